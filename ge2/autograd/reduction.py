"""Reductions, scans, sorting and sampling with torch's semantics: each Function's forward and
backward side by side, the functional ops (``ge2.prod``, ``ge2.sort``, ...) and their Tensor methods.

Gradients: a value picked from x (min/max/sort/topk/kthvalue/median along a dim) sends its gradient
back to the index it came from (``place_along_dim``); a reduction over all of x to one picked value
(``x.min()``, ``x.median()``, ``amin``) shares it evenly between the tied elements, like torch.
prod handles zeros as torch does (one zero: only it gets a gradient, the product of the others;
two or more: none); cumprod's gradient is exact at zeros too.
"""
from __future__ import annotations

import math

import torch

from ge2 import backend
from ge2.autograd import math as M
from ge2.autograd.dropout import default_rng_state
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import normalize_dims, shape_str

call = backend.call


def _tensor(op: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a ge2 Tensor, got {type(x).__name__}")
    return x


def _one_dim(op: str, dim, ndim: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    return normalize_dims(op, dim, ndim)[0] if ndim else 0


# ---------------------------------------------------------------------------------------------
# values picked along a dim: min, sort, topk, kthvalue, median
# ---------------------------------------------------------------------------------------------
class Select(Function):
    """(values, indices) = op(x, dim, ...); the gradient of values lands at indices (zeros elsewhere)."""

    @staticmethod
    def forward(ctx, x, op, dim, keepdim, attrs):
        values, indices = call(op, x, **attrs)
        ctx.mark_non_differentiable(indices)
        ctx.dim, ctx.keepdim, ctx.shape = dim, keepdim, tuple(x.shape)
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, g, _gi):
        (indices,) = ctx.saved_tensors
        if not ctx.shape:
            return g.reshape(()), None, None, None, None
        if not ctx.keepdim:  # a reduction that dropped dim: put it back (size 1)
            g, indices = g.unsqueeze(ctx.dim), indices.unsqueeze(ctx.dim)
        gx = call("place_along_dim", g.contiguous(), indices, dim=ctx.dim, n=ctx.shape[ctx.dim])
        return gx, None, None, None, None


def _select(op: str, x: Tensor, axis: int, keep: bool, **attrs):
    """Select.apply: axis is the normalised dim, keep whether the result still has it."""
    return Select.apply(x, op, axis, keep, attrs)


class Amin(Function):
    """min over dims (or all): ties share the gradient evenly, like torch.amin / Tensor.min()."""

    @staticmethod
    def forward(ctx, x, dims, keepdim):
        y = call("amin", x, dims=dims, keepdim=keepdim)
        ctx.dims = normalize_dims("amin", dims, x.dim())
        ctx.save_for_backward(x, y)
        return y

    backward = staticmethod(M.Amax.backward)  # the same even split between the tied elements


class Median(Function):
    """median of all elements: the gradient is shared evenly by the elements equal to it (torch's rule)."""

    @staticmethod
    def forward(ctx, x):
        y = call("median", x)
        ctx.dims = tuple(range(x.dim()))
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        return M.Amax.backward(ctx, g)[0]


def amin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Min values over ``dim`` (int, tuple or None = all); NaN propagates."""
    return Amin.apply(_tensor("amin", x), dim, keepdim)


def min(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001 (torch's name)
    """``min(x)``: the smallest element; ``min(x, dim)``: (values, indices) like torch; ``min(x, y)``: minimum."""
    _tensor("min", x)
    if isinstance(dim, Tensor):
        minimum = getattr(M, "minimum", None)
        if minimum is None:
            raise TypeError("min: the elementwise min(x, other) needs ge2.minimum, which this build lacks")
        return minimum(x, dim)
    if dim is None:
        return Amin.apply(x, None, False)
    d = _one_dim("min", dim, x.ndim)
    values, indices = _select("min", x, d, keepdim, dim=dim, keepdim=keepdim)
    return torch.return_types.min((values, indices))


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """int64 index of the first maximum along dim (of the flattened x when dim is None)."""
    return Tensor(call("argmax", _tensor("argmax", x).data, dim=dim, keepdim=keepdim))


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """int64 index of the first minimum along dim (of the flattened x when dim is None)."""
    return Tensor(call("argmin", _tensor("argmin", x).data, dim=dim, keepdim=keepdim))


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """(values, int64 indices) sorted along dim; always stable (equal values keep their order); NaN largest."""
    _tensor("sort", x)
    d = _one_dim("sort", dim, x.ndim)
    values, indices = _select("sort", x, d, True, dim=dim, descending=bool(descending))
    return torch.return_types.sort((values, indices))


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """int64 indices that sort x along dim (stable)."""
    _tensor("argsort", x)
    return Tensor(call("sort", x.data, dim=dim, descending=bool(descending))[1])


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The k largest (smallest) elements along dim -> (values, indices), in order (also when sorted=False);
    ties: the lower index first."""
    _tensor("topk", x)
    d = _one_dim("topk", dim, x.ndim)
    values, indices = _select("topk", x, d, True, k=k, dim=dim, largest=bool(largest))
    return torch.return_types.topk((values, indices))


def kthvalue(x: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """The k-th smallest element along dim (1-based) -> (values, indices)."""
    _tensor("kthvalue", x)
    d = _one_dim("kthvalue", dim, x.ndim)
    values, indices = _select("kthvalue", x, d, keepdim, k=k, dim=dim, keepdim=keepdim)
    return torch.return_types.kthvalue((values, indices))


def median(x: Tensor, dim: int | None = None, keepdim: bool = False):
    """Lower median (of the two middle values, the smaller), NaN if any; with dim: (values, indices)."""
    _tensor("median", x)
    if dim is None:
        return Median.apply(x)
    d = _one_dim("median", dim, x.ndim)
    values, indices = _select("median", x, d, keepdim, dim=dim, keepdim=keepdim)
    return torch.return_types.median((values, indices))


def unique(x: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,  # noqa: A002
           dim: int | None = None):
    """Sorted distinct values of x (flattened), or with ``dim`` its distinct slices along dim (sorted
    lexicographically; inverse [x.shape[dim]], counts [U]), with the inverse map and counts on request.

    One host sync: the number of distinct values (slices) is read back to size the output. sorted=False
    returns them sorted too (torch allows any order; with dim torch sorts too)."""
    _tensor("unique", x)
    values, inverse, counts = call("unique", x.data, return_inverse=bool(return_inverse),
                                   return_counts=bool(return_counts), dim=dim)
    out = [Tensor(values)] + [Tensor(t) for t in (inverse, counts) if t is not None]
    return out[0] if len(out) == 1 else tuple(out)


# ---------------------------------------------------------------------------------------------
# reductions with gradients
# ---------------------------------------------------------------------------------------------
class Prod(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        y = call("prod", x, dims=dims, keepdim=keepdim)
        ctx.dims = normalize_dims("prod", dims, x.dim())
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        keep = M._keepdim_shape(x.shape, ctx.dims)
        g, y = g.reshape(keep), y.reshape(keep)
        is_zero = call("eq", x, 0)
        zeros = call("sum", is_zero, dims=ctx.dims, keepdim=True)
        plain = call("div", call("mul", g, y), x)  # no zero in the group: d prod / dx_i = prod / x_i
        others = call("prod", x, dims=ctx.dims, keepdim=True, skip_zeros=True)
        lone = call("where", is_zero, call("mul", g, others), 0.0)  # one zero: only it moves the product
        return call("where", call("eq", zeros, 0), plain, call("where", call("eq", zeros, 1), lone, 0.0)), None, None


def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Product over dim (int or None = all); ints and bool give int64."""
    _tensor("prod", x)
    if dtype is not None:
        x = M.to(x, dtype=dtype)
    return Prod.apply(x, dim, keepdim)


class Variance(Function):
    """var / std with torch's correction; two-pass kernels, gradients from the deviations."""

    @staticmethod
    def forward(ctx, x, op, dims, correction, keepdim):
        y = call(op, x, dims=dims, correction=correction, keepdim=keepdim)
        ctx.op, ctx.dims = op, normalize_dims(op, dims, x.dim())
        ctx.count = max(0.0, math.prod(x.shape[d] for d in ctx.dims) - correction)
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        keep = M._keepdim_shape(x.shape, ctx.dims)
        g, y = g.reshape(keep), y.reshape(keep)
        deviation = call("sub", x, call("mean", x, dims=ctx.dims, keepdim=True))
        if ctx.op == "var":  # d var / dx = 2 (x - mean) / (N - correction)
            scale = call("mul", g, 2.0 / ctx.count if ctx.count else math.inf)
        else:  # d std / dx = (x - mean) / ((N - correction) std)
            scale = call("div", g, call("mul", y, ctx.count))
        return call("mul", deviation, scale), None, None, None, None



def _correction(op: str, dim, unbiased, correction):
    if isinstance(dim, bool):  # the legacy var(x, unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise ValueError(f"{op}: pass either unbiased= or correction=, not both")
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return dim, 1 if correction is None else correction


def var(x: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Variance over dim (int, tuple or None = all): sum((x - mean)^2) / max(0, N - correction)."""
    dim, correction = _correction("var", dim, unbiased, correction)
    return Variance.apply(_tensor("var", x), "var", dim, correction, keepdim)


def std(x: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Standard deviation over dim: sqrt(var) with torch's correction (default 1)."""
    dim, correction = _correction("std", dim, unbiased, correction)
    return Variance.apply(_tensor("std", x), "std", dim, correction, keepdim)


class VectorNorm(Function):
    @staticmethod
    def forward(ctx, x, ord, dims, keepdim):  # noqa: A002
        y = call("vector_norm", x, ord=ord, dims=dims, keepdim=keepdim)
        ctx.ord, ctx.dims = float(ord), normalize_dims("vector_norm", dims, x.dim())
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        keep = M._keepdim_shape(x.shape, ctx.dims)
        g, y = g.reshape(keep), y.reshape(keep)
        p = ctx.ord
        if p == 0:
            return torch.zeros(x.shape, dtype=x.dtype, device=x.device), None, None, None
        if math.isinf(p):  # max/min |x|: shared evenly by the tied elements, with x's sign
            hit = call("eq", call("abs", x), y)
            share = call("div", g, call("sum", hit, dims=ctx.dims, keepdim=True))
            signed = call("where", call("lt", x, 0), call("neg", share), share)
            return call("where", hit, signed, 0.0), None, None, None
        if p == 1:
            return call("where", call("gt", x, 0), g, call("where", call("lt", x, 0), call("neg", g), 0.0)), None, None, None
        # sign(x) |x|^(p-1) * g / norm^(p-1); a zero norm gives a zero gradient (torch's convention)
        scale = call("div", g, y if p == 2 else call("pow", y, p - 1))
        scale = call("where", call("eq", y, 0), 0.0, scale)
        if p == 2:
            return call("mul", x, scale), None, None, None
        magnitude = call("pow", call("abs", x), p - 1)
        signed = call("where", call("gt", x, 0), magnitude, call("where", call("lt", x, 0), call("neg", magnitude), 0.0))
        return call("mul", signed, scale), None, None, None


def vector_norm(x: Tensor, ord: float = 2, dim=None, keepdim: bool = False, *,  # noqa: A002
                dtype: torch.dtype | None = None) -> Tensor:
    """(sum |x|^ord)^(1/ord) over dim; ord inf / -inf: max / min |x|; ord 0: number of nonzeros."""
    _tensor("vector_norm", x)
    if dtype is not None:
        x = M.to(x, dtype=dtype)
    return VectorNorm.apply(x, ord, dim, keepdim)


def norm(x: Tensor, p="fro", dim=None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    """Tensor.norm: 'fro' (the 2-norm of the elements over dim) or a vector p-norm; 'nuc' is refused."""
    if p == "fro" or p is None:
        p = 2
    if p == "nuc":
        raise ValueError("norm: p='nuc' is not supported: the nuclear norm (the sum of the singular values) needs "
                         "an SVD, which ge2 has no kernel for; p='fro' or a number gives the element-wise norms "
                         "(as ge2.linalg.vector_norm)")
    if isinstance(p, str):
        raise ValueError(f"norm: p={p!r} is not a norm ge2 knows; use 'fro' or a number")
    return vector_norm(x, p, dim, keepdim, dtype=dtype)


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        y = call("logsumexp", x, dims=dims, keepdim=keepdim)
        ctx.dims = normalize_dims("logsumexp", dims, x.dim())
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        keep = M._keepdim_shape(x.shape, ctx.dims)
        return call("mul", g.reshape(keep), call("exp", call("sub", x, y.reshape(keep)))), None, None  # softmax


def logsumexp(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over dim (int, tuple or None = all), stable for large x."""
    return LogSumExp.apply(_tensor("logsumexp", x), dim, keepdim)


def all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where every element over dim is nonzero (bool)."""
    return Tensor(call("all", _tensor("all", x).data, dims=dim, keepdim=keepdim))


def any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where some element over dim is nonzero (bool)."""
    return Tensor(call("any", _tensor("any", x).data, dims=dim, keepdim=keepdim))


# ---------------------------------------------------------------------------------------------
# scans
# ---------------------------------------------------------------------------------------------
class Scan(Function):
    @staticmethod
    def forward(ctx, x, op, dim):
        y = call(op, x, dim=dim)
        ctx.op, ctx.dim = op, dim
        if True in ctx.needs_input_grad:
            ctx.save_for_backward(x if op != "cumsum" else None, y if op != "cumsum" else None)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        d = ctx.dim
        if ctx.op == "cumsum":  # each x_k feeds every y_i with i >= k
            return call("cumsum", g, dim=d, reverse=True), None, None
        if ctx.op == "logcumsumexp":
            return _logcumsumexp_backward(x, y, g, d), None, None
        return _cumprod_backward(x, y, g, d), None, None


def _logcumsumexp_backward(x, y, g, d):
    # gx_k = sum_{i>=k} g_i exp(x_k - y_i), summed in log space, positive and negative g apart
    log_g = call("log", call("abs", g))
    minus_inf = -math.inf
    pos = call("logcumsumexp", call("where", call("gt", g, 0), call("sub", log_g, y), minus_inf), dim=d, reverse=True)
    neg = call("logcumsumexp", call("where", call("lt", g, 0), call("sub", log_g, y), minus_inf), dim=d, reverse=True)
    return call("sub", call("exp", call("add", x, pos)), call("exp", call("add", x, neg)))


def _cumprod_backward(x, y, g, d):
    # Before a row's first zero z: gx_k = sum_{i>=k} g_i y_i / x_k. At z: sum_{i>=z} g_i * (cumprod of x
    # with x_z replaced by 1)_i. After z: 0 (every product through them holds x_z = 0).
    if x.dim() == 0:
        return g
    if x.numel() == 0:
        return torch.zeros(x.shape, dtype=g.dtype, device=g.device)
    n = x.shape[d]
    along = [1] * x.dim()
    along[d] = n
    pos = torch.arange(n, device=x.device).reshape(along)
    is_zero = call("eq", x, 0)
    first = call("argmax", is_zero, dim=d, keepdim=True)
    z = call("where", call("any", is_zero, dims=d, keepdim=True), first, n)
    at = call("eq", pos, z)
    plain = call("div", call("cumsum", call("mul", g, y), dim=d, reverse=True), x)
    w = call("cumprod", call("where", at, 1.0, x), dim=d)
    at_zero = call("sum", call("where", call("ge", pos, z), call("mul", g, w), 0.0), dims=d, keepdim=True)
    return call("where", call("lt", pos, z), plain, call("where", at, at_zero, 0.0))


def _scan(op: str, x: Tensor, dim: int, dtype: torch.dtype | None) -> Tensor:
    _tensor(op, x)
    if dtype is not None:
        x = M.to(x, dtype=dtype)
    return Scan.apply(x, op, _one_dim(op, dim, x.ndim))


def cumsum(x: Tensor, dim: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """Running sum along dim; ints and bool give int64."""
    return _scan("cumsum", x, dim, dtype)


def cumprod(x: Tensor, dim: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """Running product along dim; ints and bool give int64."""
    return _scan("cumprod", x, dim, dtype)


def logcumsumexp(x: Tensor, dim: int) -> Tensor:
    """log(cumsum(exp(x))) along dim, stable for large x."""
    return _scan("logcumsumexp", x, dim, None)


# ---------------------------------------------------------------------------------------------
# multinomial
# ---------------------------------------------------------------------------------------------
def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator: torch.Tensor | None = None) -> Tensor:
    """Draw num_samples category indices per row of input [N] or [M, N] (non-negative weights) -> int64
    [num_samples] or [M, num_samples].

    Random numbers come from ge2's device-side [seed, offset] state (``generator``: such a state,
    default the device's), advanced on the device, so a captured step draws afresh on every replay.
    Without replacement, rows need num_samples positive weights (not checked: that would sync)."""
    _tensor("multinomial", input)
    if input.ndim not in (1, 2):
        raise ValueError(f"multinomial: input must be 1-D or 2-D, got {shape_str(input.shape)}")
    if generator is not None and not (isinstance(generator, torch.Tensor) and generator.dtype == torch.int64):
        raise TypeError("multinomial: generator must be a ge2 RNG state (int64 [seed, offset] tensor on the device)")
    p = input.data if input.ndim == 2 else input.data.reshape(1, -1)
    state = generator if generator is not None else default_rng_state(input.device)
    out = call("multinomial_sample", p, state, num_samples=num_samples, replacement=bool(replacement))
    call("philox_advance", state, n=p.shape[0] * (num_samples if replacement else p.shape[1]))
    return Tensor(out if input.ndim == 2 else out.reshape(num_samples))


def _install_methods() -> None:
    T = Tensor
    T.min, T.amin, T.argmax, T.argmin = min, amin, argmax, argmin
    T.prod, T.var, T.std, T.norm, T.logsumexp = prod, var, std, norm, logsumexp
    T.all, T.any = all, any
    T.cumsum, T.cumprod, T.logcumsumexp = cumsum, cumprod, logcumsumexp
    T.sort, T.argsort, T.topk, T.kthvalue, T.median, T.unique = sort, argsort, topk, kthvalue, median, unique
    T.multinomial = multinomial


_install_methods()
