"""torch reference implementations of the elementwise ops."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ge2.backend.registry import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, register
from ge2.backend.schema import result_dtype

NUMERIC = FLOAT_DTYPES + INT_DTYPES

_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}


_SWAPPED = {"add": "add", "mul": "mul", "eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _binary(op):
    def impl(a, b):
        if isinstance(a, torch.Tensor):
            return _BINARY[op](a, b)
        # A scalar on the left: torch takes a Python scalar only on the right (where it stays in
        # opmath precision), so swap where the op allows; else compute as torch's GPU kernels do:
        # the scalar in opmath (fp32, fp64 for fp64), b cast to the result dtype, one rounding.
        if op in _SWAPPED:
            return _BINARY[_SWAPPED[op]](b, a)
        if op == "pow":
            return torch.pow(a, b)
        dt = result_dtype(a, b)
        if op == "div" and not dt.is_floating_point:
            dt = torch.get_default_dtype()
        opmath = torch.float64 if dt == torch.float64 else torch.float32 if dt.is_floating_point else dt
        out = _BINARY[op](torch.tensor(a, dtype=opmath, device=b.device), b.to(dt).to(opmath))
        return out.to(dt)
    return impl


for _op in ("add", "sub", "mul", "div"):
    register(_op, "torch", dtypes=NUMERIC)(_binary(_op))
register("pow", "torch")(_binary("pow"))
for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(_op, "torch", dtypes=ALL_DTYPES)(_binary(_op))


@register("binary_backward", "torch")
def binary_backward(gy, a, b, *, op_name, need_a=True, need_b=True):
    ta = a if isinstance(a, torch.Tensor) else None
    tb = b if isinstance(b, torch.Tensor) else None
    with torch.enable_grad():
        av = ta.detach().to(gy.dtype).requires_grad_(need_a) if ta is not None else a
        bv = tb.detach().to(gy.dtype).requires_grad_(need_b) if tb is not None else b
        y = _BINARY[op_name](av, bv)
        wrt = [v for v, need, t in ((av, need_a, ta), (bv, need_b, tb)) if need and t is not None]
        grads = list(torch.autograd.grad(y, wrt, gy.expand(y.shape))) if wrt else []
    ga = grads.pop(0).to(ta.dtype) if need_a and ta is not None else None
    gb = grads.pop(0).to(tb.dtype) if need_b and tb is not None else None
    return ga, gb


_UNARY = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs}
for _op in ("neg", "abs"):
    register(_op, "torch", dtypes=NUMERIC)(lambda x, _f=_UNARY[_op]: _f(x))
for _op in ("exp", "log", "sqrt"):
    register(_op, "torch")(lambda x, _f=_UNARY[_op]: _f(x))


@register("unary_backward", "torch")
def unary_backward(gy, x=None, y=None, *, op_name):
    if op_name == "neg":
        return -gy
    if op_name == "exp":
        return gy * y
    if op_name == "log":
        return gy / x
    if op_name == "sqrt":
        return gy / (2 * y)
    if op_name == "abs":
        return gy * torch.sign(x)
    raise ValueError(op_name)


_ACT = {
    "none": lambda x, a: x,
    "relu": lambda x, a: F.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a),
    "gelu": lambda x, a: F.gelu(x),
    "gelu_tanh": lambda x, a: F.gelu(x, approximate="tanh"),
    "sigmoid": lambda x, a: torch.sigmoid(x),
    "tanh": lambda x, a: torch.tanh(x),
    "silu": lambda x, a: F.silu(x),
}


@register("activation", "torch")
def activation(x, *, act, alpha=0.01):
    return _ACT[act](x, alpha)


@register("activation_backward", "torch")
def activation_backward(gy, x=None, y=None, *, act, alpha=0.01):
    if x is None:  # recover act' from y, as the triton kernel does
        return {
            "none": lambda: gy,
            "relu": lambda: gy * (y > 0),
            "leaky_relu": lambda: torch.where(y > 0, gy, gy * alpha),
            "sigmoid": lambda: gy * y * (1 - y),
            "tanh": lambda: gy * (1 - y * y),
        }[act]()
    with torch.enable_grad():
        xv = x.detach().requires_grad_()
        (gx,) = torch.autograd.grad(_ACT[act](xv, alpha), xv, gy)
    return gx


@register("where", "torch", dtypes=(torch.bool,))
def where(cond, a, b):
    dt = result_dtype(a, b)
    a = a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dt, device=cond.device)
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=dt, device=cond.device)
    return torch.where(cond, a.to(dt), b.to(dt))


# ---------------------------------------------------------------------------------------------
# Pointwise math: the oracles of the ops added with ge2.kernels.elementwise's pointwise math
# ---------------------------------------------------------------------------------------------
INTEGRAL = INT_DTYPES + (torch.bool,)


def _tensor_operands(a, b):
    """Both operands as tensors; a scalar becomes a 0-d tensor of its Python type's dtype, which
    promotes like the scalar (a 0-d tensor ranks with scalars in torch's promotion)."""
    def as_tensor(x, other):
        if isinstance(x, torch.Tensor):
            return x
        dt = torch.bool if isinstance(x, bool) else torch.int64 if isinstance(x, int) else torch.float64
        return torch.tensor(x, dtype=dt, device=other.device)
    return as_tensor(a, b), as_tensor(b, a)


def _scalar_binary(fn):
    def impl(a, b):
        dt = result_dtype(a, b)
        ta, tb = _tensor_operands(a, b)
        out = fn(ta, tb)
        # A scalar's float64 0-d tensor may widen the result: give it the dtype torch gives with the
        # scalar itself (bool results and atan2's float of integers stay as they are).
        if out.dtype == torch.bool or (out.is_floating_point() and not dt.is_floating_point):
            return out
        return out.to(dt)
    return impl


for _op, _fn, _dtypes in (
    ("maximum", torch.maximum, ALL_DTYPES), ("minimum", torch.minimum, ALL_DTYPES),
    ("fmod", torch.fmod, NUMERIC), ("remainder", torch.remainder, NUMERIC), ("atan2", torch.atan2, NUMERIC),
    ("logical_and", torch.logical_and, ALL_DTYPES), ("logical_or", torch.logical_or, ALL_DTYPES),
    ("logical_xor", torch.logical_xor, ALL_DTYPES), ("bitwise_and", torch.bitwise_and, INTEGRAL),
    ("bitwise_or", torch.bitwise_or, INTEGRAL), ("bitwise_xor", torch.bitwise_xor, INTEGRAL),
):
    register(_op, "torch", dtypes=_dtypes)(_scalar_binary(_fn))


for _op in ("add", "sub"):
    def _add_alpha(a, b, alpha=1, _op=_op):
        if alpha == 1:
            return _binary(_op)(a, b)
        if not isinstance(a, torch.Tensor):
            return _BINARY[_op](torch.tensor(a, dtype=b.dtype, device=b.device), b, alpha=alpha)
        return _BINARY[_op](a, b, alpha=alpha)
    register(_op, "torch", dtypes=NUMERIC)(_add_alpha)


@register("div", "torch", dtypes=NUMERIC)
def _div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return _binary("div")(a, b)
    dt = result_dtype(a, b)
    ta, tb = _tensor_operands(a, b)
    return torch.div(ta.to(dt), tb.to(dt), rounding_mode=rounding_mode)


_UNARY_MATH = {
    "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "log1p": torch.log1p,
    "expm1": torch.expm1, "log2": torch.log2, "exp2": torch.exp2, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "square": torch.square, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
}
for _op, _fn in _UNARY_MATH.items():
    register(_op, "torch", dtypes=INTEGRAL if _op == "bitwise_not" else NUMERIC if _op in ("floor", "ceil", "trunc") else ALL_DTYPES)(
        lambda x, _f=_fn: _f(x))


@register("round", "torch", dtypes=NUMERIC)
def _round(x, decimals=0):
    if not x.is_floating_point():
        return x.clone()  # integers are integral (torch's CPU kernel refuses them)
    return torch.round(x, decimals=decimals)


@register("nan_to_num", "torch", dtypes=ALL_DTYPES)
def _nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return torch.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


_UNARY_GRAD = {
    "log1p": lambda gy, x, y: gy / (1 + x), "expm1": lambda gy, x, y: gy * (y + 1),
    "log2": lambda gy, x, y: gy / (x * 0.6931471805599453), "exp2": lambda gy, x, y: gy * y * 0.6931471805599453,
    "rsqrt": lambda gy, x, y: -0.5 * gy * y ** 3, "reciprocal": lambda gy, x, y: -gy * y * y,
    "square": lambda gy, x, y: gy * 2 * x, "sin": lambda gy, x, y: gy * torch.cos(x),
    "cos": lambda gy, x, y: -gy * torch.sin(x), "erf": lambda gy, x, y: gy * 1.1283791670955126 * torch.exp(-x * x),
    "nan_to_num": lambda gy, x, y: gy * torch.isfinite(x),
}
_unary_backward_basic = unary_backward


@register("unary_backward", "torch")
def _unary_backward(gy, x=None, y=None, *, op_name):
    if op_name in ("sign", "floor", "ceil", "trunc", "round"):
        return torch.zeros_like(gy)
    if op_name in _UNARY_GRAD:
        return _UNARY_GRAD[op_name](gy, x, y)
    return _unary_backward_basic(gy, x, y, op_name=op_name)


_ACT_EX = {
    "mish": lambda x, a, b, c: F.mish(x),
    "softplus": lambda x, a, b, c: F.softplus(x, beta=a, threshold=b),
    "elu": lambda x, a, b, c: torch.ops.aten.elu(x, a, b, c),
    "hardswish": lambda x, a, b, c: F.hardswish(x),
    "hardtanh": lambda x, a, b, c: F.hardtanh(x, a, b),
    "logsigmoid": lambda x, a, b, c: F.logsigmoid(x),
}
_activation_basic, _activation_backward_basic = activation, activation_backward


@register("activation", "torch")
def _activation(x, *, act, alpha=0.01, beta=0.0, gamma=0.0):
    if act in _ACT_EX:
        return _ACT_EX[act](x, alpha, beta, gamma)
    return _activation_basic(x, act=act, alpha=alpha)


@register("activation_backward", "torch")
def _activation_backward(gy, x=None, y=None, *, act, alpha=0.01, beta=0.0, gamma=0.0):
    if act not in _ACT_EX:
        return _activation_backward_basic(gy, x, y, act=act, alpha=alpha)
    with torch.enable_grad():
        xv = x.detach().requires_grad_()
        (gx,) = torch.autograd.grad(_ACT_EX[act](xv, alpha, beta, gamma), xv, gy)
    return gx


def _clamp(x, lo=None, hi=None):
    dt = result_dtype(*[v for v in (x, lo, hi) if v is not None])
    def bound(v):
        return v.to(dt) if isinstance(v, torch.Tensor) else v
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        lo_t = bound(lo) if not isinstance(lo, (int, float)) else torch.tensor(lo, dtype=dt, device=x.device)
        hi_t = bound(hi) if not isinstance(hi, (int, float)) else torch.tensor(hi, dtype=dt, device=x.device)
        return torch.clamp(x.to(dt), lo_t, hi_t)
    return torch.clamp(x.to(dt), lo, hi)


_TERNARY = {
    "clamp": lambda a, b, c, value: _clamp(a, b, c),
    "lerp": lambda a, b, c, value: torch.lerp(a, b, c),
    "addcmul": lambda a, b, c, value: torch.addcmul(a, b, c, value=value),
    "addcdiv": lambda a, b, c, value: torch.addcdiv(a, b, c, value=value),
}
for _op, _fn in _TERNARY.items():
    register(_op, "torch", dtypes=FLOAT_DTYPES if _op == "lerp" else NUMERIC)(
        lambda a, b, c, value=1, _f=_fn: _f(a, b, c, value))


@register("ternary_backward", "torch")
def ternary_backward(gy, a, b, c, *, op_name, value=1, need_a=True, need_b=True, need_c=True):
    operands = [a, b, c]
    with torch.enable_grad():
        leaves = [x.detach().to(gy.dtype).requires_grad_(need) if isinstance(x, torch.Tensor) else x
                  for x, need in zip(operands, (need_a, need_b, need_c))]
        y = _TERNARY[op_name](*leaves, value)
        wrt = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
        grads = list(torch.autograd.grad(y, wrt, gy)) if wrt else []
    return tuple(grads.pop(0).to(x.dtype) if isinstance(v, torch.Tensor) and v.requires_grad else None
                 for x, v in zip(operands, leaves))


@register("glu", "torch")
def _glu(x, dim):
    return F.glu(x, dim)


@register("glu_backward", "torch")
def _glu_backward(x, gy, dim):
    with torch.enable_grad():
        xv = x.detach().requires_grad_()
        (gx,) = torch.autograd.grad(F.glu(xv, dim), xv, gy)
    return gx
