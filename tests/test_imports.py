"""The simulator core imports no gymnasium, torch or ray (only the gym adapters may)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_envs_core_imports_without_gymnasium_torch_ray(repo):
    code = textwrap.dedent("""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = ("gymnasium", "gym", "torch", "ray", "pydantic")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked import of {name}")
        sys.meta_path.insert(0, Block())
        import envs
        names = [m.name for m in pkgutil.walk_packages(envs.__path__, "envs.")]
        assert "envs.simulator" in names
        for name in names:
            if name in ("envs.gym_env", "envs.node_env"):
                continue
            importlib.import_module(name)
        from envs.simulator import Simulator
        from envs.config import EnvConfig
        sim = Simulator(EnvConfig())
        while sim.current is not None:
            sim.step(0)
        print("ok", len(names))
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ok")
