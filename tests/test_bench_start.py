"""`scale-ray bench service`'s start barrier (scale_ray.bench.service.start_together and the
client's wait_for_start), without Ray: every client gets the same start, set only after all
of them connected and the service offered every server."""

import threading
import time

import pytest

from scale_ray.bench.service import start_together
from scale_ray.bench.service_client import wait_for_start


class _Proc:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


class _Svc:
    def __init__(self):
        self.asked_at = None

    def wait_accepting(self, timeout_s):
        self.asked_at = time.time()
        return 0.0


def test_every_client_starts_at_one_time_set_after_the_last_connected(tmp_path):
    jobs = [(tmp_path / f"c{i}.json", tmp_path / f"c{i}.out.json") for i in range(3)]
    for inp, _ in jobs:
        inp.write_text("{}")
    starts, ready_at = {}, {}

    def client(i, delay):
        time.sleep(delay)  # a slow client (imports, Ray's driver start)
        ready_at[i] = time.time()
        starts[i] = wait_for_start(str(jobs[i][0]), str(jobs[i][1]), 10.0)

    threads = [threading.Thread(target=client, args=(i, 0.3 * i)) for i in range(3)]
    for t in threads:
        t.start()
    svc = _Svc()
    start = start_together(svc, jobs, [_Proc() for _ in jobs], 10.0)
    for t in threads:
        t.join()
    assert set(starts.values()) == {start}
    assert svc.asked_at >= max(ready_at.values())  # servers checked after the last client
    assert start > max(ready_at.values())


def test_a_client_that_died_before_connecting_fails_the_bench_at_once(tmp_path):
    jobs = [(tmp_path / "c0.json", tmp_path / "c0.out.json")]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not connect"):
        start_together(_Svc(), jobs, [_Proc(code=1)], 60.0)
    assert time.monotonic() - t0 < 5.0


def test_a_client_without_a_start_time_gives_up_after_its_timeout(tmp_path):
    with pytest.raises(TimeoutError, match="no start time"):
        wait_for_start(str(tmp_path / "c.json"), str(tmp_path / "c.out.json"), 0.2)
    assert (tmp_path / "c.out.json.ready").exists()
