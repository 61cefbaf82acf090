"""The first hour, round three (issue 73): what a new user reads and runs, without Ray.

One test (or a few) per item of the issue; the ones that need a live Ray are in
tests/test_first_hour_live.py.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest

from scale_ray.cli import main
from scale_ray.relative import rel

REPO = Path(__file__).resolve().parent.parent


# ---- item 6: scale-ray eval's table, pairing and --help ----

def test_eval_table_says_units_and_direction_and_has_no_duplicate_column(capsys):
    assert main(["eval", "--policy", "eft", "round-robin", "--episodes", "2", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "wf all" not in out and "invalid" not in out
    head = next(line for line in out.splitlines() if line.startswith("policy"))
    for col in ("wf mean s", "wf p95 s", "wf p99 s", "task p95 s", "waits/dec", "guard/ep"):
        assert col in head, (col, head)
    assert "lower is better" in out and "per episode" in out


def test_eval_flags_rows_whose_censored_mean_differs():
    from scale_ray.evaluation import format_table

    row = {"policy": "eft", "servers": 16, "episodes": 2, "mean_workflow_response_s": 5.0,
           "p95_workflow_response_s": 9.0, "p99_workflow_response_s": 10.0,
           "censored_workflow_response_s": 5.0, "mean_task_response_s": 3.0,
           "std_task_response_s": 0.1, "p95_task_response_s": 7.0, "completed_tasks": 100.0,
           "slowdown": 1.5, "utilization": 0.3, "invalid_rate": 0.0, "guard_overrides": 0.0}
    assert "unfinished" not in format_table([row])
    late = format_table([{**row, "censored_workflow_response_s": 7.25}])
    assert "unfinished workflows" in late and "eft N=16: 7.250 s" in late


def test_eval_refuses_a_policy_named_twice_and_skips_a_self_pairing(capsys):
    assert main(["eval", "--policy", "eft", "eft", "--episodes", "1", "--workers", "1"]) == 2
    assert "named more than once" in capsys.readouterr().err
    # paper.yaml's order is hop: eft@hop is eft, and pairing them would print +0.00 % ± 0.00 %
    assert main(["eval", "--policy", "eft", "eft@hop", "eft@fifo", "--paired-vs", "eft",
                 "--episodes", "2", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "eft@hop: the same policy, order and submission as eft" in out
    paired = out[out.index("paired vs eft"):].splitlines()
    assert "lower is better" in paired[0]
    assert len(paired) == 2 and paired[1].lstrip().startswith("eft@fifo")
    assert re.search(r"better in \d+, worse in \d+, equal in \d+\)", paired[1])


def test_eval_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("episodes per policy and size (default: 30)", "cluster sizes N (default: 16)",
                   "base seed of the fixed evaluation set (default: 0)"):
        assert needle in text


# ---- item 10: quiet by default ----

def test_pyproject_builds_without_a_deprecation_warning():
    """`make install` printed setuptools' `project.license` deprecation block three times."""
    from setuptools.config import pyprojecttoml
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyprojecttoml.apply_configuration(Distribution(), str(REPO / "pyproject.toml"))


def test_http_client_request_lines_are_quiet_unless_verbose():
    """`bench service` logged an httpx INFO line per metrics scrape."""
    from scale_ray.cli import configure_logging

    configure_logging(verbose=False)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging(verbose=True)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging(verbose=False)


# ---- item 11: smaller ----

def test_top_level_help_is_whole_sentences(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    desc = " ".join(out.split("\n\n")[1].split())
    assert desc.endswith(".") and "exposing" not in desc and "Ray cluster" in desc


# ---- item 7: training's per-iteration line ----

def test_training_line_says_no_episode_ended_instead_of_dashes():
    import math

    from scale_ray.train_metrics import PROGRESS_LEGEND, progress_line

    row = {"iteration": 3, "env_steps": 3072.0, "iter_s": 1.2, "episode_return": math.nan,
           "mean_task_response_s": math.nan, "lr": 3e-4, "total_loss": 0.3}
    line = progress_line(row, 20)
    assert "return n/a (no episode ended)" in line and "resp" not in line
    assert "return -" not in line and " -s" not in line
    done = progress_line({**row, "episode_return": -41.5, "mean_task_response_s": 5.02}, 20)
    assert "return -41.50 resp 5.02s" in done
    assert "higher is better" in PROGRESS_LEGEND and "lower is better" in PROGRESS_LEGEND


# ---- item 9: a memory refusal names its unit ----

def test_memory_refusal_says_gigabytes():
    from scale_ray.live import LiveConfig, collect
    from scale_ray.live.cluster import NodeInfo, server_caps
    from scale_ray.live.config import Unschedulable
    from scale_ray.live.nodes import LiveServer
    from scale_ray.live.refusals import check_fits
    from scale_ray.live.workflow import Primitive, emulated_body

    res = {"CPU": 2, "memory": 12.2881e9}
    node = LiveServer(0, NodeInfo("n", 1, 1.0, res["memory"] / 1e9, "n", 0.0, 0.0,
                                  server_caps(res, 1)), 0)
    big = Primitive(emulated_body, 1.0, ray_options={"memory": 1099.51e9})
    with pytest.raises(Unschedulable) as e:
        check_fits(collect([big.bind()]), [node], [], LiveConfig(), "ray", slotted=False)
    assert "memory=1099.51 GB (the most any node has: 12.2881 GB)" in str(e.value)


# ---- item 4 (and 11): a workflow's record as a user reads it ----

def _placed_workflow():
    """A two-task workflow in a live scheduler (Ray's resource model, no Ray: runs are
    stand-ins) whose first task was just started by the scheduler's own run path."""
    from policies import get_policy
    from scale_ray.config import load_env
    from scale_ray.live import LiveConfig, LiveScheduler
    from scale_ray.live.cluster import NodeInfo, server_caps
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.nodes import LiveServer
    from scale_ray.live.workflow import Primitive, collect, emulated_body

    res = {"CPU": 4, "memory": 16e9}
    node = LiveServer(0, NodeInfo("node-a", 1, 1.0, 16.0, "node-a", 0.0, 0.0,
                                  server_caps(res, 1)), 0)
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0))
    sched.nodes.slotted = False
    sched.set_alive([node])
    refs = iter(range(100))
    sched.nodes.run = lambda *a: (f"value{next(refs)}", f"status{next(refs)}")
    p = Primitive(emulated_body, 1.0)
    a = p.bind(0)
    wf = collect([p.bind(a)])
    h = WorkflowHandle(0, wf, 100.0)
    sched.admission.admit(h)
    (t,) = [e[2] for e in sched.placement.queue.heap]
    sched.runs.submit(t, node, 101.5)
    return h, t.idx


def test_a_workflow_whose_task_runs_is_running_with_its_node_and_start():
    from serve_apps.workflow_api import STATES, record, state

    h, i = _placed_workflow()
    assert state(h) == "running" and set(STATES) >= {"queued", "running", "completed"}
    rec = record("w-1", h, t0=90.0, time_scale=1.0, epoch=1.7e9)
    task = rec["tasks"][i]
    assert task["state"] == "running" and task["node"] == "node-a"
    assert task["started_at"] == pytest.approx(1.7e9 + 101.5) and task["finished_at"] is None
    other = rec["tasks"][1 - i]
    assert other["state"] == "pending" and other["node"] is None and other["started_at"] is None
    assert rec["submitted_at"] == pytest.approx(1.7e9 + 100.0)
    assert rec["scheduler_started_at"] == pytest.approx(1.7e9 + 90.0)
    assert rec["submitted_s"] == pytest.approx(10.0)  # since scheduler_started_at
    h.record_task_done(i, "ref", "node-a", 104.0)
    task = record("w-1", h, 90.0, 1.0, 1.7e9)["tasks"][i]
    assert task["state"] == "completed" and task["run_s"] == pytest.approx(2.5)
    assert task["finished_at"] == pytest.approx(1.7e9 + 104.0)
    assert task["response_s"] == pytest.approx(4.0)


def test_a_queued_workflow_is_queued():
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.workflow import Primitive, collect, emulated_body
    from serve_apps.workflow_api import record

    h = WorkflowHandle(0, collect([Primitive(emulated_body, 1.0).bind(0)]), 5.0)
    rec = record("w", h, 0.0, 1.0, 0.0)
    assert rec["state"] == "queued" and rec["tasks"][0]["state"] == "pending"


def test_an_open_program_whose_steps_are_done_shows_its_response_and_that_it_is_open():
    from types import SimpleNamespace

    from serve_apps.workflow_api import program_record

    def step(jid, end):
        return SimpleNamespace(jid=jid, done=lambda: end is not None, finished_wall=end)

    prog = SimpleNamespace(handles=[step("a", 12.0), step("b", 15.0)], closed=False,
                           started_wall=10.0)
    rec = program_record(prog)
    assert rec["state"] == "open" and rec["closed"] is False and rec["steps_done"] == 2
    assert rec["response_s"] == pytest.approx(5.0) and rec["final"] is False
    prog.handles.append(step("c", None))  # a step still running: no response yet
    assert program_record(prog)["response_s"] is None
    prog.handles[-1] = step("c", 18.0)
    prog.closed = True
    rec = program_record(prog)
    assert rec["state"] == "closed" and rec["response_s"] == pytest.approx(8.0) and rec["final"]


def test_the_api_docs_example_runs_on_a_cpu_only_cluster():
    """/docs's "Try it out" body asked for num_gpus: 0.5: a 422 on a CPU-only cluster."""
    import json

    from scale_ray.live import LiveConfig
    from scale_ray.live.cluster import NodeInfo, server_caps
    from scale_ray.live.nodes import LiveServer
    from scale_ray.live.refusals import check_fits
    from serve_apps.errors import parse_body
    from serve_apps.scheduler import api
    from serve_apps.workflow_api import AllowList, WorkflowIn, to_workflow

    body = api.openapi()["paths"]["/v1/workflows"]["post"]["requestBody"]
    example = body["content"]["application/json"]["example"]
    wf = to_workflow(parse_body(json.dumps(example).encode(), WorkflowIn), AllowList([]), 100)
    res = {"CPU": 2, "memory": 8e9}
    laptop = LiveServer(0, NodeInfo("cpu", 1, 1.0, 8.0, "cpu", 0.0, 0.0, server_caps(res, 1)), 0)
    check_fits(wf, [laptop], [], LiveConfig(), "ray", slotted=False)  # raises if refused


# ---- item 3: client.program(first) ----

def test_client_program_refuses_what_it_cannot_start_with_one_line_before_asking(monkeypatch):
    from scale_ray import client
    from scale_ray.live.workflow import WorkflowTypeError

    def no_service(*a, **k):
        raise AssertionError("the service was asked")

    monkeypatch.setattr(client, "_retrying", no_service)
    for wrong in (42, {"tasks": []}, 3.5):
        with pytest.raises(WorkflowTypeError) as e:
            client.program(wrong, tenant="t")
        text = str(e.value)
        assert "\n" not in text and text.startswith("client.program(first): ")
        assert "an earlier workflow" in text and "a Call" in text and "Ray DAG" in text


def test_client_program_submits_a_call_as_its_first_step(monkeypatch):
    from scale_ray import client
    from scale_ray.live.workflow import Primitive, emulated_body

    sent = []

    def fake_submit(workflow, *inputs, name="", app="scheduler", tenant=None, **kw):
        sent.append((workflow, kw.get("program")))
        return client.ServiceWorkflow(app, {"id": "w-1", "name": "first"}, 0.0, tenant or "t")

    monkeypatch.setattr(client, "submit", fake_submit)
    call = Primitive(emulated_body, 1.0).bind(0)
    p = client.program(call, tenant="t")
    assert sent == [(call, None)] and p.step == "w-1" and p.first.id == "w-1"
    assert p.tenant == "t" and not p.closed
    again = client.program(p.first)  # an earlier workflow: nothing submitted
    assert again.step == "w-1" and len(sent) == 1


# ---- item 8: metrics a user can find ----

def test_metrics_route_serves_only_the_scheduler_series():
    from serve_apps.metrics import scheduler_series
    from serve_apps.scheduler import api

    assert "/metrics" in api.openapi()["paths"]
    page = "\n".join([
        "# HELP ray_node_cpu_utilization Total CPU usage",
        "# TYPE ray_node_cpu_utilization gauge",
        'ray_node_cpu_utilization{ip="1.2.3.4"} 12.0',
        "# HELP ray_scale_scheduler_decisions_total placement decisions",
        "# TYPE ray_scale_scheduler_decisions_total counter",
        'ray_scale_scheduler_decisions_total{Component="core_worker"} 7.0',
        'ray_scale_scheduler_queued_tasks{tenant="t-0a1b2c3d"} 3.0'])
    assert scheduler_series(page).splitlines() == page.splitlines()[3:]
    assert scheduler_series("# EOF\nray_other 1\n") == ""


# ---- item 1: a client without the cluster's Ray token is told what to run, at once ----

@pytest.fixture
def token_gcs():
    """A stand-in GCS (Ray's own gRPC service definition) that requires the token "good", as a
    cluster started by `serve run` on Ray 2.60 does; yields its address."""
    from concurrent import futures

    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    class Gcs(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):
            if dict(context.invocation_metadata()).get("authorization") != "Bearer good":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken")
            return gcs_service_pb2.GetClusterIdReply()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Gcs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_a_missing_token_is_named_in_one_line_within_a_second(token_gcs, tmp_path):
    import time

    from scale_ray.connect import AuthNeeded, check_token, use_token_if_present

    env = {"HOME": str(tmp_path)}  # no RAY_AUTH_MODE, no token anywhere
    use_token_if_present(env)
    assert "RAY_AUTH_MODE" not in env
    t0 = time.perf_counter()
    with pytest.raises(AuthNeeded) as e:
        check_token(token_gcs, environ=env)
    assert time.perf_counter() - t0 < 1.0
    text = str(e.value)
    assert "\n" not in text and "has no token" in text
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=" in text
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("stale\n")
    use_token_if_present(env)  # a token at hand: used, for any address
    assert env["RAY_AUTH_MODE"] == "token"
    with pytest.raises(AuthNeeded, match="the token this process sends is not the cluster's"):
        check_token(token_gcs, environ=env)
    (tmp_path / ".ray" / "auth_token").write_text("good\n")
    check_token(token_gcs, environ=env)  # accepted: nothing raised
    check_token("127.0.0.1:1", environ=env)  # nothing there: left to ray.init


def test_the_client_drops_serve_log_lines_and_keeps_its_own_tasks(monkeypatch):
    """A client printed the replica's `CALL submit OK 44.4ms` lines and Serve's handle
    warnings (`Failed to get queue length ... within 0.1s`)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from scale_ray.connect import quiet_serve_logs

    printed = []
    monkeypatch.setattr(dispatcher, "handlers", [("ray_print_logs", printed.append)])
    serve_log = logging.getLogger("ray.serve")
    level = serve_log.level
    try:
        quiet_serve_logs()
        quiet_serve_logs()  # twice: one filter
        replica = {"actor_name": "ServeReplica:scheduler:SchedulerService",
                   "lines": ["CALL submit OK 44.4ms"]}
        mine = {"actor_name": None, "task_name": "f", "lines": ["hello"]}
        dispatcher.emit(replica)
        dispatcher.emit(mine)
        assert printed == [mine]
        assert not serve_log.isEnabledFor(logging.WARNING)
    finally:
        serve_log.setLevel(level)


# ---- item 12: a policy is checked against EFT before it serves ----

@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """A learned policy that is much worse than EFT: an untrained network (guarded, +35 % on
    paper.yaml at N = 16), as a user's 3-iteration run was (+806 %)."""
    from policies.artifact import save_untrained

    return save_untrained(tmp_path_factory.mktemp("gate") / "untrained", seed=3)


def test_eval_gate_marks_a_bad_policy_and_serve_refuses_it_with_the_number(untrained, capsys):
    import asyncio

    from scale_ray.config import load_env
    from serve_apps.gate import GATE_FILE, PolicyGate, PolicyRefused, admit, read_mark
    from serve_apps.placement import PlacementService, parse_args
    from serve_apps.policy_holder import PolicyHolder

    with pytest.raises(PolicyRefused, match="never compared with eft: run scale-ray eval --gate"):
        admit(str(untrained), PolicyGate())
    code = main(["eval", "--policy", str(untrained), "--servers", "16", "--episodes", "3",
                 "--workers", "1", "--gate"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILS the 5 % tolerance" in out and "eft" in out
    mark = read_mark(untrained)
    assert mark["rel_diff"] > 0.05 and not mark["passed"] and mark["episodes"] == 3
    shown = f"{rel(mark['rel_diff'])} vs eft"
    with pytest.raises(PolicyRefused) as e:
        admit(str(untrained), PolicyGate())
    assert shown in str(e.value) and "tolerance of 5 %" in str(e.value)
    assert "policy_gate.force" in str(e.value)
    assert admit(str(untrained), PolicyGate(force=True))["forced"]
    assert admit(str(untrained), PolicyGate(tolerance=10.0))["passed"]
    assert not admit("eft", PolicyGate())["checked"]  # heuristics are not gated
    # a swap to it keeps the current policy and says why, with the number
    svc = object.__new__(PlacementService.func_or_class)
    svc.args, svc.env = parse_args({"policy": "eft"}), load_env(None)
    holder = PolicyHolder(svc._load, "eft", "placement", lambda lp: lp.spec)
    assert asyncio.run(holder.swap(str(untrained))) is False
    assert holder.spec == "eft" and shown in holder.last_swap_error["message"]
    # the mark is bound to the weights it measured
    meta = untrained / "policy.json"
    doc = meta.read_text()
    meta.write_text(doc.replace('"checksum": "sha256:', '"checksum": "sha256:0'))
    try:
        with pytest.raises(PolicyRefused, match="measured on other weights"):
            admit(str(untrained), PolicyGate(tolerance=10.0))
    finally:
        meta.write_text(doc)
    assert (untrained / GATE_FILE).is_file()


def test_the_shipped_policies_pass_the_gate(capsys):
    """The shipped artifacts are not marked (the package is read-only): this is their gate."""
    assert main(["eval", "--policy", "scale", "crossattn", "--servers", "16", "--episodes", "3",
                 "--workers", "1", "--gate"]) == 0
    out = capsys.readouterr().out
    assert out.count("passes the 5 % tolerance") == 2


def test_eval_gate_needs_a_learned_policy(capsys):
    assert main(["eval", "--policy", "eft", "heft", "--gate", "--workers", "1"]) == 2
    assert "--gate: no learned policy" in capsys.readouterr().err


# ---- items 5 and 13: honest live numbers (scale_ray/bench/validity.py) ----

def test_a_comparison_whose_baseline_departs_from_its_twin_prints_no_gain():
    from scale_ray.bench.validity import MachineLoad, check, format_check, gain_line

    calm = MachineLoad(cores=2, samples=[1.2, 1.8])
    ok = check({"eft_spread": 13.4 / 13.3, "ray-default": 14.3 / 14.1}, calm)
    assert ok["valid"] and gain_line("eft_spread vs ray-default", -0.08, ok) == \
        "eft_spread vs ray-default: -8.0 % lower"
    bad = check({"eft_spread": 13.4 / 13.3, "ray-default": 121.2 / 14.1}, calm)
    line = gain_line("eft_spread vs ray-default", -0.89, bad)
    assert not bad["valid"] and "INVALID" in line and "89" not in line and "%" not in line
    assert "ray-default ran 8.60x its twin" in line
    assert "ray-default 8.60" in format_check(bad) and "eft_spread 1.01" in format_check(bad)


def test_a_comparison_on_an_overloaded_machine_prints_no_gain():
    from scale_ray.bench.validity import MachineLoad, check, format_check, gain_line

    busy = MachineLoad(cores=2, samples=[3.0, 135.0])
    v = check({"scale": 1.02, "ray-default": None}, busy)
    assert busy.overloaded and not v["valid"]
    assert "machine overloaded: load 135.0 on 2 cores" in gain_line("x", -0.907, v)
    assert "ray-default n/a (no twin)" in format_check(v)
    unchecked = check({"scale": 1.02, "ray-default": None}, MachineLoad(cores=2, samples=[1.0]))
    assert unchecked["valid"] and "ray-default unchecked" in gain_line("x", -0.2, unchecked)


def test_the_spread_of_a_gain_over_workflows():
    import numpy as np

    from scale_ray.bench.validity import ratio_interval

    rng = np.random.default_rng(1)
    a, b = rng.exponential(8.0, 400), rng.exponential(10.0, 400)
    lo, hi = ratio_interval(a, b)
    point = a.mean() / b.mean() - 1
    assert lo < point < hi and 0.05 < hi - lo < 0.4
    lo2, hi2 = ratio_interval(a[:40], b[:40])
    assert hi2 - lo2 > hi - lo  # fewer workflows, a wider interval


def test_bench_service_marks_the_demo_comparison_invalid_on_a_busy_machine(capsys):
    """`make demo` printed 'service vs ray-default, mean workflow response: -90.7 % lower' at
    load 135 on 2 cores."""
    import argparse

    from scale_ray.bench.service import _against_ray_default
    from scale_ray.bench.validity import MachineLoad

    out = {"killed_node": "n1", "mean_workflow_response_s": 1.0,
           "workflow_response_s": [0.9, 1.0, 1.1]}
    base = {"mean_workflow_response_s": 10.75, "p95_workflow_response_s": 20.0,
            "p99_workflow_response_s": 25.0, "workflows_completed": 3,
            "workflows_submitted": 3, "workflow_response_s": [10.0, 10.75, 11.5]}
    args = argparse.Namespace(policy="scale", seed=0)
    _against_ray_default(out, base, None, [], [], args, MachineLoad(2, [135.0]))
    text = capsys.readouterr().out
    assert "INVALID, no gain reported" in text and "90.7" not in text
    assert out["validity"]["valid"] is False and out["rel_diff_vs_ray_default"] < -0.9
    _against_ray_default(out, base, None, [], [], args, MachineLoad(2, [1.5]))
    text = capsys.readouterr().out
    assert "service vs ray-default, mean workflow response: -90.7 % lower (95 % interval" in text
    assert "scale n/a (no twin)" in text and "unchecked" in text


def test_agents_bench_reports_every_arms_twin_ratio_and_marks_a_bad_run():
    from scale_ray.bench.agents_live import REFERENCE, format_agents, summarize

    def res(mean: float, load: float | None = None) -> dict:
        return {"mean_workflow_response_model_s": mean, "p95_workflow_response_model_s": 2 * mean,
                "p99_workflow_response_model_s": 3 * mean} | (
                    {} if load is None else {"load_1m": load})

    twin_ray = res(14.1) | {"draws": 1, "sd_mean_workflow_response_model_s": 0.0}
    runs = [{"live": {REFERENCE: res(121.2, 1.0), "eft_spread": res(13.4, 1.0)},
             "twin": {REFERENCE: twin_ray, "eft_spread": res(13.3)}},
            {"live": {REFERENCE: res(14.0, 1.0), "eft_spread": res(13.0, 1.0)},
             "twin": {REFERENCE: twin_ray, "eft_spread": res(13.1)}}]
    out = {"runs": runs, "nodes": 8}
    summarize(out, ["eft_spread"])
    text = format_agents(out)
    assert [v["valid"] for v in out["validity"]] == [False, True]
    assert "run 1: live / twin mean workflow response: ray-default 8.60, eft_spread 1.01" in text
    assert "eft_spread: mean vs Ray default live INVALID / -7.1 % lower" in text
