"""Layout ops as one gather kernel: strided copies, flip, roll, repeat/tile, repeat_interleave,
tril/triu, pixel shuffles and every mode of pad; plus the small kernels repeat_interleave's tensor
repeats and pad's backward need.

``remap`` writes every element of a (possibly strided) output view ``y`` of shape OUT from

    y[o] = x[x0 + sum_d map_d(o_d) * XS[d]]          map_d(o) = o + SHIFT[d], then per MODE:
        WRAP       (o + SHIFT) % SIZE                 (roll, circular pad; SHIFT >= 0 keeps it positive)
        CONSTANT   o + SHIFT, or the fill value where it leaves [0, SIZE)
        REFLECT    |t|, then 2 (SIZE - 1) - t past the end (pad < SIZE, checked by the caller)
        REPLICATE  clamp(t, 0, SIZE - 1)

XS may be negative (flip reads backwards from x0) or 0 (repeat reads one slice several times), so
most layout ops are this map over a restrided view of x or y, with no index tensor. A table dim
(``table``) maps o through an int64 lookup instead (repeat_interleave with tensor repeats); TRI
zeroes the elements above (tril) or below (triu) a diagonal of the last two dims.

Lanes take a [rows, BLOCK_C] tile: columns over the output's last dim, rows over the others,
decoded once per row (int64: the offsets of a large tensor pass 2^31); the per-element work is the
last dim's map. Backward of the gathers that hit an element more than once (repeat, pad's reflect,
replicate, circular; repeat_interleave) sums over the candidates of each input element in a fixed
order (``segment_sum``, ``pad_backward_1d``) or through ``ge2``'s sum reduction: no atomics.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ge2 import runtime

# constexpr: the kernels compare their MODE/TRI arguments with these (Triton reads only constexpr globals)
WRAP, CONSTANT, REFLECT, REPLICATE = (tl.constexpr(i) for i in range(4))
MODES = {"circular": WRAP, "constant": CONSTANT, "reflect": REFLECT, "replicate": REPLICATE}
NO_TRI, TRIL, TRIU = (tl.constexpr(i) for i in range(3))

# Memory-bound: 1-8K elements a program. The interpreter's cost is per program, so it takes 4096.
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8))]
INTERPRETER_CONFIG = triton.Config({"BLOCK": 4096}, num_warps=4)
MAX_BLOCK_C = 1024  # at most the smallest config's BLOCK: a tile holds at least one row


@triton.jit
def _map(o, shift, size, MODE: tl.constexpr):
    """(source index, in bounds) of output index o along one dim."""
    t = o + shift
    if MODE == WRAP:
        t = t % size  # the sign of the dividend on the GPU (C's remainder): fold negatives up
        t = tl.where(t < 0, t + size, t)
    elif MODE == REFLECT:
        t = tl.abs(t)
        t = tl.where(t >= size, 2 * (size - 1) - t, t)
    elif MODE == REPLICATE:
        t = tl.minimum(tl.maximum(t, 0), size - 1)
    return t, (t >= 0) & (t < size)


@runtime.autotune(CONFIGS, key=["rows", "cols", "NDIM", "MODE", "TRI", "TABLE_DIM", "BLOCK_C"],
                  default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def remap_kernel(
    x_ptr, y_ptr, fill_ptr, table_ptr, x0, rows, cols, col_tiles, diag,
    OUT, SHIFT, SIZE, XS, YS,  # tuples of NDIM ints (shape, shift, size, x and y strides)
    NDIM: tl.constexpr, MODE: tl.constexpr, TRI: tl.constexpr, TABLE_DIM: tl.constexpr,
    WIDE_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
):
    """y[o] = x[x0 + sum_d map_d(o_d) * XS[d]] over one [BLOCK // BLOCK_C, BLOCK_C] tile of y."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    pid = tl.program_id(0)
    r = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    src_r = tl.zeros([BLOCK_R], tl.int64) + x0
    dst_r = tl.zeros([BLOCK_R], tl.int64)
    ok_r = r < rows
    # The row decode divides by the dims' sizes: int64 division is a long software sequence per
    # row held by a lane, int32 a few instructions, so rows < 2^31 decode in int32.
    if WIDE_ROWS:
        rem = r
    else:
        rem = r.to(tl.int32)
    row_o = rem  # the index along dim NDIM - 2 (TRI compares it with the column)
    for k in tl.static_range(NDIM - 1):
        # dims NDIM-2 .. 0 as the constexpr NDIM - 2 - k, written out: a name rebound to a new constexpr
        # in each unrolled iteration becomes a tensor on the GPU
        o = rem % OUT[NDIM - 2 - k]
        rem = rem // OUT[NDIM - 2 - k]
        if NDIM - 2 - k == TABLE_DIM:
            t = tl.load(table_ptr + o, mask=ok_r, other=0)
        else:
            t, inb = _map(o, SHIFT[NDIM - 2 - k], SIZE[NDIM - 2 - k], MODE)
            if MODE == CONSTANT:
                ok_r = ok_r & inb
        if k == 0:
            row_o = o
        src_r += t.to(tl.int64) * XS[NDIM - 2 - k]
        dst_r += o.to(tl.int64) * YS[NDIM - 2 - k]
    D: tl.constexpr = NDIM - 1
    mask_c = c < cols
    if D == TABLE_DIM:
        t = tl.load(table_ptr + c, mask=mask_c, other=0)
        inb = mask_c
    else:
        t, inb = _map(c, SHIFT[D], SIZE[D], MODE)
    src = src_r[:, None] + t.to(tl.int64)[None, :] * XS[D]
    dst = dst_r[:, None] + c.to(tl.int64)[None, :] * YS[D]
    mask = (r < rows)[:, None] & mask_c[None, :]
    if MODE == CONSTANT:
        ok = mask & ok_r[:, None] & inb[None, :]
        v = tl.load(x_ptr + src, mask=ok, other=0)
        v = tl.where(ok, v, tl.load(fill_ptr))
    else:
        v = tl.load(x_ptr + src, mask=mask, other=0)
    if TRI == TRIL:
        v = tl.where(c[None, :] - row_o[:, None] <= diag, v, tl.zeros_like(v))
    elif TRI == TRIU:
        v = tl.where(c[None, :] - row_o[:, None] >= diag, v, tl.zeros_like(v))
    tl.store(y_ptr + dst, v, mask=mask)


def _collapse(out, shift, size, xs, ys, keep: int):
    """Drop size-1 identity dims and merge neighbours that both dims' maps leave alone and whose
    strides chain in x and y; the last ``keep`` dims stay as they are (TRI, a table dim)."""
    dims: list[list] = []  # [out, shift, size, xs, ys, mergeable]
    for d in range(len(out)):
        free = shift[d] == 0 and size[d] == out[d] and d < len(out) - keep
        if free and out[d] == 1:
            continue
        if free and dims and dims[-1][5] and dims[-1][3] == xs[d] * out[d] and dims[-1][4] == ys[d] * out[d]:
            merged = dims[-1][0] * out[d]
            dims[-1] = [merged, 0, merged, xs[d], ys[d], True]
            continue
        dims.append([out[d], shift[d], size[d], xs[d], ys[d], free])
    if not dims:
        return (1,), (0,), (1,), (0,), (0,)
    return tuple(tuple(dim[i] for dim in dims) for i in range(5))


def remap(x: torch.Tensor, y: torch.Tensor, *, xs, x0: int = 0, shift=None, size=None, mode: int = WRAP,
          fill: torch.Tensor | None = None, tri: int = NO_TRI, diag: int = 0,
          table: torch.Tensor | None = None, table_dim: int = -1) -> torch.Tensor:
    """Fill the view y (any strides) from x's memory through the per-dim maps above; returns y.

    x: the tensor whose storage is read, at element offset x0 from its data pointer, with strides
    xs (one per dim of y). shift/size default to the identity (0, y's size). fill: a 1-element
    tensor of y's dtype (CONSTANT). table: int64 [y.shape[table_dim]] source indices for that dim.
    """
    out = tuple(y.shape)
    if y.numel() == 0:
        return y
    if not out:
        out, xs, ys = (1,), (0,), (0,)
    else:
        ys = tuple(y.stride())
    shift = tuple(shift) if shift is not None else (0,) * len(out)
    size = tuple(size) if size is not None else out
    keep = 2 if tri != NO_TRI else 0
    if table is not None:
        keep = max(keep, len(out) - table_dim)
        # the table dim must not merge with a neighbour: its maps are not the identity
        shift = tuple(1 if d == table_dim else s for d, s in enumerate(shift))
    out, shift, size, xs_, ys = _collapse(out, shift, size, tuple(xs), ys, keep)
    ndim = len(out)
    table_d = -1 if table is None else ndim - (len(y.shape) - table_dim)
    cols = out[-1]
    rows = math.prod(out[:-1])
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(cols))
    col_tiles = runtime.cdiv(cols, block_c)
    grid = lambda meta: (runtime.cdiv(rows, meta["BLOCK"] // block_c) * col_tiles,)
    fill_t = fill if fill is not None else y
    table_t = table if table is not None else y
    remap_kernel[grid](x, y, fill_t, table_t, x0, rows, cols, col_tiles, diag, out, shift, size, xs_, ys,
                       NDIM=ndim, MODE=mode, TRI=tri, TABLE_DIM=table_d, WIDE_ROWS=rows >= 2**31, BLOCK_C=block_c)
    return y


def copy_(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y[...] = x for two views of the same shape (any strides, x's may be 0): a strided copy."""
    return remap(x, y, xs=x.stride())


# ---------------------------------------------------------------------------------------------
# repeat_interleave with a tensor of repeats: segment ends, the index table, the segment sums
# ---------------------------------------------------------------------------------------------
SCAN_BLOCK = 1024


@triton.jit
def segment_ends_kernel(rep_ptr, ends_ptr, n, BLOCK: tl.constexpr):
    """ends[j] = repeats[0] + ... + repeats[j] (one program, blocks in order); ends[n] = how many
    repeats are negative (read back with the total, so the check costs no extra sync)."""
    carry = tl.zeros([], tl.int64)
    bad = tl.zeros([], tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        r = tl.load(rep_ptr + offs, mask=m, other=0).to(tl.int64)
        tl.store(ends_ptr + offs, carry + tl.cumsum(r, 0), mask=m)
        carry += tl.sum(r, 0)
        bad += tl.sum((r < 0).to(tl.int64), 0)
    tl.store(ends_ptr + n, bad)


@triton.jit
def segment_ids_kernel(ends_ptr, table_ptr, n, total, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """table[o] = the j with ends[j-1] <= o < ends[j] (binary search, STEPS >= log2(n + 1))."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lo = tl.zeros([BLOCK], tl.int64)
    hi = tl.zeros([BLOCK], tl.int64) + n
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        e = tl.load(ends_ptr + mid, mask=active & (mid < n), other=0)
        right = e <= o
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    tl.store(table_ptr + o, lo, mask=o < total)


@runtime.autotune(CONFIGS[:3], key=["rows", "inner", "EVEN"], default=0, do_bench=runtime.tuning_bench)
@triton.jit
def segment_sum_kernel(g_ptr, gx_ptr, ends_ptr, rows, n, inner, r, sgo, sgl, sgi,
                       EVEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr):
    """gx[b, j, i] = sum of g[b, l, i] over l in segment j ([j r, (j+1) r) if EVEN, else
    [ends[j-1], ends[j])), in order; gx contiguous [B, n, inner]; rows = B * n."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    col_tiles = tl.cdiv(inner, BLOCK_C)
    pid = tl.program_id(0)
    row = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok_r = row < rows
    j = row % n
    b = row // n
    if EVEN:
        start = j * r
        count = tl.where(ok_r, r, 0).to(tl.int64)
    else:
        end = tl.load(ends_ptr + j, mask=ok_r, other=0)
        start = tl.load(ends_ptr + j - 1, mask=ok_r & (j > 0), other=0)
        count = tl.where(ok_r, end - start, 0)
    mask = ok_r[:, None] & (col < inner)[None, :]
    base = g_ptr + (b * sgo + start * sgl)[:, None] + col.to(tl.int64)[None, :] * sgi
    ACC: tl.constexpr = tl.float64 if gx_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros([BLOCK_R, BLOCK_C], ACC)
    for k in range(0, tl.max(count, 0)):
        v = tl.load(base + k * sgl, mask=mask & (k < count)[:, None], other=0.0)
        acc += v.to(ACC)
    out = row[:, None] * inner + col[None, :]
    tl.store(gx_ptr + out, acc.to(gx_ptr.dtype.element_ty), mask=mask)


def segment_ends(repeats: torch.Tensor) -> torch.Tensor:
    """int64 [n + 1]: the inclusive running sum of repeats [n], then the count of negative repeats."""
    n = repeats.numel()
    ends = torch.empty(n + 1, dtype=torch.int64, device=repeats.device)
    segment_ends_kernel[(1,)](repeats, ends, n, BLOCK=SCAN_BLOCK)
    return ends


def segment_ids(ends: torch.Tensor, n: int, total: int) -> torch.Tensor:
    """int64 [total]: the segment of each output index (ends from ``segment_ends``)."""
    table = torch.empty(total, dtype=torch.int64, device=ends.device)
    if total:
        segment_ids_kernel[(runtime.cdiv(total, SCAN_BLOCK),)](
            ends, table, n, total, STEPS=max(1, n.bit_length()), BLOCK=SCAN_BLOCK)
    return table


def segment_sum(g: torch.Tensor, n: int, *, repeats: int = 0, ends: torch.Tensor | None = None) -> torch.Tensor:
    """g [B, L, inner] -> [B, n, inner]: sums of n consecutive segments of dim 1 (each ``repeats``
    long, or ending at ``ends``); fp32 accumulation (fp64 for float64), in order."""
    B, _, inner = g.shape
    gx = torch.empty((B, n, inner), dtype=g.dtype, device=g.device)
    if gx.numel() == 0:
        return gx
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(inner))
    col_tiles = runtime.cdiv(inner, block_c)
    grid = lambda meta: (runtime.cdiv(B * n, meta["BLOCK"] // block_c) * col_tiles,)
    segment_sum_kernel[grid](g, gx, ends if ends is not None else g, B * n, n, inner, repeats, *g.stride(),
                             EVEN=ends is None, BLOCK_C=block_c)
    return gx


# ---------------------------------------------------------------------------------------------
# pad backward for one dim: each input element sums the outputs that read it
# ---------------------------------------------------------------------------------------------
@runtime.autotune(CONFIGS[:3], key=["total", "MODE"], default=0, do_bench=runtime.tuning_bench)
@triton.jit
def pad_backward_1d_kernel(g_ptr, gx_ptr, total, L, M, inner, lo, sgo, sgl, sgi, extra,
                           MODE: tl.constexpr, BLOCK: tl.constexpr):
    """gx[b, j, i] (contiguous [B, L, inner]) = sum of g[b, o, i] (g: [B, M, inner]) over the o
    that pad's map sends to j: o = j + lo, the mirror images (REFLECT), the copies one period
    away (WRAP), the runs past either end (REPLICATE, ``extra`` = the longest run)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    i = offs % inner
    j = (offs // inner) % L
    b = offs // (inner * L)
    base = g_ptr + b * sgo + i * sgi
    ACC: tl.constexpr = tl.float64 if gx_ptr.dtype.element_ty == tl.float64 else tl.float32
    o = j + lo
    acc = tl.load(base + o * sgl, mask=mask & (o >= 0) & (o < M), other=0.0).to(ACC)
    if MODE == REFLECT:
        o = lo - j  # the left image of j (j >= 1)
        acc += tl.load(base + o * sgl, mask=mask & (j >= 1) & (o >= 0) & (o < M), other=0.0).to(ACC)
        o = lo + 2 * (L - 1) - j  # the right image (j <= L - 2)
        acc += tl.load(base + o * sgl, mask=mask & (j <= L - 2) & (o >= 0) & (o < M), other=0.0).to(ACC)
    elif MODE == WRAP:
        o = j + lo - L
        acc += tl.load(base + o * sgl, mask=mask & (o >= 0) & (o < M), other=0.0).to(ACC)
        o = j + lo + L
        acc += tl.load(base + o * sgl, mask=mask & (o >= 0) & (o < M), other=0.0).to(ACC)
    elif MODE == REPLICATE:
        first = mask & (j == 0)
        last = mask & (j == L - 1)
        for k in range(0, extra):
            # scalars of their own: rebinding the vector o inside the loop would change a loop-carried type
            left = lo - 1 - k  # left of the copied block, owned by j = 0
            acc += tl.load(base + left * sgl, mask=first & (left >= 0) & (left < M), other=0.0).to(ACC)
            right = lo + L + k  # right of it, owned by j = L - 1
            acc += tl.load(base + right * sgl, mask=last & (right >= 0) & (right < M), other=0.0).to(ACC)
    tl.store(gx_ptr + offs, acc.to(gx_ptr.dtype.element_ty), mask=mask)


def pad_backward_1d(g: torch.Tensor, L: int, lo: int, mode: int) -> torch.Tensor:
    """g [B, M, inner] (the gradient of a pad of dim 1 from L to M, lo before) -> [B, L, inner]."""
    B, M, inner = g.shape
    gx = torch.empty((B, L, inner), dtype=g.dtype, device=g.device)
    total = gx.numel()
    if total:
        extra = max(lo, M - L - lo, 0) if mode == REPLICATE else 0
        grid = lambda meta: (runtime.cdiv(total, meta["BLOCK"]),)
        pad_backward_1d_kernel[grid](g, gx, total, L, M, inner, lo, *g.stride(), extra, MODE=mode)
    return gx
