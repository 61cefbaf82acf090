"""Classic placement heuristics (docs/training.md) on the encoder's observation.

Each reads raw quantities back from the fixed feature normalisation (``envs.encoding.decode``).
"Fits" means the server's memory holds the task; "idle" means no remaining busy time. When no
idle server fits, every pick is a wait; all heuristics then wait for the fitting server that frees
up first (the least harmful wait), except random, which waits on a random fitting server.
"""

from __future__ import annotations

import numpy as np

from envs.config import EnvConfig, FeatureConfig
from envs.encoding import decode

from .base import Obs, Policy

# Idle servers always outrank busy ones: a busy pick is a wait.
_IDLE_BONUS = 1e9
_MEM_TOL = 1e-5  # float32 round trip of the normalised memory feature


class Heuristic(Policy):
    def __init__(self, features: FeatureConfig | None = None, transfer_delays_start: bool = False,
                 seed: int | None = None):
        self.features = features or FeatureConfig()
        self.transfer_delays_start = transfer_delays_start
        self._seed = seed
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(self._seed if seed is None else seed)

    def _decode(self, obs: Obs):
        task, srv = decode(obs, self.features)
        fits = srv.valid & (srv.memory_gb * (1 + _MEM_TOL) >= task[1])
        if not fits.any():  # nothing fits (only possible without the feasibility mask): any valid
            fits = srv.valid.copy()
        idle = fits & (srv.remaining_s <= 1e-9)
        return task, srv, fits, idle

    def _run_s(self, task: np.ndarray, srv) -> np.ndarray:
        with np.errstate(divide="ignore"):
            run = task[0] / np.where(srv.compute > 0, srv.compute, np.nan)
        if self.transfer_delays_start:
            run = run + srv.transfer_s
        return run

    def _soonest_free(self, srv, fits: np.ndarray) -> np.ndarray:
        return np.where(fits, -srv.remaining_s, -np.inf)


class RandomFeasible(Heuristic):
    """Uniformly random among idle servers that fit; a random fitting server when none is idle."""
    name = "random"

    def scores(self, obs: Obs) -> np.ndarray:
        _, _, fits, idle = self._decode(obs)
        pool = idle if idle.any() else fits
        return np.where(pool, 1.0, -np.inf)

    def act(self, obs: Obs) -> int:
        pool = np.flatnonzero(np.isfinite(self.scores(obs)))
        return int(pool[self.rng.integers(0, pool.size)])


class RoundRobin(Heuristic):
    """The next idle fitting server after the last one chosen, in slot order."""
    name = "round-robin"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._last = -1

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, idle = self._decode(obs)
        if not idle.any():
            return self._soonest_free(srv, fits)
        n = idle.shape[0]
        dist = (np.arange(n) - self._last - 1) % n  # 0 for the slot right after the last pick
        return np.where(idle, -dist.astype(float), -np.inf)

    def act(self, obs: Obs) -> int:
        a = super().act(obs)
        self._last = a
        return a


class LeastLoaded(Heuristic):
    """The fitting server with the least remaining busy time; ties at random. With one task per
    server this is a random idle server while any is idle."""
    name = "least-loaded"

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, _ = self._decode(obs)
        return np.where(fits, -srv.remaining_s, -np.inf)

    def act(self, obs: Obs) -> int:
        s = self.scores(obs)
        best = np.flatnonzero(s == s.max())
        return int(best[self.rng.integers(0, best.size)])


class FastestIdle(Heuristic):
    """The idle fitting server with the highest compute; ties to the smallest memory."""
    name = "fastest-idle"

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, idle = self._decode(obs)
        if not idle.any():
            return self._soonest_free(srv, fits)
        return np.where(idle, srv.compute - 1e-6 * srv.memory_gb, -np.inf)


class EarliestFinish(Heuristic):
    """EFT: the idle fitting server where the task finishes first (transfer counted when
    transfers delay starts; otherwise ties go to the parent's server, then smallest memory).
    Never waits while a fitting server is idle."""
    name = "eft"

    def scores(self, obs: Obs) -> np.ndarray:
        task, srv, fits, idle = self._decode(obs)
        if not idle.any():
            return self._soonest_free(srv, fits)
        finish = self._run_s(task, srv)
        tie = 1e-6 * srv.transfer_s + 1e-9 * srv.memory_gb
        return np.where(idle, -(finish + tie), -np.inf)


class EarliestFinishWait(Heuristic):
    """EFT-wait: any fitting server, busy ones counted from when they free up; picking a busy
    server is a wait (it shows what waiting costs under the paper's semantics)."""
    name = "eft-wait"

    def scores(self, obs: Obs) -> np.ndarray:
        task, srv, fits, _ = self._decode(obs)
        finish = srv.remaining_s + self._run_s(task, srv)
        return np.where(fits, -(finish + 1e-9 * srv.memory_gb), -np.inf)


class Heft(EarliestFinish):
    """HEFT-style: tasks ordered by upward rank (the simulator's first level), placed by EFT."""
    name = "heft"
    order = "upward_rank"


HEURISTICS: dict[str, type[Heuristic]] = {
    cls.name: cls for cls in (RandomFeasible, RoundRobin, LeastLoaded, FastestIdle, EarliestFinish,
                              EarliestFinishWait, Heft)
}


def make_heuristic(name: str, env: EnvConfig | None = None, seed: int | None = None) -> Policy:
    """A heuristic by name, reading features and the transfer switch from ``env``."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown heuristic {name!r}; choose one of {sorted(HEURISTICS)}")
    env = env or EnvConfig()
    return HEURISTICS[name](env.features, env.mdp.transfer_delays_start, seed)


