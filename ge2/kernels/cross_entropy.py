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
Rows up to ``MAX_FUSED_C`` classes are held in registers; longer rows take an online two-sweep path
(running max and sum, then the gradient sweep).

Targets are checked by ``target_stats_kernel``, a small pass over the targets that also computes
D and sum(w): an out-of-range target gives that row NaN loss and gradient (never an out-of-bounds
read) and counts in ``stats[2]``; the launcher reads that count (a 4-byte copy, the one host sync)
and raises, unless ``check_targets=False`` or a CUDA graph is being captured.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.losses import sum_to_scalar
from ge2.kernels.softmax import num_warps_configs, prune_by_elements_per_thread, row_offsets, row_view
from ge2.runtime import autotune

MAX_FUSED_C = 32768  # longest class row kept in registers
# The online path's (programs per SM, BLOCK_C, num_warps); bench/bench_softmax_ce.py sweeps it.
# Measured on H100 at 4096 x 128256 (bench_softmax_ce.json, ce_online_sweep): (1, 16384, 32) was best in
# both dtypes, by 1-9%; no config got sweep 2 out of L2 (all ran at ~3 passes over DRAM).
ONLINE_CONFIG = (1, 16384, 32)
TILE_ELEMENTS = 2048
STATS_BLOCK = 1024


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def target_stats_kernel(
    t_ptr, w_ptr, stats_ptr, n_rows, inner, st_o, st_i, C, ignore_index,
    HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
):
    """stats = [sum of w[t] over non-ignored rows, sum(w), number of out-of-range targets] (fp32, one program)."""
    denom = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        live = rows < n_rows
        t = tl.load(t_ptr + row_offsets(rows, inner, st_o, st_i), mask=live, other=ignore_index).to(tl.int64)
        valid = live & (t != ignore_index)
        in_range = (t >= 0) & (t < C)
        if HAS_WEIGHT:
            denom += tl.load(w_ptr + t, mask=valid & in_range, other=0.0).to(tl.float32)
        else:
            denom += tl.where(valid & in_range, 1.0, 0.0)
        bad += tl.where(valid & ~in_range, 1.0, 0.0)
    w_sum = tl.zeros([BLOCK], tl.float32)
    if HAS_WEIGHT:
        for start in range(0, C, BLOCK):
            c = start + tl.arange(0, BLOCK)
            w_sum += tl.load(w_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    tl.store(stats_ptr, tl.sum(denom, 0))
    tl.store(stats_ptr + 1, tl.sum(w_sum, 0) if HAS_WEIGHT else C * 1.0)
    tl.store(stats_ptr + 2, tl.sum(bad, 0))


@triton.jit
def _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT: tl.constexpr):
    """(t, valid, bad, w[t]) for each row; w[t] = 0 for ignored or bad rows."""
    live = rows < n_rows
    t = tl.load(t_ptr + row_offsets(rows, inner, st_o, st_i), mask=live, other=ignore_index).to(tl.int64)
    valid = live & (t != ignore_index)
    bad = valid & ((t < 0) | (t >= C))
    use = valid & ~bad
    if HAS_WEIGHT:
        w_t = tl.load(w_ptr + t, mask=use, other=0.0).to(tl.float32)
    else:
        w_t = tl.where(use, 1.0, 0.0)
    return t, valid, bad, w_t


@autotune(num_warps_configs(), key=["BLOCK_M", "BLOCK_C", "HAS_WEIGHT", "SMOOTH", "COMPUTE_GRAD", "RECOMPUTE_EXP"],
          default=0,
          prune_configs_by={"early_config_prune": prune_by_elements_per_thread}, restore_value=["x_ptr"])
@triton.jit
def cross_entropy_fwd_bwd_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    RECOMPUTE_EXP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """BLOCK_M rows in registers: the row loss (unnormalised) and dx for gy = 1 (may overwrite x).

    RECOMPUTE_EXP: recompute exp(x - max) for the gradient from the loaded row instead of keeping
    the exponentials live across the row reductions: one array of registers instead of two at
    32K classes (exp is cheap next to the memory traffic).
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    x_in = tl.load(x_ptr + row_offsets(rows, inner, sx_o, sx_i)[:, None] + cols[None, :] * sx_c,
                   mask=ok, other=float("-inf"))
    x = x_in.to(tl.float32)
    row_max = tl.max(x, 1)
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    e = tl.exp(x - row_max[:, None])
    row_sum = tl.sum(e, 1)
    lse = row_max + tl.log(row_sum)
    is_t = cols[None, :] == t[:, None]
    x_t = tl.sum(tl.where(is_t, x, 0.0), 1)
    loss = (1.0 - label_smoothing) * w_t * (lse - x_t)
    if SMOOTH:
        w_sum = tl.load(stats_ptr + 1)
        if HAS_WEIGHT:
            w_row = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        else:
            w_row = tl.where(col_ok, 1.0, 0.0)[None, :]
        w_x = tl.sum(tl.where(ok, w_row * x, 0.0), 1)
        loss += (label_smoothing / C) * (w_sum * lse - w_x)
    # Ignored rows are 0 even when their logits are NaN (w[t] = 0 times NaN would not be).
    loss = tl.where(valid, loss, 0.0)
    loss = tl.where(bad, float("nan"), loss)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=rows < n_rows)
    if COMPUTE_GRAD:
        inv_d = 1.0
        if MEAN:
            inv_d = 1.0 / tl.load(stats_ptr)
        a = (1.0 - label_smoothing) * w_t * inv_d
        if RECOMPUTE_EXP:
            p = tl.exp(x_in.to(tl.float32) - row_max[:, None]) * (1.0 / row_sum)[:, None]
        else:
            p = e / row_sum[:, None]
        g = a[:, None] * (p - tl.where(cols[None, :] == t[:, None], 1.0, 0.0))
        if SMOOTH:
            b = (label_smoothing / C) * inv_d
            g += b * (w_sum * p - w_row)
        # Ignored rows get exactly 0 (not 0 * NaN for a row of NaN logits); bad targets get NaN.
        g = tl.where(valid[:, None], g, 0.0)
        g = tl.where(bad[:, None], float("nan"), g)
        g_off = row_offsets(rows, inner, sg_o, sg_i)[:, None] + cols[None, :] * sg_c
        tl.store(g_ptr + g_off, g.to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def cross_entropy_fwd_bwd_online_kernel(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Long rows, a persistent grid: per row, sweep 1 keeps running (max, sum) per lane, sweep 2 writes dx.

    Few programs, one row each at a time, keep the rows in flight few enough that sweep 2 can
    find its row still in L2 (bf16 rows of 128K classes: ~130 rows x 250 KB < the 50 MB L2).
    """
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _cross_entropy_online_row(x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, row, n_rows, C, inner,
                                  sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
                                  HAS_WEIGHT, SMOOTH, MEAN, COMPUTE_GRAD, BLOCK_C)


@triton.jit
def _cross_entropy_online_row(
    x_ptr, t_ptr, w_ptr, stats_ptr, loss_ptr, g_ptr, row, n_rows, C, inner,
    sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, label_smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    t, valid, bad, w_t = _row_target(t_ptr, row, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    x_base = row_offsets(row, inner, sx_o, sx_i)
    g_base = row_offsets(row, inner, sg_o, sg_i)
    cols = tl.arange(0, BLOCK_C)
    lane_max = tl.full([BLOCK_C], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK_C], tl.float32)
    lane_wx = tl.zeros([BLOCK_C], tl.float32)
    for start in range(0, C, BLOCK_C):
        c = start + cols
        ok = c < C
        x = tl.load(x_ptr + x_base + c * sx_c, mask=ok, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(x - shift)
        lane_max = new_max
        if SMOOTH:
            if HAS_WEIGHT:
                lane_wx += tl.where(ok, tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32) * x, 0.0)
            else:
                lane_wx += tl.where(ok, x, 0.0)
    row_max = tl.max(lane_max, 0)
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(lane_sum * tl.exp(lane_max - row_max), 0)
    lse = row_max + tl.log(row_sum)
    use = valid & ~bad
    x_t = tl.load(x_ptr + x_base + tl.where(use, t, 0) * sx_c, mask=use, other=0.0).to(tl.float32)
    loss = (1.0 - label_smoothing) * w_t * (lse - x_t)
    w_sum = tl.load(stats_ptr + 1)
    if SMOOTH:
        loss += (label_smoothing / C) * (w_sum * lse - tl.sum(lane_wx, 0))
    loss = tl.where(valid, loss, 0.0)
    loss = tl.where(bad, float("nan"), loss)
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    if COMPUTE_GRAD:
        inv_d = 1.0
        if MEAN:
            inv_d = 1.0 / tl.load(stats_ptr)
        a = (1.0 - label_smoothing) * w_t * inv_d
        b = (label_smoothing / C) * inv_d
        for start in range(0, C, BLOCK_C):
            c = start + cols
            ok = c < C
            x = tl.load(x_ptr + x_base + c * sx_c, mask=ok, other=float("-inf")).to(tl.float32)
            p = tl.exp(x - row_max) / row_sum
            g = a * (p - tl.where(c == t, 1.0, 0.0))
            if SMOOTH:
                if HAS_WEIGHT:
                    w_c = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
                else:
                    w_c = 1.0
                g += b * (w_sum * p - w_c)
            g = tl.where(valid, g, 0.0)
            g = tl.where(bad, float("nan"), g)
            tl.store(g_ptr + g_base + c * sg_c, g.to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def scale_rows_kernel(g_ptr, gy_ptr, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i,
                      PER_ROW: tl.constexpr, BLOCK_C: tl.constexpr):
    """g[row, :] *= gy[row] (PER_ROW) or gy[0], skipped when that factor is exactly 1."""
    row = tl.program_id(0)
    if PER_ROW:
        f = tl.load(gy_ptr + row_offsets(row, inner, sy_o, sy_i)).to(tl.float32)
    else:
        f = tl.load(gy_ptr).to(tl.float32)
    if f != 1.0:
        base = row_offsets(row, inner, sg_o, sg_i)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        ok = c < C
        v = tl.load(g_ptr + base + c * sg_c, mask=ok).to(tl.float32)
        tl.store(g_ptr + base + c * sg_c, (v * f).to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def nll_fwd_kernel(
    x_ptr, t_ptr, w_ptr, loss_ptr, n_rows, C, inner, sx_o, sx_i, sx_c, st_o, st_i, ignore_index,
    HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
):
    """loss[row] = -w[t] * x[row, t] (0 for ignored rows, NaN for out-of-range targets)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    use = valid & ~bad
    x_t = tl.load(x_ptr + row_offsets(rows, inner, sx_o, sx_i) + tl.where(use, t, 0) * sx_c,
                  mask=use, other=0.0).to(tl.float32)
    loss = tl.where(bad, float("nan"), -w_t * x_t)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=rows < n_rows)


@triton.jit
def nll_bwd_kernel(
    gy_ptr, t_ptr, w_ptr, stats_ptr, g_ptr, n_rows, C, inner, st_o, st_i, sy_o, sy_i, ignore_index,
    HAS_WEIGHT: tl.constexpr, MEAN: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """g[row, c] = -(c == t) * w[t] * gy / D, written whole (zeros included) into a contiguous [N, C, d...]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = rows < n_rows
    t, valid, bad, w_t = _row_target(t_ptr, rows, n_rows, inner, st_o, st_i, C, ignore_index, w_ptr, HAS_WEIGHT)
    if PER_ROW:
        f = tl.load(gy_ptr + row_offsets(rows, inner, sy_o, sy_i), mask=live, other=0.0).to(tl.float32)
    else:
        f = tl.load(gy_ptr).to(tl.float32)
    if MEAN:
        f = f / tl.load(stats_ptr)
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
                 ignore_index: int, inner: int) -> torch.Tensor:
    """Device fp32 [3]: (sum of w[t] over non-ignored rows, sum(w), number of out-of-range targets)."""
    stats = torch.empty(3, dtype=torch.float32, device=target.device)
    t, st_o, st_i = _target_rows(target)
    target_stats_kernel[(1,)](t, weight if weight is not None else stats, stats, target.numel(), inner,
                              st_o, st_i, n_classes, ignore_index, HAS_WEIGHT=weight is not None, BLOCK=STATS_BLOCK)
    return stats


def raise_on_bad_targets(op: str, stats: torch.Tensor, n_classes: int, ignore_index: int,
                         check: bool | None) -> None:
    """Read the out-of-range count (a host sync) and raise; skipped when check is False or while capturing."""
    if check is False:
        return
    if stats.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    n_bad = int(stats[2].item())
    if n_bad:
        raise ValueError(
            f"{op}: {n_bad} target value(s) out of range: class targets must be in [0, {n_classes}) "
            f"or equal ignore_index={ignore_index}")


def _class_rows(logits: torch.Tensor):
    """logits [N, C, d...] as rows -> (logits or a copy, rows, C, inner, (s_outer, s_inner, s_class))."""
    x, (outer, c, inner), strides = row_view(logits, 1)
    return x, outer * inner, c, inner, strides


def cross_entropy_rows(
    x: torch.Tensor, target: torch.Tensor, stats: torch.Tensor, row_loss: torch.Tensor, grad: torch.Tensor | None, *,
    weight: torch.Tensor | None = None, ignore_index: int = -100, label_smoothing: float = 0.0, mean: bool = True,
    max_fused_c: int = MAX_FUSED_C, online_config: tuple[int, int, int] | None = None, recompute_exp: bool = True,
) -> None:
    """The fused pass: row losses (unnormalised) into ``row_loss`` and, if ``grad`` is given, dx for gy = 1.

    x [N, C, d...] (any strides), target [N, d...], stats from ``target_stats`` (the mean's D may
    come from more rows than these: linear_cross_entropy passes the whole batch's); ``grad`` may be x.
    """
    _, n_rows, C, inner, (sx_o, sx_i, sx_c) = _class_rows(x)
    if not n_rows:
        return
    t, st_o, st_i = _target_rows(target)
    g = grad if grad is not None else x
    sg_o, sg_i, sg_c = row_view(g, 1)[2] if grad is not None else (0, 0, 0)
    args = (x, t, weight if weight is not None else stats, stats, row_loss, g, n_rows, C, inner,
            sx_o, sx_i, sx_c, st_o, st_i, sg_o, sg_i, sg_c, ignore_index, float(label_smoothing))
    meta = dict(HAS_WEIGHT=weight is not None, SMOOTH=label_smoothing > 0, MEAN=mean, COMPUTE_GRAD=grad is not None)
    if C <= max_fused_c:
        block_c = triton.next_power_of_2(C)
        block_m = min(max(1, TILE_ELEMENTS // block_c), triton.next_power_of_2(n_rows))
        cross_entropy_fwd_bwd_kernel[(triton.cdiv(n_rows, block_m),)](*args, **meta, RECOMPUTE_EXP=recompute_exp,
                                                                      BLOCK_M=block_m, BLOCK_C=block_c)
    else:
        programs_per_sm, block_c, num_warps = online_config or ONLINE_CONFIG
        grid = min(n_rows, _num_sms(x.device) * programs_per_sm) if x.is_cuda else n_rows
        cross_entropy_fwd_bwd_online_kernel[(grid,)](*args, **meta, BLOCK_C=min(block_c, max_fused_c),
                                                     num_warps=num_warps)


def _num_sms(device: torch.device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_SMS: dict[torch.device, int] = {}


def cross_entropy_fwd_bwd(
    logits: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", label_smoothing: float = 0.0, compute_grad: bool = True, inplace: bool = False,
    check_targets: bool | None = None, max_fused_c: int = MAX_FUSED_C,
    online_config: tuple[int, int, int] | None = None, recompute_exp: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, dlogits for gy = 1): loss 0-d ('mean'/'sum') or [N, d...] ('none') in logits' dtype.

    logits [N, C, d...] (C = logits.shape[1]), target [N, d...] integer. With ``inplace`` the
    gradient overwrites ``logits`` (returned as dlogits; the caller must own that buffer).
    """
    x, n_rows, C, inner, _ = _class_rows(logits)
    stats = target_stats("cross_entropy", target, C, weight=weight, ignore_index=ignore_index, inner=inner)
    row_loss = (torch.empty(target.shape, dtype=logits.dtype, device=logits.device) if reduction == "none"
                else torch.empty(n_rows, dtype=torch.float32, device=logits.device))
    grad = None
    if compute_grad:
        # In place only into the caller's own buffer (not into a contiguous copy row_view made).
        grad = x if inplace and x.data_ptr() == logits.data_ptr() else torch.empty_like(x)
    cross_entropy_rows(x, target, stats, row_loss, grad, weight=weight, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, mean=reduction == "mean", max_fused_c=max_fused_c,
                       online_config=online_config, recompute_exp=recompute_exp)
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
    column_sums_kernel[(triton.cdiv(N, block_n),)](g, out, M, N, g.stride(0), g.stride(1), ACCUMULATE=accumulate,
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
    scale_rows_kernel[(n_rows, triton.cdiv(C, block_c))](grad, gy, n_rows, C, inner, sg_o, sg_i, sg_c, sy_o, sy_i,
                                                        PER_ROW=per_row, BLOCK_C=block_c)
    return grad


def nll_fwd(logp: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None,
            ignore_index: int = -100, reduction: str = "mean", check_targets: bool | None = None) -> torch.Tensor:
    """nll loss of log-probabilities logp [N, C, d...] at targets [N, d...]: 0-d or [N, d...] (logp's dtype)."""
    op = "nll_loss"
    x, n_rows, C, inner, (sx_o, sx_i, sx_c) = _class_rows(logp)
    stats = target_stats(op, target, C, weight=weight, ignore_index=ignore_index, inner=inner)
    row_loss = (torch.empty(target.shape, dtype=logp.dtype, device=logp.device) if reduction == "none"
                else torch.empty(n_rows, dtype=torch.float32, device=logp.device))
    if n_rows:
        t, st_o, st_i = _target_rows(target)
        nll_fwd_kernel[(triton.cdiv(n_rows, STATS_BLOCK),)](
            x, t, weight if weight is not None else stats, row_loss, n_rows, C, inner, sx_o, sx_i, sx_c,
            st_o, st_i, ignore_index, HAS_WEIGHT=weight is not None, BLOCK=STATS_BLOCK)
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
    stats = target_stats("nll_loss", target, C, weight=weight, ignore_index=ignore_index, inner=inner)
    if n_rows and C:
        t, st_o, st_i = _target_rows(target)
        per_row = reduction == "none"
        sy_o, sy_i = _target_rows(gy)[1:] if per_row else (0, 0)
        block_c = min(triton.next_power_of_2(C), 1024)
        block_m = max(1, min(TILE_ELEMENTS // block_c, triton.next_power_of_2(n_rows)))
        nll_bwd_kernel[(triton.cdiv(n_rows, block_m), triton.cdiv(C, block_c))](
            gy, t, weight if weight is not None else stats, stats, g, n_rows, C, inner, st_o, st_i, sy_o, sy_i,
            ignore_index, HAS_WEIGHT=weight is not None, MEAN=reduction == "mean", PER_ROW=per_row,
            BLOCK_M=block_m, BLOCK_C=block_c)
    return g
