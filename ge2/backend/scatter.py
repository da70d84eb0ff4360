"""Gather/scatter along a dim: schemas and Triton implementations (kernels in ``ge2.kernels.scatter``).

``gather(x, index, *, dim, check=None) -> out``                 out has index's shape, x's dtype
``scatter(x, index, src, *, dim, reduce="store", include_self=True, check=None) -> out``
    a copy of x with src (a tensor at least index's size in every dim, or a number) scattered along
    dim; reduce: store (scatter), add (scatter_add), sum, prod, mean, amax, amin (scatter_reduce).

Index tensors must have x's number of dims and index.size(d) <= x.size(d) for d != dim, as torch.
Out-of-range indices raise ValueError (at once on the CPU, deferred on the GPU: ge2.kernels.scatter).
"""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import scatter as K

INDEX_DTYPES = (torch.int64, torch.int32)
REDUCTIONS = ("store", "add", "sum", "prod", "mean", "amax", "amin")


def _check_dim_index(op: str, x, index, dim) -> int:
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise ValueError(f"{op}: dim {dim} is out of range for a tensor of shape {shape_str(x.shape)}")
    d = dim % nd
    if max(index.dim(), 1) != nd:
        raise ValueError(f"{op}: index {shape_str(index.shape)} must have as many dims as x {shape_str(x.shape)}")
    xs, ix = list(x.shape) or [1], list(index.shape) or [1]
    for k, (a, b) in enumerate(zip(ix, xs)):
        if k != d and a > b:
            raise ValueError(f"{op}: index {shape_str(index.shape)} is larger than x {shape_str(x.shape)} in dim {k}")
    return d


def _check_gather(op: str, x, index, *, dim, check=None) -> None:
    _check_dim_index(op, x, index, dim)


def _check_scatter(op: str, x, index, src, *, dim, reduce="store", include_self=True, op_name=None,
                   check=None) -> None:
    name = op_name or op
    _check_dim_index(name, x, index, dim)
    if reduce not in REDUCTIONS:
        raise ValueError(f"{name}: reduce must be one of {', '.join(REDUCTIONS[2:])}, got {reduce!r}")
    if isinstance(src, torch.Tensor):
        if max(src.dim(), 1) != max(index.dim(), 1) or any(a > b for a, b in zip(index.shape, src.shape)):
            raise ValueError(f"{name}: src {shape_str(src.shape)} must be at least index's size "
                             f"{shape_str(index.shape)} in every dim")
        if src.dtype != x.dtype:
            raise TypeError(f"{name}: src has dtype {src.dtype}, x has {x.dtype}; they must match")
    if reduce == "mean" and not x.dtype.is_floating_point and x.dtype == torch.bool:
        raise TypeError(f"{name}: reduce='mean' does not apply to bool tensors")


def _nd(t):
    return t if not isinstance(t, torch.Tensor) or t.dim() else t.reshape(1)


defop("gather", Schema((TensorArg("x"), TensorArg("index", INDEX_DTYPES)), _check_gather))
register("gather", "triton", dtypes=ALL_DTYPES)(
    lambda x, index, *, dim, check=None:
    K.gather(_nd(x), dim % max(x.dim(), 1), _nd(index), check).reshape(index.shape))

defop("scatter", Schema((TensorArg("x"), TensorArg("index", INDEX_DTYPES), TensorArg("src", scalar_ok=True)),
                        _check_scatter))
register("scatter", "triton", dtypes=ALL_DTYPES)(
    lambda x, index, src, *, dim, reduce="store", include_self=True, op_name=None, check=None:
    K.scatter(_nd(x), dim % max(x.dim(), 1), _nd(index), _nd(src), reduce, include_self,
              op=op_name or "scatter", check=check).reshape(x.shape))
