"""Policy artifacts: a trained network's weights plus its config in a small directory.

Layout (format ``scale-ray-policy/1``)::

    policy.json   {"format", "name", "algorithm", "module", "model_config", "train_servers",
                   "features", "version", "checksum": "sha256:<hex of weights.pt>", ...metadata}
    weights.pt    a plain torch state_dict of the network (``policies.networks``)

Loading needs neither Ray nor RLlib and unpickles no code: the weights are read with
``torch.load(weights_only=True)`` after their checksum matched, and the network class comes from
the ``module`` name through :data:`policies.networks.NETWORKS`.

Every damaged artifact is one :class:`ArtifactError` naming the file and the problem (the CLI
prints it and exits 2): a missing or malformed file, a checksum mismatch, a truncated or
unreadable ``weights.pt``, a file that is a symlink leading out of the artifact directory,
non-finite (NaN/Inf) weights (naming the tensor), or a ``model_config`` that would build a network
of more than :data:`MAX_PARAMETERS` parameters (counted before anything is allocated, naming the
field that makes it large).
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from envs.config import FeatureConfig, build

from .base import ObservationPolicy, Obs
from .networks import NETWORKS, CrossAttentionPointerNet, ModelConfig, build_network, model_config
from .numpy_net import NumpyPointerNet

FORMAT = "scale-ray-policy/1"
POLICY_FILE = "policy.json"
WEIGHTS_FILE = "weights.pt"
ALGORITHMS = ("ppo", "ppo+srr", "dqn", "sac", "bc", "untrained")
INFERENCE_THREADS = 1  # see load_policy
BACKENDS = ("numpy", "torch")  # decision backends of TorchPolicy
# Largest network an artifact may describe: checked from policy.json before the network is built
# (the shipped policies have ~15 k parameters; the largest sensible cross-attention net < 10 M).
MAX_PARAMETERS = 50_000_000
# Size fields of ModelConfig that scale the parameter count (named when the bound is exceeded).
_SIZE_FIELDS = ("d_model", "ffn_hidden", "embed_hidden", "critic_hidden", "critic_layers", "layers",
                "mlp_hidden", "n_servers", "task_features")


class ArtifactError(ValueError):
    """A policy artifact is missing, malformed or does not match its checksum."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def save_policy(path: str | Path, net: torch.nn.Module, meta: Mapping[str, Any]) -> Path:
    """Write ``net`` (a :mod:`policies.networks` network) and ``meta`` as an artifact at ``path``.

    ``meta`` supplies ``name``, ``algorithm``, ``train_servers``, ``features`` (a FeatureConfig or
    its dict) and optional ``version`` and free metadata; ``module`` and ``model_config`` come
    from the network.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    algorithm = meta.get("algorithm", "ppo")
    if algorithm not in ALGORITHMS:
        raise ArtifactError(f"algorithm: {algorithm!r} is not one of {list(ALGORITHMS)}")
    features = meta.get("features", FeatureConfig())
    if isinstance(features, FeatureConfig):
        features = asdict(features)
    state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    tmp = out / (WEIGHTS_FILE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(out / WEIGHTS_FILE)
    doc = {**{k: v for k, v in meta.items() if k not in ("features",)},
           "format": FORMAT,
           "name": str(meta.get("name", out.name)),
           "algorithm": algorithm,
           "module": net.kind,
           "model_config": net.cfg.to_dict(),
           "train_servers": int(meta.get("train_servers", 16)),
           "features": features,
           "version": str(meta.get("version", "0")),
           "checksum": _sha256(out / WEIGHTS_FILE)}
    (out / POLICY_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out


def save_untrained(path: str | Path, module: str = "crossattn", seed: int = 0,
                   train_servers: int = 16, model: Mapping[str, Any] | None = None) -> Path:
    """An artifact of a freshly initialised network (tests; Serve/live before training)."""
    torch.manual_seed(seed)
    cfg = dict(model or {})
    if module == "mlp":
        cfg.setdefault("n_servers", train_servers)
    net = build_network(module, cfg)
    return save_policy(path, net, {"name": f"untrained-{module}", "algorithm": "untrained",
                                   "train_servers": train_servers, "version": f"untrained-seed{seed}",
                                   "seed": seed})


def _artifact_file(p: Path, name: str) -> Path:
    """``p / name``, refusing a missing file and a symlink that leads out of the artifact
    directory (an artifact is a self-contained directory: a link elsewhere is not its file)."""
    f = p / name
    if not f.is_file():
        raise ArtifactError(f"policy artifact {p}: missing {name}")
    if f.is_symlink():
        root, target = p.resolve(), f.resolve()
        if not target.is_relative_to(root):
            raise ArtifactError(f"policy artifact {f}: a symlink to {target}, outside the artifact "
                                f"directory {root}; copy the file into the directory")
    return f


def read_meta(path: str | Path) -> dict[str, Any]:
    """The validated ``policy.json`` of an artifact directory."""
    p = Path(path)
    if not p.is_dir():
        raise ArtifactError(f"policy artifact {p}: no such directory")
    f = _artifact_file(p, POLICY_FILE)
    try:
        meta = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"policy artifact {f}: invalid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"policy artifact {f}: cannot read ({e})") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"policy artifact {f}: expected a JSON object")
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"policy artifact {f}: format {meta.get('format')!r}, expected {FORMAT!r}")
    for key in ("module", "model_config", "checksum"):
        if key not in meta:
            raise ArtifactError(f"policy artifact {f}: missing key {key!r}")
    if meta["module"] not in NETWORKS:
        raise ArtifactError(f"policy artifact {f}: module {meta['module']!r} is not one of "
                            f"{sorted(NETWORKS)}")
    return meta


def parameter_count(module: str, cfg: Mapping[str, Any] | ModelConfig) -> int:
    """Parameters of network ``module`` built from ``cfg``, counted on torch's ``meta`` device
    (shapes only: nothing is allocated, whatever the sizes)."""
    with torch.device("meta"):
        net = build_network(module, model_config(cfg, "model_config"))
    return sum(prm.numel() for prm in net.parameters())


def _check_size(module: str, cfg: ModelConfig, where: Path) -> int:
    """The parameter count of ``cfg``; an ArtifactError naming the field that makes it large
    when it exceeds :data:`MAX_PARAMETERS`."""
    n = parameter_count(module, cfg)
    if n <= MAX_PARAMETERS:
        return n
    # the field whose reset to its default shrinks the network most is the one to name
    defaults = {**cfg.to_dict(), **ModelConfig().to_dict(), "n_servers": 16}  # n_servers: the paper's N
    best, best_n = None, n
    for name in _SIZE_FIELDS:
        default = defaults[name]
        if getattr(cfg, name) == default:
            continue
        try:
            m = parameter_count(module, {**cfg.to_dict(), name: default})
        except (ValueError, TypeError):  # e.g. heads no longer divide d_model
            continue
        if m < best_n:
            best, best_n = name, m
    culprit = (f"model_config.{best} = {getattr(cfg, best)} (default {defaults[best]}) "
               f"makes it large" if best else f"model_config = {cfg.to_dict()}")
    raise ArtifactError(f"policy artifact {where}: model_config describes a network of {n:,} "
                        f"parameters ({4 * n / 2**30:.1f} GiB of float32), more than the "
                        f"{MAX_PARAMETERS:,} allowed; {culprit}")


def load_network(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(network in eval mode, metadata) of an artifact; verifies the weights' checksum, that
    neither file leads out of the directory, the network's size before building it, and that
    every weight is finite."""
    p = Path(path)
    meta = read_meta(p)
    meta_file = p / POLICY_FILE
    w = _artifact_file(p, WEIGHTS_FILE)
    try:
        cfg = model_config(meta["model_config"], "model_config")
    except ValueError as e:  # ConfigError: names the key and its range
        raise ArtifactError(f"policy artifact {meta_file}: {e}") from None
    n_params = _check_size(meta["module"], cfg, meta_file)
    size = w.stat().st_size
    if size > 8 * n_params + (1 << 20):  # float64 weights plus torch.save's framing at most
        raise ArtifactError(f"policy artifact {w}: {size:,} bytes, more than a network of "
                            f"{n_params:,} parameters (its model_config) can take")
    got = _sha256(w)
    if got != meta["checksum"]:
        raise ArtifactError(f"policy artifact {p}: {WEIGHTS_FILE} checksum {got} does not match "
                            f"policy.json ({meta['checksum']}); the file is corrupt or was replaced")
    try:
        state = torch.load(w, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - untrusted bytes: any failure is a damaged file
        raise ArtifactError(f"policy artifact {w}: cannot load weights, the file is truncated or "
                            f"not a torch state_dict ({type(e).__name__}: {e})") from None
    if not isinstance(state, Mapping):
        raise ArtifactError(f"policy artifact {w}: cannot load weights, expected a state_dict "
                            f"(a mapping of tensors), got {type(state).__name__}")
    for key, t in state.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ArtifactError(f"policy artifact {w}: tensor {key!r} has {bad} non-finite "
                                f"(NaN/Inf) value(s) of {t.numel()}; the weights are unusable")
    try:
        net = build_network(meta["module"], cfg)
        net.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError, TypeError, KeyError, pickle.UnpicklingError, EOFError) as e:
        raise ArtifactError(f"policy artifact {p}: cannot load weights ({e})") from None
    net.eval()
    for prm in net.parameters():
        prm.requires_grad_(False)
    return net, meta


class TorchPolicy(ObservationPolicy):
    """A trained network behind the :class:`Policy` interface (any N for cross-attention).
    ``scores`` are the masked pointer logits (-inf where masked); ``act`` is greedy; ``encoder``
    the observation it was trained on (``env.encoder``: ``nodes`` for an artifact of
    ``cluster_model: nodes``); ``decide`` answers through ``guard`` (set by
    ``policies.get_policy``).

    ``backend``: ``"numpy"`` (default for the cross-attention network) computes decisions with
    :class:`policies.numpy_net.NumpyPointerNet`, a float32 copy of the weights that makes one
    decision 1.5-2.5x faster than torch on a CPU; ``"torch"`` runs the module itself (the only
    choice for the structured MLP). Both agree to float32 rounding.

    Batch invariance: a row's scores never depend on the other rows of a batch, bit for bit, so
    ``act_batch`` makes the decisions ``act`` makes one by one (the evaluation harness steps
    episodes in lockstep: results must not depend on ``--workers`` or on how episodes are
    sliced). The numpy backend is batch-invariant by construction (:mod:`policies.numpy_net`);
    torch's batched forward is not (its matrix products block differently for other batch
    sizes), so the torch backend scores a batch row by row and is not ``batched``.
    """

    batched = True  # stateless and batch-invariant: the harness may step episodes in lockstep

    def __init__(self, net: torch.nn.Module, meta: Mapping[str, Any], backend: str | None = None):
        self.net = net
        self.meta = dict(meta)
        self.name = str(meta.get("name", net.kind))
        # the ready-task order it was trained under (information: a trained policy runs under
        # any order, so it needs none; envs.order)
        self.trained_order = str(meta.get("order") or meta.get("first_level") or "hop")
        self.features = build(FeatureConfig, meta.get("features") or {}, "features")
        # the observation it was trained on (artifacts before one model say cluster_model)
        self.encoder = str(meta.get("encoder") or (
            "nodes" if meta.get("cluster_model") == "nodes" else "paper"))
        self.guard = None
        if backend is None:
            backend = "numpy" if isinstance(net, CrossAttentionPointerNet) else "torch"
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {list(BACKENDS)}")
        if backend == "numpy" and not isinstance(net, CrossAttentionPointerNet):
            raise ValueError(f"backend: 'numpy' supports the cross-attention network only, not "
                             f"{net.kind!r}; use 'torch'")
        self.backend = backend
        self._fast = NumpyPointerNet(net) if backend == "numpy" else None
        self.batched = backend == "numpy"  # a torch batch costs B single forwards (see above)
        self._task_features = int(net.cfg.task_features)

    def _logits(self, obs: Obs) -> np.ndarray:
        task = np.asarray(obs["task"], dtype=np.float32)
        if task.shape[-1] != self._task_features:
            raise ValueError(
                f"task: this policy takes {self._task_features} task features, the observation "
                f"has {task.shape[-1]} (features.backlog differs from training); evaluate it "
                f"with the env config it was trained with")
        servers = np.asarray(obs["servers"], dtype=np.float32)
        mask = np.asarray(obs["action_mask"], dtype=np.float32)
        single = task.ndim == 1
        if single:
            task, servers, mask = task[None], servers[None], mask[None]
        if self._fast is not None:
            s = self._fast.scores(task, servers, mask)
        else:
            with torch.inference_mode():  # row by row: a batched torch forward rounds differently
                s = np.concatenate([
                    self.net.scores(torch.as_tensor(task[i:i + 1]), torch.as_tensor(servers[i:i + 1]),
                                    torch.as_tensor(mask[i:i + 1])).numpy()
                    for i in range(task.shape[0])]) if task.shape[0] else np.zeros(mask.shape, np.float32)
        return s[0] if single else s

    def scores(self, obs: Obs) -> np.ndarray:
        mask = np.asarray(obs["action_mask"]) > 0.5
        s = self._logits(obs).astype(np.float64)
        s[~mask] = -math.inf
        return s

    def act_batch(self, obs: Obs) -> np.ndarray:
        mask = np.asarray(obs["action_mask"]) > 0.5
        s = self._logits(obs).astype(np.float64)
        s[~mask] = -math.inf
        return s.argmax(-1).astype(np.int64)

    def describe(self) -> dict:
        keys = ("name", "algorithm", "module", "version", "train_servers", "checksum", "model_config")
        return {**{k: self.meta.get(k) for k in keys}, "trained_order": self.trained_order}


def load_policy(path: str | Path, threads: int | None = INFERENCE_THREADS,
                backend: str | None = None) -> TorchPolicy:
    """The artifact at ``path`` as a :class:`Policy` (no Ray, no code unpickled).

    ``backend``: see :class:`TorchPolicy` (default: numpy for cross-attention, else torch).

    ``threads`` caps torch's intra-op threads of this process (never raises them; None leaves
    them alone): one decision is a handful of tiny matmuls, and a thread pool only adds
    synchronisation (measured on 2 busy cores: N=48 0.7 ms with 1 thread, 17+ ms with 2).
    """
    if threads is not None and torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    net, meta = load_network(path)
    return TorchPolicy(net, meta, backend)


def set_inference_threads(n: int | None = None) -> None:
    """Set torch's intra-op threads (single decisions are latency-bound: 1 thread is best)."""
    torch.set_num_threads(max(1, n or 1))


__all__ = ["FORMAT", "MAX_PARAMETERS", "ArtifactError", "save_policy", "save_untrained",
           "load_policy", "load_network", "read_meta", "parameter_count", "TorchPolicy",
           "set_inference_threads"]
