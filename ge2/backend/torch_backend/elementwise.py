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
