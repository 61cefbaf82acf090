"""The placement service: decisions in process (encoder equality, the simulator's decision loop),
then a real Serve application on a local Ray answering real HTTP (same decisions, /v1/schedule
against the simulator, malformed input, policy swap under load), then the deployment configs."""

from __future__ import annotations

import math
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from envs.config import ConfigError, replace
from envs.encoding import Described, ServerView, TaskView, encode
from envs.order import SERVING_ORDER
from envs.simulator import DONE, READY, RUNNING, Simulator
from scale_ray.config import REPO_ROOT, load_env
from scale_ray.ports import free_port
from policies.base import ObservationPolicy, Policy
from policies.guard import GuardConfig
from serve_apps.decisions import (RequestError, RequestServers, RequestState, TaskRow, load,
                                  place, prepare_place)
from serve_apps.schedule import schedule
from serve_apps.placement import Tuning, parse_args
from serve_apps.schemas import PlaceRequest, ScheduleRequest

TIERS = ((1.0, 8.0, 30.0, 100.0), (2.0, 32.0, 50.0, 200.0), (4.0, 80.0, 80.0, 400.0))


# ------------------------------------------------------------------------------- helpers
def random_place_body(n: int, rng: np.random.Generator, parent: bool = True) -> dict:
    """A /v1/place body with ``n`` servers of the paper's tiers, some busy."""
    servers = []
    for i in range(n):
        c, m, idle_w, busy_w = TIERS[int(rng.choice(3, p=[0.25, 0.625, 0.125]))]
        busy = bool(rng.random() < 0.4)
        servers.append({"id": f"s{i}", "compute": c, "memory_gb": m,
                        "remaining_s": float(rng.exponential(2.0)) if busy else 0.0,
                        "power_w": busy_w if busy else idle_w})
    servers[int(rng.integers(n))].update(memory_gb=80.0)  # something always fits
    task = {"compute_gflop": float(rng.uniform(1, 8)), "memory_gb": float(rng.uniform(0.5, 40)),
            "output_gb": float(rng.exponential(0.5)), "successors": int(rng.integers(0, 4)),
            "completion_ratio": float(rng.uniform(0, 1))}
    if parent:
        task.update(parent_server=f"s{int(rng.integers(n))}", parent_output_gb=float(rng.exponential(0.5)))
    return {"task": task, "servers": servers}

RAW = GuardConfig(enabled=False)  # compare the unguarded policy with the simulator's loop


def reference_decision(body: dict, lp) -> tuple[int, np.ndarray | None]:
    """The in-process answer: envs.encoding.Described on plain views, then the policy (a
    learned one: its network's choice through its guard, and its raw scores; a rule: its
    decision, no scores)."""
    ids = [s["id"] for s in body["servers"]]
    t = body["task"]
    parent = t.get("parent_server")
    view = TaskView(t["compute_gflop"], t["memory_gb"], t.get("output_gb", 0.0), t.get("successors", 0),
                    t.get("completion_ratio", 0.0), ids.index(parent) if parent in ids else None,
                    t.get("parent_output_gb", 0.0), has_parent=parent is not None)
    servers = [ServerView(s["compute"], s["memory_gb"], s.get("remaining_s", 0.0), s.get("power_w", 0.0),
                          s.get("accepting", True)) for s in body["servers"]]
    e = lp.encoder
    state = Described(view, servers, e.features, e.bandwidth_gb_s, e.latency_s, e.mask_infeasible,
                      transfer_delays=e.transfer_delays_start, waits=t.get("waits", 0))
    if not isinstance(lp.policy, ObservationPolicy):
        return lp.policy.decide(state), None
    obs = state.observe()
    choice = lp.policy.act(obs)
    if lp.guard is not None:  # what the service answers: the guarded choice, the raw scores
        choice = lp.guard.check(state, choice)[0]
    return choice, lp.policy.scores(obs)


def assert_scores(ans: dict, scores: np.ndarray | None, **tol) -> None:
    if scores is None:
        assert ans["scores"] is None
        return
    np.testing.assert_allclose([-math.inf if s is None else s for s in ans["scores"]], scores,
                               **tol)


def simulator_request(sim: Simulator) -> dict:
    """The simulator's current state as a /v1/schedule body (servers in slot order)."""
    servers = []
    tb = sim.table
    for slot in tb.positions():
        busy = bool(tb.busy[slot])
        servers.append({"id": int(tb.ids[slot]), "compute": float(tb.cpu_speed[slot]),
                        "memory_gb": float(tb.memory_l[slot]),
                        "remaining_s": float(tb.busy_until[slot] - sim.t) if busy else 0.0,
                        "power_w": float(tb.busy_w[slot] if busy else tb.idle_w[slot]),
                        "busy_power_w": float(tb.busy_w[slot]), "accepting": tb.accept_l[slot]})
    by_wf: dict[int, list] = {}
    for tk in sim.tasks:
        if tk.state != DONE:
            by_wf.setdefault(tk.wf.id, []).append(tk)
    workflows = []
    for wid, tasks in sorted(by_wf.items()):
        wf = sim.workflows[wid]
        rows = []
        for tk in tasks:
            done = [p for p in tk.parents if p.state == DONE]
            if tk.first_parent is not None:
                done = [tk.first_parent] + [p for p in done if p is not tk.first_parent]
            rows.append({"id": tk.id, "compute_gflop": tk.compute, "memory_gb": tk.memory_gb,
                         "output_gb": tk.output, "running": tk.state == RUNNING,
                         "parents": [p.id for p in tk.parents if p.state != DONE],
                         "inputs": [{"server": p.sid, "output_gb": p.output} for p in done]})
        workflows.append({"id": wid, "arrival_s": wf.arrival, "size": wf.n, "tasks": rows,
                          "attained_s": wf.level if sim.order.name == "las" else 0.0})
    return {"workflows": workflows, "servers": servers}


def simulator_decisions(sim: Simulator, policy) -> tuple[list, list]:
    """Step the simulator's decision loop until its clock moves: (starts, waits) as
    [(workflow, task, server id)] and [(workflow, task)]."""
    starts, waits = [], []
    while sim.current is not None:
        t0, task = sim.t, sim.current
        a = policy.decide(sim)
        if sim.table.fits_now(a, task.demands):
            starts.append((task.wf.id, task.id, int(sim.table.ids[a])))
        else:
            waits.append((task.wf.id, task.id))
        sim.step(a)
        if sim.t != t0:
            break
    return starts, waits


def fresh_states(env, policy, seed: int, want: int, min_ready: int = 3):
    """Simulators paused at decision instants where no decision was made yet and at least
    ``min_ready`` tasks are ready (the policy itself drives the episode there)."""
    sim = Simulator(env)
    sim.reset(seed)
    policy.reset(seed)
    last_t, found = None, 0
    while sim.current is not None and found < want:
        if sim.t != last_t and sum(tk.state == READY for tk in sim.tasks[-200:]) >= min_ready:
            found += 1
            yield sim
            if sim.current is None:
                return
        last_t = sim.t
        sim.step(policy.decide(sim))


def answer_pairs(ans: dict) -> tuple[list, list]:
    starts = [(a["workflow"], a["task"], a["server"]) for a in ans["assignments"]]
    waits = [(u["workflow"], u["task"]) for u in ans["unassigned"] if u["reason"] == "wait"]
    return starts, waits


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    from policies.artifact import save_untrained, set_inference_threads

    set_inference_threads(1)  # as in a replica; 2 threads on a busy 2-core box are 100x slower
    return save_untrained(tmp_path_factory.mktemp("art") / "crossattn", module="crossattn", seed=3)


@pytest.fixture(scope="module")
def paper_env():
    return load_env(None)


# ------------------------------------------------------------------------------- in process
def test_service_never_offers_a_server_the_task_cannot_fit_by_default(paper_env):
    """The paper-budget policies pick a data-local server too small for the task and, greedy on a
    state that no longer changes, 'wait' for it forever (results/paper/README.md). The service masks
    such servers unless told otherwise: the paper's unmasked action space is opt-in."""
    body = {"task": {"compute_gflop": 4.2, "memory_gb": 13.4, "output_gb": 1.0,
                     "parent_server": "small", "parent_output_gb": 1.0},
            "servers": [{"id": "small", "compute": 1.0, "memory_gb": 8.0},
                        {"id": "medium", "compute": 2.0, "memory_gb": 32.0}]}
    req = PlaceRequest.model_validate(body)
    default = parse_args({}).mask_infeasible
    assert default is True and parse_args({"mask_infeasible": "null"}).mask_infeasible is None
    offered = {mask: prepare_place(req, load("eft", paper_env, None, mask), 100).observe()["action_mask"]
               for mask in (default, False)}
    assert offered[True].tolist() == [0.0, 1.0] and offered[False].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("n", [1, 4, 48, 300])
@pytest.mark.parametrize("mask_infeasible", [False, True])
def test_observation_equals_encode(n, mask_infeasible, paper_env):
    """The service's incremental observation is exactly envs.encoding.encode's."""
    rng = np.random.default_rng(n)
    lp = load("eft", paper_env, mask_infeasible=mask_infeasible)
    for k in range(20):
        body = random_place_body(n, rng, parent=k % 3 != 0)
        if k % 5 == 4:  # parent on a server that left
            body["task"]["parent_server"] = "gone"
        for s in body["servers"][::7]:
            s["accepting"] = False
        body["servers"][0]["accepting"] = True
        body["servers"][0]["memory_gb"] = 80.0
        req = PlaceRequest.model_validate(body)
        table = RequestServers(req.servers, lp.encoder, 10_000)
        t = req.task
        slot = -1 if t.parent_server is None else table.position.get(t.parent_server, -2)
        got = RequestState(table, TaskRow(t.compute_gflop, t.memory_gb, t.output_gb, t.successors,
                                          t.completion_ratio, slot, t.parent_output_gb),
                           lp.encoder).observe()
        ids = [s["id"] for s in body["servers"]]
        view = TaskView(t.compute_gflop, t.memory_gb, t.output_gb, t.successors, t.completion_ratio,
                        ids.index(t.parent_server) if t.parent_server in ids else None,
                        t.parent_output_gb, has_parent=t.parent_server is not None)
        views = [ServerView(s.compute, s.memory_gb, s.remaining_s, s.power_w, s.accepting)
                 for s in req.servers]
        want = encode(view, views, lp.encoder.features, 10.0, 0.01, mask_infeasible)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("spec", ["eft", "crossattn"])
@pytest.mark.parametrize("hol,order", [(True, "hop"), (False, "hop"), (False, "fifo"),
                                       (False, "srpt"), (False, "las")])
def test_schedule_equals_simulator_loop(spec, hol, order, artifact, paper_env):
    """/v1/schedule's logic on an exported simulator state = stepping the simulator's loop,
    under the paper's order and the workflow-first ones (srpt: the request's listed work; las:
    its attained_s)."""
    env = replace(paper_env, workload={"arrival_rate_16": 1.6, "horizon_s": 60.0},
                  mdp={"head_of_line_blocking": hol, "order": order})
    name = str(artifact) if spec == "crossattn" else spec
    lp = load(name, env, guard=RAW)  # the raw policy's decisions (the guard: tests/test_guard.py)
    checked = waits_seen = 0
    for sim in fresh_states(env, load(name, env).policy, seed=7, want=25):
        body = simulator_request(sim)
        ans = schedule(ScheduleRequest.model_validate(body), lp, 10_000, 10_000)
        starts, waits = simulator_decisions(sim, lp.policy)
        assert answer_pairs(ans) == (starts, waits)
        ready = sum(1 for w in body["workflows"] for t in w["tasks"]
                    if not t["running"] and not t["parents"])
        assert len(ans["assignments"]) + len(ans["unassigned"]) == ready
        checked += 1
        waits_seen += len(waits)
    assert checked == 25
    if spec == "eft":
        assert waits_seen > 0  # the high load makes the loop meet busy servers


@pytest.mark.parametrize("order", ["hop", None])
def test_schedule_orders_by_critical_path(paper_env, order):
    """mdp.order hop: longest hop path to a sink goes first; ties by arrival; each pick marks a
    server busy. Unset: Serve's default, fifo (envs.order.SERVING_ORDER): the oldest workflow
    first."""
    lp = load("fastest-idle", replace(paper_env, mdp={"order": order}))
    assert lp.encoder.order == (order or "fifo") and lp.info["order"] == lp.encoder.order
    body = {"servers": [{"id": "big", "compute": 4.0, "memory_gb": 80.0},
                        {"id": "mid", "compute": 2.0, "memory_gb": 32.0}],
            "workflows": [
                {"id": "late", "arrival_s": 5.0, "tasks": [
                    {"id": "a", "compute_gflop": 1.0, "memory_gb": 1.0},
                    {"id": "b", "compute_gflop": 1.0, "memory_gb": 1.0, "parents": ["a"]},
                    {"id": "c", "compute_gflop": 1.0, "memory_gb": 1.0, "parents": ["b"]}]},
                {"id": "early", "arrival_s": 1.0, "tasks": [
                    {"id": "x", "compute_gflop": 1.0, "memory_gb": 1.0},
                    {"id": "y", "compute_gflop": 1.0, "memory_gb": 1.0}]},
                {"id": "deep", "arrival_s": 9.0, "tasks": [
                    {"id": "p", "compute_gflop": 1.0, "memory_gb": 1.0},
                    {"id": "q", "compute_gflop": 1.0, "memory_gb": 1.0, "parents": ["p"]}]}]}
    ans = schedule(ScheduleRequest.model_validate(body), lp, 100, 100)
    got = ([(a["task"], a["server"]) for a in ans["assignments"]],
           [(u["task"], u["reason"]) for u in ans["unassigned"]])
    if order == "hop":
        # ranks: a=2 (late), p=1 (deep), x=y=0 (early); two idle servers -> a on big, p on mid
        assert got == ([("a", "big"), ("p", "mid")], [("x", "wait"), ("y", "blocked")])
    else:  # early (arrived at 1) first, then late (5), then deep (9)
        assert got == ([("x", "big"), ("y", "mid")], [("a", "wait"), ("p", "blocked")])


def test_place_matches_reference_in_process(artifact, paper_env):
    rng = np.random.default_rng(1)
    for spec in ("eft", str(artifact)):
        lp = load(spec, paper_env, guard=RAW)
        for n in (4, 16, 48, 300):
            body = random_place_body(n, rng)
            ans = place(PlaceRequest.model_validate(body), lp, 10_000)
            choice, scores = reference_decision(body, lp)
            assert ans["index"] == choice and ans["server"] == f"s{choice}"
            assert_scores(ans, scores)


def test_batched_scoring_equals_one_by_one(artifact, paper_env):
    """/v1/place batches pad the server axis (mask 0); the answers equal unbatched ones."""
    from serve_apps.decisions import decide, decide_batch, prepare_place

    lp = load(str(artifact), paper_env, guard=RAW)
    assert lp.batched
    rng = np.random.default_rng(8)
    preps = [prepare_place(PlaceRequest.model_validate(random_place_body(n, rng)), lp, 10_000)
             for n in (3, 48, 17, 300, 48)]
    batched = decide_batch(lp, preps)
    for p, (choice, scores) in zip(preps, batched):
        want_choice, want_scores = decide(lp, p)
        assert choice == want_choice
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)


def test_request_errors_in_process(paper_env):
    lp = load("eft", paper_env)
    body = random_place_body(5, np.random.default_rng(0))
    with pytest.raises(RequestError, match="limit of 4"):
        place(PlaceRequest.model_validate(body), lp, 4)
    body["servers"][3]["id"] = "s1"
    with pytest.raises(RequestError, match="duplicate server id 's1'") as e:
        place(PlaceRequest.model_validate(body), lp, 100)
    assert e.value.loc == ["body", "servers", 3, "id"]


def test_app_args_and_tuning_are_validated():
    a = parse_args({"policy": "eft", "seed": "3", "head_of_line_blocking": "false",
                    "tuning": {"max_servers": 64}})
    assert a.seed == 3 and a.head_of_line_blocking is False and a.tuning.max_servers == 64
    with pytest.raises(ConfigError, match="args.tuning.max_batch_size"):
        parse_args({"tuning": {"max_batch_size": 0}})
    with pytest.raises(ConfigError, match="unknown key args.polcy"):
        parse_args({"polcy": "eft"})
    assert Tuning().max_batch_size >= 1


# ------------------------------------------------------------------------------- configs
def test_serve_config_names_the_app():
    cfg = yaml.safe_load((REPO_ROOT / "configs/serve/placement.yaml").read_text())
    assert cfg["http_options"]["host"] == "127.0.0.1"
    (app,) = cfg["applications"]
    assert app["import_path"] == "serve_apps.placement:build_app"
    parse_args(app.get("args"))  # the args validate
    dep = {d["name"]: d for d in app["deployments"]}["PlacementService"]
    from envs.config import build
    build(Tuning, dep["user_config"], "user_config")
    assert dep["max_ongoing_requests"] >= dep["user_config"]["max_batch_size"]
    from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.parse_obj(cfg)  # what `serve run` / `serve deploy` validate


def test_kuberay_manifests_name_the_entry_points():
    kdir = REPO_ROOT / "configs/kuberay"
    service = yaml.safe_load((kdir / "rayservice.yaml").read_text())
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    serve_cfg = yaml.safe_load(service["spec"]["serveConfigV2"])
    from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.parse_obj(serve_cfg)
    apps = {a["name"]: a for a in serve_cfg["applications"]}
    assert set(apps) == {"placement", "scheduler"}  # the scheduler: tests/test_service.py
    app = apps["placement"]
    assert app["import_path"] == "serve_apps.placement:build_app"
    parse_args(app.get("args"))
    job = yaml.safe_load((kdir / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"].split()[:3] == ["scale-ray", "train", "configs/train/scale.yaml"]
    for doc in (service["spec"]["rayClusterConfig"], job["spec"]["rayClusterSpec"]):
        assert doc["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    # the module named by the import path exists and exposes the builder
    import importlib
    mod, attr = app["import_path"].split(":")
    assert callable(getattr(importlib.import_module(mod), attr))


# ------------------------------------------------------------------------------- real Serve
def serve_config(artifact: Path, eft_policy: str = "eft", ca_policy: str | None = None) -> dict:
    """configs/serve/placement.yaml with two apps: eft at /, the artifact at /ca."""
    cfg = yaml.safe_load((REPO_ROOT / "configs/serve/placement.yaml").read_text())
    (app,) = cfg.pop("applications")
    cfg.pop("http_options")  # Serve is already started on the test's own port
    dep = app["deployments"][0]
    dep["logging_config"] = {"enable_access_log": False}
    dep["user_config"]["max_servers"] = 512
    # the artifact is an untrained test network, served on purpose: past the gate by force
    forced = {**app["args"], "policy_gate": {"force": True}}
    eft = {**app, "args": {**forced, "policy": "eft"},  # the YAML's default is the shipped SCALE
           "deployments": [{**dep, "user_config": {**dep["user_config"], "policy": eft_policy}}]}
    ca = {**app, "name": "ca", "route_prefix": "/ca", "args": {**forced, "policy": str(artifact)},
          "deployments": [{**dep, "user_config": {**dep["user_config"], "policy": ca_policy}}]}
    return {**cfg, "applications": [eft, ca]}


def deploy(config: dict, timeout_s: float = 120.0) -> None:
    """Deploy like `serve deploy` / a RayService update (user_config changes reconfigure
    replicas in place) and wait until every application runs."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema.parse_obj(config))
    deadline = time.monotonic() + timeout_s
    names = {a["name"] for a in config["applications"]}
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if names <= set(apps) and all(apps[n].status == "RUNNING" for n in names):
            return
        time.sleep(0.25)
    raise TimeoutError(f"applications not running after {timeout_s} s: {serve.status()}")


@pytest.fixture(scope="module")
def served(artifact):
    """The shipped serve config on a local Ray: eft at /, the untrained cross-attention
    artifact at /ca."""
    import httpx
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-serve-test-", dir="/tmp"))
    try:
        port = free_port()  # outside the ephemeral range Ray's own servers draw from
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy(serve_config(artifact))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client, port
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow
def test_http_place_equals_in_process(served, artifact, paper_env):
    client, _ = served
    rng = np.random.default_rng(5)
    mask = parse_args({}).mask_infeasible  # the deployed apps run with the default arguments
    for prefix, spec in (("", "eft"), ("/ca", str(artifact))):
        lp = load(spec, paper_env, mask_infeasible=mask)  # the deployed default: guarded
        for n in (4, 16, 48, 300):
            for _ in range(3):
                body = random_place_body(n, rng)
                r = client.post(f"{prefix}/v1/place", json=body)
                assert r.status_code == 200, r.text
                ans = r.json()
                choice, scores = reference_decision(body, lp)
                assert ans["server"] == f"s{choice}" and ans["index"] == choice
                assert_scores(ans, scores, rtol=1e-6)
                assert ans["policy_version"] == lp.info["version"]


@pytest.mark.slow
def test_http_schedule_equals_simulator_loop(served, artifact, paper_env):
    client, _ = served
    # the service masks never-fitting servers by default and orders ready tasks by its default
    # (fifo, envs.order.SERVING_ORDER): the simulator does the same here
    env = replace(paper_env, workload={"arrival_rate_16": 1.6, "horizon_s": 40.0},
                  mdp={"mask_infeasible": parse_args({}).mask_infeasible,
                       "order": SERVING_ORDER})
    for prefix, spec in (("", "eft"), ("/ca", str(artifact))):
        lp = load(spec, env)  # the deployed default: a learned policy answers through its guard
        n = 0
        for sim in fresh_states(env, load(spec, env).policy, seed=11, want=4, min_ready=4):
            r = client.post(f"{prefix}/v1/schedule", json=simulator_request(sim))
            assert r.status_code == 200, r.text
            assert answer_pairs(r.json()) == simulator_decisions(sim, lp.policy)
            n += 1
        assert n == 4


@pytest.mark.slow
def test_policy_info_health_docs_and_handle(served, artifact):
    from ray import serve

    client, _ = served
    info = client.get("/ca/v1/policy").json()
    meta = __import__("json").loads((artifact / "policy.json").read_text())
    assert info["checksum"] == meta["checksum"] and info["version"] == meta["version"]
    assert info["algorithm"] == "untrained" and info["train_servers"] == 16
    assert info["encoder"]["bandwidth_gb_s"] == 10.0
    assert client.get("/v1/policy").json()["name"] == "eft"
    assert client.get("/-/healthz").status_code == 200
    assert set(client.get("/-/routes").json()) == {"/", "/ca"}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/place", "/v1/schedule", "/v1/policy"} <= set(paths)
    body = random_place_body(8, np.random.default_rng(2))
    h = serve.get_app_handle("placement")
    assert h.decide.remote(body).result() == client.post("/v1/place", json=body).json()
    sched = {"servers": [{"id": "s", "compute": 1.0, "memory_gb": 8.0}],
             "workflows": [{"id": "w", "tasks": [{"id": "a", "compute_gflop": 1.0, "memory_gb": 1.0}]}]}
    assert h.decide_schedule.remote(sched).result()["assignments"] == [
        {"workflow": "w", "task": "a", "server": "s", "index": 0, "guard": None}]
    assert info["guard"]["enabled"] and info["guard"]["max_waits"] == 10
    assert client.get("/v1/policy").json()["guard"] == {"enabled": False}  # heuristics: never


def _malformed_cases() -> list[tuple[str, str, object, str]]:
    """(name, route, body (dict, or bytes sent raw), a fragment the error must contain)."""
    base = random_place_body(4, np.random.default_rng(9))

    def with_(path: str, value, b=None):
        b = __import__("copy").deepcopy(b or base)
        node = b
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k) if k.isdigit() else k]
        last = keys[-1]
        if value is _DROP:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value
        return b

    many = {"task": base["task"], "servers": [dict(base["servers"][0], id=f"x{i}") for i in range(600)]}
    sched = {"workflows": [{"id": "w", "tasks": [{"id": "a", "compute_gflop": 1.0, "memory_gb": 1.0}]}],
             "servers": [{"id": "s", "compute": 1.0, "memory_gb": 8.0}]}
    return [
        ("not json", "/v1/place", b"{not json", "JSON"),
        ("empty body", "/v1/place", b"", "body"),
        ("json array", "/v1/place", b"[1, 2]", "body"),
        ("missing task", "/v1/place", with_("task", _DROP), "task"),
        ("missing servers", "/v1/place", with_("servers", _DROP), "servers"),
        ("empty servers", "/v1/place", with_("servers", []), "servers"),
        ("too many servers", "/v1/place", many, "limit of 512"),
        ("compute string", "/v1/place", with_("servers.0.compute", "fast"), "compute"),
        ("compute numeric string", "/v1/place", with_("servers.0.compute", "2.0"), "compute"),
        ("compute bool", "/v1/place", with_("servers.0.compute", True), "compute"),
        ("compute zero", "/v1/place", with_("servers.0.compute", 0), "compute"),
        ("NaN memory", "/v1/place", b'{"task": {"compute_gflop": 1, "memory_gb": NaN}, '
                                    b'"servers": [{"id": "a", "compute": 1, "memory_gb": 8}]}', "memory_gb"),
        ("Infinity remaining", "/v1/place", b'{"task": {"compute_gflop": 1, "memory_gb": 1}, "servers": '
                                            b'[{"id": "a", "compute": 1, "memory_gb": 8, "remaining_s": Infinity}]}',
         "remaining_s"),
        ("overflow to inf", "/v1/place", b'{"task": {"compute_gflop": 1e999, "memory_gb": 1}, '
                                         b'"servers": [{"id": "a", "compute": 1, "memory_gb": 8}]}', "compute_gflop"),
        ("negative memory", "/v1/place", with_("task.memory_gb", -1.0), "memory_gb"),
        ("negative output", "/v1/place", with_("task.output_gb", -0.5), "output_gb"),
        ("negative remaining", "/v1/place", with_("servers.1.remaining_s", -2.0), "remaining_s"),
        ("ratio above 1", "/v1/place", with_("task.completion_ratio", 1.5), "completion_ratio"),
        ("successors float", "/v1/place", with_("task.successors", 1.5), "successors"),
        ("duplicate ids", "/v1/place", with_("servers.1.id", "s0"), "duplicate server id"),
        ("empty id", "/v1/place", with_("servers.0.id", ""), "id"),
        ("null id", "/v1/place", with_("servers.0.id", None), "id"),
        ("unknown field", "/v1/place", with_("servers.0.speed", 3.0), "speed"),
        ("task fits no server", "/v1/place", with_("task.memory_gb", 500.0), "fits no accepting server"),
        ("no accepting server", "/v1/place",
         {"task": base["task"], "servers": [dict(s, accepting=False) for s in base["servers"]]},
         "no server is accepting"),
        ("servers not a list", "/v1/place", with_("servers", {"id": "a"}), "servers"),
        ("schedule no workflows", "/v1/schedule", dict(sched, workflows=[]), "workflows"),
        ("schedule unknown parent", "/v1/schedule",
         with_("workflows.0.tasks.0.parents", ["zz"], sched), "unknown task 'zz'"),
        ("schedule cycle", "/v1/schedule",
         {"servers": sched["servers"], "workflows": [{"id": "w", "tasks": [
             {"id": "a", "compute_gflop": 1.0, "memory_gb": 1.0, "parents": ["b"]},
             {"id": "b", "compute_gflop": 1.0, "memory_gb": 1.0, "parents": ["a"]}]}]}, "cycle"),
        ("schedule duplicate task", "/v1/schedule",
         with_("workflows.0.tasks", [sched["workflows"][0]["tasks"][0]] * 2, sched), "duplicate task id"),
        ("schedule task fits no server", "/v1/schedule",
         with_("workflows.0.tasks.0.memory_gb", 9.0, sched), "fits no accepting server"),
        ("schedule size too small", "/v1/schedule", with_("workflows.0.size", 0, sched), "size"),
        ("schedule negative arrival", "/v1/schedule", with_("workflows.0.arrival_s", -1.0, sched), "arrival_s"),
        ("schedule negative attained", "/v1/schedule", with_("workflows.0.attained_s", -1.0, sched),
         "attained_s"),
        ("schedule attained not a number", "/v1/schedule",
         with_("workflows.0.attained_s", "lots", sched), "attained_s"),
    ]


_DROP = object()


@pytest.mark.slow
def test_malformed_requests_are_4xx_naming_the_field(served):
    client, _ = served
    cases = _malformed_cases()
    assert len(cases) >= 20
    for name, route, body, fragment in cases:
        if isinstance(body, bytes):
            r = client.post(route, content=body, headers={"content-type": "application/json"})
        else:
            r = client.post(route, json=body)
        assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
        detail = r.json()["detail"]
        text = " ".join(f"{'.'.join(map(str, d['loc']))} {d['msg']}" for d in detail)
        assert fragment in text, (name, text)
    assert client.get("/v1/place").status_code == 405
    assert client.post("/v1/place", content=b"a=1",
                       headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 422


def place_loop(port: int, body: dict, stop, results: list) -> None:
    """POST ``body`` to /v1/place until ``stop`` is set; append (status, answering policy or
    error text) per request, (-1, repr) for a transport failure."""
    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        while not stop.is_set():
            try:
                r = c.post("/v1/place", json=body)
                results.append((r.status_code, r.json().get("policy", r.text)))
            except Exception as e:  # noqa: BLE001 - a transport failure counts as a failure
                results.append((-1, repr(e)))


@pytest.mark.slow
def test_policy_swap_under_load_has_no_failed_requests(served, artifact):
    """Swap eft -> artifact -> eft through user_config while 3 clients send requests."""
    import httpx

    client, port = served
    body = random_place_body(16, np.random.default_rng(4))
    stop = threading.Event()
    results: list[tuple[int, str]] = []

    def hammer():
        place_loop(port, body, stop, results)

    loaded_at = client.get("/v1/policy").json()["loaded_at"]
    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        for spec in (str(artifact), "eft"):
            deploy(serve_config(artifact, eft_policy=spec))
            deadline = time.monotonic() + 60
            while client.get("/v1/policy").json()["spec"] != spec:
                assert time.monotonic() < deadline, "the policy was not swapped"
                time.sleep(0.1)
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    failures = [r for r in results if r[0] != 200]
    assert not failures, failures[:5]
    names = [p for _, p in results]
    assert "untrained-crossattn" in names and names[-1] == "eft"
    assert len(results) > 50
    info = client.get("/v1/policy").json()
    assert info["swaps"] == 2  # the same replica reconfigured in place, twice
    assert info["loaded_at"] > loaded_at


@pytest.mark.slow
def test_lookahead_served_on_schedule_after_a_swap(served, artifact):
    """user_config.policy: lookahead on the /ca app: /v1/schedule plans (a task waits for the
    fast busy server holding its input), a running task without its server is a 422 naming the
    field, /v1/place is a 422 pointing to /v1/schedule; then back to the artifact."""
    client, _ = served
    body = {"workflows": [
        {"id": "w1", "arrival_s": 0.0, "tasks": [
            {"id": "a", "compute_gflop": 8.0, "memory_gb": 1.0, "output_gb": 0.5,
             "inputs": [{"server": "fast", "output_gb": 0.5}]},
            {"id": "b", "compute_gflop": 8.0, "memory_gb": 1.0, "parents": ["a"]},
            {"id": "r", "compute_gflop": 8.0, "memory_gb": 1.0, "running": True, "server": "fast"}]}],
        "servers": [{"id": "slow", "compute": 1.0, "memory_gb": 64.0},
                    {"id": "fast", "compute": 8.0, "memory_gb": 64.0, "remaining_s": 0.5}],
        "now_s": 1.0}
    try:
        deploy(serve_config(artifact, ca_policy="lookahead"))
        deadline = time.monotonic() + 60
        while client.get("/ca/v1/policy").json()["spec"] != "lookahead":
            assert time.monotonic() < deadline, "the policy was not swapped"
            time.sleep(0.1)
        r = client.post("/ca/v1/schedule", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["unassigned"] == [{"workflow": "w1", "task": "a", "reason": "wait",
                                           "guard": None}]
        assert r.json()["policy"] == "lookahead"
        body["workflows"][0]["tasks"][2].pop("server")
        r = client.post("/ca/v1/schedule", json=body)
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "workflows", 0, "tasks", 2, "server"]
        r = client.post("/ca/v1/place", json=random_place_body(4, np.random.default_rng(0)))
        assert r.status_code == 422 and "use /v1/schedule" in r.text
    finally:
        deploy(serve_config(artifact))


# ------------------------------------------------------------------------------- benchmark inputs
def test_bench_bodies_are_valid_and_give_64_decisions(paper_env):
    """The benchmark's generated requests pass validation; a schedule body has 64 ready tasks."""
    from scale_ray.bench.serve import SCHEDULE_TASKS, format_result, place_body, schedule_body

    rng = np.random.default_rng(0)
    lp = load("eft", paper_env, head_of_line_blocking=False)
    for n in (16, 1024):
        ans = place(PlaceRequest.model_validate(place_body(n, rng)), lp, 4096)
        assert 0 <= ans["index"] < n
    ans = schedule(ScheduleRequest.model_validate(schedule_body(rng, paper_env)), lp, 4096, 4096)
    decisions = len(ans["assignments"]) + sum(u["reason"] == "wait" for u in ans["unassigned"])
    assert decisions == SCHEDULE_TASKS
    text = format_result({"policy": "eft", "policy_version": "builtin", "requests": 10, "errors": 0,
                          "cpus": 2, "latency_ms": {"48": {"p50": 1.0, "p99": 2.0, "mean": 1.1}},
                          "inprocess_ms": {"48": 0.1}, "inprocess_policy_ms": {"48": 0.05},
                          "decisions_per_s_c32": 100.0, "schedule_decisions_per_s": 3000.0,
                          "schedule_decisions_per_request": 64.0, "schedule_servers": 128})
    assert "p50" in text and "10x" in text
