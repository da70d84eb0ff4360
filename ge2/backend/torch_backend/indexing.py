"""torch reference of the indexing ops (ge2.backend.indexing)."""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, register


def _key(x, indices, adv_dims):
    key = [slice(None)] * x.dim()
    for d, t in zip(adv_dims, [t for t in indices if t is not None]):
        key[d] = t.long()
    return tuple(key)


def _bad(op, t, size):
    if ((t < -size) | (t >= size)).any():
        raise ValueError(f"{op}: index value(s) out of range for a dim of size {size}")


@register("index_read", "torch", dtypes=ALL_DTYPES)
def index_read(x, *indices, adv_dims, check=None):
    for d, t in zip(adv_dims, [t for t in indices if t is not None]):
        _bad("index", t, x.shape[d])
    return x[_key(x, indices, adv_dims)]


@register("index_write", "torch", dtypes=ALL_DTYPES)
def index_write(x, value, *indices, adv_dims, accumulate=False, check=None):
    for d, t in zip(adv_dims, [t for t in indices if t is not None]):
        _bad("index_put", t, x.shape[d])
    key = [k if isinstance(k, torch.Tensor) else None for k in _key(x, indices, adv_dims)]
    torch.ops.aten.index_put_(x, key, value.to(x.dtype), accumulate)
    return x


@register("index_select", "torch", dtypes=ALL_DTYPES)
def index_select(x, index, *, dim, check=None):
    return torch.index_select(x, dim, index.long())


@register("index_put_along", "torch", dtypes=ALL_DTYPES)
def index_put_along(x, index, src, *, dim, mode, op_name="index_put", alpha=None, check=None):
    index = index.long().reshape(-1)
    if mode == "add":
        x.index_add_(dim, index, src, alpha=1 if alpha is None else alpha)
    elif isinstance(src, torch.Tensor):
        x.index_copy_(dim, index, src)
    else:
        x.index_fill_(dim, index, src)
    return x


@register("nonzero", "torch", dtypes=ALL_DTYPES)
def nonzero(x, *, as_tuple=False):
    return torch.nonzero(x, as_tuple=as_tuple)


@register("one_hot", "torch", dtypes=(torch.int64,))
def one_hot(index, *, num_classes, check=None):
    return torch.nn.functional.one_hot(index, num_classes)
