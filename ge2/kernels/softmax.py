"""Softmax and log-softmax over one dim: forward and backward Triton kernels and their launchers.

A tensor is seen as rows: the softmax dim has length N, and every other index picks a row. The
tensor is viewed as ``[outer, N, inner]`` through its strides (dims before ``dim`` collapse into
``outer``, dims after it into ``inner``), so any dim works without a transpose copy; the last dim
(inner = 1) is the fast case, with coalesced loads along the row.

    y = softmax(scale * x + mask)          log:  y = log_softmax(scale * x + mask)

Rows of up to ``MAX_FUSED_N`` elements are held in registers: one read, one write. Longer rows
take the online path: a first sweep keeps a running max and a running sum of exponentials per lane
(rescaled whenever the max grows), a second sweep writes the output. Math is fp32 for fp32/bf16/fp16
inputs and fp64 for fp64 inputs (the constexpr ACC, so the fp32 kernels are unchanged); ``scale``
reaches the kernels as its fp64 bits, exact in either.

The all ``-inf`` row (a fully masked row) is defined, not NaN: softmax gives 0 everywhere and
log_softmax gives -inf everywhere (log of that 0); its backward gives 0 (softmax) and ``gy``
(log_softmax: d(x_i - lse)/dx_i = 1 - p_i with p = 0). NaN inputs still give NaN rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.elementwise import _float_arg, _float_bits
from ge2.runtime import autotune, cdiv

MAX_FUSED_N = 32768  # longest row kept in registers (32 fp32 per thread at 32 warps)
ONLINE_BLOCK_N = 4096  # the chunk the online path sweeps a long row with
TILE_ELEMENTS = 2048  # short rows are packed BLOCK_M to a program up to about this many elements


def num_warps_configs() -> list[triton.Config]:
    return [triton.Config({}, num_warps=w) for w in (4, 8, 16, 32)]


def prune_by_elements_per_thread(configs, named_args, **kwargs):
    """Keep the num_warps that give each thread 8..64 elements of the BLOCK_M x BLOCK_N tile."""
    # Far fewer than 8 elements per thread wastes threads; far more than 64 spills registers.
    meta = {**named_args, **kwargs}
    tile = meta.get("BLOCK_M", 1) * (meta["BLOCK_N"] if "BLOCK_N" in meta else meta["BLOCK_C"])
    kept = [c for c in configs if 8 <= tile // (32 * c.num_warps) <= 64]
    if kept:
        return kept
    return [min(configs, key=lambda c: abs(tile // (32 * c.num_warps) - 16))]


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def row_offsets(rows, inner, s_outer, s_inner):
    """Element offset of each row's first element in the [outer, N, inner] view."""
    # Row r of the [outer, N, inner] view starts at (r // inner) * s_outer + (r % inner) * s_inner;
    # int64 because outer * s_outer can pass 2**31 elements.
    o = rows // inner
    i = rows - o * inner
    return o.to(tl.int64) * s_outer + i.to(tl.int64) * s_inner


@autotune(num_warps_configs(), key=["BLOCK_M", "BLOCK_N", "HAS_MASK", "LOG"], default=0,
          prune_configs_by={"early_config_prune": prune_by_elements_per_thread})
@triton.jit
def softmax_fwd_kernel(
    x_ptr, mask_ptr, y_ptr, n_rows, N, inner,
    sx_o, sx_i, sx_n, sm_o, sm_i, sm_n, sy_o, sy_i, sy_n, scale,
    HAS_MASK: tl.constexpr, LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """BLOCK_M whole rows per program, held in registers (N <= BLOCK_N)."""
    scale = _float_arg(scale, ACC)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ok = (rows < n_rows)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + row_offsets(rows, inner, sx_o, sx_i)[:, None] + cols[None, :] * sx_n, mask=ok, other=0.0)
    z = x.to(ACC) * scale
    if HAS_MASK:
        m_off = row_offsets(rows, inner, sm_o, sm_i)[:, None] + cols[None, :] * sm_n
        z += tl.load(mask_ptr + m_off, mask=ok, other=0.0).to(ACC)
    z = tl.where(ok, z, float("-inf"))
    row_max = tl.max(z, 1)
    # An all -inf row: shift by 0 instead of -inf so exp gives 0s, not NaNs.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    e = tl.exp(z - row_max[:, None])
    row_sum = tl.sum(e, 1)
    # row_sum is 0 only for an all -inf row; dividing by 1 there keeps 0/0 out of the math
    # (a NaN sum, from a NaN input, still makes the whole row NaN).
    dead = row_sum == 0.0
    safe_sum = tl.where(dead, 1.0, row_sum)
    if LOG:
        # (z - max) - log(sum): z - max is exact, so large |z| lose nothing (z - lse would).
        y = (z - row_max[:, None]) - tl.where(dead, float("inf"), tl.log(safe_sum))[:, None]
    else:
        y = e * tl.where(dead, 0.0, 1.0 / safe_sum)[:, None]
    y_off = row_offsets(rows, inner, sy_o, sy_i)[:, None] + cols[None, :] * sy_n
    tl.store(y_ptr + y_off, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def softmax_fwd_online_kernel(
    x_ptr, mask_ptr, y_ptr, n_rows, N, inner,
    sx_o, sx_i, sx_n, sm_o, sm_i, sm_n, sy_o, sy_i, sy_n, scale,
    HAS_MASK: tl.constexpr, LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One long row per program: a running (max, sum) sweep, then a writing sweep."""
    scale = _float_arg(scale, ACC)
    row = tl.program_id(0)
    x_base = row_offsets(row, inner, sx_o, sx_i)
    m_base = row_offsets(row, inner, sm_o, sm_i)
    y_base = row_offsets(row, inner, sy_o, sy_i)
    cols = tl.arange(0, BLOCK_N)
    lane_max = tl.full([BLOCK_N], float("-inf"), ACC)
    lane_sum = tl.zeros([BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        ok = c < N
        z = tl.load(x_ptr + x_base + c * sx_n, mask=ok, other=0.0).to(ACC) * scale
        if HAS_MASK:
            z += tl.load(mask_ptr + m_base + c * sm_n, mask=ok, other=0.0).to(ACC)
        z = tl.where(ok, z, float("-inf"))
        new_max = tl.maximum(lane_max, z)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(z - shift)
        lane_max = new_max
    row_max = tl.max(lane_max, 0)
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(lane_sum * tl.exp(lane_max - row_max), 0)
    dead = row_sum == 0.0
    safe_sum = tl.where(dead, 1.0, row_sum)
    log_sum = tl.where(dead, float("inf"), tl.log(safe_sum))
    inv_sum = tl.where(dead, 0.0, 1.0 / safe_sum)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        ok = c < N
        z = tl.load(x_ptr + x_base + c * sx_n, mask=ok, other=0.0).to(ACC) * scale
        if HAS_MASK:
            z += tl.load(mask_ptr + m_base + c * sm_n, mask=ok, other=0.0).to(ACC)
        if LOG:
            y = (z - row_max) - log_sum
        else:
            y = tl.exp(z - row_max) * inv_sum
        tl.store(y_ptr + y_base + c * sy_n, y.to(y_ptr.dtype.element_ty), mask=ok)


@autotune(num_warps_configs(), key=["BLOCK_M", "BLOCK_N", "LOG"], default=0,
          prune_configs_by={"early_config_prune": prune_by_elements_per_thread})
@triton.jit
def softmax_bwd_kernel(
    gy_ptr, y_ptr, gx_ptr, n_rows, N, inner,
    sg_o, sg_i, sg_n, sy_o, sy_i, sy_n, sx_o, sx_i, sx_n, scale,
    LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """gx = scale * y * (gy - <gy, y>)  or, for log_softmax, scale * (gy - exp(y) * sum(gy))."""
    scale = _float_arg(scale, ACC)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ok = (rows < n_rows)[:, None] & (cols < N)[None, :]
    gy = tl.load(gy_ptr + row_offsets(rows, inner, sg_o, sg_i)[:, None] + cols[None, :] * sg_n,
                 mask=ok, other=0.0).to(ACC)
    y_off = row_offsets(rows, inner, sy_o, sy_i)[:, None] + cols[None, :] * sy_n
    if LOG:
        p = tl.exp(tl.load(y_ptr + y_off, mask=ok, other=float("-inf")).to(ACC))
        gx = gy - p * tl.sum(gy, 1)[:, None]
    else:
        y = tl.load(y_ptr + y_off, mask=ok, other=0.0).to(ACC)
        gx = y * (gy - tl.sum(gy * y, 1)[:, None])
    gx_off = row_offsets(rows, inner, sx_o, sx_i)[:, None] + cols[None, :] * sx_n
    tl.store(gx_ptr + gx_off, (gx * scale).to(gx_ptr.dtype.element_ty), mask=ok)


@triton.jit
def softmax_bwd_online_kernel(
    gy_ptr, y_ptr, gx_ptr, n_rows, N, inner,
    sg_o, sg_i, sg_n, sy_o, sy_i, sy_n, sx_o, sx_i, sx_n, scale,
    LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One long row per program: a sweep for the row's reduction, a sweep writing gx."""
    scale = _float_arg(scale, ACC)
    row = tl.program_id(0)
    g_base = row_offsets(row, inner, sg_o, sg_i)
    y_base = row_offsets(row, inner, sy_o, sy_i)
    x_base = row_offsets(row, inner, sx_o, sx_i)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        ok = c < N
        gy = tl.load(gy_ptr + g_base + c * sg_n, mask=ok, other=0.0).to(ACC)
        if LOG:
            acc += gy
        else:
            acc += gy * tl.load(y_ptr + y_base + c * sy_n, mask=ok, other=0.0).to(ACC)
    total = tl.sum(acc, 0)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        ok = c < N
        gy = tl.load(gy_ptr + g_base + c * sg_n, mask=ok, other=0.0).to(ACC)
        y = tl.load(y_ptr + y_base + c * sy_n, mask=ok, other=0.0).to(ACC)
        if LOG:
            gx = gy - tl.exp(y) * total
        else:
            gx = y * (gy - total)
        tl.store(gx_ptr + x_base + c * sx_n, (gx * scale).to(gx_ptr.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _collapse(sizes, strides) -> tuple[int, int] | None:
    """(size, stride) of consecutive dims merged into one, or None if their strides do not allow it."""
    dims = [(s, st) for s, st in zip(sizes, strides) if s != 1]
    if not dims:
        return 1, 0
    size, stride = dims[-1]
    for s, st in reversed(dims[:-1]):
        if st != stride * size:
            return None
        size *= s
    return size, stride


def row_view(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, int, int], tuple[int, int, int]]:
    """(t or a contiguous copy, (outer, N, inner), (stride_outer, stride_inner, stride_N)) for rows along ``dim``."""
    sizes, strides = list(t.shape), list(t.stride())
    outer = _collapse(sizes[:dim], strides[:dim])
    inner = _collapse(sizes[dim + 1:], strides[dim + 1:])
    if outer is None or inner is None:
        t = t.contiguous()
        strides = list(t.stride())
        outer = _collapse(sizes[:dim], strides[:dim])
        inner = _collapse(sizes[dim + 1:], strides[dim + 1:])
    n, s_n = (sizes[dim], strides[dim]) if t.dim() > 0 else (1, 0)
    return t, (outer[0], n, inner[0]), (outer[1], inner[1], s_n)


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """The dtype the softmax and loss kernels compute in: fp64 for fp64 data (float64-accurate), else fp32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def _blocks(n_rows: int, n: int, max_fused_n: int) -> tuple[int, int] | None:
    """(BLOCK_M, BLOCK_N) for the in-register kernel, or None when the row is too long for it."""
    if n > max_fused_n:
        return None
    block_n = triton.next_power_of_2(max(n, 1))
    block_m = min(max(1, TILE_ELEMENTS // block_n), triton.next_power_of_2(max(n_rows, 1)))
    return block_m, block_n


def softmax_fwd(x: torch.Tensor, dim: int, *, scale: float = 1.0, mask: torch.Tensor | None = None,
                log: bool = False, max_fused_n: int = MAX_FUSED_N) -> torch.Tensor:
    """y = (log_)softmax(scale * x + mask) along ``dim`` (normalised, 0 <= dim < x.dim()); y has x's shape and dtype.

    ``mask`` (any float dtype) must broadcast to x's shape; it is read through zero strides, so a
    [1, N] or [M, 1] mask is never expanded in memory.
    """
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    x, (outer, n, inner), (sx_o, sx_i, sx_n) = row_view(x, dim)
    _, _, (sy_o, sy_i, sy_n) = row_view(y, dim)
    if mask is not None:
        mask, _, (sm_o, sm_i, sm_n) = row_view(mask.expand(x.shape), dim)
    else:
        mask, (sm_o, sm_i, sm_n) = x, (0, 0, 0)
    n_rows = outer * inner
    args = (x, mask, y, n_rows, n, inner, sx_o, sx_i, sx_n, sm_o, sm_i, sm_n, sy_o, sy_i, sy_n, _float_bits(scale))
    acc = compute_dtype(x.dtype)
    blocks = _blocks(n_rows, n, max_fused_n)
    if blocks is None:
        softmax_fwd_online_kernel[(n_rows,)](*args, HAS_MASK=mask is not x, LOG=log, ACC=acc,
                                             BLOCK_N=min(ONLINE_BLOCK_N, max_fused_n), num_warps=8)
    else:
        block_m, block_n = blocks
        softmax_fwd_kernel[(cdiv(n_rows, block_m),)](*args, HAS_MASK=mask is not x, LOG=log, ACC=acc,
                                                            BLOCK_M=block_m, BLOCK_N=block_n)
    return y


def softmax_bwd(gy: torch.Tensor, y: torch.Tensor, dim: int, *, scale: float = 1.0, log: bool = False,
                max_fused_n: int = MAX_FUSED_N) -> torch.Tensor:
    """gx (y's shape and dtype) from gy and the forward output y of (log_)softmax(scale * x + mask) along ``dim``."""
    gx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if y.numel() == 0:
        return gx
    gy, (outer, n, inner), (sg_o, sg_i, sg_n) = row_view(gy, dim)
    y, _, (sy_o, sy_i, sy_n) = row_view(y, dim)
    _, _, (sx_o, sx_i, sx_n) = row_view(gx, dim)
    n_rows = outer * inner
    args = (gy, y, gx, n_rows, n, inner, sg_o, sg_i, sg_n, sy_o, sy_i, sy_n, sx_o, sx_i, sx_n, _float_bits(scale))
    acc = compute_dtype(y.dtype)
    blocks = _blocks(n_rows, n, max_fused_n)
    if blocks is None:
        softmax_bwd_online_kernel[(n_rows,)](*args, LOG=log, ACC=acc, BLOCK_N=min(ONLINE_BLOCK_N, max_fused_n),
                                             num_warps=8)
    else:
        block_m, block_n = blocks
        softmax_bwd_kernel[(cdiv(n_rows, block_m),)](*args, LOG=log, ACC=acc, BLOCK_M=block_m, BLOCK_N=block_n)
    return gx
