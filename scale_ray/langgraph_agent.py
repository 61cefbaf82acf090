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

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence, TypedDict

from scale_ray.agent_steps import Steps
from scale_ray.live.workflow import primitive

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
