"""torch reference implementations of the pooling ops (the oracle the tests compare with)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ge2.backend.pool import POOL_DTYPES, adaptive_output_size
from ge2.backend.registry import register
from ge2.kernels.conv import empty_like_layout


def _layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return t.contiguous(memory_format=fmt)


def _grad(fn, input_size, gy, channels_last, dtype):
    """dX of ``fn`` at an input of ``input_size`` (the pools' backward depends only on its shape and indices)."""
    with torch.enable_grad():
        x = torch.zeros(tuple(input_size), dtype=torch.float32, device=gy.device, requires_grad=True)
        (dx,) = torch.autograd.grad(fn(x), x, gy.float())
    return _layout(dx.to(dtype), channels_last)


@register("max_pool2d", "torch", dtypes=POOL_DTYPES)
def max_pool2d(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    y, idx = F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    return empty_like_layout(tuple(y.shape), x).copy_(y), empty_like_layout(tuple(y.shape), x, torch.int64).copy_(idx)


@register("max_pool2d_backward", "torch", dtypes=POOL_DTYPES)
def max_pool2d_backward(gy, indices, *, input_size, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False, channels_last=False):
    N, C, H, W = input_size
    flat = torch.zeros((N, C, H * W), dtype=torch.float32, device=gy.device)
    flat.scatter_add_(2, indices.reshape(N, C, -1), gy.float().reshape(N, C, -1))
    return _layout(flat.reshape(N, C, H, W).to(gy.dtype), channels_last)


@register("avg_pool2d", "torch", dtypes=POOL_DTYPES)
def avg_pool2d(x, *, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    y = F.avg_pool2d(x.float(), kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return empty_like_layout(tuple(y.shape), x).copy_(y)


@register("avg_pool2d_backward", "torch", dtypes=POOL_DTYPES)
def avg_pool2d_backward(gy, *, input_size, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None, channels_last=False):
    return _grad(lambda x: F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                        divisor_override), input_size, gy, channels_last, gy.dtype)


@register("adaptive_avg_pool2d", "torch", dtypes=POOL_DTYPES)
def adaptive_avg_pool2d(x, *, output_size):
    y = F.adaptive_avg_pool2d(x.float(), adaptive_output_size("adaptive_avg_pool2d", tuple(x.shape), output_size))
    return empty_like_layout(tuple(y.shape), x).copy_(y)


@register("adaptive_avg_pool2d_backward", "torch", dtypes=POOL_DTYPES)
def adaptive_avg_pool2d_backward(gy, *, input_size, channels_last=False):
    return _grad(lambda x: F.adaptive_avg_pool2d(x, tuple(gy.shape[2:])), input_size, gy, channels_last, gy.dtype)
