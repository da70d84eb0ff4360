"""torch reference of the gather/scatter ops (ge2.backend.scatter)."""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, register


@register("gather", "torch", dtypes=ALL_DTYPES)
def gather(x, index, *, dim, check=None):
    return torch.gather(x, dim, index.long())


@register("scatter", "torch", dtypes=ALL_DTYPES)
def scatter(x, index, src, *, dim, reduce="store", include_self=True, op_name=None, check=None):
    index = index.long()
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=x.dtype, device=x.device)
    if reduce == "store":
        return torch.scatter(x, dim, index, src)
    if reduce == "add" and include_self:
        return torch.scatter_add(x, dim, index, src)
    return torch.scatter_reduce(x, dim, index, src, "sum" if reduce == "add" else reduce, include_self=include_self)
