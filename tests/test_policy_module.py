"""The cross-attention pointer network and its RLlib modules: permutation invariance, any N,
masking, no NaN, and the training outputs the learner needs."""

from __future__ import annotations

import pytest
import torch

from envs.config import ConfigError
from policies.networks import MASKED_SCORE, CrossAttentionPointerNet, StructuredMLPNet, model_config


def _batch(b: int, n: int, seed: int = 0, p_valid: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    task = torch.rand(b, 5, generator=g)
    servers = torch.rand(b, n, 5, generator=g)
    mask = (torch.rand(b, n, generator=g) < p_valid).float()
    mask[:, 0] = 1.0  # at least one valid server per row
    return task, servers, mask


@pytest.mark.parametrize("n", [4, 16, 48, 300])
def test_permuting_servers_permutes_scores_and_keeps_value(n):
    torch.manual_seed(n)
    net = CrossAttentionPointerNet().eval()
    task, servers, mask = _batch(8, n, seed=n)
    perm = torch.randperm(n)
    with torch.no_grad():
        a = net(task, servers, mask)
        b = net(task, servers[:, perm], mask[:, perm])
    torch.testing.assert_close(b.scores, a.scores[:, perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.value, a.value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.z, a.z, rtol=1e-5, atol=1e-5)
    pa = torch.softmax(a.scores, -1)
    pb = torch.softmax(b.scores, -1)
    torch.testing.assert_close(pb, pa[:, perm], rtol=1e-5, atol=1e-6)


def test_masked_servers_do_not_influence_the_output():
    """Padded/masked servers never attend: changing their features changes nothing."""
    torch.manual_seed(0)
    net = CrossAttentionPointerNet().eval()
    task, servers, mask = _batch(4, 12, seed=1)
    other = servers.clone()
    other[mask < 0.5] = torch.rand_like(other[mask < 0.5]) * 50
    with torch.no_grad():
        a, b = net(task, servers, mask), net(task, other, mask)
    torch.testing.assert_close(a.z, b.z)
    torch.testing.assert_close(a.value, b.value)
    valid = mask > 0.5
    torch.testing.assert_close(a.scores[valid], b.scores[valid])
    # padding with masked zero rows is the same as not having them
    padded = torch.cat([servers, torch.zeros(4, 20, 5)], 1)
    pmask = torch.cat([mask, torch.zeros(4, 20)], 1)
    with torch.no_grad():
        c = net(task, padded, pmask)
    torch.testing.assert_close(c.z, a.z)
    torch.testing.assert_close(c.scores[:, :12], a.scores)


def test_one_valid_server_and_all_masked_rows_give_no_nan():
    torch.manual_seed(0)
    net = CrossAttentionPointerNet()
    task, servers, _ = _batch(3, 10)
    mask = torch.zeros(3, 10)
    mask[0, 7] = 1.0  # one valid server; row 1 and 2: none (terminal observations)
    out = net(task, servers, mask)
    for t in out:
        assert torch.isfinite(t).all()
    logp = torch.log_softmax(out.scores, -1)
    assert torch.isfinite(logp).all()
    assert logp[0, 7].item() == pytest.approx(0.0) and torch.exp(logp[0]).sum().item() == pytest.approx(1.0)
    assert (out.scores[0, torch.arange(10) != 7] == MASKED_SCORE).all()
    dist = torch.distributions.Categorical(logits=out.scores)
    assert torch.isfinite(dist.entropy()).all()
    (out.value.sum() + logp[0, 7] + dist.entropy().sum()).backward()
    for p in net.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_sampled_actions_are_never_masked():
    torch.manual_seed(0)
    net = CrossAttentionPointerNet()
    task, servers, mask = _batch(64, 20, seed=3, p_valid=0.3)
    with torch.no_grad():
        scores = net.scores(task, servers, mask)
    actions = torch.distributions.Categorical(logits=scores).sample((500,))  # (500, 64)
    chosen_valid = mask.gather(1, actions.T)
    assert (chosen_valid == 1.0).all()


def test_structured_mlp_is_fixed_n_and_masks():
    net = StructuredMLPNet({"n_servers": 16})
    task, servers, mask = _batch(5, 16)
    out = net(task, servers, mask)
    assert out.scores.shape == (5, 16) and out.z.shape == (5, 16)
    assert (out.scores[mask < 0.5] == MASKED_SCORE).all()
    with pytest.raises(ValueError, match="N=16"):
        net(*_batch(5, 17))
    with pytest.raises(ValueError, match="n_servers"):
        StructuredMLPNet({})


def test_model_config_is_validated():
    assert model_config({"d_model": 32, "heads": 8}).d_model == 32
    with pytest.raises(ConfigError, match="model.heads"):
        model_config({"d_model": 16, "heads": 3})
    with pytest.raises(ConfigError, match="unknown key model.width"):
        model_config({"width": 3})
    with pytest.raises(ConfigError, match="model.layers"):
        model_config({"layers": 0})


# ----------------------------------------------------------------------------- RLlib modules

def _spec(module_cls, n: int, **mc):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from envs.config import EnvConfig
    from envs.gym_env import ServerSelectEnv

    env = ServerSelectEnv(EnvConfig().with_servers(n))
    return RLModuleSpec(module_class=module_cls, observation_space=env.observation_space,
                        action_space=env.action_space, model_config={"network": "crossattn", **mc})


def _rl_batch(n: int, b: int = 6, seed: int = 0):
    task, servers, mask = _batch(b, n, seed)
    return {"obs": {"task": task, "servers": servers, "action_mask": mask}}


def test_ppo_module_outputs_and_any_n_weights():
    from ray.rllib.core.columns import Columns

    from policies.rl_modules import PointerPPOModule, export_network

    torch.manual_seed(0)
    m16 = _spec(PointerPPOModule, 16).build()
    batch = _rl_batch(16)
    train = m16.forward_train(batch)
    assert train[Columns.ACTION_DIST_INPUTS].shape == (6, 16)
    assert train[Columns.EMBEDDINGS].shape == (6, 16)  # z, d = 16
    v1 = m16.compute_values(batch)
    v2 = m16.compute_values(batch, embeddings=train[Columns.EMBEDDINGS])
    torch.testing.assert_close(v1, v2)
    with torch.no_grad():
        expl = m16.forward_exploration(batch)
    assert (batch["obs"]["action_mask"].gather(
        1, torch.distributions.Categorical(logits=expl[Columns.ACTION_DIST_INPUTS]).sample()[:, None]) == 1).all()
    # the same weights in a module built for N = 48
    m48 = _spec(PointerPPOModule, 48).build()
    m48.set_state(m16.get_state())
    b48 = _rl_batch(48)
    with torch.no_grad():
        torch.testing.assert_close(m48.forward_inference(b48)[Columns.ACTION_DIST_INPUTS],
                                   export_network(m16).scores(*b48["obs"].values()))


def test_dqn_module_masks_with_minus_inf_and_explores_only_valid():
    from ray.rllib.algorithms.dqn.default_dqn_rl_module import QF_PREDS
    from ray.rllib.core.columns import Columns

    from policies.rl_modules import PointerDQNModule

    m = _spec(PointerDQNModule, 16, dueling=True, double_q=True, epsilon=[[0, 1.0], [10, 1.0]]).build()
    batch = _rl_batch(16, b=32, seed=4)
    mask = batch["obs"]["action_mask"]
    q = m.compute_q_values(batch)[QF_PREDS]
    assert torch.isneginf(q[mask < 0.5]).all() and torch.isfinite(q[mask > 0.5]).all()
    with torch.no_grad():
        for t in range(20):  # epsilon = 1: random actions, all valid
            a = m.forward_exploration(batch, t=t)[Columns.ACTIONS]
            assert (mask.gather(1, a[:, None]) == 1).all()
    # a terminal observation (nothing valid) must not crash exploration
    batch["obs"]["action_mask"] = torch.zeros_like(mask)
    with torch.no_grad():
        m.forward_exploration(batch, t=0)


def test_sac_module_log_probs_are_finite_with_masks():
    from ray.rllib.algorithms.sac.sac_learner import ACTION_LOG_PROBS, ACTION_PROBS

    from policies.rl_modules import PointerSACModule

    m = _spec(PointerSACModule, 16, twin_q=True).build()
    m.make_target_networks()  # the learner does this
    batch = _rl_batch(16, b=8, seed=5)
    nxt = _rl_batch(16, b=8, seed=6)["obs"]
    nxt["action_mask"][3] = 0.0  # terminal next observation
    batch["new_obs"] = nxt
    batch["actions"] = torch.zeros(8, dtype=torch.long)
    out = m._forward_train_discrete(batch)
    for k, v in out.items():
        assert torch.isfinite(v).all(), k
    mask = batch["obs"]["action_mask"]
    assert (out[ACTION_PROBS][mask < 0.5] == 0).all()
    assert (out[ACTION_LOG_PROBS][mask < 0.5] == 0).all()
    torch.testing.assert_close(out[ACTION_PROBS].sum(-1), torch.ones(8))


# ------------------------------------------------------------------ the NumPy decision backend
@pytest.mark.parametrize("n", [1, 4, 48, 300])
def test_numpy_backend_matches_torch_scores(n):
    """NumpyPointerNet computes the torch forward to float32 rounding, masked entries exactly."""
    import numpy as np

    from policies.numpy_net import NumpyPointerNet

    torch.manual_seed(100 + n)
    net = CrossAttentionPointerNet(model_config({"d_model": 16, "heads": 4})).eval()
    # a trained net's weights are not at their init scale: spread them
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3.0)
    task, servers, mask = _batch(16, n, seed=n)
    servers = servers * 4
    mask[3] = 0.0  # an all-masked row (terminal observation)
    with torch.no_grad():
        ref = net.scores(task, servers, mask).numpy()
    got = NumpyPointerNet(net).scores(task.numpy(), servers.numpy(), mask.numpy())
    assert got.dtype == np.float32 and got.shape == ref.shape
    valid = mask.numpy() > 0.5
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
    assert (got[~valid] == MASKED_SCORE).all() and (ref[~valid] == MASKED_SCORE).all()
    rows = valid.any(-1)
    assert (got[rows].argmax(-1) == ref[rows].argmax(-1)).all()


def test_numpy_backend_refuses_what_it_cannot_compute():
    from policies.numpy_net import NumpyPointerNet

    with pytest.raises(TypeError, match="CrossAttentionPointerNet"):
        NumpyPointerNet(StructuredMLPNet(model_config({"n_servers": 4})))


def test_shipped_policy_decides_the_same_with_both_backends():
    """Every decision of the shipped SCALE policy over simulator episodes at N = 16 and 48 is the
    same under the numpy and the torch backend (scores within float32 rounding), up to ties
    between identical servers: both backends break an exact tie by rounding that depends on the
    row's position, so there the pick may differ, but only between servers whose features are
    identical (the same decision)."""
    import numpy as np

    from envs.simulator import Simulator
    from policies import ARTIFACTS_DIR
    from policies.artifact import load_policy
    from scale_ray.config import load_env

    fast = load_policy(ARTIFACTS_DIR / "scale")
    ref = load_policy(ARTIFACTS_DIR / "scale", backend="torch")
    assert fast.backend == "numpy" and ref.backend == "torch"
    decisions = ties = 0
    for n in (16, 48):
        sim = Simulator(load_env(None, ["workload.horizon_s=40"], servers=n))
        sim.reset(7)
        while sim.current is not None:
            obs = sim.observe()
            a, b = fast.scores(obs), ref.scores(obs)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            i, j = fast.act(obs), ref.act(obs)
            if i != j:
                ties += 1
                assert (obs["servers"][i] == obs["servers"][j]).all(), (i, j, a[i], a[j])
            sim.step(i)
            decisions += 1
    assert decisions > 300 and ties < decisions // 4
