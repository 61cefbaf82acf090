"""`scale-ray gantt`: simulator, hand-written and live-shaped traces; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scale_ray.cli import main
from scale_ray.config import load_env
from scale_ray.evaluation import run_episode
from scale_ray.gantt import draw_gantt, load_schedule

PNG = b"\x89PNG\r\n\x1a\n"


def write(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def is_png(path: Path) -> bool:
    return path.exists() and path.read_bytes()[:8] == PNG


def test_simulator_trace(tmp_path, capsys):
    trace = tmp_path / "eft.jsonl"
    env = load_env(None, ["workload.horizon_s=20"])
    m = run_episode(env, "eft", 0, trace_path=trace)
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    servers = {e["server"] for e in events if e["event"] == "server_add"}
    wfs = {e["workflow"] for e in events if e["event"] == "arrival"}

    s = draw_gantt(load_schedule(trace), tmp_path / "all.png")
    assert is_png(tmp_path / "all.png")
    assert s["rows"] == len(servers) == env.cluster.servers
    assert s["bars"] == len(starts) == m["completed_tasks"]
    assert s["tasks"] == m["completed_tasks"] and s["lost"] == 0 and s["open"] == 0
    assert s["workflows"] == len(wfs) and s["wait_info"]

    # the CLI: default output next to the trace, one summary line
    assert main(["gantt", str(trace)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(str(trace.with_suffix(".png")))
    assert f"{len(servers)} of {len(servers)} servers" in out[0] and "0 lost runs" in out[0]
    assert is_png(trace.with_suffix(".png"))

    # a window and at most K rows: the K busiest in the window
    t_mid = starts[len(starts) // 2]["t"]
    s = draw_gantt(load_schedule(trace), tmp_path / "win.png", t_from=t_mid, max_servers=3,
                   title="window")
    assert s["rows"] == 3 and "busiest" in s["selection"]
    assert 0 < s["bars"] < len(starts) and s["from"] == t_mid


def lost_trace() -> list[dict]:
    """Two servers; task 1 runs on server 1, which fails at t=3; it reruns on server 0 (a guard
    event on the way, as policies.guard writes it)."""
    return [
        {"t": 0.0, "event": "episode", "bandwidth_gb_s": 10.0, "latency_s": 0.01,
         "transfer_delays_start": False,
         "tiers": [{"name": "small", "compute": 1.0, "memory_gb": 8.0},
                   {"name": "large", "compute": 4.0, "memory_gb": 80.0}]},
        {"t": 0.0, "event": "server_add", "server": 0, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0},
        {"t": 0.0, "event": "server_add", "server": 1, "tier": "small", "compute": 1.0,
         "memory_gb": 8.0},
        {"t": 1.0, "event": "arrival", "workflow": 0, "tasks": [
            {"task": 0, "compute_gflop": 8.0, "memory_gb": 1.0, "output_gb": 0.1, "parents": []},
            {"task": 1, "compute_gflop": 4.0, "memory_gb": 1.0, "output_gb": 0.1, "parents": []}]},
        {"t": 1.0, "event": "start", "task": 0, "server": 0},
        {"t": 1.0, "event": "start", "task": 1, "server": 1},
        {"t": 3.0, "event": "finish", "task": 0, "server": 0},
        {"t": 3.0, "event": "lost", "task": 1, "server": 1},
        {"t": 3.0, "event": "server_fail", "server": 1},
        {"t": 3.0, "event": "guard", "task": 1, "proposed": None, "chosen": 0,
         "reason": "infeasible"},
        {"t": 3.0, "event": "start", "task": 1, "server": 0},
        {"t": 4.0, "event": "finish", "task": 1, "server": 0},
        {"t": 4.0, "event": "end", "truncated": False, "metrics": {}},
    ]


def test_lost_run_is_marked_once(tmp_path, capsys):
    trace = write(tmp_path / "lost.jsonl", lost_trace())
    sch = load_schedule(trace)
    assert [(r.task, r.server, r.outcome, r.end) for r in sch.runs] == [
        (0, 0, "done", 3.0), (1, 1, "lost", 3.0), (1, 0, "done", 4.0)]
    assert sch.servers[1].failed and sch.servers[1].gone == 3.0
    s = draw_gantt(sch, tmp_path / "lost.png")
    assert s["lost"] == 1 and s["bars"] == 3 and s["tasks"] == 2 and s["rows"] == 2
    assert s["workflows"] == 1 and s["waits"] == 0  # the rerun starts the moment it is lost
    assert s["guards"] == 1 and sch.guards == [(3.0, 0)]
    assert main(["gantt", str(trace), "--out", str(tmp_path / "x.png")]) == 0
    assert "1 lost runs" in capsys.readouterr().out
    # a window ending before the loss still shows (and counts) the lost run, cut at the window
    s = draw_gantt(load_schedule(trace), tmp_path / "early.png", t_to=2.0)
    assert s["bars"] == 2 and s["lost"] == 1


def test_waits_are_derived_from_arrival_and_parents(tmp_path):
    ev = lost_trace()[:4]
    ev[3] = {"t": 1.0, "event": "arrival", "workflow": 7, "tasks": [
        {"task": 0, "compute_gflop": 8.0, "memory_gb": 1.0, "output_gb": 0.1, "parents": []},
        {"task": 1, "compute_gflop": 4.0, "memory_gb": 1.0, "output_gb": 0.1, "parents": [0]}]}
    ev += [{"t": 1.5, "event": "start", "task": 0, "server": 0},  # waited 0.5 s
           {"t": 3.5, "event": "finish", "task": 0, "server": 0},
           {"t": 5.0, "event": "start", "task": 1, "server": 1},  # ready at 3.5, waited 1.5 s
           {"t": 9.0, "event": "finish", "task": 1, "server": 1}]
    sch = load_schedule(write(tmp_path / "w.jsonl", ev))  # no end event: still drawable
    assert [r.ready for r in sch.runs] == [1.0, 3.5]
    s = draw_gantt(sch, tmp_path / "w.png")
    assert s["waits"] == 2 and s["workflows"] == 1

    no_arrivals = [e for e in ev if e["event"] != "arrival"]
    sch = load_schedule(write(tmp_path / "n.jsonl", no_arrivals))
    assert not sch.has_arrivals and all(r.ready is None for r in sch.runs)
    s = draw_gantt(sch, tmp_path / "n.png")
    assert s["waits"] == 0 and not s["wait_info"] and s["workflows"] == 0


def test_live_trace_shape(tmp_path, capsys):
    """What LiveScheduler writes: time_scale/policy in the header, node ids, a lost run with a
    reason, output_lost and a rerun, finish with server -1, a task still running at the end."""
    node_a, node_b = "a" * 56, "b" * 56
    ev = [
        {"t": 0.0, "event": "episode", "bandwidth_gb_s": 10.0, "latency_s": 0.01,
         "transfer_delays_start": False, "time_scale": 0.05, "policy": "eft",
         "tiers": [{"name": "small", "compute": 1.0, "memory_gb": 8.0},
                   {"name": "large", "compute": 4.0, "memory_gb": 80.0}]},
        {"t": 0.01, "event": "server_add", "server": 0, "tier": "small", "compute": 1.0,
         "memory_gb": 8.0, "node": node_a, "slot": 0},
        {"t": 0.01, "event": "server_add", "server": 1, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0, "node": node_b, "slot": 0},
        {"t": 0.02, "event": "server_add", "server": 2, "tier": "large", "compute": 4.0,
         "memory_gb": 80.0, "node": node_b, "slot": 1},
        {"t": 0.5, "event": "arrival", "workflow": 0, "name": "agent", "tasks": [
            {"task": 0, "compute_gflop": 2.0, "memory_gb": 1.0, "output_gb": 0.0, "parents": []},
            {"task": 1, "compute_gflop": 2.0, "memory_gb": 1.0, "output_gb": 0.0, "parents": [0]},
            {"task": 2, "compute_gflop": 2.0, "memory_gb": 1.0, "output_gb": 0.0, "parents": []}]},
        {"t": 0.51, "event": "start", "task": 0, "server": 0, "node": node_a},
        {"t": 0.52, "event": "start", "task": 2, "server": 2, "node": node_b},
        {"t": 2.6, "event": "finish", "task": 0, "server": 0, "node": node_a},
        {"t": 2.61, "event": "start", "task": 1, "server": 1, "node": node_b},
        {"t": 2.9, "event": "lost", "task": 1, "server": 1, "node": node_b,
         "reason": "parent output lost"},
        {"t": 2.9, "event": "output_lost", "task": 0, "node": node_a},
        {"t": 2.95, "event": "server_fail", "server": 0, "node": node_a},
        {"t": 3.0, "event": "start", "task": 0, "server": 1, "node": node_b},
        {"t": 3.6, "event": "finish", "task": 0, "server": -1, "node": node_b, "rerun": True},
        {"t": 3.7, "event": "start", "task": 1, "server": 1, "node": node_b},
        {"t": 4.3, "event": "finish", "task": 1, "server": 1, "node": node_b},
        {"t": 5.0, "event": "end", "truncated": True, "metrics": {"policy": "eft", "lost": 1}},
    ]
    trace = write(tmp_path / "live.jsonl", ev)
    sch = load_schedule(trace)
    assert sch.live and sch.policy == "eft" and sch.t_end == 5.0
    assert [(r.task, r.server, r.outcome) for r in sch.runs] == [
        (0, 0, "done"), (2, 2, "open"), (1, 1, "lost"), (0, 1, "done"), (1, 1, "done")]
    assert sch.runs[3].ready == pytest.approx(2.9)  # rerun: ready when its output was lost
    assert sch.runs[4].ready == pytest.approx(3.6)  # after its parent's rerun finished
    s = draw_gantt(sch, tmp_path / "live.png")
    assert s["rows"] == 3 and s["bars"] == 5 and s["lost"] == 1 and s["open"] == 1
    assert s["tasks"] == 3 and s["workflows"] == 1
    # busy in [2.5, 4]: server 2 1.5 s (still running), server 1 1.19 s, server 0 0.1 s
    assert main(["gantt", str(trace), "--servers", "2", "--from", "2.5", "--to", "4"]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "2 of 3 servers" in line and "1 lost runs" in line
    assert "(4 runs, 1 workflows)" in line
    assert is_png(trace.with_suffix(".png"))


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ("hello world\n", "not JSONL"),
    ('[1, 2]\n', "not a trace event"),
    ('{"event": "start", "task": 0, "server": 0}\n', "numeric time"),
    ('{"t": 0, "event": "episode"}\n{"t": 0, "event": "end"}\n', "no 'start' events"),
    ('{"t": 0, "event": "finish", "task": 3, "server": 0}\n', "not running"),
    (b"\xff\xfe\x00binary", "not a text"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["gantt", str(path)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "\n" not in err and str(path) in err and problem in err, err
    assert "Traceback" not in cap.err and not path.with_suffix(".png").exists()


def test_bad_options_exit_2(tmp_path, capsys):
    trace = write(tmp_path / "lost.jsonl", lost_trace())
    assert main(["gantt", str(trace), "--from", "3", "--to", "2"]) == 2
    assert "empty time window" in capsys.readouterr().err
    assert main(["gantt", str(trace), "--servers", "0"]) == 2
    assert "--servers" in capsys.readouterr().err
    assert main(["gantt", str(tmp_path)]) == 2  # a directory
    assert "not a file" in capsys.readouterr().err
