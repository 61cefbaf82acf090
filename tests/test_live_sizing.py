"""The sizer on the live scheduler (scale_ray.live.sizing; issue 72 item 7): the view it builds
from the live state, billing by node, the plan's budget cut, what ``sizing_apply: ray`` asks of
Ray and drains, the SLO windows, and a real LiveScheduler on a local cluster of two tiers
showing its plan in ``status()``."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from envs.config_base import ConfigError
from envs.config_files import load_env
from envs.decision import ReadyQueue
from envs.demands import Request
from envs.sizing import within_budget
from policies.sizing import make_sizer
from scale_ray.live.cluster import NodeInfo
from scale_ray.live.config import LiveConfig
from scale_ray.live.context import LiveContext
from scale_ray.live.nodes import LiveServer
from scale_ray.live.sizing import LiveSizing
from scale_ray.live.tasks import READY, RUNNING, WAITING

TIERS = [
    {"name": "cpu", "count": 1, "resources": {"CPU": 4, "memory": 16}, "compute": 2.0,
     "price_per_hour": 1.0, "min_nodes": 1, "max_nodes": 8},
    {"name": "gpu", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
     "gpu_speed": 2.0, "price_per_hour": 3.0, "max_nodes": 4},
]


def env_of(**sizing):
    return load_env({"cluster": {"servers": 2, "tiers": TIERS},
                     "sizing": {"policy": "model", "slo": {"p95_s": 10, "window_s": 60}}
                     | sizing})


def sizing_of(env, apply="advise", asked=None):
    ctx = LiveContext(LiveConfig(sizing_apply=apply, time_scale=1.0), env)
    return LiveSizing(ctx, make_sizer(env), request=lambda **kw: asked.append(kw))


def server(sid: int, node: str, tier: str) -> LiveServer:
    return LiveServer(sid, NodeInfo(node, 1, 2.0, 16.0, tier), 0)


class Task:
    """A live task as the sizer reads it."""

    def __init__(self, state, gflop, gpu, wf):
        self.state, self.wf, self.started = state, wf, time.perf_counter()
        self.prim = SimpleNamespace(request=Request(1.0, (("GPU", gpu),) if gpu else ()),
                                    compute_gflop=gflop)


def task(state, gflop=4.0, gpu=0.0, wf=None):
    return Task(state, gflop, gpu, wf)


def test_the_view_groups_servers_by_node_and_counts_the_work_by_kind():
    env = env_of()
    sz = sizing_of(env)
    wf = SimpleNamespace(failed=False, tasks=[])
    ready_gpu, ready_cpu = task(READY, 6.0, gpu=1.0, wf=wf), task(READY, 2.0, wf=wf)
    later, run = task(WAITING, 10.0, wf=wf), task(RUNNING, 8.0, wf=wf)
    wf.tasks = [ready_gpu, ready_cpu, later, run]
    a, b, c = server(0, "n1", "cpu"), server(1, "n1", "cpu"), server(2, "n2", "gpu")
    a.take(run, time.perf_counter() + 100.0)
    q = ReadyQueue()
    for i, t in enumerate((ready_gpu, ready_cpu, ready_cpu)):  # a duplicate entry counts once
        q.push((i,), i, t)
    nodes = sz._bill([a, b, c, server(3, "n3", "tpu")], 0.0)  # a tier not configured: unsized
    assert sorted(nodes) == ["n1", "n2"] and sz.seen == {"n1": "cpu", "n2": "gpu"}
    v = sz.view([a, b, c], q, nodes, 0.0)
    assert sorted((nv.tier, nv.running) for nv in v.nodes) == [("cpu", 1), ("gpu", 0)]
    assert v.queued_work == {"CPU": 2.0, "GPU": 6.0} and v.waiting_work["CPU"] == 10.0
    assert 7.9 < v.running_work["CPU"] <= 8.0 and len(v.pending) == 2


def test_a_gpu_backlog_asks_for_gpu_nodes_and_apply_ray_requests_the_node_shapes():
    env = env_of()
    asked: list = []
    sz = sizing_of(env, "ray", asked)
    wf = SimpleNamespace(failed=False, tasks=[])
    wf.tasks = [task(READY, 200.0, gpu=1.0, wf=wf) for _ in range(10)]
    q = ReadyQueue()
    for i, t in enumerate(wf.tasks):
        q.push((i,), i, t)
    alive = [server(0, "n1", "cpu"), server(1, "n2", "gpu")]
    plan = sz.turn(alive, q)
    assert plan.launch.get("gpu", 0) >= 1 and "cpu" not in plan.launch
    snap = sz.snapshot()
    assert snap["wanted"]["gpu"] == 1 + plan.launch["gpu"] and snap["nodes"] == {"cpu": 1,
                                                                                 "gpu": 1}
    bundles = asked[-1]["bundles"]
    assert bundles.count({"CPU": 4.0, "GPU": 1.0}) == snap["wanted"]["gpu"]
    assert bundles.count({"CPU": 4.0}) == snap["wanted"]["cpu"]
    # the nodes asked for count as launching: the next turn asks for no more, the same floor
    n = plan.launch["gpu"]
    assert sz.turn(alive, q).launch == {} and sz.snapshot()["launching"] == {"gpu": n}
    assert asked[-1]["bundles"] == bundles
    alive.append(server(2, "n3", "gpu"))  # one of them joined
    sz.turn(alive, q)
    assert sz.snapshot()["launching"].get("gpu", 0) == n - 1
    assert sz.snapshot()["wanted"]["gpu"] == 1 + n


def test_the_budget_cuts_the_dearest_launches_first():
    prices = {"cpu": 1.0, "gpu": 3.0}
    assert within_budget({"cpu": 2, "gpu": 2}, {"cpu": 1, "gpu": 1}, prices, None) == (
        {"cpu": 2, "gpu": 2}, False)
    assert within_budget({"cpu": 2, "gpu": 2}, {"cpu": 1, "gpu": 1}, prices, 9.0) == (
        {"cpu": 2, "gpu": 1}, True)
    assert within_budget({"gpu": 2}, {"cpu": 1, "gpu": 1}, prices, 3.0) == ({}, True)
    env = env_of(budget_per_hour=7.0)
    sz = sizing_of(env)
    wf = SimpleNamespace(failed=False, tasks=[])
    wf.tasks = [task(READY, 400.0, gpu=1.0, wf=wf) for _ in range(10)]
    q = ReadyQueue()
    for i, t in enumerate(wf.tasks):
        q.push((i,), i, t)
    plan = sz.turn([server(0, "n1", "cpu"), server(1, "n2", "gpu")], q)
    assert plan.launch == {"gpu": 1} and "budget_per_hour" in sz.snapshot()["why"]
    with pytest.raises(ConfigError, match="sizing.budget_per_hour"):
        env_of(budget_per_hour=-1)


def test_drained_nodes_stop_taking_work_and_billing_stops_when_a_node_leaves():
    env = env_of(model={"down_after_s": 0, "down_step": 1})
    sz = sizing_of(env, "ray", [])
    a, b = server(0, "n1", "cpu"), server(1, "n2", "cpu")
    for s in (a, b):
        s.idle_since = time.perf_counter() - 600
    sz._bill([a, b], -600.0)  # both billed 10 minutes ago (past the billing minimum)
    plan = sz.turn([a, b], ReadyQueue())  # nothing to do: one cpu node goes (min_nodes 1)
    assert len(plan.drain) == 1
    drained = [s for s in (a, b) if not sz.accepting(s)]
    assert len(drained) == 1 and sz.snapshot()["drain"][0]["tier"] == "cpu"
    kept = next(s for s in (a, b) if sz.accepting(s))
    gone = drained[0]
    wf = SimpleNamespace(failed=False, tasks=[])
    wf.tasks = [task(READY, 400.0, wf=wf) for _ in range(4)]
    busy = ReadyQueue()
    for i, t in enumerate(wf.tasks):
        busy.push((i,), i, t)
    sz.turn([a, b], busy)  # work again: the drained node, still there, is taken back first
    assert sz.accepting(gone) and sz.undrained == {gone.node.node_id}
    assert sz.snapshot()["wanted"]["cpu"] >= 2
    sz.draining.add(gone.node.node_id)
    sz.turn([kept], ReadyQueue())  # the drained node left: its bill closed
    assert list(sz.seen) == [kept.node.node_id]
    cost = sz.snapshot()["cost"]
    assert cost == pytest.approx(2 * 600 / 3600, rel=0.05)


def test_slo_windows_count_only_closed_windows_and_unfinished_workflows_miss():
    env = env_of()
    sz = sizing_of(env)
    done = []
    for arrival, resp in ((1.0, 3.0), (2.0, 50.0), (70.0, 2.0)):
        h = SimpleNamespace(error=None, add_done_callback=done.append)
        sz.admitted(SimpleNamespace(arrival=arrival, tasks=[], handle=h))
    sz.ctx.now_model = lambda: 10.0
    done[0](SimpleNamespace(error=None))  # the first finishes at 10: response 9 s
    sz.ctx.now_model = lambda: 130.0
    done[2](SimpleNamespace(error=None))  # the third at 130: 60 s (over the 10-s bound)
    sz.turn([], ReadyQueue())  # windows [0, 60) and [60, 120) are over; the second never ended
    slo = sz.snapshot()["slo"]
    assert slo["windows"] == 2 and slo["attainment"] == 0.0


def test_a_long_run_keeps_its_memory_bounded_and_reports_as_over_every_record():
    """Thousands of workflows over a hundred SLO windows, some finishing in a later window,
    some failing, some never ending and some arriving late (an agent program's step arrives at
    its program's start): the sizer keeps the arrivals of its trend horizon only and the
    responses folded per window, and every turn reports the windows and attainment
    ``slo_report`` gives over every record, and the arrival rate of every arrival."""
    import math
    import random

    from envs.accounting import slo_report

    env = env_of(model={"trend_s": 120, "slope_s": 240})
    sz = sizing_of(env)
    slo, keep = env.sizing.slo, 240.0
    clock = [0.0]
    sz.ctx.now_model = lambda: clock[0]
    views = []
    decide = sz.sizer.decide
    sz.sizer.decide = lambda view: (views.append(view), decide(view))[1]
    rng = random.Random(7)
    records, arrivals, ends = [], [], []  # every workflow; pending (when, callback, record)
    verdicts: set[bool] = set()
    over_share = 0.05
    for step in range(600):  # 600 turns of 10 s: 100 windows of 60 s
        t0 = clock[0]
        if step % 6 == 0:  # each window a different share of slow responses
            over_share = rng.uniform(0.0, 0.12)
        for _ in range(rng.randint(2, 8)):
            clock[0] = t0 + rng.uniform(0.0, 10.0)
            a = clock[0] - (rng.uniform(0.0, 2000.0) if rng.random() < 0.05 else 0.0)
            rec = SimpleNamespace(arrival=a, finish=0.0, done=0, n=1)
            records.append(rec)
            arrivals.append(a)
            got = []
            h = SimpleNamespace(error=None, add_done_callback=got.append)
            sz.admitted(SimpleNamespace(arrival=a, tasks=[], handle=h))
            u = rng.random()
            if u < 0.01:
                continue  # never ends
            resp = rng.uniform(10.0, 200.0) if u < 0.01 + over_share else rng.uniform(0.5, 10.0)
            ends.append((max(a + resp, clock[0]), u < 0.02, got[0], rec))
        clock[0] = t0 + 10.0
        for e in [e for e in ends if e[0] <= clock[0]]:
            ends.remove(e)
            when, failed, cb, rec = e
            saved, clock[0] = clock[0], when
            cb(SimpleNamespace(error=RuntimeError("x") if failed else None))
            rec.finish, rec.done = when, 0 if failed else 1
            clock[0] = saved
        sz.turn([], ReadyQueue())
        now = clock[0]
        got = sz.snapshot()["slo"]
        closed = (now // slo.window_s) * slo.window_s
        if closed > 0:
            want = slo_report(records, slo, closed)
            assert (got["windows"], got["attainment"]) == (want["windows"], want["attainment"])
            verdicts |= {p <= slo.p95_s for p in want["window_p95_s"]}
        full = sorted(x for x in arrivals if x <= now)
        assert sz.sizer.rate(views[-1]) == sz.sizer.rate(
            SimpleNamespace(arrivals=full, t=now)), step
        # bounded: the arrivals of the trend horizon, the workflows in flight, one per window
        assert sz.arrivals == [x for x in full if x >= now - keep]
        assert len(sz.unsettled) == sum(1 for r in records if r.done == 0 and r.finish == 0.0
                                        and r.arrival >= 0)
        assert len(sz.windows) <= math.ceil(now / slo.window_s) + 1
    assert len(records) > 2000 and len(sz.arrivals) < 200 and len(sz.unsettled) < 100
    assert verdicts == {True, False} and 0 < got["attainment"] < 1


def test_a_folded_window_gives_the_verdict_of_its_responses():
    """A window's folded responses (count, within the bound, the largest within, the smallest
    beyond, the unfinished) give ``slo_report``'s verdict on every set, numpy's interpolation
    between a response within and an unfinished one (1e18) included."""
    import random

    from envs.accounting import UNFINISHED, window_p95
    from scale_ray.live.sizing import _Window

    rng = random.Random(3)
    bound, seen = 10.0, set()
    for _ in range(3000):
        n = rng.randint(1, 60)
        share = rng.choice((0.0, 0.03, 0.05, 0.08, 0.3, 1.0))
        resp = [rng.choice((rng.uniform(10.0, 30.0), UNFINISHED)) if rng.random() < share
                else rng.choice((rng.uniform(0.0, 10.0), bound)) for _ in range(n)]
        w = _Window()
        for r in resp:
            if r == UNFINISHED and rng.random() < 0.5:
                w.open += 1  # not done yet: a miss until it is
            else:
                w.add(r, bound)
        want = window_p95(resp) <= bound
        assert w.meets(bound) == want, resp
        seen.add(want)
    assert seen == {True, False}


def test_apply_ray_and_autoscale_hints_are_exclusive():
    with pytest.raises(ConfigError, match="autoscale_hints"):
        LiveConfig(autoscale_hints=True, sizing_apply="ray")
    with pytest.raises(ConfigError, match="sizing_apply"):
        from envs.config_base import build
        build(LiveConfig, {"sizing_apply": "kubernetes"})


CPU_TIERS = [
    {"name": "small", "count": 1, "resources": {"CPU": 2, "memory": 8}, "compute": 1.0,
     "price_per_hour": 1.0, "min_nodes": 1, "max_nodes": 6},
    {"name": "big", "count": 1, "resources": {"CPU": 4, "memory": 16}, "compute": 2.0,
     "price_per_hour": 3.0, "max_nodes": 3},
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_live_scheduler_sizes_its_cluster_and_drains_through_placement():
    """A real LiveScheduler on a local cluster of one node per tier, ``sizing_apply: ray``: a
    backlog makes the plan ask for nodes (``request_resources`` is Ray's own, against this
    cluster's GCS); once the work is done the surplus node is drained (no longer offered to
    the policy) and ``status()`` shows the plan, the cost and the counters."""
    from processes import no_ray_connection

    from policies import get_policy
    from scale_ray.live import LiveScheduler, primitive
    from scale_ray.live.cluster import LocalHeteroCluster

    @primitive(compute_gflop=4.0, emulate=True)
    def step(i):
        return i

    no_ray_connection()
    env = load_env({"cluster": {"servers": 2, "tiers": CPU_TIERS},
                    "sizing": {"policy": "model", "slo": {"p95_s": 5, "window_s": 30},
                               "model": {"interval_s": 2, "down_after_s": 0, "down_step": 1}}})
    with LocalHeteroCluster(env.cluster):
        cfg = LiveConfig(time_scale=0.1, sizing_apply="ray")
        with LiveScheduler(get_policy("eft", env), env, cfg) as s:
            hs = [s.submit([step.bind(i) for i in range(30)], name=f"w{k}") for k in range(4)]
            seen_launch = False
            deadline = time.perf_counter() + 120
            while not all(h.done() for h in hs):
                snap = s.status().result(timeout=30)["sizing"]
                seen_launch |= bool(snap.get("launch"))
                assert time.perf_counter() < deadline
                time.sleep(0.2)
            assert all(h.result() for h in hs) and seen_launch
            deadline = time.perf_counter() + 60
            while True:  # idle now: the big node (the dearer surplus) is drained
                st = s.status().result(timeout=30)
                if any(x["draining"] for x in st["servers"]):
                    break
                assert time.perf_counter() < deadline, st["sizing"]
                time.sleep(0.2)
            snap = st["sizing"]
            assert snap["policy"] == "model" and snap["apply"] == "ray" and snap["turns"] > 1
            assert snap["nodes"]["small"] == 1 and snap["cost"] > 0
            assert {x["tier"] for x in st["servers"] if x["draining"]} == {"big"}, st
            assert st["counters"]["sizing_requests"] >= snap["turns"] - 1
            assert st["counters"]["sizing_errors"] == 0
            # work still runs, on the nodes that take it
            assert s.submit([step.bind(0)], name="after").result(timeout=60) == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_service_shows_its_sizing_plan_over_http(tmp_path):
    """The scheduler service with ``sizing`` in its env config: ``GET /v1/cluster`` shows the
    plan (nodes and wanted per tier, no node id) and ``GET /metrics`` the sizing gauges."""
    import json

    import httpx
    import yaml
    from processes import no_ray_connection

    from scale_ray.bench.service import LocalService
    from scale_ray.live.cluster import LocalHeteroCluster

    no_ray_connection()
    doc = {"cluster": {"servers": 2, "tiers": CPU_TIERS},
           "sizing": {"policy": "model", "budget_per_hour": 50,
                      "model": {"interval_s": 2}}}
    path = tmp_path / "sized.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = load_env(str(path))
    with LocalHeteroCluster(env.cluster) as cluster:
        svc = LocalService(cluster, {"policy": "eft", "env_config": str(path),
                                     "live": {"time_scale": 0.1, "node_refresh_s": 0.1}})
        svc.start()
        try:
            with httpx.Client(base_url=svc.url, timeout=60) as http:
                body = {"tasks": [{"name": f"t{i}", "compute_gflop": 4.0} for i in range(20)]}
                ids = [http.post("/v1/workflows", json=body).json()["id"] for _ in range(3)]
                deadline = time.perf_counter() + 120
                while True:
                    view = http.get("/v1/cluster").json()
                    if view["sizing"] and view["sizing"]["turns"] >= 2:
                        break
                    assert time.perf_counter() < deadline, view
                    time.sleep(0.5)
                sizing = view["sizing"]
                assert sizing["policy"] == "model" and sizing["apply"] == "advise"
                assert sizing["nodes"] == {"small": 1, "big": 1}
                assert set(sizing["wanted"]) == {"small", "big"}
                assert sizing["budget_per_hour"] == 50 and sizing["cost"] > 0
                for wid in ids:
                    assert http.get(f"/v1/workflows/{wid}", params={"wait_s": 60}).json()[
                        "state"] == "completed"
                text = json.dumps(view)
                assert all(n["NodeID"] not in text for n in __import__("ray").nodes())
                deadline = time.perf_counter() + 60
                while "ray_scale_scheduler_nodes_wanted" not in (page := http.get(
                        "/metrics").text):
                    assert time.perf_counter() < deadline, page[-2000:]
                    time.sleep(1)
        finally:
            svc.stop()
