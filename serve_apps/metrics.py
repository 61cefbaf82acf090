"""The scheduler service's metrics, through ``ray.util.metrics``: they appear on Ray's Prometheus
endpoint (every node's metrics export port, ``/metrics``) and in Ray's dashboard / Grafana
(configs/grafana/scale_scheduler.json), named ``ray_scale_scheduler_<name>``.

One thread updates them every ``interval_s`` from the scheduler's counters and the service's
records, so request paths only append to buffers (nothing of Ray's metrics runs on the event
loop). What is exported (docs/serving.md, "Metrics"):

* gauges: ``queued_tasks`` and ``unfinished_workflows`` per tenant, ``ready_tasks``,
  ``running_tasks``, ``servers``, ``decisions_per_s`` (over the last interval),
  ``journal_bytes``; with a sizer (``env.sizing``, scale_ray.live.sizing) ``nodes`` and
  ``nodes_wanted`` per tier, ``cluster_cost`` and ``slo_attainment``;
* counters: ``decisions``, ``waits``, ``guard_overrides``, ``lost_runs``, ``rejected`` (per
  tenant and reason, every refusal once its tenant is known: ``quota`` is a 429,
  ``does_not_fit``, ``no_servers``, ``too_large``, ``unauthorized``, ``not_found``, ``schema``,
  ``not_allowed``, ``bad_key``, ``program_closed``...: serve_apps.refusals), ``audit`` (the
  audit lines, per action and reason, a 413 before authentication included:
  serve_apps.tenants);
* histograms: ``decision_latency_ms`` (the policy's answer to one placement question),
  ``workflow_response_s`` per tenant and policy (an agent program's steps each count), and
  ``program_response_s``: a closed agent program, from its start to its last step's end.

The ``tenant`` label is :func:`serve_apps.tenants.tenant_label` of the tenant (``t-`` + 8 hex of
its name's SHA-256; a failed token's ``?`` as is) unless ``SchedulerArgs.metrics_tenant_names``:
whoever reads the metrics port learns no tenant name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from scale_ray.live.handles import WorkflowHandle

from .tenants import audit_counts, tenant_label

log = logging.getLogger("ray.serve")

PREFIX = "scale_scheduler_"
RESPONSE_S_BOUNDARIES = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0]
LATENCY_MS_BOUNDARIES = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0]
COUNTERS = {"decisions": "decisions", "waits": "waits", "lost": "lost_runs"}
T = ("tenant",)
# name -> (kind, description, tag keys); exported as ray_scale_scheduler_<name> (counters _total)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "queued_tasks": ("gauge", "unfinished tasks of unfinished workflows", T),
    "unfinished_workflows": ("gauge", "accepted, not finished", T),
    "ready_tasks": ("gauge", "tasks ready to run, not placed", ()),
    "running_tasks": ("gauge", "primitives running now", ()),
    "servers": ("gauge", "servers the policy sees", ()),
    "decisions_per_s": ("gauge", "placements over the last interval", ()),
    "journal_bytes": ("gauge", "size of the journal (live.storage)", ()),
    "nodes": ("gauge", "nodes per tier the sizer counts (env.sizing; live.sizing_apply)",
              ("tier",)),
    "nodes_wanted": ("gauge", "nodes per tier the sizer's last plan wants", ("tier",)),
    "cluster_cost": ("gauge", "the nodes' cost so far at their tiers' price_per_hour", ()),
    "slo_attainment": ("gauge", "share of the SLO windows over that met env.sizing.slo", ()),
    "decisions": ("counter", "placement decisions", ()),
    "waits": ("counter", "policy picks of a busy server (the task waited)", ()),
    "guard_overrides": ("counter", "picks the guard replaced", ()),
    "lost_runs": ("counter", "runs lost with their node or actor", ()),
    "rejected": ("counter", "submits and requests refused", ("tenant", "reason")),
    "audit": ("counter", "audit lines: submits, cancels, refusals, token failures",
              ("action", "reason")),
    "decision_latency_ms": ("histogram", "the policy's answer to one placement question (ms)",
                            ()),
    "workflow_response_s": ("histogram", "submission to the last task's completion (wall s)",
                            ("tenant", "policy")),
    "program_response_s": ("histogram", "an agent program's start to its last step's end, "
                                        "once closed (wall s)", ("tenant", "policy")),
}

__all__ = ["ServiceMetrics", "PREFIX", "METRICS", "parse_prometheus", "label_for",
           "node_target", "scheduler_series"]
SERIES = "ray_" + PREFIX  # the exported names' common start


def node_target(node_id: str | None = None) -> str | None:
    """``host:port`` of the Prometheus endpoint of node ``node_id`` (default: this process's):
    its metrics export port (``ray start --metrics-export-port``), where the metrics of every
    process on that node appear, this service's among them. Of the targets Ray lists in its
    ``prom_metrics_service_discovery.json``, the replica node's is the one with the
    ``ray_scale_scheduler_*`` series. None when Ray reports no port."""
    import ray

    node_id = node_id or ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node_id and n.get("MetricsExportPort"):
            return f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}"
    return None


def scheduler_series(text: str) -> str:
    """Of a Prometheus text page, the scheduler's series (``ray_scale_scheduler_*``) with their
    ``# HELP`` / ``# TYPE`` lines, in the page's order: what ``GET /metrics`` serves."""
    keep = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line
        if name.startswith(SERIES):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def label_for(service: Any) -> Any:
    """The tenant label function of ``service``: the name itself when its args opt in
    (``metrics_tenant_names``), else :func:`~serve_apps.tenants.tenant_label`."""
    names = bool(getattr(getattr(service, "args", None), "metrics_tenant_names", False))
    return str if names else tenant_label


class ServiceMetrics:
    """The service's ``ray.util.metrics`` and the thread that updates them."""

    def __init__(self, service: Any, interval_s: float = 1.0):
        from ray.util import metrics as m

        self.service, self.interval_s = service, interval_s
        made = {}
        for name, (kind, doc, tags) in METRICS.items():
            if kind == "histogram":
                bounds = LATENCY_MS_BOUNDARIES if name.endswith("_ms") else RESPONSE_S_BOUNDARIES
                made[name] = m.Histogram(PREFIX + name, doc, boundaries=bounds, tag_keys=tags)
            else:
                made[name] = (m.Gauge if kind == "gauge" else m.Counter)(PREFIX + name, doc,
                                                                         tag_keys=tags)
        self.gauges = {k: v for k, v in made.items() if METRICS[k][0] == "gauge"}
        self.counters = {k: v for k, v in made.items() if METRICS[k][0] == "counter"}
        self.latency, self.response = made["decision_latency_ms"], made["workflow_response_s"]
        self.program_response = made["program_response_s"]
        self._lock = threading.Lock()
        self._refused: dict[tuple[str, str], int] = defaultdict(int)
        self._responses: list[tuple[str, str, float]] = []
        self._programs: list[tuple[str, str, float]] = []
        self._last: dict[str, float] = {}
        self._last_t = time.monotonic()
        self._tenants: set[str] = set()
        self._label = label_for(service)
        self._audited: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-metrics", daemon=True)

    # -------------------------------------------------------- from request paths (any thread)
    def refused(self, tenant: str, reason: str) -> None:
        with self._lock:
            self._refused[(tenant, reason)] += 1

    def finished(self, tenant: str, policy: str, h: WorkflowHandle) -> None:
        if h.response_s is not None:
            with self._lock:
                self._responses.append((tenant, policy, h.response_s))

    def program_finished(self, tenant: str, policy: str, response_s: float) -> None:
        with self._lock:
            self._programs.append((tenant, policy, response_s))

    # -------------------------------------------------------- the updater
    def start(self) -> "ServiceMetrics":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.update()
            except Exception:  # noqa: BLE001 - metrics must never take the service down
                log.exception("scheduler metrics: update failed")

    def update(self) -> None:
        """Set every metric from the scheduler's counters and the service's records."""
        svc = self.service
        sched = svc.sched
        counts = dict(sched.counters)
        counts["guard_overrides"] = sched.guard_overrides()
        for key, name in (*COUNTERS.items(), ("guard_overrides", "guard_overrides")):
            delta = counts.get(key, 0) - self._last.get(key, 0)
            if delta > 0:
                self.counters[name].inc(delta)
            self._last[key] = counts.get(key, 0)
        now = time.monotonic()
        made = counts.get("decisions", 0) - self._last.get("rate_base", 0)
        self.gauges["decisions_per_s"].set(made / max(now - self._last_t, 1e-9))
        self._last["rate_base"], self._last_t = counts.get("decisions", 0), now
        for ms in sched.take_decision_latencies():
            self.latency.observe(ms)
        with self._lock:
            refused, self._refused = self._refused, defaultdict(int)
            responses, self._responses = self._responses, []
            programs, self._programs = self._programs, []
        label = self._label
        for (tenant, reason), n in refused.items():
            self.counters["rejected"].inc(n, tags={"tenant": label(tenant), "reason": reason})
        for key, n in audit_counts().items():
            if n > self._audited.get(key, 0):
                self.counters["audit"].inc(n - self._audited.get(key, 0),
                                           tags={"action": key[0], "reason": key[1] or "-"})
                self._audited[key] = n
        for hist, done in ((self.response, responses), (self.program_response, programs)):
            for tenant, policy, s in done:
                hist.observe(s, tags={"tenant": label(tenant), "policy": policy})
        queued: dict[str, int] = defaultdict(int)
        unfinished: dict[str, int] = defaultdict(int)
        for wid, h in svc.registry.items():
            if not h.done():
                tenant = svc.registry.owner.get(wid, "?")
                unfinished[tenant] += 1
                queued[tenant] += sum(1 for f in h.task_finish_wall if f is None)
        for tenant in self._tenants | set(unfinished):  # a tenant that drained reads 0
            tags = {"tenant": label(tenant)}
            self.gauges["queued_tasks"].set(queued.get(tenant, 0), tags=tags)
            self.gauges["unfinished_workflows"].set(unfinished.get(tenant, 0), tags=tags)
        self._tenants = set(unfinished)
        load = sched.load()
        self.gauges["ready_tasks"].set(load["ready_tasks"])
        self.gauges["running_tasks"].set(load["running_tasks"])
        self.gauges["servers"].set(load["servers"])
        sizing = getattr(sched, "sizing", None)  # (a test's stand-in scheduler has none)
        plan = sizing.snapshot() if sizing is not None else None
        if plan and "wanted" in plan:
            for tier, n in plan["nodes"].items():
                self.gauges["nodes"].set(n, tags={"tier": tier})
            for tier, n in plan["wanted"].items():
                self.gauges["nodes_wanted"].set(n, tags={"tier": tier})
            self.gauges["cluster_cost"].set(plan["cost"])
            if plan["slo"]["attainment"] is not None:
                self.gauges["slo_attainment"].set(plan["slo"]["attainment"])
        size = svc.journal.cached_size()
        if size is not None:
            self.gauges["journal_bytes"].set(size.get("bytes", 0))


def parse_prometheus(text: str, prefix: str = "ray_" + PREFIX, worker: str | None = None
                     ) -> dict[str, float]:
    """``name{labels}`` -> value of the samples in a Prometheus text page whose name starts
    with ``prefix`` (Ray's own labels such as ``SessionName`` dropped; the same series of
    several processes summed). ``worker``: only that process's samples (Ray's ``WorkerId``
    label: a replica that replaced another has series of its own)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        if worker is not None and f'WorkerId="{worker}"' not in line:
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        kept = [kv for kv in labels.rstrip("}").split(",") if kv and kv.split("=", 1)[0] in (
            "tenant", "reason", "policy", "le", "action")]
        try:
            v = float(value)
        except ValueError:
            continue
        k = f"{name}{{{','.join(kept)}}}" if kept else name
        out[k] = out.get(k, 0.0) + v  # the same series from several nodes' agents: summed
    return out
