"""conv2d ops: schemas and Triton implementations (kernels in ``ge2.kernels.conv``).

``conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, act="none",
act_alpha=0.01, save_z=False) -> (y, z)``

    z = conv(x, weight) + bias;  y = act(z)
    x: [N, C, H, W], NCHW or NHWC strides (any strides work; the layout picks the output's);
    weight: [K, C/groups, R, S]; bias: [K]. stride/dilation: int or (h, w); padding: int, (h, w),
    "valid" (0) or "same" (output H, W = input's; stride 1 only; torch's split of an odd total
    padding: the extra row/column goes bottom/right). y: [N, K, P, Q] in x's layout, x's dtype.
    z: only when save_z and ``activations.needs_z(act)``, else None.

``conv2d_backward(gy, x, weight, saved=None, *, stride, padding, dilation, groups, has_bias,
act="none", act_alpha=0.01, from_z=False, need_x=True, need_w=True) -> (dx, dw, dbias)``

    gz = gy * act'(saved) (saved = z if from_z else y; unused for act "none"); dx like x (its
    layout), dw [K, C/groups, R, S] contiguous, dbias [K] (None unless has_bias).
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, dtype_name, shape_str
from ge2.kernels import activations, conv as K

CONV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _pair(op: str, name: str, value, minimum: int) -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (int(value), int(value))
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)):
        raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    if min(value) < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {tuple(value)}")
    return int(value[0]), int(value[1])


def conv_geometry(op: str, x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1) -> K.ConvGeometry:
    """Normalise the conv arguments and check them against the shapes; clear errors naming them."""
    st = _pair(op, "stride", stride, 1)
    dil = _pair(op, "dilation", dilation, 1)
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    N, C, H, W = x_shape
    Kout, Cg, R, S = w_shape
    if C % groups or Kout % groups:
        raise ValueError(f"{op}: channels must be divisible by groups={groups}: x {shape_str(x_shape)} has "
                         f"{C} input channels, weight {shape_str(w_shape)} has {Kout} output channels")
    if Cg * groups != C:
        raise ValueError(f"{op}: weight {shape_str(w_shape)} expects {Cg} channels per group x {groups} groups "
                         f"= {Cg * groups} input channels, but x {shape_str(x_shape)} has {C}")
    span = (dil[0] * (R - 1) + 1, dil[1] * (S - 1) + 1)  # the dilated kernel's extent
    if isinstance(padding, str):
        if padding == "valid":
            pads = (0, 0, 0, 0)
        elif padding == "same":
            if st != (1, 1):
                raise ValueError(f"{op}: padding='same' needs stride 1, got stride {st}")
            th, tw = span[0] - 1, span[1] - 1
            pads = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        else:
            raise ValueError(f"{op}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
    else:
        ph, pw = _pair(op, "padding", padding, 0)
        pads = (ph, ph, pw, pw)
    padded = (H + pads[0] + pads[1], W + pads[2] + pads[3])
    if span[0] > padded[0] or span[1] > padded[1]:
        raise ValueError(f"{op}: kernel (dilated {span[0]}x{span[1]}) is larger than the padded input "
                         f"{padded[0]}x{padded[1]} (x {shape_str(x_shape)}, weight {shape_str(w_shape)}, "
                         f"padding {padding!r}, dilation {dil})")
    out_hw = ((padded[0] - span[0]) // st[0] + 1, (padded[1] - span[1]) // st[1] + 1)
    return K.ConvGeometry(st, (pads[0], pads[2]), dil, int(groups), out_hw)


def _check_same_dtype(op: str, **tensors) -> None:
    named = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{op}: {first_name} has dtype {dtype_name(first.dtype)} but {name} has "
                            f"{dtype_name(t.dtype)} (shapes {shape_str(first.shape)}, {shape_str(t.shape)})")


def _check_bias(op: str, bias, weight) -> None:
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{op}: bias must be [{weight.shape[0]}] (one per output channel of weight "
                         f"{shape_str(weight.shape)}), got {shape_str(bias.shape)}")


def _check_conv2d(op: str, x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, act="none",
                  act_alpha=0.01, save_z=False) -> None:
    _check_same_dtype(op, x=x, weight=weight, bias=bias)
    _check_bias(op, bias, weight)
    conv_geometry(op, tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    activations.act_code(op, act, act_alpha)


_CONV_INPUTS = (TensorArg("x", CONV_DTYPES, ndim=(4,)), TensorArg("weight", CONV_DTYPES, ndim=(4,)))

defop("conv2d", Schema(_CONV_INPUTS + (TensorArg("bias", CONV_DTYPES, ndim=(1,), optional=True),), _check_conv2d))


@register("conv2d", "triton", dtypes=CONV_DTYPES)
def conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, act="none", act_alpha=0.01,
           save_z=False):
    geo = conv_geometry("conv2d", tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    return K.conv2d(x, weight, bias, geo, act=act, act_alpha=act_alpha, save_z=save_z)


def _check_conv2d_backward(op: str, gy, x, weight, saved=None, *, stride=1, padding=0, dilation=1, groups=1,
                           has_bias=False, act="none", act_alpha=0.01, from_z=False, need_x=True,
                           need_w=True) -> None:
    _check_same_dtype(op, x=x, weight=weight)
    geo = conv_geometry(op, tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    y_shape = (x.shape[0], weight.shape[0], *geo.out_hw)
    for name, t in (("gy", gy), ("saved", saved)):
        if t is not None and tuple(t.shape) != y_shape:
            raise ValueError(f"{op}: {name} has shape {shape_str(t.shape)} but the conv of x {shape_str(x.shape)} "
                             f"and weight {shape_str(weight.shape)} is {shape_str(y_shape)}")
    code = activations.act_code(op, act, act_alpha)
    if code != activations.NONE and saved is None:
        raise ValueError(f"{op}: the {act} gradient needs saved (z or y), got None")
    if from_z is False and activations.needs_z(code):
        raise ValueError(f"{op}: the {act} gradient needs z (conv2d(..., save_z=True)) with from_z=True")


defop("conv2d_backward", Schema((TensorArg("gy", CONV_DTYPES, ndim=(4,)),) + _CONV_INPUTS
                                + (TensorArg("saved", CONV_DTYPES, ndim=(4,), optional=True),), _check_conv2d_backward))


@register("conv2d_backward", "triton", dtypes=CONV_DTYPES)
def conv2d_backward(gy, x, weight, saved=None, *, stride=1, padding=0, dilation=1, groups=1, has_bias=False,
                    act="none", act_alpha=0.01, from_z=False, need_x=True, need_w=True):
    geo = conv_geometry("conv2d_backward", tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    return K.conv2d_backward(gy, x, weight, saved, geo, has_bias=has_bias, act=act, act_alpha=act_alpha,
                             from_z=from_z, need_x=need_x, need_w=need_w)
