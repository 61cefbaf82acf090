"""`scale-ray explain`: response split along the realised critical path; hand-built simulator and
live traces with known parts, real simulator traces (parts sum to the response), CLI and errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from envs.config_files import CONFIG_DIR, load_env
from envs.trace import verify_trace
from scale_ray.cli import main
from scale_ray.evaluation import run_episode
from scale_ray.explain import PARTS, explain, load_episodes
from scale_ray.gantt import load_schedule

TIERS = [{"name": "small", "compute": 1.0, "memory_gb": 8.0},
         {"name": "large", "compute": 4.0, "memory_gb": 80.0}]


def write(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def task(tid: int, gflop: float, parents: list[int], memory_gb: float = 1.0) -> dict:
    return {"task": tid, "compute_gflop": gflop, "memory_gb": memory_gb, "output_gb": 0.25,
            "parents": parents}


def sim_trace() -> list[dict]:
    """Server 0 large (4 GFLOP/s), 1 small (1). Transfers delay starts: 0.25 GB / 1 GB/s + 0.25 s.
    Workflow 0 (t=1): 0 -> {1, 2} -> 3; workflow 1 (t=1.5): task 4 alone."""
    return [
        {"t": 0.0, "event": "episode", "bandwidth_gb_s": 1.0, "latency_s": 0.25,
         "transfer_delays_start": True, "tiers": TIERS},
        {"t": 0.0, "event": "server_add", "server": 0, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0},
        {"t": 0.0, "event": "server_add", "server": 1, "tier": "small", "compute": 1.0,
         "memory_gb": 8.0},
        {"t": 1.0, "event": "arrival", "workflow": 0, "tasks": [
            task(0, 8.0, []), task(1, 4.0, [0]), task(2, 2.0, [0]), task(3, 4.0, [1, 2])]},
        {"t": 1.0, "event": "start", "task": 0, "server": 0},
        {"t": 1.5, "event": "arrival", "workflow": 1, "tasks": [task(4, 4.0, [])]},
        {"t": 1.5, "event": "start", "task": 4, "server": 1},
        {"t": 3.0, "event": "finish", "task": 0, "server": 0},
        {"t": 3.0, "event": "start", "task": 1, "server": 0},  # ready at 3, same server
        {"t": 4.0, "event": "finish", "task": 1, "server": 0},
        {"t": 5.5, "event": "finish", "task": 4, "server": 1},
        {"t": 5.5, "event": "start", "task": 2, "server": 1, "transfer_s": 0.5},  # ready at 3
        {"t": 8.0, "event": "finish", "task": 2, "server": 1},
        {"t": 8.5, "event": "guard", "task": 3, "proposed": None, "chosen": 0, "reason": "x"},
        {"t": 8.5, "event": "start", "task": 3, "server": 0, "transfer_s": 0.5},  # gated by 2
        {"t": 10.0, "event": "finish", "task": 3, "server": 0},
        {"t": 10.0, "event": "end", "truncated": False,
         "metrics": {"mean_workflow_response_s": 6.5}},
    ]


def test_hand_built_simulator_trace(tmp_path):
    trace = write(tmp_path / "sim.jsonl", sim_trace())
    verify_trace(sim_trace())  # a valid trace of the model
    rep = explain(trace)
    wf0, wf1 = rep["workflows"]
    assert wf0["response_s"] == 9.0 and wf1["response_s"] == 4.0
    # path 0 -> 2 -> 3: runs 2 + 2 + 1, transfers 0.5 + 0.5, queues 0 + 2.5 (small) + 0.5 (large).
    # Best tier large (4 GFLOP/s): 8/4 + 2/4 + 4/4 = 3.5; task 2 ran on small: 2 - 0.5 slower
    assert [s["task"] for s in wf0["path"]] == [0, 2, 3]
    assert [s["gate"] for s in wf0["path"]] == ["arrival", "parent", "parent"]
    assert [s["fastest_s"] for s in wf0["path"]] == [2.0, 0.5, 1.0]
    assert {k: wf0[k] for k in PARTS} == {"critical_path_fastest_s": 3.5, "slower_server_s": 1.5,
                                          "transfer_s": 1.0, "queue_ready_s": 3.0,
                                          "lost_run_s": 0.0, "wait_parent_s": 0.0}
    assert wf0["critical_path_run_s"] == 5.0 and wf0["unbounded_runs"] == 0
    assert wf0["queue_ready_by_tier_s"] == {"large": 0.5, "small": 2.5}
    assert wf0["slower_server_by_tier_s"] == {"large": 0.0, "small": 1.5}
    # task 4 (4 GFLOP) ran 4 s on small: 1 s on large
    assert {k: wf1[k] for k in PARTS} == {"critical_path_fastest_s": 1.0, "slower_server_s": 3.0,
                                          "transfer_s": 0.0, "queue_ready_s": 0.0,
                                          "lost_run_s": 0.0, "wait_parent_s": 0.0}
    assert wf1["critical_path_run_s"] == 4.0 and wf1["slower_server_by_tier_s"] == {"small": 3.0}
    q = wf0["longest_queue"]
    assert (q["task"], q["ready"], q["start"], q["tier"], q["queue_s"]) == (
        2, 3.0, 5.5, "small", 2.5)
    # at t=3 tasks 1 (just started) and 4 run; nothing else waits; task 1 started before it
    assert q["context"] == {"busy_servers": 2, "alive_servers": 2, "ready_waiting": 0,
                            "started_between": 1}
    tot = rep["totals"]
    assert tot["workflows"] == 2 and tot["response_s"]["mean"] == 6.5
    assert tot["critical_path_run_s"] == {"sum": 9.0, "mean": 4.5, "share": 9.0 / 13.0}
    assert tot["parts"]["critical_path_fastest_s"] == {"sum": 4.5, "mean": 2.25,
                                                       "share": 4.5 / 13.0}
    assert tot["parts"]["slower_server_s"] == {"sum": 4.5, "mean": 2.25, "share": 4.5 / 13.0}
    assert tot["slower_server_by_tier_s"] == {
        "small": {"sum": 4.5, "mean": 2.25, "share": 4.5 / 13.0},
        "large": {"sum": 0.0, "mean": 0.0, "share": 0.0}}
    assert tot["unbounded_runs"] == 0
    assert tot["parts"]["queue_ready_s"]["share"] == 3.0 / 13.0
    assert tot["queue_ready_by_tier_s"]["small"]["sum"] == 2.5
    assert [r["workflow"] for r in rep["top"]] == [0, 1]


def test_lost_run_on_the_path(tmp_path):
    """Task 1 is lost with server 1 at t=3 after running 2 s, then reruns on server 0 at once."""
    ev = sim_trace()[:3] + [
        {"t": 1.0, "event": "arrival", "workflow": 0,
         "tasks": [task(0, 8.0, []), task(1, 4.0, [])]},
        {"t": 1.0, "event": "start", "task": 0, "server": 0},
        {"t": 1.0, "event": "start", "task": 1, "server": 1},
        {"t": 3.0, "event": "finish", "task": 0, "server": 0},
        {"t": 3.0, "event": "lost", "task": 1, "server": 1},
        {"t": 3.0, "event": "server_fail", "server": 1},
        {"t": 3.0, "event": "start", "task": 1, "server": 0},
        {"t": 4.0, "event": "finish", "task": 1, "server": 0},
        {"t": 4.0, "event": "end", "truncated": False, "metrics": {}},
    ]
    (wf,) = explain(write(tmp_path / "lost.jsonl", ev))["workflows"]
    assert [(s["task"], s["outcome"], s["gate"]) for s in wf["path"]] == [
        (1, "lost", "arrival"), (1, "done", "lost")]
    assert wf["response_s"] == 3.0 and wf["lost_run_s"] == 2.0 and wf["critical_path_run_s"] == 1.0
    assert wf["critical_path_fastest_s"] == 1.0 and wf["slower_server_s"] == 0.0  # rerun on large
    assert wf["queue_ready_s"] == 0.0 and wf["wait_parent_s"] == 0.0


def live_trace() -> list[dict]:
    """What LiveScheduler writes: node ids, a lost run, output_lost and a rerun (finish with
    server -1), a cancelled workflow."""
    a, b = "a" * 56, "b" * 56
    return [
        {"t": 0.0, "event": "episode", "bandwidth_gb_s": 10.0, "latency_s": 0.01,
         "transfer_delays_start": False, "time_scale": 0.05, "policy": "eft", "tiers": TIERS},
        {"t": 0.01, "event": "server_add", "server": 0, "tier": "small", "compute": 1.0,
         "memory_gb": 8.0, "node": a, "slot": 0},
        {"t": 0.01, "event": "server_add", "server": 1, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0, "node": b, "slot": 0},
        {"t": 0.02, "event": "server_add", "server": 2, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0, "node": b, "slot": 1},
        {"t": 0.5, "event": "arrival", "workflow": 0, "name": "agent",
         "tasks": [task(0, 2.0, []), task(1, 2.0, [0]), task(2, 2.0, [])]},
        {"t": 0.51, "event": "start", "task": 0, "server": 0, "node": a},
        {"t": 0.52, "event": "start", "task": 2, "server": 2, "node": b},
        {"t": 0.6, "event": "arrival", "workflow": 1, "name": "other", "tasks": [task(3, 2.0, [])]},
        {"t": 2.6, "event": "finish", "task": 0, "server": 0, "node": a},
        {"t": 2.61, "event": "start", "task": 1, "server": 1, "node": b},
        {"t": 2.9, "event": "lost", "task": 1, "server": 1, "node": b,
         "reason": "parent output lost"},
        {"t": 2.9, "event": "output_lost", "task": 0, "node": a},
        {"t": 2.95, "event": "server_fail", "server": 0, "node": a},
        {"t": 3.0, "event": "start", "task": 0, "server": 1, "node": b},
        {"t": 3.1, "event": "cancel", "workflow": 1},
        {"t": 3.6, "event": "finish", "task": 0, "server": -1, "node": b, "rerun": True},
        {"t": 3.7, "event": "start", "task": 1, "server": 1, "node": b},
        {"t": 4.0, "event": "finish", "task": 2, "server": 2, "node": b},
        {"t": 4.3, "event": "finish", "task": 1, "server": 1, "node": b},
        {"t": 5.0, "event": "end", "truncated": False, "metrics": {"policy": "eft", "lost": 1}},
    ]


def test_live_trace(tmp_path):
    trace = write(tmp_path / "live.jsonl", live_trace())
    rep = explain(trace)
    assert rep["totals"]["live"] and rep["totals"]["arrived_workflows"] == 2
    (wf,) = rep["workflows"]  # workflow 1 was cancelled
    assert wf["name"] == "agent" and wf["response_s"] == pytest.approx(3.8, abs=1e-12)
    # 0 (0.51-2.6, output lost at 2.9: wasted) -> rerun of 0 (3.0-3.6) -> 1 (3.7-4.3)
    assert [(s["task"], s["outcome"], s["gate"]) for s in wf["path"]] == [
        (0, "wasted", "arrival"), (0, "done", "output_lost"), (1, "done", "parent")]
    # the header lists tiers: both finished path runs (2 GFLOP) would take 0.5 on large, ran 0.6
    want = {"critical_path_run_s": 1.2, "critical_path_fastest_s": 1.0, "slower_server_s": 0.2,
            "transfer_s": 0.0, "queue_ready_s": 0.21, "lost_run_s": 2.09, "wait_parent_s": 0.3}
    for k, v in want.items():
        assert wf[k] == pytest.approx(v, abs=1e-12), k
    assert wf["queue_ready_by_tier_s"] == pytest.approx({"large": 0.2, "small": 0.01}, abs=1e-12)
    assert wf["slower_server_by_tier_s"] == pytest.approx({"large": 0.2}, abs=1e-12)
    assert math.fsum(wf[k] for k in PARTS) == pytest.approx(wf["response_s"], abs=1e-12)
    # the ready times agree with the Gantt chart's derivation
    (ep,) = load_episodes(trace)
    assert [r.ready for r in ep.runs] == [r.ready for r in load_schedule(trace).runs]


def test_agent_programs_split_start_to_last_step(tmp_path, capsys):
    """A program started at 1.0: step 0 arrives at 1.2 and runs 1.4-2.0; the agent reads the
    answer, step 1 arrives at 2.5 and step 2 (a side call) at 2.6; step 1 ends last at 4.0,
    step 2 at 3.0. The chain: 0 then 1; agent time 0.2 (start to step 0) + 0.5 (2.0 to 2.5)."""
    prog = {"program": 0, "program_start": 1.0}
    trace = write(tmp_path / "prog.jsonl", [
        {"t": 0.0, "event": "episode", "tiers": TIERS, "time_scale": 0.1},
        {"t": 0.0, "event": "server_add", "server": 0, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0, "node": "n"},
        {"t": 1.2, "event": "arrival", "workflow": 0, "tasks": [task(0, 2.4, [])], **prog},
        {"t": 1.4, "event": "start", "task": 0, "server": 0, "node": "n"},
        {"t": 2.0, "event": "finish", "task": 0, "server": 0, "node": "n"},
        {"t": 2.5, "event": "arrival", "workflow": 1, "tasks": [task(1, 4.0, [])], **prog},
        {"t": 2.6, "event": "arrival", "workflow": 2, "tasks": [task(2, 1.0, [])], **prog},
        {"t": 2.6, "event": "start", "task": 2, "server": 0, "node": "n"},
        {"t": 3.0, "event": "finish", "task": 2, "server": 0, "node": "n"},
        {"t": 3.0, "event": "start", "task": 1, "server": 0, "node": "n"},
        {"t": 4.0, "event": "finish", "task": 1, "server": 0, "node": "n"},
        {"t": 4.1, "event": "arrival", "workflow": 3, "tasks": [task(3, 1.0, [])]},  # alone
        {"t": 4.1, "event": "start", "task": 3, "server": 0, "node": "n"},
        {"t": 4.5, "event": "finish", "task": 3, "server": 0, "node": "n"},
        {"t": 5.0, "event": "end", "truncated": False},
    ])
    rep = explain(trace)
    (p,) = rep["programs"]
    assert (p["program"], p["steps"], p["chain"]) == (0, 3, [0, 1])
    assert p["response_s"] == pytest.approx(3.0, abs=1e-12)  # 1.0 to 4.0
    assert p["agent_s"] == pytest.approx(0.7, abs=1e-12)
    assert p["queue_ready_s"] == pytest.approx(0.2 + 0.5, abs=1e-12)  # 1.2-1.4, 2.5-3.0
    assert p["critical_path_fastest_s"] == pytest.approx(1.6, abs=1e-12)  # 2.4 and 4 GFLOP at 4
    assert p["slower_server_s"] == pytest.approx(0.0, abs=1e-12)
    assert math.fsum([p["agent_s"], *(p[k] for k in PARTS)]) == pytest.approx(3.0, abs=1e-12)
    assert rep["totals"]["programs"]["count"] == 1 and len(rep["workflows"]) == 4
    assert main(["explain", str(trace)]) == 0
    assert "1 agent programs" in capsys.readouterr().out
    # a program with a step that did not complete is left out
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    events.insert(-1, {"t": 4.6, "event": "arrival", "workflow": 4, "tasks": [task(4, 1.0, [])],
                       **prog})
    assert explain(write(tmp_path / "open.jsonl", events))["programs"] == []


def tier_trace(header_tiers: bool, server_compute: bool) -> list[dict]:
    """The fastest tier (4 GFLOP/s) has 8 GB, the big one (2 GFLOP/s) 80 GB; chain 0 -> 1 -> 2 all
    on the big server: task 0 (16 GB) fits only big, task 1 (1 GB) fits fast, task 2 (100 GB)
    fits none, so its bound is the fastest tier's (the simulator's rule)."""
    tiers = [{"name": "fast", "compute": 4.0, "memory_gb": 8.0},
             {"name": "big", "compute": 2.0, "memory_gb": 80.0}]
    servers = [{"t": 0.0, "event": "server_add", "server": i, "tier": x["name"],
                **({"compute": x["compute"], "memory_gb": x["memory_gb"]} if server_compute
                   else {})} for i, x in enumerate(tiers)]
    return [{"t": 0.0, "event": "episode", **({"tiers": tiers} if header_tiers else {})},
            *servers,
            {"t": 0.0, "event": "arrival", "workflow": 0, "tasks": [
                task(0, 4.0, [], 16.0), task(1, 4.0, [0]), task(2, 8.0, [1], 100.0)]},
            {"t": 0.0, "event": "start", "task": 0, "server": 1},
            {"t": 2.0, "event": "finish", "task": 0, "server": 1},
            {"t": 2.0, "event": "start", "task": 1, "server": 1},
            {"t": 4.0, "event": "finish", "task": 1, "server": 1},
            {"t": 4.0, "event": "start", "task": 2, "server": 1},
            {"t": 8.0, "event": "finish", "task": 2, "server": 1},
            {"t": 8.0, "event": "end", "truncated": False, "metrics": {}}]


@pytest.mark.parametrize("header_tiers, server_compute", [(True, False), (False, True)])
def test_best_tier_by_memory(tmp_path, header_tiers, server_compute):
    """Header tiers, else the servers' compute and memory, give each task's best tier."""
    trace = write(tmp_path / "tiers.jsonl", tier_trace(header_tiers, server_compute))
    (wf,) = explain(trace)["workflows"]
    assert [s["fastest_s"] for s in wf["path"]] == [2.0, 1.0, 2.0]
    assert (wf["critical_path_fastest_s"], wf["slower_server_s"], wf["critical_path_run_s"]) == (
        5.0, 3.0, 8.0)
    assert wf["slower_server_by_tier_s"] == {"big": 3.0} and wf["unbounded_runs"] == 0


def test_no_tier_compute(tmp_path, capsys):
    """Without tier compute the whole run counts as best-tier run, and the report says so."""
    trace = write(tmp_path / "bare.jsonl", tier_trace(False, False))
    rep = explain(trace)
    (wf,) = rep["workflows"]
    assert (wf["critical_path_fastest_s"], wf["slower_server_s"]) == (8.0, 0.0)
    assert wf["unbounded_runs"] == rep["totals"]["unbounded_runs"] == 3
    assert main(["explain", str(trace)]) == 0
    assert "3 path runs lack task or tier compute" in capsys.readouterr().out


def sim_episode(tmp_path: Path, k: int, *overrides: str) -> tuple[Path, dict]:
    env = load_env(CONFIG_DIR / "env" / "realistic.yaml", ["workload.horizon_s=30", *overrides],
                   servers=8)
    trace = tmp_path / f"ep{k}.jsonl"
    return trace, run_episode(env, "eft", k, trace_path=trace)


def check_sums(rep: dict) -> None:
    recs = rep["workflows"]
    for r in recs:
        assert abs(math.fsum(r[k] for k in PARTS) - r["response_s"]) < 1e-9, r["workflow"]
        assert min(r[k] for k in PARTS) >= -1e-9
        by_tier = sum(r["queue_ready_by_tier_s"].values())
        assert r["queue_ready_s"] == pytest.approx(by_tier, abs=1e-9)
        slow = sum(r["slower_server_by_tier_s"].values())
        assert r["slower_server_s"] == pytest.approx(slow, abs=1e-9)
        assert r["critical_path_run_s"] == pytest.approx(
            r["critical_path_fastest_s"] + r["slower_server_s"], abs=1e-9)
        assert r["critical_path_fastest_s"] > 0 and r["unbounded_runs"] == 0
        assert r["path"][0]["ready"] == r["arrival"] and r["path"][-1]["end"] == r["finish"]
        for prev, step in zip(r["path"], r["path"][1:]):  # consecutive path runs touch
            assert step["ready"] == prev["end"]
    tot = rep["totals"]
    assert tot["response_s"]["sum"] == pytest.approx(sum(r["response_s"] for r in recs), rel=1e-12)
    for k in PARTS:
        assert tot["parts"][k]["sum"] == pytest.approx(sum(r[k] for r in recs), abs=1e-9)
        assert tot["parts"][k]["mean"] == pytest.approx(tot["parts"][k]["sum"] / len(recs))
    assert sum(s["share"] for s in tot["parts"].values()) == pytest.approx(1.0, abs=1e-12)
    assert tot["critical_path_run_s"]["sum"] == pytest.approx(
        tot["parts"]["critical_path_fastest_s"]["sum"] + tot["parts"]["slower_server_s"]["sum"])


@pytest.mark.parametrize("overrides", [(), ("dynamics.fail_rate_per_server_s=0.02",
                                            "dynamics.rejoin_after_s=1.0")])
def test_real_simulator_trace(tmp_path, overrides):
    trace, m = sim_episode(tmp_path, 0, *overrides)
    rep = explain(trace, top=3)
    check_sums(rep)
    assert rep["totals"]["workflows"] == m["completed_workflows"] > 0
    assert rep["totals"]["response_s"]["mean"] == pytest.approx(m["mean_workflow_response_s"])
    assert rep["totals"]["parts"]["transfer_s"]["sum"] > 0  # realistic: transfers delay starts
    assert rep["totals"]["parts"]["wait_parent_s"]["sum"] == 0.0
    assert rep["totals"]["parts"]["slower_server_s"]["sum"] > 0  # some path runs on slower tiers
    # the path's best-tier runs are a chain of the DAG, so at most the simulator's lower bound
    slow = [r["response_s"] / r["critical_path_fastest_s"] for r in rep["workflows"]]
    assert sum(slow) / len(slow) >= m["slowdown"] - 1e-9
    if overrides:  # servers fail: some lost runs, all on paths accounted as lost
        assert '"lost"' in trace.read_text()
        assert rep["totals"]["parts"]["lost_run_s"]["sum"] > 0
    (ep,) = load_episodes(trace)
    assert [r.ready for r in ep.runs] == [r.ready for r in load_schedule(trace).runs]
    assert len(rep["top"]) == 3
    assert rep["top"][0]["queue_ready_s"] == max(r["queue_ready_s"] for r in rep["workflows"])


def test_multi_episode_file(tmp_path):
    (t0, m0), (t1, m1) = sim_episode(tmp_path, 0), sim_episode(tmp_path, 1)
    both = tmp_path / "both.jsonl"
    both.write_text(t0.read_text() + t1.read_text())
    rep = explain(both)
    check_sums(rep)
    assert rep["totals"]["episodes"] == 2
    n0 = m0["completed_workflows"]
    assert rep["totals"]["workflows"] == n0 + m1["completed_workflows"]
    keys = [(r["episode"], r["workflow"]) for r in rep["workflows"]]
    assert len(set(keys)) == len(keys) and keys[n0] == (1, 0)
    ep1 = [r["response_s"] for r in rep["workflows"] if r["episode"] == 1]
    assert sum(ep1) / len(ep1) == pytest.approx(m1["mean_workflow_response_s"])


def test_cli(tmp_path, capsys):
    trace = write(tmp_path / "sim.jsonl", sim_trace())
    out = tmp_path / "out" / "explain.json"
    assert main(["explain", str(trace), "--top", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("sim.jsonl: 2 completed workflows of 2 arrived")
    assert lines[1].startswith("mean workflow response 6.500 s")
    assert lines[1] == ("mean workflow response 6.500 s (sum 13.0 s; its path's runs on the best "
                        "tier 2.250 s), on its critical path:")
    assert "queue while ready" in text and "on small" in text and "23.1%" in text
    assert "run on best tier" in text and "slower server" in text and "34.6%" in text
    assert "critical-path run 4.500 s, 69.2%" in text
    assert "The 1 workflows that waited longest" in text and "workflow 0: response 9.00 s" in text
    assert ("response 9.00 s = best-tier run 3.50 + slower server 1.50 + transfer 1.00 + queue "
            "3.00; 3 runs") in text
    assert "task 2 ready at 3.00 s, started 5.50 s on server 1 (small) after 2.50 s" in text
    data = json.loads(out.read_text())
    assert len(data["workflows"]) == 2 and data["totals"]["response_s"]["sum"] == 13.0


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ('{"t": 0, "event": "episode"}\n\nhello world\n', ":3: not a trace: line 3 is not valid JSON"),
    ('[1, 2]\n', ":1: not a trace: line 1 is not a trace event"),
    ('{"event": "start", "task": 0, "server": 0}\n', "numeric time"),
    ("", "no events"),
    ('{"t": 0, "event": "finish", "task": 3, "server": 0}\n',
     ":1: finish of task 3 that is not running"),
    ('{"t": 0, "event": "episode"}\n{"t": 0, "event": "end"}\n', "no 'arrival' events"),
    (b"\xff\xfe\x00binary", "not a text"),
])
def test_bad_input(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["explain", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and problem in err, err


def test_no_completed_workflow_and_bad_options(tmp_path, capsys):
    cut = [e for e in sim_trace() if e["event"] not in ("finish", "end")]  # nothing finishes
    cut.append({"t": 10.0, "event": "end", "truncated": True, "metrics": {}})
    cut = [e for e in cut if e["event"] != "start" or e["task"] in (0, 4)]
    trace = write(tmp_path / "cut.jsonl", cut)
    assert main(["explain", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "no completed workflow: 2 arrived" in err and "truncated" in err
    assert main(["explain", str(trace), "--top", "-1"]) == 2
    assert "--top" in capsys.readouterr().err
    assert main(["explain", str(tmp_path)]) == 2
    assert "not a file" in capsys.readouterr().err
