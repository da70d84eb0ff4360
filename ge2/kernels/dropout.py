"""Dropout with an in-kernel Philox RNG: no mask tensor is stored, backward regenerates it.

The generator state is a small int64 device tensor ``[seed, offset]``. Element i of a launch
draws ``tl.rand(seed, offset + i)``; after the launch ``philox_advance`` adds the element count
to ``offset`` on the device. Both live on the GPU, so a CUDA graph that replays a training step
replays the advance too and draws a fresh mask every step, with no host round trip. Backward
reads a copy of the state taken before the advance and rebuilds the same mask.

    y = x * keep / (1 - p),   keep = rand >= p   (p = 1: y = 0)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.runtime import autotune, cdiv

BLOCK = 1024


def _configs() -> list[triton.Config]:
    return [triton.Config({}, num_warps=w) for w in (2, 4, 8)]


@autotune(_configs(), key=["BLOCK"], default=1)
@triton.jit
def dropout_kernel(x_ptr, y_ptr, state_ptr, n, p, scale, BLOCK: tl.constexpr):
    """y = x * scale where rand(seed, offset + i) >= p, else 0 (x, y contiguous, n elements)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    seed = tl.load(state_ptr)
    base = tl.load(state_ptr + 1)
    keep = tl.rand(seed, base + offs) >= p
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, tl.where(keep, x * scale, 0.0).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def philox_advance_kernel(state_ptr, n):
    """offset += n: the next launch draws numbers no earlier launch used."""
    tl.store(state_ptr + 1, tl.load(state_ptr + 1) + n)


def dropout(x: torch.Tensor, state: torch.Tensor, p: float) -> torch.Tensor:
    """y like x (contiguous); the mask comes from ``state`` = [seed, offset] (read, not advanced)."""
    src = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = src.numel()
    if n:
        scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
        dropout_kernel[(cdiv(n, BLOCK),)](src, y, state, n, float(p), scale, BLOCK=BLOCK)
    return y


def philox_advance_(state: torch.Tensor, n: int) -> torch.Tensor:
    """state[1] += n on the device (in place); returns state."""
    philox_advance_kernel[(1,)](state, n)
    return state
