"""torch reference implementations of the reductions."""
from __future__ import annotations

import torch

from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, register


def _dims(dims, ndim):
    return tuple(range(ndim)) if dims is None else dims


@register("sum", "torch", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)
def sum_(x, *, dims=None, keepdim=False):
    if x.dim() == 0:
        return x.sum() if not keepdim else x.sum().reshape(())
    return x.sum(_dims(dims, x.dim()), keepdim=keepdim)


@register("mean", "torch")
def mean(x, *, dims=None, keepdim=False):
    if x.dim() == 0:
        return x.clone()
    return x.mean(_dims(dims, x.dim()), keepdim=keepdim)


@register("amax", "torch", dtypes=FLOAT_DTYPES + INT_DTYPES)
def amax(x, *, dims=None, keepdim=False):
    if x.dim() == 0:
        return x.clone()
    return x.amax(_dims(dims, x.dim()), keepdim=keepdim)


@register("max", "torch", dtypes=FLOAT_DTYPES + INT_DTYPES)
def max_dim(x, *, dim, keepdim=False):
    v, i = x.max(dim, keepdim=keepdim)
    return v, i
