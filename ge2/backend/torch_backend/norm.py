"""torch reference implementations of the normalisation ops (fp32 math, fp64 for fp64 x, like the kernels)."""
from __future__ import annotations

import math

import torch

from ge2.backend.registry import register


def _acc(x) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rows(x, normalized_shape):
    n = math.prod(tuple(normalized_shape) if not isinstance(normalized_shape, int) else (normalized_shape,))
    return x.reshape(-1, n).to(_acc(x)), n


def _affine(t, n, acc):
    return t.reshape(n).to(acc) if t is not None else None


@register("layer_norm", "torch")
def layer_norm(x, weight=None, bias=None, *, normalized_shape, eps=1e-5):
    x2, n = _rows(x, normalized_shape)
    mean = x2.mean(1)
    rstd = torch.rsqrt(((x2 - mean[:, None]) ** 2).mean(1) + eps)
    y = (x2 - mean[:, None]) * rstd[:, None]
    if weight is not None:
        y = y * _affine(weight, n, x2.dtype)
    if bias is not None:
        y = y + _affine(bias, n, x2.dtype)
    return y.to(x.dtype).reshape(x.shape), mean, rstd


@register("add_layer_norm", "torch")
def add_layer_norm(x, residual=None, weight=None, bias=None, *, normalized_shape, eps=1e-5, out_dtype=None):
    s = x if residual is None else x + residual
    y, mean, rstd = layer_norm(s, weight, bias, normalized_shape=normalized_shape, eps=eps)
    return s, y.to(out_dtype or s.dtype), mean, rstd


def _row_norm_backward(gy, x, weight, mean, rstd, normalized_shape, rms, need_x, need_weight, need_bias):
    x2, n = _rows(x, normalized_shape)
    g2 = gy.reshape(-1, n).to(x2.dtype)
    xhat = (x2 - mean[:, None]) * rstd[:, None]
    g = g2 * _affine(weight, n, x2.dtype) if weight is not None else g2
    gx = None
    if need_x:
        mean_g = 0.0 if rms else g.mean(1, keepdim=True)
        gx = (rstd[:, None] * (g - mean_g - xhat * (g * xhat).mean(1, keepdim=True))).to(x.dtype).reshape(x.shape)
    shape = weight.shape if weight is not None else tuple(x.shape[x.dim() - len(tuple(normalized_shape)):])
    dtype = weight.dtype if weight is not None else x.dtype
    dw = (g2 * xhat).sum(0).to(dtype).reshape(shape) if need_weight and weight is not None else None
    db = g2.sum(0).to(dtype).reshape(shape) if need_bias else None
    return gx, dw, db


@register("layer_norm_backward", "torch")
def layer_norm_backward(gy, x, weight, mean, rstd, *, normalized_shape, need_x=True, need_weight=True, need_bias=True):
    return _row_norm_backward(gy, x, weight, mean, rstd, normalized_shape, False, need_x, need_weight, need_bias)


@register("add_layer_norm_backward", "torch")
def add_layer_norm_backward(gs, gy, s, weight, mean, rstd, *, normalized_shape, residual_dtype=None, need_weight=True,
                            need_bias=True):
    g, dw, db = _row_norm_backward(gy, s, weight, mean, rstd, normalized_shape, False, True, need_weight, need_bias)
    g = g + gs if gs is not None else g
    return g, (g.to(residual_dtype) if residual_dtype not in (None, s.dtype) else None), dw, db


@register("rms_norm", "torch")
def rms_norm(x, weight=None, *, normalized_shape, eps):
    x2, n = _rows(x, normalized_shape)
    rstd = torch.rsqrt((x2 * x2).mean(1) + eps)
    y = x2 * rstd[:, None]
    if weight is not None:
        y = y * _affine(weight, n, x2.dtype)
    return y.to(x.dtype).reshape(x.shape), rstd


@register("rms_norm_backward", "torch")
def rms_norm_backward(gy, x, weight, rstd, *, normalized_shape, need_x=True, need_weight=True):
    gx, dw, _ = _row_norm_backward(gy, x, weight, torch.zeros_like(rstd), rstd, normalized_shape, True, need_x,
                                   need_weight, False)
    return gx, dw


def _channels(x):
    return x.reshape(x.shape[0], x.shape[1], -1).to(_acc(x)).transpose(0, 1).reshape(x.shape[1], -1)


@register("batch_norm", "torch")
def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, num_batches_tracked=None, *,
               training, momentum=0.1, eps=1e-5):
    xc = _channels(x)
    if training:
        mean = xc.mean(1)
        var = ((xc - mean[:, None]) ** 2).mean(1)
        if running_mean is not None:
            L = xc.shape[1]
            running_mean.copy_((1 - momentum) * running_mean.to(_acc(x)) + momentum * mean)
            running_var.copy_((1 - momentum) * running_var.to(_acc(x)) + momentum * var * L / max(L - 1, 1))
            if num_batches_tracked is not None:
                num_batches_tracked.add_(1)
    else:
        mean, var = running_mean.to(_acc(x)).clone(), running_var.to(_acc(x)).clone()
    rstd = torch.rsqrt(var + eps)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    y = (x.to(_acc(x)) - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        y = y * weight.to(_acc(x)).reshape(shape)
    if bias is not None:
        y = y + bias.to(_acc(x)).reshape(shape)
    return y.to(x.dtype), mean, rstd


@register("batch_norm_backward", "torch")
def batch_norm_backward(gy, x, weight, mean, rstd, *, training, need_x=True):
    shape = (1, -1) + (1,) * (x.dim() - 2)
    xhat = (x.to(_acc(x)) - mean.reshape(shape)) * rstd.reshape(shape)
    g = gy.to(_acc(x))
    dims = [0] + list(range(2, x.dim()))
    db = g.sum(dims)
    dw = (g * xhat).sum(dims)
    gx = None
    if need_x:
        L = x.numel() // x.shape[1]
        scale = rstd.reshape(shape) * (weight.to(_acc(x)).reshape(shape) if weight is not None else 1.0)
        if training:
            gx = scale * (g - db.reshape(shape) / L - xhat * dw.reshape(shape) / L)
        else:
            gx = scale * g
        gx = gx.to(x.dtype)
    return gx, dw, db
