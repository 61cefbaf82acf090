"""A LangGraph ReAct agent whose calls run as one agent program (scale_ray/langgraph_agent.py,
scale_ray/agent_steps.py): the graph's control flow without a cluster, then live on a 2-server
local cluster, as programs and call by call."""

from __future__ import annotations

import pytest
from processes import local_cluster

from scale_ray.agent_steps import Steps
from scale_ray.langgraph_agent import (MAX_TOOL_CALLS, ask, build_graph, run_agents,
                                       scripted_reply)

QUESTIONS = ["compare Ray schedulers", "what is HEFT", "why fifo", "agents on Ray?"]


def _expected(question: str) -> tuple[str, int]:
    """The scripted answer and how many calls (model + tool) the agent makes."""
    k = 1 + len(question) % MAX_TOOL_CALLS
    return " | ".join(f"found({question} #{t})" for t in range(k)), 2 * k + 1


class LocalSteps(Steps):
    """Runs each call's body in this process (no Ray): the graph's control flow alone."""

    def __init__(self):
        super().__init__(sched=None, per_call=True)
        self.names: list[str] = []

    def run(self, call):
        self.calls += 1
        self.names.append(call.primitive.name)
        return call.primitive.fn(*call.args)


def test_the_graph_loops_model_and_tool_until_the_model_answers():
    assert scripted_reply("ab", 0, ()) == "search: ab #0"
    for q in QUESTIONS:
        steps = LocalSteps()
        out = build_graph(steps).invoke({"question": q, "turn": 0, "observations": []})
        answer, calls = _expected(q)
        assert out["answer"] == answer and steps.calls == calls
        assert steps.names == ["think", "search"] * (calls // 2) + ["think"]


def test_steps_validates_its_timeout():
    with pytest.raises(ValueError, match="timeout_s"):
        Steps(timeout_s=0)


@pytest.fixture(scope="module")
def two_servers():
    for _, env in local_cluster(["cluster.servers=2", "mdp.order=fifo",
                                 "cluster.tiers=[{name: only, compute: 4.0, memory_gb: 32, "
                                 "count: 2}]"]):
        yield env


@pytest.mark.slow
@pytest.mark.parametrize("per_call", [False, True])
def test_langgraph_agents_run_on_the_cluster_as_programs_or_call_by_call(two_servers, per_call):
    from policies import get_policy
    from scale_ray.live import LiveConfig, LiveScheduler

    env = two_servers
    with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.1)) as sched:
        results = run_agents(sched, QUESTIONS, per_call=per_call, timeout_s=120)
        for q, (answer, steps) in zip(QUESTIONS, results):
            want, calls = _expected(q)
            assert answer == want and steps.calls == calls and steps.response_s > 0
            if per_call:
                assert steps.program is None
            else:  # every call a step of the agent's program, keyed by its arrival
                prog = steps.program
                assert len(prog.handles) == calls and prog.closed
                assert {h.live_record.arrival for h in prog.handles} == {prog.arrival}
                assert prog.wait(timeout=10) and prog.response_s > 0
        answer, steps = ask(sched, "one more", per_call=per_call, timeout_s=120)
        assert answer == _expected("one more")[0]
