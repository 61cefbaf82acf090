"""Gantt charts of episode traces (``envs/trace.py`` JSONL): simulator or live scheduler.

:func:`load_schedule` turns a trace into per-server runs; :func:`draw_gantt` draws them, one row
per server grouped by tier, bars coloured by workflow, and returns a summary dict.

What a trace says and what is derived:

* a **run** is a ``start`` closed by a ``finish`` (done), a ``lost`` (the server failed or its node
  vanished before the task finished) or nothing (still running at the ``end``);
* a trace has no wait events. A run's **ready time** is derived: the latest of its workflow's
  ``arrival``, its parents' latest ``finish`` before the start, and its own latest ``lost`` /
  ``output_lost`` before the start. The **wait** drawn is ready → start. A trace without
  ``arrival`` events has no wait information, and the legend says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNKNOWN_TIER = "(no tier)"


@dataclass
class Run:
    task: int
    server: int
    start: float
    end: float | None = None  # None: still running at the end of the trace
    outcome: str = "open"  # "done" | "lost" | "cancelled" (a hedged task's other run) | "open"
    ready: float | None = None  # derived (see the module doc); None without arrival events
    transfer_s: float = 0.0
    workflow: int | None = None


@dataclass
class Server:
    sid: int
    tier: str = UNKNOWN_TIER
    added: float = 0.0
    gone: float | None = None
    failed: bool = False
    drained: float | None = None


@dataclass
class Schedule:
    path: Path
    servers: dict[int, Server] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)  # header order, then unknown ones
    t_end: float = 0.0
    has_end: bool = False
    has_arrivals: bool = False
    policy: str | None = None
    live: bool = False  # from the live scheduler (its header carries time_scale)
    end_metrics: dict[str, Any] = field(default_factory=dict)
    guards: list[tuple[float, int | None]] = field(default_factory=list)  # (t, chosen server)


def _bad(path: Path, line: int | None, msg: str) -> ValueError:
    where = f"{path}:{line}" if line is not None else f"{path}"
    return ValueError(f"{where}: {msg}")


def as_num(ev: dict, key: str) -> float | None:
    v = ev.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def as_int(ev: dict, key: str) -> int | None:
    v = ev.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def start_run(running: dict[tuple[int, int], Any], ev: dict, tid: int, sid: int,
               where: str) -> None:
    """Check a ``start`` of task ``tid`` on server ``sid`` against the runs going on (keyed by
    (task, server)): only a hedged copy (``"hedge": true``) may start while its task runs."""
    if (tid, sid) in running or (not ev.get("hedge") and any(k[0] == tid for k in running)):
        raise ValueError(f"{where}: task {tid} started while already running")


def end_run(running: dict[tuple[int, int], Any], ev: dict, where: str) -> Any:
    """The run a ``finish``, ``lost`` or ``cancel`` event ends (its task on its server)."""
    tid, sid = as_int(ev, "task"), as_int(ev, "server")
    run = running.pop((tid, sid), None) if tid is not None else None
    if run is None and tid is not None:  # no server named (live: -1 when it is gone): the
        keys = [k for k in running if k[0] == tid]  # task's only run
        run = running.pop(keys[0]) if len(keys) == 1 else None
    if run is None:
        raise ValueError(f"{where}: {ev.get('event')} of task {ev.get('task')} that is not "
                         f"running")
    return run


OUTCOME = {"finish": "done", "lost": "lost", "cancel": "cancelled"}


def _events(path: Path) -> list[tuple[int, dict]]:
    """(line number, event) of the JSONL trace at ``path``; a ValueError naming the path (and
    line) for a missing or unreadable file or a line that is not a trace event."""
    if not path.exists():
        raise _bad(path, None, "no such file")
    if not path.is_file():
        raise _bad(path, None, "not a file")
    try:
        fh = path.open(encoding="utf-8")
    except OSError as e:
        raise _bad(path, None, f"cannot read ({e.strerror or e})") from None
    with fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError:
            raise _bad(path, None, "not a text (UTF-8) file, so not a JSONL trace") from None
    out = []
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(path, i, f"not JSONL (line is not valid JSON: {e.msg})") from None
        if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
            raise _bad(path, i, "not a trace event (a JSON object with an 'event' name)")
        if as_num(ev, "t") is None:
            raise _bad(path, i, f"{ev['event']} event without a numeric time 't'")
        out.append((i, ev))
    return out


class _Reader:
    """Builds a :class:`Schedule` event by event (:func:`load_schedule`)."""

    def __init__(self, path: Path):
        self.path, self.sch = path, Schedule(path)
        self.tasks_wf: dict[int, int] = {}
        self.parents: dict[int, list[int]] = {}
        self.arrival_t: dict[int, float] = {}
        self.finishes: dict[int, list[float]] = {}  # task -> finish times (re-runs: lost output)
        self.requeued: dict[int, float] = {}  # task -> latest lost / output_lost time
        self.running: dict[tuple[int, int], Run] = {}  # (task, server): a hedged task runs twice
        self.tier_seen: list[str] = []

    def tier(self, tier: str) -> None:
        if tier not in self.tier_seen:
            self.tier_seen.append(tier)

    def event(self, i: int, ev: dict) -> None:
        sch, kind, t = self.sch, ev["event"], float(ev["t"])
        sch.t_end = max(sch.t_end, t)
        if kind == "episode":
            names = [x.get("name") for x in ev.get("tiers") or [] if isinstance(x, dict)]
            sch.tiers = [str(n) for n in names if n is not None]
            sch.policy = ev.get("policy") if isinstance(ev.get("policy"), str) else None
            sch.live = "time_scale" in ev
        elif kind == "server_add":
            sid = as_int(ev, "server")
            if sid is None:
                raise _bad(self.path, i, "server_add without an integer 'server'")
            tier = str(ev.get("tier") or UNKNOWN_TIER)
            sch.servers[sid] = Server(sid, tier, t)
            self.tier(tier)
        elif kind in ("server_remove", "server_fail", "server_drain"):
            s = sch.servers.get(as_int(ev, "server"))  # type: ignore[arg-type]
            if s is not None:
                if kind == "server_drain":
                    s.drained = t
                else:
                    s.gone, s.failed = t, kind == "server_fail"
        elif kind == "arrival":
            self.arrival(i, ev, t)
        elif kind == "start":
            self.start(i, ev, t)
        elif kind in OUTCOME and "task" in ev:  # (a live trace's workflow cancel has none)
            run = end_run(self.running, ev, f"{self.path}:{i}")
            run.end, run.outcome = t, OUTCOME[kind]
            if kind == "finish":
                self.finishes.setdefault(run.task, []).append(t)
            elif kind == "lost":
                self.requeued[run.task] = t
        elif kind == "output_lost":
            tid = as_int(ev, "task")
            if tid is not None:
                self.requeued[tid] = t
        elif kind == "guard":  # policies.guard replaced a learned policy's pick
            sch.guards.append((t, as_int(ev, "chosen")))
        elif kind == "end":
            sch.has_end = True
            if isinstance(ev.get("metrics"), dict):
                sch.end_metrics = ev["metrics"]
        # other event kinds (future additions) are ignored

    def arrival(self, i: int, ev: dict, t: float) -> None:
        self.sch.has_arrivals = True
        wid = ev.get("workflow")
        for tk in ev.get("tasks") or []:
            tid = as_int(tk, "task") if isinstance(tk, dict) else None
            if tid is None:
                raise _bad(self.path, i, "arrival with a task lacking an integer 'task' id")
            self.tasks_wf[tid] = wid if isinstance(wid, int) else -1
            self.parents[tid] = [p for p in tk.get("parents") or [] if isinstance(p, int)]
            self.arrival_t[tid] = t

    def start(self, i: int, ev: dict, t: float) -> None:
        sch = self.sch
        tid, sid = as_int(ev, "task"), as_int(ev, "server")
        if tid is None or sid is None:
            raise _bad(self.path, i, "start event without integer 'task' and 'server'")
        start_run(self.running, ev, tid, sid, f"{self.path}:{i}")
        if sid not in sch.servers:  # tolerate a trace cut before its server_add
            sch.servers[sid] = Server(sid, UNKNOWN_TIER, t)
            self.tier(UNKNOWN_TIER)
        ready = None
        if sch.has_arrivals and tid in self.arrival_t:
            ready = max([self.arrival_t[tid], self.requeued.get(tid, -math.inf)]
                        + [max((f for f in self.finishes.get(p, []) if f <= t), default=-math.inf)
                           for p in self.parents.get(tid, [])])
        run = Run(tid, sid, t, ready=ready, transfer_s=as_num(ev, "transfer_s") or 0.0,
                  workflow=self.tasks_wf.get(tid))
        self.running[(tid, sid)] = run
        sch.runs.append(run)


def load_schedule(path: str | Path) -> Schedule:
    """Runs of every task on every server of the trace at ``path``.

    Raises ValueError (message starting with the path) for a missing or unreadable file, a line
    that is not a JSON event, a finish/lost of a task that is not running, or no ``start`` event.
    """
    path = Path(path)
    reader = _Reader(path)
    for i, ev in _events(path):
        reader.event(i, ev)
    sch = reader.sch
    if not sch.runs:
        raise _bad(path, None, "no 'start' events, nothing to draw (is this an episode trace?)")
    sch.tiers = ([x for x in sch.tiers if x in reader.tier_seen]
                 + [x for x in reader.tier_seen if x not in sch.tiers])
    return sch


def _decision_note(m: dict[str, Any]) -> str:
    """Whole-episode wait/invalid counts from the ``end`` metrics (the trace does not say when)."""
    dec = as_num(m, "decisions")
    if dec is None:
        return ""
    if as_num(m, "waits") is not None:  # live scheduler: the policy chose to wait
        return f"episode: {m['waits']:g} policy waits in {dec:g} decisions (times not traced)"
    if as_num(m, "invalid_rate") is not None:  # simulator: an invalid pick is a wait
        return (f"episode: {round(m['invalid_rate'] * dec)} waits (invalid picks) in {dec:g} "
                f"decisions (times not traced)")
    return ""


def _clip(a: float, b: float, lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(a, lo), min(b, hi)
    return (a, b) if b > a else None


def _rows(sch: Schedule, lo: float, hi: float, max_servers: int | None
          ) -> tuple[list[Server], list[Run], str]:
    """The servers drawn (by tier, then id; the ``max_servers`` busiest in the window when
    there are more), the runs on them in the window, and how the rows were picked."""
    def end_of(r: Run) -> float:
        return sch.t_end if r.end is None else r.end

    vis = [r for r in sch.runs if _clip(r.start, end_of(r), lo, hi) or
           (r.start == end_of(r) and lo <= r.start <= hi)]
    busy: dict[int, float] = {sid: 0.0 for sid in sch.servers}
    for r in vis:
        c = _clip(r.start, end_of(r), lo, hi)
        busy[r.server] += (c[1] - c[0]) if c else 0.0
    alive = [s for s in sch.servers.values() if s.added <= hi and (s.gone is None or s.gone >= lo)]
    chosen = alive
    selection = f"all {len(alive)} servers alive in the window"
    if max_servers is not None and len(alive) > max_servers:
        chosen = sorted(alive, key=lambda s: (-busy[s.sid], s.sid))[:max_servers]
        selection = f"the {max_servers} busiest of {len(alive)} servers (busy time in the window)"
    tier_rank = {name: k for k, name in enumerate(sch.tiers)}
    chosen = sorted(chosen, key=lambda s: (tier_rank.get(s.tier, len(tier_rank)), s.sid))
    rows = {s.sid for s in chosen}
    return chosen, [r for r in vis if r.server in rows], selection


def _tier_axis(ax: Any, chosen: list[Server], tcol: dict[str, Any], n: int) -> None:
    """Row labels coloured by tier, a separator between tiers and each tier's name on the right."""
    ax.set_yticks(range(len(chosen)))
    ax.set_yticklabels([f"s{s.sid}" for s in chosen], fontsize=7 if n > 24 else 8)
    for lab, s in zip(ax.get_yticklabels(), chosen):
        lab.set_color(tcol.get(s.tier, "black"))
        lab.set_fontweight("bold")
    start = 0
    for k in range(1, len(chosen) + 1):
        if k == len(chosen) or chosen[k].tier != chosen[start].tier:
            tier = chosen[start].tier
            if k < len(chosen):
                ax.axhline(k - 0.5, color="0.4", linewidth=0.8)
            ax.text(1.005, 1 - ((start + k) / 2) / n, tier, transform=ax.transAxes,
                    color=tcol.get(tier, "black"), fontsize=9, fontweight="bold", va="center",
                    ha="left", rotation=90 if k - start >= 3 else 0)
            start = k


def _draw_servers(ax: Any, chosen: list[Server], row_of: dict[int, int], lo: float,
                  hi: float) -> None:
    """Each server's lifetime in the window (faint background), its failure or removal."""
    for s in chosen:
        y = row_of[s.sid]
        span = _clip(s.added, hi if s.gone is None else s.gone, lo, hi)
        if span:
            ax.broken_barh([(span[0], span[1] - span[0])], (y - 0.45, 0.9), facecolors="#f2f2f2",
                           edgecolors="none", zorder=0)
        if s.gone is not None and lo <= s.gone <= hi:
            ax.plot([s.gone], [y], marker="X" if s.failed else "|", color="red" if s.failed
                    else "0.3", markersize=9, zorder=5)
        if s.drained is not None and lo <= s.drained <= hi:
            ax.plot([s.drained], [y], marker="|", color="0.3", markersize=9, zorder=5)


def _draw_runs(ax: Any, runs: list[Run], row_of: dict[int, int], t_end: float, lo: float,
               hi: float, wf_colors: Any) -> int:
    """A bar per run (coloured by workflow; lost, cancelled and open ones marked; the input
    transfer pale) and a line for its wait while ready; returns the waits drawn."""
    waits = 0
    for r in runs:
        y = row_of[r.server]
        e = t_end if r.end is None else r.end
        seg = _clip(r.start, e, lo, hi) or (r.start, r.start)
        wcol = wf_colors[(r.workflow or 0) % len(wf_colors)] if r.workflow is not None else "0.6"
        width = max(seg[1] - seg[0], 0.0)
        if r.outcome == "lost":
            ax.broken_barh([(seg[0], width)], (y - 0.35, 0.7), facecolors=wcol, edgecolors="red",
                           linewidth=1.4, hatch="////", zorder=3)
            if lo <= e <= hi:
                ax.plot([e], [y], marker="x", color="red", markersize=7, zorder=6)
        elif r.outcome == "cancelled":  # a hedged task's run that did not finish first
            ax.broken_barh([(seg[0], width)], (y - 0.35, 0.7), facecolors=wcol, alpha=0.45,
                           edgecolors="0.3", linewidth=0.6, hatch="....", zorder=3)
        else:
            ax.broken_barh([(seg[0], width)], (y - 0.35, 0.7), facecolors=wcol, edgecolors="0.15",
                           linestyle="-" if r.outcome == "done" else ":", linewidth=0.4,
                           zorder=3)
            if r.transfer_s > 0:  # input transfer at the start of the run
                tr = _clip(r.start, r.start + r.transfer_s, lo, hi)
                if tr:
                    ax.broken_barh([(tr[0], tr[1] - tr[0])], (y - 0.35, 0.7), facecolors="white",
                                   alpha=0.55, edgecolors="none", zorder=4)
        if r.ready is not None and r.start - r.ready > 1e-9:
            w = _clip(r.ready, r.start, lo, hi)
            if w:
                ax.plot(w, [y + 0.42, y + 0.42], color="black", linewidth=1.0, zorder=4,
                        solid_capstyle="butt")
                ax.plot([w[0]], [y + 0.42], marker="|", color="black", markersize=4, zorder=4)
                waits += 1
    return waits


def _draw_guards(ax: Any, sch: Schedule, row_of: dict[int, int], lo: float, hi: float
                 ) -> list[tuple[float, int]]:
    """A marker where the guard replaced the policy's pick (on the server it chose)."""
    guards = [(t, row_of[c]) for t, c in sch.guards if c in row_of and lo <= t <= hi]
    if guards:
        ax.plot([g[0] for g in guards], [g[1] - 0.42 for g in guards], linestyle="none",
                marker="v", color="darkorange", markeredgecolor="black", markeredgewidth=0.4,
                markersize=6, zorder=7)
    return guards


def _title(sch: Schedule) -> str:
    who = f"{sch.policy} (live)" if sch.live and sch.policy else ("live" if sch.live else "")
    return " ".join(x for x in (sch.path.name, who) if x)


def _legend(sch: Schedule, runs: list[Run], chosen: list[Server], n_guards: int,
            wf_colors: Any) -> tuple[list[Any], dict[str, int]]:
    """The legend's entries (only for what the chart shows) and the counts they name."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    count = {k: sum(r.outcome == k for r in runs) for k in ("lost", "open", "cancelled")}
    count["workflows"] = len({r.workflow for r in runs if r.workflow is not None})
    handles = [Patch(facecolor=wf_colors[0], edgecolor="0.15", linewidth=0.4,
                     label=f"task run (colour = workflow, {count['workflows']} shown)"),
               Patch(facecolor="white", edgecolor="red", hatch="////",
                     label=f"lost run: its server failed first; ends at the loss ({count['lost']})")]
    if any(r.transfer_s > 0 for r in runs):
        handles.append(Patch(facecolor="0.85", label="input transfer (pale start of a run)"))
    if count["cancelled"]:
        handles.append(Patch(facecolor=wf_colors[0], alpha=0.45, edgecolor="0.3", hatch="....",
                             label=f"cancelled: the task's other run finished first "
                                   f"({count['cancelled']})"))
    if count["open"]:
        handles.append(Patch(facecolor="0.8", edgecolor="0.15", linestyle=":",
                             label=f"still running at the end ({count['open']})"))
    if sch.has_arrivals:
        handles.append(Line2D([], [], color="black", linewidth=1.0,
                              label="wait: ready (derived) to start, under the bar"))
    else:
        handles.append(Line2D([], [], color="none", label="no wait information in this trace "
                                                          "(no arrival events)"))
    if n_guards:
        handles.append(Line2D([], [], linestyle="none", marker="v", color="darkorange",
                              markeredgecolor="black", markeredgewidth=0.4,
                              label=f"guard replaced the policy's pick, on the server it chose "
                                    f"({n_guards})"))
    note = _decision_note(sch.end_metrics)
    if note:
        handles.append(Line2D([], [], color="none", label=note))
    if any(s.gone is not None and s.failed for s in chosen):
        handles.append(Line2D([], [], color="red", marker="X", linestyle="none",
                              label="server failed"))
    return handles, count


def draw_gantt(sch: Schedule, out: str | Path, t_from: float | None = None,
               t_to: float | None = None, max_servers: int | None = None,
               title: str | None = None) -> dict[str, Any]:
    """Draw ``sch`` to the PNG ``out``; return a summary dict.

    Summary keys: ``rows`` (server rows drawn), ``servers_total``, ``bars`` (runs drawn, lost and
    unfinished ones included), ``tasks`` (distinct tasks drawn), ``lost`` (lost runs drawn),
    ``open`` (runs still running at the end), ``cancelled`` (hedged tasks' runs that lost),
    ``workflows`` (distinct workflows drawn), ``waits`` (wait lines drawn), ``wait_info``
    (whether the trace has it), ``guards`` (guard overrides marked), ``from``/``to`` (the
    window), ``selection`` (how rows were picked), ``out``.
    """
    lo = 0.0 if t_from is None else float(t_from)
    hi = sch.t_end if t_to is None else float(t_to)
    if not hi > lo:
        raise ValueError(f"empty time window: --from {lo:g} --to {hi:g} (the trace ends at "
                         f"{sch.t_end:g} s)")
    if max_servers is not None and max_servers < 1:
        raise ValueError(f"--servers: {max_servers} must be >= 1")
    chosen, runs, selection = _rows(sch, lo, hi, max_servers)
    row_of = {s.sid: k for k, s in enumerate(chosen)}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wf_colors = plt.get_cmap("tab20").colors
    tier_colors = plt.get_cmap("Dark2").colors
    tcol = {name: tier_colors[k % len(tier_colors)] for k, name in enumerate(sch.tiers)}
    n = max(1, len(chosen))
    fig_h = min(60.0, 2.4 + 0.32 * n)
    fig, ax = plt.subplots(figsize=(13, fig_h))
    _draw_servers(ax, chosen, row_of, lo, hi)
    waits = _draw_runs(ax, runs, row_of, sch.t_end, lo, hi, wf_colors)
    guards = _draw_guards(ax, sch, row_of, lo, hi)
    ax.set_xlim(lo, hi)
    ax.set_ylim(n - 0.5, -0.5)
    _tier_axis(ax, chosen, tcol, n)
    ax.set_xlabel("model time (s)" if sch.live else "simulated time (s)")
    ax.set_ylabel("server (label colour = tier)")
    handles, count = _legend(sch, runs, chosen, len(guards), wf_colors)
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    title = _title(sch) if title is None else title
    n_tasks = len({r.task for r in runs})
    ax.set_title(f"{title}\n{selection}; {n_tasks} tasks, {lo:.1f}–{hi:.1f} s", fontsize=10)
    fig.tight_layout(rect=(0, 0.6 / fig_h, 1, 1))  # room for the legend below
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise ValueError(f"{out}: cannot write the chart ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return {"out": str(out), "rows": len(chosen), "servers_total": len(sch.servers),
            "bars": len(runs), "tasks": n_tasks, "lost": count["lost"], "open": count["open"],
            "cancelled": count["cancelled"], "workflows": count["workflows"], "waits": waits,
            "guards": len(guards), "wait_info": sch.has_arrivals, "from": lo, "to": hi,
            "selection": selection}
