"""The split-S decode attention launcher against a float64 reference and torch's own error.

o and lse of ``attention_decode`` are compared with the attention written out in float64; o's
budget is 2x the error of torch's SDPA in the same dtype, lse's 2x that of torch's fp32 scores
(what torch's fused kernels compute them in) or a few fp32 ulps. Shapes are tiny on the CPU (the
interpreter); ``numerics.LARGE`` adds the KV-cache lengths of text generation.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ge2.kernels import attention_decode as D
from numerics import DEVICE, LARGE, assert_matches, randn

GPU = DEVICE.type == "cuda"


def _scores(q, k, mask, scale, is_causal, dtype, tf32=False):
    """scale * q @ k^T (+ mask, causal) in ``dtype``, with k's heads repeated for grouped queries."""
    k = k.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], 1)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        s = scale * (q.to(dtype) @ k.transpose(-1, -2))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(dtype)
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def reference(q, k, v, mask, scale, is_causal):
    """(o, lse) in float64; rows with nothing to attend to give o = 0, lse = -inf."""
    s = _scores(q, k, mask, scale, is_causal, torch.float64)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # -inf - -inf on dead rows
    return p @ v.double().repeat_interleave(q.shape[1] // v.shape[1], 1), lse


def torch_own(q, k, v, mask, scale, is_causal, precision):
    """torch's (o, lse) in q's dtype and precision mode; its NaN rows (all masked) read as ge2's 0."""
    tf32 = q.dtype == torch.float32 and precision == "tf32"
    s = _scores(q, k, mask, scale, is_causal, torch.float32, tf32)  # fused kernels' fp32 scores
    lse = torch.logsumexp(s, -1)
    G = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    if tf32:  # SDPA has no tf32 mode: torch's tf32 matmuls on its fp32 softmax
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            o = torch.softmax(s, -1) @ vr
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    else:
        bias = None
        if mask is not None or is_causal:
            bias = torch.zeros(s.shape, dtype=q.dtype, device=q.device).masked_fill(s == float("-inf"), float("-inf"))
            if mask is not None and mask.dtype != torch.bool:
                bias = bias + mask.to(q.dtype)
        o = F.scaled_dot_product_attention(q, kr, vr, attn_mask=bias, scale=scale)
    return o.nan_to_num(0.0), lse


def check(q, k, v, mask=None, *, is_causal=False, precision="ieee", num_splits=None, scale=None):
    """Run the launcher and judge o and lse; returns them."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, lse = D.attention_decode(q, k, v, mask, scale=scale, is_causal=is_causal, precision=precision,
                                num_splits=num_splits)
    B, Hq, L, _ = q.shape
    Ev = v.shape[-1]
    assert o.shape == (B, Hq, L, Ev) and o.dtype == q.dtype
    assert o.stride() == torch.empty(B, L, Hq, Ev).transpose(1, 2).stride()
    assert lse.shape == (B, Hq, L) and lse.dtype == torch.float32
    ro, rl = reference(q, k, v, mask, scale, is_causal)
    to, tl_ = torch_own(q, k, v, mask, scale, is_causal, precision)
    assert_matches(o, ro, to, name="o")
    assert_matches(lse, rl, tl_, name="lse")
    return o, lse


def qkv(B, Hq, Hkv, L, S, E, Ev=None, dtype=torch.float32):
    return (randn(B, Hq, L, E, dtype=dtype), randn(B, Hkv, S, E, dtype=dtype),
            randn(B, Hkv, S, Ev or E, dtype=dtype))


# (B, Hq, Hkv, L, S, E, Ev): one query row to 16; one key to 1000 (the split path from 300 up);
# equal heads and grouped (4 q heads on 1 kv head, 6 on 2); head dims that are not powers of two.
SHAPES = [
    (1, 1, 1, 1, 1, 16, 16),
    (2, 3, 3, 1, 7, 40, 40),
    (1, 4, 1, 1, 300, 64, 64),
    (2, 6, 2, 1, 1000, 128, 128),
    (1, 2, 2, 3, 7, 64, 40),
    (1, 4, 1, 3, 300, 40, 64),
    (2, 6, 2, 3, 1000, 16, 16),
    (1, 1, 1, 16, 1, 40, 40),
    (1, 6, 2, 16, 300, 16, 16),
    (1, 4, 1, 16, 1000, 64, 64),
    (2, 2, 2, 16, 7, 128, 128),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_shapes(shape, dtype):
    if dtype == torch.float16 and shape[4] < 300:
        pytest.skip("fp16 runs on the split path; the short sequences are covered in bf16 and fp32")
    B, Hq, Hkv, L, S, E, Ev = shape
    check(*qkv(B, Hq, Hkv, L, S, E, Ev, dtype))


def test_head_dim_256_and_row_blocks():
    """E = Ev = 256; 6 q heads x 16 rows on one kv head make 96 rows: three row blocks of 32."""
    check(*qkv(1, 6, 1, 16, 300, 256, 256, torch.bfloat16))


@pytest.mark.parametrize("L,S", [(1, 1), (3, 300), (16, 1000), (16, 7), (3, 1)], ids=lambda x: str(x))
@pytest.mark.parametrize("heads", [(2, 2), (4, 1)], ids=["mha", "gqa"])
def test_causal(L, S, heads):
    """Top-left alignment, L <= S and L > S (rows past S see every key)."""
    check(*qkv(2, heads[0], heads[1], L, S, 40, dtype=torch.bfloat16), is_causal=True)


def _mask(kind: str, shape: str, B, Hq, L, S):
    """A [B, Hq, L, S] view of a smaller mask (stride-0 dims); bool True = takes part."""
    dims = {"LS": (1, 1, L, S), "B11S": (B, 1, 1, S), "1HLS": (1, Hq, L, S), "BHLS": (B, Hq, L, S),
            "BH1S": (B, Hq, 1, S)}[shape]
    if kind == "bool":
        m = torch.rand(dims) > 0.4
        m.view(-1, dims[-1])[0] = False  # an all-masked row (whole batches/heads for the broadcasts)
    else:
        m = torch.randn(dims).to(torch.float32) * 2
        m.masked_fill_(torch.rand(dims) < 0.3, float("-inf"))
        m.view(-1, dims[-1])[0] = float("-inf")
    return m.to(DEVICE).expand(B, Hq, L, S)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", ["LS", "B11S", "1HLS", "BH1S", "BHLS"])
def test_masks(kind, shape):
    B, Hq, Hkv, L, S = 2, 4, 2, 3, 300
    q, k, v = qkv(B, Hq, Hkv, L, S, 40, dtype=torch.bfloat16)
    mask = _mask(kind, shape, B, Hq, L, S)
    o, lse = check(q, k, v, mask)
    dead = ~torch.isfinite(lse)
    assert dead.any() and torch.all(o[dead] == 0), "all-masked rows must give o = 0, lse = -inf"


def test_float_mask_in_its_own_dtype_with_causal():
    """A bf16 additive mask on fp32 inputs, together with causal (both apply)."""
    B, Hq, L, S = 1, 3, 16, 300
    q, k, v = qkv(B, Hq, Hq, L, S, 64)
    mask = randn(1, Hq, 1, S, dtype=torch.bfloat16).expand(B, Hq, L, S)
    check(q, k, v, mask, is_causal=True)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
def test_split_counts(num_splits):
    """Every chunk count gives the same answer, also where whole chunks are masked out
    (lse_c = -inf chunks beside live ones) and where a row is dead in every chunk. Ev = 256: the
    combine takes 32 chunks at a time, so 64 chunks take it through its running rescale."""
    B, Hq, Hkv, L, S = 1, 4, 2, 3, 1000
    q, k, v = qkv(B, Hq, Hkv, L, S, 64, 256, dtype=torch.bfloat16)
    m = torch.ones(B, Hq, L, S, dtype=torch.bool)
    m[..., S // 4: S // 2] = False  # whole chunks in the middle take no part
    m[0, 1, 2] = False  # one dead row
    check(q, k, v, m.to(DEVICE), num_splits=num_splits)


def test_noncontiguous_inputs():
    """q from a fused QKV projection's view, k/v sliced from a [B, Hkv, Smax, E] cache buffer, and a
    last-dim stride of 2."""
    B, Hq, Hkv, L, S, Smax, E = 2, 4, 2, 3, 300, 512, 40
    proj = randn(B, L, 3, Hq, E, dtype=torch.bfloat16)
    q = proj[:, :, 0].transpose(1, 2)
    cache_k = randn(B, Hkv, Smax, E, dtype=torch.bfloat16)
    cache_v = randn(B, Hkv, Smax, E, dtype=torch.bfloat16)
    check(q, cache_k[:, :, :S], cache_v[:, :, :S])
    q2, k2, v2 = (randn(B, h, n, E, dtype=torch.float32, noncontig=True) for h, n in ((Hq, L), (Hkv, S), (Hkv, S)))
    assert k2.stride(-1) == 2
    check(q2, k2, v2, is_causal=True)


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_fp32_precisions(precision):
    check(*qkv(1, 4, 1, 3, 1000, 64), precision=precision)


def test_scale_and_large_scores():
    """A large scale: scores of hundreds, where exp without the running max would overflow."""
    check(*qkv(1, 2, 2, 3, 300, 16), scale=30.0)


def test_prefers_decode():
    q1 = torch.empty(1, 4, 1, 64)
    q17 = torch.empty(1, 4, 17, 64)
    k = torch.empty(1, 4, 4096, 64)
    assert D.prefers_decode(q1, k, 0.0)
    assert not D.prefers_decode(q17, k, 0.0)
    assert not D.prefers_decode(q1, k, 0.1)


@pytest.mark.skipif(not LARGE, reason="KV-cache lengths: GPU only")
@pytest.mark.parametrize("S", [4096, 32768])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,L", [((8, 8), 1), ((8, 2), 1), ((8, 2), 16)], ids=["mha", "gqa", "gqa16"])
def test_large(S, dtype, heads, L):
    B = 2
    q, k, v = qkv(B, heads[0], heads[1], L, S, 128, dtype=dtype)
    check(q, k, v)
    check(q, k, v, _mask("bool", "B11S", B, heads[0], L, S))


@pytest.mark.skipif(not LARGE, reason="KV-cache lengths: GPU only")
@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_large_fp32(precision):
    check(*qkv(1, 8, 2, 4, 32768, 80), precision=precision)
