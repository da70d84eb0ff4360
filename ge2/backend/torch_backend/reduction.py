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


ALL = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES


def _reduced(dims, ndim):
    """dims as torch's reductions take them; None and () mean every dim."""
    return tuple(range(ndim)) if dims is None or dims == () else dims


def _reduce_dims(fn, x, dims, keepdim, **kw):
    if x.dim() == 0:
        return fn(x.reshape(1), 0, keepdim=False, **kw).reshape(())
    return fn(x, _reduced(dims, x.dim()), keepdim=keepdim, **kw)


@register("amin", "torch", dtypes=ALL)
def amin(x, *, dims=None, keepdim=False):
    return x.clone() if x.dim() == 0 else x.amin(_reduced(dims, x.dim()), keepdim=keepdim)


@register("min", "torch", dtypes=ALL)
def min_dim(x, *, dim, keepdim=False):
    v, i = x.min(dim, keepdim=keepdim)
    return v, i


@register("argmax", "torch", dtypes=ALL)
def argmax(x, *, dim=None, keepdim=False):
    return (x.to(torch.uint8) if x.dtype == torch.bool else x).argmax(dim, keepdim=keepdim)


@register("argmin", "torch", dtypes=ALL)
def argmin(x, *, dim=None, keepdim=False):
    return (x.to(torch.uint8) if x.dtype == torch.bool else x).argmin(dim, keepdim=keepdim)


@register("prod", "torch", dtypes=ALL)
def prod(x, *, dims=None, keepdim=False, skip_zeros=False):
    if skip_zeros:
        x = torch.where(x == 0, torch.ones_like(x), x)
    out = x.to(x.dtype if x.dtype.is_floating_point else torch.int64)
    if out.dim() == 0:
        return out.clone()
    reduced = [d % x.dim() for d in ((_reduced(dims, x.dim()),) if isinstance(dims, int) else _reduced(dims, x.dim()))]
    for d in sorted(reduced, reverse=True):
        out = out.prod(d, keepdim=True)
    if not keepdim:
        out = out.reshape([s for i, s in enumerate(out.shape) if i not in reduced])
    return out


@register("var", "torch")
def var(x, *, dims=None, correction=1, keepdim=False):
    return _reduce_dims(torch.var, x, dims, keepdim, correction=correction)


@register("std", "torch")
def std(x, *, dims=None, correction=1, keepdim=False):
    return _reduce_dims(torch.std, x, dims, keepdim, correction=correction)


@register("vector_norm", "torch")
def vector_norm(x, *, ord=2.0, dims=None, keepdim=False):
    return torch.linalg.vector_norm(x, ord=ord, dim=None if x.dim() == 0 else _reduced(dims, x.dim()), keepdim=keepdim)


@register("logsumexp", "torch")
def logsumexp(x, *, dims=None, keepdim=False):
    return _reduce_dims(torch.logsumexp, x, dims, keepdim)


@register("all", "torch", dtypes=ALL)
def all_(x, *, dims=None, keepdim=False):
    return x.bool().clone() if x.dim() == 0 else x.all(_reduced(dims, x.dim()), keepdim=keepdim)


@register("any", "torch", dtypes=ALL)
def any_(x, *, dims=None, keepdim=False):
    return x.bool().clone() if x.dim() == 0 else x.any(_reduced(dims, x.dim()), keepdim=keepdim)


@register("count_nan", "torch")
def count_nan(x, *, dims=None, keepdim=False):
    return sum_(torch.isnan(x), dims=dims, keepdim=keepdim)
