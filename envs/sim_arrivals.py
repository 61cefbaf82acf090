"""Workflow arrivals of the simulator (a mixin of :class:`envs.simulator.Simulator`): the next
arrival (Poisson or a scripted list), a workflow's tasks built and their ready ones queued."""

from __future__ import annotations

from typing import Any

from .decision import READY
from .episode import TaskRecord, build_workflow
from .events import ARRIVAL
from .workload import WorkflowSpec


class Arrivals:
    """Arrival events and new workflows of the simulator (see the module docstring)."""

    def _schedule_next_arrival(self, t: float) -> None:
        if self._scripted is not None:
            nxt = self._scripted[-1][0] if self._scripted else None
        else:
            nxt = self._arrivals.next_time(t)
        if nxt is None:
            self.arrivals_done = True
        else:
            self.event_q.push(nxt, ARRIVAL, None, None)

    def _on_arrival(self, _a: Any, _b: Any) -> None:
        if self._scripted is not None:
            spec = self._scripted.pop()[1]
        else:
            spec = self._source.next_workflow(self.rng_workload)
        self._spawn_workflow(spec)
        self._schedule_next_arrival(self.t)

    def _spawn_workflow(self, spec: WorkflowSpec) -> None:
        t = self.t
        rt = self._rt
        kinds = shown = None
        if rt is not None:  # deciders see hints or estimates (envs.run_model)
            kinds = rt.kinds(spec)
            shown = rt.shown(spec, kinds)
        wf, new = build_workflow(spec, len(self.workflows), len(self.tasks), t,
                                 self._speed_by_memory, self.order,
                                 self._mean_compute, self._bw, self._lat, shown)
        if rt is not None:
            rt.arrive(new, spec, kinds, shown)
        self.workflows.append(wf)
        self.tasks.extend(new)
        self.outstanding += len(new)
        self.open_workflows += 1
        if self.trace is not None:
            self._emit({"t": t, "event": "arrival", "workflow": wf.id, "tasks": [
                {"task": tk.id, "compute_gflop": tk.nominal, "memory_gb": tk.memory_gb,
                 "output_gb": tk.output, "parents": [p.id for p in tk.parents]}
                | ({"kind": tk.kind, "shown_gflop": tk.compute} if rt is not None else {})
                for tk in new]})
        for task in new:
            if task.pending == 0:
                self._make_ready(task)

    def _make_ready(self, task: TaskRecord) -> None:
        task.state = READY
        self._queue.push(task.key, task.id, task)
