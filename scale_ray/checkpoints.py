"""Checkpoints of a training run: written atomically, checked for completeness, found on resume.

Layout: ``OUT/checkpoints/iter_000050/`` is an RLlib ``Algorithm.save_to_path`` directory plus our
``progress.json`` (iteration, env steps, elapsed training time ``time_s`` at that iteration), which
a resumed run continues its ``time_s`` from.

Writing: :func:`save_checkpoint` saves into a hidden ``.iter_000050.partial`` directory, writes
``progress.json`` last, then renames it into place, so ``iter_*`` directories are complete unless
damaged afterwards. Reading: :func:`checkpoint_problem` still checks each one (a copy cut short, a
checkpoint of an older version of this code written in place, a deleted file): every RLlib
component directory (one with ``class_and_ctor_args.pkl``) must hold its state file, and the
learner must hold the policy module's ``module_state.pkl``. :func:`latest_checkpoint` returns the
newest complete one and reports the newer incomplete ones it skipped.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable

CKPT_DIR = "checkpoints"
PROGRESS_FILE = "progress.json"
_NAME = re.compile(r"^iter_(\d{6,})$")
_COMPONENT_MARK = "class_and_ctor_args.pkl"
_STATE_SUFFIXES = ("state.pkl", "state.msgpack")  # algorithm_state / state / module_state


def checkpoint_dir(out: Path, iteration: int) -> Path:
    return out / CKPT_DIR / f"iter_{iteration:06d}"


def list_checkpoints(out: Path) -> list[Path]:
    """``iter_*`` checkpoint directories of run ``out``, oldest first (by iteration)."""
    root = out / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_problem(path: Path) -> str | None:
    """None if checkpoint ``path`` is complete, else what is missing (a short phrase)."""
    if not (path / "rllib_checkpoint.json").is_file():
        return "missing rllib_checkpoint.json"
    if not any((path / f"algorithm_{s}").is_file() for s in _STATE_SUFFIXES):
        return "missing algorithm_state.pkl"
    learner = path / "learner_group" / "learner" / "rl_module"
    if not learner.is_dir():
        return "missing learner_group/learner/rl_module"
    modules = [d for d in learner.iterdir() if d.is_dir()]
    if not modules:
        return "missing the policy module under learner_group/learner/rl_module"
    for d in modules:
        if not any((d / f"module_{s}").is_file() for s in _STATE_SUFFIXES):
            return f"missing {d.relative_to(path)}/module_state.pkl"
    for comp in sorted(p.parent for p in path.rglob(_COMPONENT_MARK)):
        if not any(f.is_file() and f.name.endswith(_STATE_SUFFIXES) for f in comp.iterdir()):
            return f"missing the state file of {comp.relative_to(path)}"
    if (path / PROGRESS_FILE).exists():
        try:
            read_progress(path)
        except ValueError as e:
            return str(e)
    return None


def latest_checkpoint(out: Path, report: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint of run ``out`` (None if there is none). Each newer,
    incomplete one (a crash while writing it) is skipped and reported through ``report``."""
    for path in reversed(list_checkpoints(out)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if report is not None:
            report(f"checkpoint {path} is incomplete ({problem}); skipping it")
    return None


def read_progress(path: Path) -> dict[str, Any]:
    """``progress.json`` of a checkpoint ({} for a checkpoint written before it existed)."""
    f = path / PROGRESS_FILE
    if not f.exists():
        return {}
    try:
        data = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"unreadable {PROGRESS_FILE} ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{PROGRESS_FILE} is not a JSON object")
    return data


def save_checkpoint(algo: Any, out: Path, iteration: int, progress: dict[str, Any]) -> Path:
    """Save ``algo`` as the checkpoint of ``iteration`` (atomically, see the module doc)."""
    final = checkpoint_dir(out, iteration)
    partial = final.parent / f".{final.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    algo.save_to_path(str(partial.resolve()))
    (partial / PROGRESS_FILE).write_text(json.dumps({"iteration": iteration, **progress}) + "\n")
    if final.exists():  # the same iteration saved again (a resume that trained nothing)
        old = final.parent / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        partial.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(final)
    return final


def remove_partials(out: Path) -> None:
    """Remove the ``.partial`` directories of checkpoints whose writing was interrupted."""
    root = out / CKPT_DIR
    if root.is_dir():
        for p in root.glob(".iter_*.partial"):
            shutil.rmtree(p, ignore_errors=True)
