"""The one scheduling interface: a decision's state in, a node out.

Every policy answers :meth:`Policy.decide` with the :class:`State` of one decision: the table of
nodes (``envs.nodes.NodeTable``), the task being placed, the clock, and where its inputs are.
Heuristics read the table; trained networks read the observation the state encodes
(:meth:`State.observe`, ``envs.encoding``) and answer through the guard
(:class:`ObservationPolicy`); planners (:class:`Planner`) try candidates on a simulator of the
present (:meth:`State.simulator`). The simulator, Serve and the live runtime build states and
ask any policy alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from envs.nodes import NodeTable

Obs = Mapping[str, np.ndarray]


class State(Protocol):
    """One decision as a policy sees it (the simulator is one; Serve and the live runtime build
    theirs): ``table``, the nodes; ``task``, the task being placed (``demands``, ``compute``,
    ``memory_gb``, ``waits``: how often a pick for it did not start it); ``now``, model seconds;
    ``parent``, the node holding its first finished parent's output (-1: none); ``transfer_s``,
    that output's transfer to another node (0: none); ``transfer_delays``, whether transfers
    delay starts."""

    table: "NodeTable"
    task: Any
    now: float
    parent: int
    transfer_s: float
    transfer_delays: bool

    def observe(self) -> dict[str, np.ndarray]:
        """The observation of this decision under the env's encoder (``envs.encoding``)."""

    def simulator(self) -> Any:
        """The present as a simulator at this decision (planners)."""


class Policy(ABC):
    """Chooses a node for the current task.

    Attributes:
        name: short name used in tables and by ``--policy``.
        order: the ready-task order (``mdp.order``, ``envs.order``) the policy needs, or None
            when it works under any (HEFT: ``"upward_rank"``, its definition). A config that
            sets another order is an error (``envs.order.resolve``).
        batched: a trained network whose ``act_batch`` is much cheaper per decision than
            ``act``; the evaluation harness then steps episodes in lockstep.
    """

    name: str = "policy"
    order: str | None = None
    batched: bool = False

    def reset(self, seed: int | None = None) -> None:
        """Forget per-episode state (round-robin pointer, random generator, guard counters)."""

    @abstractmethod
    def decide(self, state: State) -> int:
        """The node for ``state.task``; a node it does not fit now is a wait."""

    def describe(self) -> dict:
        """Metadata for ``GET /v1/policy`` and reports."""
        return {"name": self.name, "algorithm": "heuristic", "version": "builtin",
                "order": self.order}


class ObservationPolicy(Policy):
    """A policy that acts on an encoded observation (a trained network): :meth:`scores` per
    node, higher is better, ``-inf`` where the mask forbids. ``encoder``: the encoder it was
    trained with (``env.encoder``); ``features``: its constants. :meth:`decide` answers through
    ``guard`` (``policies.guard``, None: unguarded)."""

    encoder: str = "paper"
    features: Any = None
    guard: Any = None

    @abstractmethod
    def scores(self, obs: Obs) -> np.ndarray:
        """Per-node preference (N,), higher is better; ``-inf`` where the mask forbids."""

    def act(self, obs: Obs) -> int:
        """Index of the chosen node (highest score, lowest index on ties)."""
        return int(np.argmax(self.scores(obs)))

    def act_batch(self, obs: Obs) -> np.ndarray:
        """Actions for a batch of observations (leading batch axis on every array)."""
        b = np.asarray(obs["task"]).shape[0]
        return np.array([self.act({k: np.asarray(v)[i] for k, v in obs.items()})
                         for i in range(b)], dtype=np.int64)

    def reset(self, seed: int | None = None) -> None:
        if self.guard is not None:
            self.guard.reset()

    def decide(self, state: State) -> int:
        a = self.act(state.observe())
        return a if self.guard is None else self.guard.check(state, a)[0]


@runtime_checkable
class Planner(Protocol):
    """A policy that plans on a simulator of the present (``policies.lookahead``). Every
    consumer checks :func:`is_planner` and calls it through these methods only:

    * the simulator (``scale-ray eval``, ``distill``): :meth:`decide` with the simulator;
    * Serve's ``/v1/schedule`` and the live runtime: :meth:`plan` on a snapshot of the
      present (``envs.snapshot``), with a :meth:`fresh` copy per thread or round;
    * ``env``: the rules and constants it plans with. Never guarded (``planner = True``).
    """

    name: str
    planner: bool
    env: Any
    last_deferred: bool  # the last answer deferred its task (a wait that reserves nothing)

    def decide(self, state: Any) -> int:
        """The node for ``state.task`` (``state`` a simulator)."""

    def plan(self, servers: Sequence[Any], workflows: Sequence[Any], focus: tuple[int, int],
             waiting: Mapping[tuple[int, int], int] | None = None, env: Any = None,
             deferred: Sequence[tuple[int, int]] = ()) -> int:
        """The node position for task ``focus`` of a snapshot of the present; ``waiting``:
        this round's waits for busy nodes (reserved), ``deferred``: this round's defers."""

    def fresh(self) -> "Planner":
        """A planner with the same settings and its own state."""


def is_planner(policy: Any) -> bool:
    """Whether ``policy`` is a :class:`Planner` (it plans on the present, not a table alone)."""
    return isinstance(policy, Planner)


def masked(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scores with masked entries set to -inf (float64)."""
    out = np.asarray(scores, dtype=np.float64).copy()
    out[np.asarray(mask) <= 0.5] = -np.inf
    return out


class SampledPolicy(ObservationPolicy):
    """Draws the node from softmax(scores) instead of taking the argmax: the stochastic policy
    a PPO or SAC actor was trained with (RLlib's ``explore=True``), where evaluation and serving
    use the greedy one. ``--policy sample:<spec>`` in ``scale-ray eval``.

    Reproducible per episode: :meth:`reset` seeds the generator (the evaluation harness passes a
    fixed seed per episode). Not batched, so that an episode's draws never depend on which other
    episodes share its batch.
    """

    batched = False

    def __init__(self, inner: ObservationPolicy, seed: int | None = None):
        self.inner = inner
        self.name = f"sample:{inner.name}"
        self.order = inner.order
        self.encoder, self.features, self.guard = inner.encoder, inner.features, inner.guard
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)
        self._rng = np.random.default_rng(seed)

    def scores(self, obs: Obs) -> np.ndarray:
        return self.inner.scores(obs)

    def probabilities(self, obs: Obs) -> np.ndarray:
        """softmax of the scores over the unmasked nodes (0 where masked)."""
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
