"""How long data takes to move: the one transfer rule, for the simulator, the planner's
rollouts, the encoder, the live runtime and the services.

A task's output of ``d`` GB reaches a task on another node after ``d / B + L`` seconds
(:meth:`Network.transfer_s`; ``B`` the bandwidth in GB/s, ``L`` the latency in s; paper §3,
B = 10, L = 0.01) and at once on the same node. Where transfers delay starts
(``mdp.transfer_delays_start``, the live runtime), a task starts once its last input from
another node arrived (:meth:`Network.start_delay`); the paper counts the transfer from the first
parent to finish in the reward only.

Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Network"]


@dataclass(frozen=True)
class Network:
    """The cluster's network (module docstring)."""
    bandwidth_gb_s: float = 10.0
    latency_s: float = 0.01

    def transfer_s(self, output_gb: float) -> float:
        """Seconds for ``output_gb`` to reach another node."""
        return output_gb / self.bandwidth_gb_s + self.latency_s

    def start_delay(self, inputs: Iterable[tuple[Any, float]], node: Any) -> float:
        """Seconds until every input ``(where it is, output GB)`` not already on ``node`` has
        arrived there (0 when all are local or there is none)."""
        bw, lat = self.bandwidth_gb_s, self.latency_s
        return max((d / bw + lat for where, d in inputs if where != node), default=0.0)
