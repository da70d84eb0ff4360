"""Resampling and padding layers, thin over ``ge2.autograd.resample``: ``Upsample``, ``Unfold``,
``Fold``, ``PixelShuffle``, ``PixelUnshuffle`` and torch's padding modules (``ZeroPad2d``,
``ConstantPad1d/2d/3d``, ``ReflectionPad1d/2d/3d``, ``ReplicationPad1d/2d/3d``, ``CircularPad1d/2d/3d``)."""
from __future__ import annotations

from ge2.autograd.resample import fold, interpolate, pad, pixel_shuffle, pixel_unshuffle, unfold
from ge2.autograd.tensor import Tensor
from ge2.nn.module import Module


class Upsample(Module):
    """F.interpolate with fixed size / scale_factor, mode and align_corners."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                 recompute_scale_factor: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class Unfold(Module):
    """[N, C, H, W] -> [N, C kh kw, L] sliding-window columns (im2col)."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, x: Tensor) -> Tensor:
        return unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, stride={self.stride}"


class Fold(Module):
    """[N, C kh kw, L] -> [N, C, H, W], overlapping windows summed (col2im)."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, x: Tensor) -> Tensor:
        return fold(x, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class PixelShuffle(Module):
    """[*, C r^2, H, W] -> [*, C, H r, W r]."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """[*, C, H r, W r] -> [*, C r^2, H, W]."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class _Pad(Module):
    """Pads the last ``DIMS`` dims: an int pads every side by it, else torch's (before, after) pairs."""

    DIMS = 1
    MODE = "constant"

    def __init__(self, padding, value: float | None = None):
        super().__init__()
        self.padding = (padding,) * (2 * self.DIMS) if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != 2 * self.DIMS:
            raise ValueError(f"{type(self).__name__}: padding must be an int or {2 * self.DIMS} ints, got {padding!r}")
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        return pad(x, self.padding, self.MODE, self.value)

    def extra_repr(self) -> str:
        return f"{self.padding}" + (f", value={self.value}" if self.value is not None else "")


def _pad_class(name: str, dims: int, mode: str, constant: bool = False) -> type:
    if constant:
        def init(self, padding, value: float):
            _Pad.__init__(self, padding, value)
    else:
        def init(self, padding):
            _Pad.__init__(self, padding)
    doc = f"torch.nn.{name}: {mode} padding of the last {dims} dim(s)."
    return type(name, (_Pad,), {"DIMS": dims, "MODE": mode, "__init__": init, "__doc__": doc})


ConstantPad1d = _pad_class("ConstantPad1d", 1, "constant", True)
ConstantPad2d = _pad_class("ConstantPad2d", 2, "constant", True)
ConstantPad3d = _pad_class("ConstantPad3d", 3, "constant", True)
ZeroPad1d = _pad_class("ZeroPad1d", 1, "constant")
ZeroPad2d = _pad_class("ZeroPad2d", 2, "constant")
ZeroPad3d = _pad_class("ZeroPad3d", 3, "constant")
ReflectionPad1d = _pad_class("ReflectionPad1d", 1, "reflect")
ReflectionPad2d = _pad_class("ReflectionPad2d", 2, "reflect")
ReflectionPad3d = _pad_class("ReflectionPad3d", 3, "reflect")
ReplicationPad1d = _pad_class("ReplicationPad1d", 1, "replicate")
ReplicationPad2d = _pad_class("ReplicationPad2d", 2, "replicate")
ReplicationPad3d = _pad_class("ReplicationPad3d", 3, "replicate")
CircularPad1d = _pad_class("CircularPad1d", 1, "circular")
CircularPad2d = _pad_class("CircularPad2d", 2, "circular")
CircularPad3d = _pad_class("CircularPad3d", 3, "circular")
