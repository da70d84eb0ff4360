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
