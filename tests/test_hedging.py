"""Backup copies of stragglers in the simulator (issue 31, envs/hedging.py): the first run wins,
the other is cancelled, the trace replays, unmarked tasks are never copied, a failure under one
run loses that run only, and a fork hedges on its own."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from envs.decision import DONE, RUNNING
from envs.hedging import Hedges
from envs.demands import Request
from envs.encoding import ServerView, slot_table
from envs.trace import verify_trace
from envs.simulator import Simulator
from policies import get_policy
from scale_ray.config import load_env


def _episode(sets, seed=2, horizon=60.0):
    env = load_env("configs/env/realistic.yaml", ["cluster.servers=16",
                                                  f"workload.horizon_s={horizon}", *sets])
    events = []
    sim = Simulator(env, trace=events.append)
    sim.reset(seed)
    eft = get_policy("eft", env)
    while sim.current is not None:
        sim.step(eft.decide(sim))
    return sim, events


def test_hedged_copies_race_and_the_trace_replays():
    sim, events = _episode(["runtime.noise_sigma=1.0", "runtime.hedge=all"])
    m = sim.metrics()
    assert m["hedge_copies"] > 5 and 0 < m["hedge_wins"] <= m["hedge_copies"]
    assert m["hedge_waste_server_s"] > 0 and m["hedge_copy_server_s"] > 0
    verify_trace(json.loads(json.dumps(e)) for e in events)  # one finish per task, no overlap
    copies = [e for e in events if e.get("hedge")]
    cancels = [e for e in events if e["event"] == "cancel"]
    assert len(copies) == m["hedge_copies"] and len(cancels) == len(copies)
    finish = {e["task"]: e["t"] for e in events if e["event"] == "finish"}
    assert all(c["t"] == finish[c["task"]] for c in cancels)  # cancelled when the other won


def test_unmarked_tasks_are_never_copied():
    sim, events = _episode(["runtime.noise_sigma=1.0", "runtime.hedge=marked"])
    assert sim.metrics()["hedge_copies"] == 0 and not any(e.get("hedge") for e in events)
    sim, events = _episode(["runtime.noise_sigma=1.0"])
    assert "hedge_copies" not in sim.metrics()


def test_a_failure_under_one_run_loses_that_run_only():
    sim, events = _episode(["runtime.noise_sigma=1.0", "runtime.hedge=all",
                            "runtime.hedge_quantile=0.6", "dynamics.fail_rate_per_server_s=0.01",
                            "dynamics.rejoin_after_s=5"], horizon=120.0)
    verify_trace(json.loads(json.dumps(e)) for e in events)
    lost_copies = [e for e in events if e["event"] == "cancel" and e.get("reason") == "server_fail"]
    # seed 2 has both: runs of unhedged tasks lost (placed again) and one of two runs lost
    assert sim.cluster.lost > 0 and lost_copies


def test_a_fork_hedges_on_its_own():
    env = load_env("configs/env/realistic.yaml", ["cluster.servers=16", "runtime.noise_sigma=1.0",
                                                  "runtime.hedge=all"])
    sim = Simulator(env)
    sim.reset(4)
    eft = get_policy("eft", env)
    while sim.current is not None and not sim.hedges.stragglers and sim.decisions < 3000:
        sim.step(eft.decide(sim))
        if sim.hedges.stats[0] > 3:
            break
    before = list(sim.hedges.stats)
    f = sim.fork()
    for _ in range(200):
        if f.current is None:
            break
        f.step(eft.decide(f))
    assert sim.hedges.stats == before  # the fork's copies never count in the original
    assert f.hedges.stragglers is not sim.hedges.stragglers and f.hedges.stats is not sim.hedges.stats
    assert all(tk.copy_slot < 0 or tk in sim.table.running[tk.copy_slot]
               for tk in sim.tasks if tk.state == 1)  # the original's copies run where it says


def test_marked_tasks_from_a_dag_file_are_the_only_ones_copied(tmp_path):
    import yaml

    doc = {"workflows": [{"name": "w", "tasks": [
        {"name": "slow_llm", "compute_gflop": 8, "kind": "llm", "hedge": True},
        {"name": "tool", "compute_gflop": 8, "parents": ["slow_llm"]}]}]}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = load_env("configs/env/realistic.yaml", [
        "cluster.servers=8", "workload.source=dags", f"workload.dags=[{path}]",
        "workload.arrival_rate_16=0.5", "workload.horizon_s=200", "runtime.noise_sigma=1.5",
        "runtime.hedge=marked", "runtime.hedge_quantile=0.6"])
    events = []
    sim = Simulator(env, trace=events.append)
    sim.reset(1)
    eft = get_policy("eft", env)
    while sim.current is not None:
        sim.step(eft.decide(sim))
    kinds = {t.id: (t.kind, t.hedgeable) for t in sim.tasks}
    copied = {e["task"] for e in events if e.get("hedge")}
    assert copied and all(kinds[t] == ("llm", True) for t in copied)
    assert {k for k, h in kinds.values() if not h} == {"tool"}
    verify_trace(json.loads(json.dumps(e)) for e in events)


def test_bench_runtime_runs_end_to_end(tmp_path, capsys):
    import argparse

    from scale_ray.bench import runtime as bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--parts", "noise", "hedge", "--servers", "8", "--episodes", "2",
                         "--quantiles", "0.9", "--set", "workload.horizon_s=30",
                         "--json", str(tmp_path / "r.json")])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "eft|sigma1.0" in out and "hedge q=0.9" in out and "server-seconds" in out
    data = json.loads((tmp_path / "r.json").read_text())
    hedged = [r for r in data["parts"]["hedge"] if "hedge" in r["setting"]]
    assert hedged and "extra_server_s_frac" in hedged[0] and hedged[0]["paired"]["workflow"]
    assert hedged[0]["hedge_copies"] > 0  # the hedged setting did start copies
    plain = next(r for r in data["parts"]["hedge"] if "hedge" not in r["setting"])
    assert hedged[0]["extra_server_s_frac"] == pytest.approx(  # the same episodes, paired
        hedged[0]["busy_server_s"] / plain["busy_server_s"] - 1)


def test_gantt_and_explain_read_a_hedged_trace(tmp_path):
    """Both runs of a hedged task are drawn (the loser as cancelled) and explained: the finishing
    run is on the critical path, and every workflow is explained."""
    from scale_ray.explain import explain
    from scale_ray.gantt import draw_gantt, load_schedule

    sim, events = _episode(["runtime.noise_sigma=1.0", "runtime.hedge=all"], horizon=30.0)
    path = tmp_path / "hedged.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    sch = load_schedule(path)
    m = sim.metrics()
    assert sum(r.outcome == "cancelled" for r in sch.runs) == m["hedge_copies"]
    assert sum(r.outcome == "done" for r in sch.runs) == sum(e["event"] == "finish" for e in events)
    out = draw_gantt(sch, tmp_path / "g.png")
    assert out["cancelled"] == m["hedge_copies"] and (tmp_path / "g.png").stat().st_size > 0
    ex = explain(path)
    assert ex["totals"]["workflows"] == m["completed_workflows"]
    assert ex["totals"]["max_sum_error_s"] < 1e-6  # the parts still add up to each response
    # a second start of a running task that is not a hedged copy is still an error
    running = next(e for e in events if e["event"] == "start")
    path.write_text("".join(json.dumps(e) + "\n" for e in events[:events.index(running) + 1]
                            + [dict(running, server=running["server"] + 1)]))
    with pytest.raises(ValueError, match="started while already running"):
        load_schedule(path)


def test_the_hedges_part_copies_stragglers_in_order_on_the_fastest_idle_fitting_server():
    """``Hedges.launch`` on a hand-built table: each straggler still running, in the order seen,
    gets the fastest accepting other server where it fits now (busy for the next one); one that
    fits no idle server waits; finished, restarted or copied ones are dropped."""
    table = slot_table([ServerView(4.0, 16.0), ServerView(2.0, 64.0),
                        ServerView(8.0, 64.0, remaining_s=5.0), ServerView(9.0, 64.0,
                                                                           accepting=False)])
    h = Hedges(rt=None)

    class Run(NS):
        __hash__ = object.__hash__  # a run is keyed by identity in the table

    def task(mem, state=RUNNING, token=1, copy_slot=-1):
        return Run(memory_gb=mem, state=state, token=token, copy_slot=copy_slot, slot=-1,
                   demands=Request(memory_gb=mem).on_slot())

    small, big, bigger, done, old, copied = (task(8.0), task(32.0), task(32.0),
                                             task(8.0, DONE), task(8.0), task(8.0, copy_slot=0))
    for t in (done, small, old, big, copied, bigger):
        h.seen(1, t)
    ids = [id(t) for _, t in h.stragglers]
    assert ids == [id(small), id(old), id(big), id(bigger)]  # DONE, already copied: not seen
    old.token = 2  # lost and started again since: that run is not the straggler
    started = []

    def start_copy(t, slot):
        started.append((t, slot))
        table.start(slot, t, t.demands, 10.0)

    h.launch(table, start_copy)
    # slot 2 (speed 8) is busy and slot 3 (speed 9) not accepting: small takes slot 0 (4 >
    # 2), old is a later run (token 2), big takes slot 1, bigger fits no idle server now
    assert [(id(t), slot) for t, slot in started] == [(id(small), 0), (id(big), 1)]
    assert [(tok, id(t)) for tok, t in h.stragglers] == [(1, id(bigger))] and h.stats[0] == 2
    h.settled(True, 1.5, 2.5)
    h.lost(0.5)
    assert h.metrics() == {"hedge_copies": 2, "hedge_wins": 1, "hedge_copy_server_s": 1.5,
                           "hedge_waste_server_s": 3.0}
    c = h.copy(lambda t: ("copy", t), rt=None)
    assert [(tok, x[0], id(x[1])) for tok, x in c.stragglers] == [(1, "copy", id(bigger))]
    assert c.stats == h.stats
    c.stats[0] += 1
    assert h.stats[0] == 2
