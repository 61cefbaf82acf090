"""``scale-ray bench live --setting autoscale`` (issue 72, item 6): our cluster sizing against
Ray's autoscaler path, live, on a local Ray cluster whose nodes come and go.

**The cluster** (:class:`ElasticCluster`): a local Ray cluster (its own temp dir and ports; a
head with no CPUs) whose nodes are the node types of configs/env/autoscale.yaml at the live scale
of :func:`live_env` (half an hour of the daily-shaped load, no bursts, at ``--time-scale``). A
node asked for joins after its type's launch delay (drawn from the tier's ``launch_s``, model s
x time scale, one stream of draws per arm from the same seed) plus the time Ray takes to start a
raylet; a node removed leaves at once. Both arms run on this one provider, so they see the same
delays.

* **ours** (``model/eft``): the live scheduler (EFT on whole Ray nodes, ``live.model: nodes``)
  with ``sizing.policy: model`` and ``live.sizing_apply: ray``; its plan's nodes wanted per type
  are launched, and a node it drains (no new placements) is removed once its runs have ended.
* **ray** (``ray/ray``): Ray's default placement (each task a Ray task with its demands) and
  Ray's autoscaler as :class:`policies.sizing.ray.RayAutoscaler` emulates it, fed live from the
  GCS (``ray.autoscaler.v2.sdk.get_cluster_status``: the pending task demand, each node's usage
  and idle time, the inputs Ray's autoscaler v2 reads), at Ray's defaults
  (``sizing.ray``: upscaling speed 1, idle timeout 300 s); its launches and idle terminations go
  through the same provider.

Cost: each node's life (join to leave, model s) x its type's price, with the billing minimum
(:class:`envs.accounting.Billing`, as the simulator bills); attainment: the share of 5-minute
windows (by arrival) whose p95 workflow response meets the SLO (:func:`envs.accounting.slo_report`);
``workflows_lost``: submitted and not completed. **Twin**: each arm's sizer and placement in the
simulator on the same requests and arrival times (``scale_ray.evaluation.run_episode``);
``max_twin_gap_points``: the largest gap between live and twin attainment, in points. JSON keys:
``rel_cost_vs_ray_autoscaler`` (ours / ray − 1), ``slo_attainment`` (ours),
``ray_autoscaler_slo_attainment``, ``max_twin_gap_points``, ``workflows_lost``, and per arm
``live`` and ``twin`` (cost, node-seconds per type, attainment, mean/p95/p99 workflow response,
the nodes over time).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from envs.accounting import Billing, slo_report
from envs.config import EnvConfig, replace, to_dict
from envs.sim_arrivals import Arrivals
from envs.sizing import NodeView, SizingView
from envs.workload import draw
from policies import get_policy
from policies.sizing.ray import RayAutoscaler
from scale_ray.bench.validity import MachineLoad, check, format_check, twin_ratio
from scale_ray.config import load_env
from scale_ray.evaluation import run_episode
from scale_ray.live import LiveScheduler
from scale_ray.live.ray_default import RayDefaultRunner
from scale_ray.bench import write_report
from scale_ray.relative import rel

from .agents_cluster import add_node, close, collected, cpuless_head, live_settings

log = logging.getLogger(__name__)

CONFIG = "configs/env/autoscale.yaml"
ARMS = ("model/eft", "ray/ray")
#: the node types at live scale: 4 CPUs a node (a quarter of autoscale.yaml's, at a quarter of
#: the CPU node's price; a GPU node keeps its GPU and price), one of each type at the start
LIVE_NODES = {
    "cpu16": {"count": 1, "resources": {"CPU": 4, "memory": 16}, "price_per_hour": 0.192,
              "max_nodes": 6},
    "a10g": {"count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1}, "max_nodes": 4},
    "a100": {"count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1}, "max_nodes": 4},
}


def live_env(horizon_s: float = 1800.0, rate_16: float = 1.0) -> EnvConfig:
    """configs/env/autoscale.yaml at live scale: ``horizon_s`` of arrivals, one period of its
    daily curve (the peak in the middle), no bursts, ``arrival_rate_16`` ``rate_16`` (x 6 / 16
    initial nodes: 0.375 requests/s on average at 1.0)."""
    env = load_env(CONFIG)
    cl = to_dict(env.cluster)
    for t in cl["tiers"]:  # small nodes: a 2-core machine holds their workers (LIVE_NODES)
        t.update(LIVE_NODES[t["name"]])
    cl["servers"] = sum(t["count"] for t in cl["tiers"])
    return replace(env, cluster=cl,
                   workload={"arrival_rate_16": rate_16, "horizon_s": horizon_s,
                             "curve": {"period_s": horizon_s, "peak_s": horizon_s / 2,
                                       "bursts_per_hour": 0}})


def requests(env: EnvConfig, seed: int) -> list[tuple[float, Any]]:
    """The arrivals (model s) and requests of one episode of ``env`` (the simulator's own
    arrival process and workload source)."""
    rngs = np.random.default_rng([seed, 72]), np.random.default_rng([seed, 73])
    arr = Arrivals(env, *rngs)
    out, t = [], 0.0
    while True:
        nxt = arr.next_time(t)
        if nxt is None:
            return out
        t = nxt
        out.append((t, arr.next_workflow()))


class ElasticCluster:
    """A local Ray cluster whose nodes of ``env``'s tiers join after a launch delay and leave
    when removed; see the module docstring. Times are model seconds (wall / ``ts``)."""

    def __init__(self, env: EnvConfig, ts: float, seed: int):
        self.env, self.ts = env, ts
        self.rng = np.random.default_rng([seed, 7201])
        self.tiers = {t.name: t for t in env.cluster.tiers}
        self.lock = threading.Lock()
        self.launching: dict[str, int] = {k: 0 for k in self.tiers}
        self.nodes: dict[str, tuple[str, Any]] = {}  # node id -> (tier, Ray node handle)
        self.billing = Billing({k: t.price_per_hour for k, t in self.tiers.items()},
                               env.cluster.billing_min_s)
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self.t0 = 0.0
        self.temp_dir = ""
        self._cluster: Any = None
        self._due: list[tuple[float, str]] = []  # (wall time, tier) of asked nodes, sorted
        self._leaving: list[str] = []  # node ids to remove

    def now(self) -> float:
        return (time.perf_counter() - self.t0) / self.ts

    def __enter__(self) -> "ElasticCluster":
        import ray

        self._cluster, self.temp_dir = cpuless_head("scaa_")
        self.t0 = time.perf_counter()
        for t in self.env.cluster.tiers:
            for _ in range(t.count):
                self._join(t.name, counted=False)
        self._cluster.wait_for_nodes()
        ray.init(address=self._cluster.address, include_dashboard=False, log_to_driver=False)
        self.t0 = time.perf_counter()  # the run's clock: the first nodes billed from here
        with self.lock:
            for nid, (tier, _) in self.nodes.items():
                self.billing.start(nid, tier, 0.0)
            self._mark()
        return self

    def _join(self, tier: str, counted: bool = True) -> None:
        node = add_node(self._cluster, self.tiers[tier].spec())
        with self.lock:
            self.nodes[node.node_id] = (tier, node)
            if counted:
                self.launching[tier] -= 1
                self.billing.start(node.node_id, tier, self.now())
                self._mark()

    def _mark(self) -> None:
        counts = {k: 0 for k in self.tiers}
        for tier, _ in self.nodes.values():
            counts[tier] += 1
        self.timeline.append((self.now(), counts))

    def counts(self) -> dict[str, int]:
        with self.lock:
            out = {k: 0 for k in self.tiers}
            for tier, _ in self.nodes.values():
                out[tier] += 1
            return out

    def launch(self, tier: str, n: int = 1) -> None:
        """Ask for ``n`` nodes of ``tier``: each joins after a launch delay drawn now."""
        for _ in range(n):
            with self.lock:
                if sum(1 for t, _ in self.nodes.values() if t == tier) \
                        + self.launching[tier] >= self.tiers[tier].max_nodes:
                    return
                self.launching[tier] += 1
                delay = float(draw(self.tiers[tier].launch_s, self.rng, 1)[0]) * self.ts
                self._due.append((time.perf_counter() + delay, tier))
                self._due.sort()

    def remove(self, node_id: str) -> None:
        """Remove node ``node_id`` (at the next :meth:`pump`)."""
        with self.lock:
            if node_id in self.nodes and node_id not in self._leaving:
                self._leaving.append(node_id)

    def pump(self) -> None:
        """Start the nodes whose launch delay is over and stop those removed: Ray starts and
        stops a raylet only from the main thread, so the arm's loop calls this often."""
        now = time.perf_counter()
        while True:
            with self.lock:
                if not self._due or self._due[0][0] > now:
                    break
                _, tier = self._due.pop(0)
            self._join(tier)
        with self.lock:
            leaving, self._leaving = self._leaving, []
        for nid in leaving:
            with self.lock:
                got = self.nodes.pop(nid, None)
                if got is None:
                    continue
                self.billing.stop(nid, self.now())
                self._mark()
            self._cluster.remove_node(got[1], allow_graceful=False)

    def wait(self, until: float) -> None:
        """Sleep until wall time ``until``, pumping."""
        while True:
            self.pump()
            left = until - time.perf_counter()
            if left <= 0:
                return
            time.sleep(min(left, 0.02))

    def cost(self) -> dict[str, Any]:
        with self.lock:
            return self.billing.totals(self.now())

    def __exit__(self, *exc: Any) -> None:
        close(self._cluster, self.temp_dir)


def _loop(stop: threading.Event, every_s: float, step: Callable[[], None], name: str) -> None:
    while not stop.wait(every_s):
        try:
            step()
        except Exception:  # noqa: BLE001 - a controller turn fails: logged, the next one runs
            log.exception("%s: a turn failed", name)


def ours_step(sched: LiveScheduler, cluster: ElasticCluster) -> None:
    """One turn of our arm's provider: launch what the plan wants beyond the nodes present and
    launching; remove a drained node once nothing runs on it."""
    snap = sched.sizing.snapshot()
    wanted = snap.get("wanted") or {}
    have = cluster.counts()
    for tier, n in wanted.items():
        more = n - have.get(tier, 0) - cluster.launching.get(tier, 0)
        if more > 0:
            cluster.launch(tier, more)
    st = sched.status().result(timeout=30)
    by_node: dict[str, list[dict]] = {}
    for s in st["servers"]:
        by_node.setdefault(s["node"], []).append(s)
    for node, servers in by_node.items():
        if servers and all(s.get("draining") and not s["busy"] for s in servers):
            cluster.remove(node)


def _kinds(resources: dict[str, float]) -> dict[str, float]:
    """Ray's resources as the sizer counts them: CPU, GPU and memory in GB (Ray's is bytes);
    the node markers and accelerator types are Ray's business."""
    out = {k: float(v) for k, v in resources.items() if k in ("CPU", "GPU") and v > 0}
    if resources.get("memory"):
        out["memory"] = float(resources["memory"]) / 1e9
    return out


def ray_view(cluster: ElasticCluster, gcs: str, ids: dict[str, int]) -> SizingView:
    """What Ray's autoscaler v2 reads, from the GCS: the pending task demand and each node's
    usage and idle time (``ids``: node id -> the sizer's int id, grown as nodes join)."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(gcs)
    pending = []
    for d in status.resource_demands.ray_task_actor_demand:
        for b in d.bundles_by_count:
            pending += [tuple(sorted(_kinds(b.bundle).items()))] * int(b.count)
    mine = dict(cluster.nodes)
    nodes = []
    for info in [*status.active_nodes, *status.idle_nodes]:
        if info.node_id not in mine or info.resource_usage is None:
            continue
        tier = mine[info.node_id][0]
        used = _kinds({u.resource_name: u.used for u in info.resource_usage.usage if u.used > 0})
        busy = bool(used.get("CPU") or used.get("GPU"))
        nid = ids.setdefault(info.node_id, len(ids))
        nodes.append(NodeView(nid, tier, True, int(busy),
                              0.0 if busy else info.resource_usage.idle_time_ms / 1e3 / cluster.ts,
                              used, 0.0))
    return SizingView(cluster.now(), nodes, dict(cluster.launching), pending, {}, {}, {}, [], {})


def ray_step(sizer: RayAutoscaler, cluster: ElasticCluster, gcs: str, ids: dict[str, int]
             ) -> None:
    plan = sizer.decide(ray_view(cluster, gcs, ids))
    for tier, n in plan.launch.items():
        cluster.launch(tier, n)
    back = {v: k for k, v in ids.items()}
    for nid in plan.drain:
        cluster.remove(back[nid])


def run_arm(arm: str, env: EnvConfig, reqs: list, ts: float, seed: int, timeout_s: float
            ) -> dict[str, Any]:
    """One arm live on a fresh elastic cluster: its summary, cost and nodes over time."""
    import ray

    sizer_name, placement = arm.split("/")
    cfg = replace(env, sizing={"policy": sizer_name})
    with ElasticCluster(cfg, ts, seed) as cluster:
        nodes = [t.spec() for t in cfg.cluster.tiers]
        run_env, live_cfg = live_settings(cfg, nodes, ts)
        stop = threading.Event()
        if placement == "ray":
            runner: Any = RayDefaultRunner(run_env, live_cfg)
            gcs = ray.get_runtime_context().gcs_address
            sizer, ids = RayAutoscaler(cfg), {}
            step = lambda: ray_step(sizer, cluster, gcs, ids)  # noqa: E731
            every = sizer.interval_s * ts
        else:
            runner = LiveScheduler(get_policy(placement, run_env), run_env,
                                   {**live_cfg, "sizing_apply": "ray"})
            step = lambda: ours_step(runner, cluster)  # noqa: E731
            every = 0.25
        ctl = threading.Thread(target=_loop, args=(stop, every, step, arm), daemon=True)
        t_wall = time.perf_counter()
        with runner:
            ctl.start()
            handles = []
            t0 = time.perf_counter()
            for k, (t, spec) in enumerate(reqs):
                cluster.wait(t0 + t * ts)
                handles.append((t, runner.submit(collected(spec, f"request{k}"))))
            deadline = time.perf_counter() + timeout_s
            while not all(h.done() for _, h in handles) and time.perf_counter() < deadline:
                cluster.wait(time.perf_counter() + 0.2)
            done = runner.drain(timeout=5)
            stop.set()
            ctl.join(10)
            summary = runner.summary()
        cost = cluster.cost()
        recs = []
        for t, h in handles:
            r = h.response_s
            recs.append(_Rec(t, None if r is None or h.error is not None else t + r / ts))
        slo = slo_report(recs, cfg.sizing.slo, float(cfg.workload.horizon_s))
        return {"arm": arm, "drained": bool(done),
                "workflows_submitted": len(handles),
                "workflows_completed": sum(1 for r in recs if r.done),
                "workflows_lost": sum(1 for r in recs if not r.done),
                "cost": cost["cost"], "node_seconds": cost.get("node_seconds"),
                "slo_attainment": slo["attainment"], "slo_window_p95_s": slo["window_p95_s"],
                **{k: summary.get(k) for k in ("mean_workflow_response_model_s",
                                                "p95_workflow_response_model_s",
                                                "p99_workflow_response_model_s")},
                "timeline": cluster.timeline, "wall_s": time.perf_counter() - t_wall}


class _Rec:
    """A workflow as :func:`envs.accounting.slo_report` reads it (``n`` tasks, ``done`` of
    them: 1 / 1 once completed)."""

    def __init__(self, arrival: float, finish: float | None):
        self.arrival, self.n = arrival, 1
        self.finish = finish if finish is not None else float("inf")
        self.done = 1 if finish is not None else 0


def peak(timeline: list[tuple[float, dict[str, int]]]) -> dict[str, int]:
    """The most nodes of each type at once over ``timeline``."""
    out: dict[str, int] = {}
    for _, counts in timeline:
        for k, n in counts.items():
            out[k] = max(out.get(k, 0), n)
    return out


def twin(arm: str, env: EnvConfig, reqs: list, seed: int) -> dict[str, Any]:
    sizer_name, placement = arm.split("/")
    m = run_episode(replace(env, sizing={"policy": sizer_name}), placement, seed, arrivals=reqs)
    return {k: m.get(k) for k in ("cost", "node_seconds", "slo_attainment",
                                  "mean_workflow_response_s", "p95_workflow_response_s",
                                  "p99_workflow_response_s")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--autoscale-horizon-s", type=float, default=1800.0,
                   help="with --setting autoscale: model seconds of arrivals")
    p.add_argument("--autoscale-rate", type=float, default=1.0,
                   help="with --setting autoscale: workload.arrival_rate_16")


def run(args: argparse.Namespace) -> int:
    ts = args.time_scale if args.time_scale is not None else 0.1
    if not 0 < ts <= 1:
        raise ValueError(f"--time-scale: in (0, 1] for --setting autoscale, got {ts}")
    env = live_env(args.autoscale_horizon_s, args.autoscale_rate)
    reqs = requests(env, args.seed)
    out: dict[str, Any] = {"setting": "autoscale", "time_scale": ts, "seed": args.seed,
                           "requests": len(reqs), "horizon_s": env.workload.horizon_s,
                           "slo": {"p95_s": env.sizing.slo.p95_s,
                                   "window_s": env.sizing.slo.window_s}, "arms": {}}
    print(f"autoscale live: {len(reqs)} requests over {env.workload.horizon_s:g} model s at "
          f"time scale {ts:g} (~{env.workload.horizon_s * ts / 60:.1f} min a arm), SLO p95 <= "
          f"{env.sizing.slo.p95_s:g} s per {env.sizing.slo.window_s:g} s window", flush=True)
    load = MachineLoad()
    for arm in ARMS:
        live = run_arm(arm, env, reqs, ts, args.seed, args.timeout_s)
        load.sample()
        tw = twin(arm, env, reqs, args.seed)
        out["arms"][arm] = {"live": live, "twin": tw}
        print(f"  {arm:9s} live ${live['cost']:.3f} attainment {live['slo_attainment']:.3f} "
              f"mean {live['mean_workflow_response_model_s']:.1f} p95 "
              f"{live['p95_workflow_response_model_s']:.1f} s, lost "
              f"{live['workflows_lost']} | twin ${tw['cost']:.3f} attainment "
              f"{tw['slo_attainment']:.3f} mean {tw['mean_workflow_response_s']:.1f} p95 "
              f"{tw['p95_workflow_response_s']:.1f} s ({live['wall_s']:.0f} s wall); most nodes "
              f"{peak(live['timeline'])}", flush=True)
    ours, ray_arm = out["arms"]["model/eft"], out["arms"]["ray/ray"]
    out["rel_cost_vs_ray_autoscaler"] = ours["live"]["cost"] / ray_arm["live"]["cost"] - 1
    out["slo_attainment"] = ours["live"]["slo_attainment"]
    out["ray_autoscaler_slo_attainment"] = ray_arm["live"]["slo_attainment"]
    out["max_twin_gap_points"] = max(
        100 * abs(a["live"]["slo_attainment"] - a["twin"]["slo_attainment"])
        for a in out["arms"].values())
    out["twin_rel_cost_vs_ray_autoscaler"] = ours["twin"]["cost"] / ray_arm["twin"]["cost"] - 1
    out["workflows_lost"] = sum(a["live"]["workflows_lost"] for a in out["arms"].values())
    out["validity"] = check({arm: twin_ratio(a["live"]["mean_workflow_response_model_s"],
                                             a["twin"]["mean_workflow_response_s"])
                             for arm, a in out["arms"].items()}, load)
    print(format_check(out["validity"]), flush=True)
    print(f"ours vs Ray's autoscaler path{'' if out['validity']['valid'] else ' (INVALID run)'}: "
          f"cost {rel(out['rel_cost_vs_ray_autoscaler'])} "
          f"(twin {rel(out['twin_rel_cost_vs_ray_autoscaler'])}), attainment "
          f"{out['slo_attainment']:.3f} vs {out['ray_autoscaler_slo_attainment']:.3f}, twin gap "
          f"{out['max_twin_gap_points']:.1f} points, lost {out['workflows_lost']}", flush=True)
    write_report(args.json, out, float)
    return 0
