"""Softmax and the losses with gradients: each Function's forward and backward side by side.

The cross-entropies produce their gradient in the forward pass (one fused pass over the logits,
for gy = 1); backward only scales it by gy, on the device, skipping the pass when gy == 1.

**The in-place rule.** ``cross_entropy(..., inplace_backward=True)`` writes dlogits into the
logits buffer during forward, so no N x C gradient is allocated. It is an explicit opt-in, allowed
only for logits that are a non-leaf owning its buffer (the output of an earlier op, and not a
view of a leaf: the buffer belongs to the graph, never to the user's data or a parameter). After the call the logits tensor holds the
gradient, not the logits: the caller must not read it again. The write bumps the logits' version
counter, so an op that saved those logits for its own backward (e.g. log_softmax, tanh) raises
"modified by an in-place operation" at backward instead of computing with the wrong values.
Backward through a fused cross-entropy can run once (its gradient buffer is consumed).
"""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd.function import Function
from ge2.autograd.math import sum_to_shape
from ge2.autograd.tensor import Tensor

call = backend.call


# ---------------------------------------------------------------------------------------------
# softmax / log_softmax
# ---------------------------------------------------------------------------------------------
class Softmax(Function):
    """y = softmax(scale * x + mask) along dim (log_softmax when ``log``); backward from y."""

    @staticmethod
    def forward(ctx, x, mask, dim, scale, log):
        name = "log_softmax" if log else "softmax"
        y = call(name, x, mask, dim=dim, scale=scale)
        ctx.save_for_backward(y)
        ctx.name, ctx.dim, ctx.scale = name, dim, scale
        ctx.mask_shape = tuple(mask.shape) if mask is not None else None
        return y

    @staticmethod
    def backward(ctx, gy):
        (y,) = ctx.saved_tensors
        need_x, need_mask = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx = call(ctx.name + "_backward", gy, y, dim=ctx.dim, scale=ctx.scale) if need_x else None
        gmask = None
        if need_mask:
            # d/dmask is d/dz of z = scale * x + mask: the same backward without the scale.
            gz = gx if ctx.scale == 1.0 and gx is not None else call(ctx.name + "_backward", gy, y, dim=ctx.dim)
            gmask = sum_to_shape(gz, ctx.mask_shape)
        return gx, gmask, None, None, None


def _softmax_input(op: str, x: Tensor, mask: Tensor | None, dtype: torch.dtype | None):
    """(x, mask) as the kernels take them: cast to ``dtype`` first when given (torch's ``dtype=``), else fp32
    under autocast."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{op}: dtype must be a floating torch.dtype, got {dtype!r}")
        return x.to(dtype), mask
    if _amp_state.on:
        return _amp.cast_fp32(x, mask)
    return x, mask


def softmax(x: Tensor, dim: int = -1, *, scale: float = 1.0, mask: Tensor | None = None,
            dtype: torch.dtype | None = None) -> Tensor:
    """softmax(scale * x + mask) along ``dim``; mask additive, broadcastable to x. All -inf rows give 0.
    ``dtype``: x is cast to it first (torch's argument), and the result has it."""
    x, mask = _softmax_input("softmax", x, mask, dtype)
    return Softmax.apply(x, mask, dim, scale, False)


def log_softmax(x: Tensor, dim: int = -1, *, scale: float = 1.0, mask: Tensor | None = None,
                dtype: torch.dtype | None = None) -> Tensor:
    """log_softmax(scale * x + mask) along ``dim``. All -inf rows give -inf. ``dtype`` as softmax's."""
    x, mask = _softmax_input("log_softmax", x, mask, dtype)
    return Softmax.apply(x, mask, dim, scale, True)


# ---------------------------------------------------------------------------------------------
# cross-entropy: fused forward + backward
# ---------------------------------------------------------------------------------------------
class CrossEntropy(Function):
    """loss = cross_entropy(logits, target); dlogits computed in forward (in place when allowed)."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing, inplace, check_targets):
        attrs = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                     check_targets=check_targets)
        ctx.dlogits = None
        if not ctx.needs_input_grad[0]:
            return call("cross_entropy", logits, target, weight, **attrs)
        loss, ctx.dlogits = call("cross_entropy_fwd_bwd", logits, target, weight, inplace=inplace, **attrs)
        return loss

    @staticmethod
    def backward(ctx, gy):
        if ctx.dlogits is None:
            raise RuntimeError("cross_entropy: backward ran a second time; the fused cross-entropy's gradient "
                               "buffer is consumed by the first backward")
        dlogits, ctx.dlogits = ctx.dlogits, None
        return call("cross_entropy_backward", gy, dlogits), None, None, None, None, None, None, None


def _is_view_of_a_leaf(t: Tensor) -> bool:
    """Whether t shares its memory with a leaf of its graph (views share their base's version counter)."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for edge in node.edges:
            if edge is None:
                continue
            src = edge[0]
            if isinstance(src, Tensor):
                if src._version_counter is t._version_counter:
                    return True
            else:
                stack.append(src)
    return False


def _soft_cross_entropy(logits: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                        label_smoothing: float) -> Tensor:
    """Cross-entropy against class probabilities (target of the logits' shape), as torch defines it:
    loss_row = -sum_c w[c] * t'[c] * log_softmax(x)[c], t' = (1 - eps) t + eps / C; 'mean' divides by
    the number of rows (not by the weights). Composed of ge2 ops, so autograd gives the gradient."""
    op = "cross_entropy"
    if target.dtype != logits.dtype:
        raise TypeError(f"{op}: class-probability target has dtype {target.dtype} but logits have {logits.dtype} "
                        "(they must match)")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{op}: reduction must be one of ('none', 'mean', 'sum'), got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    class_dim = 0 if logits.ndim == 1 else 1
    C = logits.shape[class_dim]
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != C):
        raise ValueError(f"{op}: weight must be [{C}] (one per class), got {list(weight.shape)}")
    if label_smoothing > 0:
        target = target * (1.0 - label_smoothing) + label_smoothing / C
    prod = log_softmax(logits, class_dim) * target
    if weight is not None:
        prod = prod * weight.reshape(C, *([1] * (logits.ndim - class_dim - 1)))
    rows = -prod.sum(class_dim)
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else rows.mean()


def cross_entropy(logits: Tensor, target: Tensor, weight: Tensor | None = None, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, inplace_backward: bool = False,
                  check_targets: bool | None = None) -> Tensor:
    """Cross-entropy of logits [N, C, d...] (or [C]) and class targets [N, d...] (torch semantics), or class
    probabilities of the logits' shape (a float target; ``ignore_index`` does not apply to them).

    ``inplace_backward=True``: dlogits overwrite the logits buffer (see the module's in-place rule).
    ``check_targets``: out-of-range targets raise ValueError. None (default): on the GPU without a host
    sync, by this or a later class-target call once a pinned copy of the count lands (on the CPU at
    once); True: at this call (a 4-byte host read); False: never (bad rows give NaN).
    """
    soft = isinstance(target, Tensor) and target.dtype.is_floating_point
    if _amp_state.on:
        logits, weight = _amp.cast_fp32(logits, weight)
        if soft:
            (target,) = _amp.cast_fp32(target)
    if soft:
        if isinstance(logits, Tensor) and tuple(target.shape) != tuple(logits.shape):
            raise ValueError(f"cross_entropy: a float (class-probability) target must have the logits' shape "
                             f"{list(logits.shape)}, got {list(target.shape)}")
        if inplace_backward:
            raise ValueError("cross_entropy: inplace_backward=True needs class-index targets, not probabilities")
        return _soft_cross_entropy(logits, target, weight, reduction, label_smoothing)
    if inplace_backward and logits.requires_grad and logits.is_leaf:
        raise ValueError("cross_entropy: inplace_backward=True needs logits produced by an earlier op (a "
                         "non-leaf); these logits are a leaf tensor, whose buffer belongs to the caller")
    if inplace_backward and logits.requires_grad and _is_view_of_a_leaf(logits):
        raise ValueError("cross_entropy: inplace_backward=True needs logits that own their buffer; these are a "
                         "view of a leaf tensor, whose values would be overwritten")
    inplace = inplace_backward and logits.requires_grad
    loss = CrossEntropy.apply(logits, target, weight, ignore_index, reduction, label_smoothing, inplace,
                              check_targets)
    if inplace:
        logits._version_counter.value += 1  # the buffer now holds dlogits: saved copies must not be used
    return loss


class NllLoss(Function):
    @staticmethod
    def forward(ctx, logp, target, weight, ignore_index, reduction, check_targets):
        ctx.save_for_backward(logp, target, weight)
        ctx.ignore_index, ctx.reduction = ignore_index, reduction
        return call("nll_loss", logp, target, weight, ignore_index=ignore_index, reduction=reduction,
                    check_targets=check_targets)

    @staticmethod
    def backward(ctx, gy):
        logp, target, weight = ctx.saved_tensors
        g = call("nll_loss_backward", gy, logp, target, weight, ignore_index=ctx.ignore_index, reduction=ctx.reduction)
        return g, None, None, None, None, None


def nll_loss(logp: Tensor, target: Tensor, weight: Tensor | None = None, *, ignore_index: int = -100,
             reduction: str = "mean", check_targets: bool | None = None) -> Tensor:
    """Negative log-likelihood of log-probabilities [N, C, d...] (or [C]) at class targets [N, d...]."""
    if _amp_state.on:
        logp, weight = _amp.cast_fp32(logp, weight)
    return NllLoss.apply(logp, target, weight, ignore_index, reduction, check_targets)


# ---------------------------------------------------------------------------------------------
# elementwise losses
# ---------------------------------------------------------------------------------------------
class MseLoss(Function):
    @staticmethod
    def forward(ctx, x, target, reduction):
        ctx.save_for_backward(x, target)
        ctx.reduction = reduction
        return call("mse_loss", x, target, reduction=reduction)

    @staticmethod
    def backward(ctx, gy):
        x, target = ctx.saved_tensors
        gx, gt = call("mse_loss_backward", gy, x, target, reduction=ctx.reduction,
                      need_x=ctx.needs_input_grad[0], need_target=ctx.needs_input_grad[1])
        return gx, gt, None


def mse_loss(x: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
    """(x - target)^2, reduced; x and target of one shape."""
    if _amp_state.on:
        x, target = _amp.cast_fp32(x, target)
    return MseLoss.apply(x, target, reduction)


class BinaryCrossEntropyWithLogits(Function):
    @staticmethod
    def forward(ctx, x, target, weight, pos_weight, reduction):
        ctx.save_for_backward(x, target, weight, pos_weight)
        ctx.reduction = reduction
        return call("binary_cross_entropy_with_logits", x, target, weight, pos_weight, reduction=reduction)

    @staticmethod
    def backward(ctx, gy):
        x, target, weight, pos_weight = ctx.saved_tensors
        gx, gt = call("binary_cross_entropy_with_logits_backward", gy, x, target, weight, pos_weight,
                      reduction=ctx.reduction, need_x=ctx.needs_input_grad[0], need_target=ctx.needs_input_grad[1])
        return gx, gt, None, None, None


def binary_cross_entropy_with_logits(x: Tensor, target: Tensor, weight: Tensor | None = None, *,
                                     pos_weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """-w [pos_weight * t * log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], reduced; weight/pos_weight broadcast."""
    if _amp_state.on:
        x, target, weight, pos_weight = _amp.cast_fp32(x, target, weight, pos_weight)
    for name, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is not None and t.requires_grad:
            raise ValueError(f"binary_cross_entropy_with_logits: no gradient for {name}; pass it detached")
    return BinaryCrossEntropyWithLogits.apply(x, target, weight, pos_weight, reduction)


# ---------------------------------------------------------------------------------------------
# linear + cross-entropy (LM head)
# ---------------------------------------------------------------------------------------------
class LinearCrossEntropy(Function):
    """loss = cross_entropy(x @ W^T + b, target) in row chunks; for a reduced loss dx, dW, db are computed
    in forward; for reduction='none' backward runs the chunked pass again with the per-row gy."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, class_weight, attrs):
        need = ctx.needs_input_grad
        ctx.attrs, ctx.grads = attrs, None
        loss, *grads = call("linear_cross_entropy", x, weight, bias, target, class_weight, **attrs,
                            need_x=need[0], need_weight=need[1], need_bias=need[2])
        if attrs["reduction"] == "none":
            ctx.save_for_backward(x, weight, bias, target, class_weight)
        else:
            ctx.grads = grads
        return loss

    @staticmethod
    def backward(ctx, gy):
        need = ctx.needs_input_grad
        if ctx.attrs["reduction"] == "none":
            x, weight, bias, target, class_weight = ctx.saved_tensors
            attrs = {k: v for k, v in ctx.attrs.items() if k not in ("reduction", "check_targets", "out_dtype")}
            grads = call("linear_cross_entropy_rows_backward", gy, x, weight, bias, target, class_weight, **attrs,
                         need_x=need[0], need_weight=need[1], need_bias=need[2])
            return (*grads, None, None, None)
        if ctx.grads is None:
            raise RuntimeError("linear_cross_entropy: backward ran a second time; its gradients are consumed "
                               "by the first backward")
        grads, ctx.grads = ctx.grads, None
        scaled = call("linear_cross_entropy_backward", gy, *grads)
        return (*scaled, None, None, None)


def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         weight: Tensor | None = None, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, transposed_weight: bool = False, chunk_rows: int | None = None,
                         check_targets: bool | None = None) -> Tensor:
    """cross_entropy(input @ linear_weight^T + linear_bias, target, weight) without materialising the N x V logits
    (torch.nn.functional.linear_cross_entropy's signature; ``weight`` holds the class weights).

    input [N, H] or [H]; linear_weight [V, H] ([H, V] with ``transposed_weight``); target [N] (0-d for a
    1-D input) class indices; reduction 'mean' | 'sum' | 'none' ([N], or 0-d for a 1-D input).
    ``chunk_rows``: rows per chunk of logits (default ~256 MB of them); ``check_targets`` as cross_entropy's.
    Under ``ge2.autocast`` the matmul runs in the low dtype and the loss comes out fp32, as torch's does.
    """
    out_dtype = None
    if _amp_state.on:  # a matmul inside: its operands take the low dtype, as linear's do; the loss is fp32
        input, linear_weight, linear_bias = _amp.cast_low(input, linear_weight, linear_bias)
        (weight,) = _amp.cast_fp32(weight)
        out_dtype = torch.float32
    one_row = isinstance(input, Tensor) and input.ndim == 1
    if one_row:
        if not isinstance(target, Tensor) or target.ndim != 0:
            got = list(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(f"linear_cross_entropy: a 1-D input [{input.shape[0]}] needs a 0-d target, got {got}")
        input, target = input.reshape(1, input.shape[0]), target.reshape(1)
    attrs = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                 transposed_weight=transposed_weight, chunk_rows=chunk_rows, check_targets=check_targets,
                 out_dtype=out_dtype)
    loss = LinearCrossEntropy.apply(input, linear_weight, linear_bias, target, weight, attrs)
    return loss.reshape(()) if one_row and reduction == "none" else loss


Tensor.softmax = lambda self, dim, dtype=None: softmax(self, dim, dtype=dtype)
Tensor.log_softmax = lambda self, dim, dtype=None: log_softmax(self, dim, dtype=dtype)
