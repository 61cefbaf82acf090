"""Where the simulator's workflows come from (``sim.arrivals``, a part the simulator owns and its
fork copies): the arrival times (Poisson at ``workload.arrival_rate_16`` × N / 16 with the rate
schedule, up to the horizon; with ``workload.curve`` the non-homogeneous process of
``envs.arrival_curves``; or a scripted list of ``(time_s, workflow)``) and the workflows
(the workload source), each drawn from its own random generator, so that arrivals never depend on
what a policy did."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from .agents import expected_gpu_seconds
from .arrival_curves import ArrivalRate, CurveArrivalProcess, burst_seed
from .config import ConfigError, EnvConfig
from .demands import GPU
from .events import ARRIVAL, EventQueue
from .fork import copy_rng, copy_source
from .workload import ArrivalProcess, WorkflowSpec, make_source


@lru_cache(maxsize=32)
def _gpu_seconds(agents) -> float:
    return expected_gpu_seconds(agents, np.random.default_rng(12345))


def base_rate(cfg: EnvConfig) -> float:
    """Workflows per second before the rate schedule: ``arrival_rate_16 x N / 16``, or with
    ``workload.gpu_load`` the rate that offers that load: load x the cluster's GPU speed (GPUs x
    their speed) / the expected GPU-seconds of a request on a speed-1 GPU (agent requests)."""
    w = cfg.workload
    if w.gpu_load is None:
        return w.arrival_rate_16 * cfg.cluster.servers / 16.0
    if w.source != "agents":
        raise ConfigError(f"workload.gpu_load: sets the rate of agent requests (workload.source: "
                          f"agents), not of {w.source!r}; use arrival_rate_16")
    cap = sum(float(nd.resources.get(GPU, 0.0)) * nd.gpu_speed for nd in cfg.cluster.nodes())
    if cap <= 0:
        raise ConfigError("workload.gpu_load: the cluster has no GPU, so no load sets a rate")
    return w.gpu_load * cap / _gpu_seconds(w.agents)


def arrival_rate(cfg: EnvConfig, seed: np.random.SeedSequence | int | None = None) -> ArrivalRate:
    """The arrival rate of ``cfg`` as a function of time (:class:`ArrivalRate`: ``rate(t)``,
    ``multiplier(t)``, ``expected_arrivals(t0, t1)``): :func:`base_rate` (a trace's own rate for
    ``workload.curve.kind: trace``) x the curve x ``rate_schedule``, 0 from ``horizon_s`` on.
    ``seed`` draws the bursts (an episode's: ``sim.arrivals.rate``); None: their mean factor."""
    w = cfg.workload
    base = 1.0 if w.curve.kind == "trace" else base_rate(cfg)  # a trace sets its own rate
    return ArrivalRate(base, w.horizon_s, w.curve, w.rate_schedule, seed)


class Arrivals:
    """The next arrival's time (:meth:`next_time`) and workflow (:meth:`next_workflow`) of one
    episode; ``done`` once no more will come."""

    def __init__(self, cfg: EnvConfig, rng_arrivals: np.random.Generator,
                 rng_workload: np.random.Generator,
                 scripted: Sequence[tuple[float, WorkflowSpec]] | None = None) -> None:
        w = cfg.workload
        self.rng_arrivals, self.rng_workload = rng_arrivals, rng_workload
        self.source = make_source(w)
        self._rate: ArrivalRate | None = None
        if w.curve.active:  # workload.curve: the exact non-homogeneous process
            self._rate = arrival_rate(cfg, burst_seed(rng_arrivals))
            self.process = CurveArrivalProcess(self._rate, rng_arrivals)
        else:  # the constant rate (with rate_schedule) as it always was
            self.process = ArrivalProcess(base_rate(cfg), w.rate_schedule, w.horizon_s,
                                          rng_arrivals)
        self._cfg = cfg
        self.scripted: list[tuple[float, WorkflowSpec]] | None = None
        if scripted is not None:
            self.scripted = sorted(scripted, key=lambda tw: tw[0])[::-1]  # pop() from the end
            if any(t < 0 or not math.isfinite(t) for t, _ in self.scripted):
                raise ValueError("arrivals: times must be finite and >= 0")
        self.done = False

    @property
    def rate(self) -> ArrivalRate:
        """This episode's arrival rate (its bursts drawn), a pure function of time: rate,
        multiplier, ``expected_arrivals(t0, t1)`` (envs.arrival_curves)."""
        if self._rate is None:
            self._rate = arrival_rate(self._cfg)
        return self._rate

    def next_time(self, t: float) -> float | None:
        """When the next workflow arrives after ``t``; None (and ``done``) when none will."""
        if self.scripted is not None:
            nxt = self.scripted[-1][0] if self.scripted else None
        else:
            nxt = self.process.next_time(t)
        if nxt is None:
            self.done = True
        return nxt

    def schedule(self, t: float, events: EventQueue) -> None:
        """The next arrival after ``t`` into ``events`` (none once no more will come)."""
        nxt = self.next_time(t)
        if nxt is not None:
            events.push(nxt, ARRIVAL, None, None)

    def next_workflow(self) -> WorkflowSpec:
        """The workflow arriving now (call once per arrival :meth:`next_time` announced)."""
        if self.scripted is not None:
            return self.scripted.pop()[1]
        return self.source.next_workflow(self.rng_workload)

    def copy(self, rngs: Sequence[np.random.Generator | None] = (None, None)) -> "Arrivals":
        """An independent copy in this one's state; ``rngs``: two generators (arrivals,
        workload) it may take over (their states are overwritten)."""
        out = object.__new__(Arrivals)
        out.rng_arrivals = copy_rng(self.rng_arrivals, rngs[0])
        out.rng_workload = copy_rng(self.rng_workload, rngs[1])
        out.source = copy_source(self.source)
        out.process = self.process.copy(out.rng_arrivals)
        out._rate, out._cfg = self._rate, self._cfg
        out.scripted = None if self.scripted is None else list(self.scripted)
        out.done = self.done
        return out

    def stop(self) -> None:
        """No more workflows come (the caller drops the pending arrival event)."""
        self.scripted = []
        self.done = True

    def resample(self, states: tuple[dict, dict]) -> None:
        """Draw what comes next from generators in ``states`` (arrivals, workload): the gaps and
        workflows drawn ahead are forgotten (a planner that samples the future)."""
        self.rng_arrivals.bit_generator.state = states[0]
        self.rng_workload.bit_generator.state = states[1]
        self.process.forget_drawn()
        forget = getattr(self.source, "forget_drawn", None)
        if forget is not None:
            forget()
