"""``Embedding``: a lookup table of vectors (kernels in ``ge2.kernels.embedding``)."""
from __future__ import annotations

import torch

from ge2 import runtime
from ge2.autograd.embedding import embedding
from ge2.autograd.tensor import Tensor
from ge2.nn import init
from ge2.nn.module import Module
from ge2.nn.parameter import Parameter


class Embedding(Module):
    """weight [num_embeddings, embedding_dim] ~ N(0, 1) like torch; the padding_idx row starts at 0 and gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is outside the table of {num_embeddings} rows")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(torch.empty((num_embeddings, embedding_dim), device=runtime.resolve_device(device),
                                            dtype=dtype or torch.get_default_dtype()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx].fill_(0.0)

    def forward(self, idx: Tensor) -> Tensor:
        return embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")
