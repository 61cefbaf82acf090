"""SRR loss against hand computations, its gradients and the warm-up ramp."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from envs.config import ConfigError, build
from policies.networks import CrossAttentionPointerNet
from policies.srr import SrrConfig, feature_stats, ramp, srr_losses


def test_both_terms_match_a_hand_computation():
    z = torch.tensor([[1.0, 2.0], [3.0, 0.0], [2.0, 4.0]])
    # by hand: mu = (2, 2); centred rows (-1,0), (1,-2), (0,2)
    # C = [[(1+1+0)/2, (0-2+0)/2], [., (0+4+4)/2]] = [[1, -1], [-1, 4]]
    dec, kl = srr_losses(z)
    assert dec.item() == pytest.approx(((-1) ** 2 + (-1) ** 2) / 2)
    kl_hand = 0.5 * ((4 + 1 - 1 - math.log(1)) + (4 + 4 - 1 - math.log(4))) / 2
    assert kl.item() == pytest.approx(kl_hand, rel=1e-6)


def test_numpy_reference_on_a_random_batch():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(64, 16)) * rng.uniform(0.5, 2, 16) + rng.normal(size=16)
    c = np.cov(z, rowvar=False, ddof=1)
    mu, var = z.mean(0), np.diag(c)
    dec_ref = ((c - np.diag(var)) ** 2).sum() / 16
    kl_ref = (0.5 * (mu ** 2 + var - 1 - np.log(var))).sum() / 16
    dec, kl = srr_losses(torch.as_tensor(z, dtype=torch.float64))
    assert dec.item() == pytest.approx(dec_ref, rel=1e-4)
    assert kl.item() == pytest.approx(kl_ref, rel=1e-4)


def test_diagonal_covariance_gives_zero_decorrelation_and_standard_normal_zero_kl():
    # columns +-1 patterns that are orthogonal after centring: C = I exactly, mean 0
    h = torch.tensor([[1.0, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]])
    z = h[:, 1:] * math.sqrt(3 / 4)  # centred, orthogonal columns, unit variance (B-1 = 3)
    dec, kl = srr_losses(z)
    assert dec.item() == pytest.approx(0.0, abs=1e-12)
    assert kl.item() == pytest.approx(0.0, abs=1e-6)
    stats = feature_stats(z)
    assert stats["mean_abs_offdiag_cov"] == pytest.approx(0.0, abs=1e-7)


def test_correlated_features_are_penalised():
    x = torch.randn(256, 1)
    dec, _ = srr_losses(torch.cat([x, x, torch.randn(256, 1)], 1))
    assert dec.item() > 0.1


def test_gradients_reach_the_module_parameters():
    torch.manual_seed(0)
    net = CrossAttentionPointerNet()
    out = net(torch.rand(32, 5), torch.rand(32, 6, 5), torch.ones(32, 6))
    dec, kl = srr_losses(out.z)
    (dec + kl).backward()
    for name in ("task_mlp.0.weight", "server_mlp.0.weight", "blocks.0.q.weight", "blocks.1.ffn.2.weight"):
        g = dict(net.named_parameters())[name].grad
        assert g is not None and g.abs().sum() > 0, name
    assert net.w_q.weight.grad is None  # the pointer head does not shape z


def test_batch_of_one_is_rejected_and_collapsed_dimension_is_finite():
    with pytest.raises(ValueError, match="B >= 2"):
        srr_losses(torch.zeros(1, 4))
    dec, kl = srr_losses(torch.zeros(8, 4))
    assert math.isfinite(dec.item()) and math.isfinite(kl.item())


def test_ramp_values():
    cfg = SrrConfig()
    assert [cfg.ramp(i) for i in (0, 9, 10, 35, 59, 60, 1000)] == [0, 0, 0, 0.5, 49 / 50, 1, 1]
    assert ramp(5, 5, 5) == 1.0 and ramp(4, 5, 5) == 0.0
    assert build(SrrConfig, {"ramp_start": 0, "ramp_end": 4}).ramp(1) == 0.25
    with pytest.raises(ConfigError, match="ramp_end"):
        build(SrrConfig, {"ramp_start": 10, "ramp_end": 5}, "srr")
    with pytest.raises(ConfigError, match="srr.lambda_dec"):
        build(SrrConfig, {"lambda_dec": -1}, "srr")
