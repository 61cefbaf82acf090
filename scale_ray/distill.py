"""A learned student of the ``lookahead`` planner: behaviour cloning with DAgger (issue 17).

The student is the shipped cross-attention pointer network (``policies.networks``, the same
module SCALE trains), so it runs at any N and loads wherever a policy artifact does. Training,
at one cluster size (``servers``, 16 by default):

1. **Collect.** Simulator episodes (training seeds, disjoint from the evaluation seeds) in which,
   at every decision, the teacher (``lookahead`` acting on the simulator state) labels the
   observation with its choice. Round 0 follows the teacher; in round k > 0 the student acts
   with probability ``1 - beta**k`` (DAgger: the teacher labels the states the student
   reaches, so it learns to recover from its own mistakes).
2. **Fit.** Cross-entropy of the masked pointer scores against the teacher's server, on every
   sample collected so far (Adam, ``epochs`` passes per round).

Why not RLlib's offline API: the teacher acts on the simulator's state, which is not in the
observation, and DAgger relabels the states the *current* student visits, so the data cannot be
written once and read back as RLlib episodes. The network is RLlib's (the RLModule wraps the
same ``policies.networks`` class), so PPO fine-tuning can start from these weights
(``scale-ray train ... --init``-style; measured in results/student/README.md: it turns the
student back into EFT).

``scale-ray distill --out DIR`` writes a policy artifact (``algorithm: bc``) to ``DIR/policy``
and ``DIR/progress.jsonl`` (per round: samples, loss, agreement with the teacher).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from envs.config import EnvConfig, FeatureConfig, build, rng, to_dict
from envs.config_files import load_env
from envs.encoding import task_dim
from envs.simulator import Simulator
from policies import ARTIFACTS_DIR, get_policy, shipped_policies

log = logging.getLogger(__name__)

TRAIN_SEED_BASE = 1_000  # training episodes use SeedSequence([TRAIN_SEED_BASE + seed, k])


@dataclass(frozen=True)
class DistillConfig:
    """Settings of ``scale-ray distill`` (a YAML file or ``--set`` overrides)."""
    env_config: str = field(default="configs/env/realistic.yaml", metadata=rng(
        doc="the environment the teacher and student act in"))
    env_set: tuple[str, ...] = field(default=(), metadata=rng(
        doc="KEY=VALUE overrides of the env config, e.g. workload.horizon_s=100"))
    servers: int = field(default=16, metadata=rng(ge=2, le=4096, doc="training cluster size N"))
    teacher: str = field(default="lookahead", metadata=rng(
        doc="a planner (policies.lookahead spec, e.g. lookahead:candidates=4)"))
    rounds: int = field(default=4, metadata=rng(ge=1, le=100, doc="DAgger rounds"))
    episodes_per_round: int = field(default=6, metadata=rng(
        ge=1, le=10_000, doc="teacher-labelled episodes per DAgger round"))
    beta: float = field(default=0.5, metadata=rng(
        ge=0, le=1, doc="round k follows the teacher with probability beta**k"))
    label_reserved: bool = field(default=False, metadata=rng(
        doc="also learn from the teacher's answers to a task it already reserved a busy server "
            "for (it repeats that wait at every re-ask, so they outnumber fresh decisions)"))
    epochs: int = field(default=4, metadata=rng(ge=1, le=1000, doc="passes over the data per round"))
    batch_size: int = field(default=256, metadata=rng(
        ge=1, le=65_536, doc="observations per SGD step"))
    lr: float = field(default=1e-3, metadata=rng(gt=0, le=1, doc="learning rate (Adam)"))
    init: str | None = field(default="scale", metadata=rng(
        doc="start from this artifact's weights (shipped name or directory); none: random"))
    seed: int = field(default=0, metadata=rng(ge=0, doc="seed of the episodes and the shuffles"))
    threads: int = field(default=1, metadata=rng(ge=1, le=256, doc="torch threads"))


def load_distill_config(data: Mapping[str, Any] | None) -> DistillConfig:
    return build(DistillConfig, data, "distill")


class _Data:
    """Growing arrays of (task, servers, mask, teacher action) at one N."""

    def __init__(self) -> None:
        self.task: list[np.ndarray] = []
        self.servers: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.action: list[int] = []

    def add(self, obs: dict[str, np.ndarray], action: int) -> None:
        self.task.append(obs["task"].astype(np.float32, copy=True))
        self.servers.append(obs["servers"].astype(np.float32, copy=True))
        self.mask.append(obs["action_mask"].astype(bool, copy=True))
        self.action.append(int(action))

    def __len__(self) -> int:
        return len(self.action)

    def tensors(self) -> tuple:
        import torch

        return (torch.from_numpy(np.stack(self.task)), torch.from_numpy(np.stack(self.servers)),
                torch.from_numpy(np.stack(self.mask)), torch.as_tensor(self.action))


def _student_act(net: Any, obs: dict[str, np.ndarray]) -> int:
    import torch

    with torch.no_grad():
        s = net.scores(torch.from_numpy(obs["task"][None].astype(np.float32)),
                       torch.from_numpy(obs["servers"][None].astype(np.float32)),
                       torch.from_numpy(obs["action_mask"][None].astype(bool)))
    return int(s[0].argmax())


def collect(env: EnvConfig, cfg: DistillConfig, net: Any, data: _Data, rnd: int,
            rng_: np.random.Generator) -> dict[str, float]:
    """One DAgger round of episodes; returns the student's agreement with the teacher on the
    states visited (every state, whoever acted)."""
    follow = cfg.beta ** rnd
    agree = n = 0
    for k in range(cfg.episodes_per_round):
        teacher = get_policy(cfg.teacher, env, seed=cfg.seed * 7919 + rnd * 1009 + k)
        sim = Simulator(env)
        sim.reset(np.random.SeedSequence([TRAIN_SEED_BASE + cfg.seed, rnd * 10_000 + k]))
        teacher.reset(cfg.seed + k)
        while sim.current is not None:
            obs = sim.observe()
            fresh = sim.current.id not in getattr(teacher, "_reserved", ())
            a_t = teacher.decide(sim)
            if fresh or cfg.label_reserved:
                data.add(obs, a_t)
            a_s = _student_act(net, obs) if rnd > 0 else a_t
            agree += a_s == a_t
            n += 1
            sim.step(a_t if rng_.random() < follow else a_s)
    return {"states": n, "agreement": agree / n if n else float("nan"), "follow_teacher": follow}


def fit(net: Any, data: _Data, cfg: DistillConfig, opt: Any, rng_: np.random.Generator
        ) -> dict[str, float]:
    """``cfg.epochs`` passes of masked cross-entropy over ``data``; mean loss and accuracy of
    the last pass."""
    import torch
    import torch.nn.functional as F

    task, servers, mask, action = data.tensors()
    n = len(action)
    net.train()
    for _ in range(cfg.epochs):
        perm = torch.from_numpy(rng_.permutation(n))
        tot = correct = 0.0
        for i in range(0, n, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            scores = net.scores(task[idx], servers[idx], mask[idx])
            loss = F.cross_entropy(scores, action[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
            correct += float((scores.argmax(-1) == action[idx]).sum())
    net.eval()
    return {"loss": tot / n, "train_accuracy": correct / n}


def _initial_net(cfg: DistillConfig, env: EnvConfig) -> tuple[Any, dict]:
    import torch

    from policies.artifact import load_network
    from policies.networks import build_network

    if cfg.init is None:
        torch.manual_seed(cfg.seed)
        return build_network("crossattn", {"task_features": task_dim(env.features)}), {}
    path = ARTIFACTS_DIR / cfg.init if cfg.init in shipped_policies() else Path(cfg.init)
    net, meta = load_network(path)
    if net.kind != "crossattn" or net.cfg.task_features != task_dim(env.features):
        raise ValueError(f"distill.init: {cfg.init!r} is a {net.kind!r} network with "
                         f"{net.cfg.task_features} task features; the student is the "
                         f"cross-attention pointer network with the env's {task_dim(env.features)}"
                         f" (features.backlog: init null)")
    return net, meta


def distill(cfg: DistillConfig, out: str | Path) -> Path:
    """Train the student (module docstring); returns the artifact directory."""
    import torch

    from policies.artifact import save_policy

    torch.set_num_threads(cfg.threads)
    env = load_env(cfg.env_config, list(cfg.env_set), servers=cfg.servers)
    net, init_meta = _initial_net(cfg, env)
    if init_meta.get("features") and build(FeatureConfig, init_meta["features"],
                                           "features") != env.features:
        log.warning("distill: %s was trained with other feature constants than %s; the student "
                    "keeps the env's", cfg.init, cfg.env_config)
    net.eval()
    for p in net.parameters():  # an artifact loads frozen, for inference
        p.requires_grad_(True)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    rng_ = np.random.default_rng([cfg.seed, 17])
    data = _Data()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.jsonl"
    progress.write_text("")
    t0 = time.perf_counter()
    for rnd in range(cfg.rounds):
        c = collect(env, cfg, net, data, rnd, rng_)
        f = fit(net, data, cfg, opt, rng_)
        row = {"round": rnd, "samples": len(data), **c, **f, "time_s": time.perf_counter() - t0}
        with progress.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        log.info("round %d: %d samples, agreement %.3f (student acting %.0f%%), loss %.4f, "
                 "train acc %.3f, %.0f s", rnd, len(data), c["agreement"],
                 100 * (1 - c["follow_teacher"]), f["loss"], f["train_accuracy"],
                 row["time_s"])
    return save_policy(out / "policy", net, {
        "name": "student", "algorithm": "bc", "train_servers": cfg.servers,
        "features": env.features, "version": f"bc-dagger-seed{cfg.seed}",
        "teacher": cfg.teacher, "init": cfg.init, "distill": asdict(cfg),
        "env": json.loads(json.dumps(_env_dict(env)))})


def _env_dict(env: EnvConfig) -> dict:
    return to_dict(env)
