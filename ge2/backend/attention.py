"""Attention ops: schemas and Triton implementations (kernels in ``ge2.kernels.attention`` and
``ge2.kernels.attention_decode``).

``attention(q, k, v, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0) -> (o, lse)``
``attention_backward(do, q, k, v, o, lse, mask=None, rng_state=None, *, scale, is_causal=False,
dropout_p=0.0) -> (dq, dk, dv)``

    q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev]   (Hq a multiple of Hkv: grouped queries)
    mask [B, Hq, L, S] (stride-0 broadcast dims read in place): bool (True takes part) or additive float
    o [B, Hq, L, Ev] in q's dtype, lse [B, Hq, L] fp32: log sum exp of the row's scaled scores

Any strides. ``is_causal``: column j takes part in row i only if j <= i (torch's top-left alignment).
``dropout_p`` > 0 needs ``rng_state`` ([seed, offset] int64 on the device, read by the kernel: the same
scheme as dropout); the caller advances the state by B * Hq * L * S after the forward. A row with
nothing to attend to gives o = 0, lse = -inf and zero gradients. fp32 inputs run their two matmuls
in ``ge2.get_matmul_precision()``.

The forward takes the split-S decode kernel where it wins (few query rows against a long key
sequence: text generation with a KV cache), else the flash forward; both give the same (o, lse).
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, dtype_name, shape_str
from ge2.kernels import attention as K, attention_decode as D
from ge2.kernels.gemm import _precision

ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MASK_DTYPES = (torch.bool, torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
STATE = TensorArg("rng_state", (torch.int64,), ndim=(1,), optional=True)


def check_attention(op: str, q, k, v, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0) -> None:
    """The relations between q, k, v, mask and the attributes (the per-argument dtypes and ranks are in the schema)."""
    B, Hq, L, E = q.shape
    Bk, Hkv, S, Ek = k.shape
    Bv, Hv, Sv, Ev = v.shape
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}: q, k and v must have one dtype, got q {dtype_name(q.dtype)}, "
                        f"k {dtype_name(k.dtype)}, v {dtype_name(v.dtype)}")
    if (Bk, Hkv) != (Bv, Hv) or S != Sv:
        raise ValueError(f"{op}: k {shape_str(k.shape)} and v {shape_str(v.shape)} must agree in batch, heads "
                         f"and sequence length")
    if Bk != B:
        raise ValueError(f"{op}: q {shape_str(q.shape)} and k {shape_str(k.shape)} have different batch sizes")
    if Ek != E:
        raise ValueError(f"{op}: q's head dim {E} differs from k's {Ek} (q {shape_str(q.shape)}, "
                         f"k {shape_str(k.shape)})")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{op}: q's {Hq} heads are not a multiple of k's and v's {Hkv} heads")
    for name, size in (("q's head dim", E), ("v's head dim", Ev)):
        if not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name} {size} is outside 1..{MAX_HEAD_DIM}")
    if L == 0 or S == 0:
        raise ValueError(f"{op}: q has {L} rows and k {S}; both need at least one")
    if mask is not None:
        if mask.dtype not in MASK_DTYPES:
            raise TypeError(f"{op}: mask must be bool or a float dtype, got {dtype_name(mask.dtype)}")
        if tuple(mask.shape) != (B, Hq, L, S):
            raise ValueError(f"{op}: mask {shape_str(mask.shape)} must be [B, Hq, L, S] = "
                             f"{shape_str((B, Hq, L, S))} (broadcast it first)")
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a number, got {type(scale).__name__}")
    if not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p!r}")
    if dropout_p > 0.0 and rng_state is None:
        raise ValueError(f"{op}: dropout_p = {dropout_p} needs an rng_state")
    if rng_state is not None and rng_state.numel() != 2:
        raise ValueError(f"{op}: rng_state must be int64 [2] (seed, offset), got {shape_str(rng_state.shape)}")


def _check_backward(op: str, do, q, k, v, o, lse, mask=None, rng_state=None, *, scale, is_causal=False,
                    dropout_p=0.0) -> None:
    check_attention(op, q, k, v, mask, rng_state, scale=scale, is_causal=is_causal, dropout_p=dropout_p)
    B, Hq, L, _ = q.shape
    out_shape = (B, Hq, L, v.shape[-1])
    for name, t, shape in (("do", do, out_shape), ("o", o, out_shape), ("lse", lse, (B, Hq, L))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} has shape {shape_str(t.shape)}, expected {shape_str(shape)}")
    if do.dtype != q.dtype or o.dtype != q.dtype:
        raise TypeError(f"{op}: do and o must have q's dtype {dtype_name(q.dtype)}, got "
                        f"{dtype_name(do.dtype)} and {dtype_name(o.dtype)}")


def _qkv(*names: str) -> tuple[TensorArg, ...]:
    return tuple(TensorArg(n, ATTENTION_DTYPES, ndim=(4,)) for n in names)


MASK = TensorArg("mask", MASK_DTYPES, ndim=(4,), optional=True)
LSE = TensorArg("lse", (torch.float32,), ndim=(3,))

defop("attention", Schema((*_qkv("q", "k", "v"), MASK, STATE), check_attention))
defop("attention_backward", Schema((*_qkv("do", "q", "k", "v", "o"), LSE, MASK, STATE), _check_backward))


@register("attention", "triton", dtypes=ATTENTION_DTYPES)
def _attention(q, k, v, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0):
    precision = _precision(q.dtype)
    if D.prefers_decode(q, k, dropout_p):
        return D.attention_decode(q, k, v, mask, scale=float(scale), is_causal=is_causal, precision=precision)
    return K.attention_forward(q, k, v, mask, scale=float(scale), is_causal=is_causal, dropout_p=float(dropout_p),
                               rng_state=rng_state, precision=precision)


@register("attention_backward", "triton", dtypes=ATTENTION_DTYPES)
def _attention_backward(do, q, k, v, o, lse, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0):
    return K.attention_backward(do, q, k, v, o, lse, mask, scale=float(scale), is_causal=is_causal,
                                dropout_p=float(dropout_p), rng_state=rng_state, precision=_precision(q.dtype))
