"""Normalisation ops: schemas and Triton implementations (kernels in ``ge2.kernels.norm``).

``layer_norm(x, weight=None, bias=None, *, normalized_shape, eps=1e-5) -> (y, mean, rstd)``
``add_layer_norm(x, residual=None, weight=None, bias=None, *, normalized_shape, eps=1e-5, out_dtype=None)
-> (s, y, mean, rstd)``: s = x + residual (x itself without one), y = layer_norm(s) in out_dtype (default s's)
``layer_norm_backward(gy, x, weight, mean, rstd, *, normalized_shape, need_x=True, need_weight=True,
need_bias=True) -> (gx, dweight, dbias)``
``add_layer_norm_backward(gs, gy, s, weight, mean, rstd, *, normalized_shape, residual_dtype=None, need_weight=True,
need_bias=True) -> (g, g_residual, dweight, dbias)``: g = gs + layer_norm's gx (the gradient of x and of the
residual); g_residual is g in residual_dtype when that differs from s's dtype, else None
``rms_norm(x, weight=None, *, normalized_shape, eps) -> (y, rstd)``
``rms_norm_backward(gy, x, weight, rstd, *, normalized_shape, need_x=True, need_weight=True) -> (gx, dweight)``

    x [..., *normalized_shape] (any strides); weight/bias of normalized_shape; mean/rstd one per row
    (the leading dims flattened), fp32 (fp64 for fp64 x: fp64 in, fp64 math). Gradients not needed are None.

``batch_norm(x, weight, bias, running_mean, running_var, num_batches_tracked, *, training, momentum=0.1,
eps=1e-5) -> (y, mean, rstd)``
``batch_norm_backward(gy, x, weight, mean, rstd, *, training, need_x=True) -> (gx, dweight, dbias)``

    x [N, C, *spatial]; weight/bias/running stats [C] (each optional). Training: batch statistics,
    and running_mean/running_var/num_batches_tracked updated in place (unbiased running variance);
    eval: the running statistics. mean/rstd [C] and dweight/dbias [C] fp32 (fp64 for fp64 x, whose
    statistics, running statistics included, are computed in fp64).
"""
from __future__ import annotations

import math
import numbers

import torch

from ge2.backend.registry import FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, dtype_name, shape_str
from ge2.kernels import norm as K

STAT = (torch.float32, torch.float64)  # saved statistics: fp32, fp64 for fp64 x


def _numel(shape) -> int:
    return math.prod(shape)


def _check_normalized(op: str, x, normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    shape = tuple(normalized_shape)
    if not shape or tuple(x.shape[x.dim() - len(shape):]) != shape or x.dim() < len(shape):
        raise ValueError(f"{op}: normalized_shape {shape_str(shape)} must be the last dims of x, got x "
                         f"{shape_str(x.shape)}")
    return shape


def _check_param(op: str, name: str, t, shape, x) -> None:
    if t is None:
        return
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} has shape {shape_str(t.shape)}, expected {shape_str(shape)}")
    if t.dtype != x.dtype and t.dtype != torch.float32:
        raise TypeError(f"{op}: {name} has dtype {dtype_name(t.dtype)}; expected x's {dtype_name(x.dtype)} or float32")


def _check_eps(op: str, eps) -> None:
    if not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"{op}: eps must be a non-negative number, got {eps!r}")


def _check_layer_norm(op, x, weight=None, bias=None, *, normalized_shape, eps=1e-5) -> None:
    shape = _check_normalized(op, x, normalized_shape)
    _check_param(op, "weight", weight, shape, x)
    _check_param(op, "bias", bias, shape, x)
    _check_eps(op, eps)


def _check_row_stats(op, x, shape, *stats) -> None:
    rows = x.numel() // max(_numel(shape), 1)
    for name, s in stats:
        if s.numel() != rows:
            raise ValueError(f"{op}: {name} has {s.numel()} elements, expected one per row ({rows})")


def _check_layer_norm_backward(op, gy, x, weight, mean, rstd, *, normalized_shape, need_x=True, need_weight=True,
                               need_bias=True) -> None:
    shape = _check_normalized(op, x, normalized_shape)
    if tuple(gy.shape) != tuple(x.shape):
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but x has {shape_str(x.shape)}")
    _check_param(op, "weight", weight, shape, x)
    _check_row_stats(op, x, shape, ("mean", mean), ("rstd", rstd))


X = TensorArg("x", FLOAT_DTYPES)
W = TensorArg("weight", FLOAT_DTYPES, optional=True)
B = TensorArg("bias", FLOAT_DTYPES, optional=True)

defop("layer_norm", Schema((X, W, B), _check_layer_norm))


@register("layer_norm", "triton")
def layer_norm(x, weight=None, bias=None, *, normalized_shape, eps=1e-5):
    n = _numel(_check_normalized("layer_norm", x, normalized_shape))
    return K.row_norm_fwd(x, n, weight, bias, eps, rms=False)[:3]


def _check_add_layer_norm(op, x, residual=None, weight=None, bias=None, *, normalized_shape, eps=1e-5,
                          out_dtype=None) -> None:
    _check_layer_norm(op, x, weight, bias, normalized_shape=normalized_shape, eps=eps)
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"{op}: residual has shape {shape_str(residual.shape)} but x has {shape_str(x.shape)} "
                         f"(the fused add does not broadcast)")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: out_dtype must be a float dtype, got {out_dtype}")


defop("add_layer_norm", Schema((X, TensorArg("residual", FLOAT_DTYPES, optional=True), W, B), _check_add_layer_norm))


@register("add_layer_norm", "triton")
def add_layer_norm(x, residual=None, weight=None, bias=None, *, normalized_shape, eps=1e-5, out_dtype=None):
    n = _numel(_check_normalized("add_layer_norm", x, normalized_shape))
    y, mean, rstd, s = K.row_norm_fwd(x, n, weight, bias, eps, rms=False, out_dtype=out_dtype, residual=residual)
    return s, y, mean, rstd


defop("layer_norm_backward", Schema((TensorArg("gy", FLOAT_DTYPES), X, W, TensorArg("mean", STAT),
                                     TensorArg("rstd", STAT)), _check_layer_norm_backward))


@register("layer_norm_backward", "triton")
def layer_norm_backward(gy, x, weight, mean, rstd, *, normalized_shape, need_x=True, need_weight=True,
                        need_bias=True):
    n = _numel(_check_normalized("layer_norm_backward", x, normalized_shape))
    return K.row_norm_bwd(gy, x, n, weight, mean, rstd, rms=False, need_x=need_x,
                          need_weight=need_weight and weight is not None, need_bias=need_bias)[:3]


def _check_add_layer_norm_backward(op, gs, gy, s, weight, mean, rstd, *, normalized_shape, residual_dtype=None,
                                   need_weight=True, need_bias=True) -> None:
    _check_layer_norm_backward(op, gy, s, weight, mean, rstd, normalized_shape=normalized_shape)
    if gs is not None and tuple(gs.shape) != tuple(s.shape):
        raise ValueError(f"{op}: gs has shape {shape_str(gs.shape)} but s has {shape_str(s.shape)}")


defop("add_layer_norm_backward", Schema((TensorArg("gs", FLOAT_DTYPES, optional=True), TensorArg("gy", FLOAT_DTYPES),
                                         TensorArg("s", FLOAT_DTYPES), W, TensorArg("mean", STAT),
                                         TensorArg("rstd", STAT)), _check_add_layer_norm_backward))


@register("add_layer_norm_backward", "triton")
def add_layer_norm_backward(gs, gy, s, weight, mean, rstd, *, normalized_shape, residual_dtype=None,
                            need_weight=True, need_bias=True):
    n = _numel(_check_normalized("add_layer_norm_backward", s, normalized_shape))
    low = residual_dtype if residual_dtype not in (None, s.dtype) else None
    g, dw, db, g_low = K.row_norm_bwd(gy, s, n, weight, mean, rstd, rms=False, need_x=True,
                                      need_weight=need_weight and weight is not None, need_bias=need_bias, gs=gs,
                                      low_dtype=low)
    return g, g_low, dw, db


def _check_rms_norm(op, x, weight=None, *, normalized_shape, eps) -> None:
    shape = _check_normalized(op, x, normalized_shape)
    _check_param(op, "weight", weight, shape, x)
    _check_eps(op, eps)


defop("rms_norm", Schema((X, W), _check_rms_norm))


@register("rms_norm", "triton")
def rms_norm(x, weight=None, *, normalized_shape, eps):
    n = _numel(_check_normalized("rms_norm", x, normalized_shape))
    y, _, rstd, _ = K.row_norm_fwd(x, n, weight, None, eps, rms=True)
    return y, rstd


def _check_rms_norm_backward(op, gy, x, weight, rstd, *, normalized_shape, need_x=True, need_weight=True) -> None:
    shape = _check_normalized(op, x, normalized_shape)
    if tuple(gy.shape) != tuple(x.shape):
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but x has {shape_str(x.shape)}")
    _check_param(op, "weight", weight, shape, x)
    _check_row_stats(op, x, shape, ("rstd", rstd))


defop("rms_norm_backward", Schema((TensorArg("gy", FLOAT_DTYPES), X, W, TensorArg("rstd", STAT)),
                                  _check_rms_norm_backward))


@register("rms_norm_backward", "triton")
def rms_norm_backward(gy, x, weight, rstd, *, normalized_shape, need_x=True, need_weight=True):
    n = _numel(_check_normalized("rms_norm_backward", x, normalized_shape))
    mean = torch.zeros_like(rstd)  # rms_norm does not centre: the kernel's mean is 0
    gx, dw, _, _ = K.row_norm_bwd(gy, x, n, weight, mean, rstd, rms=True, need_x=need_x,
                               need_weight=need_weight and weight is not None, need_bias=False)
    return gx, dw


def _check_batch_norm(op, x, weight=None, bias=None, running_mean=None, running_var=None, num_batches_tracked=None,
                      *, training, momentum=0.1, eps=1e-5) -> None:
    if x.dim() < 2:
        raise ValueError(f"{op}: x must be [N, C, ...], got shape {shape_str(x.shape)}")
    C = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        _check_param(op, name, t, (C,), x)
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: pass both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError(f"{op}: eval mode needs running_mean and running_var")
    if training and x.numel() // max(C, 1) <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got x {shape_str(x.shape)}")
    if not isinstance(momentum, numbers.Real) or not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{op}: momentum must be a number in [0, 1], got {momentum!r}")
    _check_eps(op, eps)


defop("batch_norm", Schema((X, W, B, TensorArg("running_mean", FLOAT_DTYPES, optional=True),
                            TensorArg("running_var", FLOAT_DTYPES, optional=True),
                            TensorArg("num_batches_tracked", (torch.int64,), optional=True)), _check_batch_norm))
register("batch_norm", "triton")(
    lambda x, weight=None, bias=None, running_mean=None, running_var=None, num_batches_tracked=None, *, training,
    momentum=0.1, eps=1e-5: K.batch_norm_fwd(x, weight, bias, running_mean, running_var, num_batches_tracked,
                                             training=training, momentum=momentum, eps=eps))


def _check_batch_norm_backward(op, gy, x, weight, mean, rstd, *, training, need_x=True) -> None:
    if tuple(gy.shape) != tuple(x.shape):
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but x has {shape_str(x.shape)}")
    for name, s in (("mean", mean), ("rstd", rstd)):
        if s.numel() != x.shape[1]:
            raise ValueError(f"{op}: {name} has {s.numel()} elements, expected one per channel ({x.shape[1]})")


defop("batch_norm_backward", Schema((TensorArg("gy", FLOAT_DTYPES), X, W, TensorArg("mean", STAT),
                                     TensorArg("rstd", STAT)), _check_batch_norm_backward))
register("batch_norm_backward", "triton")(
    lambda gy, x, weight, mean, rstd, *, training, need_x=True:
    K.batch_norm_bwd(gy, x, weight, mean, rstd, training=training, need_x=need_x))
