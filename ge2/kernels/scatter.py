"""Gather and scatter along one dim: the kernels every indexing op of ge2 ends in.

Every op is seen as a 3-level walk ``[P, B, Q]``: P the dims before the indexed one, B the
positions of the index, Q the dims after it. For ``gather(x, d, index)`` these are index's own
dims; for ``x[:, idx]`` and ``index_select`` the index has only B and is broadcast over P and Q
(index strides 0: ``IDX_ROW`` loads it once per row). The source (gather) or destination
(scatter) address is ``P-offset + index * stride_d + Q-offset``; P and Q offsets come from one
stride where the dims merge (a contiguous tensor's always do), else from an int64 table that
``digits_kernel`` fills (a strided view written in place, e.g. ``x[::2][idx] = v``).

Index checking: a negative index wraps once (``WRAP``, torch's rule for ``x[-1]``, not for
``gather``); an index still outside ``[0, size)`` is never read or written (gather writes 0 in its
place) and counts in a device int32 counter. ``report_bad_indices`` turns the count into a
ValueError: at once on the CPU or with ``check=True`` (a 4-byte read that waits for the GPU); on
the GPU by default without a host sync, the count copied to pinned memory behind an event and
raised by the next indexing call that finds the copy done, or by ``check_pending_indices()``; not
in a CUDA graph being captured.

Accumulation: ``scatter`` with ``mode="add"`` uses atomics (fp32/fp64/int32/int64 in place;
fp16/bf16 and small ints through a 32-bit copy), one pass without a sort, as torch's CUDA
index_add/scatter_add do: the order of additions, so the last bits of a float sum, can vary
between GPU runs. ``prod``, ``amax`` and ``amin`` use ``scatter_serial_kernel``: one program per
(P, Q-block) walks B in order, so each destination element is read-modified-written by one thread
only: no atomics, deterministic, NaN-propagating like torch, at the price of parallelism only
over P x Q.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ge2.kernels.deferred import DeferredCounts
from ge2.runtime import cdiv

HALF_DTYPES = (torch.float16, torch.bfloat16)
ATOMIC_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
FLOAT_MODES = {"prod": 0, "amax": 1, "amin": 2}


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def digits_kernel(src_ptr, out_ptr, n, div, size, mult, out_stride,
                  FROM_SRC: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """out[i * out_stride] (+)= ((v // div) % size) * mult, v = src[i] or i: one dim of an unravel."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if FROM_SRC:
        v = tl.load(src_ptr + i, mask=m, other=0).to(tl.int64)
    else:
        v = i
    d = (v // div) % size * mult
    if ACC:
        d += tl.load(out_ptr + i * out_stride, mask=m, other=0)
    tl.store(out_ptr + i * out_stride, d, mask=m)


@triton.jit
def count_bad(bad_ptr, n):
    """Add n out-of-range indices to the counter; no atomic when n is 0 (one address, every program)."""
    if n > 0:
        tl.atomic_add(bad_ptr, n, sem="relaxed")  # a plain count: no ordering needed


@triton.jit
def _wrap_check(i, size, WRAP: tl.constexpr):
    """(index with one wrap of negatives if WRAP, whether it lies in [0, size))."""
    if WRAP:
        i = tl.where(i < 0, i + size, i)
    return i, (i >= 0) & (i < size)


@triton.jit
def _walk_rows(BLOCK_R: tl.constexpr, ROWS32: tl.constexpr):
    """This program's row numbers r = p * B + b: int32 where every row number fits (ROWS32), as the
    split into (p, b) is then a 32-bit division instead of a 64-bit division's subroutine call."""
    if ROWS32:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    return rows


@triton.jit
def _outer_offsets(rows, cols, live_r, live_c, B, sp, sq, ptab_ptr, qtab_ptr,
                   PTAB: tl.constexpr, QTAB: tl.constexpr):
    """(p, b, P-offsets [rows], Q-offsets [cols]) of the walk's rows r = p * B + b (p, b int64)."""
    p = rows // B
    b = (rows - p * B).to(tl.int64)
    p = p.to(tl.int64)
    if PTAB:
        po = tl.load(ptab_ptr + p, mask=live_r, other=0)
    else:
        po = p * sp
    if QTAB:
        qo = tl.load(qtab_ptr + cols, mask=live_c, other=0)
    else:
        qo = cols * sq
    return p, b, po, qo


@triton.jit
def gather_kernel(src_ptr, idx_ptr, out_ptr, bad_ptr, R, B, Q, size_d, stride_d, sp, sq, ptab_ptr, qtab_ptr,
                  sip, sib, siq, WRAP: tl.constexpr, CHECK: tl.constexpr, IDX_ROW: tl.constexpr,
                  PTAB: tl.constexpr, QTAB: tl.constexpr, ROWS32: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_Q: tl.constexpr):
    """out[r, q] (contiguous [P*B, Q]) = src[P-off(p) + index[p, b, q] * stride_d + Q-off(q)]."""
    rows = _walk_rows(BLOCK_R, ROWS32)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    live_r, live_c = rows < R, cols < Q
    p, b, po, qo = _outer_offsets(rows, cols, live_r, live_c, B, sp, sq, ptab_ptr, qtab_ptr, PTAB, QTAB)
    m = live_r[:, None] & live_c[None, :]
    if IDX_ROW:  # one index per row, shared by its Q columns
        i = tl.load(idx_ptr + p * sip + b * sib, mask=live_r, other=0).to(tl.int64)
        i, valid = _wrap_check(i, size_d, WRAP)
        ok = m & valid[:, None]
        off = (po + i * stride_d)[:, None] + qo[None, :]
        if CHECK:
            if tl.program_id(1) == 0:  # each index once (it is shared by the P rows: count at p == 0)
                count_bad(bad_ptr, tl.sum(tl.where(live_r & ~valid & ((p == 0) | (sip != 0)), 1, 0), axis=0))
    else:
        i = tl.load(idx_ptr + (p * sip + b * sib)[:, None] + cols[None, :] * siq, mask=m, other=0).to(tl.int64)
        i, valid = _wrap_check(i, size_d, WRAP)
        ok = m & valid
        off = po[:, None] + i * stride_d + qo[None, :]
        if CHECK:  # an index shared by several p or q (stride 0) counts once
            own = ((p == 0) | (sip != 0))[:, None] & ((cols == 0) | (siq != 0))[None, :]
            count_bad(bad_ptr, tl.sum(tl.sum(tl.where(m & ~valid & own, 1, 0), axis=1), axis=0))
    v = tl.load(src_ptr + off, mask=ok, other=0)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * Q + cols[None, :], v.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def scatter_kernel(dst_ptr, idx_ptr, val_ptr, bad_ptr, R, B, Q, size_d, stride_d, sp, sq, ptab_ptr, qtab_ptr,
                   sip, sib, siq, svp, svb, svq, alpha, ADD: tl.constexpr, ALPHA: tl.constexpr,
                   WRAP: tl.constexpr, CHECK: tl.constexpr, IDX_ROW: tl.constexpr, PTAB: tl.constexpr,
                   QTAB: tl.constexpr, ROWS32: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr):
    """dst[P-off(p) + index[p, b, q] * stride_d + Q-off(q)] = (or +=, atomically) alpha * val[p, b, q]."""
    rows = _walk_rows(BLOCK_R, ROWS32)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    live_r, live_c = rows < R, cols < Q
    p, b, po, qo = _outer_offsets(rows, cols, live_r, live_c, B, sp, sq, ptab_ptr, qtab_ptr, PTAB, QTAB)
    m = live_r[:, None] & live_c[None, :]
    if IDX_ROW:
        i = tl.load(idx_ptr + p * sip + b * sib, mask=live_r, other=0).to(tl.int64)
        i, valid = _wrap_check(i, size_d, WRAP)
        ok = m & valid[:, None]
        off = (po + i * stride_d)[:, None] + qo[None, :]
        if CHECK:
            if tl.program_id(1) == 0:  # each index once (it is shared by the P rows: count at p == 0)
                count_bad(bad_ptr, tl.sum(tl.where(live_r & ~valid & ((p == 0) | (sip != 0)), 1, 0), axis=0))
    else:
        i = tl.load(idx_ptr + (p * sip + b * sib)[:, None] + cols[None, :] * siq, mask=m, other=0).to(tl.int64)
        i, valid = _wrap_check(i, size_d, WRAP)
        ok = m & valid
        off = po[:, None] + i * stride_d + qo[None, :]
        if CHECK:  # an index shared by several p or q (stride 0) counts once
            own = ((p == 0) | (sip != 0))[:, None] & ((cols == 0) | (siq != 0))[None, :]
            count_bad(bad_ptr, tl.sum(tl.sum(tl.where(m & ~valid & own, 1, 0), axis=1), axis=0))
    v = tl.load(val_ptr + (p * svp + b * svb)[:, None] + cols[None, :] * svq, mask=ok, other=0)
    if ALPHA:
        v = v * alpha
    v = v.to(dst_ptr.dtype.element_ty)
    if ADD:  # relaxed, as CUDA's atomicAdd: the default acq_rel puts a fence and an L1 flush around each one
        tl.atomic_add(dst_ptr + off, v, mask=ok, sem="relaxed")
    else:
        tl.store(dst_ptr + off, v, mask=ok)


@triton.jit
def scatter_serial_kernel(dst_ptr, idx_ptr, val_ptr, bad_ptr, B, Q, size_d, stride_d, sp, sq, ptab_ptr, qtab_ptr,
                          sip, sib, siq, svp, svb, svq, MODE: tl.constexpr, PTAB: tl.constexpr,
                          QTAB: tl.constexpr, BLOCK_Q: tl.constexpr):
    """dst[...index[p, b, q]...] = op(dst, val[p, b, q]) for b in order (op: 0 prod, 1 max, 2 min; NaN wins)."""
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    live = cols < Q
    if PTAB:
        po = tl.load(ptab_ptr + p)
    else:
        po = p * sp
    if QTAB:
        qo = tl.load(qtab_ptr + cols, mask=live, other=0)
    else:
        qo = cols * sq
    n_bad = tl.zeros((BLOCK_Q,), dtype=tl.int32)
    for b in range(0, B):
        i = tl.load(idx_ptr + p * sip + b * sib + cols * siq, mask=live, other=0).to(tl.int64)
        valid = (i >= 0) & (i < size_d)
        ok = live & valid
        n_bad += tl.where(live & ~valid, 1, 0)
        v = tl.load(val_ptr + p * svp + b * svb + cols * svq, mask=ok, other=0).to(dst_ptr.dtype.element_ty)
        off = po + i * stride_d + qo
        d = tl.load(dst_ptr + off, mask=ok, other=0)
        if MODE == 0:
            r = d * v
        elif MODE == 1:
            r = tl.where((d > v) | (d != d), d, v)
        else:
            r = tl.where((d < v) | (d != d), d, v)
        tl.store(dst_ptr + off, r, mask=ok)
    count_bad(bad_ptr, tl.sum(n_bad, axis=0))


@triton.jit
def mean_finalize_kernel(acc_ptr, cnt_ptr, n, IS_INT: tl.constexpr, BLOCK: tl.constexpr):
    """acc[i] /= max(cnt[i], 1) in place (floor division for integers, as torch's scatter_reduce mean)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    a = tl.load(acc_ptr + i, mask=m, other=0)
    c = tl.maximum(tl.load(cnt_ptr + i, mask=m, other=1), 1)
    if IS_INT:
        q = a // c
        q = tl.where((q * c != a) & ((a < 0) != (c < 0)), q - 1, q)
    else:
        q = a / c
    tl.store(acc_ptr + i, q.to(acc_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------------------------
# index checks (deferred on the GPU)
# ---------------------------------------------------------------------------------------------
_DEFERRED = DeferredCounts(" (found by an earlier call and reported without a host sync; "
                           "ge2.check_pending_indices() waits for them)")


def new_counter(device: torch.device) -> torch.Tensor:
    """A device int32 [1] zero: the kernels count out-of-range indices into it."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def report_bad_indices(op: str, bad: torch.Tensor, what: str, check: bool | None = None) -> None:
    """Raise ValueError if ``bad`` counts out-of-range indices: now (CPU, check=True), deferred
    (GPU default: pinned copy behind an event, raised by a later call), never (check=False, capture)."""
    _DEFERRED.report(bad, lambda n_bad: f"{op}: {n_bad} index value(s) out of range: {what}", check)


def check_pending_indices(wait: bool = True) -> None:
    """Raise the first out-of-range count that earlier GPU indexing calls left (waiting for them if ``wait``)."""
    _DEFERRED.raise_pending(wait)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _block(n: int, cap: int) -> int:
    return min(triton.next_power_of_2(max(n, 1)), cap)


def offsets_table(sizes, strides, device: torch.device) -> torch.Tensor:
    """int64 [prod(sizes)]: the memory offset of every element of dims ``sizes`` x ``strides`` (row-major)."""
    n = 1
    for s in sizes:
        n *= s
    out = torch.empty(n, dtype=torch.int64, device=device)
    if n == 0:
        return out
    inner, first = 1, True
    block = _block(n, 1024)
    for size, stride in reversed(list(zip(sizes, strides))):
        digits_kernel[(cdiv(n, block),)](out, out, n, inner, size, stride, 1, FROM_SRC=False, ACC=not first,
                                         BLOCK=block)
        inner, first = inner * size, False
    return out


class Axis:
    """The P or Q part of a walk: dims ``sizes`` with ``strides`` -> (count, one stride or a table)."""

    def __init__(self, sizes, strides, device: torch.device, table: bool = True):
        dims = [(s, st) for s, st in zip(sizes, strides) if s != 1]
        self.count = 1
        for s, _ in dims:
            self.count *= s
        self.table = None
        self.stride = dims[-1][1] if dims else 0
        self.merged = all(st0 == st1 * s1 for (s0, st0), (s1, st1) in zip(dims, dims[1:]))
        if not self.merged and table:  # dims that do not merge into one stride: a table of offsets
            self.stride = 0
            self.table = offsets_table([s for s, _ in dims], [st for _, st in dims], device)


def _rows32(R: int, block_r: int) -> bool:
    """Whether every row number of the last row block fits in int32."""
    return cdiv(R, block_r) * block_r < 2 ** 31


def _tiles(R: int, Q: int) -> tuple[int, int, int]:
    bq = _block(Q, 256)
    br = _block(R, max(1, 2048 // bq))
    return br, bq, 8 if br * bq >= 2048 else 4


def gather_walk(src: torch.Tensor, pre: tuple, post: tuple, d_size: int, d_stride: int,
                idx: torch.Tensor, idx_strides: tuple[int, int, int], B: int, out: torch.Tensor,
                bad: torch.Tensor | None, wrap: bool) -> torch.Tensor:
    """out (contiguous, P*B*Q elements) = src gathered along one dim.

    pre/post: (sizes, strides) of src's dims before/after the gathered one; idx read at
    p * sip + b * sib + q * siq (idx_strides); bad: the counter (None: offsets known valid).
    """
    P, Qx = Axis(*pre, src.device), Axis(*post, src.device)
    R, Q = P.count * B, Qx.count
    if R == 0 or Q == 0:
        return out
    br, bq, warps = _tiles(R, Q)
    sip, sib, siq = idx_strides
    gather_kernel[(cdiv(R, br), cdiv(Q, bq))](
        src, idx, out, bad if bad is not None else idx, R, B, Q, d_size, d_stride, P.stride, Qx.stride,
        P.table if P.table is not None else idx, Qx.table if Qx.table is not None else idx, sip, sib, siq,
        WRAP=wrap, CHECK=bad is not None, IDX_ROW=siq == 0 and Q > 1, PTAB=P.table is not None,
        QTAB=Qx.table is not None, ROWS32=_rows32(R, br), BLOCK_R=br, BLOCK_Q=bq, num_warps=warps)
    return out


def scatter_walk(dst: torch.Tensor, pre: tuple, post: tuple, d_size: int, d_stride: int,
                 idx: torch.Tensor, idx_strides: tuple[int, int, int], B: int, val: torch.Tensor,
                 val_strides: tuple[int, int, int], bad: torch.Tensor | None, wrap: bool, mode: str = "store",
                 alpha=None) -> None:
    """dst[...] = / += / op= val along one dim, in place (``mode``: store, add, prod, amax, amin).

    dst must be fp32/fp64/int32/int64 for ``add`` (the caller accumulates other dtypes in a copy)."""
    P, Qx = Axis(*pre, dst.device), Axis(*post, dst.device)
    R, Q = P.count * B, Qx.count
    if R == 0 or Q == 0:
        return
    sip, sib, siq = idx_strides
    svp, svb, svq = val_strides
    ptab = P.table if P.table is not None else idx
    qtab = Qx.table if Qx.table is not None else idx
    counter = bad if bad is not None else torch.zeros(1, dtype=torch.int32, device=dst.device)
    if mode in FLOAT_MODES:
        bq = _block(Q, 256)
        scatter_serial_kernel[(P.count, cdiv(Q, bq))](
            dst, idx, val, counter, B, Q, d_size, d_stride, P.stride, Qx.stride, ptab, qtab, sip, sib, siq,
            svp, svb, svq, MODE=FLOAT_MODES[mode], PTAB=P.table is not None, QTAB=Qx.table is not None,
            BLOCK_Q=bq, num_warps=4)
        return
    br, bq, warps = _tiles(R, Q)
    scatter_kernel[(cdiv(R, br), cdiv(Q, bq))](
        dst, idx, val, counter, R, B, Q, d_size, d_stride, P.stride, Qx.stride, ptab, qtab, sip, sib, siq,
        svp, svb, svq, alpha if alpha is not None else 1, ADD=mode == "add", ALPHA=alpha is not None and alpha != 1,
        WRAP=wrap, CHECK=bad is not None, IDX_ROW=siq == 0 and Q > 1, PTAB=P.table is not None,
        QTAB=Qx.table is not None, ROWS32=_rows32(R, br), BLOCK_R=br, BLOCK_Q=bq, num_warps=warps)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype atomics add in for ``dtype`` (itself where the hardware adds it atomically)."""
    if dtype in ATOMIC_DTYPES:
        return dtype
    return torch.float32 if dtype.is_floating_point else torch.int32


def mean_finalize(acc: torch.Tensor, cnt: torch.Tensor) -> None:
    """acc /= max(cnt, 1) in place (both contiguous, same shape)."""
    n = acc.numel()
    if n:
        block = _block(n, 1024)
        mean_finalize_kernel[(cdiv(n, block),)](acc, cnt, n, IS_INT=not acc.dtype.is_floating_point, BLOCK=block)


# ---------------------------------------------------------------------------------------------
# gather / scatter along a dim (torch's gather, scatter, scatter_add, scatter_reduce)
# ---------------------------------------------------------------------------------------------
def _dim_walk(t: torch.Tensor, shape, dim: int):
    """(pre, post) (sizes, strides) of t's dims around ``dim``, walked over ``shape`` (index's sizes)."""
    return ((tuple(shape[:dim]), tuple(t.stride()[:dim])), (tuple(shape[dim + 1:]), tuple(t.stride()[dim + 1:])))


def _walk_strides(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """t (index or values) read as a [P, B, Q] walk around ``dim``: (t, its three strides), read in place
    when its dims before and after ``dim`` merge (an expanded index [N, 1] -> [N, D] does: stride 0), else
    from a contiguous copy."""
    shape, strides = tuple(t.shape), t.stride()
    pre, post = Axis(shape[:dim], strides[:dim], t.device, table=False), \
        Axis(shape[dim + 1:], strides[dim + 1:], t.device, table=False)
    if pre.merged and post.merged:
        return t, (pre.stride, strides[dim], post.stride)
    t = t.contiguous()
    q = math.prod(shape[dim + 1:])
    return t, (shape[dim] * q, q, 1)


def gather(x: torch.Tensor, dim: int, index: torch.Tensor, check: bool | None = None) -> torch.Tensor:
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along ``dim``: out has index's shape and x's dtype."""
    out = torch.empty(index.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    idx, strides = _walk_strides(index, dim)
    pre, post = _dim_walk(x, index.shape, dim)
    bad = new_counter(x.device)
    gather_walk(x, pre, post, x.shape[dim], x.stride(dim), idx, strides, index.shape[dim], out, bad, wrap=False)
    report_bad_indices("gather", bad, f"gather indices must be in [0, {x.shape[dim]}) along dim {dim}", check)
    return out


def scatter(x: torch.Tensor, dim: int, index: torch.Tensor, src, reduce: str = "store",
            include_self: bool = True, alpha=None, op: str = "scatter", check: bool | None = None) -> torch.Tensor:
    """A copy of x with ``src`` (tensor at least index's shape, or a number) scattered along ``dim``.

    reduce: store (scatter), add (scatter_add / sum), mean, prod, amax, amin (scatter_reduce)."""
    if reduce == "sum":
        reduce = "add"
    index_shape = tuple(index.shape)
    n = index.numel()
    if isinstance(src, torch.Tensor):
        val, val_strides = _walk_strides(src[tuple(slice(0, s) for s in index_shape)], dim)
    else:
        val, val_strides = torch.full((1,), src, dtype=x.dtype, device=x.device), (0, 0, 0)
    idx, strides = _walk_strides(index, dim)
    B = index_shape[dim] if index_shape else 1
    acc_dtype = x.dtype
    if reduce in ("add", "mean"):
        acc_dtype = accumulate_dtype(x.dtype)
    elif reduce in FLOAT_MODES and x.dtype in HALF_DTYPES:
        acc_dtype = torch.float32
    out = torch.empty(x.shape, dtype=acc_dtype, device=x.device)
    out.copy_(x)
    if n == 0:
        return out if acc_dtype == x.dtype else out.to(x.dtype)
    pre, post = _dim_walk(out, index_shape, dim)
    walk = (pre, post, out.shape[dim], out.stride(dim), idx, strides, B)
    bad = new_counter(x.device)
    if not include_self and reduce != "store":
        identity = {"add": 0, "mean": 0, "prod": 1,
                    "amax": float("-inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min,
                    "amin": float("inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).max}[reduce]
        fill = torch.full((1,), identity, dtype=acc_dtype, device=x.device)
        scatter_walk(out, *walk, fill, (0, 0, 0), None, wrap=False)
    if reduce == "mean":
        cnt = torch.full(x.shape, 1 if include_self else 0, dtype=acc_dtype, device=x.device)
        ones = torch.ones((1,), dtype=acc_dtype, device=x.device)
        scatter_walk(cnt, *_dim_walk(cnt, index_shape, dim), cnt.shape[dim], cnt.stride(dim), idx, strides, B,
                     ones, (0, 0, 0), None, wrap=False, mode="add")
        scatter_walk(out, *walk, val, val_strides, bad, wrap=False, mode="add")
        mean_finalize(out, cnt)
    else:
        scatter_walk(out, *walk, val, val_strides, bad, wrap=False, mode=reduce, alpha=alpha)
    report_bad_indices(op, bad, f"{op} indices must be in [0, {x.shape[dim]}) along dim {dim}", check)
    return out if acc_dtype == x.dtype else out.to(x.dtype)
