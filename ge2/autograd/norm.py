"""LayerNorm, RMSNorm and BatchNorm with gradients (ops in ``ge2.backend.norm``)."""
from __future__ import annotations

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
