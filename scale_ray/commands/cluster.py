"""`scale-ray cluster up|down|status`: a local heterogeneous Ray cluster for trying the scheduler
service (``scale_ray.live.localcluster``)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from scale_ray.config import load_env
from scale_ray.live import localcluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--tiers", default=localcluster.DEFAULT_TIERS,
                   help=f"servers per tier, NAME:COUNT,... (default {localcluster.DEFAULT_TIERS}; "
                        f"tier capacities from --env-config)")
    p.add_argument("--servers-per-node", type=int, default=2,
                   help="servers of one tier packed into one raylet (default 2)")
    p.add_argument("--env-config", default="configs/env/paper.yaml")
    p.add_argument("--address-file", default=None, metavar="F",
                   help="also write the cluster's address to this file")
    p.add_argument("--state", default=None, metavar="FILE",
                   help=f"state file (default {localcluster.default_state_path()})")
    p.add_argument("--json", action="store_true", help="print the state as JSON")


def _exports(info: dict) -> str:
    env = {"RAY_ADDRESS": info["address"], "RAY_AUTH_MODE": "token"}
    if info.get("token"):
        env["RAY_AUTH_TOKEN"] = info["token"]
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def run(args: argparse.Namespace) -> int:
    state = Path(args.state) if args.state else localcluster.default_state_path()
    if args.action == "up":
        if args.servers_per_node < 1:
            raise ValueError(f"--servers-per-node: {args.servers_per_node} must be >= 1")
        env = load_env(args.env_config)
        cluster = localcluster.parse_tiers(args.tiers, env.cluster)
        try:
            info = localcluster.up(cluster, args.servers_per_node, state)
        except RuntimeError as e:
            print(f"scale-ray cluster up: {e}")
            return 1
        if args.address_file:
            Path(args.address_file).write_text(info["address"] + "\n")
        if args.json:
            print(json.dumps(info, indent=1))
            return 0
        servers = ", ".join(f"{k}: {v}" for k, v in info["servers"].items())
        print(f"local cluster up in {info['started_s']} s: {info['nodes']} server nodes ({servers}), "
              f"temp dir {info['temp_dir']}\n"
              f"connect (this shell, serve run, ray job submit, your driver):\n{_exports(info)}\n"
              f"then: serve run configs/serve/scheduler.yaml   |   stop: scale-ray cluster down")
        return 0
    if args.action == "down":
        info = localcluster.down(state)
        if info is None:
            print(f"no cluster started by `scale-ray cluster up` (state {state})")
            return 0
        print(f"stopped the local cluster at {info['address']} (process {info['pid']}; "
              f"{info['killed_leftovers']} leftover Ray processes killed)")
        return 0
    info = localcluster.status(state)
    if info is None:
        print(f"no cluster started by `scale-ray cluster up` runs (state {state})")
        return 1
    print(json.dumps(info, indent=1) if args.json else
          f"running: {info['address']} ({info['nodes']} server nodes, process {info['pid']})\n"
          f"{_exports(info)}")
    return 0
