"""Gymnasium adapter over :class:`envs.simulator.Simulator`, the one placement env (the only
module of ``envs`` that imports gymnasium; RLlib registration happens in :func:`register_rllib`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .config import EnvConfig, load_env_config
from .encoding import CLIP as NODES_CLIP
from .simulator import Simulator
from .trace import JsonlTraceWriter

ENV_ID = "scale_ray/ServerSelect-v0"
RLLIB_ENV_NAME = "scale_server_select"


class ServerSelectEnv(gym.Env):
    """Place each ready task of streaming workflow DAGs on a node.

    ## Description
    Workflows (DAGs of tasks) arrive as a Poisson process at a heterogeneous cluster: the
    paper's servers of one slot, or Ray nodes that run every task that fits (``cluster.tiers``
    with ``resources``). The order (``mdp.order``, envs/order.py: the paper's longest hop-count
    path to a sink unless set) picks the ready task; the agent picks the node (paper §4.1;
    docs/simulator.md has every default).

    ## Action Space
    ``Discrete(n_max)``: a node position. Positions beyond the live nodes are padding (mask 0).
    An integer outside ``0..n_max-1`` raises ``ValueError``.

    ## Observation Space
    ``Dict`` of float32 boxes (``env.encoder``, envs/encoding.py), features divided by fixed
    constants:

    | encoder | ``task`` | ``servers`` (n_max, k) | ``action_mask`` (n_max,) |
    |---|---|---|---|
    | ``paper`` | (5,) or (7,): compute, memory, successors, completion ratio, output (with ``features.backlog``: ready tasks per node, workflow age) | 5: speed, memory, remaining busy time, power, transfer delay | alive, not draining (with ``mdp.mask_infeasible``: could ever hold it) |
    | ``nodes`` | (8,): compute, CPU, GPU, memory, GPU work, completion ratio, age, children | 9: run, start in, fits now, free CPU / GPU / memory, speed, runs, has a GPU | fits now |

    ## Rewards
    Paper eq. 2 on a valid pick: ``w1 exp(-T_exec/T0) - w2 T_comm/T0c - w3 E/E0``; a wait
    (a pick that does not fit now) gives ``reward.invalid_penalty`` (-0.1) and moves the clock by
    ``mdp.wait_dt_s``. ``reward.kind: response`` also charges the time tasks (or workflows,
    ``objective: workflow``) spend in the system (beyond the paper; its sum is the negative total
    response, Little's law).

    ## Starting State
    The cluster of ``cluster.servers`` nodes in the configured tier mix, idle, clock 0; the
    workload and dynamics come from the reset seed.

    ## Episode End
    Terminated when arrivals have stopped (``workload.horizon_s``) and every arrived workflow is
    done; truncated at ``mdp.max_decisions`` or when the clock passes
    ``horizon_s * max_time_factor``. The final ``info`` holds the episode metrics.

    ## Arguments
    ``config``: an :class:`EnvConfig` or its mapping (RLlib's env_config), optionally with
    ``trace_dir`` (one JSONL trace per episode) and ``seed`` (base seed when ``reset`` gets none).
    """

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | Mapping[str, Any] | None = None):
        extra: dict[str, Any] = {}
        if isinstance(config, EnvConfig):
            cfg = config
        else:
            data = dict(config or {})
            for key in ("trace_dir", "seed"):
                if key in data:
                    extra[key] = data.pop(key)
            cfg = load_env_config(data)
        self.config = cfg
        self.n_max = cfg.padded_servers
        self.sim = Simulator(cfg)
        task_w, node_w = self.sim.encoder.spaces_dims()
        clip = NODES_CLIP if cfg.encoder == "nodes" else cfg.features.clip
        self.observation_space = spaces.Dict({
            "task": spaces.Box(0.0, clip, (task_w,), np.float32),
            "servers": spaces.Box(0.0, clip, (self.n_max, node_w), np.float32),
            "action_mask": spaces.Box(0.0, 1.0, (self.n_max,), np.float32),
        })
        self.action_space = spaces.Discrete(self.n_max)
        self._trace_dir = Path(extra["trace_dir"]) if extra.get("trace_dir") else None
        self._base_seed = extra.get("seed")
        # RLlib's EnvContext carries worker/vector indices: give each sub-env its own stream.
        wi = getattr(config, "worker_index", 0) or 0
        vi = getattr(config, "vector_index", 0) or 0
        self._stream = (wi, vi)
        self._writer: JsonlTraceWriter | None = None
        self._episode = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None and self._base_seed is not None and self._episode == 0:
            seed = int(np.random.SeedSequence([self._base_seed, *self._stream]).generate_state(1)[0])
        super().reset(seed=seed)
        self._close_writer()
        self._episode += 1
        # An episode with no decision at all (no arrival before the horizon) cannot be returned by
        # reset(): draw the next workload instead (deterministic given the seed). Trace events of
        # reset are buffered so that only the episode that is played gets written.
        for _ in range(100):
            buffer: list[dict[str, Any]] = []
            self.sim.trace = buffer.append if self._trace_dir is not None else None
            self.sim.reset(np.random.SeedSequence(int(self.np_random.integers(0, 2**63 - 1))))
            if self.sim.current is not None:
                if self._trace_dir is not None:
                    self._trace_dir.mkdir(parents=True, exist_ok=True)
                    self._writer = JsonlTraceWriter(
                        self._trace_dir / f"episode_{self._episode - 1:05d}.jsonl")
                    for ev in buffer:
                        self._writer(ev)
                    self.sim.trace = self._writer
                return self.sim.observe(), {}
        raise ValueError("env: 100 workloads in a row had no arrival before workload.horizon_s="
                         f"{self.config.workload.horizon_s}; raise the horizon or the arrival rate")

    def step(self, action):
        try:
            a = int(action)
        except (TypeError, ValueError):
            raise ValueError(f"action {action!r} is not an integer; allowed: 0..{self.n_max - 1}") from None
        if a != action or not 0 <= a < self.n_max:
            raise ValueError(f"action {action!r} is out of range; allowed: 0..{self.n_max - 1}")
        r = self.sim.step(a)
        info: dict[str, Any] = {"valid": r.valid}
        if r.terminated or r.truncated:
            info["episode_metrics"] = self.sim.metrics()
            self._close_writer()
        return self.sim.observe(), float(r.reward), r.terminated, r.truncated, info

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self.sim.trace = None

    def close(self) -> None:
        self._close_writer()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_writer"] = None
        return state


def register_rllib() -> str:
    """Register the env with RLlib's ``register_env`` (imports ray); returns the name."""
    from ray.tune.registry import register_env

    register_env(RLLIB_ENV_NAME, lambda ctx: ServerSelectEnv(ctx))
    return RLLIB_ENV_NAME


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="envs.gym_env:ServerSelectEnv")
