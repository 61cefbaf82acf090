"""Steps of an agent program submitted from inside a running primitive, in the library
(``scale_ray.live.program()``; the scheduler service's form is ``scale_ray.client.program()``).

A primitive runs in a Ray worker; the :class:`~scale_ray.live.LiveScheduler` that placed it
lives in the driver. With ``LiveConfig.program_gateway`` on, the scheduler starts one actor,
:class:`ProgramGateway` (no CPU, a name of its own), and tells every run it starts the actor's
name and the run's workflow (the step context that ``journal.current_step`` returns in the
body). Inside the body, :func:`program` returns a :class:`RemoteProgram`: ``submit(dag)`` hands
the calls to the actor and returns a :class:`RemoteStep`, whose ``result()`` waits for them.
A driver thread (:class:`GatewayPump`) takes what the actor holds and submits each as the next
step of that workflow's program (``programs.program_of``): its arrival for the order, the fair
share, the journal and hedging are the program's, as for ``Program.submit`` in the driver.
When the step is done the pump hands the actor the step's output refs, or its error.

A primitive that waits on its steps holds its server meanwhile: if every server is held by a
waiting parent, the steps cannot start (as nested Ray tasks that wait on each other). Give the
calls that fan out fewer servers than the cluster has, or return and let the driver go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
import weakref
from typing import Any

from .journal import current_step
from .programs import program_of

log = logging.getLogger(__name__)

__all__ = ["ProgramGateway", "GatewayPump", "RemoteProgram", "RemoteStep", "program"]

TAKE_S = 0.5  # the pump's long poll: how long a shutdown may wait for it


class ProgramGateway:
    """The actor between the workers and the driver (module docstring): steps submitted and
    not yet taken, and each step's outcome until its submitter reads it. Async: ``take`` and
    ``result`` wait without holding the actor."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, int, Any]] = []
        self._outcome: dict[int, tuple[str, Any]] = {}
        self._ready: dict[int, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._n = 0

    async def submit(self, step: int, dag: Any) -> int:
        """Queue ``dag`` as the next step of workflow ``step``'s program; its token."""
        self._n += 1
        self._ready[self._n] = asyncio.Event()
        self._pending.append((self._n, step, dag))
        self._wake.set()
        return self._n

    async def take(self, timeout_s: float) -> list[tuple[int, int, Any]]:
        """Every step queued, waiting up to ``timeout_s`` for one (the driver's pump)."""
        if not self._pending:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        out, self._pending = self._pending, []
        return out

    async def finish(self, token: int, outcome: tuple[str, Any]) -> None:
        """The driver: step ``token`` is done; ``("ok", [output refs])`` or ``("error", msg)``."""
        self._outcome[token] = outcome
        self._ready[token].set()

    async def result(self, token: int) -> tuple[str, Any]:
        """Wait for step ``token`` to be done and hand over its outcome (once)."""
        ready = self._ready.get(token)
        if ready is None:
            return "error", f"step token {token} is unknown (already read, or never submitted)"
        await ready.wait()
        del self._ready[token]
        return self._outcome.pop(token)


class GatewayPump:
    """The driver's side: starts the actor, sets the runs' step context, and submits what the
    actor holds as program steps on a thread of its own (module docstring)."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.name = f"scale-program-gateway-{uuid.uuid4().hex[:12]}"
        self._handles: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.actor: Any = None
        self.submitted = 0  # steps submitted from primitives so far

    def start(self) -> None:
        import ray

        self.actor = ray.remote(num_cpus=0, max_concurrency=1000)(ProgramGateway).options(
            name=self.name).remote()
        self.sched.runs.step_context = self._context
        self._thread = threading.Thread(target=self._loop, name="scale-program-gateway",
                                        daemon=True)
        self._thread.start()

    def _context(self, h: Any) -> tuple:
        """What a run of workflow ``h`` finds in ``journal.current_step()``: (its id, its
        tenant, no service app, the gateway's name)."""
        self._handles[h.id] = h
        return h.id, h.tenant, None, self.name

    def _loop(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                steps = ray.get(self.actor.take.remote(TAKE_S))
            except Exception:  # noqa: BLE001 - the actor or Ray went away: stop quietly
                if not self._stop.is_set():
                    log.exception("program gateway: taking steps failed; no more steps from "
                                  "primitives")
                return
            for token, step, dag in steps:
                self._submit(token, step, dag)

    def _submit(self, token: int, step: int, dag: Any) -> None:
        h = self._handles.get(step)
        try:
            if h is None:
                raise LookupError(f"workflow {step} is not held by this scheduler any more")
            new = program_of(self.sched, h).submit(dag)
        except Exception as e:  # noqa: BLE001 - the submitter gets it, the pump goes on
            self.actor.finish.remote(token, ("error", f"{type(e).__name__}: {e}"))
            return
        self.submitted += 1
        new.add_done_callback(lambda x: self.actor.finish.remote(token, _outcome(x)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(TAKE_S * 4)
            self._thread = None
        if self.actor is not None:
            import ray

            ray.kill(self.actor)
            self.actor = None


def _outcome(h: Any) -> tuple[str, Any]:
    if h.error is not None:
        return "error", f"step {h.name!r} failed: {type(h.error).__name__}: {h.error}"
    return "ok", [h.result_refs[i] for i in h.workflow.outputs]


class RemoteStep:
    """A step submitted from inside a primitive; ``result()`` waits for its output's value (a
    list for several outputs), as ``WorkflowHandle.result`` does."""

    def __init__(self, actor: Any, token: int) -> None:
        self._actor, self.token = actor, token
        self._value: Any = None
        self._read = False

    def result(self, timeout: float | None = None) -> Any:
        import ray

        if not self._read:
            kind, got = ray.get(self._actor.result.remote(self.token), timeout=timeout)
            if kind != "ok":
                raise RuntimeError(got)
            vals = ray.get(got, timeout=timeout)
            self._value, self._read = (vals[0] if len(vals) == 1 else vals), True
        return self._value


class RemoteProgram:
    """The program of the workflow whose primitive is running (:func:`program`)."""

    def __init__(self, step: int, gateway: str) -> None:
        self.step, self.gateway = step, gateway

    def submit(self, workflow: Any) -> RemoteStep:
        """Submit the next step (what ``LiveScheduler.submit`` takes: calls, a Ray DAG);
        its arguments travel by value."""
        import ray

        actor = ray.get_actor(self.gateway)
        return RemoteStep(actor, ray.get(actor.submit.remote(self.step, workflow)))

    def __repr__(self) -> str:
        return f"RemoteProgram(step={self.step})"


def program() -> RemoteProgram:
    """Inside a primitive the library's scheduler runs (with ``LiveConfig.program_gateway``):
    the program of the workflow it belongs to, to submit the calls it decides on::

        @primitive
        def plan(question):
            steps = [program().submit(search.bind(t)) for t in decide(question)]
            return [s.result(timeout=300) for s in steps]
    """
    ctx = current_step()
    if ctx is None or len(ctx) < 4 or ctx[3] is None:
        where = ("the scheduler service runs this primitive: use scale_ray.client.program()"
                 if ctx is not None else "not inside a primitive the live scheduler runs")
        raise RuntimeError(f"scale_ray.live.program(): {where}; in the library, start the "
                           f"scheduler with LiveConfig(program_gateway=True)")
    return RemoteProgram(ctx[0], ctx[3])
