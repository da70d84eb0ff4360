"""torch reference of the embedding ops."""
from __future__ import annotations

import torch

from ge2.backend.registry import FLOAT_DTYPES, register


@register("embedding", "torch", dtypes=(torch.int32, torch.int64))
def embedding(idx, weight, *, check=None):
    V = weight.shape[0]
    bad = int(((idx < 0) | (idx >= V)).sum()) if check is not False else 0
    if bad:
        raise ValueError(f"embedding: {bad} index value(s) out of range: a table of {V} rows (valid: 0..{V - 1}); "
                         "their rows are NaN")
    return torch.nn.functional.embedding(idx.long(), weight).contiguous()


@register("embedding_backward", "torch", dtypes=FLOAT_DTYPES)
def embedding_backward(gy, idx, *, num_embeddings, padding_idx=None, dtype):
    D = gy.shape[-1]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    gw = torch.zeros((num_embeddings, D), dtype=acc, device=gy.device)
    gw.index_add_(0, idx.reshape(-1).long(), gy.reshape(-1, D).to(acc))
    if padding_idx is not None:
        gw[padding_idx] = 0
    return gw.to(dtype)
