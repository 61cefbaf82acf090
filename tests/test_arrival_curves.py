"""Time-varying arrivals (``workload.curve``, envs/arrival_curves.py; issue 72 item 1): the default
changes nothing; the diurnal rate per phase, the bursts and a replayed trace match their
definitions over many arrivals; bad values and bad files are refused naming the field (and the
file, line); the same seed gives the same arrivals; ``expected_arrivals`` is the integral of the
rate. The recorded episodes of tests/test_golden_eval.py pin the default exactly."""
from __future__ import annotations

import math

import numpy as np
import pytest

from envs.arrival_curves import (ArrivalCurveConfig, ArrivalRate, CurveArrivalProcess,
                                 example_counts, load_counts)
from envs.config import ConfigError, load_env_config
from envs.sim_arrivals import Arrivals, arrival_rate, base_rate
from envs.workload import ArrivalProcess


def env(curve=None, **workload):
    w = dict(workload)
    if curve is not None:
        w["curve"] = curve
    return load_env_config({"workload": w})


def arrivals_of(cfg, seed=0):
    """Every arrival time of one episode of ``cfg`` through the simulator's Arrivals."""
    ss = np.random.SeedSequence(seed)
    arr = Arrivals(cfg, np.random.Generator(np.random.PCG64(ss.spawn(1)[0])),
                   np.random.default_rng(1))
    out, t = [], 0.0
    while (t := arr.next_time(t)) is not None:
        out.append(t)
    return np.array(out), arr


def write_csv(tmp_path, text, name="counts.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# -------------------------------------------------------------------- the default is unchanged
def test_kind_none_is_the_old_process_bit_for_bit():
    plain = env(horizon_s=500.0, rate_schedule=[[100.0, 2.0], [300.0, 0.5]])
    none = env({"kind": "none"}, horizon_s=500.0, rate_schedule=[[100.0, 2.0], [300.0, 0.5]])
    assert plain == none and plain.workload.curve == ArrivalCurveConfig()
    a, arr = arrivals_of(plain, 3)
    b, _ = arrivals_of(none, 3)
    assert isinstance(arr.process, ArrivalProcess)
    # the process as it was built before workload.curve existed
    old = ArrivalProcess(base_rate(plain), plain.workload.rate_schedule, 500.0,
                         np.random.Generator(np.random.PCG64(np.random.SeedSequence(3).spawn(1)[0])))
    ref, t = [], 0.0
    while (t := old.next_time(t)) is not None:
        ref.append(t)
    assert a.tolist() == b.tolist() == ref and len(ref) > 100


def test_kind_none_episode_equals_the_default_episode(repo, monkeypatch):
    from scale_ray.config import load_env
    from scale_ray.evaluation import evaluate
    monkeypatch.chdir(repo)
    got = []
    for ov in ([], ["workload.curve.kind=none"]):
        cfg = load_env("configs/env/paper.yaml", ["workload.horizon_s=60", *ov])
        ep = evaluate(cfg, ["eft"], [16], 1, 7, workers=1)[1][0]
        got.append({k: v for k, v in ep.items() if k != "wall_s"})  # all but the wall clock
    assert got[0] == got[1] and got[0]["completed_tasks"] > 0


# -------------------------------------------------------------------- diurnal
def test_diurnal_rate_per_phase_matches_the_curve():
    period, peak, amp, base = 3600.0, 900.0, 0.6, 5.0
    cfg = env({"kind": "diurnal", "period_s": period, "peak_s": peak, "amplitude": amp},
              arrival_rate_16=base, horizon_s=10 * period)
    times, arr = arrivals_of(cfg, 11)
    assert isinstance(arr.process, CurveArrivalProcess)
    bins = 12
    counts = np.bincount(((times % period) / period * bins).astype(int), minlength=bins)
    w = 2 * math.pi / period
    for k in range(bins):
        a, b = k * period / bins, (k + 1) * period / bins
        mean_m = 1 + amp * (math.sin(w * (b - peak)) - math.sin(w * (a - peak))) / (w * (b - a))
        expect = 10 * base * (b - a) * mean_m
        assert abs(counts[k] - expect) < 5 * math.sqrt(expect), (k, counts[k], expect)
    # the mean over whole periods is the configured rate
    assert abs(len(times) / (10 * period) - base) < 5 * math.sqrt(base * 10 * period) / (10 * period)
    r = arr.rate
    assert r.multiplier(peak) == pytest.approx(1 + amp)
    assert r.multiplier(peak + period / 2) == pytest.approx(1 - amp)
    assert r.rate(10 * period) == 0.0  # arrivals stop at the horizon


def test_peak_s_is_taken_modulo_the_period():
    a = arrival_rate(env({"kind": "diurnal", "period_s": 3600, "peak_s": 600}, horizon_s=3600.0))
    b = arrival_rate(env({"kind": "diurnal", "period_s": 3600}))  # default 50400 = 14 x 3600
    c = arrival_rate(env({"kind": "diurnal", "period_s": 3600, "peak_s": 0}))
    t = np.linspace(0, 200, 41)
    assert np.allclose(b.rate(t), c.rate(t)) and a.multiplier(600.0) == pytest.approx(1.5)


def test_bursts_raise_the_rate_in_their_window():
    cfg = env({"kind": "diurnal", "amplitude": 0.0, "bursts_per_hour": 2.0, "burst_factor": 4.0,
               "burst_s": 300.0}, arrival_rate_16=2.0, horizon_s=36000.0)
    times, arr = arrivals_of(cfg, 5)
    win = arr.rate.bursts
    assert 8 <= len(win) <= 40  # 20 expected (a few merge)
    assert np.all(win[:, 1] - win[:, 0] >= 300.0 - 1e-9)
    inside = np.zeros(len(times), dtype=bool)
    for s, e in win:
        inside |= (times >= s) & (times < e)
    t_in = float(np.sum(np.minimum(win[:, 1], 36000.0) - win[:, 0]))
    n_in, n_out = inside.sum(), (~inside).sum()
    assert abs(n_in - 8.0 * t_in) < 5 * math.sqrt(8.0 * t_in)
    assert abs(n_out - 2.0 * (36000 - t_in)) < 5 * math.sqrt(2.0 * (36000 - t_in))
    s, e = win[0]
    assert arr.rate.multiplier((s + e) / 2) == pytest.approx(4.0)
    # no seed: the long-run mean factor instead of drawn windows (a planner's expectation)
    mean = arrival_rate(cfg)
    p = 1 - math.exp(-2.0 * 300.0 / 3600.0)
    assert len(mean.bursts) == 0 and mean.multiplier(100.0) == pytest.approx(1 + 3 * p)


# -------------------------------------------------------------------- trace
COUNTS = [0, 30, 60, 120, 6, 45]


def test_trace_replays_the_counts(tmp_path):
    path = write_csv(tmp_path, "minute,count\n" + "".join(f"{k + 1},{c}\n"
                                                          for k, c in enumerate(COUNTS)))
    cfg = env({"kind": "trace", "path": path, "scale": 2.0}, horizon_s=360.0)
    rate = arrival_rate(cfg)
    assert rate.base_rate == pytest.approx(2.0 * np.mean(COUNTS) / 60)
    n = 300
    per_min = np.zeros(len(COUNTS))
    for seed in range(n):
        times, _ = arrivals_of(cfg, seed)
        per_min += np.bincount((times // 60).astype(int), minlength=len(COUNTS))
    expect = 2.0 * np.array(COUNTS, dtype=float)
    assert per_min[0] == 0  # a minute of count 0 has no arrival
    assert np.all(np.abs(per_min / n - expect) <= 5 * np.sqrt(np.maximum(expect, 1) / n))


def test_trace_repeat_wraps_and_a_short_file_is_refused(tmp_path):
    path = write_csv(tmp_path, "0,10\n1,20\n")
    with pytest.raises(ConfigError, match=r"workload\.horizon_s.*curve\.repeat"):
        env({"kind": "trace", "path": path}, horizon_s=121.0)
    cfg = env({"kind": "trace", "path": path, "repeat": True}, horizon_s=600.0)
    r = arrival_rate(cfg)
    assert [r.rate(60.0 * k + 1) * 60 for k in range(10)] == pytest.approx([10, 20] * 5)
    assert r.expected_arrivals(0, 600) == pytest.approx(150.0)
    # without repeat the rate is 0 after the file (ArrivalRate used directly)
    direct = ArrivalRate(1.0, 300.0, ArrivalCurveConfig(kind="trace", path=path))
    assert direct.rate(130.0) == 0.0 and direct.total == pytest.approx(30.0)


def test_the_example_file_is_the_documented_synthetic_day(repo):
    counts = load_counts("configs/env/workloads/diurnal_minutes.csv")
    assert counts.tolist() == example_counts().tolist() and len(counts) == 1440
    cfg = env({"kind": "trace", "path": "configs/env/workloads/diurnal_minutes.csv",
               "scale": 0.01}, horizon_s=86400.0)
    assert arrival_rate(cfg).total == pytest.approx(0.01 * counts.sum())


# -------------------------------------------------------------------- validation
@pytest.mark.parametrize("curve, field", [
    ({"kind": "diurnal", "amplitude": 1.2}, r"workload\.curve\.amplitude: 1\.2 is out of range"),
    ({"kind": "diurnal", "amplitude": -0.1}, r"workload\.curve\.amplitude"),
    ({"kind": "diurnal", "period_s": 0}, r"workload\.curve\.period_s: 0\.0 is out of range"),
    ({"kind": "diurnal", "peak_s": -1}, r"workload\.curve\.peak_s: -1\.0 is out of range"),
    ({"kind": "diurnal", "burst_factor": 0}, r"workload\.curve\.burst_factor"),
    ({"kind": "diurnal", "bursts_per_hour": -1}, r"workload\.curve\.bursts_per_hour"),
    ({"kind": "none", "bursts_per_hour": 1}, r"workload\.curve\.bursts_per_hour"),
    ({"kind": "weekly"}, r"workload\.curve\.kind"),
    ({"kind": "trace"}, r"workload\.curve\.path: required"),
    ({"kind": "diurnal", "path": "x.csv"}, r"workload\.curve\.path: only for kind trace"),
    ({"kind": "trace", "path": "no/such/file.csv"},
     r"workload\.curve\.path: no/such/file\.csv: no such file"),
    ({"kind": "none", "smoothing": 1}, r"unknown key env\.workload\.curve\.smoothing"),
])
def test_bad_curves_are_refused_naming_the_field(curve, field):
    with pytest.raises(ConfigError, match=field):
        env(curve)


@pytest.mark.parametrize("text, where", [
    ("minute,count\n0,5\n1,abc\n", r"line 3: field count: 'abc' is not a number"),
    ("0,5\n1,-3\n", r"line 2: field count: -3 is out of range"),
    ("0,5\n1,nan\n", r"line 2: field count"),
    ("0,5\n1,4\n3,7\n", r"line 3: field minute: 3 follows 1"),
    ("0,5\n0,4\n", r"line 2: field minute: 0 follows 0"),
    ("0,5\nx,4\n", r"line 2: field minute: 'x' is not an integer"),
    ("0,5,1\n", r"line 1: expected 2 fields minute,count, got 3"),
    ("# only a comment\nminute,count\n", r"no minute,count rows"),
    ("0,0\n1,0\n", r"every count is 0"),
])
def test_bad_files_are_refused_naming_file_line_and_field(tmp_path, text, where):
    path = write_csv(tmp_path, text)
    sep = " " if where.startswith("line") else ": "
    with pytest.raises(ConfigError, match=r"workload\.curve\.path: \S*counts\.csv" + sep + where):
        env({"kind": "trace", "path": path}, horizon_s=60.0)


def test_trace_with_gpu_load_is_refused(tmp_path):
    path = write_csv(tmp_path, "0,5\n1,6\n")
    with pytest.raises(ConfigError, match=r"workload\.gpu_load"):
        load_env_config({"workload": {"source": "agents", "gpu_load": 0.5, "horizon_s": 60,
                                      "curve": {"kind": "trace", "path": path}}})


def test_header_comments_and_blank_lines_are_accepted(tmp_path):
    path = write_csv(tmp_path, "# made by hand\n\nminute, count\n1, 2\n2,3.5\n\n")
    assert load_counts(path).tolist() == [2.0, 3.5]


# -------------------------------------------------------------------- determinism, forks
def test_same_seed_same_arrivals_and_bursts():
    cfg = env({"kind": "diurnal", "period_s": 600, "peak_s": 100, "amplitude": 0.9,
               "bursts_per_hour": 6}, arrival_rate_16=3.0, horizon_s=3600.0)
    a, ra = arrivals_of(cfg, 42)
    b, rb = arrivals_of(cfg, 42)
    c, rc = arrivals_of(cfg, 43)
    assert a.tolist() == b.tolist() and ra.rate.bursts.tolist() == rb.rate.bursts.tolist()
    assert a.tolist() != c.tolist() and ra.rate.bursts.tolist() != rc.rate.bursts.tolist()
    assert np.all(np.diff(a) >= 0) and a[-1] < 3600.0
    # the same times from the vectorised generator of the same rate and generator
    g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(42).spawn(1)[0]))
    assert np.allclose(ra.rate.arrival_times(g), a, rtol=0, atol=1e-9)


def test_a_copy_draws_the_same_future_and_a_resample_draws_afresh():
    cfg = env({"kind": "diurnal", "period_s": 600, "peak_s": 0, "amplitude": 0.5},
              arrival_rate_16=2.0, horizon_s=1200.0)
    arr = Arrivals(cfg, np.random.default_rng(9), np.random.default_rng(10))
    t = arr.next_time(0.0)
    cp = arr.copy()
    x, y, tx, ty = [], [], t, t
    for _ in range(50):
        tx, ty = arr.next_time(tx), cp.next_time(ty)
        x.append(tx)
        y.append(ty)
    assert x == y
    cp.resample((np.random.default_rng(1).bit_generator.state,
                 np.random.default_rng(2).bit_generator.state))
    nxt = cp.next_time(ty)
    assert nxt is not None and nxt >= ty and nxt != x[-1]


def test_a_simulator_episode_runs_under_a_curve():
    from envs.simulator import Simulator
    cfg = env({"kind": "diurnal", "period_s": 120, "peak_s": 30, "amplitude": 0.8,
               "bursts_per_hour": 60, "burst_s": 10}, horizon_s=120.0)
    sim = Simulator(cfg)
    sim.reset(4)
    assert isinstance(sim.arrivals.process, CurveArrivalProcess)
    assert sim.arrivals.rate.expected_arrivals(0, 120) > 0


# -------------------------------------------------------------------- expected_arrivals
@pytest.mark.parametrize("curve", [
    {"kind": "diurnal", "period_s": 1000, "peak_s": 250, "amplitude": 0.7,
     "bursts_per_hour": 12, "burst_factor": 2.5, "burst_s": 120},
    {"kind": "diurnal", "period_s": 86400, "peak_s": 50400, "amplitude": 0.99},
    {"kind": "trace", "path": "configs/env/workloads/diurnal_minutes.csv", "scale": 0.01,
     "bursts_per_hour": 4},
])
def test_expected_arrivals_is_the_integral_of_the_rate(repo, curve):
    cfg = env(curve, arrival_rate_16=1.5, horizon_s=5000.0, rate_schedule=[[1000.0, 2.0]])
    r = arrival_rate(cfg, np.random.SeedSequence(3))
    spans = [(0, 5000), (0, 1000), (123.4, 4321.0), (999.0, 1001.0), (4000, 5000)]
    # a fine grid through every point where the rate jumps (bursts, schedule, minutes) and
    # every span's ends: the midpoint rule is then exact to O(step^2)
    grid = np.unique(np.concatenate([np.linspace(0.0, 5000.0, 1_000_001), r.bursts.ravel(),
                                     60.0 * np.arange(84), [1000.0], np.ravel(spans)]))
    grid = grid[(grid >= 0) & (grid <= 5000.0)]
    rates = r.rate(grid[:-1] + np.diff(grid) / 2)
    cum = np.concatenate([[0.0], np.cumsum(rates * np.diff(grid))])
    for t0, t1 in spans:
        num = cum[np.searchsorted(grid, t1)] - cum[np.searchsorted(grid, t0)]
        assert r.expected_arrivals(t0, t1) == pytest.approx(num, rel=1e-6), (t0, t1)
    assert r.expected_arrivals(4000, 9000) == r.expected_arrivals(4000, 5000)  # 0 after
    assert r.expected_arrivals(10.0, 10.0) == 0.0
    # the inverse of the cumulative rate is exact to rounding
    ys = np.linspace(0.0, r.total * 0.999, 1001)
    assert np.allclose(r.cumulative(r.inverse(ys)), ys, rtol=1e-12, atol=1e-9)
