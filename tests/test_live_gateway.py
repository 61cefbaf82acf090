"""Steps of an agent program submitted from inside a running primitive, in the library
(scale_ray/live/gateway.py, LiveConfig.program_gateway). The live tests share one 2-server local
cluster: the planning call holds one server while its steps run on the other."""

from __future__ import annotations

import pytest
from processes import local_cluster

from policies import get_policy
from scale_ray.live import LiveConfig, LiveScheduler, WorkflowFailed, primitive, program

TWO = ["cluster.servers=2", "mdp.order=fifo",
       "cluster.tiers=[{name: only, compute: 1.0, memory_gb: 32, count: 2}]"]


@primitive(compute_gflop=0.2)
def square(x):
    return x * x


@primitive(compute_gflop=0.2)
def plan(n):
    """An agent call that decides its next calls and waits for their answers."""
    steps = [program().submit(square.bind(i)) for i in range(1, n + 1)]
    return sum(s.result(timeout=60) for s in steps)


def test_program_outside_a_primitive_names_what_to_do():
    with pytest.raises(RuntimeError, match="program_gateway=True"):
        program()


@pytest.fixture(scope="module")
def two_servers():
    for _, env in local_cluster(TWO):
        yield env


@pytest.mark.slow
def test_a_primitive_submits_the_next_steps_of_its_own_program(two_servers):
    env = two_servers
    cfg = LiveConfig(time_scale=0.1, program_gateway=True)
    with LiveScheduler(get_policy("eft", env), env, cfg) as sched:
        h = sched.submit(plan.bind(3), tenant="team-a")
        assert h.result(timeout=120) == 1 + 4 + 9
        prog = h.program  # made for the workflow when its primitive submitted the first step
        assert prog is not None and prog.handles[0] is h and len(prog.handles) == 4
        assert sched.gateway.submitted == 3
        for step in prog.handles[1:]:  # each a step of the same request: its arrival, tenant
            assert step.result(timeout=30) in (1, 4, 9) and step.tenant == "team-a"
            assert step.live_record.arrival == h.live_record.arrival
    assert sched.gateway.actor is None  # shutdown killed the gateway actor


@pytest.mark.slow
def test_without_the_gateway_the_primitive_fails_naming_the_switch(two_servers):
    env = two_servers
    with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.1)) as sched:
        h = sched.submit(plan.bind(1))
        with pytest.raises(WorkflowFailed, match="program_gateway=True"):
            h.result(timeout=120)
