"""Where the lookahead planner waits, live and in its twin (a measurement script for
results/live_twin/README.md): records every answer of the planner during one `scale-ray bench
live` run (its arguments after OUT.json), then compares the waits with the run's traces.

    python results/live_twin/scripts/probe_waits.py OUT.json --setting realistic \
        --skip-overhead --servers 16 --servers-per-node 4 --workflows 360 --seed 0 --trace-dir DIR
    python results/live_twin/scripts/probe_waits.py --analyze OUT.json DIR
    python results/live_twin/scripts/probe_waits.py --overruns DIR POLICY [POLICY ...]

``--overruns`` needs only the traces of any `bench live --trace-dir DIR` run: how much longer
each live run took than its nominal time (the first run on each server apart), and live minus
twin workflow response by arrival time. An answer is a wait when it names a busy server; "told" is the remaining time the planner was
given for that server, "freed" when the trace says it finished its task (the live times are
aligned to the trace by the answers that started a task at once).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import statistics as st
import sys
import threading

from policies import lookahead as la
from scale_ray.bench import live as bench_live
from scale_ray.live import planning


def main(argv: list[str]) -> int:
    """``scale-ray bench live`` with ``argv`` (its arguments)."""
    p = argparse.ArgumentParser(prog="probe_waits OUT.json")
    bench_live.add_arguments(p)
    return int(bench_live.run(p.parse_args(argv)) or 0)


def record(out: str, argv: list[str]) -> int:
    log: dict[str, list] = {"live": [], "twin": []}
    tls = threading.local()
    ask0, act0 = planning.LivePlanner.ask, la.Lookahead.decide

    def ask(self, t, placement, now):
        tls.live, reused = True, self.reused
        try:
            choice = ask0(self, t, placement, now)
        finally:
            tls.live = False
        s = placement.alive[choice]
        busy = bool(s.running)
        log["live"].append({"now": now / self._ts, "task": t.gid, "server": s.sid, "busy": busy,
                            "told": (s.busy_until - now) / self._ts if busy else 0.0,
                            "reused": self.reused > reused})
        return choice

    def decide(self, sim):
        slot = act0(self, sim)
        if not getattr(tls, "live", False) and not self.config.snapshot:
            busy = sim.is_busy(slot)
            log["twin"].append({"now": sim.t, "task": sim.current.id,
                                "server": sim.server_ids[slot], "busy": busy,
                                "told": sim.busy_until[slot] - sim.t if busy else 0.0})
        return slot

    planning.LivePlanner.ask, la.Lookahead.decide = ask, decide
    try:
        return main(argv)
    finally:
        with open(out, "w") as f:
            json.dump(log, f)


def _q(xs: list[float], q: float) -> float:
    return sorted(xs)[min(int(q * len(xs)), len(xs) - 1)]


def analyze(path: str, trace_dir: str) -> None:
    probe = json.load(open(path))
    for side in ("twin", "live"):
        starts, fins, tier = {}, collections.defaultdict(list), {}
        for line in open(f"{trace_dir}/{side}_lookahead.jsonl"):
            d = json.loads(line)
            ev = d.get("event")
            if ev == "server_add":
                tier[d["server"]] = d["tier"]
            elif ev == "start" and not d.get("hedge"):
                starts.setdefault(d["task"], (d["server"], d["t"]))
            elif ev == "finish":
                fins[d["server"]].append(d["t"])
        for v in fins.values():
            v.sort()
        rec = probe[side]
        off = st.median(r["now"] - starts[r["task"]][1] for r in rec if not r["busy"]
                        and starts.get(r["task"], (None,))[0] == r["server"])
        late, overdue = [], []
        for r in rec:
            if r["busy"] and not r.get("reused"):
                t = r["now"] - off
                f = fins[r["server"]]
                i = bisect.bisect_left(f, t - 1e-9)
                if i < len(f):
                    late.append(f[i] - t - max(r["told"], 1e-3))
                    if r["told"] <= 2e-3:
                        overdue.append(f[i] - t)
        by_task = collections.defaultdict(list)
        for r in rec:
            by_task[r["task"]].append(r)
        waited = [(k, [r for r in v if r["busy"]][-1]) for k, v in by_task.items()
                  if any(r["busy"] for r in v) and k in starts]
        kept = sum(starts[k][0] == w["server"] for k, w in waited)
        final = collections.Counter(tier[starts[k][0]] for k, _ in waited)
        every = collections.Counter(tier[s] for s, _ in starts.values())
        print(f"{side}: {len(rec)} answers, {sum(r['busy'] for r in rec)} waits "
              f"({len(late)} planned); {len(waited)} tasks waited, {kept} "
              f"({kept / max(len(waited), 1):.0%}) started on the server they last waited for; "
              f"where the waiters started {dict(final)}; every start {dict(every)}")
        print(f"  a waited-for server freed later than told by median {st.median(late):+.4f}, "
              f"p90 {_q(late, 0.9):+.4f}, max {max(late):+.4f} model s; {len(overdue)} waits on an "
              f"overdue server, freed after {st.mean(overdue) if overdue else 0:.3f} s on average")


def _runs(path: str) -> tuple[list[tuple[float, float, int]], dict[int, tuple[float, float]]]:
    """(start - first arrival, overrun, server) per run, and workflow -> (arrival, response)."""
    comp, gflop, start, fin, arr, wf_of, last = {}, {}, {}, {}, {}, {}, {}
    first = None
    for line in open(path):
        d = json.loads(line)
        ev = d.get("event")
        if ev == "server_add":
            comp[d["server"]] = d["compute"]
        elif ev == "arrival":
            first = d["t"] if first is None else first
            arr[d["workflow"]] = d["t"] - first
            for t in d["tasks"]:
                gflop[t["task"]], wf_of[t["task"]] = t["compute_gflop"], d["workflow"]
        elif ev == "start" and not d.get("hedge"):
            start.setdefault(d["task"], (d["t"], d["server"], d.get("transfer_s", 0.0)))
        elif ev == "finish":
            fin[d["task"]] = d["t"]
            w = wf_of[d["task"]]
            last[w] = max(last.get(w, 0.0), d["t"] - first)
    rows = sorted((t0 - first, fin[k] - t0 - gflop[k] / comp[s] - tr, s)
                  for k, (t0, s, tr) in start.items() if k in fin)
    return rows, {w: (arr[w], last[w] - arr[w]) for w in arr if w in last}


def overruns(trace_dir: str, policies: list[str]) -> None:
    for pol in policies:
        rows, live = _runs(f"{trace_dir}/live_{pol}.jsonl")
        _, twin = _runs(f"{trace_dir}/twin_{pol}.jsonl")
        seen: set[int] = set()
        firsts, rest = [], []
        for _, o, s in rows:
            (rest if s in seen else firsts).append(o)
            seen.add(s)
        gap = {w: live[w][1] - twin[w][1] for w in twin if w in live}
        early = [g for w, g in gap.items() if twin[w][0] < 20.0]
        print(f"{pol}: first run on each server +{st.mean(firsts):.3f} model s (max "
              f"{max(firsts):.3f}); other runs +{st.mean(rest):.4f} (median {st.median(rest):.4f}, "
              f"p99 {_q(rest, 0.99):.3f}, max {max(rest):.3f}); live - twin workflow response "
              f"{st.mean(gap.values()):+.3f}, arrivals before 20 model s ({len(early)}) "
              f"{st.mean(early):+.3f}, later {st.mean([g for w, g in gap.items() if twin[w][0] >= 20.0]):+.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    if sys.argv[1] == "--analyze":
        analyze(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--overruns":
        overruns(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(record(sys.argv[1], sys.argv[2:]))
