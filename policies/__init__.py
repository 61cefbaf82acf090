"""Schedulers: the one Policy interface, heuristics (EFT, HEFT, Ray's placement...), the
lookahead planner and (with torch) trained networks.

``get_policy(spec)``, the one registry, resolves what ``--policy`` accepts: a heuristic name
(``eft``, ``ray``), a planner (``lookahead[:key=value,...]``), the name of a shipped artifact
(``scale``, ``crossattn``) or a path to a policy artifact directory, optionally prefixed
``sample:`` to draw from the trained policy's distribution instead of acting greedily. A
trained policy answers through the guard (``policies.guard``; ``guard`` to configure or switch
it off).
"""

from __future__ import annotations

from pathlib import Path

from envs.config import EnvConfig

from .base import ObservationPolicy, Planner, Policy, SampledPolicy, State, is_planner
from .guard import GuardConfig, make_guard
from .heuristics import HEURISTICS, make_heuristic

ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"


def shipped_policies() -> list[str]:
    """Names of the trained policy artifacts shipped with the package."""
    if not ARTIFACTS_DIR.is_dir():
        return []
    return sorted(p.name for p in ARTIFACTS_DIR.iterdir() if (p / "policy.json").is_file())


def default_policy() -> str:
    """The policy used when none is named: the shipped SCALE policy, or EFT without it."""
    return "scale" if "scale" in shipped_policies() else "eft"


def load_policy(path: str | Path) -> Policy:
    """Load a trained policy artifact directory (no Ray, no unpickling of code)."""
    from .artifact import load_policy as _load  # needs torch

    return _load(path)


SAMPLE_PREFIX = "sample:"


def _lookahead(spec: str, env: EnvConfig | None, seed: int | None) -> Policy:
    from .lookahead import make_lookahead  # loaded on first use
    return make_lookahead(spec, env, seed)


#: planners (:class:`policies.base.Planner`) by name, as HEURISTICS are: ``NAME`` or
#: ``NAME:key=value,...`` -> factory(spec, env, seed)
PLANNERS = {"lookahead": _lookahead}


def get_policy(spec: str, env: EnvConfig | None = None, seed: int | None = None,
               guard: GuardConfig | None = None) -> Policy:
    """A heuristic name, a planner, a shipped artifact name, or an artifact path -> Policy; a
    trained one guarded by ``guard`` (default: on, ``GuardConfig()``).

    ``sample:<shipped name or path>``: the trained policy sampling from softmax(scores) (its
    stochastic training-time policy) instead of acting greedily; PPO and SAC artifacts only.
    """
    if spec.startswith(SAMPLE_PREFIX):
        inner_spec = spec[len(SAMPLE_PREFIX):]
        if inner_spec in HEURISTICS or inner_spec.split(":", 1)[0] in PLANNERS or not inner_spec:
            raise ValueError(f"--policy {spec!r}: sample: takes a trained policy (a shipped name "
                             f"or an artifact path), not a heuristic")
        inner = get_policy(inner_spec, env, seed, guard)
        algorithm = str(getattr(inner, "meta", {}).get("algorithm", ""))
        if algorithm == "dqn":
            raise ValueError(f"--policy {spec!r}: a DQN artifact scores Q-values, not an action "
                             f"distribution; sample: applies to PPO and SAC policies only")
        return SampledPolicy(inner, seed)
    if spec in HEURISTICS:
        return make_heuristic(spec, env, seed)
    planner = PLANNERS.get(spec.split(":", 1)[0])
    if planner is not None:  # planners act on the present itself (policies.base.Planner)
        return planner(spec, env, seed)
    path = ARTIFACTS_DIR / spec if spec in shipped_policies() else Path(spec)
    if path.is_dir():
        policy = load_policy(path)
        policy.guard = make_guard(policy, guard)
        return policy
    raise ValueError(f"--policy {spec!r}: not a heuristic ({', '.join(sorted(HEURISTICS))}), "
                     f"not a planner ({', '.join(PLANNERS)}), "
                     f"not a shipped policy ({', '.join(shipped_policies()) or 'none yet'}) "
                     f"and not an artifact directory")


__all__ = ["Policy", "ObservationPolicy", "State", "Planner", "is_planner", "SampledPolicy",
           "SAMPLE_PREFIX", "HEURISTICS", "PLANNERS", "GuardConfig", "make_heuristic",
           "get_policy", "load_policy", "shipped_policies", "default_policy"]
