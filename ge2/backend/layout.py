"""Layout ops: schemas and Triton implementations (kernels in ``ge2.kernels.layout``).

``flip(x, *, dims)``                         y [x.shape]; dims: sorted non-negative ints
``roll(x, *, shifts, dims)``                 y [x.shape]; one shift per dim
``repeat(x, *, repeats)``                    y [r0 s0, r1 s1, ...]; x padded with leading 1s to len(repeats)
``repeat_interleave(x, *, repeats, dim)``    y: dim d of size s -> s * repeats (int repeats)
``repeat_interleave_backward(gy, ends, *, repeats, dim, n)``  segment sums of gy along dim (ends or int repeats)
``segment_table(repeats, *, output_size)``   (ends [n + 1], table [total]) of tensor repeats (documented sync)
``take_segments(x, table, *, dim)``          y with y[.., o, ..] = x[.., table[o], ..] along dim
``tri(x, *, diagonal, upper)``               tril (upper=False) / triu of the last two dims
``diag_embed(x, *, offset, dim1, dim2)``     zeros with x's last dim on the (offset) diagonal of dims dim1, dim2

Data movement only: every dtype (float, int, bool); results contiguous.
"""
from __future__ import annotations

import math
import numbers

import torch

from ge2.backend.registry import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import layout as K

X = TensorArg("x", ALL_DTYPES)


def _flip(x, *, dims):
    xs, x0 = list(x.stride()), 0
    for d in dims:
        if x.shape[d] > 0:
            x0 += (x.shape[d] - 1) * xs[d]
        xs[d] = -xs[d]
    return K.remap(x, torch.empty(x.shape, dtype=x.dtype, device=x.device), xs=xs, x0=x0)


def _roll(x, *, shifts, dims):
    shift = [0] * x.dim()
    for s, d in zip(shifts, dims):
        if x.shape[d]:
            shift[d] = (shift[d] - s) % x.shape[d]
    return K.remap(x, torch.empty(x.shape, dtype=x.dtype, device=x.device), xs=x.stride(), shift=shift, mode=K.WRAP)


def _repeat(x, *, repeats):
    lead = len(repeats) - x.dim()
    shape = (1,) * lead + tuple(x.shape)
    strides = (0,) * lead + tuple(x.stride())
    y = torch.empty([r * s for r, s in zip(repeats, shape)], dtype=x.dtype, device=x.device)
    # y viewed as [r0, s0, r1, s1, ...] reads x through stride 0 along each r
    split = [v for r, s in zip(repeats, shape) for v in (r, s)]
    xs = [v for st in strides for v in (0, st)]
    K.remap(x, y.view(split), xs=xs)
    return y


def _repeat_interleave(x, *, repeats, dim):
    shape = list(x.shape)
    y = torch.empty(shape[:dim] + [shape[dim] * repeats] + shape[dim + 1:], dtype=x.dtype, device=x.device)
    xs = list(x.stride())
    K.remap(x, y.view(shape[:dim] + [shape[dim], repeats] + shape[dim + 1:]), xs=xs[:dim + 1] + [0] + xs[dim + 1:])
    return y


def _repeat_interleave_backward(gy, ends, *, repeats, dim, n):
    outer, inner = math.prod(gy.shape[:dim]), math.prod(gy.shape[dim + 1:])
    g3 = gy.reshape(outer, gy.shape[dim], inner)
    gx = K.segment_sum(g3, n, repeats=repeats, ends=ends)
    return gx.reshape(*gy.shape[:dim], n, *gy.shape[dim + 1:])


def _segment_table(repeats, *, output_size):
    n = repeats.numel()
    ends = K.segment_ends(repeats)
    if output_size is None:
        # the output's length lives on the device: one read back (torch syncs here too)
        total, bad = ends[n - 1:].tolist() if n else (0, ends[0].item())
        if bad:
            raise ValueError(f"repeat_interleave: repeats must be non-negative, got {bad} negative value(s)")
    else:
        total = output_size
    return ends, K.segment_ids(ends, n, total)


def _take_segments(x, table, *, dim):
    shape = list(x.shape)
    shape[dim] = table.numel()
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    return K.remap(x, y, xs=x.stride(), table=table, table_dim=dim)


def _tri(x, *, diagonal, upper):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return K.remap(x, y, xs=x.stride(), tri=K.TRIU if upper else K.TRIL, diag=diagonal)


def diag_embed_shape(shape, offset, dim1, dim2) -> list[int]:
    """The shape torch.diag_embed gives: x's last dim n becomes two dims of n + |offset| at dim1, dim2."""
    n = shape[-1] + abs(offset)
    out = list(shape[:-1])
    for d in sorted((dim1, dim2)):
        out.insert(d, n)
    return out


def _diag_embed(x, *, offset, dim1, dim2):
    y = torch.zeros(diag_embed_shape(x.shape, offset, dim1, dim2), dtype=x.dtype, device=x.device)
    K.copy_(y.diagonal(offset, dim1, dim2), x)
    return y


def _int(op: str, name: str, v) -> None:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}")


def _check_dims(op, x, *, dims, shifts=None):
    for d in dims:
        if not 0 <= d < max(x.dim(), 1):
            raise ValueError(f"{op}: dim {d} is out of range for x of shape {shape_str(x.shape)}")


def _check_repeat(op, x, *, repeats):
    if len(repeats) < x.dim():
        raise ValueError(f"{op}: {len(repeats)} repeats cannot repeat x of shape {shape_str(x.shape)} "
                         f"(give at least one per dim)")
    for r in repeats:
        _int(op, "repeats", r)
        if r < 0:
            raise ValueError(f"{op}: repeats must be non-negative, got {list(repeats)}")


def _check_interleave(op, x, *, repeats, dim):
    _int(op, "repeats", repeats)
    if repeats < 0:
        raise ValueError(f"{op}: repeats must be non-negative, got {repeats}")
    _check_dims(op, x, dims=(dim,))


def _check_interleave_bwd(op, gy, ends, *, repeats, dim, n):
    _check_dims(op, gy, dims=(dim,))


def _check_table(op, repeats, *, output_size):
    if repeats.dim() > 1:
        raise ValueError(f"{op}: repeats must be 0-D or 1-D, got shape {shape_str(repeats.shape)}")
    if output_size is not None and (not isinstance(output_size, numbers.Integral) or output_size < 0):
        raise ValueError(f"{op}: output_size must be a non-negative int, got {output_size!r}")


def _check_take(op, x, table, *, dim):
    _check_dims(op, x, dims=(dim,))


def _check_tri(op, x, *, diagonal, upper):
    if x.dim() < 2:
        raise ValueError(f"{op}: x must have at least 2 dims, got shape {shape_str(x.shape)}")
    _int(op, "diagonal", diagonal)


def _check_diag_embed(op, x, *, offset, dim1, dim2):
    _int(op, "offset", offset)
    nd = x.dim() + 1
    for name, d in (("dim1", dim1), ("dim2", dim2)):
        if not 0 <= d < nd:
            raise ValueError(f"{op}: {name}={d} is out of range for a {nd}-D result (x of shape {shape_str(x.shape)})")
    if dim1 == dim2:
        raise ValueError(f"{op}: dim1 and dim2 must differ, both are {dim1}")
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least 1 dim, got a 0-D tensor")


defop("flip", Schema((X,), _check_dims))
defop("roll", Schema((X,), _check_dims))
defop("repeat", Schema((X,), _check_repeat))
defop("repeat_interleave", Schema((X,), _check_interleave))
defop("repeat_interleave_backward", Schema((TensorArg("gy", FLOAT_DTYPES), TensorArg("ends", (torch.int64,), optional=True)),
                                           _check_interleave_bwd))
defop("segment_table", Schema((TensorArg("repeats", INT_DTYPES),), _check_table))
defop("take_segments", Schema((X, TensorArg("table", (torch.int64,), ndim=(1,))), _check_take))
defop("tri", Schema((X,), _check_tri))
defop("diag_embed", Schema((X,), _check_diag_embed))

for _name, _fn in (("flip", _flip), ("roll", _roll), ("repeat", _repeat), ("repeat_interleave", _repeat_interleave),
                   ("take_segments", _take_segments), ("tri", _tri), ("diag_embed", _diag_embed)):
    register(_name, "triton", dtypes=ALL_DTYPES)(_fn)
register("repeat_interleave_backward", "triton")(_repeat_interleave_backward)
register("segment_table", "triton", dtypes=INT_DTYPES)(_segment_table)
