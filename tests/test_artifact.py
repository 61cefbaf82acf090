"""Policy artifacts: round trip, any-N inference, checksum and error handling, latency."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

from envs.config import FeatureConfig
from envs.encoding import ServerView, TaskView, encode
from policies import get_policy, load_policy
from policies.artifact import ArtifactError, load_network, save_policy, save_untrained
from policies.networks import CrossAttentionPointerNet


def _obs(n: int, seed: int = 0, valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    servers = [ServerView(compute=float(rng.choice([1.0, 2.0, 4.0])), memory_gb=float(rng.choice([8, 32, 80])),
                          remaining_s=float(rng.exponential(1.0) * (rng.random() < 0.5)),
                          power_w=100.0, accepting=True if valid is None else bool(valid[i]))
               for i in range(n)]
    return encode(TaskView(4.0, 6.0, 0.3, 2, 0.25), servers, FeatureConfig())


def test_untrained_round_trip_scores_any_n(tmp_path):
    path = save_untrained(tmp_path / "p", seed=3)
    meta = json.loads((path / "policy.json").read_text())
    assert meta["format"] == "scale-ray-policy/1"
    assert meta["module"] == "crossattn" and meta["train_servers"] == 16
    assert meta["checksum"].startswith("sha256:")
    pol = load_policy(path)
    for n in (1, 4, 16, 48, 300):
        s = pol.scores(_obs(n, seed=n))
        assert s.shape == (n,) and np.isfinite(s).all()
        assert 0 <= pol.act(_obs(n, seed=n)) < n
    # same seed, same weights: identical scores; another seed differs
    again = load_policy(save_untrained(tmp_path / "q", seed=3))
    other = load_policy(save_untrained(tmp_path / "r", seed=4))
    o = _obs(48)
    np.testing.assert_array_equal(pol.scores(o), again.scores(o))
    assert not np.allclose(pol.scores(o), other.scores(o))
    assert get_policy(str(path)).describe()["checksum"] == meta["checksum"]


def test_saved_weights_reproduce_the_network(tmp_path):
    torch.manual_seed(0)
    net = CrossAttentionPointerNet({"d_model": 8, "heads": 2, "layers": 1, "ffn_hidden": 16})
    save_policy(tmp_path / "p", net, {"name": "x", "algorithm": "ppo+srr", "train_servers": 16,
                                      "features": FeatureConfig(), "extra": 1})
    loaded, meta = load_network(tmp_path / "p")
    assert meta["extra"] == 1 and meta["model_config"]["d_model"] == 8
    o = _obs(20)
    t, s, m = (torch.as_tensor(o[k])[None] for k in ("task", "servers", "action_mask"))
    with torch.no_grad():
        np.testing.assert_allclose(loaded.scores(t, s, m).numpy(), net.scores(t, s, m).numpy())


def test_masked_servers_get_minus_inf_and_batch_matches(tmp_path):
    pol = load_policy(save_untrained(tmp_path / "p"))
    valid = np.zeros(10, bool)
    valid[[2, 7]] = True
    o = _obs(10, valid=valid)
    s = pol.scores(o)
    assert np.isneginf(s[~valid]).all() and np.isfinite(s[valid]).all()
    assert pol.act(o) in (2, 7)
    batch = {k: np.stack([o[k], _obs(10, 5)[k]]) for k in o}
    assert list(pol.act_batch(batch)) == [pol.act(o), pol.act(_obs(10, 5))]


def test_mlp_artifact_fixed_n(tmp_path):
    pol = load_policy(save_untrained(tmp_path / "m", module="mlp", train_servers=16))
    assert pol.scores(_obs(16)).shape == (16,)
    with pytest.raises(ValueError, match="N=16"):
        pol.scores(_obs(48))


@pytest.mark.parametrize("damage", ["missing_json", "missing_weights", "corrupt_weights",
                                    "bad_json", "bad_format", "bad_module"])
def test_bad_artifacts_give_clear_errors(tmp_path, damage):
    path = save_untrained(tmp_path / "p")
    meta = json.loads((path / "policy.json").read_text())
    if damage == "missing_json":
        (path / "policy.json").unlink()
    elif damage == "missing_weights":
        (path / "weights.pt").unlink()
    elif damage == "corrupt_weights":
        data = bytearray((path / "weights.pt").read_bytes())
        data[-10] ^= 0xFF
        (path / "weights.pt").write_bytes(bytes(data))
    elif damage == "bad_json":
        (path / "policy.json").write_text("{not json")
    elif damage == "bad_format":
        (path / "policy.json").write_text(json.dumps({**meta, "format": "other/9"}))
    elif damage == "bad_module":
        (path / "policy.json").write_text(json.dumps({**meta, "module": "transformer"}))
    expected = {"missing_json": "missing policy.json", "missing_weights": "missing weights.pt",
                "corrupt_weights": "checksum", "bad_json": "invalid JSON", "bad_format": "format",
                "bad_module": "module"}[damage]
    with pytest.raises(ArtifactError, match=expected):
        load_policy(path)
    with pytest.raises(ArtifactError, match="no such directory"):
        load_policy(tmp_path / "nowhere")


def test_weights_are_loaded_without_unpickling_code(tmp_path):
    """A weights.pt holding a pickled object (not tensors) is refused even with a valid checksum."""
    path = save_untrained(tmp_path / "p")
    torch.save({"x": ArtifactError("boom")}, path / "weights.pt")
    from policies.artifact import _sha256
    meta = json.loads((path / "policy.json").read_text())
    (path / "policy.json").write_text(json.dumps({**meta, "checksum": _sha256(path / "weights.pt")}))
    with pytest.raises(ArtifactError, match="cannot load weights"):
        load_policy(path)


def test_single_decision_latency(tmp_path):
    """In-process inference stays in the millisecond range: a gross-regression guard, 10x the
    targets (0.5 ms at N=48, 2 ms at N=1024, measured by ``scale-ray bench serve``), on the best
    of 5 batches so that a busy shared machine does not fail it."""
    pol = load_policy(save_untrained(tmp_path / "p"))
    for n, bound_ms in ((48, 5.0), (1024, 20.0)):
        o = _obs(n)
        for _ in range(20):
            pol.act(o)
        batches = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(40):
                pol.act(o)
            batches.append((time.perf_counter() - t0) / 40 * 1e3)
        assert min(batches) < bound_ms, f"N={n}: {batches} ms per decision"


def test_sampled_policy_draws_from_the_softmax_of_the_scores_and_only_where_allowed(tmp_path):
    path = save_untrained(tmp_path / "p", seed=3)
    greedy, sampled = get_policy(str(path)), get_policy(f"sample:{path}")
    valid = np.ones(6, bool)
    valid[[1, 4]] = False
    o = _obs(6, seed=2, valid=valid)
    s = greedy.scores(o)
    p = sampled.probabilities(o)
    expected = np.exp(s[valid] - s[valid].max())
    np.testing.assert_allclose(p[valid], expected / expected.sum())
    assert (p[~valid] == 0).all()
    sampled.reset(7)
    draws = np.array([sampled.act(o) for _ in range(4000)])
    assert set(draws) <= set(np.flatnonzero(valid))
    freq = np.bincount(draws, minlength=6) / draws.size
    np.testing.assert_allclose(freq, p, atol=0.03)
    # the same seed replays the same draws; the greedy policy is untouched
    sampled.reset(7)
    assert [sampled.act(o) for _ in range(50)] == list(draws[:50])
    assert greedy.act(o) == int(np.argmax(s))
    assert sampled.describe()["sampled"] is True and not sampled.batched


def test_sample_prefix_rejects_heuristics_and_dqn(tmp_path):
    with pytest.raises(ValueError, match="not a heuristic"):
        get_policy("sample:eft")
    torch.manual_seed(0)
    net = CrossAttentionPointerNet({"d_model": 8, "heads": 2, "layers": 1, "ffn_hidden": 16})
    save_policy(tmp_path / "q", net, {"name": "q", "algorithm": "dqn", "train_servers": 16,
                                      "features": FeatureConfig()})
    with pytest.raises(ValueError, match="PPO and SAC policies only"):
        get_policy(f"sample:{tmp_path / 'q'}")


# ----------------------------------------------------------------------------- damaged artifacts

def _rechecksum(path) -> None:
    """Make policy.json's checksum match the (damaged) weights.pt: only the new checks can catch it."""
    from policies.artifact import _sha256

    meta = json.loads((path / "policy.json").read_text())
    (path / "policy.json").write_text(json.dumps({**meta, "checksum": _sha256(path / "weights.pt")}))


def _damage(path, damage: str, tmp_path) -> str:
    """Damage the artifact at ``path``; returns a regex the one-line error must match."""
    meta = json.loads((path / "policy.json").read_text())
    if damage == "truncated":
        data = (path / "weights.pt").read_bytes()
        (path / "weights.pt").write_bytes(data[: len(data) // 2])
        _rechecksum(path)
        return r"weights\.pt: cannot load weights, the file is truncated"
    if damage == "symlink_outside":
        outside = tmp_path / "elsewhere.pt"
        (path / "weights.pt").rename(outside)
        (path / "weights.pt").symlink_to(outside)
        return r"weights\.pt: a symlink to .*elsewhere\.pt, outside the artifact directory"
    if damage == "json_symlink_outside":
        outside = tmp_path / "elsewhere.json"
        (path / "policy.json").rename(outside)
        (path / "policy.json").symlink_to(outside)
        return r"policy\.json: a symlink to .*elsewhere\.json, outside the artifact directory"
    if damage in ("nan", "inf"):
        state = torch.load(path / "weights.pt", weights_only=True)
        state["blocks.1.ffn.0.weight"][3, 2] = math.nan if damage == "nan" else math.inf
        torch.save(state, path / "weights.pt")
        _rechecksum(path)
        return r"weights\.pt: tensor 'blocks\.1\.ffn\.0\.weight' has 1 non-finite \(NaN/Inf\)"
    if damage == "huge_crossattn":  # every value within ModelConfig's ranges; ~440 M parameters
        cfg = {**meta["model_config"], "d_model": 4096, "ffn_hidden": 16384}
        (path / "policy.json").write_text(json.dumps({**meta, "model_config": cfg}))
        return (r"policy\.json: model_config describes a network of 437,113,793 parameters .*more "
                r"than the 50,000,000 allowed; model_config\.d_model = 4096 \(default 16\)")
    if damage == "huge_mlp":
        cfg = {**meta["model_config"], "n_servers": 100_000, "mlp_hidden": 4096}
        (path / "policy.json").write_text(json.dumps({**meta, "module": "mlp", "model_config": cfg}))
        return r"more than the 50,000,000 allowed; model_config\.n_servers = 100000 \(default 16\)"
    if damage == "model_config_out_of_range":
        cfg = {**meta["model_config"], "layers": 0}
        (path / "policy.json").write_text(json.dumps({**meta, "model_config": cfg}))
        return r"policy\.json: model_config\.layers"
    raise AssertionError(damage)


DAMAGES = ["truncated", "symlink_outside", "json_symlink_outside", "nan", "inf", "huge_crossattn",
           "huge_mlp", "model_config_out_of_range"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_every_damaged_artifact_is_one_artifact_error_naming_file_and_problem(tmp_path, damage):
    path = save_untrained(tmp_path / "p")
    expected = _damage(path, damage, tmp_path)
    with pytest.raises(ArtifactError, match=expected) as err:
        load_policy(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_huge_model_config_is_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    """The size check counts parameters on the meta device (no storage); the network is never
    built with real tensors and the weights are never read."""
    import policies.artifact as art

    path = save_untrained(tmp_path / "p")
    _damage(path, "huge_crossattn", tmp_path)
    real_build = art.build_network
    built = []

    def build_on_meta_only(*a, **k):
        net = real_build(*a, **k)
        built.append(net)
        assert all(prm.is_meta for prm in net.parameters()), "network built with real tensors"
        return net

    monkeypatch.setattr(art, "build_network", build_on_meta_only)
    monkeypatch.setattr(art, "_sha256", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ArtifactError, match="more than the 50,000,000 allowed"):
        load_network(path)
    assert built  # the count went through build_network, on the meta device


def test_parameter_count_matches_the_built_network():
    from policies.artifact import parameter_count
    from policies.networks import build_network

    for module, cfg in (("crossattn", {}), ("crossattn", {"d_model": 32, "layers": 3, "heads": 8}),
                        ("mlp", {"n_servers": 16})):
        net = build_network(module, cfg)
        assert parameter_count(module, cfg) == sum(p.numel() for p in net.parameters())


def test_symlinks_inside_the_artifact_directory_are_fine(tmp_path):
    path = save_untrained(tmp_path / "p")
    (path / "weights.pt").rename(path / "weights.real.pt")
    (path / "weights.pt").symlink_to("weights.real.pt")
    assert load_policy(path).scores(_obs(8)).shape == (8,)
    linked = tmp_path / "link"  # the directory itself behind a symlink
    linked.symlink_to(path)
    assert load_policy(linked).scores(_obs(8)).shape == (8,)


@pytest.mark.parametrize("damage", ["truncated", "nan", "huge_crossattn", "symlink_outside"])
def test_cli_reports_a_damaged_artifact_in_one_line_and_exits_2(tmp_path, damage, capsys):
    from scale_ray.cli import main

    path = save_untrained(tmp_path / "p")
    _damage(path, damage, tmp_path)
    rc = main(["eval", "--policy", str(path), "--servers", "4", "--episodes", "1", "--workers", "1",
               "--set", "workload.horizon_s=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("scale-ray: error: policy artifact ") and str(path) in err[0]


# ----------------------------------------------------------------------------- batch invariance

def _random_batch(rng, b: int, n: int, task_features: int = 5):
    task = (rng.normal(size=(b, task_features)) * rng.choice([0.01, 1.0, 50.0])).astype(np.float32)
    servers = (rng.normal(size=(b, n, 5)) * rng.choice([0.1, 1.0, 10.0])).astype(np.float32)
    mask = (rng.random((b, n)) < rng.uniform(0.05, 1.0)).astype(np.float32)
    mask[0] = 0.0  # an all-masked (terminal) row
    if b > 1:
        mask[1] = 1.0  # a row where every server attends
    return {"task": task, "servers": servers, "action_mask": mask}


@pytest.mark.parametrize("spec", ["scale", "untrained-wide", "untrained-backlog"])
def test_batched_scores_are_bit_identical_to_one_by_one(tmp_path, spec):
    """The lockstep evaluation's batched call must not change a decision: each row's scores equal
    the single-observation scores bit for bit, for any batch size and any company in the batch
    (a plain (B, d) @ (d, k) product fails this on most rows)."""
    if spec == "scale":
        pol, tf = get_policy("scale"), 5  # a trained policy
    elif spec == "untrained-wide":
        pol, tf = load_policy(save_untrained(tmp_path / "w", seed=2, model={
            "d_model": 32, "heads": 8, "layers": 3, "ffn_hidden": 96, "embed_hidden": 48})), 5
    else:
        pol, tf = load_policy(save_untrained(tmp_path / "b", seed=5, model={"task_features": 7})), 7
    rng = np.random.default_rng(19)
    rows = 0
    for n in (1, 3, 16, 48, 257):
        for b in (1, 2, 5, 16, 64):
            batch = _random_batch(rng, b, n, tf)
            s = pol.scores(batch)
            acts = pol.act_batch(batch)
            for i in range(b):
                one = {k: v[i] for k, v in batch.items()}
                np.testing.assert_array_equal(pol.scores(one), s[i])
                assert acts[i] == pol.act(one)
                rows += 1
            sub = rng.permutation(b)[: max(1, b // 2)]  # another batch, other order
            np.testing.assert_array_equal(pol.scores({k: v[sub] for k, v in batch.items()}), s[sub])
    assert rows == 5 * (1 + 2 + 5 + 16 + 64)


def test_torch_backend_scores_rows_one_by_one_and_is_not_lockstepped(tmp_path):
    pol = load_policy(save_untrained(tmp_path / "m", module="mlp", train_servers=12))
    assert not pol.batched
    rng = np.random.default_rng(3)
    batch = _random_batch(rng, 9, 12)
    s = pol.scores(batch)
    for i in range(9):
        np.testing.assert_array_equal(pol.scores({k: v[i] for k, v in batch.items()}), s[i])
    assert get_policy("scale").batched and load_policy(save_untrained(tmp_path / "c")).batched
