"""Cluster sizers (``envs.sizing.Sizer``): Ray's autoscaler emulated (:mod:`.ray`), the
Kubernetes HPA rule (:mod:`.hpa`) and ours (:mod:`.model`); :func:`make_sizer` builds the one
``env.sizing.policy`` names. docs/autoscale.md compares them."""

from __future__ import annotations

from envs.config import EnvConfig
from envs.sizing import Sizer

from .hpa import Hpa
from .model import ModelSizer
from .ray import RayAutoscaler

__all__ = ["make_sizer", "SIZERS", "RayAutoscaler", "Hpa", "ModelSizer"]

SIZERS = {"ray": RayAutoscaler, "hpa": Hpa, "model": ModelSizer}


def make_sizer(cfg: EnvConfig) -> Sizer | None:
    """The sizer of ``cfg.sizing.policy`` for ``cfg``'s cluster; None for ``static``."""
    policy = cfg.sizing.policy
    if policy == "static":
        return None
    return SIZERS[policy](cfg)
