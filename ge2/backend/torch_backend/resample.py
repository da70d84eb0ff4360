"""Reference of the resampling ops, written with torch (backward through torch's autograd)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ge2.backend.registry import ALL_DTYPES, FLOAT_DTYPES, register
from ge2.backend.resample import INTERP_DTYPES


def _vjp(fn, in_shape, gy):
    x = torch.zeros(in_shape, dtype=gy.dtype, device=gy.device, requires_grad=True)
    with torch.enable_grad():
        (gx,) = torch.autograd.grad(fn(x), x, gy)
    return gx


def _interp(x, *, size, scale_factors, mode, align_corners):
    align = align_corners if mode not in ("nearest", "nearest-exact") else None
    if scale_factors is not None:
        return F.interpolate(x, scale_factor=list(scale_factors), mode=mode, align_corners=align,
                             recompute_scale_factor=False)
    return F.interpolate(x, size=list(size), mode=mode, align_corners=align)


register("pad", "torch", dtypes=ALL_DTYPES)(lambda x, *, pad, mode, value=0.0: F.pad(x, list(pad), mode=mode, value=value)
                                            if mode == "constant" else F.pad(x, list(pad), mode=mode))
register("pad_backward", "torch", dtypes=FLOAT_DTYPES)(lambda gy, *, pad, mode, in_shape: _vjp(lambda x: F.pad(x, list(pad), mode=mode),
                                                                           in_shape, gy))
register("interpolate", "torch", dtypes=INTERP_DTYPES)(_interp)
register("interpolate_backward", "torch", dtypes=INTERP_DTYPES)(
    lambda gy, *, in_shape, size, scale_factors, mode, align_corners: _vjp(
        lambda x: _interp(x, size=size, scale_factors=scale_factors, mode=mode, align_corners=align_corners),
        in_shape, gy))
register("unfold", "torch", dtypes=FLOAT_DTYPES)(lambda x, *, kernel_size, dilation, padding, stride: F.unfold(
    x, kernel_size, dilation=dilation, padding=padding, stride=stride))
register("fold", "torch", dtypes=FLOAT_DTYPES)(lambda x, *, output_size, kernel_size, dilation, padding, stride: F.fold(
    x, output_size, kernel_size, dilation=dilation, padding=padding, stride=stride))
register("pixel_shuffle", "torch", dtypes=ALL_DTYPES)(lambda x, *, r: F.pixel_shuffle(x, r))
register("pixel_unshuffle", "torch", dtypes=ALL_DTYPES)(lambda x, *, r: F.pixel_unshuffle(x, r))
