"""Normalisation kernels: LayerNorm and RMSNorm over the last dims, BatchNorm over all but the channel dim.

Row norms (LayerNorm, RMSNorm) see x as [M, N] rows. A row of up to ``MAX_BLOCK_N`` elements is
read once: a program loads a [BLOCK_M, BLOCK_N] tile of whole rows (BLOCK_M > 1 packs several
short rows, so a program moves about ``TILE`` elements whatever N is) and does all its math in
registers. Longer rows take one program per row, which sweeps the row in ``BLOCK_N`` chunks (once
for the mean, once for the variance, once to write), so any N works. The variance is the mean of
squared deviations from the already-computed mean (two passes), not E[x^2] - E[x]^2, which
cancels catastrophically when |mean| >> std. Math is fp32 for fp32/bf16/fp16 storage and fp64 for
fp64 (the constexpr ACC; eps and momentum reach the kernels as their fp64 bits), and the saved
statistics and weight-gradient partials are in that compute dtype.

    layer_norm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)
    rms_norm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)

Backward (xhat = (x - mean) * rstd, g = gy * w):
    gx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (rms_norm: no mean(g) term)
    dw = sum over rows of gy * xhat, db = sum over rows of gy
Backward of rows that fit one tile: a persistent grid of ``BWD_PROGRAMS_PER_SM`` programs per SM, each
taking every G-th tile and keeping its dw/db sums in registers; at the end it writes one row of
partials [dw | db] (no atomics: the result does not depend on scheduling), and ``sum_partials``
adds the G rows. The partials cost 2 * G * N * 4 bytes written and read again, a few percent of
the 3 * M * N elements the kernel must move. Longer rows: each program owns ``ROWS_PER_PROGRAM``
rows and read-modify-writes its own partial row chunk by chunk.

BatchNorm sees x as [N, C, S] (S = the spatial size, 1 for [N, C]) through strides, each channel's
[N, S] plane cut into [BN, BS] tiles of ``BN_TILE`` elements. One channel alone is too little work
for a program (256 channels on 132 SMs left most of the GPU idle), so each channel's tiles are split
over SPLIT programs (~``BN_PROGRAMS_PER_SM`` programs per SM in all). Training: ``batch_norm_stats_kernel``
writes each program's (count, shift, mean - shift, M2) from sums of deviations from its first
tile's mean, then ``batch_norm_fwd_kernel`` combines a channel's SPLIT partials by Chan's formula
(in a fixed order: no atomics, deterministic), updates the running statistics in place (unbiased
running variance, as in torch) and normalises; x is read twice. Eval: the second kernel alone,
with the running statistics. The backward is the same shape: partial (sum(gy), sum(gy * xhat)),
then gx.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.elementwise import _float_arg, _float_bits, binary
from ge2.kernels.gemm import _sm_count, sum_partials
from ge2.kernels.losses import partial_dtype
from ge2.kernels.softmax import compute_dtype
from ge2.runtime import autotune, cdiv

MAX_BLOCK_N = 4096  # row chunk; longer rows are swept in chunks of this size
# Tiles of 2048-8192 elements and 1-4 backward programs per SM were swept on the H100 at 8192x4096,
# 16384x384 and 8192x768 bf16 (bench_nn.py --sweep, bench/results/nn_sweep.json): 4096 / 2 was the
# best or within 4% at each; more programs mean more partial rows to write and sum.
TILE = 4096  # elements per program tile when rows fit one chunk (BLOCK_M = TILE // BLOCK_N rows)
BWD_PROGRAMS_PER_SM = 2  # backward, rows that fit one tile: persistent programs per SM
ROWS_PER_PROGRAM = 32  # backward, longer rows: rows sharing one partial-sum row for dw/db
# BatchNorm: tiles of 2048-8192 elements, 4-16 programs per SM and 4 or 8 warps were swept on the H100
# at 64x256x28x28 fp32 (bench_nn.py --bn at 4094abc, bench/results/nn_batch_norm_sweep.json): 4096 / 16 / 4
# was within 3% of the best forward and backward; 8192 with 4 programs per SM left SMs idle (0.13 ms).
BN_TILE = 4096  # elements of a [BN, BS] tile of one channel's [N, S] plane
BN_PROGRAMS_PER_SM = 16  # each channel's tiles are split so that the grid has ~this many programs an SM
BN_WARPS = 4


def _fixed_warps(block: int) -> int:
    """num_warps for the kernels that write in place (partial sums, running statistics), which are
    not autotuned: tuning re-runs a kernel to time it, and each re-run would add or update again.
    About 8 elements per thread."""
    return max(1, min(16, block // 256))


# ---------------------------------------------------------------------------------------------
# LayerNorm / RMSNorm
# ---------------------------------------------------------------------------------------------
@triton.jit
def _row_mean(total, N):
    """total / N correctly rounded: Triton's fp32 ``/`` may be 2 ulp off, and in a row of one element that
    turns x - mean (and g - mean(g)) from 0 into an ulp that rstd = 1/sqrt(eps) multiplies by ~300."""
    if total.dtype == tl.float32:
        return tl.math.div_rn(total, tl.zeros_like(total) + N)
    return total / N  # fp64's division is IEEE already


@autotune([triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)], key=["N", "BLOCK_N"], default=2)
@triton.jit
def row_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N, stride_xm, stride_xn, stride_ym, eps,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One row: mean and rstd (saved, in ACC), then y = (x - mean) * rstd * w + b."""
    eps = _float_arg(eps, ACC)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    cols = tl.arange(0, BLOCK_N)
    mean = 0.0
    if not RMS:
        acc = tl.zeros([BLOCK_N], ACC)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            acc += tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(ACC)
        mean = _row_mean(tl.sum(acc, axis=0), N)
    acc = tl.zeros([BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        d = tl.where(c < N, tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(ACC) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(_row_mean(tl.sum(acc, axis=0), N) + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = c < N
        y = (tl.load(x_row + c * stride_xn, mask=m, other=0.0).to(ACC) - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + c, mask=m, other=0.0).to(ACC)
        if HAS_B:
            y = y + tl.load(b_ptr + c, mask=m, other=0.0).to(ACC)
        tl.store(y_ptr + row * stride_ym + c, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def row_norm_bwd_kernel(
    gy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, gx_ptr, part_ptr,
    M, N, stride_gm, stride_gn, stride_xm, stride_xn, stride_gxm, part_width, db_offset,
    RMS: tl.constexpr, HAS_W: tl.constexpr, NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr,
    ROWS: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """gx for ROWS rows (any N, swept in chunks), and this program's partial sums of gy * xhat (dw) and gy (db),
    added chunk by chunk into its row of part: [dw | db]."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    part = part_ptr + pid.to(tl.int64) * part_width
    for r in range(0, ROWS):
        row = pid * ROWS + r
        if row < M:
            row64 = row.to(tl.int64)
            mean = tl.load(mean_ptr + row64)
            rstd = tl.load(rstd_ptr + row64)
            gy_row = gy_ptr + row64 * stride_gm
            x_row = x_ptr + row64 * stride_xm
            if NEED_X:
                # the two row means of the gx formula: mean(g) and mean(g * xhat), g = gy * w
                acc_g = tl.zeros([BLOCK_N], ACC)
                acc_gx = tl.zeros([BLOCK_N], ACC)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    m = c < N
                    g = tl.load(gy_row + c * stride_gn, mask=m, other=0.0).to(ACC)
                    if HAS_W:  # a select after the product: no fma contraction (see the tile kernel)
                        g = tl.where(m, g * tl.load(w_ptr + c, mask=m, other=0.0).to(ACC), 0.0)
                    xhat = (tl.load(x_row + c * stride_xn, mask=m, other=0.0).to(ACC) - mean) * rstd
                    acc_g += g
                    acc_gx += tl.where(m, g * xhat, 0.0)
                mean_g = _row_mean(tl.sum(acc_g, axis=0), N)
                mean_gx = _row_mean(tl.sum(acc_gx, axis=0), N)
                if RMS:
                    mean_g = 0.0
            for start in range(0, N, BLOCK_N):
                c = start + cols
                m = c < N
                gy = tl.load(gy_row + c * stride_gn, mask=m, other=0.0).to(ACC)
                xhat = (tl.load(x_row + c * stride_xn, mask=m, other=0.0).to(ACC) - mean) * rstd
                if NEED_X:
                    g = gy
                    if HAS_W:
                        g = tl.where(m, g * tl.load(w_ptr + c, mask=m, other=0.0).to(ACC), 0.0)
                    gx = rstd * (g - mean_g - xhat * mean_gx)
                    tl.store(gx_ptr + row64 * stride_gxm + c, gx.to(gx_ptr.dtype.element_ty), mask=m)
                if NEED_W:
                    p = part + c
                    tl.store(p, tl.load(p, mask=m, other=0.0) + gy * xhat, mask=m)
                if NEED_B:
                    p = part + db_offset + c
                    tl.store(p, tl.load(p, mask=m, other=0.0) + gy, mask=m)


@autotune([triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)], key=["N", "BLOCK_M", "BLOCK_N"], default=2)
@triton.jit
def row_norm_fwd_tile_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, r_ptr, s_ptr, M, N, stride_xm, stride_xn, stride_ym,
    stride_rm, stride_rn, eps,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_R: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """BLOCK_M whole rows (N <= BLOCK_N) read once: mean and rstd (saved, in ACC), y = (x - mean) * rstd * w + b.

    HAS_R: the rows normalised are s = x + r, written to s (contiguous rows) in s's dtype, as a residual
    add before a pre-LN block's norm would write them."""
    eps = _float_arg(eps, ACC)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    m = row_ok[:, None] & (cols[None, :] < N)
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :] * stride_xn, mask=m, other=0.0).to(ACC)
    if HAS_R:
        r = tl.load(r_ptr + rows64[:, None] * stride_rm + cols[None, :] * stride_rn, mask=m, other=0.0).to(ACC)
        s = (x + r).to(s_ptr.dtype.element_ty)  # the sum rounded to s's dtype is what is normalised
        tl.store(s_ptr + rows64[:, None] * N + cols[None, :], s, mask=m)
        x = s.to(ACC)
    if RMS:
        mean = tl.zeros([BLOCK_M], ACC)
        d = x
    else:
        mean = _row_mean(tl.sum(x, axis=1), N)
        d = tl.where(m, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(_row_mean(tl.sum(d * d, axis=1), N) + eps)
    tl.store(mean_ptr + rows64, mean, mask=row_ok)
    tl.store(rstd_ptr + rows64, rstd, mask=row_ok)
    y = d * rstd[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(ACC)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(ACC)[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@autotune([triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["N", "BLOCK_M", "BLOCK_N", "NEED_X"],
          default=2)
@triton.jit
def row_norm_bwd_tile_kernel(
    gy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, gx_ptr, part_ptr, gs_ptr, gl_ptr, M, N, stride_gm, stride_gn,
    stride_xm, stride_xn, stride_gxm, part_width, db_offset, stride_gsm, stride_gsn,
    RMS: tl.constexpr, HAS_W: tl.constexpr, NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr,
    HAS_GS: tl.constexpr, HAS_GL: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Persistent: gx for every G-th tile of BLOCK_M whole rows (N <= BLOCK_N), each read once; the program's
    sums of gy * xhat (dw) and gy (db) stay in registers and end as row program_id of part: [dw | db].

    HAS_GS: gx also gets gs added (the gradient of a residual sum that the norm read besides its own);
    HAS_GL: that gx is written a second time, contiguous, in gl's (lower) dtype for the residual branch."""
    pid = tl.program_id(0)
    rows0 = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(ACC)
    acc_dw = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    acc_db = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows = tile * BLOCK_M + rows0
        row_ok = rows < M
        m = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        rstd = tl.load(rstd_ptr + rows64, mask=row_ok, other=0.0)
        gy = tl.load(gy_ptr + rows64[:, None] * stride_gm + cols[None, :] * stride_gn, mask=m, other=0.0).to(ACC)
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :] * stride_xn, mask=m, other=0.0).to(ACC)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(mean_ptr + rows64, mask=row_ok, other=0.0)
            xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
        if NEED_X:
            g = gy
            if HAS_W:
                # the select keeps LLVM from contracting g - mean(g) below into an fma with the unrounded
                # product: a one-element row would then give rstd * its rounding error instead of 0
                g = tl.where(m, gy * w[None, :], 0.0)
            # the two row means of the gx formula: mean(g) (not for rms_norm) and mean(g * xhat)
            mean_gx = _row_mean(tl.sum(g * xhat, axis=1), N)
            if RMS:
                gx = rstd[:, None] * (g - xhat * mean_gx[:, None])
            else:
                mean_g = _row_mean(tl.sum(g, axis=1), N)
                gx = rstd[:, None] * (g - mean_g[:, None] - xhat * mean_gx[:, None])
            if HAS_GS:
                gs = tl.load(gs_ptr + rows64[:, None] * stride_gsm + cols[None, :] * stride_gsn, mask=m, other=0.0)
                gx = gx.to(gx_ptr.dtype.element_ty).to(ACC) + gs.to(ACC)  # as the separate add would round
            tl.store(gx_ptr + rows64[:, None] * stride_gxm + cols[None, :], gx.to(gx_ptr.dtype.element_ty), mask=m)
            if HAS_GL:
                tl.store(gl_ptr + rows64[:, None] * N + cols[None, :],
                         gx.to(gx_ptr.dtype.element_ty).to(gl_ptr.dtype.element_ty), mask=m)
        if NEED_W:
            acc_dw += gy * xhat
        if NEED_B:
            acc_db += gy
    part = part_ptr + pid.to(tl.int64) * part_width
    if NEED_W:
        tl.store(part + cols, tl.sum(acc_dw, axis=0), mask=col_ok)
    if NEED_B:
        tl.store(part + db_offset + cols, tl.sum(acc_db, axis=0), mask=col_ok)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as [M, n] rows (a view when the strides allow it)."""
    return t.reshape(-1, n)


def _block_n(n: int) -> int:
    return min(triton.next_power_of_2(max(n, 1)), MAX_BLOCK_N)


def _tile_m(m: int, block_n: int) -> int:
    """Rows per tile: about TILE elements, no more rows than there are."""
    return max(1, min(TILE // block_n, triton.next_power_of_2(max(m, 1))))


def row_norm_fwd(x: torch.Tensor, n: int, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                 rms: bool, out_dtype: torch.dtype | None = None,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y [x's shape] in out_dtype (default x's), mean [M], rstd [M], s) normalising each row of the last ``n``
    elements of s = x + residual (s is x itself without a residual; stats fp32, fp64 for fp64 x).

    With a residual (x's shape), s is a new contiguous tensor in the promoted dtype; rows of up to
    MAX_BLOCK_N elements get it from the norm's own pass, longer rows from an add first."""
    if residual is not None and n > MAX_BLOCK_N:
        s = binary("add", x, residual)
        return (*row_norm_fwd(s, n, weight, bias, eps, rms, out_dtype)[:3], s)
    s = x if residual is None else torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype),
                                               device=x.device)
    x2 = _rows(x, n)
    r2 = _rows(residual, n) if residual is not None else x2
    M = x2.shape[0]
    y = torch.empty(x.shape, dtype=out_dtype or s.dtype, device=x.device)
    mean = torch.empty(M, dtype=partial_dtype(s.dtype), device=x.device)
    rstd = torch.empty(M, dtype=partial_dtype(s.dtype), device=x.device)
    if M == 0:
        return y, mean, rstd, s
    w = weight.reshape(-1) if weight is not None else None
    b = bias.reshape(-1) if bias is not None else None
    args = (x2, w if w is not None else x2, b if b is not None else x2, y, mean, rstd)
    flags = dict(RMS=rms, HAS_W=w is not None, HAS_B=b is not None, ACC=compute_dtype(s.dtype))
    block_n = _block_n(n)
    if n <= MAX_BLOCK_N:
        block_m = _tile_m(M, block_n)
        row_norm_fwd_tile_kernel[(cdiv(M, block_m),)](
            *args, r2, s, M, n, x2.stride(0), x2.stride(1), n, r2.stride(0), r2.stride(1), _float_bits(eps), **flags,
            HAS_R=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n)
    else:
        row_norm_fwd_kernel[(M,)](*args, n, x2.stride(0), x2.stride(1), n, _float_bits(eps), **flags, BLOCK_N=block_n)
    return y, mean, rstd, s


def row_norm_bwd(gy: torch.Tensor, x: torch.Tensor, n: int, weight: torch.Tensor | None, mean: torch.Tensor,
                 rstd: torch.Tensor, *, rms: bool, need_x: bool, need_weight: bool, need_bias: bool,
                 gs: torch.Tensor | None = None, low_dtype: torch.dtype | None = None):
    """(gx | None, dw | None, db | None, gx_low | None) of a row norm; dw/db shaped like the normalized dims.

    ``gs`` (x's shape): a gradient added to gx (x was also used besides the norm: a residual stream);
    ``low_dtype``: gx_low is gx in that dtype too (the residual branch's gradient)."""
    if n > MAX_BLOCK_N and (gs is not None or low_dtype is not None):  # long rows: the add and cast run after
        gx, dw, db, _ = row_norm_bwd(gy, x, n, weight, mean, rstd, rms=rms, need_x=True, need_weight=need_weight,
                                     need_bias=need_bias)
        gx = binary("add", gx, gs) if gs is not None else gx
        return gx, dw, db, (gx.to(low_dtype) if low_dtype is not None else None)
    x2, gy2 = _rows(x, n), _rows(gy, n)
    M = x2.shape[0]
    need_x = need_x or gs is not None or low_dtype is not None
    gx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_x else None
    gx_low = torch.empty(x.shape, dtype=low_dtype, device=x.device) if low_dtype is not None else None
    gs2 = _rows(gs, n) if gs is not None else x2
    w = weight.reshape(-1) if weight is not None else None
    width = n * (need_weight + need_bias)  # a partial row: [dw | db], either may be absent
    block_n = _block_n(n)
    tiled = n <= MAX_BLOCK_N
    if tiled:
        block_m = _tile_m(M, block_n)
        programs = max(1, min(cdiv(M, block_m), BWD_PROGRAMS_PER_SM * _sm_count(x.device)))
        part = torch.empty((programs, width), dtype=partial_dtype(x.dtype), device=x.device) if width else None
    else:
        programs = max(cdiv(M, ROWS_PER_PROGRAM), 1)
        part = torch.zeros((programs, width), dtype=partial_dtype(x.dtype), device=x.device) if width else None
    if M > 0:
        args = (gy2, x2, w if w is not None else x2, mean, rstd, gx if gx is not None else x2)
        flags = dict(RMS=rms, HAS_W=w is not None, NEED_X=need_x, NEED_W=need_weight, NEED_B=need_bias,
                     ACC=compute_dtype(x.dtype), BLOCK_N=block_n)
        strides = (gy2.stride(0), gy2.stride(1), x2.stride(0), x2.stride(1), n)
        if tiled:
            row_norm_bwd_tile_kernel[(programs,)](
                *args, part if part is not None else mean, gs2, gx_low if gx_low is not None else x2, M, n, *strides,
                width, n * need_weight, gs2.stride(0), gs2.stride(1), **flags, HAS_GS=gs is not None,
                HAS_GL=gx_low is not None, BLOCK_M=block_m)
        else:
            row_norm_bwd_kernel[(programs,)](
                *args, part if part is not None else mean, M, n, *strides, width, n * need_weight, **flags,
                ROWS=ROWS_PER_PROGRAM, num_warps=_fixed_warps(block_n))
    elif part is not None:
        part.fill_(0.0)  # no rows: the sums are zero
    shape = weight.shape if weight is not None else (n,)
    sums = None
    if part is not None:
        sums = torch.empty(width, dtype=weight.dtype if weight is not None else x.dtype, device=x.device)
        sum_partials(part, sums)
    dw = sums[:n].reshape(shape) if need_weight else None
    db = sums[n * need_weight:].reshape(shape) if need_bias else None
    return gx, dw, db, gx_low


# ---------------------------------------------------------------------------------------------
# BatchNorm
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bn_tile(t, TS, N, S, stride_n, stride_s, BN: tl.constexpr, BS: tl.constexpr):
    """Offsets [BN, BS], mask and element count of tile t of one channel's [N, S] plane (TS tiles along S)."""
    tn = t // TS
    ts = t - tn * TS
    n = tn * BN + tl.arange(0, BN)
    s = ts * BS + tl.arange(0, BS)
    offs = n.to(tl.int64)[:, None] * stride_n + s.to(tl.int64)[None, :] * stride_s
    mask = (n < N)[:, None] & (s < S)[None, :]
    count = tl.minimum(N - tn * BN, BN) * tl.minimum(S - ts * BS, BS)
    return offs, mask, count


@triton.jit
def _sum2(x):
    return tl.sum(tl.sum(x, axis=1), axis=0)


@triton.jit
def batch_norm_stats_kernel(
    x_ptr, part_ptr, N, S, sxn, sxc, sxs, TS, T, TPP, SPLIT,
    ACC: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr,
):
    """Tiles [j * TPP, (j + 1) * TPP) of channel c (program c * SPLIT + j): (count, shift, mean - shift, M2)
    into part[c, j].

    Shifted sums: the deviations from the first tile's mean are summed, so sum(d^2) - sum(d)^2 / n
    does not cancel (that shift is within ~std / sqrt(tile) of the mean, whatever |mean| / std is).
    The mean stays split as shift + offset: rounded to one float it would be off by half an ulp of
    |mean|, which Chan's between-program term (mean_p - mean)^2 would magnify when |mean| >> std."""
    pid = tl.program_id(0)
    c = pid // SPLIT
    j = pid - c * SPLIT
    x_c = x_ptr + c.to(tl.int64) * sxc
    t0 = j * TPP
    offs, mask, count = _bn_tile(t0, TS, N, S, sxn, sxs, BN, BS)
    x = tl.load(x_c + offs, mask=mask, other=0.0).to(ACC)
    shift = _row_mean(_sum2(x), count)
    d = tl.where(mask, x - shift, 0.0)
    acc1 = d
    acc2 = d * d
    n = count.to(ACC)
    for t in range(t0 + 1, tl.minimum(t0 + TPP, T)):
        offs, mask, count = _bn_tile(t, TS, N, S, sxn, sxs, BN, BS)
        d = tl.where(mask, tl.load(x_c + offs, mask=mask, other=0.0).to(ACC) - shift, 0.0)
        acc1 += d
        acc2 += d * d
        n += count.to(ACC)
    s1 = _sum2(acc1)
    p = part_ptr + (c.to(tl.int64) * SPLIT + j) * 4
    tl.store(p, n)
    tl.store(p + 1, shift)
    tl.store(p + 2, _row_mean(s1, n))
    tl.store(p + 3, tl.maximum(_sum2(acc2) - s1 * _row_mean(s1, n), 0.0))


@triton.jit
def batch_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, rmean_ptr, rvar_ptr, tracked_ptr, mean_ptr, rstd_ptr, part_ptr,
    N, S, sxn, sxc, sxs, syn, syc, sys, TS, T, TPP, SPLIT, eps, momentum,
    TRAINING: tl.constexpr, UPDATE_RUNNING: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    ONE_TILE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Tiles [j * TPP, (j + 1) * TPP) of channel c: y = (x - mean) * rstd * w + b, the batch statistics
    combined from part[c, :] (Chan's parallel formula) or the running ones; program j = 0 writes the
    channel's mean/rstd and updates its running statistics. Programs run in reverse order of the
    stats kernel's, so the first tiles read were the last it read (still in L2). ONE_TILE (training,
    the channel is one tile, one program): the statistics from that tile, with no stats kernel."""
    eps = _float_arg(eps, ACC)
    momentum = _float_arg(momentum, ACC)
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    c = pid // SPLIT
    j = pid - c * SPLIT
    L = N * S
    x_c = x_ptr + c.to(tl.int64) * sxc
    if ONE_TILE:
        offs, mask, _ = _bn_tile(0, TS, N, S, sxn, sxs, BN, BS)
        x = tl.load(x_c + offs, mask=mask, other=0.0).to(ACC)
        center = _row_mean(_sum2(x), L)
        d = tl.where(mask, x - center, 0.0)
        s1 = _sum2(d)
        o = _row_mean(s1, L)  # the rounding error of center, for y's (x - center) - o as below
        var = tl.maximum(_row_mean(_sum2(d * d) - s1 * o, L), 0.0)
        mean = center + o
    elif TRAINING:
        # Chan's combination in offsets from program 0's shift k: shift_p - k is exact (close floats),
        # so the offsets keep their own relative precision and the mean is rounded once, at the end
        p = part_ptr + c.to(tl.int64) * SPLIT * 4 + tl.arange(0, BLOCK_P) * 4
        pm = tl.arange(0, BLOCK_P) < SPLIT
        k = tl.load(part_ptr + c.to(tl.int64) * SPLIT * 4 + 1)
        n_p = tl.load(p, mask=pm, other=0.0)
        o_p = tl.where(pm, (tl.load(p + 1, mask=pm, other=0.0) - k) + tl.load(p + 2, mask=pm, other=0.0), 0.0)
        o = _row_mean(tl.sum(n_p * o_p, axis=0), L)
        do = tl.where(pm, o_p - o, 0.0)
        var = _row_mean(tl.sum(tl.load(p + 3, mask=pm, other=0.0) + n_p * do * do, axis=0), L)
        mean = k + o
        center = k  # y from (x - k) - o: x - k is exact, and no half-ulp of |mean| enters
    if TRAINING:
        if UPDATE_RUNNING:
            if j == 0:
                rm = tl.load(rmean_ptr + c).to(ACC)
                rv = tl.load(rvar_ptr + c).to(ACC)
                unbiased = var * L / tl.maximum(L - 1, 1)
                tl.store(rmean_ptr + c, ((1.0 - momentum) * rm + momentum * mean).to(rmean_ptr.dtype.element_ty))
                tl.store(rvar_ptr + c, ((1.0 - momentum) * rv + momentum * unbiased).to(rvar_ptr.dtype.element_ty))
                if c == 0:
                    tl.store(tracked_ptr, tl.load(tracked_ptr) + 1)
    else:
        mean = tl.load(rmean_ptr + c).to(ACC)
        var = tl.load(rvar_ptr + c).to(ACC)
        center = mean
        o = 0.0
    rstd = 1.0 / tl.sqrt(var + eps)
    if j == 0:
        tl.store(mean_ptr + c, mean)
        tl.store(rstd_ptr + c, rstd)
    # (x - mean) * scale + shift, not x * scale + (shift - mean * scale): that adds two terms of size
    # |mean| * rstd which cancel, losing digits when |mean| >> std
    scale = rstd
    if HAS_W:
        scale = scale * tl.load(w_ptr + c).to(ACC)
    shift = 0.0
    if HAS_B:
        shift = tl.load(b_ptr + c).to(ACC)
    y_c = y_ptr + c.to(tl.int64) * syc
    t0 = j * TPP
    for t in range(t0, tl.minimum(t0 + TPP, T)):
        offs, mask, _ = _bn_tile(t, TS, N, S, sxn, sxs, BN, BS)
        x = tl.load(x_c + offs, mask=mask, other=0.0).to(ACC)
        y_offs, _, _ = _bn_tile(t, TS, N, S, syn, sys, BN, BS)
        tl.store(y_c + y_offs, (((x - center) - o) * scale + shift).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def batch_norm_bwd_sums_kernel(
    gy_ptr, x_ptr, mean_ptr, rstd_ptr, part_ptr,
    N, S, sgn, sgc, sgs, sxn, sxc, sxs, TS, T, TPP, SPLIT,
    ACC: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr,
):
    """Tiles [j * TPP, (j + 1) * TPP) of channel c: (sum(gy), sum(gy * xhat)) into part[c, j]."""
    pid = tl.program_id(0)
    c = pid // SPLIT
    j = pid - c * SPLIT
    g_c = gy_ptr + c.to(tl.int64) * sgc
    x_c = x_ptr + c.to(tl.int64) * sxc
    mean = tl.load(mean_ptr + c)
    rstd = tl.load(rstd_ptr + c)
    acc_g = tl.zeros([BN, BS], ACC)
    acc_gx = tl.zeros([BN, BS], ACC)
    t0 = j * TPP
    for t in range(t0, tl.minimum(t0 + TPP, T)):
        g_offs, mask, _ = _bn_tile(t, TS, N, S, sgn, sgs, BN, BS)
        x_offs, _, _ = _bn_tile(t, TS, N, S, sxn, sxs, BN, BS)
        g = tl.load(g_c + g_offs, mask=mask, other=0.0).to(ACC)
        xhat = (tl.load(x_c + x_offs, mask=mask, other=0.0).to(ACC) - mean) * rstd
        acc_g += g
        acc_gx += g * xhat  # g is 0 where masked
    p = part_ptr + (c.to(tl.int64) * SPLIT + j) * 2
    tl.store(p, _sum2(acc_g))
    tl.store(p + 1, _sum2(acc_gx))


@triton.jit
def batch_norm_bwd_kernel(
    gy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, part_ptr, gx_ptr, dw_ptr, db_ptr,
    N, S, sgn, sgc, sgs, sxn, sxc, sxs, son, soc, TS, T, TPP, SPLIT, P,
    TRAINING: tl.constexpr, HAS_W: tl.constexpr, NEED_X: tl.constexpr, ACC: tl.constexpr,
    BN: tl.constexpr, BS: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Tiles [j * TPP, (j + 1) * TPP) of channel c: gx (batch statistics: their gradient too) from the
    summed part[c, :P]; program j = 0 writes dw = sum(gy * xhat), db = sum(gy). Reverse program order,
    as in the forward."""
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    c = pid // SPLIT
    j = pid - c * SPLIT
    p = part_ptr + c.to(tl.int64) * P * 2 + tl.arange(0, BLOCK_P) * 2
    pm = tl.arange(0, BLOCK_P) < P
    sum_g = tl.sum(tl.load(p, mask=pm, other=0.0), axis=0)
    sum_gx = tl.sum(tl.load(p + 1, mask=pm, other=0.0), axis=0)
    if j == 0:
        tl.store(dw_ptr + c, sum_gx)
        tl.store(db_ptr + c, sum_g)
    if NEED_X:
        mean = tl.load(mean_ptr + c)
        rstd = tl.load(rstd_ptr + c)
        L = N * S
        scale = rstd
        if HAS_W:
            scale = scale * tl.load(w_ptr + c).to(ACC)
        g_c = gy_ptr + c.to(tl.int64) * sgc
        x_c = x_ptr + c.to(tl.int64) * sxc
        gx_c = gx_ptr + c.to(tl.int64) * soc
        t0 = j * TPP
        for t in range(t0, tl.minimum(t0 + TPP, T)):
            g_offs, mask, _ = _bn_tile(t, TS, N, S, sgn, sgs, BN, BS)
            g = tl.load(g_c + g_offs, mask=mask, other=0.0).to(ACC)
            if TRAINING:
                x_offs, _, _ = _bn_tile(t, TS, N, S, sxn, sxs, BN, BS)
                xhat = (tl.load(x_c + x_offs, mask=mask, other=0.0).to(ACC) - mean) * rstd
                g = g - _row_mean(sum_g, L) - xhat * _row_mean(sum_gx, L)
            o_offs, _, _ = _bn_tile(t, TS, N, S, son, 1, BN, BS)
            tl.store(gx_c + o_offs, (g * scale).to(gx_ptr.dtype.element_ty), mask=mask)


def _ncs(x: torch.Tensor) -> tuple[int, int, int, torch.Tensor]:
    """(N, C, S, x3) with x [N, C, *spatial] seen as x3 [N, C, S] (a view where the spatial dims merge)."""
    N, C = x.shape[0], x.shape[1]
    x3 = x.reshape(N, C, -1)
    return N, C, x3.shape[2], x3


def _bn_grid(N: int, C: int, S: int, device: torch.device) -> tuple[int, int, int, int, int, int]:
    """(BN, BS, TS, T, TPP, SPLIT): [BN, BS] tiles of ~BN_TILE elements over a channel's [N, S] plane,
    TS along S and T in all, TPP consecutive tiles a program, SPLIT programs a channel (enough for
    ``BN_PROGRAMS_PER_SM`` programs per SM in all)."""
    BS = min(triton.next_power_of_2(S), BN_TILE)
    BN = max(1, min(BN_TILE // BS, triton.next_power_of_2(N)))
    TS = cdiv(S, BS)
    T = cdiv(N, BN) * TS
    split = min(T, max(1, cdiv(BN_PROGRAMS_PER_SM * _sm_count(device), C)))
    TPP = cdiv(T, split)
    return BN, BS, TS, T, TPP, cdiv(T, TPP)


def batch_norm_fwd(x: torch.Tensor, weight, bias, running_mean, running_var, num_batches_tracked, *,
                   training: bool, momentum: float, eps: float):
    """(y like x, mean [C], rstd [C] (fp32; fp64 for fp64 x)); updates running stats in place when training and given."""
    N, C, S, x3 = _ncs(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y3 = y.reshape(N, C, S)
    acc = partial_dtype(x.dtype)
    mean = torch.empty(C, dtype=acc, device=x.device)
    rstd = torch.empty(C, dtype=acc, device=x.device)
    BN, BS, TS, T, TPP, split = _bn_grid(N, C, S, x.device)
    part = mean
    one_tile = training and T == 1
    if training and not one_tile:
        part = torch.empty(C, split, 4, dtype=acc, device=x.device)
        batch_norm_stats_kernel[(C * split,)](
            x3, part, N, S, *x3.stride(), TS, T, TPP, split, ACC=compute_dtype(x.dtype), BN=BN, BS=BS,
            num_warps=BN_WARPS)
    update = training and running_mean is not None
    dummy = mean
    batch_norm_fwd_kernel[(C * split,)](
        x3, weight if weight is not None else dummy, bias if bias is not None else dummy, y3,
        running_mean if running_mean is not None else dummy, running_var if running_var is not None else dummy,
        num_batches_tracked if num_batches_tracked is not None and update else torch.zeros(1, dtype=torch.int64, device=x.device),
        mean, rstd, part, N, S, *x3.stride(), *y3.stride(), TS, T, TPP, split, _float_bits(eps), _float_bits(momentum),
        TRAINING=training, UPDATE_RUNNING=update, HAS_W=weight is not None, HAS_B=bias is not None,
        ONE_TILE=one_tile, ACC=compute_dtype(x.dtype), BN=BN, BS=BS, BLOCK_P=triton.next_power_of_2(split),
        num_warps=BN_WARPS)
    return y, mean, rstd


def batch_norm_bwd(gy: torch.Tensor, x: torch.Tensor, weight, mean, rstd, *, training: bool, need_x: bool):
    """(gx | None, dw [C], db [C]); dw/db in fp32 (fp64 for fp64 x; cast by the caller)."""
    N, C, S, x3 = _ncs(x)
    g3 = gy.reshape(N, C, S)
    acc = partial_dtype(x.dtype)
    gx = torch.empty((N, C, S), dtype=x.dtype, device=x.device) if need_x else None
    dw = torch.empty(C, dtype=acc, device=x.device)
    db = torch.empty(C, dtype=acc, device=x.device)
    BN, BS, TS, T, TPP, split = _bn_grid(N, C, S, x.device)
    part = torch.empty(C, split, 2, dtype=acc, device=x.device)
    batch_norm_bwd_sums_kernel[(C * split,)](
        g3, x3, mean, rstd, part, N, S, *g3.stride(), *x3.stride(), TS, T, TPP, split,
        ACC=compute_dtype(x.dtype), BN=BN, BS=BS, num_warps=BN_WARPS)
    batch_norm_bwd_kernel[(C * (split if need_x else 1),)](
        g3, x3, weight if weight is not None else mean, mean, rstd, part, gx if gx is not None else dw, dw, db,
        N, S, *g3.stride(), *x3.stride(), C * S, S, TS, T, TPP if need_x else T, split if need_x else 1, split,
        TRAINING=training, HAS_W=weight is not None, NEED_X=need_x, ACC=compute_dtype(x.dtype),
        BN=BN, BS=BS, BLOCK_P=triton.next_power_of_2(split), num_warps=BN_WARPS)
    return (gx.reshape(x.shape) if gx is not None else None), dw, db
