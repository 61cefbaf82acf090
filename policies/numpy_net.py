"""NumPy inference of :class:`policies.networks.CrossAttentionPointerNet` (the decision fast path).

One decision of the pointer network is about 55 tiny tensor operations (d = 16). On a CPU, torch
spends ~4 µs of dispatch on each whatever its size, so a single decision costs ~0.25 ms at N = 48
although the arithmetic is a few microseconds; NumPy's per-call cost is several times lower.
Serve's ``/v1/schedule`` makes one decision after another (each depends on the previous one), so
this overhead is its throughput.

:class:`NumpyPointerNet` copies the weights of a trained network once and computes the same
forward in float32, operation for operation (same layer order, exact erf GELU, the same layer-norm
epsilon and masking constants). Results agree with torch to float32 rounding (summation order
differs inside matrix products); ``tests/test_policy_module.py`` checks scores and argmax on
random observations and on simulator rollouts. Training never uses it.

Batch invariance: the scores of one row do not depend on the other rows of the batch, bit for bit
(``scores(batch)[i] == scores(batch[i:i+1])[0]``). A plain ``(B, d) @ (d, k)`` product is one BLAS
call whose blocking, and so its rounding, changes with B; here every product keeps a row axis of
its own (``(B, 1, d) @ (d, k)``, ``(B, N, d) @ (d, k)``), which NumPy's ``matmul`` computes as B
separate BLAS calls of the shape a single decision makes, and the remaining operations are
element-wise or reduce along a row's own last axis. So the evaluation harness can step episodes in
lockstep (one batched call per step) and get the decisions of the sequential run, whatever the
batch: ``tests/test_artifact.py`` checks it on random observations and batch sizes.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf
from torch import nn

from .networks import ATTN_MASKED, MASKED_SCORE, CrossAttentionBlock, CrossAttentionPointerNet

_F32 = np.float32


def _linear(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray | None]:
    """(W^T contiguous (in, out), bias or None) as float32 arrays."""
    w = np.ascontiguousarray(layer.weight.detach().cpu().numpy().T, dtype=_F32)
    b = None if layer.bias is None else layer.bias.detach().cpu().numpy().astype(_F32)
    return w, b


def _mlp2(seq: nn.Sequential) -> tuple:
    """A ``Linear, ReLU, Linear`` sequence (the embedding MLPs) as weight arrays."""
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    others = [m for m in seq if not isinstance(m, nn.Linear)]
    if len(linears) != 2 or len(others) != 1 or not isinstance(others[0], nn.ReLU):
        raise ValueError("numpy inference supports 2-layer ReLU embedding MLPs only")
    return (*_linear(linears[0]), *_linear(linears[1]))


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: np.float32,
                mean_w: np.ndarray) -> np.ndarray:
    """torch's LayerNorm over the last axis (biased variance). Means are dot products with a
    ``1/d`` vector: ``ndarray.mean`` goes through Python code and costs several times more."""
    xc = x - (x @ mean_w)[..., None]
    var = (xc * xc) @ mean_w
    xc /= np.sqrt(var + eps)[..., None]
    xc *= g
    xc += b
    return xc


class _Block:
    """One :class:`CrossAttentionBlock` as arrays. Its key/value projection of the servers is
    done by :class:`NumpyPointerNet` for all blocks at once (one matmul instead of one each)."""

    def __init__(self, blk: CrossAttentionBlock):
        if not isinstance(blk.ffn[1], nn.GELU) or blk.ffn[1].approximate != "none":
            raise ValueError("numpy inference supports the exact (erf) GELU only")
        self.h, self.dh = blk.heads, blk.d_head
        # The attention scale 1/sqrt(d_head) folded into the query projection.
        scale = _F32(1.0 / math.sqrt(blk.d_head))
        wq, bq = _linear(blk.q)
        self.wq, self.bq = wq * scale, bq * scale
        self.wkv, self.bkv = _linear(blk.kv)
        self.wo, self.bo = _linear(blk.out)
        self.w1, self.b1 = _linear(blk.ffn[0])
        self.w2, self.b2 = _linear(blk.ffn[2])
        self.g1, self.n1, self.eps1 = _norm(blk.norm1)
        self.g2, self.n2, self.eps2 = _norm(blk.norm2)
        self.mean_w = np.full(blk.q.out_features, 1.0 / blk.q.out_features, dtype=_F32)

    def __call__(self, z: np.ndarray, kv: np.ndarray, key_bias: np.ndarray | None) -> np.ndarray:
        """z (B, 1, d), kv (B, N, 2d) = this block's key/value projection of the servers,
        key_bias (B, 1, 1, N) or None when every server attends -> (B, 1, d). Every product
        keeps the row axis (batch invariance, see the module docstring)."""
        b, n, _ = kv.shape
        h, dh = self.h, self.dh
        q = (z @ self.wq + self.bq).reshape(b, h, 1, dh)
        kv = kv.reshape(b, n, 2, h, dh)
        k = kv[:, :, 0].transpose(0, 2, 3, 1)  # (B, h, dh, N)
        v = kv[:, :, 1].transpose(0, 2, 1, 3)  # (B, h, N, dh)
        att = q @ k  # (B, h, 1, N), already scaled
        if key_bias is not None:
            att += key_bias
        att -= att.max(-1, keepdims=True)
        np.exp(att, out=att)
        att /= att.sum(-1, keepdims=True)
        ctx = (att @ v).reshape(b, 1, h * dh)
        x = _layer_norm(z + (ctx @ self.wo + self.bo), self.g1, self.n1, self.eps1, self.mean_w)
        f = x @ self.w1 + self.b1
        f = _F32(0.5) * f * (_F32(1.0) + erf(f * _F32(1.0 / math.sqrt(2.0))))
        return _layer_norm(x + (f @ self.w2 + self.b2), self.g2, self.n2, self.eps2, self.mean_w)


def _norm(ln: nn.LayerNorm) -> tuple[np.ndarray, np.ndarray, np.float32]:
    if ln.weight is None or ln.bias is None or tuple(ln.normalized_shape) != (ln.weight.shape[0],):
        raise ValueError("numpy inference supports affine layer norm over the last axis only")
    return (ln.weight.detach().cpu().numpy().astype(_F32), ln.bias.detach().cpu().numpy().astype(_F32),
            _F32(ln.eps))


class NumpyPointerNet:
    """Masked pointer scores of a :class:`CrossAttentionPointerNet`, computed with NumPy.

    A snapshot: later changes to the torch module's weights are not seen (build a new one).
    """

    def __init__(self, net: CrossAttentionPointerNet):
        if not isinstance(net, CrossAttentionPointerNet):
            raise TypeError(f"NumpyPointerNet: expected a CrossAttentionPointerNet, got {type(net).__name__}")
        self.task_mlp = _mlp2(net.task_mlp)
        self.server_mlp = _mlp2(net.server_mlp)
        self.blocks = [_Block(b) for b in net.blocks]
        self.wq, _ = _linear(net.w_q)
        wk, _ = _linear(net.w_k)
        # Every projection of the server embeddings in one matmul: [kv_1 | kv_2 | ... | w_k].
        self.w_servers = np.ascontiguousarray(np.concatenate([b.wkv for b in self.blocks] + [wk], 1))
        self.b_servers = np.concatenate([b.bkv for b in self.blocks] + [np.zeros(wk.shape[1], _F32)])
        self._kv_width = self.blocks[0].wkv.shape[1]
        self.scale = _F32(net.attn_scale)

    @staticmethod
    def _embed(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
        hidden = x @ w1 + b1
        np.maximum(hidden, _F32(0.0), out=hidden)
        return hidden @ w2 + b2

    def scores(self, task: np.ndarray, servers: np.ndarray, action_mask: np.ndarray) -> np.ndarray:
        """task (B, 5), servers (B, N, 5), action_mask (B, N) (1 = valid) -> scores (B, N)
        float32, ``MASKED_SCORE`` where masked (as :meth:`CrossAttentionPointerNet.scores`)."""
        # (B, 1, T): the task side keeps a row axis, so no product mixes rows (batch invariance)
        task = np.ascontiguousarray(np.asarray(task, dtype=_F32)[:, None, :])
        servers = np.ascontiguousarray(servers, dtype=_F32)
        valid = np.asarray(action_mask) > 0.5
        e = self._embed(servers, *self.server_mlp)
        proj = e @ self.w_servers + self.b_servers  # (B, N, L*2d + d)
        w = self._kv_width
        # A row with no valid server attends to every key (its scores are all masked anyway).
        attend = valid | ~valid.any(-1, keepdims=True)
        key_bias = (None if attend.all() else
                    np.where(attend, _F32(0.0), _F32(ATTN_MASKED))[:, None, None, :])
        z = self._embed(task, *self.task_mlp)
        for i, block in enumerate(self.blocks):
            z = block(z, proj[:, :, i * w:(i + 1) * w], key_bias)
        # (B, N, d) @ (B, d, 1): one product per row
        s = (proj[:, :, len(self.blocks) * w:] @ (z @ self.wq).transpose(0, 2, 1))[..., 0] * self.scale
        s[~valid] = _F32(MASKED_SCORE)
        return s
