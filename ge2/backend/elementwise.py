"""Elementwise ops: schemas and Triton implementations (kernels in ``ge2.kernels.elementwise``).

All take torch tensors (any strides, NumPy broadcasting) or Python scalars where marked, and
return a new tensor of the broadcast shape, laid out like torch's result: in the memory order of the
first operand that spans the whole shape (a channels-last input gives a channels-last result),
row-major when that operand is contiguous or every operand broadcasts.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, broadcast_shapes, dtype_name, normalize_dims, shape_str
from ge2.kernels import activations, elementwise as K

NUMERIC = FLOAT_DTYPES + INT_DTYPES
INTEGRAL = INT_DTYPES + BOOL_DTYPES

# Which dtypes each unary op takes (torch's): the transcendental ones take integers and bool too
# (computing in the default float), rounding and negation no bool, bitwise_not no floats.
UNARY_DTYPES = {name: ALL_DTYPES for name in K.UNARY_OPS}
UNARY_DTYPES.update({name: NUMERIC for name in ("neg", "abs", "floor", "ceil", "trunc", "round")})
UNARY_DTYPES["bitwise_not"] = INTEGRAL


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


def _is_integral(*operands) -> bool:
    """Whether the promoted dtype of the operands is an integer or bool one (not a float)."""
    from ge2.backend.schema import result_dtype

    return not result_dtype(*operands).is_floating_point


def _check_add(op: str, a, b, *, alpha=1) -> None:
    _broadcastable(op, a, b)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"{op}: alpha must be a number, got {type(alpha).__name__}")
    if isinstance(alpha, float) and _is_integral(a, b):
        raise TypeError(f"{op}: for integer tensors, alpha must not be a float, got {alpha}")


def _check_div(op: str, a, b, *, rounding_mode=None) -> None:
    _broadcastable(op, a, b)
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"{op}: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def _check_integral_scalars(op: str, a, b) -> None:
    _broadcastable(op, a, b)
    for n, x in (("a", a), ("b", b)):
        if isinstance(x, float):
            raise TypeError(f"{op}: is defined for integer and bool operands, got the float scalar {n} = {x}")


# a (op) b with broadcasting and torch's type promotion.
defop("add", Schema(_binary_schema(NUMERIC).inputs, _check_add))
defop("sub", Schema(_binary_schema(NUMERIC).inputs, _check_add))
defop("div", Schema(_binary_schema(NUMERIC).inputs, _check_div))
for _name in ("add", "sub"):
    register(_name, "triton", dtypes=NUMERIC)(lambda a, b, alpha=1, _op=_name: K.binary(_op, a, b, alpha=alpha))
register("div", "triton", dtypes=NUMERIC)(lambda a, b, rounding_mode=None: K.binary("div", a, b, rounding_mode=rounding_mode))
for _name, _dtypes in (("mul", NUMERIC), ("pow", FLOAT_DTYPES), ("maximum", ALL_DTYPES), ("minimum", ALL_DTYPES),
                       ("fmod", NUMERIC), ("remainder", NUMERIC), ("atan2", NUMERIC),
                       *((_op, ALL_DTYPES) for _op in K.LOGICAL_OPS)):
    defop(_name, _binary_schema(_dtypes))
    register(_name, "triton", dtypes=_dtypes)(lambda a, b, _op=_name: K.binary(_op, a, b))
for _name in K.BITWISE_OPS:
    defop(_name, Schema(_binary_schema(INTEGRAL).inputs, _check_integral_scalars))
    register(_name, "triton", dtypes=INTEGRAL)(lambda a, b, _op=_name: K.binary(_op, a, b))

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

def _check_unary(op: str, x, *, decimals: int = 0, nan=0.0, posinf=None, neginf=None) -> None:
    if not isinstance(decimals, int) or isinstance(decimals, bool):
        raise TypeError(f"{op}: decimals must be an int, got {type(decimals).__name__}")
    if decimals != 0 and not x.is_floating_point():
        raise TypeError(f"{op}: decimals is only supported for floating-point tensors, got {x.dtype}")
    for name, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and not isinstance(v, (int, float)):
            raise TypeError(f"{op}: {name} must be a number or None, got {type(v).__name__}")


# Unary math: y = f(x) (round takes decimals=, nan_to_num nan=, posinf=, neginf=).
for _name in K.UNARY_OPS:
    defop(_name, Schema((TensorArg("x", UNARY_DTYPES[_name]),), _check_unary))
    register(_name, "triton", dtypes=UNARY_DTYPES[_name])(lambda x, _op=_name, **attrs: K.unary(_op, x, **attrs))


def _check_unary_backward(op: str, gy, x, y, *, op_name: str) -> None:
    if op_name not in K.UNARY_GRAD_SAVES and op_name not in K.ZERO_GRAD_OPS and op_name != "neg":
        raise ValueError(f"{op}: op_name must be one of {('neg', *K.UNARY_GRAD_SAVES, *K.ZERO_GRAD_OPS)}, "
                         f"got {op_name!r}")
    saves = K.UNARY_GRAD_SAVES.get(op_name)
    needed = (saves, x if saves == "x" else y) if saves else None
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
    if act in activations.POINTWISE_ACTIVATIONS:
        return
    activations.act_code(op, act, alpha)


# y = act(x) for act in activations.ACTIVATIONS (relu, leaky_relu, gelu, gelu_tanh, sigmoid, tanh, silu)
# or activations.POINTWISE_ACTIVATIONS (mish, softplus, elu, hardswish, hardtanh, logsigmoid; their
# parameters alpha, beta, gamma).
defop("activation", Schema((TensorArg("x", FLOAT_DTYPES),), _check_act))
register("activation", "triton")(K.activation)


def _check_act_backward(op: str, gy, x, y, *, act: str, alpha: float = 0.01, **_params) -> None:
    if act in activations.POINTWISE_ACTIVATIONS:
        if x is None:
            raise ValueError(f"{op}: the {act} gradient needs the input x, got None")
        return
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


def _check_ternary(op: str, a, b, c, **_attrs) -> None:
    names = {"clamp": ("x", "min", "max"), "lerp": ("input", "end", "weight")}.get(op, ("input", "tensor1", "tensor2"))
    present = [(n, x) for n, x in zip(names, (a, b, c)) if isinstance(x, torch.Tensor)]
    broadcast_shapes(op, [n for n, _ in present], [tuple(x.shape) for _, x in present])
    if op == "clamp" and b is None and c is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if op == "lerp":
        for n, x in present[1:]:
            if x.dtype != a.dtype:
                raise TypeError(f"lerp: expected {n} of dtype {dtype_name(a.dtype)}, got {dtype_name(x.dtype)}")
    if op in ("addcmul", "addcdiv"):
        value = _attrs.get("value", 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{op}: value must be a number, got {type(value).__name__}")
        if isinstance(value, float) and _is_integral(a, b, c):
            raise TypeError(f"{op}: for integer tensors, value must not be a float, got {value}")
    if op == "addcdiv" and not b.is_floating_point() and not c.is_floating_point():
        raise TypeError("addcdiv: integer division (tensor1 and tensor2 both of integer dtypes) is not "
                        "supported; use input + value * tensor1 / tensor2")


# clamp(x, min, max) (either bound None or a scalar), lerp(start, end, weight) (weight may be a
# scalar), addcmul / addcdiv(x, t1, t2, value=): x + value * t1 * t2 (or / t2).
_TERNARY_ARGS = {
    "clamp": (TensorArg("x", NUMERIC), TensorArg("min", NUMERIC, optional=True, scalar_ok=True),
              TensorArg("max", NUMERIC, optional=True, scalar_ok=True)),
    "lerp": (TensorArg("input", FLOAT_DTYPES), TensorArg("end", FLOAT_DTYPES),
             TensorArg("weight", FLOAT_DTYPES, scalar_ok=True)),
    "addcmul": (TensorArg("input", NUMERIC), TensorArg("tensor1", NUMERIC), TensorArg("tensor2", NUMERIC)),
    "addcdiv": (TensorArg("input", NUMERIC), TensorArg("tensor1", NUMERIC), TensorArg("tensor2", NUMERIC)),
}
for _name, _args in _TERNARY_ARGS.items():
    defop(_name, Schema(_args, _check_ternary))
    register(_name, "triton", dtypes=_args[0].dtypes)(lambda a, b, c, _op=_name, **attrs: K.ternary(_op, a, b, c, **attrs))


def _check_ternary_backward(op: str, gy, a, b, c, *, op_name: str, **_attrs) -> None:
    if op_name not in K.TERNARY_OPS:
        raise ValueError(f"{op}: op_name must be one of {K.TERNARY_OPS}, got {op_name!r}")
    present = [(n, x) for n, x in (("a", a), ("b", b), ("c", c)) if isinstance(x, torch.Tensor)]
    shape = broadcast_shapes(op, [n for n, _ in present], [tuple(x.shape) for _, x in present])
    if tuple(gy.shape) != shape:
        raise ValueError(f"{op}: gy has shape {shape_str(gy.shape)} but the operands broadcast to {shape_str(shape)}")


# (ga, gb, gc): the gradients of a ternary op, summed back to the operands' shapes (None for scalars,
# absent operands and those not needed).
defop("ternary_backward", Schema(
    (TensorArg("gy", FLOAT_DTYPES), TensorArg("a", NUMERIC, scalar_ok=True),
     TensorArg("b", NUMERIC, optional=True, scalar_ok=True), TensorArg("c", NUMERIC, optional=True, scalar_ok=True)),
    _check_ternary_backward,
))
register("ternary_backward", "triton")(K.ternary_backward)


def _check_glu(op: str, x, *rest, dim: int) -> None:
    if x.dim() == 0:
        raise ValueError(f"{op}: glu does not take a 0-d tensor")
    (d,) = normalize_dims(op, dim, x.dim())
    if x.shape[d] % 2:
        raise ValueError(f"{op}: the halved dim {dim} must have an even size, got {x.shape[d]} (x {shape_str(x.shape)})")
    if rest and rest[0] is not None:
        half = list(x.shape)
        half[d] //= 2
        if list(rest[0].shape) != half:
            raise ValueError(f"{op}: gy has shape {shape_str(rest[0].shape)}, expected {shape_str(half)}")


# glu(x, dim) = a * sigmoid(b) over the halves a, b of x along dim; glu_backward(x, gy, dim) -> gx.
defop("glu", Schema((TensorArg("x", FLOAT_DTYPES),), _check_glu))
register("glu", "triton")(lambda x, dim: K.glu(x, normalize_dims("glu", dim, x.dim())[0]))
defop("glu_backward", Schema((TensorArg("x", FLOAT_DTYPES), TensorArg("gy", FLOAT_DTYPES)), _check_glu))
register("glu_backward", "triton")(lambda x, gy, dim: K.glu_backward(gy, x, normalize_dims("glu", dim, x.dim())[0]))
