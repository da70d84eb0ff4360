"""The core tensor ops with gradients: each Function's forward and backward side by side.

Elementwise arithmetic (with NumPy broadcasting; gradients summed back to each input's shape),
unary math and activations, reductions, comparisons and ``where``, and the view/shape ops. All
arithmetic goes through ``ge2.backend.call``; view ops only re-stride torch tensors.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch

from ge2 import backend, runtime
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd import grad_mode
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor, _check_inplace, parse_to_args
from ge2.backend.schema import broadcast_shapes, dtype_name, normalize_dims, shape_str

call = backend.call
Operand = "Tensor | float | int | bool"


def sum_to_shape(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum a broadcast gradient back to ``shape`` (leading dims and size-1 dims), one reduction."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    if dims:
        g = call("sum", g, dims=dims, keepdim=True)
    return g.reshape(shape)


def _operand(x, op: str):
    if isinstance(x, Tensor) or isinstance(x, numbers.Number):
        return x
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: got a torch.Tensor; wrap it with ge2.from_torch(t)")
    raise TypeError(f"{op}: unsupported operand type {type(x).__name__}")


# ---------------------------------------------------------------------------------------------
# binary arithmetic
# ---------------------------------------------------------------------------------------------
class Add(Function):
    """a + b; Sub flips the sign of b's gradient. Neither needs its operands for backward."""

    op_name, b_sign = "add", 1

    @classmethod
    def forward(cls, ctx, a, b):
        if True in ctx.needs_input_grad:
            ctx.shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in (a, b)]
        return call(cls.op_name, a, b)

    @classmethod
    def backward(cls, ctx, gy):
        sa, sb = ctx.shapes
        ga = sum_to_shape(gy, sa) if ctx.needs_input_grad[0] else None
        gb = sum_to_shape(gy, sb) if ctx.needs_input_grad[1] else None
        if gb is not None and cls.b_sign < 0:
            gb = call("neg", gb)
        return ga, gb


class Sub(Add):
    op_name, b_sign = "sub", -1


class _ProductLike(Function):
    """mul, div, pow: the gradient needs both operands; one fused backward kernel gives both."""

    op_name = ""

    @classmethod
    def forward(cls, ctx, a, b):
        ctx.save_for_backward(a if isinstance(a, torch.Tensor) else None, b if isinstance(b, torch.Tensor) else None)
        ctx.scalars = (a, b)
        return call(cls.op_name, a, b)

    @classmethod
    def backward(cls, ctx, gy):
        sa, sb = ctx.saved_tensors
        a = sa if sa is not None else ctx.scalars[0]
        b = sb if sb is not None else ctx.scalars[1]
        need_a, need_b = ctx.needs_input_grad
        return call("binary_backward", gy, a, b, op_name=cls.op_name, need_a=need_a, need_b=need_b)


class Mul(_ProductLike):
    op_name = "mul"


class Div(_ProductLike):
    op_name = "div"


class Pow(_ProductLike):
    op_name = "pow"


class AddScaled(Function):
    """a + alpha * b (or a - alpha * b) in one kernel, torch's add/sub with ``alpha``."""

    @staticmethod
    def forward(ctx, a, b, alpha, op):
        if True in ctx.needs_input_grad:
            ctx.shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in (a, b)]
            ctx.scale = alpha if op == "add" else -alpha
        return call(op, a, b, alpha=alpha)

    @staticmethod
    def backward(ctx, gy):
        sa, sb = ctx.shapes
        ga = sum_to_shape(gy, sa) if ctx.needs_input_grad[0] else None
        gb = call("mul", sum_to_shape(gy, sb), ctx.scale) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None


def add(a, b, *, alpha=1) -> Tensor:
    """a + alpha * b with broadcasting; either may be a Python number."""
    if alpha != 1 or type(alpha) is float:
        return AddScaled.apply(_operand(a, "add"), _operand(b, "add"), alpha, "add")
    return Add.apply(a if type(a) is Tensor else _operand(a, "add"),
                     b if type(b) is Tensor else _operand(b, "add"))


def sub(a, b, *, alpha=1) -> Tensor:
    """a - alpha * b with broadcasting."""
    if alpha != 1 or type(alpha) is float:
        return AddScaled.apply(_operand(a, "sub"), _operand(b, "sub"), alpha, "sub")
    return Sub.apply(a if type(a) is Tensor else _operand(a, "sub"),
                     b if type(b) is Tensor else _operand(b, "sub"))


def mul(a, b) -> Tensor:
    """a * b with broadcasting."""
    return Mul.apply(a if type(a) is Tensor else _operand(a, "mul"),
                     b if type(b) is Tensor else _operand(b, "mul"))


class DivRounded(Function):
    """a / b rounded toward zero or down (torch's rounding_mode): a zero gradient, as in torch."""

    @staticmethod
    def forward(ctx, a, b, rounding_mode):
        ctx.operands = [(tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else None for x in (a, b)]
        return call("div", a, b, rounding_mode=rounding_mode)

    @staticmethod
    def backward(ctx, gy):
        grads = [torch.zeros(m[0], dtype=m[1], device=m[2]) if m is not None and need else None
                 for m, need in zip(ctx.operands, ctx.needs_input_grad)]
        return grads[0], grads[1], None


def div(a, b, *, rounding_mode: str | None = None) -> Tensor:
    """a / b with broadcasting: true division, or rounded with rounding_mode "trunc" / "floor"."""
    if rounding_mode is not None:
        return DivRounded.apply(_operand(a, "div"), _operand(b, "div"), rounding_mode)
    return Div.apply(a if type(a) is Tensor else _operand(a, "div"),
                     b if type(b) is Tensor else _operand(b, "div"))


def floor_divide(a, b) -> Tensor:
    """a // b: a / b rounded down (torch.floor_divide)."""
    return div(a, b, rounding_mode="floor")


def pow(a, b) -> Tensor:  # noqa: A001 (torch's name)
    """a ** b with broadcasting."""
    if _amp_state.on:
        a, b = _amp.cast_fp32(a, b)
    return Pow.apply(a if type(a) is Tensor else _operand(a, "pow"),
                     b if type(b) is Tensor else _operand(b, "pow"))


# ---------------------------------------------------------------------------------------------
# unary math and activations
# ---------------------------------------------------------------------------------------------
class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return call("neg", x)

    @staticmethod
    def backward(ctx, gy):
        return call("neg", gy)


class _UnaryMath(Function):
    """exp, log, sqrt, abs: f'(x) from the saved x or y, whichever the op needs."""

    op_name = ""
    saves = "x"

    @classmethod
    def forward(cls, ctx, x):
        y = call(cls.op_name, x)
        ctx.save_for_backward(x if cls.saves == "x" else y)
        return y

    @classmethod
    def backward(cls, ctx, gy):
        (s,) = ctx.saved_tensors
        if cls.saves == "x":
            return call("unary_backward", gy, s, None, op_name=cls.op_name)
        return call("unary_backward", gy, None, s, op_name=cls.op_name)


class Exp(_UnaryMath):
    op_name, saves = "exp", "y"


class Log(_UnaryMath):
    op_name, saves = "log", "x"


class Sqrt(_UnaryMath):
    op_name, saves = "sqrt", "y"


class Abs(_UnaryMath):
    op_name, saves = "abs", "x"


class Activation(Function):
    """y = act(x); backward reads act' from y where it can (relu, leaky, sigmoid, tanh), else x."""

    @staticmethod
    def forward(ctx, x, act, alpha):
        from ge2.kernels.activations import ACTIVATIONS, GRAD_FROM_Y

        y = call("activation", x, act=act, alpha=alpha)
        ctx.act, ctx.alpha = act, alpha
        ctx.from_y = ACTIVATIONS.get(act) in GRAD_FROM_Y
        ctx.save_for_backward(y if ctx.from_y else x)
        return y

    @staticmethod
    def backward(ctx, gy):
        (s,) = ctx.saved_tensors
        x, y = (None, s) if ctx.from_y else (s, None)
        return call("activation_backward", gy, x, y, act=ctx.act, alpha=ctx.alpha), None, None


def neg(x: Tensor) -> Tensor:
    return Neg.apply(x)


def exp(x: Tensor) -> Tensor:
    if _amp_state.on:
        (x,) = _amp.cast_fp32(x)
    return Exp.apply(x)


def log(x: Tensor) -> Tensor:
    if _amp_state.on:
        (x,) = _amp.cast_fp32(x)
    return Log.apply(x)


def sqrt(x: Tensor) -> Tensor:
    return Sqrt.apply(x)


def abs(x: Tensor) -> Tensor:  # noqa: A001
    return Abs.apply(x)


def activation(x: Tensor, act: str, alpha: float = 0.01) -> Tensor:
    """act(x) for act in relu, leaky_relu (slope alpha), gelu, gelu_tanh, sigmoid, tanh, silu."""
    return Activation.apply(x, act, alpha)


def relu(x: Tensor) -> Tensor:
    return Activation.apply(x, "relu", 0.01)


def sigmoid(x: Tensor) -> Tensor:
    return Activation.apply(x, "sigmoid", 0.01)


def tanh(x: Tensor) -> Tensor:
    return Activation.apply(x, "tanh", 0.01)


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------
def _keepdim_shape(shape, dims) -> tuple[int, ...]:
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        ctx.shape = tuple(x.shape)
        ctx.dims = normalize_dims("sum", dims, x.dim())
        return call("sum", x, dims=dims, keepdim=keepdim)

    @staticmethod
    def backward(ctx, gy):
        # d sum / dx broadcasts gy back: a stride-0 view, no kernel needed.
        return gy.reshape(_keepdim_shape(ctx.shape, ctx.dims)).expand(ctx.shape), None, None


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        ctx.shape = tuple(x.shape)
        ctx.dims = normalize_dims("mean", dims, x.dim())
        ctx.count = 1
        for d in ctx.dims if x.dim() else ():  # a 0-d x takes dim 0 / -1 and is its own mean
            ctx.count *= x.shape[d]
        return call("mean", x, dims=dims, keepdim=keepdim)

    @staticmethod
    def backward(ctx, gy):
        g = call("div", gy, ctx.count) if ctx.count != 1 else gy
        return g.reshape(_keepdim_shape(ctx.shape, ctx.dims)).expand(ctx.shape), None, None


class Amax(Function):
    """max over dims (or all): ties share the gradient evenly, like torch.amax / Tensor.max()."""

    @staticmethod
    def forward(ctx, x, dims, keepdim):
        y = call("amax", x, dims=dims, keepdim=keepdim)
        ctx.dims = normalize_dims("amax", dims, x.dim())
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, y = ctx.saved_tensors
        keep = _keepdim_shape(x.shape, ctx.dims)
        hit = call("eq", x, y.reshape(keep))
        count = call("sum", hit, dims=ctx.dims, keepdim=True)
        return call("where", hit, call("div", gy.reshape(keep), count), 0.0), None, None


class MaxDim(Function):
    """(values, indices) of the max along one dim; the gradient goes to the returned index."""

    @staticmethod
    def forward(ctx, x, dim, keepdim):
        values, indices = call("max", x, dim=dim, keepdim=keepdim)
        ctx.mark_non_differentiable(indices)
        ctx.dim = normalize_dims("max", dim, x.dim())[0] if x.dim() else 0
        ctx.shape = tuple(x.shape)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, gy, _gi):
        (indices,) = ctx.saved_tensors
        if not ctx.shape:
            return gy.reshape(()), None, None
        keep = _keepdim_shape(ctx.shape, (ctx.dim,))
        along = [1] * len(ctx.shape)
        along[ctx.dim] = ctx.shape[ctx.dim]
        positions = torch.arange(ctx.shape[ctx.dim], device=gy.device).reshape(along)
        hit = call("eq", positions, indices.reshape(keep))
        return call("where", hit, gy.reshape(keep), 0.0), None, None


def sum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (int, tuple or None = all)."""
    if _amp_state.on:
        (x,) = _amp.cast_fp32(x)
    return Sum.apply(x, dim, keepdim)


def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over ``dim`` (int, tuple or None = all)."""
    return Mean.apply(x, dim, keepdim)


def amax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Max values over ``dim`` (int, tuple or None = all); NaN propagates."""
    return Amax.apply(x, dim, keepdim)


def max(x: Tensor, dim: "int | Tensor | None" = None, keepdim: bool = False):  # noqa: A001
    """``max(x)``: the largest element; ``max(x, dim)``: (values, indices) like torch;
    ``max(x, other)`` with a Tensor ``other``: the elementwise maximum."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return Amax.apply(x, None, False)
    values, indices = MaxDim.apply(x, dim, keepdim)
    return torch.return_types.max((values, indices))


# ---------------------------------------------------------------------------------------------
# comparisons and where
# ---------------------------------------------------------------------------------------------
def compare(op: str, a, b) -> Tensor:
    """Elementwise comparison (eq ne lt le gt ge) -> bool tensor; no gradient."""
    a, b = _operand(a, op), _operand(b, op)
    return Tensor(call(op, a.data if isinstance(a, Tensor) else a, b.data if isinstance(b, Tensor) else b))


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        ctx.shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in (a, b)]
        return call("where", cond, a, b)

    @staticmethod
    def backward(ctx, gy):
        (cond,) = ctx.saved_tensors
        sa, sb = ctx.shapes
        ga = sum_to_shape(call("where", cond, gy, 0.0), sa) if ctx.needs_input_grad[1] else None
        gb = sum_to_shape(call("where", cond, 0.0, gy), sb) if ctx.needs_input_grad[2] else None
        return None, ga, gb


def where(cond: Tensor, a, b) -> Tensor:
    """Elementwise ``a if cond else b`` with broadcasting; a/b may be numbers."""
    if not isinstance(cond, Tensor):
        raise TypeError(f"where: cond must be a Tensor, got {type(cond).__name__}")
    return Where.apply(cond, _operand(a, "where"), _operand(b, "where"))


# ---------------------------------------------------------------------------------------------
# views and shape ops (torch re-strides; no arithmetic)
# ---------------------------------------------------------------------------------------------
def _infer_shape(op: str, shape, numel: int) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension can be inferred, got {shape_str(shape)}")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise ValueError(f"{op}: invalid size {s} in {shape_str(shape)}")
            known *= s
    if -1 in shape:
        if known == 0 or numel % known:
            raise ValueError(f"{op}: shape {shape_str(shape)} is invalid for input of size {numel}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    elif known != numel:
        raise ValueError(f"{op}: shape {shape_str(shape)} is invalid for input of size {numel}")
    return shape


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape, must_view):
        ctx.shape = tuple(x.shape)
        shape = _infer_shape("view" if must_view else "reshape", shape, x.numel())
        if must_view:
            try:
                return x.view(shape)
            except RuntimeError as e:
                raise ValueError(
                    f"view: cannot view a tensor of shape {list(x.shape)} and strides {list(x.stride())} "
                    f"as {shape_str(shape)} without a copy; use reshape"
                ) from e
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, gy):
        return gy.reshape(ctx.shape), None, None


class Permute(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = [0] * len(dims)
        for i, d in enumerate(dims):
            ctx.inverse[d] = i
        return x.permute(dims)

    @staticmethod
    def backward(ctx, gy):
        return gy.permute(ctx.inverse), None


class Expand(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = tuple(x.shape)
        return x.expand(shape)

    @staticmethod
    def backward(ctx, gy):
        return sum_to_shape(gy, ctx.shape), None


class Restride(Function):
    """squeeze/unsqueeze and friends: a view whose gradient is gy reshaped back."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.shape = tuple(x.shape)
        return fn(x)

    @staticmethod
    def backward(ctx, gy):
        return gy.reshape(ctx.shape), None


class Index(Function):
    """Basic indexing (ints, slices, None, Ellipsis): a view; the gradient scatters into zeros."""

    @staticmethod
    def forward(ctx, x, key):
        ctx.shape, ctx.dtype, ctx.key = tuple(x.shape), x.dtype, key
        return x[key]

    @staticmethod
    def backward(ctx, gy):
        gx = torch.zeros(ctx.shape, dtype=gy.dtype, device=gy.device)
        gx[ctx.key] = gy
        return gx, None


class Copy(Function):
    """clone / contiguous / dtype and device casts: a copy whose gradient is copied back."""

    @staticmethod
    def forward(ctx, x, dtype, device, memory_format):
        ctx.dtype, ctx.device = x.dtype, x.device
        # torch's rule: preserve_format keeps a dense input's strides, else the named layout
        out = torch.empty_like(x, dtype=dtype, device=device, memory_format=memory_format)
        out.copy_(x)
        return out

    @staticmethod
    def backward(ctx, gy):
        return gy.to(device=ctx.device, dtype=ctx.dtype), None, None, None


class Cat(Function):
    @staticmethod
    def forward(ctx, dim, *xs):
        ctx.dim, ctx.sizes = dim, [x.shape[dim] for x in xs]
        shape = list(xs[0].shape)
        shape[dim] = 0
        for s in ctx.sizes:
            shape[dim] += s
        out = torch.empty(shape, dtype=xs[0].dtype, device=xs[0].device)
        start = 0
        for x, s in zip(xs, ctx.sizes):
            out.narrow(dim, start, s).copy_(x)
            start += s
        return out

    @staticmethod
    def backward(ctx, gy):
        grads, start = [], 0
        for need, s in zip(ctx.needs_input_grad[1:], ctx.sizes):
            grads.append(gy.narrow(ctx.dim, start, s) if need else None)
            start += s
        return (None, *grads)


def _norm_dim(op: str, dim: int, ndim: int) -> int:
    return normalize_dims(op, dim, ndim)[0] if ndim else 0


def reshape(x: Tensor, *shape) -> Tensor:
    return Reshape.apply(x, shape, False)


def view(x: Tensor, *shape) -> Tensor:
    return Reshape.apply(x, shape, True)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, 1)
    s, e = _norm_dim("flatten", start_dim, x.ndim), _norm_dim("flatten", end_dim, x.ndim)
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = list(x.shape)
    merged = 1
    for d in shape[s:e + 1]:
        merged *= d
    return reshape(x, *shape[:s], merged, *shape[e + 1:])


def permute(x: Tensor, *dims) -> Tensor:
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if sorted(_norm_dim("permute", d, x.ndim) for d in dims) != list(range(x.ndim)):
        raise ValueError(f"permute: dims {list(dims)} are not a permutation of {x.ndim} dims")
    return Permute.apply(x, tuple(_norm_dim("permute", d, x.ndim) for d in dims))


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    if x.ndim == 0:  # torch: dims 0 and -1 of a 0-d tensor name the tensor itself
        normalize_dims("transpose", dim0, 0), normalize_dims("transpose", dim1, 0)
        return Permute.apply(x, ())
    d0, d1 = _norm_dim("transpose", dim0, x.ndim), _norm_dim("transpose", dim1, x.ndim)
    dims = list(range(x.ndim))
    dims[d0], dims[d1] = d1, d0
    return Permute.apply(x, tuple(dims))


def expand(x: Tensor, *shape) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if len(shape) < x.ndim:
        raise ValueError(f"expand: target {shape_str(shape)} has fewer dims than the tensor {list(x.shape)}")
    lead = len(shape) - x.ndim
    target = tuple(x.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(shape))
    for i, size in enumerate(x.shape):
        if size != 1 and size != target[lead + i]:
            raise ValueError(f"expand: cannot expand shape {list(x.shape)} to {shape_str(shape)}")
    return Expand.apply(x, target)


def broadcast_to(x: Tensor, shape) -> Tensor:
    return expand(x, tuple(shape))


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    d = _norm_dim("unsqueeze", dim, x.ndim + 1)
    return Restride.apply(x, lambda t: t.unsqueeze(d))


def squeeze(x: Tensor, dim=None) -> Tensor:
    if dim is None:
        return Restride.apply(x, lambda t: t.squeeze())
    dims = normalize_dims("squeeze", dim, x.ndim)
    return Restride.apply(x, lambda t: t.squeeze(dims))


def index(x: Tensor, key) -> Tensor:
    """x[key] for basic keys (ints, slices, None, Ellipsis)."""
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        if not (k is None or k is Ellipsis or isinstance(k, (int, slice))) or isinstance(k, bool):
            raise TypeError(
                f"index: ge2 supports basic indexing (int, slice, None, ...); got {type(k).__name__}"
            )
        if isinstance(k, slice) and k.step is not None and k.step <= 0:
            raise ValueError(f"index: slice step must be positive, got {k.step}")
    try:
        return Index.apply(x, key)
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor shape {list(x.shape)})") from None


def _check_memory_format(op: str, x: Tensor, memory_format) -> None:
    if not isinstance(memory_format, torch.memory_format):
        raise TypeError(f"{op}: memory_format must be a torch.memory_format (torch.contiguous_format, "
                        f"torch.preserve_format, torch.channels_last, ...), got {memory_format!r}")
    need = {torch.channels_last: 4, torch.channels_last_3d: 5}.get(memory_format)
    if need is not None and x.ndim != need:
        raise ValueError(f"{op}: {memory_format} needs a {need}-D tensor, got shape {shape_str(x.shape)}")


def to(x: Tensor, device=None, dtype: torch.dtype | None = None, memory_format=torch.preserve_format) -> Tensor:
    """x on ``device`` in ``dtype`` and ``memory_format`` (torch's rules: x itself when nothing changes)."""
    from ge2.autograd.tensor import _resolve

    _check_memory_format("to", x, memory_format)
    dev = x.device if device is None else _resolve(device)
    dt = x.dtype if dtype is None else dtype
    if dev == x.device and dt == x.dtype and (memory_format == torch.preserve_format
                                              or x.data.is_contiguous(memory_format=memory_format)):
        return x
    return Copy.apply(x, dt, dev, memory_format)


def clone(x: Tensor, memory_format=torch.preserve_format) -> Tensor:
    _check_memory_format("clone", x, memory_format)
    return Copy.apply(x, x.dtype, x.device, memory_format)


def contiguous(x: Tensor, memory_format=torch.contiguous_format) -> Tensor:
    _check_memory_format("contiguous", x, memory_format)
    if memory_format == torch.preserve_format:
        raise ValueError("contiguous: memory_format=torch.preserve_format is not a layout to make contiguous "
                         "(torch refuses it too)")
    return x if x.data.is_contiguous(memory_format=memory_format) else Copy.apply(x, x.dtype, x.device, memory_format)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along ``dim``; shapes must match elsewhere."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    if _amp_state.on:
        tensors = list(_amp.cast_widest(*tensors))
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"cat: tensors[{i}] is a {type(t).__name__}, expected a Tensor")
    first = tensors[0]
    d = _norm_dim("cat", dim, first.ndim)
    for i, t in enumerate(tensors[1:], start=1):
        if t.ndim != first.ndim or any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
            raise ValueError(
                f"cat: tensors[{i}] has shape {list(t.shape)}, incompatible with tensors[0] {list(first.shape)} along dim {d}"
            )
        if t.dtype != first.dtype:
            raise TypeError(f"cat: tensors[{i}] has dtype {t.dtype}, tensors[0] has {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"cat: tensors[{i}] is on {t.device}, tensors[0] on {first.device}")
    return Cat.apply(d, *tensors)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack equal-shaped tensors along a new ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"stack: tensors[{i}] is a {type(t).__name__}, expected a Tensor")
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: tensors[{i}] has shape {list(t.shape)}, tensors[0] has {list(tensors[0].shape)}")
    d = _norm_dim("stack", dim, tensors[0].ndim + 1)
    return cat([unsqueeze(t, d) for t in tensors], d)


class Unbind(Function):
    """The slices of x along dim, as views; the gradient is the slices' gradients copied into one buffer."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.shape, ctx.dtype, ctx.dim = tuple(x.shape), x.dtype, dim
        return tuple(x.unbind(dim))

    @staticmethod
    def backward(ctx, *gys):
        if all(g is not None and g.dtype == ctx.dtype for g in gys):
            layout = runtime.packed_layout(gys)
            if layout is not None:  # the slices' gradients are already one tensor's slices (attention's dq, dk, dv)
                step, *strides = layout[1]
                strides.insert(ctx.dim, step)
                return gys[0].as_strided(ctx.shape, strides, gys[0].storage_offset()), None
        gx = torch.empty(ctx.shape, dtype=ctx.dtype, device=next(g for g in gys if g is not None).device)
        for i, g in enumerate(gys):
            part = gx.select(ctx.dim, i)
            part.zero_() if g is None else part.copy_(g)
        return gx, None


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of x along ``dim`` (views, without that dim): x [.., n, ..] -> n tensors."""
    if x.ndim == 0:
        raise ValueError("unbind: cannot unbind a 0-d tensor")
    d = _norm_dim("unbind", dim, x.ndim)
    out = Unbind.apply(x, d)
    return out if isinstance(out, tuple) else (out,)


# ---------------------------------------------------------------------------------------------
# pointwise math: binary, unary, ternary, logical/bitwise, and the pointwise-only activations
# ---------------------------------------------------------------------------------------------
class Maximum(_ProductLike):
    op_name = "maximum"


class Minimum(_ProductLike):
    op_name = "minimum"


class Fmod(_ProductLike):
    op_name = "fmod"


class Remainder(_ProductLike):
    op_name = "remainder"


class Atan2(_ProductLike):
    op_name = "atan2"


def _binary_fn(cls, name: str, doc: str):
    def fn(a, b) -> Tensor:
        return cls.apply(_operand(a, name), _operand(b, name))
    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


maximum = _binary_fn(Maximum, "maximum", "Elementwise max with broadcasting; NaN propagates; ties share the gradient.")
minimum = _binary_fn(Minimum, "minimum", "Elementwise min with broadcasting; NaN propagates; ties share the gradient.")
fmod = _binary_fn(Fmod, "fmod", "C's remainder a - b * trunc(a / b) (the sign of a), broadcast.")
remainder = _binary_fn(Remainder, "remainder", "Python's a % b = a - b * floor(a / b) (the sign of b), broadcast.")
atan2 = _binary_fn(Atan2, "atan2", "atan(a / b) in the quadrant of (b, a), broadcast; integers give float32.")
arctan2 = atan2


class Unary(Function):
    """y = f(x) for the pointwise math ops of ``kernels.elementwise.UNARY_GRAD_SAVES`` and the
    piecewise-constant ones (zero gradient); ``attrs`` are the op's keywords (decimals, nan, ...)."""

    @staticmethod
    def forward(ctx, x, op, attrs):
        from ge2.kernels.elementwise import UNARY_GRAD_SAVES

        y = call(op, x, **attrs)
        ctx.op = op
        saves = UNARY_GRAD_SAVES.get(op)
        if True in ctx.needs_input_grad and saves:
            ctx.save_for_backward(x if saves == "x" else y)
        ctx.saves = saves
        return y

    @staticmethod
    def backward(ctx, gy):
        if ctx.saves is None:
            return call("unary_backward", gy, None, None, op_name=ctx.op), None, None
        (s,) = ctx.saved_tensors
        x, y = (s, None) if ctx.saves == "x" else (None, s)
        return call("unary_backward", gy, x, y, op_name=ctx.op), None, None


def _unary_fn(name: str, doc: str, fp32_under_autocast: bool = False):
    def fn(x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
        if fp32_under_autocast and _amp_state.on:
            (x,) = _amp.cast_fp32(x)
        return Unary.apply(x, name, {})
    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


sign = _unary_fn("sign", "-1, 0 or 1 by the sign of x (0 for NaN); zero gradient.")
floor = _unary_fn("floor", "x rounded down; zero gradient.")
ceil = _unary_fn("ceil", "x rounded up; zero gradient.")
trunc = _unary_fn("trunc", "x rounded toward zero; zero gradient.")
fix = trunc
log1p = _unary_fn("log1p", "log(1 + x), accurate near 0.", True)
expm1 = _unary_fn("expm1", "exp(x) - 1, accurate near 0.", True)
log2 = _unary_fn("log2", "Base-2 logarithm.", True)
exp2 = _unary_fn("exp2", "2 ** x.")
rsqrt = _unary_fn("rsqrt", "1 / sqrt(x).", True)
reciprocal = _unary_fn("reciprocal", "1 / x (integers give float32).", True)
square = _unary_fn("square", "x * x.")
sin = _unary_fn("sin", "Sine.")
cos = _unary_fn("cos", "Cosine.")
erf = _unary_fn("erf", "The error function.")


def round(x: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001 (torch's name)
    """x rounded to ``decimals`` places, ties to even (torch.round); zero gradient."""
    return Unary.apply(x, "round", {"decimals": decimals} if decimals else {})


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, +inf, -inf replaced by ``nan``, ``posinf``, ``neginf`` (None: the dtype's largest / lowest)."""
    return Unary.apply(x, "nan_to_num", {"nan": nan, "posinf": posinf, "neginf": neginf})


def _mask_fn(name: str, doc: str):
    def fn(x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
        return Tensor(call(name, x.data))
    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


isnan = _mask_fn("isnan", "Bool mask of the NaN elements.")
isinf = _mask_fn("isinf", "Bool mask of the +-inf elements.")
isfinite = _mask_fn("isfinite", "Bool mask of the finite elements.")
logical_not = _mask_fn("logical_not", "Bool: x == 0.")
bitwise_not = _mask_fn("bitwise_not", "~x for integers, logical not for bool.")


def _no_grad_binary(name: str, doc: str):
    def fn(a, b) -> Tensor:
        a, b = _operand(a, name), _operand(b, name)
        return Tensor(call(name, a.data if isinstance(a, Tensor) else a, b.data if isinstance(b, Tensor) else b))
    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


logical_and = _no_grad_binary("logical_and", "Bool: a != 0 and b != 0, broadcast.")
logical_or = _no_grad_binary("logical_or", "Bool: a != 0 or b != 0, broadcast.")
logical_xor = _no_grad_binary("logical_xor", "Bool: exactly one of a, b nonzero, broadcast.")
bitwise_and = _no_grad_binary("bitwise_and", "a & b for integers and bool, broadcast.")
bitwise_or = _no_grad_binary("bitwise_or", "a | b for integers and bool, broadcast.")
bitwise_xor = _no_grad_binary("bitwise_xor", "a ^ b for integers and bool, broadcast.")


class Ternary(Function):
    """clamp, lerp, addcmul, addcdiv: one kernel forward, one kernel for all three gradients."""

    @staticmethod
    def forward(ctx, op, a, b, c, value):
        out = call(op, a, b, c, value=value) if op in ("addcmul", "addcdiv") else call(op, a, b, c)
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(*(x if isinstance(x, torch.Tensor) else None for x in (a, b, c)))
            ctx.scalars, ctx.op, ctx.value = (a, b, c), op, value
        return out

    @staticmethod
    def backward(ctx, gy):
        saved = ctx.saved_tensors
        a, b, c = (t if t is not None else s for t, s in zip(saved, ctx.scalars))
        _, na, nb, nc, _ = ctx.needs_input_grad
        ga, gb, gc = call("ternary_backward", gy, a, b, c, op_name=ctx.op, value=ctx.value,
                          need_a=na, need_b=nb, need_c=nc)
        return None, ga, gb, gc, None


def _ternary_operand(x, op: str):
    return None if x is None else _operand(x, op)


def clamp(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 (torch's names)
    """min(max(x, min), max) with tensor or scalar bounds (either may be None); NaN propagates."""
    if not isinstance(x, Tensor):
        raise TypeError(f"clamp: expected a Tensor, got {type(x).__name__}")
    return Ternary.apply("clamp", x, _ternary_operand(min, "clamp"), _ternary_operand(max, "clamp"), 1)


clip = clamp


def clamp_min(x: Tensor, min) -> Tensor:  # noqa: A002
    return clamp(x, min, None)


def clamp_max(x: Tensor, max) -> Tensor:  # noqa: A002
    return clamp(x, None, max)


def lerp(start: Tensor, end: Tensor, weight) -> Tensor:
    """start + weight * (end - start), broadcast; weight a tensor or a number."""
    return Ternary.apply("lerp", _operand(start, "lerp"), _operand(end, "lerp"), _operand(weight, "lerp"), 1)


def addcmul(x: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """x + value * tensor1 * tensor2, broadcast."""
    return Ternary.apply("addcmul", _operand(x, "addcmul"), _operand(tensor1, "addcmul"),
                         _operand(tensor2, "addcmul"), value)


def addcdiv(x: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """x + value * tensor1 / tensor2, broadcast."""
    return Ternary.apply("addcdiv", _operand(x, "addcdiv"), _operand(tensor1, "addcdiv"),
                         _operand(tensor2, "addcdiv"), value)


class ActivationEx(Function):
    """y = act(x; p0, p1, p2) for activations.POINTWISE_ACTIVATIONS; backward reads x."""

    @staticmethod
    def forward(ctx, x, act, params):
        ctx.act, ctx.params = act, params
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x)
        return call("activation", x, act=act, alpha=params[0], beta=params[1], gamma=params[2])

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        p = ctx.params
        return call("activation_backward", gy, x, None, act=ctx.act, alpha=p[0], beta=p[1], gamma=p[2]), None, None


def activation_ex(x: Tensor, act: str, p0: float = 0.0, p1: float = 0.0, p2: float = 0.0) -> Tensor:
    """act(x) for act in mish, softplus(beta, threshold), elu(alpha, scale, input_scale), hardswish,
    hardtanh(min_val, max_val), logsigmoid."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{act}: expected a Tensor, got {type(x).__name__}")
    if _amp_state.on and act == "softplus":
        (x,) = _amp.cast_fp32(x)
    return ActivationEx.apply(x, act, (float(p0), float(p1), float(p2)))


class Glu(Function):
    @staticmethod
    def forward(ctx, x, dim):
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x)
            ctx.dim = dim
        return call("glu", x, dim=dim)

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        return call("glu_backward", x, gy, dim=ctx.dim), None


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b) for the halves a, b of x along ``dim`` (even size)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"glu: expected a Tensor, got {type(x).__name__}")
    return Glu.apply(x, dim)


# ---------------------------------------------------------------------------------------------
# in-place ops
# ---------------------------------------------------------------------------------------------
def _kind(dt: torch.dtype) -> int:
    return 2 if dt.is_floating_point else 0 if dt == torch.bool else 1


def inplace_source(x: Tensor) -> Tensor:
    """What an in-place op on x should compute from: x, or a recorded copy of x when the op is
    recorded (its backward may read x's old value, which the write is about to replace; torch
    saves the original the same way)."""
    if x.requires_grad and grad_mode.is_grad_enabled() and not x.is_leaf:
        return clone(x)
    return x


def inplace(x: Tensor, result_fn, op: str) -> Tensor:
    """Write ``result_fn()`` into x's memory, bump its version; record the op if grad is on.

    Under grad mode a non-leaf x is rebound to the new node (its old value, if saved by an
    earlier op, is detected as modified at backward); views of tensors that need grad are refused.
    """
    _check_inplace(x, op)
    result = result_fn()
    if result.shape != x.shape:
        raise ValueError(f"{op}: result of shape {list(result.shape)} cannot be written into {list(x.shape)}")
    if _kind(result.dtype) > _kind(x.dtype):  # torch's can_cast: no float into ints, no ints into bool
        raise TypeError(f"{op}: result type {dtype_name(result.dtype)} can't be cast to the desired output "
                        f"type {dtype_name(x.dtype)}")
    if result.requires_grad and grad_mode.is_grad_enabled():
        if x.data._base is not None and x.requires_grad:
            raise RuntimeError(f"{op}: in-place on a view of a tensor that requires grad is not supported")
        x.grad_fn, x._out_idx, x._requires_grad = result.grad_fn, result._out_idx, True
    x.data.copy_(result.data)
    x._version_counter.value += 1
    return x


def _install_pointwise_methods(make_inplace) -> None:
    """The pointwise math's methods, operators and in-place variants (torch's names)."""
    T = Tensor

    def keywords_inplace(fn, name):
        def method(self, *args, **kwargs):
            src = inplace_source(self)
            return inplace(self, lambda: fn(src, *args, **kwargs), name)
        return method

    T.add, T.sub, T.div = add, sub, div
    T.add_, T.sub_, T.div_ = (keywords_inplace(fn, f"{fn.__name__}_") for fn in (add, sub, div))
    T.floor_divide, T.floor_divide_ = floor_divide, make_inplace(floor_divide, "floor_divide_")
    T.true_divide = div
    T.__floordiv__ = floor_divide
    T.__rfloordiv__ = lambda self, o: floor_divide(o, self)
    T.__ifloordiv__ = make_inplace(floor_divide, "floor_divide_")
    T.__mod__ = remainder
    T.__rmod__ = lambda self, o: remainder(o, self)
    T.__imod__ = make_inplace(remainder, "remainder_")
    for name, fn in (("and", bitwise_and), ("or", bitwise_or), ("xor", bitwise_xor)):
        setattr(T, f"__{name}__", fn)
        setattr(T, f"__r{name}__", lambda self, o, _fn=fn: _fn(o, self))
        setattr(T, f"__i{name}__", make_inplace(fn, f"bitwise_{name}_"))
    T.__invert__ = bitwise_not
    binary = (maximum, minimum, fmod, remainder, atan2, logical_and, logical_or, logical_xor, bitwise_and,
              bitwise_or, bitwise_xor)
    for fn in binary:
        setattr(T, fn.__name__, fn)
    for fn in (fmod, remainder, atan2, logical_and, logical_or, logical_xor, bitwise_and, bitwise_or, bitwise_xor):
        setattr(T, f"{fn.__name__}_", make_inplace(fn, f"{fn.__name__}_"))
    T.arctan2, T.arctan2_ = atan2, T.atan2_
    unary = (sign, floor, ceil, trunc, log1p, expm1, log2, exp2, rsqrt, reciprocal, square, sin, cos, erf,
             logical_not, bitwise_not, neg, exp, log, sqrt, abs, relu, sigmoid, tanh)
    for fn in unary:
        setattr(T, fn.__name__, fn)
        setattr(T, f"{fn.__name__}_", keywords_inplace(fn, f"{fn.__name__}_"))
    T.fix, T.fix_ = trunc, T.trunc_
    T.negative, T.absolute = neg, abs
    for fn in (isnan, isinf, isfinite):
        setattr(T, fn.__name__, fn)
    for fn in (round, nan_to_num, clamp, clamp_min, clamp_max, lerp, addcmul, addcdiv):
        setattr(T, fn.__name__, fn)
        setattr(T, f"{fn.__name__}_", keywords_inplace(fn, f"{fn.__name__}_"))
    T.clip, T.clip_ = clamp, T.clamp_
    T.maximum, T.minimum = maximum, minimum


def _install_methods() -> None:
    """Tensor's operators and methods, each a call to a functional op above."""
    from ge2.autograd import linalg

    T = Tensor

    def cmp(op):
        return lambda self, other: compare(op, self, other)

    T.__add__ = add
    T.__radd__ = lambda self, o: add(o, self)
    T.__sub__ = sub
    T.__rsub__ = lambda self, o: sub(o, self)
    T.__mul__ = mul
    T.__rmul__ = lambda self, o: mul(o, self)
    T.__truediv__ = div
    T.__rtruediv__ = lambda self, o: div(o, self)
    T.__pow__ = pow
    T.__rpow__ = lambda self, o: pow(o, self)
    T.__neg__ = neg
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__matmul__ = lambda self, o: linalg.matmul(self, o)
    T.__rmatmul__ = lambda self, o: linalg.matmul(o, self)
    for op in ("eq", "ne", "lt", "le", "gt", "ge"):
        setattr(T, f"__{op}__", cmp(op))
        setattr(T, op, cmp(op))
    T.__hash__ = object.__hash__
    T.add, T.sub, T.mul, T.div, T.pow = add, sub, mul, div, pow
    T.neg, T.exp, T.log, T.sqrt, T.abs = neg, exp, log, sqrt, abs
    T.relu, T.sigmoid, T.tanh = relu, sigmoid, tanh
    T.sum, T.mean, T.max, T.amax = sum, mean, max, amax
    T.matmul = lambda self, o: linalg.matmul(self, o)
    T.reshape, T.view, T.flatten, T.permute, T.transpose = reshape, view, flatten, permute, transpose
    T.expand, T.broadcast_to, T.unsqueeze, T.squeeze = expand, broadcast_to, unsqueeze, squeeze
    T.clone, T.contiguous, T.unbind = clone, contiguous, unbind
    T.T = property(lambda self: permute(self, *reversed(range(self.ndim))))
    T.mT = property(lambda self: transpose(self, -2, -1))
    T.__getitem__ = index

    def to_method(self, *args, memory_format=torch.preserve_format, **kwargs):
        device, dtype = parse_to_args(args, kwargs)
        return to(self, device=device, dtype=dtype, memory_format=memory_format)

    T.to = to_method

    def _setitem(self, key, value):
        _check_inplace(self, "setitem")
        if self.requires_grad and grad_mode.is_grad_enabled():
            raise RuntimeError("setitem: assigning into a tensor that requires grad is not supported")
        target = self.data[key]
        if isinstance(value, Tensor):
            target.copy_(value.data)
        elif isinstance(value, numbers.Number):
            target.fill_(value)
        else:
            raise TypeError(f"setitem: value must be a Tensor or a number, got {type(value).__name__}")
        self._version_counter.value += 1

    T.__setitem__ = _setitem

    def make_inplace(fn, name):
        def method(self, other):
            src = inplace_source(self)
            return inplace(self, lambda: fn(src, other), name)
        return method

    for name, fn in (("mul", mul), ("pow", pow)):
        setattr(T, f"{name}_", make_inplace(fn, f"{name}_"))
    T.__iadd__ = make_inplace(add, "add_")
    T.__isub__ = make_inplace(sub, "sub_")
    T.__imul__ = make_inplace(mul, "mul_")
    T.__itruediv__ = make_inplace(div, "div_")
    _install_pointwise_methods(make_inplace)

    def zero_(self):
        _check_inplace(self, "zero_")
        self.data.zero_()
        self._version_counter.value += 1
        return self

    def fill_(self, value):
        _check_inplace(self, "fill_")
        self.data.fill_(value)
        self._version_counter.value += 1
        return self

    def copy_(self, src):
        _check_inplace(self, "copy_")
        src_data = src.data if isinstance(src, Tensor) else src
        broadcast_shapes("copy_", ["self", "src"], [tuple(self.shape), tuple(src_data.shape)])
        self.data.copy_(src_data)
        self._version_counter.value += 1
        return self

    T.zero_, T.fill_, T.copy_ = zero_, fill_, copy_


_install_methods()
