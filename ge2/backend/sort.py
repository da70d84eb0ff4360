"""Sorting and selection: schemas and Triton implementations (kernels in ``ge2.kernels.sort``).

``sort(x, *, dim, descending=False) -> (values, indices)``       stable (equal values keep input order)
``topk(x, *, k, dim, largest=True) -> (values, indices)``        sorted; ties: lowest index first
``kthvalue(x, *, k, dim, keepdim=False) -> (values, indices)``   the k-th smallest, 1-based
``median(x, *, dim=None, keepdim=False)``                        lower median; dim None -> values only
``unique(x, *, return_inverse=False, return_counts=False, dim=None) -> (values, inverse | None, counts | None)``
``place_along_dim(g, index, *, dim, n) -> out``                  zeros with g at index along dim (gradients)
``multinomial_sample(p, state, *, num_samples, replacement) -> int64 [M, num_samples]``

indices are int64; x any strides; NaN sorts as the largest value.
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.dropout import STATE, _check_state
from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, normalize_dims, shape_str
from ge2.kernels import sort as K
from ge2.kernels.unique_dim import unique_dim

SORTABLE = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES


def _dim(op: str, x, dim) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    normalize_dims(op, dim, x.dim())
    return dim % x.dim() if x.dim() else 0


def _size(x, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


def _check_k(op: str, x, k, dim: int, low: int) -> None:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool):
        raise TypeError(f"{op}: k must be an int, got {k!r}")
    n = _size(x, dim)
    if not low <= k <= n:
        raise ValueError(f"{op}: k must be in [{low}, {n}] for dim {dim} of x {shape_str(x.shape)}, got {k}")


def _check_sort(op: str, x, *, dim=-1, descending=False) -> None:
    _dim(op, x, dim)


def _check_topk(op: str, x, *, k, dim=-1, largest=True) -> None:
    _check_k(op, x, k, _dim(op, x, dim), 0)


def _check_kthvalue(op: str, x, *, k, dim=-1, keepdim=False) -> None:
    _check_k(op, x, k, _dim(op, x, dim), 1)


def _check_median(op: str, x, *, dim=None, keepdim=False) -> None:
    if dim is not None:
        d = _dim(op, x, dim)
        if _size(x, d) == 0:
            raise ValueError(f"{op}: cannot take the median over dim {d} of size 0 (x {shape_str(x.shape)})")
    elif x.numel() == 0:
        raise ValueError(f"{op}: cannot take the median of an empty tensor {shape_str(x.shape)}")


defop("sort", Schema((TensorArg("x", SORTABLE),), _check_sort))
register("sort", "triton", dtypes=SORTABLE)(lambda x, *, dim=-1, descending=False: K.sort(x, dim=dim, descending=descending))
defop("topk", Schema((TensorArg("x", SORTABLE),), _check_topk))
register("topk", "triton", dtypes=SORTABLE)(lambda x, *, k, dim=-1, largest=True: K.topk(x, int(k), dim=dim, largest=largest))
defop("kthvalue", Schema((TensorArg("x", SORTABLE),), _check_kthvalue))
register("kthvalue", "triton", dtypes=SORTABLE)(
    lambda x, *, k, dim=-1, keepdim=False: K.kthvalue(x, int(k), dim=dim, keepdim=keepdim))
defop("median", Schema((TensorArg("x", SORTABLE),), _check_median))
register("median", "triton", dtypes=SORTABLE)(K.median)
def _check_unique(op: str, x, *, return_inverse=False, return_counts=False, dim=None) -> None:
    if dim is None:
        return
    if x.dim() == 0:
        raise ValueError(f"{op}: dim={dim} given but x is 0-d (unique over slices needs a dim)")
    d = _dim(op, x, dim)
    if any(s == 0 for i, s in enumerate(x.shape) if i != d):
        raise ValueError(f"{op}: x {shape_str(x.shape)} has a zero-size dim other than dim {d}: "
                         f"unique over slices along dim {d} is undefined (torch refuses it too)")


def _unique(x, *, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        return K.unique(x, return_inverse=return_inverse, return_counts=return_counts)
    return unique_dim(x, dim % x.dim(), return_inverse=return_inverse, return_counts=return_counts)


defop("unique", Schema((TensorArg("x", SORTABLE),), _check_unique))
register("unique", "triton", dtypes=SORTABLE)(_unique)


def _check_place(op: str, g, index, *, dim, n) -> None:
    if g.shape != index.shape:
        raise ValueError(f"{op}: g {shape_str(g.shape)} and index {shape_str(index.shape)} must have one shape")
    _dim(op, g, dim)


def _place_along_dim(g, index, *, dim, n):
    if g.dim() == 0:
        return K.place(g.reshape(1, 1), index.reshape(1, 1), 1).reshape(())
    d = dim % g.dim()
    g2, index2 = g.movedim(d, -1), index.movedim(d, -1)
    lead = g2.shape[:-1]
    out = K.place(g2.reshape(-1, g2.shape[-1]), index2.reshape(-1, g2.shape[-1]), n)
    return out.reshape(*lead, n).movedim(-1, d)


defop("place_along_dim", Schema((TensorArg("g", FLOAT_DTYPES), TensorArg("index", (torch.int64,))), _check_place))
register("place_along_dim", "triton")(_place_along_dim)


def _check_multinomial(op: str, p, state, *, num_samples, replacement) -> None:
    _check_state(op, state)
    if not isinstance(num_samples, numbers.Integral) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"{op}: num_samples must be a positive int, got {num_samples!r}")
    if p.shape[1] == 0:
        raise ValueError(f"{op}: p {shape_str(p.shape)} has no categories")
    if not replacement and num_samples > p.shape[1]:
        raise ValueError(f"{op}: cannot draw {num_samples} samples without replacement from {p.shape[1]} "
                         f"categories (p {shape_str(p.shape)})")


defop("multinomial_sample", Schema((TensorArg("p", FLOAT_DTYPES, ndim=(2,)), STATE), _check_multinomial))
register("multinomial_sample", "triton")(
    lambda p, state, *, num_samples, replacement: K.multinomial(p, int(num_samples), bool(replacement), state))
