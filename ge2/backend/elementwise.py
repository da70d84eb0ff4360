"""Elementwise ops: schemas and Triton implementations (kernels in ``ge2.kernels.elementwise``).

All take torch tensors (any strides, NumPy broadcasting) or Python scalars where marked, and
return a new tensor of the broadcast shape, laid out like torch's result: in the memory order of the
first operand that spans the whole shape (a channels-last input gives a channels-last result),
row-major when that operand is contiguous or every operand broadcasts.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, broadcast_shapes, shape_str
from ge2.kernels import activations, elementwise as K

NUMERIC = FLOAT_DTYPES + INT_DTYPES


def _broadcastable(op: str, *operands, **_attrs) -> None:
    names = ("a", "b", "c")
    tensors = [(n, x) for n, x in zip(names, operands) if isinstance(x, torch.Tensor)]
    broadcast_shapes(op, [n for n, _ in tensors], [tuple(x.shape) for _, x in tensors])
    for n, x in zip(names, operands):
        # Integer scalars travel as int64 kernel arguments (exact integer math needs all the bits).
        if isinstance(x, int) and not -(2**63) <= x < 2**63:
            raise ValueError(f"{op}: scalar {n} = {x} does not fit in int64")


def _binary_schema(dtypes) -> Schema:
    return Schema((TensorArg("a", dtypes, scalar_ok=True), TensorArg("b", dtypes, scalar_ok=True)), _broadcastable)


# a (op) b with broadcasting and torch's type promotion.
for _name, _dtypes in (("add", NUMERIC), ("sub", NUMERIC), ("mul", NUMERIC), ("div", NUMERIC), ("pow", FLOAT_DTYPES)):
    defop(_name, _binary_schema(_dtypes))
    register(_name, "triton", dtypes=_dtypes)(lambda a, b, _op=_name: K.binary(_op, a, b))

# Comparisons: bool result, no gradient.
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    defop(_name, _binary_schema(ALL_DTYPES))
    register(_name, "triton", dtypes=ALL_DTYPES)(lambda a, b, _op=_name: K.compare(_op, a, b))


def _check_binary_backward(op: str, gy, a, b, *, op_name: str, need_a: bool = True, need_b: bool = True) -> None:
    if op_name not in K.BINARY_OPS:
        raise ValueError(f"{op}: op_name must be one of {tuple(K.BINARY_OPS)}, got {op_name!r}")
    tensors = [(n, x) for n, x in (("a", a), ("b", b)) if isinstance(x, torch.Tensor)]
    shape = broadcast_shapes(op, [n for n, _ in tensors], [tuple(x.shape) for _, x in tensors])
    if tensors and tuple(gy.shape) != shape:
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but a and b broadcast to {shape_str(shape)}")


# (ga, gb): the gradients of a (op) b w.r.t. a and b, summed back to their shapes (None for a scalar
# operand or when not needed).
defop("binary_backward", Schema(
    (TensorArg("gy", FLOAT_DTYPES), TensorArg("a", NUMERIC, scalar_ok=True), TensorArg("b", NUMERIC, scalar_ok=True)),
    _check_binary_backward,
))
register("binary_backward", "triton")(K.binary_backward)

# Unary math: y = f(x).
for _name in K.UNARY_OPS:
    defop(_name, Schema((TensorArg("x", FLOAT_DTYPES if _name not in ("neg", "abs") else NUMERIC),)))
    register(_name, "triton", dtypes=FLOAT_DTYPES if _name not in ("neg", "abs") else NUMERIC)(
        lambda x, _op=_name: K.unary(_op, x))


def _check_unary_backward(op: str, gy, x, y, *, op_name: str) -> None:
    if op_name not in K.UNARY_OPS:
        raise ValueError(f"{op}: op_name must be one of {tuple(K.UNARY_OPS)}, got {op_name!r}")
    needed = {"exp": ("y", y), "sqrt": ("y", y), "log": ("x", x), "abs": ("x", x)}.get(op_name)
    if needed is not None and needed[1] is None:
        raise ValueError(f"{op}: the {op_name} gradient needs {needed[0]}, got None")
    for name, t in (("x", x), ("y", y)):
        if t is not None and tuple(t.shape) != tuple(gy.shape):
            raise ValueError(f"{op}: {name} has shape {list(t.shape)} but gy has {list(gy.shape)}")


# gx = gy * f'(x), with f' read from x or from y = f(x) (whichever the op needs; pass both if unsure).
defop("unary_backward", Schema(
    (TensorArg("gy", FLOAT_DTYPES), TensorArg("x", FLOAT_DTYPES, optional=True), TensorArg("y", FLOAT_DTYPES, optional=True)),
    _check_unary_backward,
))
register("unary_backward", "triton")(K.unary_backward)


def _check_act(op: str, *tensors, act: str, alpha: float = 0.01, **_attrs) -> None:
    activations.act_code(op, act, alpha)


# y = act(x) for act in activations.ACTIVATIONS (relu, leaky_relu, gelu, gelu_tanh, sigmoid, tanh, silu).
defop("activation", Schema((TensorArg("x", FLOAT_DTYPES),), _check_act))
register("activation", "triton")(K.activation)


def _check_act_backward(op: str, gy, x, y, *, act: str, alpha: float = 0.01) -> None:
    code = activations.act_code(op, act, alpha)
    if activations.needs_z(code) and x is None:
        raise ValueError(f"{op}: the {act} gradient needs the input x, got None")
    if x is None and y is None:
        raise ValueError(f"{op}: pass x or y")


# gx = gy * act'(x); act' read from y when the activation allows it (activations.GRAD_FROM_Y).
defop("activation_backward", Schema(
    (TensorArg("gy", FLOAT_DTYPES), TensorArg("x", FLOAT_DTYPES, optional=True), TensorArg("y", FLOAT_DTYPES, optional=True)),
    _check_act_backward,
))
register("activation_backward", "triton")(K.activation_backward)


def _check_where(op: str, cond, a, b) -> None:
    broadcast_shapes(op, [n for n, x in (("cond", cond), ("a", a), ("b", b)) if isinstance(x, torch.Tensor)],
                     [tuple(x.shape) for x in (cond, a, b) if isinstance(x, torch.Tensor)])


# out = a where cond else b (broadcasting; a/b may be scalars).
defop("where", Schema(
    (TensorArg("cond", (torch.bool,)), TensorArg("a", ALL_DTYPES, scalar_ok=True), TensorArg("b", ALL_DTYPES, scalar_ok=True)),
    _check_where,
))
register("where", "triton", dtypes=(torch.bool,))(K.where)
