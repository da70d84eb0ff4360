"""Reference of the layout ops, written with torch."""
from __future__ import annotations

import torch

from ge2.backend.layout import diag_embed_shape
from ge2.backend.registry import ALL_DTYPES, INT_DTYPES, register


def _interleave_backward(gy, ends, *, repeats, dim, n):
    if ends is None:
        shape = list(gy.shape)
        return gy.reshape(shape[:dim] + [n, repeats] + shape[dim + 1:]).sum(dim + 1)
    counts = torch.diff(ends[:n], prepend=ends.new_zeros(1))
    seg = torch.repeat_interleave(torch.arange(n, device=gy.device), counts)
    out = gy.new_zeros(gy.shape[:dim] + (n,) + gy.shape[dim + 1:])
    return out.index_add_(dim, seg, gy)


def _segment_table(repeats, *, output_size):
    r = repeats.reshape(-1).long()
    ends = torch.cat([r.cumsum(0), (r < 0).sum().reshape(1)])
    return ends, torch.repeat_interleave(torch.arange(r.numel(), device=r.device), r, output_size=output_size)


def _diag_embed(x, *, offset, dim1, dim2):
    y = torch.zeros(diag_embed_shape(x.shape, offset, dim1, dim2), dtype=x.dtype, device=x.device)
    y.diagonal(offset, dim1, dim2).copy_(x)
    return y


for _name, _fn in (
    ("flip", lambda x, *, dims: x.flip(dims)),
    ("roll", lambda x, *, shifts, dims: x.roll(shifts, dims)),
    ("repeat", lambda x, *, repeats: x.repeat(repeats)),
    ("repeat_interleave", lambda x, *, repeats, dim: x.repeat_interleave(repeats, dim)),
    ("take_segments", lambda x, table, *, dim: x.index_select(dim, table)),
    ("tri", lambda x, *, diagonal, upper: x.triu(diagonal) if upper else x.tril(diagonal)),
    ("diag_embed", _diag_embed),
):
    register(_name, "torch", dtypes=ALL_DTYPES)(_fn)
register("repeat_interleave_backward", "torch")(_interleave_backward)
register("segment_table", "torch", dtypes=INT_DTYPES)(_segment_table)
