"""Real-DAG loaders (envs.loaders): exact shapes and demands of the shipped sample files, the
error for every failure mode (cycle, unknown link, missing field, truncated JSON) naming file and
record, skip-and-count for predicted plans, the family sources, and a short EFT episode per family
checked by the independent trace checker."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from envs import loaders
from envs.config import ConfigError, build, ResourceMappingConfig
from envs.loaders import DATA_DIR
from envs.simulator import Simulator
from envs.trace import verify_trace
from envs.workflow import WorkflowError, WorkflowSpec
from envs.workload import make_source
from scale_ray.commands.workloads import skip_reasons
from scale_ray.families import family_env
from scale_ray.config import load_env

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "configs" / "env" / "workloads" / "base.yaml"


@pytest.fixture(scope="module")
def res() -> ResourceMappingConfig:
    return load_env(BASE).workload.resources


def edges(wf: WorkflowSpec) -> int:
    return sum(len(t.parents) for t in wf.tasks)


def by_name(wf: WorkflowSpec, name: str):
    return next(t for t in wf.tasks if t.name == name)


def check_consistent(wf: WorkflowSpec) -> None:
    """Parents come earlier, children() is exactly the inverse of parents, no duplicate edge."""
    kids = wf.children()
    for i, t in enumerate(wf.tasks):
        assert len(set(t.parents)) == len(t.parents)
        for p in t.parents:
            assert p < i and i in kids[p]
    assert sum(map(len, kids)) == edges(wf)


# ------------------------------------------------------------------------------------------
# One loader test per format on its shipped sample file
# ------------------------------------------------------------------------------------------

def test_wfformat_montage_measured(res):
    path = DATA_DIR / "wfinstances/pegasus/montage/montage-chameleon-2mass-005d-001.json"
    (wf,) = loaders.load_wfformat([path], res).workflows
    assert (len(wf.tasks), edges(wf)) == (58, 114)
    t = by_name(wf, "mProject_ID0000001")  # runtime 16.712 s, avgCPU 97.6723 %, 14.8 MB
    assert t.compute_gflop == pytest.approx(16.712 * 0.976723 * 2.0)
    assert t.memory_gb == pytest.approx(0.0148)
    assert not t.estimated
    # output: the largest edge = bytes of this task's outputs that one child reads
    doc = json.loads(path.read_text())
    spec = {x["id"]: x for x in doc["workflow"]["specification"]["tasks"]}
    sizes = {f["id"]: f["sizeInBytes"] for f in doc["workflow"]["specification"]["files"]}
    me = spec["mProject_ID0000001"]
    expect = max(sum(sizes[f] for f in set(me["outputFiles"]) & set(spec[c]["inputFiles"]))
                 for c in me["children"])
    assert t.output_gb == pytest.approx(expect / 1e9)
    assert t.output_gb > 0
    check_consistent(wf)
    # parents in the file = parents in the spec
    idx = {t.name: i for i, t in enumerate(wf.tasks)}
    for tid, st in spec.items():
        assert sorted(idx[p] for p in st["parents"]) == list(wf.tasks[idx[tid]].parents)


def test_wfformat_without_memory_is_estimated(res):
    path = DATA_DIR / "wfinstances/pegasus/seismology/seismology-chameleon-100p-001.json"
    (wf,) = loaders.load_wfformat([path], res).workflows
    assert (len(wf.tasks), edges(wf)) == (101, 100)
    assert all(t.estimated for t in wf.tasks)
    assert {t.memory_gb for t in wf.tasks} == {res.profile("pegasus_job").memory_gb}
    check_consistent(wf)


def test_flowbench_adjacency(res):
    path = DATA_DIR / "flowbench/adjacency_list_dags/eht_imaging.json"
    (wf,) = loaders.load_flowbench([path], res).workflows
    assert (len(wf.tasks), edges(wf)) == (12, 18)
    aux = by_name(wf, "create_dir_eht-imaging_0_condorpool")
    job = by_name(wf, "eht-imaging_pipeline_ID0000001")
    assert (aux.compute_gflop, aux.memory_gb, aux.estimated) == (0.2, 0.1, True)
    assert (job.compute_gflop, job.memory_gb, job.output_gb) == (3.8, 0.026, 0.000028)
    assert wf.tasks[0].name == "create_dir_eht-imaging_0_condorpool"
    check_consistent(wf)
    (big,) = loaders.load_flowbench([DATA_DIR / "flowbench/adjacency_list_dags/casa_nowcast_full.json"],
                                    res).workflows
    assert (len(big.tasks), edges(big)) == (2081, 4029)


def test_dagbench_measured_op_time(res):
    path = DATA_DIR / "dagbench/workflows/ml_pipelines/gpt2_tensor_sh12_decode/graph.json"
    (wf,) = loaders.load_dagbench([path], res).workflows
    assert (len(wf.tasks), edges(wf)) == (327, 614)
    embed = by_name(wf, "embed")  # cost 0.4816000582650304 ms
    assert embed.compute_gflop == pytest.approx(0.4816000582650304e-3 * 2.0)
    assert embed.memory_gb == res.profile("tensor_op").memory_gb and embed.estimated
    doc = json.loads(path.read_text())["task_graph"]
    assert embed.output_gb == pytest.approx(
        max(d["size"] for d in doc["dependencies"] if d["source"] == "embed") / 1e9)
    assert wf.name == "dagbench/gpt2_tensor_sh12_decode"
    check_consistent(wf)


def test_worfbench_graph_text(res):
    path = DATA_DIR / "worfbench/gold_traj/seal_tools/graph_eval.json"
    out = loaders.load_worfbench([path], res)
    assert len(out.workflows) == 223 and not out.skipped
    assert (len(out.workflows[0].tasks), edges(out.workflows[0])) == (3, 2)  # chain 1-2-3
    first = out.workflows[1]  # three parallel steps: (START,1) (START,2) (START,3) (k,END)
    assert first.name == "worfbench/seal_tools/seal_tools_2"
    assert (len(first.tasks), edges(first)) == (3, 0)
    p = res.profile("agent_step")
    assert (first.tasks[0].compute_gflop, first.tasks[0].memory_gb, first.tasks[0].output_gb) == \
        (p.compute_gflop, p.memory_gb, p.output_gb)
    chain = loaders.load_worfbench([DATA_DIR / "worfbench/gold_traj/toolalpaca/graph_eval.json"],
                                   res).workflows[0]  # (START,1) (1,2) (2,END)
    assert (len(chain.tasks), edges(chain), chain.tasks[1].parents) == (2, 1, (0,))
    for wf in out.workflows:
        check_consistent(wf)


def test_nestful_variable_references(res):
    path = DATA_DIR / "nestful/data/executable/executable-data.json"
    out = loaders.load_nestful([path], res)
    assert len(out.workflows) == 85
    wf = out.workflows[0]  # var1, var2 -> var3 (flights); var4 -> var5 (hotels); var_result dropped
    assert (len(wf.tasks), edges(wf)) == (5, 3)
    names = [t.name for t in wf.tasks]
    flight = wf.tasks[names.index("SkyScrapperFlightSearch")]
    assert sorted(names[p] for p in flight.parents) == ["SkyScrapperSearchAirport"] * 2
    assert (flight.compute_gflop, flight.memory_gb, flight.output_gb) == (0.5, 0.5, 0.0001)
    for wf in out.workflows:
        check_consistent(wf)


def test_nestful_reused_label_resolves_to_latest(res, tmp_path):
    rec = [{"output": [
        {"name": "a", "arguments": {}, "label": "var1"},
        {"name": "b", "arguments": {}, "label": "var1"},
        {"name": "c", "arguments": {"x": "$var1.y$"}, "label": "var2"},
        {"name": "var_result", "arguments": {"r": "$var2$"}}]}]
    f = tmp_path / "n.json"
    f.write_text(json.dumps(rec))
    (wf,) = loaders.load_nestful([f], res).workflows
    assert [t.name for t in wf.tasks] == ["a", "b", "c"] and wf.tasks[2].parents == (1,)


def test_taskbench_gold_modalities(res):
    out = loaders.FAMILIES["taskbench"].load(res)
    assert len(out.workflows) == 50 and not out.skipped
    wf = next(w for w in out.workflows if w.name == "taskbench/30123865")
    # links: Image Editing -> Object Detection -> Text-to-Video, Summarization -> Image Editing
    assert (len(wf.tasks), edges(wf)) == (4, 3)
    assert [t.name for t in wf.tasks] == ["Summarization", "Image Editing", "Object Detection",
                                          "Text-to-Video"]
    summ, edit, det, t2v = wf.tasks
    assert (summ.compute_gflop, summ.output_gb) == (2.0, 0.001)          # text -> text
    assert (edit.compute_gflop, edit.memory_gb, edit.output_gb) == (6.0, 12.0, 0.005)  # image
    assert (det.compute_gflop, det.output_gb) == (6.0, 0.001)             # image -> text
    assert (t2v.compute_gflop, t2v.memory_gb, t2v.output_gb) == (16.0, 24.0, 0.1)  # text -> video
    for w in out.workflows:
        check_consistent(w)


def test_taskbench_unknown_tool_in_gold_takes_default_and_is_counted(res, caplog):
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        out = loaders.FAMILIES["taskbench"].load(res)
    wf = next(w for w in out.workflows if w.name == "taskbench/21313605")
    d = res.default
    assert (wf.tasks[0].compute_gflop, wf.tasks[0].memory_gb) == (d.compute_gflop, d.memory_gb)
    assert "1 task nodes use tools without a description" in caplog.text
    assert "21313605" in caplog.text


def test_gnn4taskplan_predictions_skip_and_count(res, caplog):
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        out = loaders.FAMILIES["gnn4taskplan"].load(res)
    assert out.records == 995
    assert len(out.workflows) + len(out.skipped) == 995
    assert len(out.skipped) == 326
    assert skip_reasons(out.skipped) == {"unknown tool": 284, "self-loop": 37, "unknown link": 1,
                                         "cycle": 4}
    assert "skipped 248 of 497 records" in caplog.text and "skipped 78 of 498 records" in caplog.text
    first = out.workflows[0]  # line 1: ASR -> TTS -> QA, also via <node-k> arguments
    assert first.name == "gnn4taskplan/huggingface/23046980"
    assert (len(first.tasks), edges(first)) == (3, 2)
    for w in out.workflows:
        check_consistent(w)


def test_tmdb_self_linked_tool_chains_its_slots(res):
    wfs = loaders.FAMILIES["gnn4taskplan-tmdb"].load(res).workflows
    assert len(wfs) == 100
    wf = next(w for w in wfs if w.name == "gnn4taskplan-tmdb/78")  # SearchMovie x2, linked to itself
    assert [t.parents for t in wf.tasks] == [(), (0,)]


# ------------------------------------------------------------------------------------------
# Failure modes: each names the file and the record
# ------------------------------------------------------------------------------------------

def write(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    return p


def wfformat_doc(**task_overrides) -> dict:
    tasks = [{"id": "a", "parents": [], "children": ["b"], "inputFiles": [], "outputFiles": ["f"]},
             {"id": "b", "parents": ["a"], "children": [], "inputFiles": ["f"], "outputFiles": []}]
    for k, v in task_overrides.items():
        tasks[1][k] = v
    return {"schemaVersion": "1.5", "workflow": {
        "specification": {"tasks": tasks, "files": [{"id": "f", "sizeInBytes": 2e9}]},
        "execution": {"tasks": [{"id": "a", "runtimeInSeconds": 10.0, "avgCPU": 50.0},
                                {"id": "b", "runtimeInSeconds": 1.0, "avgCPU": 100.0,
                                 "memoryInBytes": 3e9}]}}}


def test_wfformat_small_doc_exact(res, tmp_path):
    (wf,) = loaders.load_wfformat([write(tmp_path, "ok.json", wfformat_doc())], res).workflows
    a, b = wf.tasks
    assert (a.compute_gflop, a.output_gb, a.estimated) == (10.0, 2.0, True)
    assert (b.compute_gflop, b.memory_gb, b.parents, b.estimated) == (2.0, 3.0, (0,), False)


@pytest.mark.parametrize("overrides,needle", [
    ({"children": ["a"]}, "cycle"),
    ({"parents": ["a", "ghost"]}, "parent 'ghost' is not a task"),
    ({"parents": []}, "does not list it as a parent"),
    ({"inputFiles": ["nope"]}, "unknown file 'nope'"),
])
def test_wfformat_invalid(res, tmp_path, overrides, needle):
    doc = wfformat_doc(**overrides)
    if overrides.get("children") == ["a"]:  # a <-> b: make it consistent so the cycle is reached
        doc["workflow"]["specification"]["tasks"][0]["parents"] = ["b"]
    path = write(tmp_path, "bad.json", doc)
    with pytest.raises(WorkflowError, match=needle) as e:
        loaders.load_wfformat([path], res)
    assert "bad.json" in str(e.value)


def test_wfformat_missing_field_and_truncated(res, tmp_path):
    doc = wfformat_doc()
    del doc["workflow"]["execution"]["tasks"][1]["runtimeInSeconds"]
    with pytest.raises(WorkflowError, match=r"m\.json.*task 'b'.*missing field 'runtimeInSeconds'"):
        loaders.load_wfformat([write(tmp_path, "m.json", doc)], res)
    text = json.dumps(wfformat_doc())
    with pytest.raises(WorkflowError, match=r"t\.json: invalid or truncated JSON at line 1"):
        loaders.load_wfformat([write(tmp_path, "t.json", text[: len(text) // 2])], res)


def test_flowbench_invalid(res, tmp_path):
    cases = {"cycle.json": ({"a": ["b"], "b": ["a"]}, "contains a cycle"),
             "link.json": ({"a": ["zzz"]}, "unknown node 'zzz'"),
             "field.json": ({"a": "b"}, "node 'a': children must be a list"),
             "trunc.json": ('{"a": ["b"], "b": [', "invalid or truncated JSON")}
    for name, (content, needle) in cases.items():
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_flowbench([write(tmp_path, name, content)], res)
        assert name in str(e.value)


def test_dagbench_invalid(res, tmp_path):
    def doc(tasks, deps):
        return {"task_graph": {"tasks": tasks, "dependencies": deps}}
    t2 = [{"name": "x", "cost": 1.0}, {"name": "y", "cost": 2.0}]
    cases = {"cycle.json": (doc(t2, [{"source": "x", "target": "y", "size": 1},
                                     {"source": "y", "target": "x", "size": 1}]), "cycle"),
             "link.json": (doc(t2, [{"source": "x", "target": "q", "size": 1}]), "unknown node 'q'"),
             "field.json": (doc([{"name": "x"}], []), r"tasks\[0\] \('x'\): missing field 'cost'"),
             "trunc.json": (json.dumps(doc(t2, []))[:-7], "truncated JSON")}
    for name, (content, needle) in cases.items():
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_dagbench([write(tmp_path, name, content)], res)
        assert name in str(e.value)


def worf(content: str, rid: str = "r1") -> list:
    return [{"id": "ok", "conversations": [{"role": "assistant",
                                            "content": "Node:\n1: a\nEdge: (START,1) (1,END)"}]},
            {"id": rid, "conversations": [{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": content}]}]


def test_worfbench_invalid(res, tmp_path):
    cases = {"cycle.json": (worf("Node:\n1: a\n2: b\nEdge: (START,1) (1,2) (2,1) (2,END)"), "cycle"),
             "link.json": (worf("Node:\n1: a\nEdge: (START,1) (1,7) (1,END)"), "unknown node '7'"),
             "field.json": (worf("Node:\n1: a\n2: b\n"), "no 'Edge:' line"),
             "trunc.json": (json.dumps(worf("Node:\n1: a\nEdge: (1,END)"))[:-3], "truncated JSON")}
    for name, (content, needle) in cases.items():
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_worfbench([write(tmp_path, name, content)], res)
        assert name in str(e.value)
        if name != "trunc.json":
            assert "record 1 (id 'r1')" in str(e.value)


def test_nestful_invalid(res, tmp_path):
    def rec(calls):
        return [{"output": [{"name": "ok", "arguments": {}, "label": "var1"}]}, {"output": calls}]
    cases = {"cycle.json": (rec([{"name": "a", "arguments": {"x": "$var2$"}, "label": "var1"},
                                 {"name": "b", "arguments": {"x": "$var1.z$"}, "label": "var2"}]),
                            "cycle"),
             "link.json": (rec([{"name": "a", "arguments": {"x": "$var9.q$"}, "label": "var1"}]),
                           r"refers to \$var9\$, which no call is labelled"),
             "field.json": (rec([{"arguments": {}, "label": "var1"}]), r"output\[0\]: missing field 'name'"),
             "trunc.json": (json.dumps(rec([]))[:-2], "truncated JSON")}
    for name, (content, needle) in cases.items():
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_nestful([write(tmp_path, name, content)], res)
        assert name in str(e.value)
        if name != "trunc.json":
            assert "record 1 (id 1)" in str(e.value)


def plan_lines(*records) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def test_plans_invalid_gold_raises(res, tmp_path):
    ok = {"id": "ok", "task_nodes": [{"task": "A"}], "task_links": []}
    cases = {
        "cycle.jsonl": ({"id": "c", "task_nodes": [{"task": "A"}, {"task": "B"}],
                         "task_links": [{"source": "A", "target": "B"}, {"source": "B", "target": "A"}]},
                        "cycle"),
        "link.jsonl": ({"id": "c", "task_nodes": [{"task": "A"}],
                        "task_links": [{"source": "A", "target": "Z"}]}, "tool 'Z', which no task node runs"),
        "ref.jsonl": ({"id": "c", "task_nodes": [{"task": "A", "arguments": ["<node-4>"]}],
                       "task_links": []}, "refers to <node-4>"),
        "field.jsonl": ({"id": "c", "task_nodes": [{"task": "A"}]}, "missing field 'task_links'"),
    }
    for name, (bad, needle) in cases.items():
        path = write(tmp_path, name, plan_lines(ok, bad))
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_plans([path], res, "raise", "t", None)
        assert name in str(e.value) and "line 2 (id 'c')" in str(e.value)
    trunc = write(tmp_path, "trunc.jsonl", plan_lines(ok)[:-1] + "\n" + json.dumps(ok)[:-5] + "\n")
    with pytest.raises(WorkflowError, match=r"trunc\.jsonl: line 2: invalid or truncated JSON"):
        loaders.load_plans([trunc], res, "skip", "t", None)  # a damaged file aborts even in skip mode


def test_plans_predicted_cycle_is_skipped_and_counted(res, tmp_path, caplog):
    ok = {"id": "ok", "task_nodes": [{"task": "A"}, {"task": "B"}],
          "task_links": [{"source": "A", "target": "B"}]}
    cyc = {"id": "cyc", "task_nodes": [{"task": "A"}, {"task": "B"}],
           "task_links": [{"source": "A", "target": "B"}, {"source": "B", "target": "A"}]}
    path = write(tmp_path, "pred.jsonl", plan_lines(ok, cyc, cyc))
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        out = loaders.load_plans([path], res, "skip", "t", None)
    assert (len(out.workflows), len(out.skipped), out.records) == (1, 2, 3)
    assert "pred.jsonl: skipped 2 of 3 records as invalid" in caplog.text
    assert "line 2 (id 'cyc')" in caplog.text and "cycle" in caplog.text


def test_missing_file_is_a_clear_error(res, tmp_path):
    with pytest.raises(WorkflowError, match="no such workflow file"):
        loaders.load_wfformat([tmp_path / "absent.json"], res)


# ------------------------------------------------------------------------------------------
# Config, families, sources
# ------------------------------------------------------------------------------------------

def test_resource_mapping_is_validated():
    base = load_env(BASE).workload.resources
    with pytest.raises(ConfigError, match=r"env\.workload\.resources\.reference_gflop_per_core_s"):
        load_env(BASE, ["workload.resources.reference_gflop_per_core_s=0"])
    with pytest.raises(ConfigError, match=r"unknown key env\.workload\.resources\.profiles\[0\]\.gflop"):
        load_env(BASE, {"workload": {"resources": {"profiles": [
            {"kind": "text", "gflop": 1, "memory_gb": 1, "output_gb": 0}]}}})
    assert base.profile("no-such-kind") == base.default
    assert build(ResourceMappingConfig, {"reference_gflop_per_core_s": 1, "min_compute_gflop": 1,
                                         "max_memory_gb": 1, "default": {
                                             "kind": "d", "compute_gflop": 1, "memory_gb": 0,
                                             "output_gb": 0}}).profiles == ()


def test_real_source_needs_the_mapping():
    env = load_env(None, ["workload.source=nestful"])
    with pytest.raises(WorkflowError, match="workload.resources: required for workload.source 'nestful'"):
        make_source(env.workload)


def test_replay_follows_file_order_and_sample_draws_with_replacement():
    import numpy as np
    env = family_env("nestful", ["workload.order=replay"])
    src = make_source(env.workload)
    wfs = loaders.load_family("nestful", env.workload.resources)
    rng = np.random.default_rng(0)
    assert [src.next_workflow(rng) for _ in range(5)] == list(wfs[:5])
    env = family_env("nestful")
    assert env.workload.order == "sample"
    src = make_source(env.workload)
    rng = np.random.default_rng(1)
    draws = [src.next_workflow(rng).name for _ in range(300)]
    assert 100 < len(set(draws)) < 300  # with replacement: repeats, yet most workflows appear
    assert draws[:5] != [w.name for w in wfs[:5]]


def test_every_family_has_a_config_and_loads():
    for name in loaders.family_names():
        env = family_env(name)
        assert env.workload.source == name
        wfs = loaders.load_family(name, env.workload.resources)
        assert wfs and all(isinstance(w, WorkflowSpec) for w in wfs)
        assert all(w.tasks for w in wfs)


def test_loaders_import_no_frameworks():
    code = ("import sys, envs.loaders; bad = [m for m in ('gymnasium', 'torch', 'ray', 'yaml') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------
# A short simulated episode per family, checked by the independent trace checker
# ------------------------------------------------------------------------------------------

SHORT = {"wfinstances": 600.0, "flowbench": 100.0, "dagbench": 0.2, "worfbench": 10.0,
         "nestful": 2.0, "taskbench": 10.0, "gnn4taskplan": 10.0, "gnn4taskplan-tmdb": 2.0}


@pytest.mark.parametrize("family", sorted(SHORT))
def test_eft_episode_trace_verifies(family):
    from policies import get_policy

    env = family_env(family, [f"workload.horizon_s={SHORT[family]}"])
    policy = get_policy("eft", env, seed=0)
    events: list[dict] = []
    sim = Simulator(env, trace=events.append)
    sim.reset(3)
    policy.reset(3)
    while sim.current is not None:
        sim.step(policy.decide(sim))
    m = sim.metrics()
    assert not m["truncated"]
    assert m["completed_tasks"] == m["arrived_tasks"] > 0
    recomputed = verify_trace(events)
    assert math.isclose(recomputed["mean_task_response_s"], m["mean_task_response_s"], rel_tol=1e-9)


def test_cli_list_workloads():
    r = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--list-workloads"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == loaders.family_names()


def test_cli_eval_workload_heuristic(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--workload", "nestful",
                        "--policy", "eft", "fastest-idle", "--servers", "16", "--episodes", "1",
                        "--workers", "1", "--set", "workload.horizon_s=5", "--json", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["results"]
    assert [row["policy"] for row in rows] == ["eft", "fastest-idle"]
    assert all(row["completed_tasks"] > 0 for row in rows)
    bad = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--workload", "nope"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown family 'nope'" in bad.stderr


# ------------------------------------------------------------------------------------------
# Format detection (envs.loaders.dags) and the loader fixes of issue 15
# ------------------------------------------------------------------------------------------

SHIPPED_FORMATS = {
    "wfinstances": ("wfformat", 7), "flowbench": ("flowbench", 13), "dagbench": ("dagbench", 2),
    "worfbench": ("worfbench", 4), "nestful": ("nestful", 3), "gnn4taskplan": ("taskplan", 3),
}


@pytest.mark.parametrize("folder", sorted(SHIPPED_FORMATS))
def test_detect_format_of_every_shipped_file(folder):
    fmt, count = SHIPPED_FORMATS[folder]
    files = loaders.dags.dag_files([DATA_DIR / folder])
    assert len(files) == count
    assert [loaders.detect_format(f) for f in files] == [fmt] * count


def test_detect_format_taskbench_live_and_not_a_dag(tmp_path):
    assert loaders.detect_format(DATA_DIR / "taskbench/taskbench_gold_sample.jsonl") == "taskplan"
    assert loaders.detect_format(REPO / "configs/live/agent_dags.yaml") == "live"
    with pytest.raises(WorkflowError, match=r"tool_desc\.json: not a DAG file in a known format; "
                                            r"formats tried: wfformat, worfbench, flowbench"):
        loaders.detect_format(DATA_DIR / "taskbench/data_huggingface/tool_desc.json")


def test_detect_format_reads_content_not_the_file_name(tmp_path):
    src = DATA_DIR / "flowbench/adjacency_list_dags/montage.json"
    as_yaml = write(tmp_path, "plans.jsonl", src.read_text())
    assert loaders.detect_format(as_yaml) == "flowbench"
    wf = write(tmp_path, "graph.yaml", wfformat_doc())
    assert loaders.detect_format(wf) == "wfformat"
    one_plan = write(tmp_path, "x.json", {"id": "p", "task_nodes": [{"task": "A"}], "task_links": []})
    assert loaders.detect_format(one_plan) == "taskplan"
    live_yaml = write(tmp_path, "dag.txt", "name: w\ntasks:\n  - {name: a, compute_gflop: 2}\n")
    assert loaders.detect_format(live_yaml) == "live"
    # a list whose first record is damaged is still recognised by its majority
    recs = [{"bad": 1}] + worf("Node:\n1: a\nEdge: (START,1) (1,END)")
    assert loaders.detect_format(write(tmp_path, "w.json", recs)) == "worfbench"


def test_load_dags_directory_of_two_formats(res, tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "sub/a.json", wfformat_doc())
    write(tmp_path, "b.yaml", "name: w\ntasks:\n  - {name: a, compute_gflop: 2, memory_gb: 1}\n"
                              "  - {name: b, compute_gflop: 6, parents: [a]}\n")
    write(tmp_path, "README.md", "not read")
    loaded, per = loaders.load_dags([tmp_path], res)
    assert per == {"live": 1, "wfformat": 1}
    assert sorted(w.name for w in loaded.workflows) == ["w", "wfformat/a"]
    live = next(w for w in loaded.workflows if w.name == "w")
    assert [(t.compute_gflop, t.memory_gb, t.parents) for t in live.tasks] == [(2.0, 1.0, ()), (6.0, 0.0, (0,))]


def test_duplicate_node_ids_are_errors(res, tmp_path):
    dup = worf("Node:\n1: a\n1: b\nEdge: (START,1) (1,END)")
    path = write(tmp_path, "dup.json", dup)
    with pytest.raises(WorkflowError, match=r"dup\.json: record 1 \(id 'r1'\): graph text declares "
                                            r"node id '1' twice"):
        loaders.load_worfbench([path], res)
    out = loaders.load_worfbench([path], res, "skip")  # skip mode: a counted skip, not a merge
    assert (len(out.workflows), len(out.skipped), out.records) == (1, 1, 2)
    flow = write(tmp_path, "flow.json", '{"a": ["b"], "b": [], "a": []}')
    with pytest.raises(WorkflowError, match=r"flow\.json: duplicate key 'a'"):
        loaders.load_flowbench([flow], res)
    live = write(tmp_path, "live.json", {"name": "w", "tasks": [{"name": "x", "compute_gflop": 1},
                                                                 {"name": "x", "compute_gflop": 2}]})
    with pytest.raises(WorkflowError, match="duplicate task name 'x'"):
        loaders.load_dags([live], res)


def test_empty_file_warns_naming_it(res, tmp_path, caplog):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        out = loaders.load_wfformat([empty], res)
        plans = loaders.load_plans([empty], res, "raise", "t", None)
    assert (out.records, plans.records) == (0, 0)
    assert caplog.text.count("empty.json: empty file") == 2
    ok = write(tmp_path, "ok.json", wfformat_doc())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        loaded, per = loaders.load_dags([empty, ok], res)
    assert per == {"wfformat": 1} and len(loaded.workflows) == 1
    assert "empty.json: empty file" in caplog.text


def test_binary_and_non_utf8_files_name_the_file(res, tmp_path):
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"a": ["caf\u00e9"]}'.encode("latin-1"))
    with pytest.raises(WorkflowError, match=r"latin\.json: not UTF-8 text \(invalid byte 0xe9"):
        loaders.load_flowbench([latin], res)
    binary = tmp_path / "blob.json"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)))
    with pytest.raises(WorkflowError, match=r"blob\.json: binary file"):
        loaders.load_plans([binary], res, "skip", "t", None)
    with pytest.raises(WorkflowError, match=r"blob\.json: binary file.*formats tried: wfformat"):
        loaders.detect_format(binary)


@pytest.mark.parametrize("where,key,value,needle", [
    ("execution", "runtimeInSeconds", 1e12, r"'runtimeInSeconds' must be a finite number in \[0, 1e\+07\], got 1000000000000.0"),
    ("execution", "runtimeInSeconds", float("nan"), r"'runtimeInSeconds' must be a finite number"),
    ("execution", "runtimeInSeconds", -1.0, r"'runtimeInSeconds' must be a finite number"),
    ("execution", "avgCPU", float("inf"), r"'avgCPU' must be a finite number"),
    ("execution", "memoryInBytes", 2e15, r"'memoryInBytes' must be a finite number in \[0, 1e\+15\]"),
    ("files", "sizeInBytes", -5, r"'sizeInBytes' must be a finite number in \[0, 1e\+15\], got -5"),
])
def test_wfformat_absurd_values_rejected(res, tmp_path, where, key, value, needle):
    doc = wfformat_doc()
    spec = doc["workflow"]["specification"]
    target = spec["files"][0] if where == "files" else doc["workflow"]["execution"]["tasks"][1]
    target[key] = value
    with pytest.raises(WorkflowError, match=needle) as e:
        loaders.load_wfformat([write(tmp_path, "absurd.json", doc)], res)
    assert "absurd.json" in str(e.value)


def test_dagbench_and_live_absurd_values_rejected(res, tmp_path):
    doc = {"task_graph": {"tasks": [{"name": "x", "cost": 1e11}], "dependencies": []}}
    with pytest.raises(WorkflowError, match=r"d\.json.*'cost' must be a finite number in \[0, 1e\+10\]"):
        loaders.load_dagbench([write(tmp_path, "d.json", doc)], res)
    for key, value, needle in (("memory_gb", 2e6, r"memory_gb must be a finite number >= 0 and <= 1e\+06"),
                               ("compute_gflop", 1e12, r"compute_gflop must be a finite number > 0 and <= 1e\+09"),
                               ("output_gb", -1, "output_gb must be a finite number >= 0")):
        rec = {"name": "w", "tasks": [{"name": "a", "compute_gflop": 1, key: value}]}
        with pytest.raises(WorkflowError, match=needle) as e:
            loaders.load_dags([write(tmp_path, f"{key}.json", rec)], res)
        assert f"{key}.json" in str(e.value)
    nan = write(tmp_path, "nan.json", '{"name": "w", "tasks": [{"name": "a", "compute_gflop": NaN}]}')
    with pytest.raises(WorkflowError, match="compute_gflop must be a finite number > 0"):
        loaders.load_dags([nan], res)


def test_family_on_invalid_override(res):
    # gnn4taskplan skips its invalid predicted plans by default; 'raise' aborts on the first one
    records, skipped = loaders.load_counts("gnn4taskplan", res)
    assert skipped > 0
    with pytest.raises(WorkflowError, match=r"direct\.json: line \d+"):
        loaders.load_family("gnn4taskplan", res, "raise")
    assert len(loaders.load_family("worfbench", res, "skip")) == len(loaders.load_family("worfbench", res))


def test_dags_config_is_validated():
    with pytest.raises(ConfigError, match="workload.dags: name at least one DAG file"):
        load_env(BASE, ["workload.source=dags"])
    with pytest.raises(ConfigError, match=r"env\.workload\.dag_format: 'pdf' is not allowed; choose "
                                          r"one of \['auto', 'wfformat'"):
        load_env(BASE, ["workload.dag_format=pdf"])
    with pytest.raises(ConfigError, match=r"env\.workload\.on_invalid"):
        load_env(BASE, ["workload.on_invalid=ignore"])


def test_dags_source_and_offered_load(tmp_path):
    path = write(tmp_path, "w.json", {"workflows": [
        {"name": "a", "tasks": [{"name": "x", "compute_gflop": 10}]},
        {"name": "b", "tasks": [{"name": "x", "compute_gflop": 20}, {"name": "y", "compute_gflop": 10}]}]})
    env = load_env(BASE, {"workload": {"source": "dags", "dags": [str(path)], "order": "replay"}})
    import numpy as np
    src = make_source(env.workload)
    rng = np.random.default_rng(0)
    assert [src.next_workflow(rng).name for _ in range(3)] == ["a", "b", "a"]
    # W = (10 + 30) / 2 = 20 GFLOP; paper cluster at N=16: 4 x 1 + 10 x 2 + 2 x 4 = 32 GFLOP/s
    assert loaders.dags.capacity_gflop_s(env, 16) == 32.0
    assert loaders.arrival_rate_for_load(env, 0.5, src.workflows) == pytest.approx(0.8)


def test_the_format_registry_drives_the_config_the_loaders_and_the_cli():
    """One list of DAG formats (envs.dag_formats): the config's choices, a loader for each, and
    --dag-format's choices come from it."""
    import argparse

    from envs.config import DAG_FORMATS
    from envs.dag_formats import NAMES, format_of
    from envs.loaders.dags import LOADERS
    from scale_ray.commands import run_workflows

    assert DAG_FORMATS == ("auto", *NAMES) and set(LOADERS) | {"live"} == set(NAMES)
    p = argparse.ArgumentParser()
    run_workflows.add_arguments(p)
    assert next(a for a in p._actions if a.dest == "dag_format").choices == DAG_FORMATS
    # a list votes by record, a tie going to the first in the registry
    assert format_of("json", [{"output": []}, {"task_nodes": []}]) == "nestful"
    assert format_of("json", [{"conversations": []}, {"output": []}, {"output": []}]) == "nestful"
    assert format_of("json", {"task_graph": {}, "tasks": []}) == "dagbench"
    assert format_of("json", {"a": ["b"], "b": []}) == "flowbench"
    assert format_of("json", {"x": 1}) is None
