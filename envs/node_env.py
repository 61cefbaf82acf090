"""Gymnasium adapter over :class:`envs.node_sim.NodeSimulator`: a learned policy places each task
of agent requests on a node in Ray's resource model (issue 46; the slot model's env is
``envs.gym_env``)."""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .agents import load_agents_config
from .config_base import ConfigError
from .node_encoding import CLIP, NODE_DIM, TASK_DIM, TIME_UNIT_S, encode_nodes, encode_task
from .node_sim import NodeSimulator

NODE_ENV_ID = "scale_ray/NodeSelect-v0"
RLLIB_NODE_ENV_NAME = "scale_node_select"
DEFAULT_AGENTS = "configs/env/agents.yaml"
_KEYS = ("agents", "nodes", "n_max", "gpu_load", "horizon_s", "seed")


class NodeSelectEnv(gym.Env):
    """Place each ready call of agent requests on a node that runs every task that fits.

    ## Description
    Requests (plan, tools, reflections, answer: ``envs.agents``) arrive as a Poisson process at
    a cluster of CPU and GPU nodes (``configs/env/agents.yaml``); the order (``order`` there)
    picks the next ready call that fits some node now; the agent picks its node. Calls that fit
    no node now wait without asking (docs/simulator.md, "Ray's resource model").

    ## Action Space
    ``Discrete(n_max)``: a node. The mask offers the nodes the call fits now; a pick outside it
    is a wait: the call is set aside until the next event (a finish or an arrival), and the
    next ready call is asked about. When no event is left to wait for, the pick is replaced by
    the first node it fits (counted as ``forced_picks``): the episode cannot wait without
    bound.

    ## Observation Space
    ``Dict``: ``task`` (:data:`envs.node_encoding.TASK_DIM`,), ``servers`` (n_max,
    :data:`envs.node_encoding.NODE_DIM`), ``action_mask`` (n_max,): 1 where the call fits now
    (``envs.node_encoding.encode_nodes`` says why waits are left out). Features in
    ``envs.node_encoding``.

    ## Rewards
    Minus the request-seconds spent in the system since the last decision, in units of 10 s:
    over an episode the rewards sum to minus the total request response / 10 s (Little's law),
    so the return is the objective (mean workflow response) up to a constant factor.

    ## Episode End
    Terminated when arrivals have stopped (``horizon_s``) and every request finished; the final
    ``info`` holds the episode metrics (``NodeSimulator`` metrics plus ``forced_picks``).

    ## Arguments
    ``config`` (RLlib's env_config): ``agents`` (a path or a mapping; default
    configs/env/agents.yaml), ``nodes`` (16), ``n_max`` (padding, default ``nodes``),
    ``gpu_load`` and ``horizon_s`` (override the file), ``seed`` (the base seed).
    """

    metadata = {"render_modes": []}

    def __init__(self, config: Mapping[str, Any] | None = None):
        data = dict(config or {})
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ConfigError(f"node env: unknown keys {unknown}; allowed: {list(_KEYS)}")
        self.agents = load_agents_config(data.get("agents", DEFAULT_AGENTS),
                                          {k: data[k] for k in ("gpu_load", "horizon_s")
                                           if data.get(k) is not None})
        nodes = data.get("nodes", 16)
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ConfigError(f"node env.nodes: must be an integer >= 1, got {nodes!r}")
        self.n_max = data.get("n_max", nodes)
        if not isinstance(self.n_max, int) or self.n_max < nodes:
            raise ConfigError(f"node env.n_max: must be an integer >= nodes ({nodes}), got "
                              f"{self.n_max!r}")
        self.sim = NodeSimulator(self.agents, nodes)
        self.observation_space = spaces.Dict({
            "task": spaces.Box(0.0, CLIP, (TASK_DIM,), np.float32),
            "servers": spaces.Box(0.0, CLIP, (self.n_max, NODE_DIM), np.float32),
            "action_mask": spaces.Box(0.0, 1.0, (self.n_max,), np.float32),
        })
        self.action_space = spaces.Discrete(self.n_max)
        self._base_seed = data.get("seed")
        wi = getattr(config, "worker_index", 0) or 0
        vi = getattr(config, "vector_index", 0) or 0
        self._stream = (wi, vi)
        self._episodes = 0
        self._nodes = np.zeros((self.n_max, NODE_DIM), dtype=np.float32)
        self.episode: Any = None
        self.task: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None and self._base_seed is not None and self._episodes == 0:
            seed = int(np.random.SeedSequence([self._base_seed, *self._stream])
                       .generate_state(1)[0])
        super().reset(seed=seed)
        self._episodes += 1
        for _ in range(100):  # an episode with no decision at all cannot be returned by reset
            self.episode = self.sim.episode(int(self.np_random.integers(0, 2**63 - 1)))
            self._steps = self.episode.decisions()
            self._area = 0.0
            self.forced_picks = 0
            try:
                self.task = next(self._steps)
            except StopIteration:
                continue
            return self._observe(), {}
        raise ValueError("node env: 100 episodes in a row had no request; raise horizon_s")

    def step(self, action):
        try:
            a = int(action)
        except (TypeError, ValueError):
            raise ValueError(f"action {action!r} is not an integer; allowed: 0..{self.n_max - 1}"
                             ) from None
        if a != action or not 0 <= a < self.n_max:
            raise ValueError(f"action {action!r} is out of range; allowed: 0..{self.n_max - 1}")
        ep = self.episode
        table = ep.table
        valid = table.fits_now(a, self.task.demands)
        if not valid and not ep.events:  # nothing left to wait for: no wait without bound
            a = table.fitting(self.task.demands)[0]
            self.forced_picks += 1
        info: dict[str, Any] = {"valid": valid}
        try:
            self.task = self._steps.send(a)
        except StopIteration as done:
            self.task = None
            info["episode_metrics"] = {**done.value, "forced_picks": self.forced_picks}
        reward = -(ep.area - self._area) / TIME_UNIT_S
        self._area = ep.area
        if self.task is None:
            return self._empty(), reward, True, False, info
        return self._observe(), reward, False, False, info

    def _observe(self) -> dict[str, np.ndarray]:
        ep = self.episode
        mask = encode_nodes(ep.table, self.task, ep.now, self._nodes)
        task = encode_task(self.task, ep.now)
        return {"task": task, "servers": self._nodes.copy(), "action_mask": mask}

    def _empty(self) -> dict[str, np.ndarray]:
        return {"task": np.zeros(TASK_DIM, np.float32),
                "servers": np.zeros((self.n_max, NODE_DIM), np.float32),
                "action_mask": np.zeros(self.n_max, np.float32)}


def register_rllib() -> str:
    """Register the env with RLlib's ``register_env`` (imports ray); returns the name."""
    from ray.tune.registry import register_env

    register_env(RLLIB_NODE_ENV_NAME, lambda ctx: NodeSelectEnv(ctx))
    return RLLIB_NODE_ENV_NAME


if NODE_ENV_ID not in gym.registry:
    gym.register(id=NODE_ENV_ID, entry_point="envs.node_env:NodeSelectEnv")
