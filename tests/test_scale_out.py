"""Training scale-out through RLlib's own knobs: `ray job submit` of a training run to a local
3-node cluster (head + 2 worker nodes) the test starts itself, with 2 env runners that must land
on different worker nodes and one learner actor (``learners.num_learners: 1``).

Placement is forced by resources, not left to the scheduler: each worker node has 2 CPUs and each
env runner asks for 2 (``rollout.num_cpus_per_env_runner``), so a runner fits only on a worker node
and one per node; the head has 1 CPU, which the learner actor asks for
(``learners.num_cpus_per_learner``) and gets once the runners hold the workers' CPUs (RLlib starts
the runners first). The run writes ``placement.json`` (the node of the driver, of every env runner
and of every learner), which the test checks.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from processes import stop_own

from scale_ray.config import REPO_ROOT
from scale_ray.ports import free_port




def _ports(n: int, taken: set[int]) -> list[int]:
    out = []
    while len(out) < n:
        p = free_port(exclude=taken)  # outside Ray's worker ports and the ephemeral range
        taken.add(p)
        out.append(p)
    return out


def _wait_port(port: int, procs: list[subprocess.Popen], what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            dead = [p for p in procs if p.poll() is not None]
            if time.time() > deadline or dead:
                raise RuntimeError(f"{what} did not start (exited: {[p.args[:3] for p in dead]})")
            time.sleep(1)


def _node_count(bindir: str, gcs: int, env: dict, want: int, timeout: float = 120) -> None:
    """Wait until the cluster has ``want`` alive nodes."""
    code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.time() + timeout
    while True:
        res = subprocess.run([f"{bindir}/python", "-c", code, f"127.0.0.1:{gcs}"], env=env,
                             capture_output=True, text=True, timeout=120)
        if res.returncode == 0 and res.stdout.strip().splitlines()[-1:] == [str(want)]:
            return
        if time.time() > deadline:
            raise RuntimeError(f"cluster did not reach {want} nodes: {res.stdout[-500:]} {res.stderr[-1500:]}")
        time.sleep(2)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ray_job_submit_to_a_three_node_cluster_places_runners_and_learner(tmp_path):
    root = str(Path("/tmp") / f"sso_{os.getpid()}")  # short: Ray's unix sockets live below it
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    taken: set[int] = set()
    gcs, dash, client, *head_ports = _ports(9, taken)
    procs: list[subprocess.Popen] = []

    def node_args(ports: list[int]) -> list[str]:
        agent_http, agent_grpc, metrics, runtime_env, node_mgr, obj_mgr = ports
        return [f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
                f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
                f"--node-manager-port={node_mgr}", f"--object-manager-port={obj_mgr}",
                "--min-worker-port=0", "--max-worker-port=0"]  # OS-chosen: no clash between nodes

    out = tmp_path / "run"
    try:
        procs.append(subprocess.Popen(
            [f"{bindir}/ray", "start", "--head", "--block", "--num-cpus=1", f"--port={gcs}",
             f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
             f"--ray-client-server-port={client}", f"--temp-dir={root}/h", *node_args(head_ports)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        _wait_port(gcs, procs, "ray head")
        for w in (1, 2):
            procs.append(subprocess.Popen(
                [f"{bindir}/ray", "start", f"--address=127.0.0.1:{gcs}", "--block", "--num-cpus=2",
                 f"--temp-dir={root}/w{w}", *node_args(_ports(6, taken))],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        _wait_port(dash, procs, "ray dashboard")
        _node_count(bindir, gcs, env, 3)

        sets = {"env.workload.horizon_s": 15, "ppo.steps_per_iteration": 128,
                "ppo.minibatch_size": 64, "ppo.num_epochs": 1,
                "rollout.num_env_runners": 2, "rollout.num_envs_per_env_runner": 1,
                "rollout.num_cpus_per_env_runner": 2,
                "learners.num_learners": 1, "learners.num_cpus_per_learner": 1}
        cmd = [f"{bindir}/ray", "job", "submit", "--address", f"http://127.0.0.1:{dash}",
               "--working-dir", str(REPO_ROOT),
               "--runtime-env-json", json.dumps({"excludes": [".venv", ".git", "runs", "*.log"]}),
               "--", "python", "-m", "scale_ray.cli", "train", "configs/train/scale.yaml",
               "--iterations", "1", "--out", str(out),
               *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
        for _ in range(20):  # the dashboard answers before its job agent is ready
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if "No available agent" not in res.stdout + res.stderr:
                break
            time.sleep(3)
        log = res.stdout + res.stderr
        assert res.returncode == 0, log[-4000:]
        assert "iter    1/1" in log, log[-4000:]
        assert "placement: 2 env runner(s) on 2 node(s), 1 learner actor(s) on 1 node(s)" in log

        placement = json.loads((out / "placement.json").read_text())
        head = placement["driver"]  # the job's driver runs on the head node
        runners = placement["env_runners"]
        assert len(runners) == 2 and len(set(runners)) == 2, placement  # different nodes
        assert head not in runners, placement  # both on worker nodes
        assert placement["learners_remote"] is True and placement["learners"] == [head], placement

        # the artifact came from the learner actor and is a working policy
        from policies import load_policy

        pol = load_policy(out / "policy")
        assert pol.scores({"task": np.full(5, 0.1, np.float32), "servers": np.full((48, 5), 0.2, np.float32),
                           "action_mask": np.ones(48, np.float32)}).shape == (48,)
        assert (out / "checkpoints" / "iter_000001" / "progress.json").is_file()
        from scale_ray.checkpoints import checkpoint_problem

        assert checkpoint_problem(out / "checkpoints" / "iter_000001") is None
    finally:
        stop_own(procs, root)  # workers first, then the head, then anything of ours left behind


def test_kuberay_gpu_learner_variant_parses_and_its_settings_validate():
    """The commented GPU-learner block of configs/kuberay/rayjob.yaml is valid YAML once
    uncommented, asks for one GPU per learner actor, and its --set keys are valid train keys."""
    import shlex

    import yaml

    from scale_ray.config import parse_overrides
    from scale_ray.rllib_config import build_algo_config
    from scale_ray.train_config import load_train_config

    text = (REPO_ROOT / "configs/kuberay/rayjob.yaml").read_text()
    yaml.safe_load(text)  # still one document (tests/test_serve.py reads it so)
    block = text.split("# BEGIN gpu-learner\n", 1)[1].split("# END gpu-learner", 1)[0]
    doc = yaml.safe_load("\n".join(line[4:] for line in block.splitlines()))
    (group,) = doc["workerGroupSpecs"]
    assert group["rayStartParams"]["num-gpus"] == "1"
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    argv = shlex.split(doc["entrypoint"])
    assert argv[:3] == ["scale-ray", "train", "configs/train/scale.yaml"]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg, env = load_train_config(REPO_ROOT / argv[2], parse_overrides(sets))
    assert (cfg.learners.num_learners, cfg.learners.num_gpus_per_learner) == (1, 1.0)
    ac = build_algo_config(cfg, env)
    assert (ac.num_learners, ac.num_gpus_per_learner, ac.num_env_runners) == (1, 1, 4)
