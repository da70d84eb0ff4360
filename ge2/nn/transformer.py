"""``TransformerEncoderLayer`` and ``TransformerEncoder`` with torch's constructor, forward and state_dict keys.

Post-norm (torch's default) or pre-norm (``norm_first=True``): self-attention through
``MultiheadAttention``'s fused path (need_weights=False), a feed-forward whose activation (relu or
gelu) runs in ``linear1``'s GEMM epilogue, dropout after attention, inside and after the
feed-forward, and a LayerNorm per sub-block.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch

from ge2.autograd.dropout import new_rng_state
from ge2.autograd.tensor import Tensor
from ge2.nn.attention import MultiheadAttention
from ge2.nn.container import ModuleList
from ge2.nn.dropout import Dropout
from ge2.nn.linear import Linear
from ge2.nn.module import Module
from ge2.nn.normalization import LayerNorm

_FUSED = {"relu": "relu", "gelu": "gelu"}  # activations linear1's epilogue computes


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: src [S, N, E] (or [N, S, E] with batch_first, or [S, E]) -> same shape."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if isinstance(activation, str) and activation not in _FUSED:
            raise ValueError(f"TransformerEncoderLayer: activation should be relu/gelu, not {activation!r}")
        fused = _FUSED.get(activation) if isinstance(activation, str) else None
        # parameters first, in torch's order, so the same seed gives torch's weights
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, activation=fused, device=device, dtype=dtype)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout, self.dropout1, self.dropout2 = (Dropout(dropout, device=device) for _ in range(3))
        self.activation = None if fused else activation  # a callable runs after linear1's GEMM

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        h = self.linear1(x)
        if self.activation is not None:
            h = self.activation(h)
        return self.dropout2(self.linear2(self.dropout(h)))

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: ``num_layers`` deep copies of ``encoder_layer``, then an optional norm."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = ModuleList(copy.deepcopy(encoder_layer) for _ in range(num_layers))
        for name, state in self.layers.named_buffers():
            if name.endswith("rng_state"):  # a copied dropout would draw its original's masks
                state.data.copy_(new_rng_state(state.device))
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        return self.norm(x) if self.norm is not None else x
