"""``linear``: y = act(x @ W^T + b) as one GEMM-epilogue launch; backward is one "gemm_backward".

W is [out, in] like torch's Linear; it is read transposed through strides (``trans_b``), never
copied. x may have any leading dims ([..., in]); they are folded into the GEMM's M.
"""
from __future__ import annotations

from ge2 import backend
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import dtype_name, shape_str
from ge2.kernels import activations

call = backend.call


class Linear(Function):
    """y = act(x W^T + b): forward saves x, W and y (or z, the pre-activation, for gelu/silu)."""

    @staticmethod
    def forward(ctx, x, weight, bias, act, act_alpha, weight_low):
        # weight_low: autocast's cached low-precision copy of an fp32 weight; the GEMMs read it, and the
        # weight's gradient leaves the accumulator in fp32, so no cast runs either way
        w = weight if weight_low is None else weight_low
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, x.shape[-1])
        bias_kind = "per_n" if bias is not None else "none"
        save = True in ctx.needs_input_grad[:3]
        from_z = save and activations.needs_z(activations.act_code("linear", act, act_alpha))
        y, z = call("gemm", x2, w, None, bias, trans_b=True, bias_kind=bias_kind, act=act,
                    act_alpha=act_alpha, save_z=from_z)
        if save:
            ctx.save_for_backward(x2, w, z if from_z else y)
            ctx.lead, ctx.bias_kind, ctx.act, ctx.act_alpha, ctx.from_z = x.shape[:-1], bias_kind, act, act_alpha, from_z
            ctx.weight_dtype = weight.dtype
        return y if flat else y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x2, w, saved = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gy2 = gy if len(ctx.lead) == 1 else gy.reshape(-1, w.shape[0])
        dx, dw, dbias, _ = call(
            "gemm_backward", gy2, x2, w, saved if ctx.from_z else None, None if ctx.from_z else saved,
            trans_b=True, bias_kind=ctx.bias_kind, act=ctx.act, act_alpha=ctx.act_alpha,
            need_a=need_x, need_b=need_w, db_dtype=ctx.weight_dtype if ctx.weight_dtype != w.dtype else None)
        if dx is not None and len(ctx.lead) != 1:
            dx = dx.reshape(*ctx.lead, w.shape[1])
        return dx, dw, (dbias if ctx.needs_input_grad[2] else None), None, None, None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None,
           negative_slope: float = 0.01) -> Tensor:
    """act(x [..., in] @ weight[out, in]^T + bias[out]) -> [..., out]: one fused GEMM-epilogue launch.

    ``activation``: None, "relu", "leaky_relu" (``negative_slope``), "gelu", "gelu_tanh", "sigmoid",
    "tanh" or "silu".
    """
    weight_low = None
    if _amp_state.on:
        weight_low = _amp.cached_low_copy(weight, x)
        if weight_low is None:
            x, weight, bias = _amp.cast_low(x, weight, bias)
        else:
            x, bias = _amp.cast_low(x, bias)
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor) and (bias is None or isinstance(bias, Tensor))
            and _well_formed(x.data, weight.data if weight_low is None else weight_low,
                             None if bias is None else bias.data)):
        _check(x, weight, bias)  # raises the error that says what is wrong
    act = activation or "none"
    activations.act_code("linear", act, negative_slope)
    if x.data.dim() == 1:
        return Linear.apply(x.reshape(1, -1), weight, bias, act, negative_slope, weight_low).reshape(-1)
    return Linear.apply(x, weight, bias, act, negative_slope, weight_low)


def _well_formed(x, weight, bias) -> bool:
    """The common case, tested in one expression (each check is spelled out with its message in _check)."""
    return (weight.dim() == 2 and x.dim() != 0 and x.shape[-1] == weight.shape[1] and weight.dtype == x.dtype
            and (bias is None or (bias.dim() == 1 and bias.shape[0] == weight.shape[0] and bias.dtype == x.dtype)))


def _check(x, weight, bias) -> None:
    """Raise the clear error for linear's arguments (only called when _well_formed says something is off)."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"linear: {name} must be a Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"linear: bias must be a Tensor or None, got {type(bias).__name__}")
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D [out, in], got shape {shape_str(weight.shape)}")
    if x.ndim == 0:
        raise ValueError("linear: x is 0-d; expected [..., in_features]")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x {shape_str(x.shape)} has {x.shape[-1]} features but weight "
                         f"{shape_str(weight.shape)} expects {weight.shape[1]}")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"linear: bias must be [{weight.shape[0]}] (one per output), got {shape_str(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"linear: x has dtype {dtype_name(x.dtype)} but {name} has {dtype_name(t.dtype)}")
