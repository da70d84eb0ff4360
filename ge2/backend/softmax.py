"""Softmax ops: schemas and Triton implementations (kernels in ``ge2.kernels.softmax``).

``softmax(x, mask=None, *, dim=-1, scale=1.0) -> y``           y = softmax(scale * x + mask) along dim
``log_softmax(x, mask=None, *, dim=-1, scale=1.0) -> y``       y = log_softmax(scale * x + mask)
``softmax_backward(gy, y, *, dim=-1, scale=1.0) -> gx``        from the forward output y
``log_softmax_backward(gy, y, *, dim=-1, scale=1.0) -> gx``

x: any shape, fp32/bf16/fp16/fp64 (fp32 math; fp64 math for fp64 x), any strides. mask:
additive, any float dtype, broadcastable to x's shape ([M, N], [1, N], [M, 1] of a 2-D x). y has
x's shape and dtype, contiguous. A row that is all -inf gives softmax 0 / log_softmax -inf.
"""
from __future__ import annotations

import math
import numbers

from ge2.backend.registry import FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, broadcast_shapes, normalize_dims, shape_str
from ge2.kernels import softmax as K


def _dim(op: str, dim, ndim: int) -> int:
    (d,) = normalize_dims(op, dim, ndim)
    return d if ndim else 0


def _check_scale(op: str, scale) -> None:
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite number, got {scale!r}")


def _check_softmax(op: str, x, mask=None, *, dim: int = -1, scale: float = 1.0) -> None:
    _dim(op, dim, x.dim())
    _check_scale(op, scale)
    if mask is not None:
        out = broadcast_shapes(op, ("x", "mask"), (tuple(x.shape), tuple(mask.shape)))
        if out != tuple(x.shape):
            raise ValueError(f"{op}: mask {shape_str(mask.shape)} must broadcast to x's shape "
                             f"{shape_str(x.shape)} (it would make the result {shape_str(out)})")


def _check_softmax_backward(op: str, gy, y, *, dim: int = -1, scale: float = 1.0) -> None:
    _dim(op, dim, y.dim())
    _check_scale(op, scale)
    if tuple(gy.shape) != tuple(y.shape):
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but y has {shape_str(y.shape)}")


for _log in (False, True):
    _name = "log_softmax" if _log else "softmax"
    defop(_name, Schema((TensorArg("x", FLOAT_DTYPES), TensorArg("mask", FLOAT_DTYPES, optional=True)),
                        _check_softmax))
    register(_name, "triton")(
        lambda x, mask=None, *, dim=-1, scale=1.0, _log=_log, _name=_name:
        K.softmax_fwd(x, _dim(_name, dim, x.dim()), scale=scale, mask=mask, log=_log))
    defop(_name + "_backward", Schema((TensorArg("gy", FLOAT_DTYPES), TensorArg("y", FLOAT_DTYPES)),
                                      _check_softmax_backward))
    register(_name + "_backward", "triton")(
        lambda gy, y, *, dim=-1, scale=1.0, _log=_log, _name=_name:
        K.softmax_bwd(gy, y, _dim(_name, dim, y.dim()), scale=scale, log=_log))
