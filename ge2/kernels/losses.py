"""Elementwise losses (mse, binary cross-entropy with logits) and the reductions every loss shares.

    mse:      l = (x - t)^2
    bce:      l = w * [(1 - t) * x + (1 + (pw - 1) * t) * softplus(-x)]      (torch's stable form)

Inputs are read through strides (up to 4 dims; ``weight``/``pos_weight`` broadcast by zero
strides), so nothing is expanded in memory. A reduced loss is summed in two deterministic steps:
one partial per program, then ``sum_to_scalar``. Math is fp32 for fp32/bf16/fp16 inputs and fp64
for fp64 inputs (``compute_dtype``: a constexpr, so the fp32 kernels are unchanged). Gradients come from ``loss_bwd`` with
``gy`` read on the device (a 0-d tensor for mean/sum), so backward never syncs with the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.softmax import compute_dtype
from ge2.runtime import cdiv

MSE, BCE_WITH_LOGITS = 0, 1
REDUCTIONS = ("none", "mean", "sum")
ELEMENTWISE_BLOCK = 1024
SUM_BLOCK = 1024


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of per-row / per-program partial losses for inputs of ``dtype`` (the compute dtype)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# shared reductions
# ---------------------------------------------------------------------------------------------
@triton.jit
def sum_to_scalar_kernel(src_ptr, n, out_ptr, denom_ptr, count, HAS_DENOM: tl.constexpr, HAS_COUNT: tl.constexpr,
                         ACC: tl.constexpr, BLOCK: tl.constexpr):
    """out[0] = sum(src[:n]) / denom[0] (or / count): one program, a fixed order, so the loss is deterministic."""
    acc = tl.zeros([BLOCK], ACC)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0.0).to(ACC)
    total = tl.sum(acc, 0)
    if HAS_DENOM:
        # A zero denominator (every target ignored) gives 0/0 = NaN, like torch.
        total = total / tl.load(denom_ptr).to(ACC)
    if HAS_COUNT:
        # a mean over count elements: 0/0 = NaN for an empty input, like torch
        total = total / count
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


def sum_to_scalar(src: torch.Tensor, out_dtype: torch.dtype, *, count: int | None = None,
                  denom: torch.Tensor | None = None) -> torch.Tensor:
    """0-d tensor: sum(src) / denom[0] or / count (src contiguous; denom a 1-element device tensor or None).

    Summed in fp64 when src or out_dtype is fp64, else in fp32.
    """
    out = torch.empty((), dtype=out_dtype, device=src.device)
    acc = tl.float64 if torch.float64 in (src.dtype, out_dtype) else tl.float32
    sum_to_scalar_kernel[(1,)](src, src.numel(), out, denom if denom is not None else src, count or 0,
                               HAS_DENOM=denom is not None, HAS_COUNT=count is not None, ACC=acc, BLOCK=SUM_BLOCK)
    return out


@triton.jit
def scale_by_device_scalar_kernel(t_ptr, n, g_ptr, BLOCK: tl.constexpr):
    """t *= g[0], skipped (no memory traffic) when g[0] == 1, the usual seed of loss.backward()."""
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        v = tl.load(t_ptr + offs, mask=ok).to(tl.float32)
        tl.store(t_ptr + offs, (v * g).to(t_ptr.dtype.element_ty), mask=ok)


def scale_by_device_scalar_(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """In place: t *= g (g a 1-element device tensor), without reading g on the host; t contiguous."""
    if t.numel():
        scale_by_device_scalar_kernel[(cdiv(t.numel(), ELEMENTWISE_BLOCK),)](
            t, t.numel(), g, BLOCK=ELEMENTWISE_BLOCK)
    return t


# ---------------------------------------------------------------------------------------------
# elementwise losses
# ---------------------------------------------------------------------------------------------
@triton.jit
def _index4(k, d1, d2, d3):
    i3 = k % d3
    k = k // d3
    i2 = k % d2
    k = k // d2
    i1 = k % d1
    return k // d1, i1, i2, i3


@triton.jit
def _softplus(x):
    # log(1 + exp(x)) without overflow: max(x, 0) + log(1 + exp(-|x|)).
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def loss_fwd_kernel(
    x_ptr, t_ptr, w_ptr, pw_ptr, out_ptr, numel, d1, d2, d3,
    sx0, sx1, sx2, sx3, st0, st1, st2, st3, sw0, sw1, sw2, sw3, sp0, sp1, sp2, sp3,
    KIND: tl.constexpr, HAS_W: tl.constexpr, HAS_PW: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The elementwise loss: out[k] (REDUCE=False) or one partial sum (in ACC) per program (REDUCE=True)."""
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = k < numel
    i0, i1, i2, i3 = _index4(k, d1, d2, d3)
    x = tl.load(x_ptr + i0 * sx0 + i1 * sx1 + i2 * sx2 + i3 * sx3, mask=ok, other=0.0).to(ACC)
    t = tl.load(t_ptr + i0 * st0 + i1 * st1 + i2 * st2 + i3 * st3, mask=ok, other=0.0).to(ACC)
    if KIND == 0:
        d = x - t
        loss = d * d
    else:
        if HAS_PW:
            pw = tl.load(pw_ptr + i0 * sp0 + i1 * sp1 + i2 * sp2 + i3 * sp3, mask=ok, other=1.0).to(ACC)
            loss = (1.0 - t) * x + (1.0 + (pw - 1.0) * t) * _softplus(-x)
        else:
            loss = (1.0 - t) * x + _softplus(-x)
        if HAS_W:
            loss *= tl.load(w_ptr + i0 * sw0 + i1 * sw1 + i2 * sw2 + i3 * sw3, mask=ok, other=0.0).to(ACC)
    if REDUCE:
        tl.store(out_ptr + tl.program_id(0), tl.sum(tl.where(ok, loss, 0.0), 0))
    else:
        tl.store(out_ptr + k, loss.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def loss_bwd_kernel(
    gy_ptr, x_ptr, t_ptr, w_ptr, pw_ptr, gx_ptr, gt_ptr, numel, d1, d2, d3, gy_div,
    sg0, sg1, sg2, sg3, sx0, sx1, sx2, sx3, st0, st1, st2, st3, sw0, sw1, sw2, sw3, sp0, sp1, sp2, sp3,
    KIND: tl.constexpr, HAS_W: tl.constexpr, HAS_PW: tl.constexpr, REDUCED: tl.constexpr,
    NEED_X: tl.constexpr, NEED_T: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
):
    """gx = gy * dl/dx and gt = gy * dl/dt (contiguous); gy is a scalar (REDUCED, divided by gy_div) or strided."""
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = k < numel
    i0, i1, i2, i3 = _index4(k, d1, d2, d3)
    x = tl.load(x_ptr + i0 * sx0 + i1 * sx1 + i2 * sx2 + i3 * sx3, mask=ok, other=0.0).to(ACC)
    t = tl.load(t_ptr + i0 * st0 + i1 * st1 + i2 * st2 + i3 * st3, mask=ok, other=0.0).to(ACC)
    if REDUCED:
        g = tl.load(gy_ptr).to(ACC) / gy_div
    else:
        g = tl.load(gy_ptr + i0 * sg0 + i1 * sg1 + i2 * sg2 + i3 * sg3, mask=ok, other=0.0).to(ACC)
    if KIND == 0:
        dx = 2.0 * (x - t)
        dt = -dx
    else:
        if HAS_PW:
            pw = tl.load(pw_ptr + i0 * sp0 + i1 * sp1 + i2 * sp2 + i3 * sp3, mask=ok, other=1.0).to(ACC)
        else:
            pw = 1.0
        # d/dx = sigmoid(x) * (1 - t + pw * t) - pw * t;  d/dt = (pw - 1) * softplus(-x) - x
        sig = tl.where(x >= 0, 1.0 / (1.0 + tl.exp(-x)), tl.exp(x) / (1.0 + tl.exp(x)))
        dx = sig * (1.0 - t + pw * t) - pw * t
        dt = (pw - 1.0) * _softplus(-x) - x
        if HAS_W:
            w = tl.load(w_ptr + i0 * sw0 + i1 * sw1 + i2 * sw2 + i3 * sw3, mask=ok, other=0.0).to(ACC)
            dx *= w
            dt *= w
    if NEED_X:
        tl.store(gx_ptr + k, (g * dx).to(gx_ptr.dtype.element_ty), mask=ok)
    if NEED_T:
        tl.store(gt_ptr + k, (g * dt).to(gt_ptr.dtype.element_ty), mask=ok)


def _strides4(t: torch.Tensor | None, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Strides of ``t`` broadcast to ``shape`` (<= 4 dims), padded in front to 4 (0 for absent/broadcast dims)."""
    if t is None:
        return (0, 0, 0, 0)
    st = t.expand(shape).stride() if shape else ()
    return (0,) * (4 - len(shape)) + tuple(st)


def _as_4d(shape: tuple[int, ...], *tensors: torch.Tensor | None):
    """(shape padded to 4 dims, tensors) — tensors of more than 4 dims become flat contiguous copies."""
    if len(shape) <= 4:
        return (1,) * (4 - len(shape)) + tuple(shape), shape, tensors
    flat = tuple(None if t is None else t.expand(shape).contiguous().reshape(-1) for t in tensors)
    numel = flat[0].numel()
    return (1, 1, 1, numel), (numel,), flat


def loss_fwd(kind: int, x: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None,
             pos_weight: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """The loss of x [any shape] against target [x's shape]: [x's shape] for 'none', else a 0-d tensor (x's dtype)."""
    shape4, view, (x4, t4, w4, p4) = _as_4d(tuple(x.shape), x, target, weight, pos_weight)
    numel = x.numel()
    grid = (max(1, cdiv(numel, ELEMENTWISE_BLOCK)),)
    reduce = reduction != "none"
    out = (torch.empty(grid[0], dtype=partial_dtype(x.dtype), device=x.device) if reduce
           else torch.empty(x.shape, dtype=x.dtype, device=x.device))
    loss_fwd_kernel[grid](
        x4, t4, w4 if w4 is not None else x4, p4 if p4 is not None else x4, out, numel, *shape4[1:],
        *_strides4(x4, view), *_strides4(t4, view), *_strides4(w4, view), *_strides4(p4, view),
        KIND=kind, HAS_W=w4 is not None, HAS_PW=p4 is not None, REDUCE=reduce, ACC=compute_dtype(x.dtype),
        BLOCK=ELEMENTWISE_BLOCK)
    if not reduce:
        return out
    return sum_to_scalar(out, x.dtype, count=numel if reduction == "mean" else None)


def loss_bwd(kind: int, gy: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *,
             weight: torch.Tensor | None = None, pos_weight: torch.Tensor | None = None,
             reduction: str = "mean", need_x: bool = True, need_target: bool = False):
    """(gx | None, gtarget | None), each contiguous in x's / target's shape and dtype."""
    shape4, view, (x4, t4, w4, p4, g4) = _as_4d(
        tuple(x.shape), x, target, weight, pos_weight, gy if reduction == "none" else None)
    numel = x.numel()
    gx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_x else None
    gt = torch.empty(target.shape, dtype=target.dtype, device=x.device) if need_target else None
    if numel and (need_x or need_target):
        gy_div = numel if reduction == "mean" else 1
        loss_bwd_kernel[(cdiv(numel, ELEMENTWISE_BLOCK),)](
            g4 if g4 is not None else gy, x4, t4, w4 if w4 is not None else x4, p4 if p4 is not None else x4,
            gx if gx is not None else x4, gt if gt is not None else x4, numel, *shape4[1:], gy_div,
            *_strides4(g4, view), *_strides4(x4, view), *_strides4(t4, view), *_strides4(w4, view),
            *_strides4(p4, view), KIND=kind, HAS_W=w4 is not None, HAS_PW=p4 is not None,
            REDUCED=reduction != "none", NEED_X=need_x, NEED_T=need_target, ACC=compute_dtype(x.dtype),
            BLOCK=ELEMENTWISE_BLOCK)
    return gx, gt
