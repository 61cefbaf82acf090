"""A LangGraph ReAct agent whose model and tool calls run as one agent program (issue 47, item 4).

The graph is plain LangGraph (``StateGraph``): an ``agent`` node asks the model what to do, a
``tools`` node runs the tool it chose, a conditional edge loops until the model answers. Each
node's work is a ``@primitive`` call run through :class:`scale_ray.agent_steps.Steps`: on the
cluster, placed by the scheduler, as a step of the request's program (``per_call=True``: each
call alone, the comparison). The model is langchain-core's ``FakeListChatModel`` (no network, no
weights) with a scripted reply per turn, and both calls emulate their latency
(``compute_gflop`` on the chosen server, ``time_scale``).

    from scale_ray.langgraph_agent import ask
    answer, steps = ask(sched, "compare Ray schedulers")            # or sched=None: the service

LangGraph is an optional dependency (``pip install 'scale-ray[agents]'``; in ``[dev]`` for the
tests). :func:`run_agents` runs several agents at once and returns each one's answer and
response (tests/test_langgraph_agent.py compares programs with per-call submission).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence, TypedDict

from policies import get_policy
from scale_ray.agent_steps import Steps
from scale_ray.bench.localservice import LocalService
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler
from scale_ray.live.cluster import LocalHeteroCluster
from scale_ray.live.workflow import primitive
from scale_ray.relative import rel

#: tool calls the scripted model makes before it answers, by the question's length
MAX_TOOL_CALLS = 3


def scripted_reply(question: str, turn: int, observations: Sequence[str]) -> str:
    """What the fake model says at ``turn``: a search until it has searched enough, then the
    answer built from what it found."""
    if turn < 1 + len(question) % MAX_TOOL_CALLS:
        return f"search: {question} #{turn}"
    return "final: " + " | ".join(observations)


@primitive(compute_gflop=4.0, memory_gb=2.0, kind="llm", emulate=True)
def think(question: str, turn: int, observations: tuple[str, ...]) -> str:
    """The model call: langchain-core's fake chat model, replying with the turn's script."""
    from langchain_core.language_models import FakeListChatModel

    model = FakeListChatModel(responses=[scripted_reply(question, turn, observations)])
    return str(model.invoke(f"{question}\n" + "\n".join(observations)).content)


@primitive(compute_gflop=2.0, memory_gb=1.0, kind="tool", emulate=True)
def search(query: str) -> str:
    """The tool call."""
    return f"found({query})"


class AgentState(TypedDict, total=False):
    question: str
    turn: int
    observations: list[str]
    pending: str | None
    answer: str | None


def build_graph(steps: Steps) -> Any:
    """The compiled ReAct graph whose node calls run through ``steps``."""
    from langgraph.graph import END, START, StateGraph

    def agent(state: AgentState) -> dict:
        reply = steps.run(think.bind(state["question"], state.get("turn", 0),
                                     tuple(state.get("observations", []))))
        if reply.startswith("search: "):
            return {"pending": reply[len("search: "):]}
        return {"pending": None, "answer": reply[len("final: "):]}

    def tools(state: AgentState) -> dict:
        found = steps.run(search.bind(state["pending"]))
        return {"observations": [*state.get("observations", []), found],
                "turn": state.get("turn", 0) + 1, "pending": None}

    g = StateGraph(AgentState)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if s.get("pending") else END)
    g.add_edge("tools", "agent")
    return g.compile()


def ask(sched: Any, question: str, per_call: bool = False, **steps_options: Any
        ) -> tuple[str, Steps]:
    """Run one agent on ``question``; returns its answer and its :class:`Steps` (calls,
    ``response_s``). ``sched``: a LiveScheduler, or None for the scheduler service."""
    with Steps(sched, "react", per_call=per_call, **steps_options) as steps:
        out = build_graph(steps).invoke({"question": question, "turn": 0, "observations": []})
    return out["answer"], steps


def run_agents(sched: Any, questions: Sequence[str], per_call: bool = False,
               **steps_options: Any) -> list[tuple[str, Steps]]:
    """One agent per question, all at once (a thread each, as concurrent users)."""
    with ThreadPoolExecutor(max(1, len(questions))) as pool:
        return list(pool.map(lambda q: ask(sched, q, per_call, **steps_options), questions))


def compare(sched: Any, questions: Sequence[str], rounds: int = 1) -> dict[str, Any]:
    """The same agents as programs and call by call, alternating ``rounds`` times: each way's
    mean response (wall s, as the agents see them) and program / per_call - 1."""
    out: dict[str, list[float]] = {"program": [], "per_call": []}
    for _ in range(rounds):
        for mode in ("program", "per_call"):
            done = run_agents(sched, questions, per_call=mode == "per_call")
            out[mode] += [steps.response_s for _, steps in done]
    means = {m: sum(v) / len(v) for m, v in out.items()}
    return {"agents": len(questions), "rounds": rounds, "mean_response_s": means,
            "program_vs_per_call_rel_diff": means["program"] / means["per_call"] - 1}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scale_ray.langgraph_agent``: concurrent LangGraph agents on a local cluster,
    as programs and call by call (``--help``)."""
    p = argparse.ArgumentParser(prog="python -m scale_ray.langgraph_agent",
                                description=main.__doc__)
    p.add_argument("--agents", type=int, default=12, help="agents at once (one question each)")
    p.add_argument("--servers", type=int, default=2, help="local servers (4 GFLOP/s each)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of both ways")
    p.add_argument("--time-scale", type=float, default=0.1, help="wall s per model s")
    p.add_argument("--service", action="store_true",
                   help="run the agents through the scheduler service (Ray Serve on the local "
                        "cluster, scale_ray.client) instead of a LiveScheduler in this process")
    p.add_argument("--no-fair-share", action="store_true",
                   help="with --service: its live.fair_share off (on by default in the service)")
    args = p.parse_args(argv)
    if args.agents < 1 or args.servers < 1 or args.rounds < 1:
        p.error("--agents, --servers and --rounds must be >= 1")
    env = load_env(None, [f"cluster.servers={args.servers}", "mdp.order=fifo",
                          f"cluster.tiers=[{{name: only, compute: 4.0, memory_gb: 32, "
                          f"count: {args.servers}}}]"])
    questions = [f"question {i} " + "?" * (i % MAX_TOOL_CALLS) for i in range(args.agents)]
    with LocalHeteroCluster(env.cluster) as cluster:
        if args.service:  # the service's order: fifo (its env's mdp.order is unset)
            svc = LocalService(cluster, {"policy": "eft", "live": {
                "time_scale": args.time_scale, "fair_share": not args.no_fair_share}})
            svc.start()
            try:
                svc.wait_accepting()
                r = compare(None, questions, args.rounds)
            finally:
                svc.stop()
        else:
            cfg = LiveConfig(time_scale=args.time_scale)
            with LiveScheduler(get_policy("eft", env), env, cfg) as sched:
                r = compare(sched, questions, args.rounds)
    m = r["mean_response_s"]
    print(f"{args.agents} LangGraph agents on {args.servers} servers "
          f"({'the service' if args.service else 'in process'}), {args.rounds} rounds: mean "
          f"response {m['program']:.3f} s as programs, {m['per_call']:.3f} s call by call: "
          f"{rel(r['program_vs_per_call_rel_diff'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
