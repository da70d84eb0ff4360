"""conv2d (with a fused bias + activation epilogue) and 2-D pooling, with gradients.

Each forward is one op launch ("conv2d", "max_pool2d", ...), each backward one "*_backward" op;
the kernels live in ``ge2.kernels.conv`` / ``ge2.kernels.pool``. Inputs may be NCHW or NHWC
(channels-last); outputs and input gradients keep the input's layout.
"""
from __future__ import annotations

from ge2 import backend
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import shape_str
from ge2.kernels import activations
from ge2.kernels.conv import is_channels_last

call = backend.call


class Conv2d(Function):
    """y = act(conv(x, W) + b): forward saves x, W and y (or z, the pre-activation, for gelu/silu)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, act, act_alpha):
        code = activations.act_code("conv2d", act, act_alpha)
        from_z = activations.needs_z(code)
        geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        y, z = call("conv2d", x, weight, bias, **geometry, act=act, act_alpha=act_alpha,
                    save_z=from_z and any(ctx.needs_input_grad[:3]))
        saved = None if code == activations.NONE else z if from_z else y
        ctx.save_for_backward(x, weight, saved)
        ctx.geometry, ctx.has_bias, ctx.from_z = geometry, bias is not None, from_z
        ctx.act, ctx.act_alpha = act, act_alpha
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, saved = ctx.saved_tensors
        dx, dw, dbias = call("conv2d_backward", gy, x, weight, saved, **ctx.geometry, has_bias=ctx.has_bias,
                             act=ctx.act, act_alpha=ctx.act_alpha, from_z=ctx.from_z,
                             need_x=ctx.needs_input_grad[0], need_w=ctx.needs_input_grad[1])
        return dx, dw, (dbias if ctx.needs_input_grad[2] else None), None, None, None, None, None, None


def _geometry_arg(value):
    """torch takes a one-element tuple or list wherever it takes an int (``padding=(1,)``): the int."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        return value[0]
    return value


def _check_tensors(op: str, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a ge2 Tensor, got {type(t).__name__}")


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1,
           activation: str | None = None, negative_slope: float = 0.01) -> Tensor:
    """act(conv2d(x [N, C, H, W], weight [K, C/groups, R, S]) + bias [K]) -> [N, K, P, Q], one fused launch.

    stride/dilation: int or (h, w); padding: int, (h, w), "valid" or "same". x NCHW or NHWC (the
    output takes its layout). ``activation``: None, "relu", "leaky_relu" (``negative_slope``),
    "gelu", "gelu_tanh", "sigmoid", "tanh" or "silu".
    """
    _check_tensors("conv2d", x=x, weight=weight, bias=bias)
    if _amp_state.on:
        x, weight, bias = _amp.cast_low(x, weight, bias)
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D [K, C/groups, R, S], got shape {shape_str(weight.shape)}")
    stride, padding, dilation = _geometry_arg(stride), _geometry_arg(padding), _geometry_arg(dilation)
    if x.ndim == 3:  # an unbatched [C, H, W] image, as torch allows
        y = conv2d(x.reshape(1, *x.shape), weight, bias, stride, padding, dilation, groups, activation, negative_slope)
        return y.reshape(*y.shape[1:])
    if x.ndim != 4:
        raise ValueError(f"conv2d: x must be 4-D [N, C, H, W] (or 3-D [C, H, W]), got shape {shape_str(x.shape)}")
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups, activation or "none", negative_slope)


class MaxPool2d(Function):
    """(y, indices): the window maxima and their int64 flat positions h*W + w; the gradient goes there."""

    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, dilation, ceil_mode):
        geometry = dict(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
        y, indices = call("max_pool2d", x, **geometry)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.geometry, ctx.input_size, ctx.channels_last = geometry, tuple(x.shape), is_channels_last(x)
        return y, indices

    @staticmethod
    def backward(ctx, gy, _gi):
        (indices,) = ctx.saved_tensors
        dx = call("max_pool2d_backward", gy, indices, input_size=ctx.input_size, **ctx.geometry,
                  channels_last=ctx.channels_last)
        return dx, None, None, None, None, None


class AvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        geometry = dict(kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                        count_include_pad=count_include_pad, divisor_override=divisor_override)
        ctx.geometry, ctx.input_size, ctx.channels_last = geometry, tuple(x.shape), is_channels_last(x)
        return call("avg_pool2d", x, **geometry)

    @staticmethod
    def backward(ctx, gy):
        dx = call("avg_pool2d_backward", gy, input_size=ctx.input_size, **ctx.geometry,
                  channels_last=ctx.channels_last)
        return dx, None, None, None, None, None, None


class AdaptiveAvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, output_size):
        ctx.input_size, ctx.channels_last = tuple(x.shape), is_channels_last(x)
        return call("adaptive_avg_pool2d", x, output_size=output_size)

    @staticmethod
    def backward(ctx, gy):
        return call("adaptive_avg_pool2d_backward", gy, input_size=ctx.input_size,
                    channels_last=ctx.channels_last), None


def _pool_input(op: str, x) -> Tensor:
    """x as a batch [N, C, H, W]: an unbatched [C, H, W] image (as torch allows) becomes a batch of one (a view)."""
    _check_tensors(op, x=x)
    if x.ndim == 3:
        return x.reshape(1, *x.shape)
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 4-D [N, C, H, W] or 3-D [C, H, W], got shape {shape_str(x.shape)}")
    return x


def _pool_output(x: Tensor, y: Tensor) -> Tensor:
    """y [1, C, P, Q] back to [C, P, Q] when x was unbatched."""
    return y.reshape(*y.shape[1:]) if x.ndim == 3 else y


def _pool_stride(stride):
    """torch reads an empty stride tuple as its default (the kernel size)."""
    return None if isinstance(stride, (tuple, list)) and len(stride) == 0 else _geometry_arg(stride)


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Window maxima of x [N, C, H, W] (or [C, H, W]) -> [N, C, P, Q] (and the int64 indices h*W + w if asked)."""
    xb = _pool_input("max_pool2d", x)
    y, indices = MaxPool2d.apply(xb, _geometry_arg(kernel_size), _pool_stride(stride), _geometry_arg(padding),
                                 _geometry_arg(dilation), ceil_mode)
    y = _pool_output(x, y)
    return (y, _pool_output(x, indices)) if return_indices else y


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Window means of x [N, C, H, W] (or [C, H, W]) -> [N, C, P, Q], with torch's divisor rules."""
    xb = _pool_input("avg_pool2d", x)
    return _pool_output(x, AvgPool2d.apply(xb, _geometry_arg(kernel_size), _pool_stride(stride),
                                           _geometry_arg(padding), ceil_mode, count_include_pad, divisor_override))


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """Means of x [N, C, H, W] (or [C, H, W]) over output_size (int or (P, Q)) adaptive windows -> [N, C, P, Q]."""
    xb = _pool_input("adaptive_avg_pool2d", x)
    return _pool_output(x, AdaptiveAvgPool2d.apply(xb, output_size))
