"""The live scheduler in Ray's resource model (live.model: nodes) without a cluster: whole nodes
in the decision core's NodeTable, runs holding their Ray demands until released, GPU work at a
node's GPU speed, and the Ray task options that ask Ray for exactly what is tracked."""

from __future__ import annotations

import time

import numpy as np
import pytest

from envs.config import build
from policies import get_policy
from scale_ray.bench.agents_live import decision_overhead
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler, collect
from scale_ray.live.cluster import NodeInfo, run_speed, server_caps
from scale_ray.live.config import Unschedulable
from scale_ray.live.discovery import discover
from scale_ray.live.executors import node_task_options
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.refusals import check_fits
from scale_ray.live.workflow import Primitive, WorkflowError, emulated_body


def _node(nid: str, res: dict, gpu_compute: float = 0.0) -> NodeInfo:
    return NodeInfo(nid, 1, 1.0, res.get("memory", 0.0) / 1e9, nid, 0.0, 0.0,
                    server_caps(res, 1), gpu_compute)


def _sched(servers):
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0))
    sched.nodes.slotted = False  # as the first node refresh sets it on plain Ray nodes
    sched.set_alive(servers)
    return sched


def _admit(sched, prims):
    wf = collect([p.bind(i) for i, p in enumerate(prims)])
    sched.admission.admit(WorkflowHandle(0, wf, 0.0))
    return wf


def test_half_gpu_tasks_share_a_gpu_node_and_the_third_waits_for_a_release():
    gpu = LiveServer(0, _node("gpu", {"CPU": 4, "GPU": 1, "memory": 16e9}), 0)
    cpu = LiveServer(1, _node("cpu", {"CPU": 2, "memory": 8e9}), 0)
    sched = _sched([gpu, cpu])
    half = Primitive(emulated_body, 1.0, ray_options={"num_gpus": 0.5, "num_cpus": 1})
    _admit(sched, [half, half, half])
    started = []

    def start(t, srv):
        started.append((t.idx, srv.sid))
        srv.take(t, 10.0)

    pl = sched.placement
    pl.round(lambda: 0.0, sched.ask, start)
    assert started == [(0, 0), (1, 0)]  # two share the GPU; none fits the CPU node
    first = next(iter(gpu.running))
    pl.release(gpu, first, 1.0)
    pl.round(lambda: 1.0, sched.ask, start)
    assert started[-1] == (2, 0) and len(gpu.running) == 2


def test_num_cpus_2_and_12_gib_fit_a_whole_node_and_hold_it():
    node = LiveServer(0, _node("c2", {"CPU": 2, "memory": 16e9}), 0)
    sched = _sched([node])
    two = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 2})
    big = Primitive(emulated_body, 1.0, ray_options={"memory": 12 * 1024 ** 3, "num_cpus": 0})
    _admit(sched, [two, big, two])
    started = []
    sched.placement.round(lambda: 0.0, sched.ask,
                          lambda t, s: started.append(t.idx) or s.take(t, 5.0))
    assert started == [0, 1]  # both CPUs and 12.9 of 16 GB are held; the second 2-CPU waits


def test_gpu_work_runs_at_the_nodes_gpu_speed_and_eft_picks_the_faster_gpu():
    slow = LiveServer(0, _node("a10g", {"CPU": 4, "GPU": 1}), 0)
    fast = LiveServer(1, _node("a100", {"CPU": 4, "GPU": 1}, gpu_compute=2.6), 0)
    assert run_speed(fast.node, (("GPU", 1.0),)) == 2.6 and run_speed(fast.node, ()) == 1.0
    sched = _sched([slow, fast])
    _admit(sched, [Primitive(emulated_body, 4.0, ray_options={"num_gpus": 1}),
                   Primitive(emulated_body, 4.0, ray_options={"num_cpus": 1})])
    started = []
    sched.placement.round(lambda: 0.0, sched.ask,
                          lambda t, s: started.append((t.idx, s.sid)) or s.take(t, 5.0))
    assert started == [(0, 1), (1, 0)]  # GPU work to the A100; CPU work: equal speed, first


def test_the_ray_task_asks_ray_for_exactly_the_tracked_demands():
    p = Primitive(emulated_body, 1.0, memory_gb=2.0, ray_options={
        "num_gpus": 0.25, "memory": 12 * 1024 ** 3, "resources": {"tok": 2},
        "accelerator_type": "A100"})
    assert dict(p.ray_demands) == {"CPU": 1.0, "GPU": 0.25, "memory": 12 * 1024 ** 3 / 1e9,
                                   "tok": 2.0, "accelerator_type:A100": 0.001}
    assert node_task_options(p) == {"num_cpus": 1.0, "num_gpus": 0.25,
                                    "memory": 12 * 1024 ** 3, "resources": {"tok": 2.0},
                                    "accelerator_type": "A100"}
    zero = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 0})
    assert zero.ray_demands == () and node_task_options(zero)["num_cpus"] == 0.0


def test_discovery_gives_whole_nodes_gpu_speeds_by_accelerator():
    raw = [{"NodeID": "a", "Alive": True, "Resources": {
        "CPU": 8, "GPU": 1, "accelerator_type:A100": 1, "memory": 32e9}}]
    cfg = build(LiveConfig, {"server_compute": 2.0, "gpu_speeds": {"A100": 3.0}})
    (a,), source = discover(raw, (), cfg)
    assert source == "ray" and (a.slots, a.compute, a.gpu_compute, a.memory_gb) == (1, 2.0, 6.0,
                                                                                   32.0)


def test_a_round_runs_only_after_something_changed():
    """In Ray's resource model the scheduler places at events, as its twin does: a round with
    nothing new (no task ready, no run ended, no node change) is skipped; a release runs one."""
    node = LiveServer(0, _node("c", {"CPU": 1, "memory": 8e9}), 0)
    sched = _sched([node])
    one = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 1})
    _admit(sched, [one, one])
    pl = sched.placement
    rounds, started = [], []
    run_round = pl.core.run_round
    pl.core.run_round = lambda *a: rounds.append(1) or run_round(*a)

    def start(t, srv):
        started.append(t)
        srv.take(t, 10.0)

    pl.round(lambda: 0.0, sched.ask, start)
    pl.round(lambda: 0.1, sched.ask, start)  # nothing changed: no round
    assert len(rounds) == 1 and len(started) == 1
    pl.release(node, started[0], 1.0)
    pl.round(lambda: 1.0, sched.ask, start)
    assert len(rounds) == 2 and len(started) == 2


def test_the_decision_path_bench_runs_every_task_of_its_burst():
    """`bench live --setting agents`'s decision path without Ray: every request of the burst
    finishes through the scheduler's own rounds and completions (it raises otherwise)."""
    r = decision_overhead(4, 12, seed=3)
    assert r["requests"] == 12 and r["tasks"] >= 12 and r["cpu_ms_per_task"] > 0
    assert r["max_ready_backlog"] >= 1


def test_a_label_selector_from_ray_options_places_on_matching_nodes_and_asks_ray_for_it():
    a = LiveServer(0, NodeInfo("a", 1, 1.0, 16.0, "a", caps=(("CPU", 8.0),),
                               labels=(("zone", "a"),)), 0)
    b = LiveServer(1, NodeInfo("b", 1, 1.0, 16.0, "b", caps=(("CPU", 8.0),),
                               labels=(("zone", "b"),)), 0)
    sched = _sched([a, b])
    sel = Primitive(emulated_body, 1.0, ray_options={"label_selector": {"zone": "b"}})
    _admit(sched, [sel, sel])
    started = []
    sched.placement.round(lambda: 0.0, sched.ask, lambda t, srv: started.append(srv.sid) or
                          srv.take(t, 10.0))
    assert started == [1, 1]  # node a is emptier and first, but its labels do not match
    opts = node_task_options(sel)
    assert opts["label_selector"] == {"zone": "b"} and "resources" not in opts
    with pytest.raises(WorkflowError, match=r"label_selector\['zone'\]"):
        Primitive(emulated_body, 1.0, ray_options={"label_selector": {"zone": "in()"}})


def test_servers_of_one_slot_honour_a_label_selector_too():
    """One model: a slot server carries its node's labels, so a selector its labels match fits
    and one they do not is refused naming the selector."""
    slot = LiveServer(0, NodeInfo("s", 1, 1.0, 8.0, "small", caps=(("CPU", 1.0),),
                                  labels=(("zone", "a"),)), 0)

    def wf(zone):
        return collect([Primitive(emulated_body, 1.0,
                                  ray_options={"label_selector": {"zone": zone}}).bind()])
    check_fits(wf("a"), [slot], [], LiveConfig(), "scale")
    with pytest.raises(Unschedulable, match=r"label_selector \{zone: b\} \(no node's labels"):
        check_fits(wf("b"), [slot], [], LiveConfig(), "scale")


def test_with_the_estimator_the_node_rule_plans_with_run_times_learned_per_node_shape():
    """Two GPU nodes of equal configured speed. With live.estimator online, once the estimator
    has seen kind "llm" run 2.6x faster on the a100 shape, the rule sends the call there though
    the a10g node is listed first (and wins the tie without the estimator)."""
    env = load_env(None, servers=4)
    picks = []
    for estimator in ("off", "online"):
        gpus = [LiveServer(i, NodeInfo(f"g{i}", 1, 1.0, 16.0, shape,
                                       caps=(("CPU", 4.0), ("GPU", 1.0))), 0)
                for i, shape in enumerate(("a10g", "a100"))]
        sched = LiveScheduler(get_policy("eft", env), env,
                              LiveConfig(time_scale=1.0, estimator=estimator))
        sched.nodes.slotted = False
        sched.set_alive(gpus)
        if sched.estimator is not None:
            for _ in range(5):
                sched.estimator.observe("llm", "a100", 1.0, 2.6)
                sched.estimator.observe("llm", "a10g", 2.6, 2.6)
        llm = Primitive(emulated_body, 2.6, kind="llm", ray_options={"num_gpus": 1})
        _admit(sched, [llm])
        sched.placement.round(lambda: 0.0, sched.ask, lambda t, srv: picks.append(srv.node.tier) or
                              srv.take(t, 10.0))
    assert picks == ["a10g", "a100"]


def test_the_fair_share_counts_resource_seconds_in_rays_resource_model():
    """Placing a task charges its tenant run time x the largest share of an average node it
    holds (at least envs.fairshare.MIN_SHARE): a one-GPU call 16 times a one-CPU call of the same
    compute; a zero-CPU call the floor, not nothing."""
    from envs.fairshare import MIN_SHARE

    gpu = LiveServer(0, _node("g", {"CPU": 8, "GPU": 1, "memory": 32e9}), 0)
    cpu = LiveServer(1, _node("c", {"CPU": 8, "memory": 32e9}), 0)
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0, fair_share=True))
    sched.nodes.slotted = False
    sched.set_alive([gpu, cpu])
    g1 = Primitive(emulated_body, 1.0, ray_options={"num_gpus": 1, "num_cpus": 1})
    c1 = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 1})
    z1 = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 0, "memory": 1})
    table = sched.placement.table
    assert table.dominant_share(g1.ray_demands) == 2.0  # 1 GPU of 0.5 a node on average
    assert table.dominant_share(c1.ray_demands) == 0.125  # 1 CPU of 8
    work = {}
    for tenant, p in (("gpu", g1), ("cpu", c1), ("zero", z1)):
        wf = collect([p.bind(i) for i in range(4)])
        h = WorkflowHandle(len(work), wf, 0.0)
        h.tenant = tenant
        sched.admission.admit(h)
        work[tenant] = [t.work for t in h.live_record.tasks]
    assert work["gpu"][0] == pytest.approx(16 * work["cpu"][0]) and work["cpu"][0] > 0
    assert work["zero"][0] == pytest.approx(work["cpu"][0] / 0.125 * MIN_SHARE)


def test_the_service_quota_counts_resource_seconds_in_rays_resource_model():
    """A tenant's queued work is capped in resource-seconds (``Admission.work_s``, what the
    fair share counts): a second workflow of one-GPU calls is a 429 where one-CPU calls of the
    same compute still fit; another tenant is not held back; a finished workflow frees its
    share."""
    from serve_apps.registry import Workflows
    from serve_apps.scheduler_config import SchedulerTuning
    from serve_apps.schemas import RequestError

    gpu = LiveServer(0, _node("g", {"CPU": 8, "GPU": 1, "memory": 32e9}), 0)
    cpu = LiveServer(1, _node("c", {"CPU": 8, "memory": 32e9}), 0)
    sched = _sched([gpu, cpu])
    g1 = Primitive(emulated_body, 1.0, ray_options={"num_gpus": 1, "num_cpus": 1})
    c1 = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 1})
    g_wf, c_wf = (collect([p.bind(i) for i in range(4)]) for p in (g1, c1))
    metrics = type("M", (), {"refused": lambda self, t, r: None,
                             "finished": lambda self, t, p, h: None})()
    tuning = SchedulerTuning()
    reg = Workflows(sched, lambda: tuning, None, metrics, None, "inc1")
    g_work, c_work = reg.work_s(g_wf), reg.work_s(c_wf)
    assert g_work == pytest.approx(16 * c_work) and c_work > 0
    tuning = SchedulerTuning(max_queued_work_s_per_tenant=1.5 * g_work)
    h = WorkflowHandle(0, g_wf, 0.0)
    reg.register("w1", h, "team-a")
    with pytest.raises(RequestError, match="resource-seconds of this tenant") as e:
        reg.check_quota("team-a", 4, reg.work_s(g_wf))
    assert e.value.status == 429
    reg.check_quota("team-a", 4, c_work)  # the same compute on one CPU each fits
    reg.check_quota("team-b", 4, g_work)  # another tenant's share is its own
    reg._done("team-a", 4, h, g_work)
    reg.check_quota("team-a", 4, g_work)
    assert reg.inflight["team-a"] == [0, 0, 0.0]


def test_a_task_that_holds_next_to_nothing_is_charged_a_floor_share():
    """Issue 71 (3): a 9,000-task workflow of 3,600-model-second tasks with ``num_cpus: 0,
    memory: 1`` was counted as ~0 resource-seconds. Each task is charged at least its run at the
    servers' mean speed x ``min_task_share`` (1/16) now; a task holding more (one CPU of an
    8-CPU node: 1/8) keeps its own share."""
    from serve_apps.registry import Workflows
    from serve_apps.scheduler_config import MIN_TASK_SHARE, SchedulerTuning
    from serve_apps.schemas import RequestError

    fast = LiveServer(0, NodeInfo("f", 1, 3.0, 32.0, "f", 0.0, 0.0,
                                  server_caps({"CPU": 8, "memory": 32e9}, 1)), 0)
    slow = LiveServer(1, _node("s", {"CPU": 8, "memory": 32e9}), 0)  # speeds 3 and 1: mean 2
    sched = _sched([fast, slow])
    zero = Primitive(emulated_body, 3600.0, ray_options={"num_cpus": 0, "memory": 1})
    one = Primitive(emulated_body, 3600.0, ray_options={"num_cpus": 1})
    tuning = SchedulerTuning(max_queued_work_s_per_tenant=1e7)
    metrics = type("M", (), {"refused": lambda self, t, r: None})()
    reg = Workflows(sched, lambda: tuning, None, metrics, None, "inc1")
    big = collect([zero.bind(i) for i in range(9000)])
    assert sum(sched.admission.work_s(big)) < 1.0  # what the fair share counts: ~0
    assert MIN_TASK_SHARE == 1 / 16
    assert reg.work_s(big) == pytest.approx(9000 * 3600 / 2.0 / 16)  # 1.01e6, not ~0
    ones = collect([one.bind(i) for i in range(4)])
    assert reg.work_s(ones) == pytest.approx(sum(sched.admission.work_s(ones)))
    assert reg.work_s(ones) == pytest.approx(4 * 3600 / 2.0 / 8)  # its own share, 1/8
    reg.check_quota("team-a", 9000, reg.work_s(big))  # (the default cap holds it)
    tuning = SchedulerTuning(max_queued_work_s_per_tenant=5e6, min_task_share=0.5)
    with pytest.raises(RequestError, match="resource-seconds of this tenant") as e:
        reg.check_quota("team-a", 9000, reg.work_s(big))  # 8.1e6 > 5e6
    assert e.value.status == 429


def test_the_node_table_keeps_model_seconds_so_eft_wait_compares_like_with_like():
    """At time scale 0.5 a run expected to end 4 wall s from now ends 8 model s from now, so a
    call of 8 model s on the idle slow node (ends at 8) beats waiting for the fast node (8 + 0.8):
    eft-wait starts it now, as its twin would. With wall times in the table it compared 4 + 0.8
    with 8 and waited."""
    fast = LiveServer(0, _node("fast", {"CPU": 1, "memory": 8e9}), 0)
    slow = LiveServer(1, _node("slow", {"CPU": 1, "memory": 8e9}), 0)
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft-wait", env), env, LiveConfig(time_scale=0.5))
    sched.nodes.slotted = False
    sched.set_alive([fast, slow])
    pl = sched.placement
    pl.table.cpu_speed[:] = [10.0, 1.0]
    _admit(sched, [Primitive(emulated_body, 1.0)])
    pl.round(lambda: 100.0, sched.ask, lambda t, srv: srv.take(t, 104.0))  # on fast, 4 wall s left
    assert len(fast.running) == 1
    started = []
    _admit(sched, [Primitive(emulated_body, 8.0)])
    pl.round(lambda: 100.0, sched.ask, lambda t, srv: started.append(srv.sid) or srv.take(t, 108.0))
    assert started == [1]


def test_a_learned_node_policy_places_live_tasks_guarded_and_a_bad_one_is_named():
    """A policy trained on the nodes encoder (results/resource_model/scale_nodes) decides every
    live placement on whole Ray nodes, reading the live table through its encoder, guarded."""
    from envs.encoding import TIME_UNIT_S

    path = "results/resource_model/scale_nodes/policy"
    servers = [LiveServer(i, _node(f"n{i}", {"CPU": 2, "GPU": 1, "memory": 16e9}, 1.0 + i), 0)
               for i in range(3)]
    env = load_env(None, servers=4)
    policy = get_policy(path, env)
    assert policy.encoder == "nodes" and policy.guard is not None
    sched = LiveScheduler(policy, env, LiveConfig(time_scale=1.0))
    sched.nodes.slotted = False
    sched.set_alive(servers)
    asked, ages = [], []
    act = policy.act
    policy.act = lambda obs: (asked.append(obs["action_mask"].copy()),
                              ages.append(float(obs["task"][6])))[0] or act(obs)
    gpu = Primitive(emulated_body, 1.0, ray_options={"num_gpus": 1, "num_cpus": 1})
    wf = collect([gpu.bind(i) for i in range(4)])
    submitted = time.perf_counter()  # real wall times, as live: ages in the scheduler's model s
    sched.admission.admit(WorkflowHandle(0, wf, submitted))
    started = []
    sched.placement.round(lambda: submitted + 0.5, sched.ask,
                          lambda t, srv: (started.append(srv.sid), srv.take(t, submitted + 10)))
    assert sorted(started) == [0, 1, 2] and len(asked) == 3  # it chose each; the 4th fits nowhere
    assert [int(m[:3].sum()) for m in asked] == [3, 2, 1]  # valid picks only: where it fits now
    # the request's age it reads is 0.5 s (not the time since the process started: clipped)
    assert ages == [pytest.approx(0.5 / TIME_UNIT_S)] * 3
    with pytest.raises(ValueError, match="'/no/such/artifact'.*not an artifact directory"):
        get_policy("/no/such/artifact", env)


def test_a_straggler_is_hedged_on_another_node_and_each_run_holds_its_own_resources():
    """Ray's resource model, hedging (live.hedge: all): the copy of a straggling one-GPU run
    goes to the fastest other node where it fits now, holds a GPU there while the first run
    holds its own, and the cancelled run frees only its node's (Ray not called: runs are
    stand-ins)."""
    a10g = LiveServer(0, _node("a10g", {"CPU": 4, "GPU": 1, "memory": 16e9}, 1.0), 0)
    a100 = LiveServer(1, _node("a100", {"CPU": 4, "GPU": 1, "memory": 16e9}, 2.6), 0)
    cpu = LiveServer(2, _node("cpu", {"CPU": 8, "memory": 32e9}), 0)
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0, hedge="all"))
    sched.nodes.slotted = False
    sched.set_alive([a10g, a100, cpu])
    refs = iter(range(100))
    sched.nodes.run = lambda *a: (f"value{next(refs)}", f"status{next(refs)}")
    gpu = Primitive(emulated_body, 1.0, ray_options={"num_gpus": 1, "num_cpus": 1})
    _admit(sched, [gpu])
    (t,) = [e[2] for e in sched.placement.queue.heap]
    runs, table = sched.runs, sched.placement.table
    runs.submit(t, a10g, 0.0)  # the first run (say the A100 was busy when it was placed)
    table.start(0, t, t.demands, 1.0)
    assert runs.hedgeable(t) and runs.stragglers  # armed at its start
    assert runs.copy_server(t) is a100  # the faster GPU node; not its own, not the CPU node
    runs.due.append((t.token, t))
    runs.launch_copies(1.0)
    assert t.copy is not None and t.copy.server is a100 and sched.counters["hedge_copies"] == 1
    assert [sum(g) for g in table.gpus] == [0.0, 0.0, 0.0]  # both GPUs held (the CPU node: none)
    assert runs.copy_server(t) is None  # no other GPU node has room: at most one copy anyway
    runs.end_loser(t, t.copy, None)  # the copy is cancelled: only the A100's GPU is free
    assert [sum(g) for g in table.gpus] == [0.0, 1.0, 0.0]
    assert t in a10g.running and t not in a100.running
    sched.placement.release(a10g, t, 2.0)
    assert [sum(g) for g in table.gpus] == [1.0, 1.0, 0.0] and table.running == [{}, {}, {}]


def test_ray_defaults_twin_is_the_mean_of_its_random_draws():
    """Live Ray is one draw of its random top-k choice: its twin (bench live --setting agents)
    averages --ray-draws draws on the run's requests, and reports their spread; a rule
    without randomness is run once."""
    from policies.heuristics import RayHybrid
    from scale_ray.bench.agents_live import REFERENCE, requests, twin_prediction
    from scale_ray.evaluation import simulate

    env = load_env("configs/env/agents.yaml").with_servers(4)
    reqs = requests(env, 20, 1)
    key = "mean_workflow_response_s"
    one = [simulate(env, RayHybrid(), 1 + 10_000 * j, reqs, 1 + 10_000 * j)[key]
           for j in range(3)]
    got = twin_prediction(REFERENCE, 1, reqs, env, 3)
    assert got["draws"] == 3 and got[key] == pytest.approx(np.mean(one))
    assert got["sd_mean_workflow_response_s"] == pytest.approx(np.std(one, ddof=1))
    assert len(set(one)) > 1  # the draws differ: there is a spread to average
    assert twin_prediction(REFERENCE, 1, reqs, env, 1)[key] == one[0]
    spread = twin_prediction("eft_spread", 1, reqs, env, 3)
    assert spread["draws"] == 1 and spread["sd_mean_workflow_response_s"] == 0.0
