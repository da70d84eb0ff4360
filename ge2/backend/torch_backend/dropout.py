"""Reference of the dropout ops: Triton's Philox4x32-10 written out with NumPy, so the oracle draws
the very same mask as the kernel (``tl.rand(seed, offset + i)``) and the backends can be compared
bit for bit on models with dropout."""
from __future__ import annotations

import numpy as np
import torch

from ge2.backend.registry import register

_M32 = np.uint64(0xFFFFFFFF)
_KEY_A, _KEY_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_ROUND_A, _ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)


def philox_uniform(seed: int, offsets: np.ndarray) -> np.ndarray:
    """float32 U[0, 1) of ``tl.rand(seed, offsets)`` for int64 offsets (10 rounds, 32-bit lanes)."""
    c0 = offsets.astype(np.uint64) & _M32
    c1 = (offsets.astype(np.uint64) >> np.uint64(32)) & _M32
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed) & _M32, (np.uint64(seed) >> np.uint64(32)) & _M32
    for _ in range(10):
        prod_b, prod_a = _ROUND_B * c2, _ROUND_A * c0  # 32 x 32 -> 64 bits: exact in uint64
        c0 = (prod_b >> np.uint64(32)) ^ c1 ^ k0
        c2 = (prod_a >> np.uint64(32)) ^ c3 ^ k1
        c1, c3 = prod_b & _M32, prod_a & _M32
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    x = c0.astype(np.uint32).view(np.int32).astype(np.int64)
    x = np.where(x < 0, -x - 1, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)


def keep_mask(state, shape, p, device) -> torch.Tensor:
    """The kernels' keep mask: element i (row-major in ``shape``) kept when rand(seed, offset + i) >= p."""
    seed, offset = (int(v) for v in state.tolist())
    n = int(np.prod(shape))
    keep = philox_uniform(seed, offset + np.arange(n, dtype=np.int64)) >= np.float32(p)
    return torch.from_numpy(keep).reshape(shape).to(device)


def _dropout(x, state, *, p):
    keep_t = keep_mask(state, x.shape, p, x.device)
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return torch.where(keep_t, x.float() * scale, 0.0).to(x.dtype).contiguous()


register("dropout", "torch")(_dropout)
register("dropout_backward", "torch")(_dropout)


@register("philox_advance", "torch", dtypes=(torch.int64,))
def philox_advance(state, *, n):
    state[1] += n
    return state
