"""Agent programs in the live scheduler (scale_ray/live/programs.py): steps submitted one at a time
are ordered as one request. The unit tests need no cluster; the live ones share one 1-server
local cluster."""

from __future__ import annotations

import pytest
from processes import local_cluster

from policies import get_policy
from scale_ray.live import LiveConfig, LiveScheduler, Primitive
from scale_ray.live.programs import Program, ProgramClosed
from scale_ray.live.workflow import emulated_body

ONE = ["cluster.servers=1", "mdp.order=fifo",
       "cluster.tiers=[{name: only, compute: 1.0, memory_gb: 32, count: 1}]"]
TS = 0.25  # wall s per model s


class _Rec:
    wid, level = 0, 0.0


class _Sched:
    def __init__(self):
        self.calls = []

    def submit(self, *a, **kw):
        self.calls.append((a, kw))
        return "not a handle"


def test_admission_keys_a_later_step_by_its_program():
    """No Ray: the second step of a program is keyed with the program's tie breaker (its first
    step's admission number) and, under ``las``, the service the program attained so far."""
    from scale_ray.config import load_env
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.workflow import from_spec
    from envs.workflow import TaskSpec, WorkflowSpec

    env = load_env(None, ["mdp.order=las"], servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0))
    prog = Program(sched, "react", None, 0.0)
    spec = WorkflowSpec((TaskSpec(2.0, 1.0, 0.0),), "step")
    first, second = WorkflowHandle(0, from_spec(spec), 0.0), WorkflowHandle(1, from_spec(spec), 0.0)
    first.program = second.program = prog
    sched.admission.admit(first)
    prog.ran(3.0)
    sched.admission.admit(second)
    a, b = first.live_record, second.live_record
    assert b.wid == a.wid and b.wid != sched.admission.next_gid - 1
    assert (a.level, b.level) == (0.0, 3.0)
    assert b.tasks[0].key[:3] == (3.0, 0.0, a.wid)  # (level, arrival, workflow, -rank)


def test_program_keys_its_steps_and_closes():
    sched = _Sched()
    prog = Program(sched, "react", "team-a", 12.5)
    prog.submit("wf", 1, x=2)
    (args, kw), = sched.calls
    assert args == ("wf", 1) and kw == {"name": "react", "tenant": "team-a", "program": prog,
                                         "x": 2}
    first, second = _Rec(), _Rec()
    prog.admitted(first, 40)
    prog.ran(3.0)
    prog.admitted(second, 97)
    assert (first.wid, second.wid) == (40, 40)  # the first step's admission number
    assert prog.attained == 3.0  # las keys the next step at the service attained so far
    with prog:
        pass
    assert prog.closed and prog.response_s is None  # no step finished (none was a handle)
    with pytest.raises(ProgramClosed, match="closed"):
        prog.submit("wf")


@pytest.fixture(scope="module")
def one_server():
    for _, env in local_cluster(ONE):
        yield env


def _prim(name: str, gflop: float) -> Primitive:
    return Primitive(emulated_body, compute_gflop=gflop, name=name, emulate=True)


@pytest.mark.slow
@pytest.mark.parametrize("as_program", [True, False])
def test_a_later_step_goes_before_a_newer_request_only_as_a_program(one_server, as_program):
    env = one_server
    with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=TS)) as sched:
        prog = sched.program("agent")
        first = prog.submit([_prim("think", 1.0).bind(0)])
        first.result(timeout=60)  # the agent reads the answer, then...
        blocker = sched.submit([_prim("blocker", 2.0).bind(0)], "blocker")  # the server busy
        newer = sched.submit([_prim("other", 1.0).bind(0)], "newer")  # a newer request waits
        step = (prog.submit if as_program else sched.submit)([_prim("act", 1.0).bind(0)])
        prog.close()
        for h in (blocker, newer, step):
            h.result(timeout=60)
        assert prog.wait(timeout=30)
        # fifo: the step keeps its program's arrival (older than the newer request's) only as a
        # step of the program; submitted alone it arrives last and runs last
        assert (step.finished_wall < newer.finished_wall) == as_program
        if as_program:
            assert step.live_record.arrival == prog.arrival
            assert step.live_record.wid == first.live_record.wid
            assert prog.response_s == pytest.approx(step.finished_wall - prog.started_wall)
        else:
            assert step.live_record.arrival > newer.live_record.arrival


@pytest.mark.slow
def test_bench_agents_submit_call_by_call_in_both_modes(one_server):
    from envs.workflow import TaskSpec, WorkflowSpec
    from scale_ray.bench.programs_live import run_live
    env = one_server
    # think -> (tool, tool) -> answer: 4 GFLOP in all, 1 GFLOP/s: at least 4 model s each
    fan = WorkflowSpec((TaskSpec(1.0, 1.0, 0.0), TaskSpec(1.0, 1.0, 0.0, (0,)),
                        TaskSpec(1.0, 1.0, 0.0, (0,)), TaskSpec(1.0, 1.0, 0.0, (1, 2))), "fan")
    for mode in ("per_call", "program"):
        resp = run_live(env, [fan, fan], [0.0, 0.5], TS, mode, timeout_s=120)
        assert len(resp) == 2 and all(r >= 4.0 for r in resp), (mode, resp)
        # one server, 8 s of work from t = 0: the last request ends after 8 model s
        assert max(r + t for r, t in zip(resp, (0.0, 0.5))) >= 8.0


def _registry():
    """serve_apps.registry.Workflows over a fake LiveScheduler (what accept, append and
    program_of use of it) and its tuning."""
    from scale_ray.live.handles import WorkflowHandle
    from serve_apps.registry import Workflows
    from serve_apps.tenants import IdSigner

    class Sched:
        durable = type("D", (), {"known": lambda self, t, k: None, "journal": None, "closes": [],
                                 "close_program": lambda self, h: self.closes.append(h.jid)})()
        policy = type("P", (), {"name": "eft"})()
        admission = type("A", (), {"work_s": lambda self, wf: [1.0] * len(wf.calls)})()
        alive_servers = ()  # (no server: the floor's run at speed 1)

        def __init__(self):
            self.programs = []

        def program(self, name, tenant, started_wall=None):
            self.programs.append(Program(self, name, tenant, 50.0, started_wall))
            return self.programs[-1]

        def submit(self, wf, tenant, key, record, program):
            h = WorkflowHandle(0, wf, 0.0)
            h.jid, h.tenant, h.record = record.id, tenant, record
            if program is not None:
                program.add(h)
            return h

    metrics = type("M", (), {"refused": lambda self, t, r: None,
                             "finished": lambda self, t, p, h: None,
                             "program_finished": lambda self, t, p, s: self.programs.append(
                                 (t, p, s)), "programs": []})()
    tuning = type("T", (), {"max_inflight_per_tenant": 100, "max_queued_tasks_per_tenant": 100,
                            "max_inflight_workflows": 100, "max_queued_tasks": 100,
                            "max_queued_work_s_per_tenant": 1e9, "max_queued_work_s": 1e9,
                            "min_task_share": 1 / 16,
                            "retry_after_s": 5, "retain_finished": 100, "max_tasks": 100})()
    sched = Sched()
    reg = Workflows(sched, lambda: tuning, IdSigner("inc1", b"k" * 32), metrics, None, "inc1")
    return sched, reg, tuning


def test_the_service_continues_the_program_of_an_earlier_workflow_of_the_same_tenant():
    from envs.workflow import TaskSpec, WorkflowSpec
    from scale_ray.live.workflow import from_spec
    from serve_apps.schemas import RequestError

    sched, reg, tuning = _registry()
    wf = from_spec(WorkflowSpec((TaskSpec(1.0, 1.0, 0.0),), "step"))
    first = reg.accept(wf, "team-a", "json", b"{}")
    assert reg.handles[first["id"]].program is None  # alone until a later step names it
    second = reg.accept(wf, "team-a", "json", b"{}", program=first["id"])
    third = reg.accept(wf, "team-a", "json", b"{}", program=second["id"])
    h1, h2, h3 = (reg.handles[x["id"]] for x in (first, second, third))
    assert h1.program is h2.program is h3.program is sched.programs[0]
    assert len(sched.programs) == 1 and sched.programs[0].tenant == "team-a"
    assert sched.programs[0].started_wall == h1.submitted_wall  # it began with the first step
    # another tenant cannot continue team-a's program, nor name an unknown, forged or non-ASCII
    # id: 404 naming body.program, nothing queued
    forged = first["id"].rsplit("-", 1)[0] + "-" + "0" * 16
    for tenant, wid in (("team-b", first["id"]), ("team-a", "inc1-00-00"), ("team-a", forged),
                        ("team-a", "inc1-\u00e9\u00fc-\u00f6"), ("team-a", "x" * 5000)):
        with pytest.raises(RequestError) as e:
            reg.accept(wf, tenant, "json", b"{}", program=wid)
        assert (e.value.status, e.value.loc) == (404, ["body", "program"]), wid[:20]
    assert len(reg.handles) == 3
    # over quota: a 429 before the program is looked at, nothing queued
    tuning.max_inflight_per_tenant = 3
    with pytest.raises(RequestError) as e:
        reg.accept(wf, "team-a", "json", b"{}", program=first["id"])
    assert e.value.status == 429 and len(reg.handles) == 3


def test_the_http_body_names_a_program_by_id_and_nothing_else():
    from fastapi.exceptions import RequestValidationError

    from serve_apps.errors import parse_body
    from serve_apps.workflow_api import WorkflowIn
    task = b'"tasks": [{"name": "a", "compute_gflop": 1}]'
    assert parse_body(b'{' + task + b'}', WorkflowIn).program is None
    assert parse_body(b'{' + task + b', "program": "inc1-ab-cd"}', WorkflowIn).program == \
        "inc1-ab-cd"
    for bad in (b'5', b'""', b'"' + b"x" * 201 + b'"', b'["a"]'):
        with pytest.raises(RequestValidationError) as e:
            parse_body(b'{' + task + b', "program": ' + bad + b'}', WorkflowIn)
        assert any(err["loc"][-1] == "program" or "program" in err["loc"]
                   for err in e.value.errors()), bad


def test_appends_name_earlier_outputs_and_every_malformed_one_is_a_4xx():
    import json

    from scale_ray.live.programs import StepResult
    from serve_apps.errors import parse_body
    from serve_apps.registry import UnknownWorkflow
    from serve_apps.schemas import RequestError
    from serve_apps.workflow_api import AllowList, AppendIn, WorkflowIn, to_workflow

    sched, reg, tuning = _registry()

    def doc(tasks, **kw):
        return json.dumps({"tasks": tasks, **kw}).encode()

    first = reg.accept(to_workflow(parse_body(doc([
        {"name": "plan", "compute_gflop": 1}, {"name": "draft", "compute_gflop": 1,
                                               "parents": ["plan"]}]), WorkflowIn),
        AllowList([]), 100), "team-a", "json", b"{}")["id"]

    def append(body, tenant="team-a", wid=first):
        req = parse_body(body, AppendIn)
        return reg.append(wid, tenant, req, body, None, {}, lambda earlier: to_workflow(
            req, AllowList([]), 100, earlier))

    def refused(body, status, loc, tenant="team-a", wid=first):
        with pytest.raises(RequestError) as e:
            append(body, tenant, wid)
        assert (e.value.status, e.value.loc) == (status, loc), e.value.msg
        return e.value.msg

    # a fan-out after the draft, joined in the same append: parent values in listed order
    out = append(doc([{"name": "s1", "compute_gflop": 1, "parents": ["draft"]},
                      {"name": "s2", "compute_gflop": 1, "parents": ["draft"]},
                      {"name": "join", "compute_gflop": 1, "parents": ["s2", "s1"]}]))
    h1, h2 = reg.handles[first], reg.handles[out["id"]]
    assert out["program"] == first and out["waiting_for"] == [first] and out["tasks"] == 3
    assert h2.program is h1.program and h1.program.handles == [h1, h2]
    s1 = h2.workflow.calls[[t.name for t in h2.workflow.spec.tasks].index("s1")]
    (arg,) = [a for a in s1.args if isinstance(a, StepResult)]
    assert arg.handle is h1 and arg.index == 1  # draft: the first step's second task
    assert h2.record.meta == {"program": first, "append": True, "earlier": {"draft": [first, 1]}}
    assert h2.workflow.spec.tasks[0].parents == ()  # the earlier parent is an argument
    # malformed appends: 404 for the id, 422 naming the field, nothing queued
    assert "unique" in refused(doc([{"name": "s1", "compute_gflop": 1}]), 422,
                               ["body", "tasks", 0, "name"])
    assert "neither" in refused(doc([{"name": "x", "compute_gflop": 1, "parents": ["nope"]}]),
                                422, ["body", "tasks", 0, "parents"])
    assert "outputs" in refused(doc([{"name": "x", "compute_gflop": 1, "parents": ["plan"]}]),
                                422, ["body", "tasks", 0, "parents"])
    refused(doc([{"name": "x", "compute_gflop": 1, "parents": ["y", "join"]},
                 {"name": "y", "compute_gflop": 1, "parents": ["x"]}]), 422, ["body", "tasks"])
    refused(doc([]), 422, ["body", "tasks"])
    for tenant, wid in (("team-b", first), ("team-a", "inc1-00-00"), ("team-a", "x" * 5000)):
        with pytest.raises(UnknownWorkflow) as e:  # the app's 404 naming path.id
            append(doc([{"name": "x", "compute_gflop": 1}]), tenant, wid)
        assert not e.value.gone
    assert len(reg.handles) == 2
    # a parent whose step failed: 409
    h1.record_completion(1.0, RuntimeError("boom"))
    assert "did not complete" in refused(doc([{"name": "x", "compute_gflop": 1,
                                               "parents": ["draft"]}]), 409,
                                         ["body", "tasks", 0, "parents"])
    # close (from any step's id), then nothing more: 409
    # a program's steps together are capped as one workflow is (max_tasks): 422, nothing queued
    tuning.max_tasks = 5
    assert "max_tasks=5" in refused(doc([{"name": "x", "compute_gflop": 1}]), 422,
                                    ["body", "tasks"])
    tuning.max_tasks = 100
    assert reg.metrics.programs == []
    assert append(doc([], close=True), wid=out["id"]) == {"program": first, "closed": True}
    assert h1.program.closed and reg.metrics.programs == []  # a step still runs
    assert reg.sched.durable.closes == [first]  # journaled (a resume keeps it closed)
    h2.record_completion(3.0)  # the last step ends: the program counts once, start to end
    assert reg.metrics.programs == [("team-a", "eft", 3.0)]
    reg._program_done("team-a", h1.program)
    assert len(reg.metrics.programs) == 1
    assert "closed" in refused(doc([{"name": "x", "compute_gflop": 1}]), 409, ["path", "id"])
    assert len(reg.handles) == 2


def test_a_held_step_is_released_with_its_inputs_once_the_steps_it_names_are_done():
    from envs.workflow import TaskSpec, WorkflowSpec
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.programs import EarlierStepFailed, StepResult, hold, step_inputs
    from scale_ray.live.workflow import Call, CollectedWorkflow, from_spec

    def handle(tenant, jid, *args):
        wf = from_spec(WorkflowSpec((TaskSpec(1.0, 1.0, 0.0), TaskSpec(1.0, 1.0, 0.0)), "s"))
        if args:
            calls = (Call(wf.calls[0].primitive, args, {"k": args[-1]}), wf.calls[1])
            wf = CollectedWorkflow(wf.spec, calls, wf.outputs)
        h = WorkflowHandle(0, wf, 0.0)
        h.tenant, h.jid = tenant, jid
        return h

    a, b = handle("t", "A"), handle("t", "B")
    released, failed = [], []
    step = handle("t", "S", StepResult(a, 1), 5, StepResult("B", 0))
    needs = step_inputs(step.workflow)
    assert [(i, r.jid, r.index) for i, r in needs] == [(0, "A", 1), (0, "B", 0), (0, "B", 0)]
    hold(step, needs, {"B": b}.get, released.append, lambda h, e: failed.append(e))
    assert (a.pins, b.pins) == (1, 1) and not released
    a.record_task_done(1, "ref-a1", "n", 1.0)
    a.record_completion(1.0)
    assert not released  # B still runs
    b.record_task_done(0, "ref-b0", "n", 2.0)
    b.record_completion(2.0)
    assert released == [step] and not failed
    assert step.workflow.calls[0].args == ("ref-a1", 5, "ref-b0")
    assert step.workflow.calls[0].kwargs == {"k": "ref-b0"}
    step.record_completion(3.0)
    assert (a.pins, b.pins) == (0, 0)
    # another tenant's step, an unknown id, a failed earlier step: failed, never released
    for tenant, ref, done_err in (("u", StepResult(a, 1), None), ("t", StepResult("Z", 0), None),
                                  ("t", StepResult(c := handle("t", "C"), 0), RuntimeError())):
        s = handle(tenant, "S2", ref)
        hold(s, step_inputs(s.workflow), {"B": b}.get, released.append,
             lambda h, e: failed.append(e))
        if done_err is not None:
            c.record_completion(4.0, done_err)
    assert len(released) == 1 and len(failed) == 3
    assert all(isinstance(e, EarlierStepFailed) for e in failed)
    assert "failed" in str(failed[-1]) and "tenant" in str(failed[0])
