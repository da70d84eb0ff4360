"""Embedding ops: schemas and Triton implementations (kernels in ``ge2.kernels.embedding``).

``embedding(idx, weight, *, check=None) -> y``   y = weight[idx]: idx any int shape, weight [V, D] -> [*idx, D]
    An out-of-range index raises ValueError: at once on the CPU or with ``check=True`` (a 4-byte host
    read), on the GPU by default without a host sync, by a later indexing call or
    ``ge2.check_pending_indices()``; ``check=False`` skips it and leaves NaN rows.
``embedding_backward(gy, idx, *, num_embeddings, padding_idx=None, dtype) -> dweight [V, D]``
    the gy rows summed per index; the padding_idx row gets no gradient.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import embedding as K

INDEX_DTYPES = (torch.int32, torch.int64)


def _check_embedding(op: str, idx, weight, *, check=None) -> None:
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [num_embeddings, dim], got {shape_str(weight.shape)}")


defop("embedding", Schema((TensorArg("idx", INDEX_DTYPES), TensorArg("weight", FLOAT_DTYPES)), _check_embedding))
register("embedding", "triton", dtypes=INDEX_DTYPES)(lambda idx, weight, *, check=None: K.embedding(idx, weight, check))


def _check_embedding_backward(op: str, gy, idx, *, num_embeddings, padding_idx=None, dtype) -> None:
    if tuple(gy.shape[:-1]) != tuple(idx.shape):
        raise ValueError(f"{op}: gy {shape_str(gy.shape)} must be idx's shape {shape_str(idx.shape)} plus the "
                         "embedding dim")
    if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
        raise ValueError(f"{op}: padding_idx {padding_idx} is outside 0..{num_embeddings - 1}")


defop("embedding_backward", Schema((TensorArg("gy", FLOAT_DTYPES), TensorArg("idx", INDEX_DTYPES)),
                                   _check_embedding_backward))
register("embedding_backward", "triton")(
    lambda gy, idx, *, num_embeddings, padding_idx=None, dtype:
    K.embedding_backward(gy, idx, num_embeddings, padding_idx, dtype))
