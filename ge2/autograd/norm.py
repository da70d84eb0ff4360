"""LayerNorm, RMSNorm and BatchNorm with gradients (ops in ``ge2.backend.norm``)."""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor

call = backend.call


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps):
        y, mean, rstd = call("layer_norm", x, weight, bias, normalized_shape=normalized_shape, eps=eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.normalized_shape = normalized_shape
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, dw, db = call("layer_norm_backward", gy, x, weight, mean, rstd, normalized_shape=ctx.normalized_shape,
                          need_x=need[0], need_weight=need[1], need_bias=need[2])
        return gx, dw, db, None, None


class AddLayerNorm(Function):
    """s = x + residual and y = layer_norm(s) in out_dtype from one pass over the rows (the residual stream of a
    pre-LN transformer: the add that ends one branch and the norm that starts the next)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, normalized_shape, eps, out_dtype):
        s, y, mean, rstd = call("add_layer_norm", x, residual, weight, bias, normalized_shape=normalized_shape,
                                eps=eps, out_dtype=out_dtype)
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.normalized_shape = normalized_shape
        ctx.residual_dtype = residual.dtype if residual is not None else None
        return (s, y) if residual is not None else y  # without a residual s is x: only y is new

    @staticmethod
    def backward(ctx, *grads):
        gs, gy = grads if len(grads) == 2 else (None, grads[0])
        s, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        if gy is None:  # only s was used: the add's gradient
            return gs if need[0] else None, gs if need[1] else None, None, None, None, None, None
        # one pass: the norm's gradient (gy read in its own dtype, bf16 from the next GEMM), plus gs, written
        # in s's dtype for x and, when the residual branch is lower precision, in its dtype too
        g, g_res, dw, db = call("add_layer_norm_backward", gs, gy, s, weight, mean, rstd,
                                normalized_shape=ctx.normalized_shape, residual_dtype=ctx.residual_dtype,
                                need_weight=need[2], need_bias=need[3])
        return (g if need[0] else None, (g if g_res is None else g_res) if need[1] else None,
                dw if need[2] else None, db if need[3] else None, None, None, None)


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        y, rstd = call("rms_norm", x, weight, normalized_shape=normalized_shape, eps=eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.normalized_shape = normalized_shape
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, dw = call("rms_norm_backward", gy, x, weight, rstd, normalized_shape=ctx.normalized_shape,
                      need_x=need[0], need_weight=need[1])
        return gx, dw, None, None


class BatchNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps):
        y, mean, rstd = call("batch_norm", x, weight, bias, running_mean, running_var, num_batches_tracked,
                             training=training, momentum=momentum, eps=eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.training = training
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, dw, db = call("batch_norm_backward", gy, x, weight, mean, rstd, training=ctx.training, need_x=need[0])
        return gx, (dw if need[1] else None), (db if need[2] else None), None, None, None, None, None, None


def _shape(normalized_shape) -> tuple[int, ...]:
    return (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise the last dims (``normalized_shape``) of x [..., *normalized_shape] to mean 0, variance 1."""
    if _amp_state.on:
        x, weight, bias = _amp.cast_fp32(x, weight, bias)
    return LayerNorm.apply(x, weight, bias, _shape(normalized_shape), eps)


def add_layer_norm(x: Tensor, residual: Tensor | None, normalized_shape, weight: Tensor | None = None,
                   bias: Tensor | None = None, eps: float = 1e-5,
                   out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(s, layer_norm(s)) with s = x + residual [..., *normalized_shape] (s is x when residual is None), in one pass.

    ``out_dtype``: the norm's output dtype (default: what ``layer_norm(s)`` gives, float32 under autocast);
    a pre-LN block passes the autocast dtype so the GEMM that reads it needs no cast. Rounding the fp32
    result once, it equals ``layer_norm(s).to(out_dtype)``.
    """
    if _amp_state.on:  # torch's rules: the add runs in the inputs' dtypes, the norm in fp32 (weights too)
        weight, bias = _amp.cast_fp32(weight, bias)
        if out_dtype is None and _amp.is_autocast_enabled(x.device.type):
            out_dtype = torch.float32
    if residual is None:
        return x, AddLayerNorm.apply(x, None, weight, bias, _shape(normalized_shape), eps, out_dtype)
    s, y = AddLayerNorm.apply(x, residual, weight, bias, _shape(normalized_shape), eps, out_dtype)
    return s, y


def rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dims; eps=None means the dtype's machine epsilon."""
    import torch

    if _amp_state.on:  # on torch's fp32 list since torch 2.12
        x, weight = _amp.cast_fp32(x, weight)

    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return RMSNorm.apply(x, weight, _shape(normalized_shape), eps)


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
               num_batches_tracked: Tensor | None = None) -> Tensor:
    """Per-channel normalisation of x [N, C, ...]; training updates the running statistics in place."""
    y = BatchNorm.apply(x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps)
    if training:
        for t in (running_mean, running_var, num_batches_tracked):
            if t is not None:
                t._version_counter.value += 1
    return y
