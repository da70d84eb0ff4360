"""Scan kernels: cumsum, cumprod and logcumsumexp along one dim, forward or reversed.

scan(x, *, dim, op, reverse=False) -> y     # op "sum" | "prod" | "logsumexp"; y[..., i, ...] = op over
                                           # x[..., :i+1, ...] (x[..., i:, ...] when reverse)
ints and bool scan to int64 (like torch's cumsum/cumprod), floats keep their dtype; the arithmetic is
fp32 for fp16/bf16/fp32 (fp64 for fp64, int64 for integers).

Every scan is a set of rows [M, N] (the scanned dim last; other layouts are viewed as rows when
their dims merge, copied otherwise). A program scans one segment of a row (of several short rows) tile by
tile (``tl.cumsum``/``tl.cumprod``/``tl.associative_scan``), carrying the running total from tile to tile. Rows long enough that M
programs would leave the GPU idle (a few rows of 1M) are cut into segments scanned in parallel:
pass 1 reduces every segment to its total, pass 2 scans those totals per row (the same kernel on a
[M, S] array), pass 3 rescans each segment starting from the scanned total of the segments before
it. That reads x twice (12 bytes per fp32 element moved instead of 8) but every pass is
bandwidth-bound on all SMs. ``reverse`` maps the logical column c to memory column N-1-c in every
load and store, so the gradient of cumsum (a reversed cumsum) needs no flipped copy.

logsumexp combines a and b as max + log(1 + exp(-|a - b|)): -inf with -inf stays -inf, equal
infinities stay themselves, NaN propagates.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ge2.runtime import cdiv

SUM, PROD, LOGSUMEXP = (tl.constexpr(i) for i in range(3))
_OPS = {"sum": SUM, "prod": PROD, "logsumexp": LOGSUMEXP}
_ACC = {torch.float64: tl.float64, torch.float32: tl.float32, torch.float16: tl.float32, torch.bfloat16: tl.float32}
_TORCH_ACC = {tl.float64: torch.float64, tl.float32: torch.float32, tl.int64: torch.int64}

BLOCK = 1024
# Rows are cut into segments when fewer than this many programs would run (module-level so tests
# can exercise the segmented path on small inputs).
MIN_PROGRAMS = None


@triton.jit
def _log_add_exp(a, b):
    hi = tl.where(a > b, a, b)
    gap = tl.where(a == b, 0.0, -tl.abs(a - b))  # equal infinities: no inf - inf
    return hi + tl.log(1.0 + tl.exp(gap))


@triton.jit
def _combine(a, b, OP: tl.constexpr):
    if OP == SUM:
        return a + b
    elif OP == PROD:
        return a * b
    else:
        return _log_add_exp(a, b)


@triton.jit
def _identity(OP: tl.constexpr, ACC: tl.constexpr, ROWS: tl.constexpr):
    if OP == SUM:
        return tl.zeros([ROWS], ACC)
    elif OP == PROD:
        return tl.full([ROWS], 1, ACC)
    else:
        return tl.full([ROWS], float("-inf"), ACC)


@triton.jit
def _scan_tile(x, OP: tl.constexpr):
    # tl.cumsum / tl.cumprod: the interpreter runs these as NumPy scans, a custom combine element by element
    if OP == SUM:
        return tl.cumsum(x, 1)
    elif OP == PROD:
        return tl.cumprod(x, 1)
    else:
        return tl.associative_scan(x, 1, _log_add_exp)


@triton.jit
def _scan_kernel(
    x_ptr, y_ptr, carry_ptr, M, N, segment, stride_xm, stride_xn, stride_ym, stride_cm,
    OP: tl.constexpr, ACC: tl.constexpr, REVERSE: tl.constexpr, TOTAL_ONLY: tl.constexpr,
    HAS_CARRY: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Scan logical columns [s * segment, (s + 1) * segment) of ROWS rows (program (row block, s)).

    TOTAL_ONLY: write only each row's segment total, to y[m, s]. HAS_CARRY: start from carry[m, s - 1]
    (the combined totals of the segments before) instead of the identity.
    """
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_live = rows < M
    seg = tl.program_id(1)
    start = seg.to(tl.int64) * segment
    end = tl.minimum(start + segment, N)
    identity = _identity(OP, ACC, ROWS)
    carry = identity
    if HAS_CARRY:
        if seg > 0:
            carry = tl.load(carry_ptr + rows * stride_cm + seg - 1, mask=row_live, other=0).to(ACC)
    for tile in range(start, end, BLOCK):
        cols = tile + tl.arange(0, BLOCK)
        live = row_live[:, None] & (cols < end)[None, :]
        if REVERSE:
            mem = N - 1 - cols
        else:
            mem = cols
        x = tl.load(x_ptr + rows[:, None] * stride_xm + mem[None, :] * stride_xn, mask=live, other=0).to(ACC)
        x = tl.where(live, x, identity[:, None])
        y = _combine(carry[:, None], _scan_tile(x, OP), OP)
        if not TOTAL_ONLY:
            tl.store(y_ptr + rows[:, None] * stride_ym + mem[None, :], y.to(y_ptr.dtype.element_ty), mask=live)
        # the running total is the scan at the tile's last column (a masked sum picks it out)
        last = tl.minimum(end, tile + BLOCK) - 1
        carry = tl.sum(tl.where((cols == last)[None, :], y, 0), axis=1)
    if TOTAL_ONLY:
        tl.store(y_ptr + rows * stride_ym + seg, carry.to(y_ptr.dtype.element_ty), mask=row_live)


@functools.lru_cache(maxsize=None)
def _min_programs(device_index: int | None) -> int:
    if device_index is None:
        return 8
    return 4 * torch.cuda.get_device_properties(device_index).multi_processor_count


def _launch(x2, y2, op, acc, reverse, M, N):
    """Scan the rows of x2 [M, N] (any strides) into y2 [M, N] (contiguous rows)."""
    target = MIN_PROGRAMS or _min_programs(x2.device.index if x2.device.type == "cuda" else None)
    segments = 1 if M >= target else min(cdiv(target, M), cdiv(N, BLOCK))
    if segments <= 1:
        _rows_launch(x2, y2, y2, M, N, N, 1, y2.stride(0), 0, op, acc, reverse, False, False)
        return
    segment = cdiv(cdiv(N, segments), BLOCK) * BLOCK
    segments = cdiv(N, segment)
    totals = torch.empty((M, segments), dtype=_TORCH_ACC[acc], device=x2.device)
    _rows_launch(x2, totals, totals, M, N, segment, segments, segments, 0, op, acc, reverse, True, False)
    # The segment totals are in logical order (reversed already when reverse): scan them forward.
    _rows_launch(totals, totals, totals, M, segments, segments, 1, segments, 0, op, acc, False, False, False)
    _rows_launch(x2, y2, totals, M, N, segment, segments, y2.stride(0), segments, op, acc, reverse, False, True)


def _rows_launch(x2, y2, carry, M, N, segment, segments, stride_ym, stride_cm, op, acc, reverse, total_only, has_carry):
    # Short rows share a program (ROWS of them), so a tile holds about BLOCK elements either way.
    block = min(BLOCK, triton.next_power_of_2(min(N, segment)))
    rows = min(BLOCK // block, triton.next_power_of_2(M))
    _scan_kernel[(cdiv(M, rows), segments)](
        x2, y2, carry, M, N, segment, x2.stride(0), x2.stride(1), stride_ym, stride_cm, OP=op, ACC=acc,
        REVERSE=reverse, TOTAL_ONLY=total_only, HAS_CARRY=has_carry, ROWS=rows, BLOCK=block, num_warps=4)


def scan(x: torch.Tensor, *, dim: int, op: str, reverse: bool = False) -> torch.Tensor:
    """Inclusive scan of x [..] along dim with op ("sum", "prod", "logsumexp") -> y like x (ints -> int64)."""
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.int64
    if x.dim() == 0:
        return _scan_flat(x.reshape(1), op, reverse, out_dtype).reshape(())
    dim = dim % x.dim()
    moved = x.movedim(dim, -1)
    N = moved.shape[-1]
    M = math.prod(moved.shape[:-1])
    y = torch.empty(moved.shape, dtype=out_dtype, device=x.device)
    if M and N:
        x2 = moved.reshape(M, N)  # a view when the kept dims merge, else a copy
        acc = _ACC.get(x.dtype, tl.int64)
        _launch(x2, y.view(M, N), _OPS[op], acc, bool(reverse), M, N)
    return y.movedim(-1, dim)


def _scan_flat(x, op, reverse, out_dtype):
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    _launch(x.reshape(1, -1), y.view(1, -1), _OPS[op], _ACC.get(x.dtype, tl.int64), bool(reverse), 1, x.numel())
    return y

