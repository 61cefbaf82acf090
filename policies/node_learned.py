"""A trained pointer network as a node policy of Ray's resource model (``envs.node_sim.Policy``:
``(table, task, now, rng) -> node``), guarded.

It sees what the gym env showed it in training (``envs.node_encoding``) and picks the node of
the highest masked score. A pick where the task does not fit now is a wait. The guard keeps the
policy from waiting without bound, as everywhere a learned policy acts: a wait is kept only
while some task runs (a finish will come) and the task has waited fewer than
:data:`policies.node_rules.MAX_WAITS` times; otherwise the task goes where EFT sends it
(counted in :attr:`LearnedNodePolicy.overrides`).

:func:`node_decider` names any of: a rule of ``policies.node_rules``, ``learned:PATH`` (this
policy from the artifact at PATH) or ``lookahead[:K]`` (the rollout planner of
``policies.node_lookahead`` trying K nodes, default 4) (``live.node_rule``, ``scale-ray bench live
--rules``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from envs.node_encoding import NODE_DIM, encode_nodes, encode_task
from envs.nodes import NodeTable

from .node_lookahead import NodeLookahead
from .node_rules import MAX_WAITS, NODE_POLICIES, eft, eft_spread, node_policy

LEARNED = "learned:"  # node_decider's prefix for an artifact path
PLANNER = "lookahead"  # node_decider's name of the rollout planner (lookahead[:K])


class LearnedNodePolicy:
    """The artifact at ``path`` (trained with ``cluster_model: nodes``) as a node policy."""

    def __init__(self, path: str | Path):
        from .artifact import ArtifactError, load_policy  # torch: only where one is used

        self.policy = load_policy(path)
        if self.policy.meta.get("cluster_model") != "nodes":
            raise ArtifactError(f"policy artifact {path}: trained on the paper's servers "
                                "(cluster_model slots); a node policy needs one trained with "
                                "cluster_model: nodes (configs/train/scale_nodes.yaml)")
        self.name = self.policy.name
        self.overrides = 0  # picks the guard replaced
        self._nodes = np.zeros((0, NODE_DIM), dtype=np.float32)

    def __call__(self, table: NodeTable, task: Any, now: float,
                 rng: np.random.Generator) -> int:
        if self._nodes.shape[0] != table.n:
            self._nodes = np.zeros((table.n, NODE_DIM), dtype=np.float32)
        mask = encode_nodes(table, task, now, self._nodes)
        pick = self.policy.act({"task": encode_task(task, now), "servers": self._nodes,
                                "action_mask": mask})
        if table.fits_now(pick, task.demands):
            return pick
        if task.waits < MAX_WAITS and any(table.running):  # a finish will come: wait
            return pick
        self.overrides += 1
        return eft(table, task, now, rng)


def node_decider(spec: str) -> Any:
    """A fresh node policy: ``learned:PATH`` (a :class:`LearnedNodePolicy`, guarded; a wrong
    artifact raises naming it), ``lookahead[:K]`` (a ``NodeLookahead``) or a rule's name
    (``policies.node_rules.node_policy``)."""
    why = node_decider_error(spec)
    if why is not None:
        raise ValueError(why)
    if spec.startswith(LEARNED):
        return LearnedNodePolicy(spec[len(LEARNED):])
    if spec.partition(":")[0] == PLANNER:
        return NodeLookahead(int(spec.partition(":")[2] or 4), base=eft_spread)
    return node_policy(spec)


def node_decider_error(spec: str) -> str | None:
    """Why ``spec`` names no node policy (None: it names one; an artifact is read only when
    the policy is made)."""
    name, sep, arg = spec.partition(":")
    if name == PLANNER and (not sep or (arg.isdigit() and 1 <= int(arg) <= 64)):
        return None
    if (spec.startswith(LEARNED) and arg) or (spec in NODE_POLICIES):
        return None
    return (f"node policy {spec!r}: choose one of {sorted(NODE_POLICIES)}, {LEARNED}PATH (a node "
            f"policy artifact) or {PLANNER}[:K] (the rollout planner trying K nodes, 1-64)")
