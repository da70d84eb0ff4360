"""2-D pooling ops: schemas and Triton implementations (kernels in ``ge2.kernels.pool``).

x is [N, C, H, W] (NCHW or NHWC strides; the output takes x's layout). kernel_size, stride
(default: kernel_size), padding, dilation: int or (h, w); output sizes as torch computes them
(``ceil_mode`` rounds up but never starts a window in the bottom/right padding).

``max_pool2d(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> (y, indices)``
    indices: int64 flat positions h*W + w of each window's max (torch's convention).
``max_pool2d_backward(gy, indices, *, input_size, kernel_size, stride=None, padding=0, dilation=1,
ceil_mode=False, channels_last=False) -> dx``
``avg_pool2d(x, *, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
divisor_override=None) -> y``
``avg_pool2d_backward(gy, *, input_size, kernel_size, stride=None, padding=0, ceil_mode=False,
count_include_pad=True, divisor_override=None, channels_last=False) -> dx``
``adaptive_avg_pool2d(x, *, output_size) -> y``   output_size: int or (h, w); None keeps that dim.
``adaptive_avg_pool2d_backward(gy, *, input_size, channels_last=False) -> dx``

Backward results are new [N, C, H, W] tensors, NHWC when ``channels_last`` else NCHW.
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.conv import _pair
from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import pool as K

POOL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _out_size(size: int, k: int, pad: int, stride: int, dil: int, ceil_mode: bool) -> int:
    span = dil * (k - 1) + 1
    num = size + 2 * pad - span + ((stride - 1) if ceil_mode else 0)
    out = num // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:  # the last window must start inside the input
        out -= 1
    return out


def pool_geometry(op: str, x_shape, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """(kernel, stride, padding, dilation, (P, Q)) as pairs, checked against x's shape."""
    k = _pair(op, "kernel_size", kernel_size, 1)
    default_stride = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)  # torch: [] too
    st = k if default_stride else _pair(op, "stride", stride, 1)
    pad = _pair(op, "padding", padding, 0)
    dil = _pair(op, "dilation", dilation, 1)
    for i, axis in enumerate("hw"):
        span = dil[i] * (k[i] - 1) + 1
        if 2 * pad[i] > span:
            raise ValueError(f"{op}: padding {pad} must be at most half the (dilated) kernel {k} "
                             f"(x {shape_str(x_shape)})")
    H, W = x_shape[2], x_shape[3]
    out = (_out_size(H, k[0], pad[0], st[0], dil[0], ceil_mode), _out_size(W, k[1], pad[1], st[1], dil[1], ceil_mode))
    if min(out) < 1:
        raise ValueError(f"{op}: kernel {k} (dilation {dil}) is larger than the padded input "
                         f"{H + 2 * pad[0]}x{W + 2 * pad[1]} (x {shape_str(x_shape)}, padding {pad})")
    return k, st, pad, dil, out


def _input_size(op: str, input_size) -> tuple[int, int, int, int]:
    if not isinstance(input_size, (tuple, list, torch.Size)) or len(input_size) != 4:
        raise ValueError(f"{op}: input_size must be the 4 sizes [N, C, H, W] of x, got {input_size!r}")
    return tuple(int(s) for s in input_size)


def _check_grad_shape(op: str, gy, x_shape, out_hw) -> None:
    want = (x_shape[0], x_shape[1], *out_hw)
    if tuple(gy.shape) != want:
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but pooling x {shape_str(x_shape)} "
                         f"gives {shape_str(want)}")


# -- max_pool2d --------------------------------------------------------------------------------

def _check_max(op, x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> None:
    pool_geometry(op, tuple(x.shape), kernel_size, stride, padding, dilation, ceil_mode)


defop("max_pool2d", Schema((TensorArg("x", POOL_DTYPES, ndim=(4,)),), _check_max))


@register("max_pool2d", "triton", dtypes=POOL_DTYPES)
def max_pool2d(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    k, st, pad, dil, out = pool_geometry("max_pool2d", tuple(x.shape), kernel_size, stride, padding, dilation,
                                         ceil_mode)
    return K.max_pool2d(x, k, st, pad, dil, out)


def _check_max_backward(op, gy, indices, *, input_size, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False, channels_last=False) -> None:
    x_shape = _input_size(op, input_size)
    out = pool_geometry(op, x_shape, kernel_size, stride, padding, dilation, ceil_mode)[-1]
    _check_grad_shape(op, gy, x_shape, out)
    if tuple(indices.shape) != tuple(gy.shape):
        raise ValueError(f"{op}: indices {shape_str(indices.shape)} and gy {shape_str(gy.shape)} differ in shape")


defop("max_pool2d_backward", Schema((TensorArg("gy", POOL_DTYPES, ndim=(4,)),
                                     TensorArg("indices", (torch.int64,), ndim=(4,))), _check_max_backward))


@register("max_pool2d_backward", "triton", dtypes=POOL_DTYPES)
def max_pool2d_backward(gy, indices, *, input_size, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False, channels_last=False):
    k, st, pad, dil, _ = pool_geometry("max_pool2d_backward", tuple(input_size), kernel_size, stride, padding,
                                       dilation, ceil_mode)
    return K.max_pool2d_backward(gy, indices, tuple(input_size), k, st, pad, dil, channels_last)


# -- avg_pool2d --------------------------------------------------------------------------------

def _check_divisor(op, divisor_override) -> None:
    if divisor_override is not None and (not isinstance(divisor_override, numbers.Integral)
                                         or isinstance(divisor_override, bool) or divisor_override < 1):
        raise ValueError(f"{op}: divisor_override must be a positive int or None, got {divisor_override!r}")


def _check_avg(op, x, *, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None) -> None:
    pool_geometry(op, tuple(x.shape), kernel_size, stride, padding, 1, ceil_mode)
    _check_divisor(op, divisor_override)


defop("avg_pool2d", Schema((TensorArg("x", POOL_DTYPES, ndim=(4,)),), _check_avg))


@register("avg_pool2d", "triton", dtypes=POOL_DTYPES)
def avg_pool2d(x, *, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k, st, pad, _, out = pool_geometry("avg_pool2d", tuple(x.shape), kernel_size, stride, padding, 1, ceil_mode)
    return K.avg_pool2d(x, k, st, pad, out, count_include_pad, divisor_override)


def _check_avg_backward(op, gy, *, input_size, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None, channels_last=False) -> None:
    x_shape = _input_size(op, input_size)
    out = pool_geometry(op, x_shape, kernel_size, stride, padding, 1, ceil_mode)[-1]
    _check_grad_shape(op, gy, x_shape, out)
    _check_divisor(op, divisor_override)


defop("avg_pool2d_backward", Schema((TensorArg("gy", POOL_DTYPES, ndim=(4,)),), _check_avg_backward))


@register("avg_pool2d_backward", "triton", dtypes=POOL_DTYPES)
def avg_pool2d_backward(gy, *, input_size, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None, channels_last=False):
    k, st, pad, _, _ = pool_geometry("avg_pool2d_backward", tuple(input_size), kernel_size, stride, padding, 1,
                                     ceil_mode)
    return K.avg_pool2d_backward(gy, tuple(input_size), k, st, pad, count_include_pad, divisor_override,
                                 channels_last)


# -- adaptive_avg_pool2d -----------------------------------------------------------------------

def adaptive_output_size(op: str, x_shape, output_size) -> tuple[int, int]:
    """output_size as (P, Q): an int, or a pair whose None entries keep x's size."""
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        output_size = tuple(x_shape[2 + i] if s is None else s for i, s in enumerate(output_size))
    out = _pair(op, "output_size", output_size, 1)
    if min(x_shape[2], x_shape[3]) < 1:
        raise ValueError(f"{op}: x {shape_str(x_shape)} has an empty spatial dim")
    return out


def _check_adaptive(op, x, *, output_size) -> None:
    adaptive_output_size(op, tuple(x.shape), output_size)


defop("adaptive_avg_pool2d", Schema((TensorArg("x", POOL_DTYPES, ndim=(4,)),), _check_adaptive))


@register("adaptive_avg_pool2d", "triton", dtypes=POOL_DTYPES)
def adaptive_avg_pool2d(x, *, output_size):
    return K.adaptive_avg_pool2d(x, adaptive_output_size("adaptive_avg_pool2d", tuple(x.shape), output_size))


def _check_adaptive_backward(op, gy, *, input_size, channels_last=False) -> None:
    x_shape = _input_size(op, input_size)
    if tuple(gy.shape[:2]) != x_shape[:2]:
        raise ValueError(f"{op}: gy {shape_str(gy.shape)} does not match input_size {shape_str(x_shape)} in N, C")
    if min(x_shape[2], x_shape[3]) < 1:
        raise ValueError(f"{op}: input_size {shape_str(x_shape)} has an empty spatial dim")


defop("adaptive_avg_pool2d_backward", Schema((TensorArg("gy", POOL_DTYPES, ndim=(4,)),), _check_adaptive_backward))


@register("adaptive_avg_pool2d_backward", "triton", dtypes=POOL_DTYPES)
def adaptive_avg_pool2d_backward(gy, *, input_size, channels_last=False):
    return K.adaptive_avg_pool2d_backward(gy, tuple(input_size), channels_last)
