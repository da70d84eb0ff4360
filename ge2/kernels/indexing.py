"""Advanced indexing (read and write), index_select/add/copy/fill, nonzero and one_hot.

An advanced key has already been split by the caller into a basic view of the tensor (ints,
slices, None applied by torch, no copy) and K index tensors broadcast to one shape Bs, each
indexing one dim of that view (``adv_dims``). torch's layout rule decides the result: the
indexed dims are replaced by Bs where they were if they are adjacent, else Bs comes first. The
work is then a walk ``[P, B, Q]`` over the view (``ge2.kernels.scatter``): K = 1 reads the index
itself (negatives wrap once, as ``x[-1]``); K > 1 first folds the K indices into one int64 offset
per position (``index_offsets_kernel``, -1 where any index is out of range, so the walk skips it).

Bool masks go through ``nonzero`` (per-block counts, one scan program, a compaction pass); its
output size is data-dependent, so it reads the count back to the host (one sync, as torch's).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ge2.kernels import scatter as S
from ge2.kernels.scatter import count_bad
from ge2.runtime import cdiv

NONZERO_BLOCK = 1024
BIG = 2 ** 62  # the "size" of a dim addressed by precomputed offsets: only -1 is out of range


@triton.jit
def index_offsets_kernel(idx_ptr, off_ptr, bad_ptr, n, size, stride, FIRST: tl.constexpr, BLOCK: tl.constexpr):
    """off[i] (+)= wrap(idx[i]) * stride; -1 once any index of position i is outside [-size, size)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(idx_ptr + i, mask=m, other=0).to(tl.int64)
    v = tl.where(v < 0, v + size, v)
    valid = (v >= 0) & (v < size)
    o = v * stride
    if not FIRST:
        prev = tl.load(off_ptr + i, mask=m, other=0)
        valid = valid & (prev >= 0)
        o += prev
    tl.store(off_ptr + i, tl.where(valid, o, -1), mask=m)
    count_bad(bad_ptr, tl.sum(tl.where(m & ~valid, 1, 0), axis=0))


@triton.jit
def nonzero_count_kernel(x_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < n, other=0)
    tl.store(counts_ptr + tl.program_id(0), tl.sum(tl.where(v != 0, 1, 0).to(tl.int64), axis=0))


@triton.jit
def exclusive_scan_kernel(counts_ptr, n, BLOCK: tl.constexpr):
    """counts[:n] -> exclusive prefix sums in place, counts[n] = total (one program, chunks in order)."""
    carry = tl.zeros((), dtype=tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        c = tl.load(counts_ptr + offs, mask=m, other=0)
        inc = tl.cumsum(c, axis=0)
        tl.store(counts_ptr + offs, inc - c + carry, mask=m)
        carry += tl.sum(c, axis=0)
    tl.store(counts_ptr + n, carry)


@triton.jit
def nonzero_write_kernel(x_ptr, starts_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[starts[block] + rank] = flat position of each nonzero element, in order."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    hit = (tl.load(x_ptr + i, mask=m, other=0) != 0) & m
    h = tl.where(hit, 1, 0).to(tl.int64)
    pos = tl.load(starts_ptr + tl.program_id(0)) + tl.cumsum(h, axis=0) - h
    tl.store(out_ptr + pos, i, mask=hit)


@triton.jit
def one_hot_kernel(idx_ptr, out_ptr, bad_ptr, n, C, BLOCK_I: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = rows < n
    t = tl.load(idx_ptr + rows, mask=live, other=0).to(tl.int64)
    hit = (t[:, None] == cols[None, :]).to(tl.int64)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], hit, mask=live[:, None] & (cols < C)[None, :])
    if tl.program_id(1) == 0:
        count_bad(bad_ptr, tl.sum(tl.where(live & ((t < 0) | (t >= C)), 1, 0), axis=0))


# ---------------------------------------------------------------------------------------------
# advanced indexing
# ---------------------------------------------------------------------------------------------
def result_layout(shape, adv_dims: tuple[int, ...], bshape) -> tuple[list[int], list[int], tuple[int, ...]]:
    """(dims before B, dims after B, result shape) of x[adv] by torch's rule: the index shape B replaces
    the indexed dims where they are adjacent, else comes first."""
    K = len(adv_dims)
    adjacent = tuple(adv_dims) == tuple(range(adv_dims[0], adv_dims[0] + K))
    rest = [d for d in range(len(shape)) if d not in adv_dims]
    pre = [d for d in rest if d < adv_dims[0]] if adjacent else []
    post = [d for d in rest if d not in pre]
    return pre, post, tuple(shape[d] for d in pre) + tuple(bshape) + tuple(shape[d] for d in post)


class Plan:
    """Where x[adv] reads: result shape, the [P, B, Q] walk and the index (or offsets) it reads."""

    def __init__(self, shape, strides, adv_dims: tuple[int, ...], indices: list[torch.Tensor],
                 bad: torch.Tensor | None):
        K = len(adv_dims)
        bshape = tuple(indices[0].shape)
        pre, post, self.out_shape = result_layout(shape, adv_dims, bshape)
        self.pre = (tuple(shape[d] for d in pre), tuple(strides[d] for d in pre))
        self.post = (tuple(shape[d] for d in post), tuple(strides[d] for d in post))
        self.B = 1
        for s in bshape:
            self.B *= s
        self.P = 1
        for s in self.pre[0]:
            self.P *= s
        self.Q = 1
        for s in self.post[0]:
            self.Q *= s
        if K == 1:
            self.idx = indices[0].contiguous().view(-1)
            self.size, self.stride, self.wrap = shape[adv_dims[0]], strides[adv_dims[0]], True
        else:
            self.idx = torch.empty(self.B, dtype=torch.int64, device=indices[0].device)
            if self.B:
                block = min(triton.next_power_of_2(self.B), 1024)
                for k, (d, t) in enumerate(zip(adv_dims, indices)):
                    index_offsets_kernel[(cdiv(self.B, block),)](
                        t.contiguous().view(-1), self.idx, bad, self.B, shape[d], strides[d], FIRST=k == 0,
                        BLOCK=block)
            self.size, self.stride, self.wrap = BIG, 1, False
        self.counted = K > 1  # the offsets pass already counted the bad indices

    def walk(self):
        return self.pre, self.post, self.size, self.stride, self.idx, (0, 1, 0), self.B


def _bounds(shape, adv_dims) -> str:
    return "; ".join(f"dim {d} has size {shape[d]} (valid: -{shape[d]}..{shape[d] - 1})" for d in adv_dims)


def index_read(x: torch.Tensor, indices: list[torch.Tensor], adv_dims: tuple[int, ...],
               check: bool | None = None) -> torch.Tensor:
    """x[adv]: indices (broadcast to one shape) into dims ``adv_dims`` of the view x -> torch's result layout."""
    bad = S.new_counter(x.device)
    plan = Plan(x.shape, x.stride(), adv_dims, indices, bad)
    out = torch.empty(plan.out_shape, dtype=x.dtype, device=x.device)
    if out.numel():
        S.gather_walk(x, *plan.walk(), out, None if plan.counted else bad, wrap=plan.wrap)
    S.report_bad_indices("index", bad, _bounds(x.shape, adv_dims), check)
    return out


def _value_walk(value: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """value broadcast to the result shape as a [P, B, Q] view (a stride-0 broadcast stays a view)."""
    v = value.expand(plan.out_shape)
    try:
        v = v.view(plan.P, plan.B, plan.Q)
    except RuntimeError:
        v = v.contiguous().view(plan.P, plan.B, plan.Q)
    return v, tuple(v.stride())


def index_write(x: torch.Tensor, indices: list[torch.Tensor], adv_dims: tuple[int, ...], value: torch.Tensor,
                accumulate: bool = False, check: bool | None = None) -> None:
    """x[adv] = value (or += with ``accumulate``, duplicates adding up), in place in x's memory."""
    target = x
    if accumulate and x.dtype not in S.ATOMIC_DTYPES:
        target = x.to(S.accumulate_dtype(x.dtype))
    bad = S.new_counter(x.device)
    plan = Plan(target.shape, target.stride(), adv_dims, indices, bad)
    if plan.P * plan.B * plan.Q:
        v, vs = _value_walk(value, plan)
        S.scatter_walk(target, *plan.walk(), v, vs, None if plan.counted else bad, wrap=plan.wrap,
                       mode="add" if accumulate else "store")
    if target is not x:
        x.copy_(target)
    S.report_bad_indices("index_put", bad, _bounds(x.shape, adv_dims), check)


# ---------------------------------------------------------------------------------------------
# index_select / index_add / index_copy / index_fill (one 1-D index along one dim, no wrap)
# ---------------------------------------------------------------------------------------------
def _along(x: torch.Tensor, dim: int, n: int):
    shape, strides = tuple(x.shape), x.stride()
    return ((shape[:dim], strides[:dim]), (shape[dim + 1:], strides[dim + 1:]), shape[dim], strides[dim])


def _what(op: str, x: torch.Tensor, dim: int) -> str:
    return f"{op} indices must be in [0, {x.shape[dim]}) along dim {dim}"


def index_select(x: torch.Tensor, dim: int, index: torch.Tensor, check: bool | None = None) -> torch.Tensor:
    """x along ``dim`` at the positions of the 1-D ``index`` -> x's shape with dim sized len(index)."""
    idx = index.contiguous().view(-1)
    shape = list(x.shape)
    shape[dim] = idx.numel()
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    if out.numel():
        bad = S.new_counter(x.device)
        pre, post, size, stride = _along(x, dim, idx.numel())
        S.gather_walk(x, pre, post, size, stride, idx, (0, 1, 0), idx.numel(), out, bad, wrap=False)
        S.report_bad_indices("index_select", bad, _what("index_select", x, dim), check)
    return out


def index_put_along(x: torch.Tensor, dim: int, index: torch.Tensor, src, mode: str, op: str,
                    alpha=None, check: bool | None = None) -> None:
    """x[.., index[j], ..] = / += alpha * src[.., j, ..] along ``dim`` in place (src: tensor or number)."""
    idx = index.contiguous().view(-1)
    n = idx.numel()
    target = x
    if mode == "add" and x.dtype not in S.ATOMIC_DTYPES:
        target = x.to(S.accumulate_dtype(x.dtype))
    P, Q = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1:])
    if isinstance(src, torch.Tensor):
        val = src.contiguous()
        vs = (n * Q, Q, 1)
    else:
        val = torch.full((1,), src, dtype=x.dtype, device=x.device)
        vs = (0, 0, 0)
    if P * n * Q:
        bad = S.new_counter(x.device)
        pre, post, size, stride = _along(target, dim, n)
        S.scatter_walk(target, pre, post, size, stride, idx, (0, 1, 0), n, val, vs, bad, wrap=False, mode=mode,
                       alpha=alpha)
        if target is not x:
            x.copy_(target)
        S.report_bad_indices(op, bad, _what(op, x, dim), check)


# ---------------------------------------------------------------------------------------------
# nonzero and one_hot
# ---------------------------------------------------------------------------------------------
def nonzero_flat(x: torch.Tensor) -> torch.Tensor:
    """int64 [n]: the row-major positions of x's nonzero elements, in order (one host sync for n)."""
    flat = x.contiguous().view(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    n = flat.numel()
    n_blocks = max(cdiv(n, NONZERO_BLOCK), 1)
    counts = torch.zeros(n_blocks + 1, dtype=torch.int64, device=x.device)
    if n:
        nonzero_count_kernel[(n_blocks,)](flat, counts, n, BLOCK=NONZERO_BLOCK)
        exclusive_scan_kernel[(1,)](counts, n_blocks, BLOCK=min(triton.next_power_of_2(n_blocks), 1024))
    total = int(counts[n_blocks].item())  # the output's size: the documented host sync
    out = torch.empty(total, dtype=torch.int64, device=x.device)
    if total:
        nonzero_write_kernel[(n_blocks,)](flat, counts, out, n, BLOCK=NONZERO_BLOCK)
    return out


def nonzero(x: torch.Tensor, as_tuple: bool = False):
    """[n, ndim] int64 coordinates of the nonzero elements (row-major order), or ndim [n] tensors."""
    flat = nonzero_flat(x)
    n, nd = flat.numel(), x.dim()
    if nd == 0:
        return (torch.zeros(n, dtype=torch.int64, device=x.device),) if as_tuple else \
            torch.empty((n, 0), dtype=torch.int64, device=x.device)
    coords = torch.empty((nd, n) if as_tuple else (n, nd), dtype=torch.int64, device=x.device)
    if n:
        block = min(triton.next_power_of_2(n), 1024)
        inner = 1
        for d in reversed(range(nd)):
            col = coords[d] if as_tuple else coords[:, d]
            S.digits_kernel[(cdiv(n, block),)](flat, col, n, inner, x.shape[d], 1, col.stride(0), FROM_SRC=True,
                                               ACC=False, BLOCK=block)
            inner *= x.shape[d]
    return tuple(coords.unbind(0)) if as_tuple else coords


def one_hot(index: torch.Tensor, num_classes: int, check: bool | None = None) -> torch.Tensor:
    """int64 [*index.shape, num_classes]: 1 at each index's class."""
    idx = index.contiguous().view(-1)
    n = idx.numel()
    out = torch.empty((*index.shape, num_classes), dtype=torch.int64, device=index.device)
    if n and num_classes:
        bad = S.new_counter(index.device)
        bc = min(triton.next_power_of_2(num_classes), 256)
        bi = min(triton.next_power_of_2(n), max(1, 2048 // bc))
        one_hot_kernel[(cdiv(n, bi), cdiv(num_classes, bc))](idx, out, bad, n, num_classes, BLOCK_I=bi, BLOCK_C=bc)
        S.report_bad_indices("one_hot", bad, f"class values must be in [0, {num_classes})", check)
    return out
