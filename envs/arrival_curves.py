"""Time-varying arrival rates (``workload.curve``, docs/simulator.md "Time-varying arrivals").

:class:`ArrivalCurveConfig` is the config section: ``kind`` none (the default: the constant rate
of ``workload.arrival_rate_16`` / ``gpu_load`` with ``rate_schedule``, unchanged), ``diurnal`` (a
sinusoid around the configured rate, plus random bursts) or ``trace`` (per-minute counts from a
``minute,count`` CSV file, the shape of the public Azure Functions invocation traces).

:class:`ArrivalRate` is the rate of one episode as a pure object: :meth:`~ArrivalRate.rate` and
:meth:`~ArrivalRate.multiplier` at a time, :meth:`~ArrivalRate.expected_arrivals` in ``[t0, t1)``
(closed form), and the exact non-homogeneous Poisson arrival times
(:meth:`~ArrivalRate.arrival_times`, and :class:`CurveArrivalProcess` for the simulator): unit
exponential gaps mapped through the inverse of the cumulative rate (``t = Λ⁻¹(Λ(t_prev) + E)``),
vectorised (numpy, a bisect per batch, safeguarded Newton on the sinusoid's closed-form
integral), so no approximation by time steps.

The rate is ``f(t) · g(t)`` on ``[0, horizon_s)`` and 0 after: ``f`` is piecewise constant (the
base rate or a trace minute's count / 60 × scale, × the ``rate_schedule`` multiplier, × the
``burst_factor`` inside a burst) and ``g(t) = 1 + amplitude · cos(2π (t − peak_s) / period_s)``
(1 unless diurnal).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from .config_base import ConfigError, rng

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ArrivalCurveConfig:
    """``workload.curve``: how the arrival rate varies in time (docs/simulator.md)."""
    kind: Literal["none", "diurnal", "trace"] = field(default="none", metadata=rng(
        doc="none: the constant configured rate (with rate_schedule), as before; diurnal: that "
            "rate x 1 + amplitude cos(2 pi (t - peak_s) / period_s), plus bursts; trace: the "
            "per-minute counts of the CSV file at path"))
    period_s: float = field(default=86400.0, metadata=rng(
        gt=0, le=1e9, doc="diurnal: the period of the sinusoid, s (a day)"))
    peak_s: float = field(default=50400.0, metadata=rng(
        ge=0, doc="diurnal: when the rate peaks, s after t = 0 (the episode's start is a period's "
                  "start; modulo period_s; default 14:00 of a day)"))
    amplitude: float = field(default=0.5, metadata=rng(
        ge=0, lt=1, doc="diurnal: the sinusoid's relative amplitude: the rate swings between "
                        "(1 - a) and (1 + a) x the configured rate, whose mean over a period it "
                        "keeps"))
    bursts_per_hour: float = field(default=0.0, metadata=rng(
        ge=0, le=3600, doc="diurnal or trace: bursts start as a Poisson process of this rate in "
                           "[0, horizon_s), drawn from the episode's seed"))
    burst_factor: float = field(default=3.0, metadata=rng(
        gt=0, le=1e4, doc="inside a burst the rate is multiplied by this (overlapping bursts do "
                          "not compound; < 1: dips)"))
    burst_s: float = field(default=300.0, metadata=rng(gt=0, le=1e7, doc="a burst's length, s"))
    path: str | None = field(default=None, metadata=rng(
        doc="trace: a CSV file of minute,count rows (header optional, # comments), consecutive "
            "minutes; as given, else relative to the repository"))
    scale: float = field(default=1.0, metadata=rng(
        gt=0, le=1e6, doc="trace: the rate in the file's minute k is count_k / 60 x scale per s"))
    repeat: bool = field(default=False, metadata=rng(
        doc="trace: after the last minute the file starts over; false: workload.horizon_s must "
            "not pass the file's end"))

    def __post_init__(self) -> None:
        if self.kind == "none" and self.bursts_per_hour > 0:
            raise ConfigError("workload.curve.bursts_per_hour: bursts need kind diurnal or trace")
        if self.kind != "trace" and self.path is not None:
            raise ConfigError(f"workload.curve.path: only for kind trace (kind is {self.kind!r})")
        if self.kind == "trace":
            if self.path is None:
                raise ConfigError("workload.curve.path: required for kind trace (a minute,count "
                                  "CSV file)")
            load_counts(self.path)  # every error names the file, the line and the field

    @property
    def active(self) -> bool:
        """Whether the rate varies (kind is not none)."""
        return self.kind != "none"

    def trace_s(self) -> float:
        """kind trace: the seconds the file covers (60 per minute)."""
        return 60.0 * len(load_counts(self.path))


def resolve_path(path: str) -> Path:
    """``path`` as given if it exists (or is absolute), else relative to the repository."""
    p = Path(path)
    if p.is_file() or p.is_absolute():
        return p
    alt = REPO_ROOT / p
    return alt if alt.is_file() else p


def load_counts(path: str) -> np.ndarray:
    """The per-minute counts of a ``minute,count`` CSV file (read-only float array, one per
    minute from the first row's minute on). Refused with a :class:`ConfigError` naming the file,
    the line and the field: a missing file, a row that is not two numbers, a minute that does not
    follow the previous one (a gap, a repeat, out of order), a negative or non-finite count, no
    rows, or only zero counts."""
    p = resolve_path(path)
    try:
        st = p.stat()
    except OSError:
        raise ConfigError(f"workload.curve.path: {path}: no such file") from None
    return _load_counts(str(p.resolve()), path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _load_counts(real: str, shown: str, _mtime: int, _size: int) -> np.ndarray:
    where = f"workload.curve.path: {shown}"
    counts: list[float] = []
    prev: int | None = None
    try:
        with open(real, newline="", encoding="utf-8") as fh:
            for lineno, row in enumerate(csv.reader(fh), start=1):
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                cells = [c.strip() for c in row]
                if prev is None and not counts and [c.lower() for c in cells] == ["minute", "count"]:
                    continue  # the optional header
                if len(cells) != 2:
                    raise ConfigError(f"{where} line {lineno}: expected 2 fields minute,count, "
                                      f"got {len(cells)}")
                try:
                    minute = int(cells[0])
                except ValueError:
                    raise ConfigError(f"{where} line {lineno}: field minute: {cells[0]!r} is not "
                                      f"an integer") from None
                try:
                    count = float(cells[1])
                except ValueError:
                    raise ConfigError(f"{where} line {lineno}: field count: {cells[1]!r} is not "
                                      f"a number") from None
                if not math.isfinite(count) or count < 0:
                    raise ConfigError(f"{where} line {lineno}: field count: {cells[1]} is out of "
                                      f"range; allowed: a finite number >= 0")
                if prev is not None and minute != prev + 1:
                    raise ConfigError(f"{where} line {lineno}: field minute: {minute} follows "
                                      f"{prev}; minutes must be consecutive (no gap, repeat or "
                                      f"reordering)")
                prev = minute
                counts.append(count)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not a UTF-8 text file ({e.reason})") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None
    if not counts:
        raise ConfigError(f"{where}: no minute,count rows")
    out = np.asarray(counts, dtype=float)
    if not out.any():
        raise ConfigError(f"{where}: every count is 0 (no arrivals)")
    out.setflags(write=False)
    return out


def burst_windows(bursts_per_hour: float, burst_s: float, horizon_s: float,
                  rng_bursts: np.random.Generator) -> np.ndarray:
    """Merged ``(start, end)`` windows (shape (k, 2)) of Poisson burst starts in
    ``[0, horizon_s)`` at ``bursts_per_hour``, each ``burst_s`` long (overlaps merged)."""
    lam = bursts_per_hour / 3600.0 * horizon_s
    n = int(rng_bursts.poisson(lam)) if lam > 0 else 0
    if n == 0:
        return np.zeros((0, 2))
    starts = np.sort(rng_bursts.uniform(0.0, horizon_s, n))
    ends = starts + burst_s
    # merge: a window starts where no earlier window is still open
    run_end = np.maximum.accumulate(ends)
    new = np.ones(n, dtype=bool)
    new[1:] = starts[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1)
    return np.column_stack([starts[first], run_end[last]])


def burst_seed(rng_arrivals: np.random.Generator) -> np.random.SeedSequence | int:
    """The seed of an episode's bursts, derived from its arrival generator's seed without
    drawing from it (a child of that seed sequence no other part spawns)."""
    ss = getattr(rng_arrivals.bit_generator, "seed_seq", None)
    if isinstance(ss, np.random.SeedSequence):
        return np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 0x0C0C),
                                      pool_size=ss.pool_size)
    return int(rng_arrivals.integers(2**63))  # a generator from a bare state: draw the seed


class ArrivalRate:
    """The arrival rate of one episode, requests (workflows) per second, as a pure function of
    time: ``base_rate × multiplier(t)`` on ``[0, horizon_s)``, 0 after.

    ``base_rate``: the configured rate (kinds none and diurnal) or the trace's mean,
    ``scale × mean(count) / 60`` (kind trace, whose counts set the rate: the configured rate does
    not apply). ``schedule``: ``workload.rate_schedule`` (``(t_s, multiplier)``, multiplying from
    ``t_s`` on). ``seed`` draws the bursts; None: no drawn bursts, their long-run mean factor
    ``1 + (burst_factor − 1)(1 − exp(−bursts_per_hour · burst_s / 3600))`` everywhere instead (a
    planner's expectation)."""

    def __init__(self, base_rate: float, horizon_s: float,
                 curve: ArrivalCurveConfig | None = None,
                 schedule: Sequence[tuple[float, float]] = (),
                 seed: np.random.SeedSequence | int | None = None) -> None:
        curve = curve if curve is not None else ArrivalCurveConfig()
        if not horizon_s > 0:
            raise ValueError("ArrivalRate: horizon_s must be > 0")
        self.curve = curve
        self.horizon_s = float(horizon_s)
        cuts = [0.0, self.horizon_s]
        counts = None
        if curve.kind == "trace":
            counts = load_counts(curve.path) * (curve.scale / 60.0)
            base_rate = float(counts.mean())
            n_min = len(counts) if not curve.repeat else math.ceil(self.horizon_s / 60.0)
            cuts.extend(60.0 * np.arange(1, n_min + 1))
        if not base_rate > 0:
            raise ValueError("ArrivalRate: base_rate must be > 0")
        self.base_rate = float(base_rate)
        if curve.kind == "diurnal" and curve.amplitude > 0:
            # a grid of 256 cuts a period (at most 200,000 in all): within a cut G is nearly
            # linear, so the inverse's Newton starts close and converges in a few steps
            step = max(curve.period_s / 256.0, self.horizon_s / 200_000.0)
            cuts.extend(step * np.arange(1, math.ceil(self.horizon_s / step)))
        sched_t = np.array([t for t, _ in schedule], dtype=float)
        sched_m = np.array([m for _, m in schedule], dtype=float)
        cuts.extend(sched_t)
        burst_mean = 1.0
        windows = np.zeros((0, 2))
        if curve.active and curve.bursts_per_hour > 0:
            if seed is None:
                p = 1.0 - math.exp(-curve.bursts_per_hour * curve.burst_s / 3600.0)
                burst_mean = 1.0 + (curve.burst_factor - 1.0) * p
            else:
                windows = burst_windows(curve.bursts_per_hour, curve.burst_s, self.horizon_s,
                                        np.random.default_rng(seed))
                cuts.extend(windows.ravel())
        #: the merged burst windows, (k, 2) start/end (none when seed is None)
        self.bursts = windows
        b = np.unique(np.clip(np.asarray(cuts, dtype=float), 0.0, self.horizon_s))
        starts = b[:-1]
        f = np.full(len(starts), self.base_rate * burst_mean)
        if counts is not None:
            k = (starts // 60.0).astype(np.int64)
            past = (k >= len(counts)) & (not curve.repeat)  # no repeat: 0 after the file
            f = np.where(past, 0.0, counts[k % len(counts)]) * burst_mean
        if len(sched_t):
            i = np.searchsorted(sched_t, starts, side="right") - 1
            f = f * np.where(i >= 0, sched_m[np.maximum(i, 0)], 1.0)
        if len(windows):
            j = np.searchsorted(windows[:, 0], starts, side="right") - 1
            inside = (j >= 0) & (starts < windows[np.maximum(j, 0), 1])
            f = np.where(inside, f * curve.burst_factor, f)
        self._b, self._f = b, f
        if curve.kind == "diurnal" and curve.amplitude > 0:
            self._amp = float(curve.amplitude)
            self._omega = 2.0 * math.pi / float(curve.period_s)
            self._peak = float(curve.peak_s)
        else:
            self._amp, self._omega, self._peak = 0.0, 1.0, 0.0
        gb = self._G(b)
        self._gb = gb
        self._C = np.concatenate([[0.0], np.cumsum(f * np.diff(gb))])
        #: the largest rate, requests/s
        self.max_rate = float((f * (1.0 + self._amp)).max()) if len(f) else 0.0

    # -- the shape g and its integral G -----------------------------------------------------
    def _g(self, t):
        if self._amp == 0.0:
            return np.ones_like(t)
        return 1.0 + self._amp * np.cos(self._omega * (t - self._peak))

    def _G(self, t):
        if self._amp == 0.0:
            return np.asarray(t, dtype=float)
        return t + (self._amp / self._omega) * np.sin(self._omega * (t - self._peak))

    def _piece(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self._b, t, side="right") - 1, 0, len(self._f) - 1)

    # -- the public functions ---------------------------------------------------------------
    def rate(self, t):
        """Requests per second at time ``t`` (scalar or array): 0 before 0 and from horizon_s."""
        ta = np.asarray(t, dtype=float)
        out = self._f[self._piece(ta)] * self._g(ta)
        out = np.where((ta >= 0) & (ta < self.horizon_s), out, 0.0)
        return float(out) if np.ndim(out) == 0 else out

    def multiplier(self, t):
        """``rate(t) / base_rate``: m(t) of the curve × the rate schedule × bursts."""
        r = self.rate(t)
        return r / self.base_rate

    def cumulative(self, t):
        """Λ(t): the expected arrivals in ``[0, t)`` (scalar or array)."""
        ta = np.clip(np.asarray(t, dtype=float), 0.0, self.horizon_s)
        i = self._piece(ta)
        out = self._C[i] + self._f[i] * (self._G(ta) - self._gb[i])
        return float(out) if np.ndim(out) == 0 else out

    def expected_arrivals(self, t0: float, t1: float) -> float:
        """The expected number of arrivals in ``[t0, t1)`` (0 when t1 <= t0)."""
        if t1 <= t0:
            return 0.0
        return float(self.cumulative(t1) - self.cumulative(t0))

    @property
    def total(self) -> float:
        """Λ(horizon_s): the expected arrivals of the whole episode."""
        return float(self._C[-1])

    def inverse(self, y) -> np.ndarray:
        """Λ⁻¹: the times at which the cumulative rate reaches ``y`` (array; inf where ``y`` is
        at or past :attr:`total`)."""
        y = np.asarray(y, dtype=float)
        out = np.full(y.shape, np.inf)
        ok = y < self._C[-1]
        if not ok.any():
            return out
        yv = y[ok]
        i = np.clip(np.searchsorted(self._C, yv, side="right") - 1, 0, len(self._f) - 1)
        lo, hi = self._b[i], self._b[i + 1]
        if self._amp == 0.0:
            x = lo + (yv - self._C[i]) / self._f[i]
        else:
            x = self._solve(self._gb[i] + (yv - self._C[i]) / self._f[i], lo, hi)
        out[ok] = np.clip(x, lo, hi)
        return out

    def _solve(self, target: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """x in [lo, hi] with G(x) = target (G increasing: g >= 1 - amplitude > 0): Newton from
        the chord, kept inside the bracket (bisection where a step leaves it), to rounding."""
        lo, hi = lo.copy(), hi.copy()
        glo, ghi = self._G(lo), self._G(hi)
        x = np.clip(lo + (target - glo) * (hi - lo) / (ghi - glo), lo, hi)  # the chord
        # G's own rounding: x + (a / omega) sin(..) carries the error of its larger term
        tol = 8 * np.finfo(float).eps * (np.abs(hi) + self._amp / self._omega + np.abs(target))
        todo = np.arange(len(x))
        for _ in range(200):
            xs = x[todo]
            r = self._G(xs) - target[todo]
            open_ = np.abs(r) > tol[todo]
            todo, xs, r = todo[open_], xs[open_], r[open_]
            if not len(todo):
                break
            lo[todo] = np.where(r < 0, xs, lo[todo])
            hi[todo] = np.where(r > 0, xs, hi[todo])
            xn = xs - r / self._g(xs)
            bad = (xn < lo[todo]) | (xn > hi[todo]) | (xn == xs)
            x[todo] = np.where(bad, 0.5 * (lo[todo] + hi[todo]), xn)
        return x

    def arrival_times(self, rng_gen: np.random.Generator, t0: float = 0.0,
                      t1: float | None = None) -> np.ndarray:
        """Every arrival in ``[t0, t1)`` (default: to the horizon), sorted: the exact
        non-homogeneous Poisson process, from unit exponential gaps of ``rng_gen``."""
        t1 = self.horizon_s if t1 is None else min(t1, self.horizon_s)
        y0, y1 = self.cumulative(t0), self.cumulative(t1)
        out, y = [], y0
        while True:
            need = y1 - y
            n = max(16, int(need + 6.0 * math.sqrt(max(need, 1.0)) + 16))
            ys = y + np.cumsum(rng_gen.exponential(1.0, n))
            inside = ys[ys < y1]
            out.append(inside)
            if len(inside) < n:
                break
            y = ys[-1]
        ys = np.concatenate(out)
        return self.inverse(ys)


class CurveArrivalProcess:
    """The simulator's arrival times under a curve (``ArrivalProcess``'s interface): arrivals
    chain through the cumulative rate, ``Λ⁻¹(Λ(previous) + E)``, with the unit gaps ``E`` drawn
    in batches from the episode's arrival generator and mapped a batch at a time. After
    :meth:`forget_drawn` the next arrival is drawn afresh from the ``t`` asked for."""

    def __init__(self, rate: ArrivalRate, rng_gen: np.random.Generator, batch: int = 256):
        self.rate = rate
        self.horizon_s = rate.horizon_s
        self.rng = rng_gen
        self._batch = batch
        self._times: list[float] = []  # arrival times drawn ahead (reversed: pop() from the end)
        self._y: float | None = None  # Λ of the last arrival drawn (None: start from t)

    def copy(self, rng_gen: np.random.Generator) -> "CurveArrivalProcess":
        """An independent copy drawing from ``rng_gen`` (its arrivals drawn ahead copied)."""
        out = object.__new__(CurveArrivalProcess)
        out.__dict__.update(self.__dict__)
        out._times = list(self._times)
        out.rng = rng_gen
        return out

    def forget_drawn(self) -> None:
        """Drop the arrivals drawn ahead: the next ones come from the generator's state."""
        self._times = []
        self._y = None

    def next_time(self, t: float) -> float | None:
        """Time of the next arrival after ``t`` (at or after, for a tie), or None when past the
        horizon."""
        while True:
            while self._times and self._times[-1] < t:
                self._times.pop()  # arrivals before t (after a restart): skipped
            if self._times:
                nxt = self._times.pop()
                return nxt if nxt < self.horizon_s else None
            y0 = self.rate.cumulative(t) if self._y is None else self._y
            if y0 >= self.rate.total:
                return None
            ys = y0 + np.cumsum(self.rng.exponential(1.0, self._batch))
            self._y = float(ys[-1])
            self._times = self.rate.inverse(ys).tolist()[::-1]


EXAMPLE_HEADER = """\
# Synthetic (not measured): one day of per-minute request counts in the shape of the public
# Azure Functions invocation traces, made by envs.arrival_curves.write_example (seed 72): a
# diurnal curve (mean 300 a minute, amplitude 0.6, peak at minute 840 = 14:00), three bursts
# (x3 for 10-20 minutes) and Poisson noise. Regenerate:
#   python -c "from envs.arrival_curves import write_example as w; w('configs/env/workloads/diurnal_minutes.csv')"
"""


def example_counts(seed: int = 72) -> np.ndarray:
    """The synthetic day of ``configs/env/workloads/diurnal_minutes.csv`` (1,440 integer
    counts): Poisson counts around ``300 (1 + 0.6 cos(2π (k − 840) / 1440))`` a minute, three
    times that in three bursts of 10-20 minutes at random minutes."""
    g = np.random.default_rng(seed)
    k = np.arange(1440)
    mean = 300.0 * (1.0 + 0.6 * np.cos(2.0 * np.pi * (k - 840) / 1440.0))
    for start in g.integers(0, 1420, 3):
        mean[start:start + int(g.integers(10, 21))] *= 3.0
    return g.poisson(mean)


def write_example(path: str | Path, seed: int = 72) -> None:
    """Write :func:`example_counts` as a ``minute,count`` CSV (header, comment lines)."""
    rows = "".join(f"{k},{c}\n" for k, c in enumerate(example_counts(seed).tolist()))
    Path(path).write_text(EXAMPLE_HEADER + "minute,count\n" + rows, encoding="utf-8")


__all__ = ["ArrivalCurveConfig", "ArrivalRate", "CurveArrivalProcess", "load_counts",
           "burst_windows", "burst_seed", "resolve_path", "example_counts", "write_example"]
