"""torch reference implementations of the scans."""
from __future__ import annotations

import torch

from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, register


def _scan(fn, x, dim, reverse):
    if x.dim() == 0:
        return fn(x.reshape(1), 0).reshape(())
    if reverse:
        return fn(x.flip(dim), dim).flip(dim)
    return fn(x, dim)


@register("cumsum", "torch", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)
def cumsum(x, *, dim, reverse=False):
    return _scan(lambda t, d: torch.cumsum(t, d, dtype=t.dtype if t.is_floating_point() else torch.int64), x, dim, reverse)


@register("cumprod", "torch", dtypes=FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES)
def cumprod(x, *, dim, reverse=False):
    return _scan(lambda t, d: torch.cumprod(t, d, dtype=t.dtype if t.is_floating_point() else torch.int64), x, dim, reverse)


@register("logcumsumexp", "torch")
def logcumsumexp(x, *, dim, reverse=False):
    return _scan(torch.logcumsumexp, x, dim, reverse)
