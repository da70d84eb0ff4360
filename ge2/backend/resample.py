"""Resampling ops: schemas and Triton implementations (kernels in ``ge2.kernels.resample``).

``pad(x, *, pad, mode, value)``               pad (torch's order: last dim first) constant / reflect / replicate / circular
``pad_backward(gy, *, pad, mode, in_shape)``  its gradient (sums where reflect/replicate/circular read an element twice)
``interpolate(x, *, size, scale_factors, mode, align_corners)``  x [N, C, *in] -> [N, C, *size]
``interpolate_backward(gy, *, in_shape, scale_factors, mode, align_corners)``
``unfold(x, *, kernel_size, dilation, padding, stride)``   x [N, C, H, W] -> [N, C kh kw, L]
``fold(x, *, output_size, kernel_size, dilation, padding, stride)``   [N, C kh kw, L] -> [N, C, H, W]
``pixel_shuffle(x, *, r)`` / ``pixel_unshuffle(x, *, r)``  [*, C r^2, H, W] <-> [*, C, H r, W r]

pad and pixel (un)shuffle move data (every dtype); interpolation computes in fp32 and takes
float16/bfloat16/float32 (float64 is refused: its positions would be fp32's); unfold/fold take floats.
"""
from __future__ import annotations


import torch

from ge2.backend.registry import ALL_DTYPES, FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import layout
from ge2.kernels import resample as K

INTERP_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INTERP_MODES = {"nearest": K.NEAREST, "nearest-exact": K.NEAREST_EXACT, "linear": K.LINEAR,
                "bilinear": K.LINEAR, "trilinear": K.LINEAR, "bicubic": K.CUBIC}
# the spatial dims each mode takes (torch's rule: linear 3-D input, bilinear/bicubic 4-D, trilinear 5-D)
INTERP_SPATIAL = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "linear": (1,), "bilinear": (2,),
                  "bicubic": (2,), "trilinear": (3,)}
PAD_MODES = tuple(layout.MODES)


def pad_shape(op: str, shape, pad, mode: str) -> list[int]:
    """The padded shape; a clear error for a pad torch refuses."""
    k = len(pad) // 2
    out = list(shape)
    for i in range(k):
        d = len(shape) - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        size = shape[d]
        if mode == "reflect" and (lo >= size or hi >= size):
            raise ValueError(f"{op}: reflect padding ({lo}, {hi}) must be smaller than dim {d} of size {size} "
                             f"(x of shape {shape_str(shape)})")
        if mode == "circular" and (lo > size or hi > size):
            raise ValueError(f"{op}: circular padding ({lo}, {hi}) must be at most dim {d} of size {size} "
                             f"(x of shape {shape_str(shape)})")
        if mode != "constant" and size == 0:
            raise ValueError(f"{op}: {mode} padding of an empty dim {d} (x of shape {shape_str(shape)})")
        out[d] = size + lo + hi
        if out[d] < 0:
            raise ValueError(f"{op}: padding ({lo}, {hi}) of dim {d} of size {size} gives a negative size "
                             f"(x of shape {shape_str(shape)})")
    return out


def _check_pad(op, x, *, pad, mode, value=0.0, in_shape=None):
    shape = in_shape if in_shape is not None else x.shape
    if mode not in PAD_MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    if len(pad) % 2 or not pad:
        raise ValueError(f"{op}: pad must hold (before, after) pairs, got {len(pad)} values {list(pad)}")
    k = len(pad) // 2
    if k > len(shape):
        raise ValueError(f"{op}: pad {list(pad)} pads {k} dims but x of shape {shape_str(shape)} has {len(shape)}")
    if mode != "constant" and (k > 3 or len(shape) not in (k + 1, k + 2)):
        raise ValueError(f"{op}: {mode} padding of the last {k} dims takes a {k + 1}-D or {k + 2}-D x "
                         f"(pad of length {len(pad)}), got x of shape {shape_str(shape)}")
    out = pad_shape(op, shape, pad, mode)
    if in_shape is not None and list(x.shape) != out:
        raise ValueError(f"{op}: gy has shape {shape_str(x.shape)}, expected {shape_str(out)}")


def interp_scales(in_size, size, scale_factors, mode: str, align_corners: bool) -> tuple[float, ...]:
    """The source step a of src = a*o + b per spatial dim, as torch computes it."""
    out = []
    for i, (n_in, n_out) in enumerate(zip(in_size, size)):
        sf = scale_factors[i] if scale_factors is not None else None
        if align_corners and mode not in ("nearest", "nearest-exact"):
            out.append((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        elif sf is not None and sf > 0:
            out.append(1.0 / sf)
        else:
            out.append(n_in / n_out if n_out else 0.0)
    return tuple(out)


def _check_interp(op, x, *, size, scale_factors, mode, align_corners, in_shape=None):
    shape = in_shape if in_shape is not None else x.shape
    if mode not in INTERP_MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(INTERP_MODES)} (or 'area'), got {mode!r}")
    k = len(shape) - 2
    if k not in INTERP_SPATIAL[mode]:
        want = " or ".join(f"{n + 2}-D" for n in INTERP_SPATIAL[mode])
        raise ValueError(f"{op}: mode {mode!r} takes a {want} input, got x of shape {shape_str(shape)}")
    if len(size) != k or any(s <= 0 for s in size):
        raise ValueError(f"{op}: size {list(size)} must give {k} positive output sizes for x of shape {shape_str(shape)}")
    if any(s <= 0 for s in shape[2:]):
        raise ValueError(f"{op}: x of shape {shape_str(shape)} has an empty spatial dim")
    if in_shape is not None and tuple(x.shape) != (*shape[:2], *size):
        raise ValueError(f"{op}: gy has shape {shape_str(x.shape)}, expected {shape_str((*shape[:2], *size))}")


def unfold_blocks(op: str, hw, kernel_size, dilation, padding, stride) -> tuple[int, int]:
    """(P, Q): the sliding windows along each spatial dim; a clear error when none fits."""
    out = []
    for n, k, d, p, s, name in zip(hw, kernel_size, dilation, padding, stride, ("height", "width")):
        if k <= 0 or d <= 0 or s <= 0 or p < 0:
            raise ValueError(f"{op}: kernel_size {list(kernel_size)} and dilation {list(dilation)}, stride "
                             f"{list(stride)} must be positive and padding {list(padding)} non-negative")
        blocks = (n + 2 * p - d * (k - 1) - 1) // s + 1
        if blocks <= 0:
            raise ValueError(f"{op}: no {k}-wide window (dilation {d}) fits the padded {name} {n + 2 * p}")
        out.append(blocks)
    return tuple(out)


def _check_unfold(op, x, *, kernel_size, dilation, padding, stride):
    unfold_blocks(op, x.shape[2:], kernel_size, dilation, padding, stride)


def _check_fold(op, x, *, output_size, kernel_size, dilation, padding, stride):
    P, Q = unfold_blocks(op, output_size, kernel_size, dilation, padding, stride)
    kk = kernel_size[0] * kernel_size[1]
    if x.shape[1] % kk:
        raise ValueError(f"{op}: x of shape {shape_str(x.shape)}: dim 1 ({x.shape[1]}) must be divisible by "
                         f"the kernel's {kk} taps (kernel_size {list(kernel_size)})")
    if x.shape[2] != P * Q:
        raise ValueError(f"{op}: x of shape {shape_str(x.shape)} has {x.shape[2]} blocks, but output_size "
                         f"{list(output_size)} with kernel_size {list(kernel_size)} gives {P} x {Q} = {P * Q}")


def _check_shuffle(op, x, *, r):
    if not isinstance(r, int) or r <= 0:
        raise ValueError(f"{op}: the factor must be a positive int, got {r!r}")
    if x.dim() < 3:
        raise ValueError(f"{op}: x must have at least 3 dims, got shape {shape_str(x.shape)}")
    if op == "pixel_shuffle" and x.shape[-3] % (r * r):
        raise ValueError(f"{op}: channels {x.shape[-3]} of x {shape_str(x.shape)} are not divisible by "
                         f"upscale_factor^2 = {r * r}")
    if op == "pixel_unshuffle" and (x.shape[-1] % r or x.shape[-2] % r):
        raise ValueError(f"{op}: height and width of x {shape_str(x.shape)} must be divisible by "
                         f"downscale_factor {r}")


def _pad(x, *, pad, mode, value=0.0):
    return K.pad(x, tuple(pad), layout.MODES[mode], value)


def _pad_backward(gy, *, pad, mode, in_shape):
    return K.pad_backward(gy, tuple(in_shape), tuple(pad), layout.MODES[mode])


def _interpolate(x, *, size, scale_factors, mode, align_corners):
    scales = interp_scales(x.shape[2:], size, scale_factors, mode, align_corners)
    return K.interpolate(x, tuple(size), scales, INTERP_MODES[mode], bool(align_corners))


def _interpolate_backward(gy, *, in_shape, size, scale_factors, mode, align_corners):
    scales = interp_scales(in_shape[2:], size, scale_factors, mode, align_corners)
    return K.interpolate_backward(gy, tuple(in_shape), scales, INTERP_MODES[mode], bool(align_corners))


def _unfold(x, *, kernel_size, dilation, padding, stride):
    blocks = unfold_blocks("unfold", x.shape[2:], kernel_size, dilation, padding, stride)
    return K.unfold(x, kernel_size, dilation, padding, stride, blocks)


def _fold(x, *, output_size, kernel_size, dilation, padding, stride):
    blocks = unfold_blocks("fold", output_size, kernel_size, dilation, padding, stride)
    return K.fold(x, output_size, kernel_size, dilation, padding, stride, blocks)


X = TensorArg("x", ALL_DTYPES)
defop("pad", Schema((X,), _check_pad))
defop("pad_backward", Schema((TensorArg("gy", FLOAT_DTYPES),), _check_pad))
defop("interpolate", Schema((TensorArg("x", INTERP_DTYPES),), _check_interp))
defop("interpolate_backward", Schema((TensorArg("gy", INTERP_DTYPES),), _check_interp))
defop("unfold", Schema((TensorArg("x", FLOAT_DTYPES, ndim=(4,)),), _check_unfold))
defop("fold", Schema((TensorArg("x", FLOAT_DTYPES, ndim=(3,)),), _check_fold))
defop("pixel_shuffle", Schema((X,), _check_shuffle))
defop("pixel_unshuffle", Schema((X,), _check_shuffle))

register("pad", "triton", dtypes=ALL_DTYPES)(_pad)
register("pad_backward", "triton")(_pad_backward)
register("interpolate", "triton", dtypes=INTERP_DTYPES)(_interpolate)
register("interpolate_backward", "triton", dtypes=INTERP_DTYPES)(_interpolate_backward)
register("unfold", "triton")(_unfold)
register("fold", "triton")(_fold)
register("pixel_shuffle", "triton", dtypes=ALL_DTYPES)(lambda x, *, r: K.pixel_shuffle(x, r))
register("pixel_unshuffle", "triton", dtypes=ALL_DTYPES)(lambda x, *, r: K.pixel_unshuffle(x, r))
