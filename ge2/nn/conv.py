"""Convolution and pooling layers: ``Conv2d`` (with an optional fused activation), ``MaxPool2d``,
``AvgPool2d``, ``AdaptiveAvgPool2d``."""
from __future__ import annotations

import torch

from ge2.autograd.conv import adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d
from ge2.autograd.tensor import Tensor
from ge2.backend.conv import _pair
from ge2.kernels import activations
from ge2.nn import init
from ge2.nn.module import Module


class Conv2d(Module):
    """y = act(conv(x, W) + b): W [out, in/groups, kh, kw], b [out]; ``activation`` is fused into the epilogue.

    Initialised like torch.nn.Conv2d (kaiming-uniform W with a = sqrt(5), uniform b in
    +-1/sqrt(fan_in)), with torch's RNG, so the same seed gives the same weights as torch.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, activation: str | None = None, negative_slope: float = 0.01,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__()
        if activation is not None:
            activations.act_code("Conv2d", activation, negative_slope)
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels={in_channels} and out_channels={out_channels} must be "
                             f"divisible by groups={groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size, 1)
        self.stride, self.dilation = _pair("Conv2d", "stride", stride, 1), _pair("Conv2d", "dilation", dilation, 1)
        self.padding = padding if isinstance(padding, str) else _pair("Conv2d", "padding", padding, 0)
        self.activation, self.negative_slope = activation, negative_slope
        init.add_layer_parameters(self, (out_channels, in_channels // groups, *self.kernel_size), out_channels, bias,
                                  device, dtype)

    def reset_parameters(self) -> None:
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                      self.activation, self.negative_slope)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding!r}")
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.activation is not None:
            s += f", activation={self.activation!r}"
        return s


class MaxPool2d(Module):
    """Window maxima; ``return_indices`` also returns the int64 flat positions h*W + w."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Window means, with torch's ``count_include_pad`` and ``divisor_override`` rules."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                          self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Means over output_size (int or (h, w)) adaptive windows; (1, 1) is global average pooling."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
