"""Padding and resampling with gradients: pad, interpolate, unfold / fold, pixel (un)shuffle
(kernels in ``ge2.kernels.resample``)."""
from __future__ import annotations

import math
import numbers

from ge2 import backend
from ge2.autograd.function import Function
from ge2.autograd.math import squeeze, unsqueeze
from ge2.autograd.tensor import Tensor

call = backend.call


class Pad(Function):
    @staticmethod
    def forward(ctx, x, pad, mode, value):
        ctx.pad, ctx.mode, ctx.shape = pad, mode, tuple(x.shape)
        return call("pad", x, pad=pad, mode=mode, value=value)

    @staticmethod
    def backward(ctx, gy):
        return call("pad_backward", gy, pad=ctx.pad, mode=ctx.mode, in_shape=ctx.shape), None, None, None


class Interpolate(Function):
    @staticmethod
    def forward(ctx, x, size, scale_factors, mode, align_corners):
        ctx.args = dict(in_shape=tuple(x.shape), size=size, scale_factors=scale_factors, mode=mode,
                        align_corners=align_corners)
        return call("interpolate", x, size=size, scale_factors=scale_factors, mode=mode, align_corners=align_corners)

    @staticmethod
    def backward(ctx, gy):
        return call("interpolate_backward", gy, **ctx.args), None, None, None, None


class Unfold(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, dilation, padding, stride):
        ctx.hw, ctx.args = tuple(x.shape[2:]), dict(kernel_size=kernel_size, dilation=dilation, padding=padding,
                                                    stride=stride)
        return call("unfold", x, **ctx.args)

    @staticmethod
    def backward(ctx, gy):
        return call("fold", gy, output_size=ctx.hw, **ctx.args), None, None, None, None


class Fold(Function):
    @staticmethod
    def forward(ctx, x, output_size, kernel_size, dilation, padding, stride):
        ctx.args = dict(kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride)
        return call("fold", x, output_size=output_size, **ctx.args)

    @staticmethod
    def backward(ctx, gy):
        return call("unfold", gy, **ctx.args), None, None, None, None, None


class PixelShuffle(Function):
    @staticmethod
    def forward(ctx, x, r, inverse):
        ctx.r, ctx.inverse = r, inverse
        return call("pixel_unshuffle" if inverse else "pixel_shuffle", x, r=r)

    @staticmethod
    def backward(ctx, gy):
        return call("pixel_shuffle" if ctx.inverse else "pixel_unshuffle", gy, r=ctx.r), None, None


def _ints(op: str, name: str, v, n: int) -> tuple[int, ...]:
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return (int(v),) * n
    v = tuple(v)
    if len(v) != n or not all(isinstance(e, numbers.Integral) for e in v):
        raise ValueError(f"{op}: {name} must be an int or {n} ints, got {v!r}")
    return tuple(int(e) for e in v)


def pad(input: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:  # noqa: A002
    """torch.nn.functional.pad: pad (before, after) pairs from the last dim backwards; negative pads crop."""
    pads = tuple(pad)
    if not all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in pads):
        raise TypeError(f"pad: pad must be a sequence of ints, got {pad!r}")
    if mode != "constant" and value is not None and value != 0:
        raise ValueError(f"pad: mode {mode!r} does not take a value (got value={value})")
    return Pad.apply(input, tuple(int(p) for p in pads), mode, 0.0 if value is None else value)


_INTERP_ALIGN = ("linear", "bilinear", "bicubic", "trilinear")


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """torch.nn.functional.interpolate over the spatial dims of [N, C, *spatial]: nearest,
    nearest-exact, (bi/tri)linear, bicubic (and area through adaptive average pooling, 3-D/4-D)."""
    if antialias:
        raise ValueError("interpolate: antialias=True is not supported by ge2")
    k = input.ndim - 2
    if k < 1:
        raise ValueError(f"interpolate: input must be [N, C, *spatial] with 1-3 spatial dims, got {list(input.shape)}")
    if align_corners is not None and mode not in _INTERP_ALIGN:
        raise ValueError(f"interpolate: align_corners can only be set with the interpolating modes "
                         f"{' | '.join(_INTERP_ALIGN)}, got mode {mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    in_size = tuple(input.shape[2:])
    sfs = None
    if size is not None:
        out = _ints("interpolate", "size", size, k)
    else:
        if isinstance(scale_factor, numbers.Real):
            sfs = (float(scale_factor),) * k
        else:
            sfs = tuple(float(s) for s in scale_factor)
            if len(sfs) != k:
                raise ValueError(f"interpolate: scale_factor {list(sfs)} must give {k} factors for input "
                                 f"{list(input.shape)}")
        out = tuple(math.floor(n * s) for n, s in zip(in_size, sfs))
        if recompute_scale_factor:
            sfs = None
    if mode == "area":
        from ge2.autograd.conv import adaptive_avg_pool2d

        if k == 1:
            return squeeze(adaptive_avg_pool2d(unsqueeze(input, 2), (1, out[0])), 2)
        if k == 2:
            return adaptive_avg_pool2d(input, out)
        raise ValueError(f"interpolate: mode 'area' takes a 3-D or 4-D input in ge2, got {list(input.shape)}")
    return Interpolate.apply(input, out, sfs, mode, bool(align_corners))


def _pair(op: str, name: str, v) -> tuple[int, int]:
    return _ints(op, name, v, 2)


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002
    """torch.nn.functional.unfold (im2col): [N, C, H, W] (or [C, H, W]) -> [N, C kh kw, L]."""
    if input.ndim not in (3, 4):
        raise ValueError(f"unfold: input must be [N, C, H, W] or [C, H, W], got {list(input.shape)}")
    args = [_pair("unfold", n, v) for n, v in (("kernel_size", kernel_size), ("dilation", dilation),
                                               ("padding", padding), ("stride", stride))]
    if input.ndim == 3:
        return squeeze(Unfold.apply(unsqueeze(input, 0), *args), 0)
    return Unfold.apply(input, *args)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002
    """torch.nn.functional.fold (col2im, overlaps summed): [N, C kh kw, L] (or [C kh kw, L]) -> [N, C, H, W]."""
    if input.ndim not in (2, 3):
        raise ValueError(f"fold: input must be [N, C*kh*kw, L] or [C*kh*kw, L], got {list(input.shape)}")
    args = [_pair("fold", n, v) for n, v in (("output_size", output_size), ("kernel_size", kernel_size),
                                             ("dilation", dilation), ("padding", padding), ("stride", stride))]
    if input.ndim == 2:
        return squeeze(Fold.apply(unsqueeze(input, 0), *args), 0)
    return Fold.apply(input, *args)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:  # noqa: A002
    """[*, C r^2, H, W] -> [*, C, H r, W r]."""
    return PixelShuffle.apply(input, upscale_factor, False)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:  # noqa: A002
    """[*, C, H r, W r] -> [*, C r^2, H, W]."""
    return PixelShuffle.apply(input, downscale_factor, True)
