"""Reductions: schemas and Triton implementations (kernels in ``ge2.kernels.reduction``).

``dims`` is an int, a tuple of ints or None (all dims); negative dims count from the end.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, normalize_dims
from ge2.kernels import reduction as K


def _check_dims(op: str, x, *, dims=None, keepdim: bool = False) -> None:
    normalize_dims(op, dims, x.dim())


def _check_dim(op: str, x, *, dim: int, keepdim: bool = False) -> None:
    normalize_dims(op, dim, x.dim())
    if x.numel() == 0:
        raise ValueError(f"{op}: cannot reduce an empty tensor of shape {list(x.shape)} (no identity)")


def _check_amax(op: str, x, *, dims=None, keepdim: bool = False) -> None:
    d = normalize_dims(op, dims, x.dim()) or range(x.dim())  # () means all dims, like torch
    if x.dim() > 0 and any(x.shape[i] == 0 for i in d):
        raise ValueError(f"{op}: cannot reduce an empty tensor of shape {list(x.shape)} (no identity)")


# sum: floats keep their dtype (fp32 accumulation); ints and bool sum to int64, like torch.
defop("sum", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),), _check_dims))
register("sum", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(K.sum)

defop("mean", Schema((TensorArg("x", FLOAT_DTYPES),), _check_dims))
register("mean", "triton")(K.mean)

# amax: max values over dims (NaN propagates).
defop("amax", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES),), _check_amax))
register("amax", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES)(K.amax)

# max over one dim: (values, int64 indices of the first maximum), like torch.max(x, dim).
defop("max", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES),), _check_dim))
register("max", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES)(K.max_dim)

# amin / min over one dim / argmax / argmin: as amax / max; argmax(dim=None) indexes the flattened x.
defop("amin", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),), _check_amax))
register("amin", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(K.amin)
defop("min", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),), _check_dim))
register("min", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(K.min_dim)


def _check_arg(op: str, x, *, dim=None, keepdim: bool = False) -> None:
    if dim is not None:
        _check_dim(op, x, dim=dim)
    elif x.numel() == 0:
        raise ValueError(f"{op}: cannot reduce an empty tensor of shape {list(x.shape)} (no identity)")


for _name, _fn in (("argmax", K.argmax), ("argmin", K.argmin)):
    defop(_name, Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),), _check_arg))
    register(_name, "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(_fn)

# prod: dtype as sum; skip_zeros (for prod's gradient) multiplies the nonzero elements only.
defop("prod", Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),),
                     lambda op, x, *, dims=None, keepdim=False, skip_zeros=False: _check_dims(op, x, dims=dims)))
register("prod", "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(K.prod)


def _check_var(op: str, x, *, dims=None, correction=1, keepdim: bool = False) -> None:
    _check_dims(op, x, dims=dims)
    if isinstance(correction, bool) or not isinstance(correction, (int, float)):
        raise TypeError(f"{op}: correction must be a number, got {type(correction).__name__}")


for _name, _fn in (("var", K.var), ("std", K.std)):
    defop(_name, Schema((TensorArg("x", FLOAT_DTYPES),), _check_var))
    register(_name, "triton")(_fn)


def _check_norm(op: str, x, *, ord=2.0, dims=None, keepdim: bool = False) -> None:  # noqa: A002
    _check_dims(op, x, dims=dims)
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"{op}: ord must be a number (inf, -inf, 0, p), got {ord!r}")
    if ord < 0 and x.numel() and any(x.shape[d] == 0 for d in (normalize_dims(op, dims, x.dim()) or range(x.dim()))):
        raise ValueError(f"{op}: ord {ord} of an empty reduction of shape {list(x.shape)} is undefined")


defop("vector_norm", Schema((TensorArg("x", FLOAT_DTYPES),), _check_norm))
register("vector_norm", "triton")(K.vector_norm)

defop("logsumexp", Schema((TensorArg("x", FLOAT_DTYPES),), _check_dims))
register("logsumexp", "triton")(K.logsumexp)

# all / any: bool results over any dtype (NaN counts as nonzero, like torch).
for _name, _fn in (("all", K.all), ("any", K.any)):
    defop(_name, Schema((TensorArg("x", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),), _check_dims))
    register(_name, "triton", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)(_fn)

defop("count_nan", Schema((TensorArg("x", FLOAT_DTYPES),), _check_dims))
register("count_nan", "triton")(K.count_nan)
