"""Embedding lookup with gradients (ops in ``ge2.backend.embedding``)."""
from __future__ import annotations

from ge2 import backend
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor

call = backend.call


class Embedding(Function):
    @staticmethod
    def forward(ctx, idx, weight, padding_idx):
        ctx.save_for_backward(idx)
        ctx.num_embeddings, ctx.dtype, ctx.padding_idx = weight.shape[0], weight.dtype, padding_idx
        return call("embedding", idx, weight)

    @staticmethod
    def backward(ctx, gy):
        (idx,) = ctx.saved_tensors
        gw = call("embedding_backward", gy, idx, num_embeddings=ctx.num_embeddings, padding_idx=ctx.padding_idx,
                  dtype=ctx.dtype)
        return None, gw, None


def embedding(idx: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """weight[idx]: int indices of any shape into a [V, D] table -> [*idx.shape, D]; padding_idx gets no gradient."""
    if not isinstance(idx, Tensor) or idx.dtype.is_floating_point:
        raise TypeError(f"embedding: indices must be an integer Tensor, got "
                        f"{idx.dtype if isinstance(idx, Tensor) else type(idx).__name__}")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return Embedding.apply(idx, weight, padding_idx)
