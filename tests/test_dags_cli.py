"""`scale-ray eval --dags` / `--on-invalid` / `--load` and `scale-ray run-workflows --dag` on any
supported DAG format: an evaluation row from a directory of two formats, counted skips, and exit
code 2 with one line naming the file (and the formats tried) for a bad file, never a traceback.
All in process or one subprocess; no Ray (``--workers 1``; run-workflows fails before a cluster)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from envs.loaders import DATA_DIR, FORMATS
from scale_ray.cli import main

REPO = Path(__file__).resolve().parent.parent
TRIED = "formats tried: " + ", ".join(FORMATS)
LIVE = {"workflows": [{"name": "pair", "tasks": [
    {"name": "a", "compute_gflop": 4, "memory_gb": 2},
    {"name": "b", "compute_gflop": 12, "memory_gb": 2, "parents": ["a"]}]}]}


def worf_record(rid: str, graph: str) -> dict:
    return {"id": rid, "conversations": [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": graph}]}


@pytest.fixture
def two_formats(tmp_path: Path) -> Path:
    d = tmp_path / "dags"
    (d / "nested").mkdir(parents=True)
    (d / "live.json").write_text(json.dumps(LIVE))
    (d / "nested" / "flow.json").write_text(json.dumps({"stage_in_1": ["job_a"], "job_a": []}))
    return d


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("scale-ray:")]


def test_eval_dags_directory_of_two_formats(two_formats, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["eval", "--dags", str(two_formats), "--policy", "eft", "--episodes", "1",
               "--workers", "1", "--set", "workload.horizon_s=20", "--json", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "dags: 2 workflows from 2 files (live 1, flowbench 1); 0 of 2 records skipped" in stdout
    # tasks: a 4, b 12 (live), stage_in_1 0.2 and job_a 3.8 GFLOP (flowbench's pegasus_aux and
    # pegasus_job profiles): mean 5.0 / 4
    assert "dags: features.workload_scale = 1.25 " in stdout
    (row,) = json.loads(out.read_text())["results"]
    assert row["policy"] == "eft" and row["servers"] == 16
    assert row["completed_tasks"] > 0


def test_eval_load_sets_lambda16_from_the_dags(two_formats, capsys):
    live = two_formats / "live.json"
    # W = 4 + 12 = 16 GFLOP per workflow; C16 = 32 GFLOP/s (paper tiers 4/10/2 x 1/2/4 GFLOP/s):
    # lambda16 = 0.5 x 32 / 16 = 1.0
    assert main(["eval", "--dags", str(live), "--load", "0.5", "--policy", "eft", "--episodes", "1",
                 "--workers", "1", "--set", "workload.horizon_s=5"]) == 0
    stdout = capsys.readouterr().out
    assert "--load 0.5: lambda16 = 1 workflows/s (W = 16 GFLOP per workflow, C16 = 32 GFLOP/s" in stdout
    assert main(["eval", "--dags", str(live), "--load", "0.5",
                 "--set", "workload.arrival_rate_16=2"]) == 2
    assert error_lines(capsys) == ["scale-ray: error: --load and --set workload.arrival_rate_16 are "
                                   "exclusive"]


@pytest.mark.parametrize("name,content,needle", [
    ("blob.json", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "binary file (NUL bytes)"),
    ("latin.yaml", "name: caf\u00e9\n".encode("latin-1"), "not UTF-8 text (invalid byte 0xe9"),
    ("tools.json", json.dumps({"nodes": [{"id": "x"}]}).encode(), "not a DAG file in a known format"),
    ("trunc.json", b'{"a": ["b"], "b": [', "not valid JSON (line 1 column 20"),
])
def test_eval_bad_file_exits_2_with_one_line(tmp_path, capsys, name, content, needle):
    bad = tmp_path / name
    bad.write_bytes(content)
    assert main(["eval", "--dags", str(bad), "--workers", "1", "--episodes", "1"]) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"scale-ray: error: {bad}: ") and needle in line and line.endswith(TRIED)


def test_bad_file_one_line_in_a_subprocess(tmp_path):
    bad = tmp_path / "blob.bin"
    bad.write_bytes(bytes(range(256)))
    r = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--dags", str(bad)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"scale-ray: error: {bad}: binary file (NUL bytes), not "
                                             f"a UTF-8 text DAG file; {TRIED}"]


def test_run_workflows_dag_detects_formats_and_rejects_unknown(tmp_path, capsys):
    from scale_ray.live.workflow import load_dag_file
    from scale_ray.config import load_env

    res = load_env(REPO / "configs/env/workloads/base.yaml").workload.resources
    montage = DATA_DIR / "wfinstances/pegasus/montage/montage-chameleon-2mass-005d-001.json"
    (spec,) = load_dag_file(montage, res)
    assert len(spec.tasks) == 58
    live = load_dag_file(REPO / "configs/live/agent_dags.yaml")  # live format: no mapping needed
    assert [(w.name, len(w.tasks)) for w in live] == [("research-agent", 6), ("code-agent", 6)]
    unknown = tmp_path / "x.json"
    unknown.write_text(json.dumps({"hello": 1}))
    assert main(["run-workflows", "--dag", str(unknown)]) == 2
    (line,) = error_lines(capsys)
    assert line == f"scale-ray: error: {unknown}: not a DAG file in a known format; {TRIED}"


def worf_file(tmp_path: Path) -> Path:
    recs = [worf_record("ok", "Node:\n1: a\n2: b\nEdge: (START,1) (1,2) (2,END)"),
            worf_record("dup", "Node:\n1: a\n1: b\nEdge: (START,1) (1,END)"),
            worf_record("cyc", "Node:\n1: a\n2: b\nEdge: (START,1) (1,2) (2,1) (2,END)")]
    p = tmp_path / "worf" / "graph_eval.json"
    p.parent.mkdir()
    p.write_text(json.dumps(recs))
    return p


def test_on_invalid_skip_counts_and_error_aborts(tmp_path, capsys, caplog):
    path = worf_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="envs.loaders"):
        assert main(["eval", "--dags", str(path.parent), "--on-invalid", "skip", "--policy", "eft",
                     "--episodes", "1", "--workers", "1", "--set", "workload.horizon_s=10"]) == 0
    assert "dags: 1 workflows from 1 files (worfbench 1); 2 of 3 records skipped" in capsys.readouterr().out
    assert "graph_eval.json: skipped 2 of 3 records as invalid" in caplog.text
    assert "node id '1' twice" in caplog.text and "cycle" in caplog.text
    assert main(["eval", "--dags", str(path), "--on-invalid", "error"]) == 2
    (line,) = error_lines(capsys)
    assert "graph_eval.json: record 1 (id 'dup'): graph text declares node id '1' twice" in line
    assert main(["eval", "--dags", str(path)]) == 2  # error is the default for --dags
    assert len(error_lines(capsys)) == 1


def test_on_invalid_for_a_family(capsys):
    # gnn4taskplan skips its invalid predicted plans by default; error aborts on the first one
    assert main(["eval", "--workload", "gnn4taskplan", "--on-invalid", "error", "--workers", "1",
                 "--episodes", "1"]) == 2
    (line,) = error_lines(capsys)
    assert "direct.json: line" in line


def test_dag_format_forced(tmp_path, capsys):
    path = worf_file(tmp_path)
    assert main(["eval", "--dags", str(path), "--dag-format", "nestful"]) == 2
    (line,) = error_lines(capsys)
    assert "graph_eval.json: record 0 (id 0): missing field 'output'" in line
    assert main(["eval", "--dag-format", "nestful"]) == 2
    assert error_lines(capsys) == ["scale-ray: error: --dag-format: only with --dags"]


def test_run_workflows_takes_its_live_settings_from_a_config_not_a_second_default(tmp_path):
    """``--time-scale`` has no default of its own: the emulation config (configs/live/
    emulate.yaml) says 0.1, LiveConfig's default stays 1.0 for the library, the flag and
    ``--live-set`` override in that order, and the flag's help is the config field's doc."""
    import argparse

    from scale_ray.commands import run_workflows
    from scale_ray.live.config import LiveConfig

    p = argparse.ArgumentParser()
    run_workflows.add_arguments(p)
    ts = next(a for a in p._actions if a.dest == "time_scale")
    assert ts.default is None and "wall s per model s of emulated work" in ts.help
    assert LiveConfig().time_scale == 1.0
    assert run_workflows._live_config(p.parse_args([])).time_scale == 0.1
    assert run_workflows._live_config(p.parse_args(["--time-scale", "0.5"])).time_scale == 0.5
    assert run_workflows._live_config(p.parse_args(
        ["--time-scale", "0.5", "--live-set", "time_scale=0.2"])).time_scale == 0.2
    own = tmp_path / "live.yaml"
    own.write_text("time_scale: 0.3\nmax_retries: 5\n")
    cfg = run_workflows._live_config(p.parse_args(["--live-config", str(own)]))
    assert (cfg.time_scale, cfg.max_retries) == (0.3, 5)
