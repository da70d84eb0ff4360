"""``MultiheadAttention`` with torch's constructor, forward, initialisation and state_dict keys.

Self-attention projects q, k and v with one GEMM (``in_proj_weight`` [3E, E]) and splits the result
into heads by strides; the flash kernels read those strided views directly and write the output
laid out as [N, L, H, hd], so the heads merge back for ``out_proj`` without a copy (batch_first).
``need_weights=True`` (torch's default) takes the explicit path that forms the [N, H, L, S] weights
to return them; ``need_weights=False`` runs the fused kernel and never forms them.
"""
from __future__ import annotations

import math

import torch

from ge2 import runtime
from ge2.autograd.attention import scaled_dot_product_attention
from ge2.autograd.dropout import dropout, new_rng_state
from ge2.autograd.linear import linear
from ge2.autograd.math import unbind, where
from ge2.autograd.softmax import softmax
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import dtype_name, shape_str
from ge2.nn import init
from ge2.nn.linear import Linear
from ge2.nn.module import Module
from ge2.nn.parameter import Parameter

OP = "MultiheadAttention"


def _additive(mask: Tensor, name: str, dtype: torch.dtype) -> Tensor:
    """torch's canonical mask: a bool mask (True = not allowed) as 0 / -inf in ``dtype``; a float mask as is."""
    if mask.dtype == torch.bool:
        return where(mask, float("-inf"), 0.0).to(dtype)
    if not mask.dtype.is_floating_point:
        raise TypeError(f"{OP}: {name} must be bool or float, got {dtype_name(mask.dtype)}")
    return mask


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: query [L, N, E] (or [N, L, E] with batch_first, or unbatched [L, E]),
    key [S, N, kdim], value [S, N, vdim] -> (output [L, N, E], weights [N, L, S] or None)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"{OP}: embed_dim and num_heads must be positive, got {embed_dim} and {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"{OP}: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{OP}: dropout must be in [0, 1), got {dropout}")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError(f"{OP}: add_bias_kv and add_zero_attn are not supported by ge2")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.batch_first = dropout, batch_first
        dev, dtype = runtime.resolve_device(device), dtype or torch.get_default_dtype()

        def param(*shape):
            return Parameter(torch.empty(shape, device=dev, dtype=dtype))

        if self._qkv_same_embed_dim:
            self.in_proj_weight = param(3 * embed_dim, embed_dim)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = param(embed_dim, embed_dim)
            self.k_proj_weight = param(embed_dim, self.kdim)
            self.v_proj_weight = param(embed_dim, self.vdim)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = param(3 * embed_dim)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=dev, dtype=dtype)
        self._reset_parameters()
        # after the init, so the parameters draw torch's random numbers in torch's order
        self.register_buffer("rng_state", Tensor(new_rng_state(dev)), persistent=False)

    def _reset_parameters(self) -> None:
        """torch's init: xavier-uniform projections, zero biases (out_proj's weight keeps Linear's init)."""
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    # -- projections ------------------------------------------------------------------------------
    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v in [seq, N, E] / [N, seq, E] layout (whatever the input's), each [..., E]."""
        E = self.embed_dim
        b = self.in_proj_bias
        if self._qkv_same_embed_dim:
            if query is key and key is value:  # self-attention: one GEMM, split by strides
                proj = linear(query, self.in_proj_weight, b)
                return unbind(proj.view(*proj.shape[:-1], 3, E), -2)
            wq, wk, wv = unbind(self.in_proj_weight.view(3, E, E))
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        bq, bk, bv = unbind(b.view(3, E)) if b is not None else (None, None, None)
        return linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)

    def _heads(self, t: Tensor) -> Tensor:
        """[seq, N, E] (or [N, seq, E] with batch_first) -> [N, H, seq, hd], a strided view."""
        if self.batch_first:
            N, n = t.shape[0], t.shape[1]
            return t.view(N, n, self.num_heads, self.head_dim).transpose(1, 2)
        n, N = t.shape[0], t.shape[1]
        return t.view(n, N, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    # -- forward ----------------------------------------------------------------------------------
    def _check(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        """Shape checks with torch's rules; returns whether the input is batched."""
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"{OP}: query, key and value must all be 3-D (batched) or 2-D (unbatched), got "
                             f"{shape_str(query.shape)}, {shape_str(key.shape)} and {shape_str(value.shape)}")
        for name, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.shape[-1] != dim:
                raise ValueError(f"{OP}: {name} has {t.shape[-1]} features but the module expects {dim} "
                                 f"({name} {shape_str(t.shape)})")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"{OP}: key {shape_str(key.shape)} and value {shape_str(value.shape)} must agree in "
                             f"sequence length and batch")
        if batched:
            bdim = 0 if self.batch_first else 1
            if query.shape[bdim] != key.shape[bdim]:
                raise ValueError(f"{OP}: query {shape_str(query.shape)} and key {shape_str(key.shape)} have "
                                 f"different batch sizes")
        return batched

    def _mask(self, key_padding_mask, attn_mask, N: int, L: int, S: int, dtype) -> Tensor | None:
        """key_padding_mask [N, S] and attn_mask [L, S] or [N*H, L, S] as one additive mask broadcastable to [N, H, L, S]."""
        mask = None
        if attn_mask is not None:
            if tuple(attn_mask.shape) == (L, S):
                mask = _additive(attn_mask, "attn_mask", dtype).view(1, 1, L, S)
            elif tuple(attn_mask.shape) == (N * self.num_heads, L, S):
                mask = _additive(attn_mask, "attn_mask", dtype).view(N, self.num_heads, L, S)
            else:
                raise ValueError(f"{OP}: attn_mask {shape_str(attn_mask.shape)} must be [L, S] = {shape_str((L, S))} "
                                 f"or [N * num_heads, L, S] = {shape_str((N * self.num_heads, L, S))}")
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise ValueError(f"{OP}: key_padding_mask {shape_str(key_padding_mask.shape)} must be [N, S] = "
                                 f"{shape_str((N, S))}")
            pad = _additive(key_padding_mask, "key_padding_mask", dtype).view(N, 1, 1, S)
            mask = pad if mask is None else mask + pad
        return mask

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        batched = self._check(query, key, value)
        if not batched:  # one sequence: a batch of one along the batch dim
            bdim = 0 if self.batch_first else 1
            same = query is key and key is value  # keep self-attention's one-GEMM projection
            query, key, value = (query.unsqueeze(bdim),) * 3 if same else (t.unsqueeze(bdim) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        N = query.shape[0] if self.batch_first else query.shape[1]
        L = query.shape[1] if self.batch_first else query.shape[0]
        S = key.shape[1] if self.batch_first else key.shape[0]
        if is_causal and attn_mask is None:
            raise ValueError(f"{OP}: is_causal is a hint that attn_mask is the causal mask; pass attn_mask too "
                             f"(as torch requires)")
        causal = is_causal and key_padding_mask is None and not need_weights
        mask = None if causal else self._mask(key_padding_mask, attn_mask, N, L, S, query.dtype)
        q, k, v = (self._heads(t) for t in self._project(query, key, value))
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            w = softmax(q @ k.transpose(-1, -2), -1, scale=1.0 / math.sqrt(self.head_dim), mask=mask)
            if p > 0.0:
                w = dropout(w, p, True, self.rng_state.data)
            o = w @ v
            weights = w.mean(1) if average_attn_weights else w
        else:
            o = scaled_dot_product_attention(q, k, v, mask, dropout_p=p, is_causal=causal,
                                             rng_state=self.rng_state.data)
        # o [N, H, L, hd] back to the input's layout with the heads merged
        o = o.transpose(1, 2).reshape(N, L, self.embed_dim) if self.batch_first \
            else o.permute(2, 0, 1, 3).reshape(L, N, self.embed_dim)
        out = self.out_proj(o)
        if not batched:
            out = out.squeeze(0 if self.batch_first else 1)
            weights = weights.squeeze(0) if weights is not None else None
        return out, weights

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"batch_first={self.batch_first}")
