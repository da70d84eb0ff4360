"""Joins, splits and reshapes with gradients: views where torch views (split, chunk, narrow,
diagonal, movedim, meshgrid), ge2 kernels where torch computes (flip, roll, repeat, tile,
repeat_interleave, tril/triu, diag_embed; ``ge2.kernels.layout``).

The Tensor methods of this module are installed at its bottom.
"""
from __future__ import annotations

import numbers
import torch

from ge2 import backend
from ge2.autograd.function import Function
from ge2.autograd.math import _norm_dim, expand, permute, reshape
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import shape_str

call = backend.call


def _ints(op: str, name: str, values) -> tuple[int, ...]:
    """One int or a sequence of ints (a torch.Size too) as a tuple; a clear TypeError otherwise."""
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        return (int(values),)
    if isinstance(values, (tuple, list, torch.Size)) and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        return tuple(int(v) for v in values)
    raise TypeError(f"{op}: {name} must be an int or a sequence of ints, got {values!r}")


# ---------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------
class Split(Function):
    """Consecutive slices of x along dim (views); the gradient is the slices' gradients copied back."""

    @staticmethod
    def forward(ctx, x, dim, sizes):
        ctx.shape, ctx.dim, ctx.sizes = tuple(x.shape), dim, sizes
        return tuple(x.split(list(sizes), dim))

    @staticmethod
    def backward(ctx, *gys):
        g0 = next(g for g in gys if g is not None)
        gx = torch.empty(ctx.shape, dtype=g0.dtype, device=g0.device)
        start = 0
        for g, s in zip(gys, ctx.sizes):
            part = gx.narrow(ctx.dim, start, s)
            part.zero_() if g is None else part.copy_(g)
            start += s
        return gx, None, None


class Diagonal(Function):
    """x.diagonal(offset, dim1, dim2), a view; the gradient is gy written onto the diagonal of zeros."""

    @staticmethod
    def forward(ctx, x, offset, dim1, dim2):
        ctx.shape, ctx.args = tuple(x.shape), (offset, dim1, dim2)
        return x.diagonal(offset, dim1, dim2)

    @staticmethod
    def backward(ctx, gy):
        gx = torch.zeros(ctx.shape, dtype=gy.dtype, device=gy.device)
        gx.diagonal(*ctx.args).copy_(gy)
        return gx, None, None, None


def split(x: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of consecutive pieces of x along dim: each split_size long (the last shorter), or the given sections."""
    if x.ndim == 0:
        raise ValueError("split: cannot split a 0-d tensor")
    d = _norm_dim("split", dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, numbers.Integral) and not isinstance(split_size_or_sections, bool):
        size = int(split_size_or_sections)
        if size <= 0 and not (size == 0 and n == 0):
            raise ValueError(f"split: split_size must be positive, got {size} (x of shape {list(x.shape)})")
        sizes = tuple(min(size, n - s) for s in range(0, n, size)) if n else (0,)
    else:
        sizes = _ints("split", "split_size_or_sections", split_size_or_sections)
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"split: sections {list(sizes)} must be non-negative and sum to dim {d}'s size {n} "
                             f"(x of shape {list(x.shape)})")
    out = Split.apply(x, d, sizes)
    return out if isinstance(out, tuple) else (out,)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most ``chunks`` views of x along dim, each ceil(n / chunks) long (torch's rule)."""
    if not isinstance(chunks, numbers.Integral) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    if x.ndim == 0:
        raise ValueError("chunk: cannot chunk a 0-d tensor")
    n = x.shape[_norm_dim("chunk", dim, x.ndim)]
    return split(x, max(-(-n // chunks), 1) if n else 0, dim)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The view x[..., start:start + length, ...] along dim (start may be negative)."""
    if x.ndim == 0:
        raise ValueError("narrow: cannot narrow a 0-d tensor")
    d = _norm_dim("narrow", dim, x.ndim)
    n = x.shape[d]
    s = start + n if start < 0 else start
    if not 0 <= s <= n or length < 0 or s + length > n:
        raise ValueError(f"narrow: start {start} and length {length} leave dim {d} of size {n} "
                         f"(x of shape {list(x.shape)})")
    return Split.apply(x, d, (s, length, n - s - length))[1]


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The view of the (offset) diagonal of dims dim1, dim2, as the last dim."""
    d1, d2 = _norm_dim("diagonal", dim1, x.ndim), _norm_dim("diagonal", dim2, x.ndim)
    if x.ndim < 2 or d1 == d2:
        raise ValueError(f"diagonal: dim1 {dim1} and dim2 {dim2} must be two different dims of x {list(x.shape)}")
    return Diagonal.apply(x, int(offset), d1, d2)


def movedim(x: Tensor, source, destination) -> Tensor:
    """The view with dims ``source`` moved to positions ``destination`` (the others keep their order)."""
    src = _ints("movedim", "source", source)
    dst = _ints("movedim", "destination", destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: source {list(src)} and destination {list(dst)} must have the same length")
    src = tuple(_norm_dim("movedim", s, x.ndim) for s in src)
    dst = tuple(_norm_dim("movedim", s, x.ndim) for s in dst)
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: repeated dim in source {list(src)} or destination {list(dst)}")
    order = [None] * x.ndim
    for s, t in zip(src, dst):
        order[t] = s
    rest = iter(d for d in range(x.ndim) if d not in src)
    order = [next(rest) if o is None else o for o in order]
    return permute(x, *order) if x.ndim else x


moveaxis = movedim


def meshgrid(*tensors, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Grids of 0-/1-D tensors (expanded views): "ij" gives shape (n0, n1, ...), "xy" (n1, n0, ...)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor) or t.ndim > 1:
            raise ValueError(f"meshgrid: tensors[{i}] must be a 0-D or 1-D Tensor, got "
                             f"{shape_str(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    ts = list(tensors)
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = [t.numel() for t in ts]
    out = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[i] = shape[i]
        out.append(expand(reshape(t, *view), *shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# copies computed by ge2 kernels
# ---------------------------------------------------------------------------------------------
class Flip(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return call("flip", x, dims=dims)

    @staticmethod
    def backward(ctx, gy):
        return call("flip", gy, dims=ctx.dims), None


class Roll(Function):
    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return call("roll", x, shifts=shifts, dims=dims)

    @staticmethod
    def backward(ctx, gy):
        return call("roll", gy, shifts=tuple(-s for s in ctx.shifts), dims=ctx.dims), None, None


class Repeat(Function):
    """y = x tiled; the gradient sums gy over the copies (ge2's sum over the repeat dims of a view)."""

    @staticmethod
    def forward(ctx, x, repeats):
        ctx.shape, ctx.repeats = tuple(x.shape), repeats
        return call("repeat", x, repeats=repeats)

    @staticmethod
    def backward(ctx, gy):
        shape = (1,) * (len(ctx.repeats) - len(ctx.shape)) + ctx.shape
        split = [v for r, s in zip(ctx.repeats, shape) for v in (r, s)]
        g = call("sum", gy.reshape(split), dims=tuple(range(0, len(split), 2)), keepdim=False)
        return g.reshape(ctx.shape), None


class RepeatInterleave(Function):
    @staticmethod
    def forward(ctx, x, repeats, dim):
        ctx.repeats, ctx.dim, ctx.n = repeats, dim, x.shape[dim]
        return call("repeat_interleave", x, repeats=repeats, dim=dim)

    @staticmethod
    def backward(ctx, gy):
        return call("repeat_interleave_backward", gy, None, repeats=ctx.repeats, dim=ctx.dim, n=ctx.n), None, None


class TakeSegments(Function):
    """repeat_interleave with tensor repeats: y[.., o, ..] = x[.., table[o], ..]; the gradient sums each segment."""

    @staticmethod
    def forward(ctx, x, ends, table, dim):
        ctx.ends, ctx.dim, ctx.n = ends, dim, x.shape[dim]
        return call("take_segments", x, table, dim=dim)

    @staticmethod
    def backward(ctx, gy):
        return call("repeat_interleave_backward", gy, ctx.ends, repeats=0, dim=ctx.dim, n=ctx.n), None, None, None


class Tri(Function):
    @staticmethod
    def forward(ctx, x, diagonal, upper):
        ctx.args = (diagonal, upper)
        return call("tri", x, diagonal=diagonal, upper=upper)

    @staticmethod
    def backward(ctx, gy):
        return call("tri", gy, diagonal=ctx.args[0], upper=ctx.args[1]), None, None


class DiagEmbed(Function):
    @staticmethod
    def forward(ctx, x, offset, dim1, dim2):
        ctx.args = (offset, dim1, dim2)
        return call("diag_embed", x, offset=offset, dim1=dim1, dim2=dim2)

    @staticmethod
    def backward(ctx, gy):
        return gy.diagonal(*ctx.args), None, None, None


def _dims(op: str, dims, ndim: int) -> tuple[int, ...]:
    return tuple(_norm_dim(op, d, ndim) for d in _ints(op, "dims", dims))


def flip(x: Tensor, *dims) -> Tensor:
    """x reversed along each of dims (a copy, as in torch); dims as a sequence or as arguments."""
    d = _dims("flip", dims[0] if len(dims) == 1 else dims, x.ndim)
    if len(set(d)) != len(d):
        raise ValueError(f"flip: dims {list(d)} has a repeated dim")
    return Flip.apply(x, tuple(sorted(d)))


def roll(x: Tensor, shifts, dims=None) -> Tensor:
    """x rotated by shifts[i] along dims[i] (elements leaving one end come in at the other);
    without dims, over the flattened x, reshaped back."""
    s = _ints("roll", "shifts", shifts)
    if dims is None:
        if len(s) != 1:
            raise ValueError(f"roll: without dims, shifts must be one int, got {list(s)}")
        return reshape(Roll.apply(reshape(x, -1), s, (0,)), *x.shape)
    d = _dims("roll", dims, x.ndim)
    if len(s) != len(d):
        raise ValueError(f"roll: shifts {list(s)} and dims {list(d)} must have the same length")
    return Roll.apply(x, s, d)


def repeat(x: Tensor, *sizes) -> Tensor:
    """x tiled sizes[i] times along each dim (leading sizes add dims), as torch.Tensor.repeat."""
    if len(sizes) == 1 and not isinstance(sizes[0], numbers.Integral):
        sizes = sizes[0]
    reps = _ints("repeat", "sizes", sizes)
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: {len(reps)} sizes {list(reps)} cannot repeat x of shape {list(x.shape)} "
                         f"(give at least one per dim)")
    return Repeat.apply(x, reps)


def tile(x: Tensor, dims) -> Tensor:
    """torch.tile: repeat with dims padded with leading 1s to x's dims."""
    reps = _ints("tile", "dims", dims)
    return repeat(x, (1,) * (x.ndim - len(reps)) + reps)


def repeat_interleave(x: Tensor, repeats, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
    """Each element (slice along dim) repeated ``repeats`` times in place; without dim, over the flattened x.

    Tensor repeats (one per slice, or one for all) need the output's length: it is read back from
    the device (a host sync, as in torch) unless ``output_size`` is given.
    """
    if dim is None:
        x, dim = reshape(x, -1), 0
    d = _norm_dim("repeat_interleave", dim, x.ndim)
    if isinstance(repeats, numbers.Integral) and not isinstance(repeats, bool):
        return RepeatInterleave.apply(x, int(repeats), d)
    if not isinstance(repeats, (Tensor, torch.Tensor)):
        raise TypeError(f"repeat_interleave: repeats must be an int or a Tensor, got {type(repeats).__name__}")
    r = repeats.data if isinstance(repeats, Tensor) else repeats
    n = x.shape[d]
    if r.dim() > 1 or r.numel() not in (1, n):
        raise ValueError(f"repeat_interleave: repeats of shape {list(r.shape)} must hold one count or one per "
                         f"slice of dim {d} (x of shape {list(x.shape)})")
    if r.device != x.data.device:
        raise ValueError(f"repeat_interleave: repeats is on {r.device} but x is on {x.data.device}")
    r = r.reshape(-1).expand(n).contiguous() if r.numel() != n or r.dim() == 0 else r.contiguous()
    ends, table = call("segment_table", r, output_size=output_size)
    return TakeSegments.apply(x, ends, table, d)


def _check_matrix(op: str, x: Tensor) -> None:
    if x.ndim < 2:
        raise ValueError(f"{op}: x must have at least 2 dims, got shape {shape_str(x.shape)}")


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements above the diagonal-th diagonal of its last two dims zeroed."""
    _check_matrix("tril", x)
    return Tri.apply(x, int(diagonal), False)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """x with the elements below the diagonal-th diagonal of its last two dims zeroed."""
    _check_matrix("triu", x)
    return Tri.apply(x, int(diagonal), True)


def diag_embed(x: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """x [..., n] on the (offset) diagonal of new dims dim1, dim2 of size n + |offset|, zeros elsewhere."""
    nd = x.ndim + 1
    d1, d2 = _norm_dim("diag_embed", dim1, nd), _norm_dim("diag_embed", dim2, nd)
    return DiagEmbed.apply(x, int(offset), d1, d2)


def _install() -> None:
    T = Tensor
    T.split, T.chunk, T.narrow, T.diagonal = split, chunk, narrow, diagonal
    T.movedim, T.moveaxis = movedim, moveaxis
    T.flip, T.roll, T.repeat, T.tile, T.repeat_interleave = flip, roll, repeat, tile, repeat_interleave
    T.tril, T.triu, T.diag_embed = tril, triu, diag_embed


_install()
