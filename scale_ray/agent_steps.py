"""An agent's calls as one program, from any agent framework (issue 47, item 4): the framework
keeps its control flow; each call it makes runs on the cluster as a step of one agent program
(scale_ray/live/programs.py), so the scheduler orders the request's later calls by the request's
arrival, not each call's.

    from scale_ray.agent_steps import Steps

    with Steps(sched, "react") as steps:       # a LiveScheduler; Steps() uses the service
        plan = steps.run(think.bind(question))   # a @primitive call: run as a step, its value
        obs = steps.run(search.bind(plan))

``per_call=True`` submits each call on its own instead (what an agent does without programs:
the comparison). ``response_s``: wall seconds from the first call's submission to the last
call's answer, as the agent sees them, the same in both ways. A LangGraph graph that does this:
:mod:`scale_ray.langgraph_agent` (docs/live.md, "Agent programs").
"""

from __future__ import annotations

import time
from typing import Any

from scale_ray import client


class Steps:
    """Run calls one at a time as steps of one agent program (module docstring).

    ``sched``: a started :class:`~scale_ray.live.LiveScheduler`, or None for the scheduler
    service (``scale_ray.client``; ``tenant`` and ``app`` as there). ``timeout_s``: the longest
    wait for one call's answer."""

    def __init__(self, sched: Any = None, name: str = "agent", per_call: bool = False,
                 tenant: str | None = None, app: str | None = None, timeout_s: float = 600.0):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: {timeout_s!r} must be > 0")
        self.sched, self.name, self.per_call = sched, name, per_call
        self.tenant, self.app, self.timeout_s = tenant, app, timeout_s
        # the library's Program; the service's (client.ServiceProgram) once its first step is in
        self.program = None if sched is None or per_call else sched.program(name, tenant)
        self.first: Any = None  # the service: the program's first step (later ones name it)
        self.calls = 0
        self.started_wall: float | None = None
        self.finished_wall: float | None = None

    def submit(self, workflow: Any, *inputs: Any, **kw_inputs: Any) -> Any:
        """Submit the next call (anything ``submit`` takes); returns its handle at once."""
        if self.started_wall is None:
            self.started_wall = time.perf_counter()
        self.calls += 1
        if self.program is not None:  # a step of the library's or the service's program
            return self.program.submit(workflow, *inputs, name=self.name, **kw_inputs)
        if self.sched is not None:
            return self.sched.submit(workflow, *inputs, name=self.name, tenant=self.tenant,
                                     **kw_inputs)
        app = {"app": self.app} if self.app is not None else {}
        h = client.submit(workflow, *inputs, tenant=self.tenant, name=self.name, **app,
                          **kw_inputs)
        if not self.per_call:  # the first step: later ones continue its program
            self.first, self.program = h, client.program(h, **app)
        return h

    def run(self, workflow: Any, *inputs: Any, **kw_inputs: Any) -> Any:
        """Submit the next call and wait for its value (the agent needs it to go on)."""
        value = self.submit(workflow, *inputs, **kw_inputs).result(timeout=self.timeout_s)
        self.finished_wall = time.perf_counter()
        return value

    @property
    def response_s(self) -> float | None:
        """Wall s from the first submission to the last answer (None before any answer)."""
        if self.started_wall is None or self.finished_wall is None:
            return None
        return self.finished_wall - self.started_wall

    def close(self) -> None:
        """No more calls: the program ends when its steps are done (the library's, or the
        service's: ``client.ServiceProgram.close``)."""
        if self.program is not None:  # (closing twice does nothing)
            self.program.close()

    def __enter__(self) -> "Steps":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
