"""Loss ops: schemas and Triton implementations (kernels in ``ge2.kernels.cross_entropy``/``losses``).

Class-index losses (logits/log-probs [N, C, d...] or [C]; target [N, d...] or 0-d, any int dtype):
``cross_entropy(logits, target, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
check_targets=None) -> loss``
``cross_entropy_fwd_bwd(... same ..., inplace=False) -> (loss, dlogits)``  dlogits for gy = 1, in one
    pass; with ``inplace`` written into the logits buffer (the caller must own it).
``cross_entropy_backward(gy, dlogits) -> dlogits``  dlogits *= gy in place (no pass when gy == 1).
``nll_loss(logp, target, weight=None, *, ignore_index=-100, reduction="mean", check_targets=None) -> loss``
``nll_loss_backward(gy, logp, target, weight=None, *, ignore_index=-100, reduction="mean") -> dlogp``

Elementwise losses (target of x's shape; weight / pos_weight broadcast to it):
``mse_loss(x, target, *, reduction="mean") -> loss``
``mse_loss_backward(gy, x, target, *, reduction="mean", need_x=True, need_target=False) -> (gx, gtarget)``
``binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, *, reduction="mean") -> loss``
``binary_cross_entropy_with_logits_backward(gy, x, target, weight=None, pos_weight=None, *, reduction="mean",
need_x=True, need_target=False) -> (gx, gtarget)``

Losses have the input's dtype: 0-d for "mean"/"sum", the per-element/per-row shape for "none". They
are computed in fp32 for fp32/bf16/fp16 inputs and in fp64 for fp64 inputs (cross_entropy's fp64
rows: up to 16384 classes, longer ones refused; linear_cross_entropy refuses fp64).
Out-of-range class targets raise ValueError: at the call on the CPU or with ``check_targets=True``
(a 4-byte read, a host sync on the GPU); by default on the GPU without a sync, at the next
class-target call or ``check_pending_targets()`` (see ``ge2.kernels.cross_entropy``);
``check_targets=False`` skips the check (bad rows then give NaN).
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.registry import FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, broadcast_shapes, shape_str
from ge2.kernels import cross_entropy as CE
from ge2.kernels import losses as L
from ge2.kernels.losses import sum_to_scalar

REDUCTIONS = L.REDUCTIONS
TARGET_DTYPES = tuple(d for d in INT_DTYPES if d != torch.bool)


def _check_reduction(op: str, reduction) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_class_target(op: str, logits, target, weight=None, *, ignore_index: int = -100,
                        reduction: str = "mean", label_smoothing: float = 0.0, **_flags) -> None:
    if logits.dim() == 0:
        raise ValueError(f"{op}: logits must be [C] or [N, C, d...], got a 0-d tensor")
    want = () if logits.dim() == 1 else (logits.shape[0],) + tuple(logits.shape[2:])
    n_classes = logits.shape[0] if logits.dim() == 1 else logits.shape[1]
    if tuple(target.shape) != want:
        raise ValueError(f"{op}: target has shape {shape_str(target.shape)} but logits {shape_str(logits.shape)} "
                         f"needs target {shape_str(want)} (class indices, the class dim removed)")
    if n_classes == 0:
        raise ValueError(f"{op}: logits {shape_str(logits.shape)} have no classes")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != n_classes):
        raise ValueError(f"{op}: weight must be [{n_classes}] (one per class), got {shape_str(weight.shape)}")
    _check_reduction(op, reduction)
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"{op}: ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(label_smoothing, numbers.Real) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")


def _rows(logits: torch.Tensor, target: torch.Tensor):
    """[C] logits with a 0-d target become one row [1, C] / [1] (views)."""
    return (logits.unsqueeze(0), target.reshape(1)) if logits.dim() == 1 else (logits, target)


_CLASS_INPUTS = (TensorArg("logits", FLOAT_DTYPES), TensorArg("target", TARGET_DTYPES),
                 TensorArg("weight", FLOAT_DTYPES, ndim=(1,), optional=True))

defop("cross_entropy", Schema(_CLASS_INPUTS, _check_class_target))
defop("cross_entropy_fwd_bwd", Schema(_CLASS_INPUTS, _check_class_target))


@register("cross_entropy", "triton")
def cross_entropy(logits, target, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  check_targets=None):
    x, t = _rows(logits, target)
    loss, _ = CE.cross_entropy_fwd_bwd(x, t, weight=weight, ignore_index=ignore_index, reduction=reduction,
                                       label_smoothing=label_smoothing, compute_grad=False,
                                       check_targets=check_targets)
    return loss.reshape(target.shape) if reduction == "none" else loss


@register("cross_entropy_fwd_bwd", "triton")
def cross_entropy_fwd_bwd(logits, target, weight=None, *, ignore_index=-100, reduction="mean",
                          label_smoothing=0.0, check_targets=None, inplace=False):
    x, t = _rows(logits, target)
    loss, grad = CE.cross_entropy_fwd_bwd(x, t, weight=weight, ignore_index=ignore_index, reduction=reduction,
                                          label_smoothing=label_smoothing, compute_grad=True, inplace=inplace,
                                          check_targets=check_targets)
    return (loss.reshape(target.shape) if reduction == "none" else loss), grad.reshape(logits.shape)


def _check_cross_entropy_backward(op: str, gy, dlogits) -> None:
    rows = () if dlogits.dim() == 1 else (dlogits.shape[0],) + tuple(dlogits.shape[2:])
    if gy.dim() != 0 and tuple(gy.shape) != rows:
        raise ValueError(f"{op}: gy must be 0-d (reduced loss) or {shape_str(rows)} (reduction='none'), "
                         f"got {shape_str(gy.shape)} for dlogits {shape_str(dlogits.shape)}")


defop("cross_entropy_backward", Schema((TensorArg("gy", FLOAT_DTYPES), TensorArg("dlogits", FLOAT_DTYPES)),
                                       _check_cross_entropy_backward))


@register("cross_entropy_backward", "triton")
def cross_entropy_backward(gy, dlogits):
    g = dlogits.unsqueeze(0) if dlogits.dim() == 1 else dlogits
    # A [C] row has a 0-d gy whatever the reduction: the scalar path covers it.
    CE.cross_entropy_scale_grad_(g, gy)
    return dlogits


defop("nll_loss", Schema(_CLASS_INPUTS, _check_class_target))


@register("nll_loss", "triton")
def nll_loss(logp, target, weight=None, *, ignore_index=-100, reduction="mean", check_targets=None):
    x, t = _rows(logp, target)
    loss = CE.nll_fwd(x, t, weight=weight, ignore_index=ignore_index, reduction=reduction,
                      check_targets=check_targets)
    return loss.reshape(target.shape) if reduction == "none" else loss


def _check_nll_backward(op: str, gy, logp, target, weight=None, *, ignore_index=-100, reduction="mean") -> None:
    _check_class_target(op, logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    want = tuple(target.shape) if reduction == "none" else ()
    if tuple(gy.shape) != want:
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)}, expected {shape_str(want)} "
                         f"for reduction={reduction!r}")


defop("nll_loss_backward", Schema((TensorArg("gy", FLOAT_DTYPES),) + _CLASS_INPUTS, _check_nll_backward))


@register("nll_loss_backward", "triton")
def nll_loss_backward(gy, logp, target, weight=None, *, ignore_index=-100, reduction="mean"):
    x, t = _rows(logp, target)
    g = CE.nll_bwd(gy.reshape(t.shape) if reduction == "none" else gy, t, tuple(x.shape), logp.dtype,
                   weight=weight, ignore_index=ignore_index, reduction=reduction)
    return g.reshape(logp.shape)


# ---------------------------------------------------------------------------------------------
# elementwise losses
# ---------------------------------------------------------------------------------------------
def _check_pointwise(op: str, x, target, weight=None, pos_weight=None, *, reduction="mean", **_flags) -> None:
    _check_reduction(op, reduction)
    if tuple(target.shape) != tuple(x.shape):
        raise ValueError(f"{op}: target has shape {shape_str(target.shape)} but input has {shape_str(x.shape)} "
                         "(they must match)")
    for name, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is not None:
            out = broadcast_shapes(op, ("input", name), (tuple(x.shape), tuple(t.shape)))
            if out != tuple(x.shape):
                raise ValueError(f"{op}: {name} {shape_str(t.shape)} must broadcast to the input's shape "
                                 f"{shape_str(x.shape)}")


def _check_pointwise_backward(op: str, gy, x, target, weight=None, pos_weight=None, *, reduction="mean",
                              **_flags) -> None:
    _check_pointwise(op, x, target, weight, pos_weight, reduction=reduction)
    want = tuple(x.shape) if reduction == "none" else ()
    if tuple(gy.shape) != want:
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)}, expected {shape_str(want)} "
                         f"for reduction={reduction!r}")


_XT = (TensorArg("input", FLOAT_DTYPES), TensorArg("target", FLOAT_DTYPES))
_WP = (TensorArg("weight", FLOAT_DTYPES, optional=True), TensorArg("pos_weight", FLOAT_DTYPES, optional=True))

defop("mse_loss", Schema(_XT, _check_pointwise))
register("mse_loss", "triton")(
    lambda x, target, *, reduction="mean": L.loss_fwd(L.MSE, x, target, reduction=reduction))
defop("mse_loss_backward", Schema((TensorArg("gy", FLOAT_DTYPES),) + _XT, _check_pointwise_backward))
register("mse_loss_backward", "triton")(
    lambda gy, x, target, *, reduction="mean", need_x=True, need_target=False:
    L.loss_bwd(L.MSE, gy, x, target, reduction=reduction, need_x=need_x, need_target=need_target))

defop("binary_cross_entropy_with_logits", Schema(_XT + _WP, _check_pointwise))
register("binary_cross_entropy_with_logits", "triton")(
    lambda x, target, weight=None, pos_weight=None, *, reduction="mean":
    L.loss_fwd(L.BCE_WITH_LOGITS, x, target, weight=weight, pos_weight=pos_weight, reduction=reduction))
defop("binary_cross_entropy_with_logits_backward",
      Schema((TensorArg("gy", FLOAT_DTYPES),) + _XT + _WP, _check_pointwise_backward))
register("binary_cross_entropy_with_logits_backward", "triton")(
    lambda gy, x, target, weight=None, pos_weight=None, *, reduction="mean", need_x=True, need_target=False:
    L.loss_bwd(L.BCE_WITH_LOGITS, gy, x, target, weight=weight, pos_weight=pos_weight, reduction=reduction,
               need_x=need_x, need_target=need_target))


# ---------------------------------------------------------------------------------------------
# linear + cross-entropy (the LM head), chunked over rows
# ---------------------------------------------------------------------------------------------
LCE_CHUNK_BYTES = 256 * 2**20  # the logits of one chunk of rows; the full N x V never exists


def _check_linear_cross_entropy(op: str, x, weight, bias, target, class_weight=None, *, ignore_index=-100,
                                reduction="mean", label_smoothing=0.0, transposed_weight=False, chunk_rows=None,
                                out_dtype=None, **_flags) -> None:
    H = x.shape[1]
    V, Hw = (weight.shape[1], weight.shape[0]) if transposed_weight else (weight.shape[0], weight.shape[1])
    layout = "[H, V]" if transposed_weight else "[V, H]"
    if Hw != H:
        raise ValueError(f"{op}: x {shape_str(x.shape)} has {H} features but weight {shape_str(weight.shape)} "
                         f"(laid out {layout}) expects {Hw}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"{op}: x, weight and bias must share one dtype, got x {x.dtype}, weight {weight.dtype}"
                        + (f", bias {bias.dtype}" if bias is not None else ""))
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(f"{op}: bias must be [{V}] (one per class), got {shape_str(bias.shape)}")
    if tuple(target.shape) != (x.shape[0],):
        raise ValueError(f"{op}: target must be [{x.shape[0]}] (one class per row of x), got {shape_str(target.shape)}")
    _check_class_target(op, x.new_empty((1, V)).expand(1, V), target[:1], class_weight, ignore_index=ignore_index,
                        reduction=reduction, label_smoothing=label_smoothing)
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"{op}: chunk_rows must be a positive int, got {chunk_rows!r}")
    if out_dtype not in (None, torch.float32):
        raise TypeError(f"{op}: out_dtype must be None (x's dtype) or torch.float32, got {out_dtype}")


def _default_chunk_rows(n: int, row_bytes: int) -> int:
    """About LCE_CHUNK_BYTES of logits per chunk, preferring a size that divides n (no short last chunk)."""
    target = max(128, LCE_CHUNK_BYTES // max(1, row_bytes) // 128 * 128)
    if n <= target:
        return n
    for rows in range(target, target // 2, -128):
        if n % rows == 0:
            return rows
    return target


_LCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LCE_INPUTS = (
    TensorArg("x", _LCE_DTYPES, ndim=(2,)),
    TensorArg("weight", _LCE_DTYPES, ndim=(2,)),
    TensorArg("bias", _LCE_DTYPES, ndim=(1,), optional=True),
    TensorArg("target", TARGET_DTYPES, ndim=(1,)),
    TensorArg("class_weight", FLOAT_DTYPES, ndim=(1,), optional=True),
)
defop("linear_cross_entropy", Schema(_LCE_INPUTS, _check_linear_cross_entropy))


def _lce_chunks(x, weight, bias, target, class_weight, stats, row_loss, *, ignore_index, label_smoothing,
                transposed_weight, chunk_rows, mean, need_x, need_weight, need_bias, gy_rows=None):
    """The chunked pass: row losses into row_loss and, where needed, (dx, dweight, dbias) for gy = 1 (or per-row gy).

    Rows are processed in chunks: logits_c = x_c @ W^T + b (GEMM), the fused CE pass turns them
    into dlogits_c in place (scaled row by row by ``gy_rows`` when given), then dx_c = dlogits_c @ W
    and dW += dlogits_c^T @ x_c (GEMMs), so only one chunk of logits exists at a time. dW
    accumulates in W's dtype (one rounding per chunk).
    """
    from ge2.backend.registry import call
    from ge2.kernels import gemm as G

    N = x.shape[0]
    V = weight.shape[1] if transposed_weight else weight.shape[0]
    need_bias = need_bias and bias is not None
    dx = torch.empty_like(x) if need_x else None
    dw = torch.empty_like(weight) if need_weight else None
    db = torch.empty(V, dtype=torch.float32, device=x.device) if need_bias else None
    any_grad = need_x or need_weight or need_bias
    rows = chunk_rows or _default_chunk_rows(N, V * x.element_size())
    for n0 in range(0, N, rows):
        xc, tc = x[n0:n0 + rows], target[n0:n0 + rows]
        logits, _ = call("gemm", xc, weight, bias=bias, trans_b=not transposed_weight,
                         bias_kind="per_n" if bias is not None else "none")
        CE.cross_entropy_rows(logits, tc, stats, row_loss[n0:n0 + rows], logits if any_grad else None,
                              weight=class_weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
                              mean=mean)
        if any_grad and gy_rows is not None:
            CE.cross_entropy_scale_grad_(logits, gy_rows[n0:n0 + rows])
        if need_x:
            dxc, _ = call("gemm", logits, weight, trans_b=transposed_weight)
            dx[n0:n0 + rows].copy_(dxc)
        if need_weight:
            # dW += dlogits^T @ x_c ([V, H]) or x_c^T @ dlogits ([H, V]). In place (C and Y both dW)
            # only for chunks of the first chunk's size: the GEMM autotuner times its configs by
            # running them, which an aliased C += ... would repeat; the first chunk (beta = 0, no C)
            # has tuned that shape. A last, shorter chunk goes through a fresh output.
            a, b = (xc, logits) if transposed_weight else (logits, xc)
            if n0 == 0:
                G._launch(G._view(a, True), G._view(b, False), dw)
            elif xc.shape[0] == rows:
                G._launch(G._view(a, True), G._view(b, False), dw, c=dw, beta=1.0)
            else:
                dw, _ = call("gemm", a, b, c=dw, trans_a=True, beta=1.0)
        if need_bias:
            CE.column_sums_(logits, db, accumulate=n0 > 0)
    if need_bias and bias.dtype != torch.float32:
        db = db.to(bias.dtype)
    return dx, dw, db


@register("linear_cross_entropy", "triton", dtypes=_LCE_DTYPES)
def linear_cross_entropy(x, weight, bias, target, class_weight=None, *, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, transposed_weight=False, chunk_rows=None, check_targets=None,
                         out_dtype=None, need_x=True, need_weight=True, need_bias=True):
    """(loss, dx, dweight, dbias) of cross_entropy(x @ W^T + b, target, class_weight); grads for gy = 1, None
    where not needed. reduction 'none' gives the row losses [N] and no grads (they need gy: see
    ``linear_cross_entropy_rows_backward``). The loss has ``out_dtype`` (default x's dtype)."""
    V = weight.shape[1] if transposed_weight else weight.shape[0]
    stats = CE.target_stats("linear_cross_entropy", target, V, weight=class_weight, ignore_index=ignore_index,
                            inner=1)
    none = reduction == "none"
    row_loss = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    dx, dw, db = _lce_chunks(x, weight, bias, target, class_weight, stats, row_loss, ignore_index=ignore_index,
                             label_smoothing=label_smoothing, transposed_weight=transposed_weight,
                             chunk_rows=chunk_rows, mean=reduction == "mean", need_x=need_x and not none,
                             need_weight=need_weight and not none, need_bias=need_bias and not none)
    out_dtype = out_dtype or x.dtype
    if none:
        loss = row_loss if out_dtype == torch.float32 else row_loss.to(out_dtype)
    else:
        loss = sum_to_scalar(row_loss, out_dtype, denom=stats if reduction == "mean" else None)
    CE.raise_on_bad_targets("linear_cross_entropy", stats, V, ignore_index, check_targets)
    return loss, dx, dw, db


def _check_lce_rows_backward(op: str, gy, x, weight, bias, target, class_weight=None, **attrs) -> None:
    _check_linear_cross_entropy(op, x, weight, bias, target, class_weight, **attrs)
    if tuple(gy.shape) != (x.shape[0],):
        raise ValueError(f"{op}: gy must be [{x.shape[0]}] (one per row, reduction='none'), got {shape_str(gy.shape)}")


defop("linear_cross_entropy_rows_backward",
      Schema((TensorArg("gy", FLOAT_DTYPES, ndim=(1,)),) + _LCE_INPUTS, _check_lce_rows_backward))


@register("linear_cross_entropy_rows_backward", "triton", dtypes=_LCE_DTYPES)
def linear_cross_entropy_rows_backward(gy, x, weight, bias, target, class_weight=None, *, ignore_index=-100,
                                       label_smoothing=0.0, transposed_weight=False, chunk_rows=None,
                                       need_x=True, need_weight=True, need_bias=True, **_attrs):
    """(dx, dweight, dbias) of reduction='none' for per-row gy [N]: the chunked pass again, each chunk's
    dlogits scaled by its rows' gy before the gradient GEMMs."""
    V = weight.shape[1] if transposed_weight else weight.shape[0]
    stats = CE.target_stats("linear_cross_entropy", target, V, weight=class_weight, ignore_index=ignore_index,
                            inner=1)
    row_loss = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return _lce_chunks(x, weight, bias, target, class_weight, stats, row_loss, ignore_index=ignore_index,
                       label_smoothing=label_smoothing, transposed_weight=transposed_weight, chunk_rows=chunk_rows,
                       mean=False, need_x=need_x, need_weight=need_weight, need_bias=need_bias, gy_rows=gy)


def _check_lce_backward(op: str, gy, *grads) -> None:
    if gy.numel() != 1:
        raise ValueError(f"{op}: gy must have one element (the reduced loss's gradient), got {shape_str(gy.shape)}")


# (dx, dweight, dbias) *= gy in place, gy read on the device (no pass at all when gy == 1).
defop("linear_cross_entropy_backward", Schema((
    TensorArg("gy", FLOAT_DTYPES), TensorArg("dx", FLOAT_DTYPES, optional=True),
    TensorArg("dweight", FLOAT_DTYPES, optional=True), TensorArg("dbias", FLOAT_DTYPES, optional=True),
), _check_lce_backward))


@register("linear_cross_entropy_backward", "triton")
def linear_cross_entropy_backward(gy, dx=None, dweight=None, dbias=None):
    return tuple(L.scale_by_device_scalar_(g, gy) if g is not None else None for g in (dx, dweight, dbias))
