"""The one scheduling interface: an observation in, a server index out.

Observations are the encoder's dicts (``envs.encoding``): ``task`` (5,), ``servers`` (N, 5),
``action_mask`` (N,). Heuristics implement :meth:`Policy.scores`; trained modules are wrapped by
the same class (``policies.artifact``), so evaluation, Serve and the live scheduler treat every
scheduler alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

Obs = Mapping[str, np.ndarray]


class Policy(ABC):
    """Chooses a server for the current task.

    Attributes:
        name: short name used in tables and by ``--policy``.
        order: the ready-task order (``mdp.order``, ``envs.order``) the policy needs, or None
            when it works under any (HEFT: ``"upward_rank"``, its definition). A config that
            sets another order is an error (``envs.order.resolve``).
        batched: see below.
    """

    name: str = "policy"
    order: str | None = None
    #: True for stateless policies whose act_batch is much cheaper per decision than act
    #: (trained networks); the evaluation harness then steps episodes in lockstep.
    batched: bool = False

    def reset(self, seed: int | None = None) -> None:
        """Forget per-episode state (round-robin pointer, RNG)."""

    @abstractmethod
    def scores(self, obs: Obs) -> np.ndarray:
        """Per-server preference (N,), higher is better; ``-inf`` where the mask forbids."""

    def act(self, obs: Obs) -> int:
        """Index of the chosen server (highest score, lowest index on ties)."""
        return int(np.argmax(self.scores(obs)))

    def act_batch(self, obs: Obs) -> np.ndarray:
        """Actions for a batch of observations (leading batch axis on every array)."""
        b = np.asarray(obs["task"]).shape[0]
        return np.array([self.act({k: np.asarray(v)[i] for k, v in obs.items()}) for i in range(b)],
                        dtype=np.int64)

    def describe(self) -> dict:
        """Metadata for ``GET /v1/policy`` and reports."""
        return {"name": self.name, "algorithm": "heuristic", "version": "builtin",
                "order": self.order}


@runtime_checkable
class Planner(Protocol):
    """A policy that plans on the state itself, not on an observation (``policies.lookahead``).
    Every consumer checks :func:`is_planner` and calls it through these methods only:

    * the simulator (``scale-ray eval``, ``distill``): :meth:`act_state` on the live episode;
    * Serve's ``/v1/schedule`` and the live scheduler: :meth:`decide` on a snapshot of the
      present (``envs.snapshot``), with a :meth:`fresh` copy per thread or round;
    * ``env``: the rules and constants it plans with. Never guarded (``planner = True``).
    """

    name: str
    planner: bool
    env: Any
    last_deferred: bool  # the last answer deferred its task (a wait that reserves nothing)

    def act_state(self, sim: Any) -> int:
        """The slot for ``sim.current``."""

    def decide(self, servers: Sequence[Any], workflows: Sequence[Any], focus: tuple[int, int],
               waiting: Mapping[tuple[int, int], int] | None = None, env: Any = None,
               deferred: Sequence[tuple[int, int]] = ()) -> int:
        """The server position for task ``focus`` of a snapshot of the present; ``waiting``:
        this round's waits for busy servers (reserved), ``deferred``: this round's defers."""

    def fresh(self) -> "Planner":
        """A planner with the same settings and its own state."""


def is_planner(policy: Any) -> bool:
    """Whether ``policy`` is a :class:`Planner` (it acts on the state, not an observation)."""
    return isinstance(policy, Planner)


def masked(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scores with masked entries set to -inf (float64)."""
    out = np.asarray(scores, dtype=np.float64).copy()
    out[np.asarray(mask) <= 0.5] = -np.inf
    return out


class SampledPolicy(Policy):
    """Draws the server from softmax(scores) instead of taking the argmax: the stochastic policy
    a PPO or SAC actor was trained with (RLlib's ``explore=True``), where evaluation and serving
    use the greedy one. ``--policy sample:<spec>`` in ``scale-ray eval``.

    Reproducible per episode: :meth:`reset` seeds the generator (the evaluation harness passes a
    fixed seed per episode). Not batched, so that an episode's draws never depend on which other
    episodes share its batch.
    """

    batched = False

    def __init__(self, inner: Policy, seed: int | None = None):
        self.inner = inner
        self.name = f"sample:{inner.name}"
        self.order = inner.order
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)
        self._rng = np.random.default_rng(seed)

    def scores(self, obs: Obs) -> np.ndarray:
        return self.inner.scores(obs)

    def probabilities(self, obs: Obs) -> np.ndarray:
        """softmax of the scores over the unmasked servers (0 where masked)."""
        s = np.asarray(self.scores(obs), dtype=np.float64)
        finite = np.isfinite(s)
        e = np.zeros_like(s)
        if not finite.any():  # nothing allowed: index 0, what the greedy argmax picks
            e[0] = 1.0
            return e
        e[finite] = np.exp(s[finite] - s[finite].max())
        return e / e.sum()

    def act(self, obs: Obs) -> int:
        p = self.probabilities(obs)
        return int(self._rng.choice(p.size, p=p))

    def describe(self) -> dict:
        return {**self.inner.describe(), "name": self.name, "sampled": True}
