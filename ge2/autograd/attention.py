"""Scaled dot-product attention with gradients (ops in ``ge2.backend.attention``), torch's semantics.

Forward saves (q, k, v, o, lse): the L x S attention matrix is never stored, backward recomputes it
block by block from the row log-sum-exp. Dropout draws from ge2's device-side [seed, offset] state
like ``dropout``: the forward reads a snapshot, the live state advances by B * Hq * L * S on the
device, and backward rebuilds the very mask from the snapshot, so a captured step draws fresh masks
on every replay.
"""
from __future__ import annotations

import math
import numbers

import torch

from ge2 import backend
from ge2.amp import autocast_mode as _amp
from ge2.amp.autocast_mode import state as _amp_state
from ge2.autograd.dropout import default_rng_state
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import broadcast_shapes, dtype_name, shape_str

call = backend.call
OP = "scaled_dot_product_attention"


class ScaledDotProductAttention(Function):
    """o = softmax(scale * q k^T + mask) v on 4-D q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev]."""

    @staticmethod
    def forward(ctx, q, k, v, mask, state, scale, is_causal, dropout_p):
        snapshot = None
        if dropout_p > 0.0:
            snapshot = state.clone()
            B, Hq, L, _ = q.shape
            call("philox_advance", state, n=B * Hq * L * k.shape[2])
        attrs = dict(scale=scale, is_causal=is_causal, dropout_p=dropout_p)
        o, lse = call("attention", q, k, v, mask, snapshot, **attrs)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.mask, ctx.snapshot, ctx.attrs = mask, snapshot, attrs
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = call("attention_backward", do, q, k, v, o, lse, ctx.mask, ctx.snapshot, **ctx.attrs)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                None, None, None, None, None)


def _as_4d(x: Tensor, batch: tuple[int, ...], B: int) -> Tensor:
    """[*b, H, n, d] (batch dims broadcastable to ``batch``) as [B, H, n, d]: a view wherever strides allow."""
    target = (*batch, *x.shape[-3:])
    if tuple(x.shape) != target:
        x = x.expand(*target)  # stride 0: a broadcast k/v batch is read in place
    return x if x.ndim == 4 else x.reshape(B, *x.shape[-3:])


def _mask_4d(mask: Tensor, q_batch: tuple[int, ...], B: int, Hq: int, L: int, S: int) -> torch.Tensor:
    """The user's mask broadcast to [B, Hq, L, S] by strides (never materialised at L x S)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{OP}: attn_mask must be a ge2 Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"{OP}: attn_mask must be bool or a float dtype, got {dtype_name(mask.dtype)}")
    if mask.requires_grad:
        raise NotImplementedError(f"{OP}: attn_mask requires grad, but ge2's attention gives no gradient for the "
                                  f"mask; pass attn_mask.detach() (or a mask built under ge2.no_grad())")
    target = (*q_batch, Hq, L, S)
    if broadcast_shapes(OP, ("attn_mask", "the attention weights"), (tuple(mask.shape), target)) != target:
        raise ValueError(f"{OP}: attn_mask {shape_str(mask.shape)} does not broadcast to the attention weights' "
                         f"shape {shape_str(target)}")
    return mask.data.expand(target).reshape(B, Hq, L, S)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False, *, rng_state: torch.Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v: q [..., Hq, L, E], k [..., Hkv, S, E], v [..., Hkv, S, Ev] -> [..., Hq, L, Ev].

    torch's semantics: ``attn_mask`` bool (True takes part) or additive float, broadcastable to
    [..., Hq, L, S]; ``is_causal`` keeps column j <= row i (top-left when L != S); ``scale`` defaults to
    1/sqrt(E); ``enable_gqa`` lets Hq be a multiple of Hkv (k and v are never repeated); batch dims
    broadcast. Under ``ge2.autocast`` q, k and v run in the region's low dtype (a float mask is read in
    its own). A row with nothing to attend to gives 0 and zero gradients. ``rng_state`` (ge2's): the
    [seed, offset] device tensor dropout draws from (default: the device's, as ``dropout``).
    """
    if _amp_state.on:  # autocast: attention is a matmul-like op (torch's lower-precision list)
        query, key, value = _amp.cast_low(query, key, value)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{OP}: {name} must be a ge2 Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{OP}: {name} must have at least 2 dims [..., L, E], got shape {shape_str(t.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"{OP}: query, key and value must have one dtype, got {dtype_name(query.dtype)}, "
                        f"{dtype_name(key.dtype)} and {dtype_name(value.dtype)}")
    if not (query.device == key.device == value.device):
        raise ValueError(f"{OP}: query, key and value must be on one device, got {query.device}, {key.device} "
                         f"and {value.device}")
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{OP}: dropout_p must be in [0, 1), got {dropout_p!r}")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{OP}: pass either attn_mask or is_causal=True, not both (as torch requires)")
    squeeze = query.ndim == 2  # [L, E]: one head of one sequence
    if squeeze:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    if key.ndim != value.ndim or key.shape[:-2] != value.shape[:-2] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"{OP}: key {shape_str(key.shape)} and value {shape_str(value.shape)} must agree in every "
                         f"dim but the last")
    Hq, L, E = query.shape[-3:]
    Hkv, S = key.shape[-3], key.shape[-2]
    if key.shape[-1] != E:
        raise ValueError(f"{OP}: query's head dim {E} differs from key's {key.shape[-1]} "
                         f"(query {shape_str(query.shape)}, key {shape_str(key.shape)})")
    if Hq != Hkv and Hkv != 1 and not enable_gqa:
        raise ValueError(f"{OP}: query has {Hq} heads and key/value {Hkv}; pass enable_gqa=True for grouped-query "
                         f"attention")
    if Hq % Hkv:
        raise ValueError(f"{OP}: query's {Hq} heads are not a multiple of key's and value's {Hkv} heads")
    batch = broadcast_shapes(OP, ("query's batch dims", "key's batch dims"),
                             (tuple(query.shape[:-3]), tuple(key.shape[:-3])))
    B = math.prod(batch)
    q4, k4, v4 = (_as_4d(t, batch, B) for t in (query, key, value))
    mask = _mask_4d(attn_mask, batch, B, Hq, L, S) if attn_mask is not None else None
    if mask is not None and mask.device != query.device:
        raise ValueError(f"{OP}: attn_mask is on {mask.device} but query is on {query.device}")
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    state = None
    if dropout_p > 0.0:
        state = rng_state if rng_state is not None else default_rng_state(query.device)
        if state.device != query.device:
            raise ValueError(f"{OP}: rng_state is on {state.device} but query is on {query.device}")
    o = ScaledDotProductAttention.apply(q4, k4, v4, mask, state, scale, bool(is_causal), float(dropout_p))
    o = o.reshape(*batch, Hq, L, value.shape[-1]) if len(batch) != 1 else o
    return o.squeeze(0) if squeeze else o
