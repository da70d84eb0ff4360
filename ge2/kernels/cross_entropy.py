"""Losses over class-index targets: cross-entropy (forward and backward fused in one pass) and nll.

Logits are [N, C] or [N, C, d1, ...]; each (n, d1, ...) picks a row of C classes, read through
strides (the class dim need not be last). For target t of a row, with p = softmax(x) and
lse = logsumexp(x), torch's semantics are

    loss_row = (1 - eps) * w[t] * (lse - x[t]) + (eps / C) * sum_c w[c] * (lse - x[c])
    dx_row   = a * (p - onehot(t)) + b * (sum(w) * p - w),   a = (1 - eps) w[t] / D,  b = (eps / C) / D

where D = 1 for 'sum'/'none' and, for 'mean', the sum of w[t] over the non-ignored rows (their
count without weights). Rows whose target is ``ignore_index`` give 0 loss and 0 gradient.

One pass over the logits gives both the row loss and dx (for gy = 1): the row is read once,
dx is written once, into the logits buffer itself when the caller allows it. Backward then only
scales dx by gy, reading gy on the device and skipping the pass when gy == 1 (``loss.backward()``).
Rows up to ``MAX_FUSED_C`` (32768) classes are held in registers by one program. Longer rows are
split over several programs (``cross_entropy_split_kernel``), each holding a slice in registers; on
the GPU they exchange a partial (max, sum exp) through global memory and wait for each other, so
the row is still read once. (``cross_entropy_two_pass_kernel``, one program per SM streaming a row
twice, the second pass from L2, is kept as an option: ``two_pass_config=`` / ``TWO_PASS_CONFIG``.)
Rows whose target is ignored are not read at all.

Targets are checked by ``target_stats_kernel``, a small pass over the targets that also computes
D and sum(w): an out-of-range target gives that row NaN loss and gradient (never an out-of-bounds
read) and counts in ``stats[2]``. ``raise_on_bad_targets`` turns that count into a ValueError:
at once on the CPU and with ``check_targets=True``; by default on the GPU without a host sync, the
count is copied to pinned memory behind an event and raised by the next class-target call (or by
``check_pending_targets()``); not at all with ``check_targets=False`` or in a captured CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.deferred import DeferredCounts
from ge2.kernels.elementwise import _float_arg, _float_bits
from ge2.kernels.losses import partial_dtype, sum_to_scalar
from ge2.kernels.softmax import compute_dtype, num_warps_configs, prune_by_elements_per_thread, row_offsets, row_view
from ge2.runtime import autotune, cdiv

# Longest class row one program holds in registers, by element size; longer rows take the split path.
# fp64 rows (8 bytes) are computed in fp64 by the in-register kernel only; longer fp64 rows are refused.
MAX_FUSED_C = {8: 16384, 4: 32768, 2: 32768, 1: 32768}
# The split path's (BLOCK_C, num_warps) by element size: the fastest of bench/bench_softmax_ce.py's
# sweep at 4096 x 128256 on the H100 (ce_split_sweep rows of bench/results/softmax_ce.json, commit
# 4050d31): fp32 (8192, 4) 1.41 ms, (4096, 2) 1.41, (4096, 4) 1.42, (4096, 8) 1.50; bf16 (8192, 4)
# 0.790, (4096, 2) 0.803, (4096, 4) 0.821, (4096, 8) 1.11. Four warps with many elements per thread
# beat eight: a program's cross-warp reductions and sync poll cost less, and more programs fit per SM.
SPLIT_CONFIG = {4: (8192, 4), 2: (8192, 4), 1: (8192, 4)}
# Rows of more than this many slices run as two launches (partials, then dx re-reading the row):
# a cooperative launch needs a row's SPLIT programs co-resident, kept far below the GPU's capacity.
MAX_COOPERATIVE_SPLIT = 64
# Rows of ROW_PERSISTENT_MIN_C < C <= MAX_FUSED_C classes, by element size: None = one program per row
# (cross_entropy_fwd_bwd_kernel), else the num_warps of cross_entropy_persistent_kernel. The fastest
# of bench/bench_softmax_ce.py's sweep at 8192 x 32768 on the H100 (ce_split_sweep rows): bf16
# persistent 32 warps 0.417 ms (16 warps 0.439) vs 0.488 one row per program; fp32 one row per
# program 0.725 ms vs 1.04-1.24 persistent (two fp32 rows of 32K do not fit in the registers: spills).
ROW_CONFIG = {8: None, 4: None, 2: 32, 1: 32}
# Rows longer than MAX_FUSED_C, by element size: (BLOCK_C, num_warps) of cross_entropy_two_pass_kernel,
# or None for the split kernel. The same sweep: bf16 two-pass (16384, 32) 0.96 ms vs split (8192, 4)
# 0.790 (the two-pass kernel was the faster, 0.96 vs 1.13, before the split kernel's one-exponential
# dx); fp32 rows (512 KB) of one program per SM overflow the L2 (1.80 ms two-pass).
TWO_PASS_CONFIG = {4: None, 2: None, 1: None}
ROW_PERSISTENT_MIN_C = 16384
SYNC_STRIDE: tl.constexpr = tl.constexpr(32)
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e), for _exp_from
TILE_ELEMENTS = 2048
STATS_BLOCK = 1024
TARGET_STATS_BLOCK = 4096  # targets per step of target_stats_kernel's loop (one program)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def target_stats_kernel(
    t_ptr, w_ptr, stats_ptr, n_rows, inner, st_o, st_i, C, ignore_index,
    HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
):
    """stats = [sum of w[t] over non-ignored rows, sum(w), number of out-of-range targets] (stats' dtype, one program)."""
    denom = tl.zeros([BLOCK], stats_ptr.dtype.element_ty)
    bad = tl.zeros([BLOCK], stats_ptr.dtype.element_ty)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        live = rows < n_rows
        t = tl.load(t_ptr + row_offsets(rows, inner, st_o, st_i), mask=live, other=ignore_index).to(tl.int64)
        valid = live & (t != ignore_index)
        in_range = (t >= 0) & (t < C)
        if HAS_WEIGHT:
            denom += tl.load(w_ptr + t, mask=valid & in_range, other=0.0).to(stats_ptr.dtype.element_ty)
        else:
            denom += tl.where(valid & in_range, 1.0, 0.0)
        bad += tl.where(valid & ~in_range, 1.0, 0.0)
    w_sum = tl.zeros([BLOCK], stats_ptr.dtype.element_ty)
    if HAS_WEIGHT:
        for start in range(0, C, BLOCK):
            c = start + tl.arange(0, BLOCK)
            w_sum += tl.load(w_ptr + c, mask=c < C, other=0.0).to(stats_ptr.dtype.element_ty)
    tl.store(stats_ptr, tl.sum(denom, 0))
    tl.store(stats_ptr + 1, tl.sum(w_sum, 0) if HAS_WEIGHT else C * 1.0)
    tl.store(stats_ptr + 2, tl.sum(bad, 0))


@triton.jit
def _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT: tl.constexpr,
                ACC: tl.constexpr = tl.float32):
    """(t, valid, bad, w[t]) for each row; w[t] (in ACC) = 0 for ignored or bad rows."""
    live = rows < n_rows
    t = tl.load(t_ptr + row_offsets(rows, inner, st_o, st_i), mask=live, other=ignore_index).to(tl.int64)
    valid = live & (t != ignore_index)
    bad = valid & ((t < 0) | (t >= C))
    use = valid & ~bad
    if HAS_WEIGHT:
        w_t = tl.load(w_ptr + t, mask=use, other=0.0).to(ACC)
    else:
        w_t = tl.where(use, 1.0, 0.0).to(ACC)
    return t, valid, bad, w_t


@autotune(num_warps_configs(), key=["BLOCK_M", "BLOCK_C", "HAS_WEIGHT", "SMOOTH", "COMPUTE_GRAD"], default=0,
          prune_configs_by={"early_config_prune": prune_by_elements_per_thread}, restore_value=["x_ptr"])
@triton.jit
def cross_entropy_fwd_bwd_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """BLOCK_M whole rows in registers: the row loss (unnormalised) and dx for gy = 1 (may overwrite x).

    Math in ACC (fp64 for fp64 logits, else fp32); label_smoothing arrives as its fp64 bits.

    x[t] is a gathered load (no third row reduction); the gradient recomputes exp(x - max) from
    the loaded row rather than keeping the exponentials live across the reductions (one array of
    registers instead of two at 32K classes: 0.59 -> 0.54 ms bf16 at 8192 x 32768 on the H100).
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT, ACC)
    label_smoothing = _float_arg(label_smoothing, ACC)
    use = valid & ~bad
    x_base = row_offsets(rows, inner, sx_o, sx_i)
    # Ignored (and bad) rows are not read: their loss and dx do not depend on the logits.
    x = tl.load(x_ptr + x_base[:, None] + cols[None, :] * sx_c, mask=ok & use[:, None],
                other=float("-inf")).to(ACC)
    row_max = tl.max(x, 1)
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(tl.exp(x - row_max[:, None]), 1)
    lse = row_max + tl.log(row_sum)
    x_t = tl.load(x_ptr + x_base + tl.where(use, t, 0) * sx_c, mask=use, other=0.0).to(ACC)
    w_sum = tl.load(stats_ptr + 1).to(ACC)
    w_x = 0.0
    if SMOOTH:
        if HAS_WEIGHT:
            w_row = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
        else:
            w_row = tl.where(col_ok, 1.0, 0.0)[None, :]
        w_x = tl.sum(tl.where(ok, w_row * x, 0.0), 1)
    else:
        w_row = tl.zeros([1, BLOCK_C], ACC)
    loss = _ce_loss(lse, x_t, w_x, w_t, w_sum, valid, bad, label_smoothing, C, SMOOTH)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=rows < n_rows)
    if COMPUTE_GRAD:
        inv_d = 1.0
        if MEAN:
            inv_d = 1.0 / tl.load(stats_ptr).to(ACC)
        p = tl.exp(x - row_max[:, None]) * (1.0 / row_sum[:, None])
        g = _ce_grad(p, cols[None, :], t[:, None], valid[:, None], bad[:, None], w_t[:, None], w_row, w_sum,
                     inv_d, label_smoothing, C, SMOOTH)
        g_off = row_offsets(rows, inner, sg_o, sg_i)[:, None] + cols[None, :] * sg_c
        tl.store(g_ptr + g_off, g.to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def cross_entropy_persistent_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Whole rows, persistent: program p does rows p, p + P, p + 2P, ... (P programs, as many as fit at once).

    While it reduces row r and writes r's dx, row r + P is already being loaded (issued after
    r's reductions, before its dx), and the target of r + 2P: the SM's memory requests never
    stop for a row's reductions, its exponentials and its dx arithmetic, which the one-row-per-
    program kernel runs with nothing in flight (one 32-warp program per SM at 32K classes). One
    exponential per element: p = e / sum with e = exp(x - max) kept from the sum, in place of x.
    """
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    c = tl.arange(0, BLOCK_C)
    ok = c < C
    w_sum = tl.load(stats_ptr + 1)
    inv_d = 1.0
    if MEAN:
        inv_d = 1.0 / tl.load(stats_ptr)
    w_c = tl.where(ok, 1.0, 0.0)
    if SMOOTH:
        if HAS_WEIGHT:
            w_c = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    # the pipeline: this row's and the next row's targets, this row's logits (and x[t]) in flight
    t, valid, bad, w_t = _row_target(t_ptr, pid, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    t1, valid1, bad1, w_t1 = _row_target(t_ptr, pid + n_prog, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr,
                                         HAS_WEIGHT)
    x_nxt, x_t_nxt = _load_row(x_ptr, pid, inner, sx_o, sx_i, sx_c, c, ok, t, valid & ~bad)
    for k in range(0, tl.cdiv(n_rows - pid, n_prog)):
        row = pid + k * n_prog
        x = x_nxt.to(tl.float32)
        x_t = x_t_nxt
        row_max = tl.max(x, 0)
        row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
        e = tl.exp(x - row_max)
        row_sum = tl.sum(e, 0)
        wx = 0.0
        if SMOOTH:
            wx = tl.sum(tl.where(ok, w_c * x, 0.0), 0)
        # Prefetch the next row (its target arrived during this one) and the target after it. In
        # place this is safe: another row.
        x_nxt, x_t_nxt = _load_row(x_ptr, row + n_prog, inner, sx_o, sx_i, sx_c, c, ok, t1, valid1 & ~bad1)
        t2, valid2, bad2, w_t2 = _row_target(t_ptr, row + 2 * n_prog, n_rows, inner, st_o, st_i, C, ignore_index,
                                             w_ptr, HAS_WEIGHT)
        lse = row_max + tl.log(row_sum)
        loss = _ce_loss(lse, x_t, wx, w_t, w_sum, valid, bad, label_smoothing, C, SMOOTH)
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        g = _ce_grad(e * (1.0 / row_sum), c, t, valid, bad, w_t, w_c, w_sum, inv_d, label_smoothing, C, SMOOTH)
        tl.store(g_ptr + row_offsets(row, inner, sg_o, sg_i) + c * sg_c, g.to(g_ptr.dtype.element_ty), mask=ok)
        t, valid, bad, w_t = t1, valid1, bad1, w_t1
        t1, valid1, bad1, w_t1 = t2, valid2, bad2, w_t2


@triton.jit
def cross_entropy_two_pass_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Long rows, persistent, one program per row at a time, in BLOCK_C tiles: (max, sum exp) in a first
    pass over the row, then dx in a second pass that re-reads the row from L2 (last tile first).

    With one program per SM the rows in flight (132 x 256 KB of bf16 at 128256 classes) fit in the
    50 MB L2, so DRAM sees one read and one write of the logits and no program waits for another
    (the split kernel's slices do). The first pass keeps the next tile's load in flight while it
    reduces this one, and keeps its loads in L2 (evict_last); the second pass reads them once more
    (evict_first), newest first. x[t] is read before the second pass overwrites anything (in place).
    """
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    c0 = tl.arange(0, BLOCK_C)
    n_tiles = tl.cdiv(C, BLOCK_C)
    w_sum = tl.load(stats_ptr + 1)
    inv_d = 1.0
    if MEAN:
        inv_d = 1.0 / tl.load(stats_ptr)
    for row in range(pid, n_rows, n_prog):
        t, valid, bad, w_t = _row_target(t_ptr, row, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
        use = valid & ~bad
        x_base = row_offsets(row, inner, sx_o, sx_i)
        # Per lane: sum exp(x - m) with m the running row max (one block max per tile); sum w x.
        m = float("-inf")
        s = tl.zeros([BLOCK_C], tl.float32)
        wx = tl.zeros([BLOCK_C], tl.float32)
        x_nxt = tl.load(x_ptr + x_base + c0 * sx_c, mask=(c0 < C) & use, other=float("-inf"),
                        eviction_policy="evict_last")
        for b in range(0, tl.where(use, n_tiles, 0)):
            c = b * BLOCK_C + c0
            x = x_nxt.to(tl.float32)
            c_nxt = c + BLOCK_C
            x_nxt = tl.load(x_ptr + x_base + c_nxt * sx_c, mask=c_nxt < C, other=float("-inf"),
                            eviction_policy="evict_last")
            m_new = tl.maximum(m, tl.max(x, 0))
            # an all -inf tile (or row) so far keeps m = -inf: exp(-inf - 0) = 0, never NaN
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
            if SMOOTH:
                ok = c < C
                if HAS_WEIGHT:
                    w_c = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
                else:
                    w_c = tl.where(ok, 1.0, 0.0)
                wx += tl.where(ok, w_c * x, 0.0)
        row_max = tl.where(m == float("-inf"), 0.0, m)
        row_sum = tl.sum(s, 0)
        lse = row_max + tl.log(row_sum)
        x_t = tl.load(x_ptr + x_base + tl.where(use, t, 0) * sx_c, mask=use, other=0.0).to(tl.float32)
        wx_row = 0.0
        if SMOOTH:
            wx_row = tl.sum(wx, 0)
        loss = _ce_loss(lse, x_t, wx_row, w_t, w_sum, valid, bad, label_smoothing, C, SMOOTH)
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        if COMPUTE_GRAD:
            g_base = row_offsets(row, inner, sg_o, sg_i)
            inv_sum = 1.0 / row_sum
            for i in range(0, n_tiles):
                c = (n_tiles - 1 - i) * BLOCK_C + c0
                ok = c < C
                x = tl.load(x_ptr + x_base + c * sx_c, mask=ok & use, other=float("-inf"),
                            eviction_policy="evict_first").to(tl.float32)
                w_c = tl.where(ok, 1.0, 0.0)
                if SMOOTH:
                    if HAS_WEIGHT:
                        w_c = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
                g = _ce_grad(tl.exp(x - row_max) * inv_sum, c, t, valid, bad, w_t, w_c, w_sum, inv_d,
                             label_smoothing, C, SMOOTH)
                # evict_first: dx is done with, the L2 keeps the rows the first passes are reading
                tl.store(g_ptr + g_base + c * sg_c, g.to(g_ptr.dtype.element_ty), mask=ok, eviction_policy="evict_first")


@triton.jit
def _load_row(x_ptr, row, inner, sx_o, sx_i, sx_c, c, ok, t, use):
    """(a row's logits in x's dtype, -inf past C; x[t] in fp32). Rows ignored, bad or past the last one are not read."""
    x_base = row_offsets(row, inner, sx_o, sx_i)
    x = tl.load(x_ptr + x_base + c * sx_c, mask=ok & use, other=float("-inf"))
    x_t = tl.load(x_ptr + x_base + tl.where(use, t, 0) * sx_c, mask=use, other=0.0).to(tl.float32)
    return x, x_t


@triton.jit
def cross_entropy_split_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, part_ptr, sync_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    PHASE: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Long rows split over SPLIT programs of BLOCK_C classes: partial (max, sum exp) per slice, combined per row.

    PHASE 0 (GPU, one launch, cooperative): each program reduces its slice, publishes the partial,
    waits for the row's other SPLIT - 1 programs, combines, then writes dx from the slice's
    exponentials still in registers: the logits are read once, and each element costs one
    exponential and one multiply of dx (see the dx comment). PHASE 1 then PHASE 2 (two launches; the interpreter, which
    runs programs one after another, and splits too wide to be co-resident): partials, then the
    combine and dx, re-reading the slice. Partials: part_ptr [n_rows, SPLIT, 4] = (max, sum exp(x -
    max), sum w x, x[t] if t is in the slice else 0). sync_ptr: n_rows arrival counters and a ticket
    counter, SYNC_STRIDE int32 apart (one 128-byte line each: the rows in flight poll their
    counters without contending for one line), zeroed by the launcher (PHASE 0 only).
    """
    if PHASE == 0:
        # Slices are handed out in arrival order (a ticket), not by program id: a row's programs
        # then hold consecutive tickets, so at any time at most one row has programs still waiting
        # for a sibling that has not started; every other waiting row's siblings are resident and
        # finish, which frees their slots. No deadlock needs more than SPLIT co-resident programs.
        ticket = tl.atomic_add(sync_ptr + n_rows * SYNC_STRIDE, 1, sem="relaxed")
    else:
        ticket = tl.program_id(0)
    row = ticket // SPLIT
    part = ticket % SPLIT
    t, valid, bad, w_t = _row_target(t_ptr, row, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    use = valid & ~bad
    x_base = row_offsets(row, inner, sx_o, sx_i)
    lo = part * BLOCK_C
    c = lo + tl.arange(0, BLOCK_C)
    ok = c < C
    w_sum = tl.load(stats_ptr + 1)
    w_c = tl.where(ok, 1.0, 0.0)
    if SMOOTH:
        if HAS_WEIGHT:
            w_c = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    p_row = part_ptr + row.to(tl.int64) * (SPLIT * 4)
    if PHASE != 2:
        x = _load_slice(x_ptr, x_base, c, sx_c, ok, use)
        m = tl.max(x, 0)
        # kept for dx (PHASE 0): p = e exp(m - row max) / row sum, one exponential per element
        e = _exp_from(x, m, x_ptr.dtype.element_ty != tl.float32)
        s = tl.sum(e, 0)
        wx = 0.0
        if SMOOTH:
            wx = tl.sum(tl.where(ok, w_c * x, 0.0), 0)
        # x[t] is read here, before any program of the row can overwrite it with dx (in place).
        has_t = use & (t >= lo) & (t < lo + BLOCK_C)
        x_t = tl.load(x_ptr + x_base + tl.where(has_t, t, 0) * sx_c, mask=has_t, other=0.0).to(tl.float32)
        p_out = p_row + part * 4
        tl.store(p_out, m)
        tl.store(p_out + 1, s)
        tl.store(p_out + 2, wx)
        tl.store(p_out + 3, x_t)
    if PHASE == 0:
        # Publish (a CTA barrier, then one release atomic: the partial stores above come first),
        # then poll the row's counter until all SPLIT slices have arrived.
        tl.debug_barrier()
        counter = sync_ptr + row * SYNC_STRIDE
        arrived = tl.atomic_add(counter, 1, sem="acq_rel") + 1
        while arrived < SPLIT:
            arrived = tl.atomic_add(counter, 0, sem="acq_rel")
        tl.debug_barrier()
    if PHASE != 1:
        j = tl.arange(0, SPLIT_P2)
        jm = j < SPLIT
        # .cg: read the siblings' partials from L2, never from a stale L1 line.
        pm = tl.load(p_row + j * 4, mask=jm, other=float("-inf"), cache_modifier=".cg")
        ps = tl.load(p_row + j * 4 + 1, mask=jm, other=0.0, cache_modifier=".cg")
        row_max = tl.max(pm, 0)
        row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
        row_sum = tl.sum(tl.where(pm == float("-inf"), 0.0, ps * tl.exp(pm - row_max)), 0)
        lse = row_max + tl.log(row_sum)
        if part == 0:
            x_t_row = tl.sum(tl.load(p_row + j * 4 + 3, mask=jm, other=0.0, cache_modifier=".cg"), 0)
            wx_row = 0.0
            if SMOOTH:
                wx_row = tl.sum(tl.load(p_row + j * 4 + 2, mask=jm, other=0.0, cache_modifier=".cg"), 0)
            loss = _ce_loss(lse, x_t_row, wx_row, w_t, w_sum, valid, bad, label_smoothing, C, SMOOTH)
            tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        if COMPUTE_GRAD:
            inv_d = 1.0
            if MEAN:
                inv_d = 1.0 / tl.load(stats_ptr)
            fma = x_ptr.dtype.element_ty != tl.float32
            if PHASE == 2:  # the slice again, its max and x[t] from the partials: PHASE 0's values, bit for bit
                m = tl.load(p_row + part * 4)
                x_t = tl.load(p_row + part * 4 + 3)
                e = _exp_from(_load_slice(x_ptr, x_base, c, sx_c, ok, use), m, fma)
            # dx = a p - a onehot(t) + b (sum(w) p - w) with p = e scale: one multiply (smoothing: and a
            # multiply-add) per element; the target's -a is one element, stored after the slice. The
            # row's state rides on the scalars: w[t] = 0 makes a = 0 for an ignored row (whose e is 0),
            # a bad target makes a NaN. A slice of only -inf has e = 0 and needs scale 0, not
            # exp(0 - row max) (inf for a low max).
            scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - row_max) / row_sum)
            a = tl.where(bad, float("nan"), (1.0 - label_smoothing) * w_t * inv_d)
            b = 0.0
            if SMOOTH:
                b = tl.where(valid, (label_smoothing / C) * inv_d, 0.0)
            k = scale * (a + b * w_sum)
            g = e * k
            if SMOOTH:
                g -= b * w_c
            g_base = row_offsets(row, inner, sg_o, sg_i)
            tl.store(g_ptr + g_base + c * sg_c, g.to(g_ptr.dtype.element_ty), mask=ok)
            has_t = use & (t >= lo) & (t < lo + BLOCK_C)
            if has_t:
                tl.debug_barrier()  # the slice's store of dx[t] comes first (the barrier orders the two writes)
                g_t = _exp_from(x_t, m, fma) * k - a
                if SMOOTH:
                    w_tc = 1.0
                    if HAS_WEIGHT:
                        w_tc = tl.load(w_ptr + t).to(tl.float32)
                    g_t -= b * w_tc
                tl.store(g_ptr + g_base + t * sg_c, g_t.to(g_ptr.dtype.element_ty))


@triton.jit
def _exp_from(x, m, FMA: tl.constexpr):
    """exp(x - m) with m = -inf read as 0 (an all -inf slice gives 0, not NaN). FMA: as exp2(x log2(e) -
    m log2(e)), one FMA before the ex2 instead of a subtract and a multiply, at ~1e-7 |x| relative
    error (rounding x log2(e)): for 16-bit inputs, whose dx is rounded to 2^-8 anyway."""
    m = tl.where(m == float("-inf"), 0.0, m)
    if FMA:
        return tl.math.exp2(x * LOG2E - m * LOG2E)
    return tl.exp(x - m)


@triton.jit
def _load_slice(x_ptr, x_base, c, sx_c, ok, use):
    """A row slice in fp32; rows that are ignored (or bad) are not read: their loss and dx do not depend on them."""
    return tl.load(x_ptr + x_base + c * sx_c, mask=ok & use, other=float("-inf")).to(tl.float32)


@triton.jit
def _ce_loss(lse, x_t, wx, w_t, w_sum, valid, bad, label_smoothing, C, SMOOTH: tl.constexpr):
    """A row's loss (before the mean's 1/D) from lse, x[t] and (SMOOTH) sum_c w[c] x[c]; 0 for ignored rows, NaN for bad ones."""
    loss = (1.0 - label_smoothing) * w_t * (lse - x_t)
    if SMOOTH:
        loss += (label_smoothing / C) * (w_sum * lse - wx)
    # Ignored rows are 0 even when their logits are NaN (w[t] = 0 times NaN would not be).
    loss = tl.where(valid, loss, 0.0)
    return tl.where(bad, float("nan"), loss)


@triton.jit
def _ce_grad(p, c, t, valid, bad, w_t, w_c, w_sum, inv_d, label_smoothing, C, SMOOTH: tl.constexpr):
    """dx for gy = 1 from the probabilities p of a row (slice): a (p - onehot(t)) + b (sum(w) p - w); 0 for ignored rows, NaN for bad ones."""
    g = ((1.0 - label_smoothing) * w_t * inv_d) * (p - tl.where(c == t, 1.0, 0.0))
    if SMOOTH:
        g += ((label_smoothing / C) * inv_d) * (w_sum * p - w_c)
    # Ignored rows get exactly 0 (not 0 * NaN for a row of NaN logits); bad targets get NaN.
    g = tl.where(valid, g, 0.0)
    return tl.where(bad, float("nan"), g)


@triton.jit
def scale_rows_kernel(g_ptr, gy_ptr, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i,
                      PER_ROW: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr):
    """g[row, :] *= gy[row] (PER_ROW) or gy[0], over (row, column block) tiles strided across the programs.

    A 0-d gy of exactly 1 (``loss.backward()``) costs each program one load: a small grid, so the
    skipped pass costs a few microseconds rather than a launch of one program per tile.
    """
    f = tl.load(gy_ptr).to(ACC)
    if PER_ROW:
        _scale_tiles(g_ptr, gy_ptr, f, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i, True, ACC, BLOCK_C)
    elif f != 1.0:
        _scale_tiles(g_ptr, gy_ptr, f, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i, False, ACC, BLOCK_C)


@triton.jit
def _scale_tiles(g_ptr, gy_ptr, f, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i,
                 PER_ROW: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr):
    n_cb = tl.cdiv(C, BLOCK_C)
    for tile in range(tl.program_id(0), n_rows * n_cb, tl.num_programs(0)):
        row = tile // n_cb
        if PER_ROW:
            f = tl.load(gy_ptr + row_offsets(row, inner, sy_o, sy_i)).to(ACC)
        if f != 1.0:
            base = row_offsets(row, inner, sg_o, sg_i)
            c = (tile - row * n_cb) * BLOCK_C + tl.arange(0, BLOCK_C)
            ok = c < C
            v = tl.load(g_ptr + base + c * sg_c, mask=ok).to(ACC)
            tl.store(g_ptr + base + c * sg_c, (v * f).to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def nll_fwd_kernel(
    x_ptr, t_ptr, w_ptr, loss_ptr, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i, ignore_index,
    HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
):
    """loss[row] = -w[t] * x[row, t] (0 for ignored rows, NaN for out-of-range targets)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT, ACC)
    use = valid & ~bad
    x_t = tl.load(x_ptr + row_offsets(rows, inner, sx_o, sx_i) + tl.where(use, t, 0) * sx_c,
                  mask=use, other=0.0).to(ACC)
    loss = tl.where(bad, float("nan"), -w_t * x_t)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=rows < n_rows)


@triton.jit
def nll_bwd_kernel(
    gy_ptr, t_ptr, w_ptr, stats_ptr, g_ptr, n_rows, C, inner, st_o, st_i, sy_o, sy_i, ignore_index,
    HAS_WEIGHT: tl.constexpr, MEAN: tl.constexpr, PER_ROW: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """g[row, c] = -(c == t) * w[t] * gy / D, written whole (zeros included) into a contiguous [N, C, d...]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = rows < n_rows
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT, ACC)
    if PER_ROW:
        f = tl.load(gy_ptr + row_offsets(rows, inner, sy_o, sy_i), mask=live, other=0.0).to(ACC)
    else:
        f = tl.load(gy_ptr).to(ACC)
    if MEAN:
        f = f / tl.load(stats_ptr).to(ACC)
    coef = tl.where(bad, float("nan"), -w_t * f)
    g = tl.where(cols[None, :] == t[:, None], coef[:, None], 0.0)
    g = tl.where(bad[:, None], float("nan"), g)
    # contiguous [outer, C, inner]: row (o, i) at o * C * inner + i, classes inner apart
    g_off = row_offsets(rows, inner, C * inner, 1)[:, None] + cols[None, :].to(tl.int64) * inner
    tl.store(g_ptr + g_off, g.to(g_ptr.dtype.element_ty), mask=live[:, None] & (cols < C)[None, :])


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _target_rows(target: torch.Tensor):
    """target [N, d...] as rows (n, d...) -> (target, (stride_outer, stride_inner)) matching the logits' rows."""
    t, _, (st_o, st_i, _) = row_view(target.unsqueeze(1), 1)
    return t, st_o, st_i


def target_stats(op: str, target: torch.Tensor, n_classes: int, *, weight: torch.Tensor | None,
                 ignore_index: int, inner: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Device [3] of ``dtype`` (fp32, or fp64 for fp64 losses): (sum of w[t] over non-ignored rows, sum(w),
    number of out-of-range targets).
    """
    stats = torch.empty(3, dtype=dtype, device=target.device)
    t, st_o, st_i = _target_rows(target)
    # a batch's targets in one step where they fit: the one program's loop is a chain of dependent loads
    block = min(max(triton.next_power_of_2(target.numel()), 128), TARGET_STATS_BLOCK)
    target_stats_kernel[(1,)](t, weight if weight is not None else stats, stats, target.numel(), inner,
                              st_o, st_i, n_classes, ignore_index, HAS_WEIGHT=weight is not None, BLOCK=block,
                              num_warps=8 if block >= 2048 else 4)
    return stats


def raise_on_bad_targets(op: str, stats: torch.Tensor, n_classes: int, ignore_index: int,
                         check: bool | None) -> None:
    """Raise ValueError if stats[2] counts out-of-range targets: now, deferred (GPU default), or never.

    check=False or a CUDA graph being captured: never (bad rows are NaN). CPU tensors or
    check=True: now (on the GPU, a 4-byte read that waits for the GPU). check=None on the GPU: the
    count is copied to pinned memory behind an event, with no host sync, and raised by the next
    class-target call that finds the copy done, or by ``check_pending_targets()``.
    """
    _DEFERRED.report(stats[2:3], lambda n_bad: _bad_targets_message(op, n_bad, n_classes, ignore_index), check)


def _bad_targets_message(op: str, n_bad: int, n_classes: int, ignore_index: int) -> str:
    return (f"{op}: {n_bad} target value(s) out of range: class targets must be in [0, {n_classes}) "
            f"or equal ignore_index={ignore_index}")


def check_pending_targets(wait: bool = True) -> None:
    """Raise the first out-of-range target count left by earlier GPU calls (waiting for them if ``wait``).

    Each later class-target call (cross_entropy, nll_loss, linear_cross_entropy) raises the landed
    ones without waiting; call it with wait=True where an error must surface (end of a step).
    """
    _DEFERRED.raise_pending(wait)


_DEFERRED = DeferredCounts(" (found by an earlier call and reported without a host sync; check_targets=True "
                           "raises at the call itself)")


def _class_rows(logits: torch.Tensor):
    """logits [N, C, d...] as rows -> (logits or a copy, rows, C, inner, (s_outer, s_inner, s_class))."""
    x, (outer, c, inner), strides = row_view(logits, 1)
    return x, outer * inner, c, inner, strides


def cross_entropy_rows(
    x: torch.Tensor, target: torch.Tensor, stats: torch.Tensor, row_loss: torch.Tensor, grad: torch.Tensor | None, *,
    weight: torch.Tensor | None = None, ignore_index: int = -100, label_smoothing: float = 0.0, mean: bool = True,
    max_fused_c: int | None = None, split_config: tuple[int, int] | None = None, cooperative: bool | None = None,
    persistent_warps: int | None = None, two_pass_config: tuple[int, int] | None = None,
) -> None:
    """The fused pass: row losses (unnormalised) into ``row_loss`` and, if ``grad`` is given, dx for gy = 1.

    x [N, C, d...] (any strides), target [N, d...], stats from ``target_stats`` (the mean's D may
    come from more rows than these: linear_cross_entropy passes the whole batch's); ``grad`` may be x.
    Rows of C <= max_fused_c (default MAX_FUSED_C[element size]) classes: whole rows per program,
    one row each, or looping over rows (the persistent kernel, with ``persistent_warps`` warps;
    default ROW_CONFIG for rows longer than ROW_PERSISTENT_MIN_C, when the gradient is wanted).
    Longer rows: the two-pass kernel with ``two_pass_config`` = (BLOCK_C, num_warps) (default
    TWO_PASS_CONFIG, when not None and no ``split_config`` is given; also for any row when given), else
    the split kernel (any row when ``split_config`` = (BLOCK_C, num_warps) is given), cooperative (one launch) on the GPU for the gradient pass unless ``cooperative=False``
    or the split is wider than MAX_COOPERATIVE_SPLIT; never under the interpreter, which runs
    programs one after another (a program waiting for a later one would never return).
    """
    _, n_rows, C, inner, (sx_o, sx_i, sx_c) = _class_rows(x)
    if not n_rows:
        return
    t, st_o, st_i = _target_rows(target)
    g = grad if grad is not None else x
    sg_o, sg_i, sg_c = row_view(g, 1)[2] if grad is not None else (0, 0, 0)
    w = weight if weight is not None else stats
    max_fused_c = max_fused_c or MAX_FUSED_C[x.element_size()]
    if x.dtype == torch.float64 and (C > max_fused_c or split_config or persistent_warps or two_pass_config):
        raise ValueError(f"cross_entropy: float64 logits are computed in float64 only for rows of up to "
                         f"{max_fused_c} classes, got {C} (use float32 for longer rows)")
    meta = dict(HAS_WEIGHT=weight is not None, SMOOTH=label_smoothing > 0, MEAN=mean, COMPUTE_GRAD=grad is not None)
    if persistent_warps is None and C > ROW_PERSISTENT_MIN_C and grad is not None:
        persistent_warps = ROW_CONFIG[x.element_size()]
    if C <= max_fused_c and split_config is None and persistent_warps and grad is not None:
        args = (x, t, w, stats, row_loss, g, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c,
                ignore_index, float(label_smoothing))
        shape = dict(HAS_WEIGHT=meta["HAS_WEIGHT"], SMOOTH=meta["SMOOTH"], MEAN=mean,
                     BLOCK_C=triton.next_power_of_2(C), num_warps=persistent_warps)
        programs = min(n_rows, _resident_programs(cross_entropy_persistent_kernel, args, shape, x.device))
        cross_entropy_persistent_kernel[(programs,)](*args, **shape)
        return
    if two_pass_config is None and C > max_fused_c and split_config is None:
        two_pass_config = TWO_PASS_CONFIG[x.element_size()]
    if two_pass_config is not None:
        block_c, num_warps = two_pass_config
        # one program per SM: more rows in flight would overflow the L2 the second pass reads from
        programs = min(n_rows, _num_sms(x.device) if x.is_cuda else 3)
        cross_entropy_two_pass_kernel[(programs,)](
            x, t, w, stats, row_loss, g, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c,
            ignore_index, float(label_smoothing), **meta, BLOCK_C=min(block_c, triton.next_power_of_2(C)),
            num_warps=num_warps)
        return
    if C <= max_fused_c and split_config is None:
        block_c = triton.next_power_of_2(C)
        block_m = min(max(1, TILE_ELEMENTS // block_c), triton.next_power_of_2(n_rows))
        cross_entropy_fwd_bwd_kernel[(cdiv(n_rows, block_m),)](
            x, t, w, stats, row_loss, g, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c,
            ignore_index, _float_bits(label_smoothing), **meta, ACC=compute_dtype(x.dtype), BLOCK_M=block_m,
            BLOCK_C=block_c)
        return
    block_c, num_warps = split_config or SPLIT_CONFIG[x.element_size()]
    # slices no longer than the in-register limit (tests lower it to reach this path with tiny rows)
    block_c = min(block_c, 1 << (max(max_fused_c, 2).bit_length() - 1))
    split = cdiv(C, block_c)
    if cooperative is None:
        cooperative = grad is not None and split <= MAX_COOPERATIVE_SPLIT
    cooperative = cooperative and x.is_cuda
    # partials [n_rows, split, 4] fp32, then (cooperative) n_rows arrival counters and a ticket, zeroed
    n_part = n_rows * split * 4
    n_sync = (n_rows + 1) * SYNC_STRIDE.value if cooperative else 0
    ws = (torch.zeros if cooperative else torch.empty)(n_part + n_sync, dtype=torch.float32, device=x.device)
    sync = ws[n_part:].view(torch.int32) if cooperative else ws
    args = (x, t, w, stats, row_loss, g, ws, sync, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i,
            sg_o, sg_i, sg_c, ignore_index, float(label_smoothing))
    shape = dict(**meta, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split), BLOCK_C=block_c, num_warps=num_warps)
    grid = (n_rows * split,)
    for phase in ((0,) if cooperative else (1, 2)):
        cross_entropy_split_kernel[grid](*args, **shape, PHASE=phase)


def _resident_programs(kernel, args: tuple, shape: dict, device: torch.device) -> int:
    """How many programs of ``kernel`` the GPU holds at once (its registers, shared memory and warps per SM).

    Compiled once per specialization (``warmup``) to read its register count. Under the
    interpreter: 3, so that the tests' programs loop over several rows.
    """
    if device.type != "cuda":
        return 3
    key = (kernel, device, tuple(sorted(shape.items())), tuple(a.dtype for a in args[:6]))
    if key not in _RESIDENT:
        k = kernel.warmup(*args, grid=(1,), **shape)
        k._init_handles()
        p = torch.cuda.get_device_properties(device)
        warps = shape["num_warps"]
        regs_per_warp = -(-max(k.n_regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
        by_regs = getattr(p, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps)
        by_threads = getattr(p, "max_threads_per_multi_processor", 2048) // (32 * warps)
        by_smem = getattr(p, "shared_memory_per_multiprocessor", 233472) // (k.metadata.shared + 1024)
        _RESIDENT[key] = max(1, min(by_regs, by_threads, by_smem, 32)) * p.multi_processor_count
    return _RESIDENT[key]


_RESIDENT: dict = {}


def _num_sms(device: torch.device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_SMS: dict[torch.device, int] = {}


def cross_entropy_fwd_bwd(
    logits: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", label_smoothing: float = 0.0, compute_grad: bool = True, inplace: bool = False,
    check_targets: bool | None = None, max_fused_c: int | None = None,
    split_config: tuple[int, int] | None = None, cooperative: bool | None = None, persistent_warps: int | None = None,
    two_pass_config: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, dlogits for gy = 1): loss 0-d ('mean'/'sum') or [N, d...] ('none') in logits' dtype.

    logits [N, C, d...] (C = logits.shape[1]), target [N, d...] integer. With ``inplace`` the
    gradient overwrites ``logits`` (returned as dlogits; the caller must own that buffer).
    """
    x, n_rows, C, inner, _ = _class_rows(logits)
    stats = target_stats("cross_entropy", target, C, weight=weight, ignore_index=ignore_index, inner=inner,
                         dtype=partial_dtype(logits.dtype))
    row_loss = (torch.empty(target.shape, dtype=logits.dtype, device=logits.device) if reduction == "none"
                else torch.empty(n_rows, dtype=partial_dtype(logits.dtype), device=logits.device))
    grad = None
    if compute_grad:
        # In place only into the caller's own buffer (not into a contiguous copy row_view made).
        grad = x if inplace and x.data_ptr() == logits.data_ptr() else torch.empty_like(x)
    cross_entropy_rows(x, target, stats, row_loss, grad, weight=weight, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, mean=reduction == "mean", max_fused_c=max_fused_c,
                       split_config=split_config, cooperative=cooperative, persistent_warps=persistent_warps,
                       two_pass_config=two_pass_config)
    if reduction == "none":
        loss = row_loss
    else:
        loss = sum_to_scalar(row_loss, logits.dtype, denom=stats if reduction == "mean" else None)
    raise_on_bad_targets("cross_entropy", stats, C, ignore_index, check_targets)
    return loss, grad


@triton.jit
def column_sums_kernel(g_ptr, out_ptr, M, N, s_m, s_n, ACCUMULATE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n] (+)= sum over m of g[m, n], fp32: the bias gradient of linear_cross_entropy."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, M, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        ok = (rows < M)[:, None] & col_ok[None, :]
        acc += tl.load(g_ptr + rows[:, None].to(tl.int64) * s_m + cols[None, :] * s_n, mask=ok, other=0.0)
    total = tl.sum(acc, 0)
    if ACCUMULATE:
        total += tl.load(out_ptr + cols, mask=col_ok, other=0.0)
    tl.store(out_ptr + cols, total, mask=col_ok)


def column_sums_(g: torch.Tensor, out: torch.Tensor, *, accumulate: bool) -> torch.Tensor:
    """out [N] fp32 (+)= g [M, N].sum(0)."""
    M, N = g.shape
    block_n = 128
    column_sums_kernel[(cdiv(N, block_n),)](g, out, M, N, g.stride(0), g.stride(1), ACCUMULATE=accumulate,
                                                   BLOCK_M=32, BLOCK_N=block_n)
    return out


def cross_entropy_scale_grad_(grad: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """In place: dlogits [N, C, d...] *= gy (0-d, or [N, d...] per row); a pass only where gy != 1."""
    _, n_rows, C, inner, (sg_o, sg_i, sg_c) = _class_rows(grad)
    if not n_rows or not C:
        return grad
    per_row = gy.dim() > 0
    sy_o, sy_i = _target_rows(gy)[1:] if per_row else (0, 0)
    block_c = min(triton.next_power_of_2(C), 4096)
    tiles = n_rows * cdiv(C, block_c)
    programs = min(tiles, 8 * _num_sms(grad.device) if grad.is_cuda else 4)
    scale_rows_kernel[(programs,)](grad, gy, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i,
                                   PER_ROW=per_row, ACC=compute_dtype(grad.dtype), BLOCK_C=block_c, num_warps=8)
    return grad


def nll_fwd(logp: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None,
            ignore_index: int = -100, reduction: str = "mean", check_targets: bool | None = None) -> torch.Tensor:
    """nll loss of log-probabilities logp [N, C, d...] at targets [N, d...]: 0-d or [N, d...] (logp's dtype)."""
    op = "nll_loss"
    x, n_rows, C, inner, (sx_o, sx_i, sx_c) = _class_rows(logp)
    stats = target_stats(op, target, C, weight=weight, ignore_index=ignore_index, inner=inner,
                         dtype=partial_dtype(logp.dtype))
    row_loss = (torch.empty(target.shape, dtype=logp.dtype, device=logp.device) if reduction == "none"
                else torch.empty(n_rows, dtype=partial_dtype(logp.dtype), device=logp.device))
    if n_rows:
        t, st_o, st_i = _target_rows(target)
        nll_fwd_kernel[(cdiv(n_rows, STATS_BLOCK),)](
            x, t, weight if weight is not None else stats, row_loss, n_rows, C, inner, sx_o, sx_i, sx_c,
            st_o, st_i, ignore_index, HAS_WEIGHT=weight is not None, ACC=compute_dtype(logp.dtype), BLOCK=STATS_BLOCK)
    loss = row_loss if reduction == "none" else sum_to_scalar(
        row_loss, logp.dtype, denom=stats if reduction == "mean" else None)
    raise_on_bad_targets(op, stats, C, ignore_index, check_targets)
    return loss


def nll_bwd(gy: torch.Tensor, target: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, *,
            weight: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """d loss / d logp, contiguous [N, C, d...] = ``shape``, from gy (0-d, or [N, d...] for 'none')."""
    C = shape[1]
    inner = 1
    for s in shape[2:]:
        inner *= s
    n_rows = target.numel()
    g = torch.empty(shape, dtype=dtype, device=target.device)
    stats = target_stats("nll_loss", target, C, weight=weight, ignore_index=ignore_index, inner=inner,
                         dtype=partial_dtype(dtype))
    if n_rows and C:
        t, st_o, st_i = _target_rows(target)
        per_row = reduction == "none"
        sy_o, sy_i = _target_rows(gy)[1:] if per_row else (0, 0)
        block_c = min(triton.next_power_of_2(C), 1024)
        block_m = max(1, min(TILE_ELEMENTS // block_c, triton.next_power_of_2(n_rows)))
        nll_bwd_kernel[(cdiv(n_rows, block_m), cdiv(C, block_c))](
            gy, t, weight if weight is not None else stats, stats, g, n_rows, C, inner, st_o, st_i, sy_o, sy_i,
            ignore_index, HAS_WEIGHT=weight is not None, MEAN=reduction == "mean", PER_ROW=per_row,
            ACC=compute_dtype(dtype), BLOCK_M=block_m, BLOCK_C=block_c)
    return g
