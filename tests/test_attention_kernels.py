"""The flash-attention launchers (ge2.kernels.attention) against attention written out in float64.

Each case draws q, k, v (and a mask), runs ``attention_forward`` and ``attention_backward`` and
compares o, lse, dq, dk, dv with the float64 reference; the error budget is twice the error of the
same attention written out with torch in the inputs' dtype (or a few ulps of it).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ge2.backend.torch_backend.dropout import philox_uniform
from ge2.kernels import attention
from ge2.kernels.attention import attention_backward, attention_forward
from tests.numerics import DEVICE, EPS, LARGE, assert_matches, rel_error

ON_GPU = DEVICE.type == "cuda"


def keep_mask(rng_state: torch.Tensor, B: int, H: int, L: int, S: int, p: float) -> torch.Tensor:
    """The dropout keep mask the kernels draw: tl.rand(seed, offset + ((b*H + h)*L + i)*S + j) >= p."""
    seed, offset = (int(x) for x in rng_state.tolist())
    u = philox_uniform(seed, offset + np.arange(B * H * L * S, dtype=np.int64))
    return torch.from_numpy(u >= np.float32(p)).reshape(B, H, L, S)


def written_out(q, k, v, mask, scale, causal, keep=None, p=0.0):
    """o, lse of attention written out with torch ops in q's dtype (scores and softmax in fp32 at least)."""
    Hq, Hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(Hq // Hkv, 1)
    v = v.repeat_interleave(Hq // Hkv, 1)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q @ k.transpose(-1, -2)).to(acc) * scale
    L, S = s.shape[-2:]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(acc)
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    safe = torch.where(total == 0, torch.ones_like(total), total)
    prob = e / safe
    lse = torch.where(total == 0, torch.full_like(total, float("-inf")), torch.log(safe) + m).squeeze(-1)
    if keep is not None:
        prob = prob * keep.to(prob.device) / (1.0 - p)
    return prob.to(v.dtype) @ v, lse


def run_case(B, Hq, Hkv, L, S, E, Ev, *, causal=False, mask=None, dtype=torch.float32, precision="ieee",
             dropout_p=0.0, fused_qkv=False, seed=0, negative_scale=False):
    g = torch.Generator().manual_seed(seed)
    if fused_qkv:  # q, k, v as the transposed views of one [B, L, 3, H, E] projection (L = S, Hq = Hkv)
        qkv = torch.randn(B, L, 3, Hq, E, generator=g, dtype=torch.float64).to(DEVICE, dtype)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q = torch.randn(B, Hq, L, E, generator=g, dtype=torch.float64).to(DEVICE, dtype)
        k = torch.randn(B, Hkv, S, E, generator=g, dtype=torch.float64).to(DEVICE, dtype)
        v = torch.randn(B, Hkv, S, Ev, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    do = torch.randn(B, Hq, L, 2 * Ev, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    # with fused q, k, v: do as a strided view too (every other column of a wider buffer)
    do = do[..., ::2] if fused_qkv else do[..., :Ev]
    scale = E ** -0.5 * (-1.3 if negative_scale else 1.3)
    rng_state = torch.tensor([1234 + seed, 77 * seed], dtype=torch.int64, device=DEVICE) if dropout_p else None
    keep = keep_mask(rng_state, B, Hq, L, S, dropout_p) if dropout_p else None
    mask_full = None if mask is None else mask.expand(B, Hq, L, S)

    o, lse = attention_forward(q, k, v, mask_full, scale=scale, is_causal=causal, dropout_p=dropout_p,
                               rng_state=rng_state, precision=precision)
    dq, dk, dv = attention_backward(do, q, k, v, o, lse, mask_full, scale=scale, is_causal=causal,
                                    dropout_p=dropout_p, rng_state=rng_state, precision=precision)
    assert o.shape == (B, Hq, L, Ev) and o.dtype == dtype and lse.shape == (B, Hq, L) and lse.dtype == torch.float32
    assert o.transpose(1, 2).is_contiguous()  # heads merge as a free view
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape

    def grads(fn_dtype, inputs):
        leaves = [t.detach().to(fn_dtype).requires_grad_() for t in inputs]
        out, l_ = written_out(*leaves, mask_full, scale, causal, keep, dropout_p)
        out.backward(do.to(fn_dtype))
        return out, l_, [t.grad for t in leaves]

    ref_o, ref_lse, ref_grads = grads(torch.float64, (q, k, v))
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        t_o, t_lse, t_grads = grads(dtype, (q, k, v))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    assert_matches(o, ref_o, t_o, name="o")
    assert_matches(lse, ref_lse, t_lse.float(), name="lse")
    for name, ours, ref, theirs in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_grads, t_grads):
        assert_matches(ours, ref, theirs, name=name)

    def rerun():
        o2, lse2 = attention_forward(q, k, v, mask_full, scale=scale, is_causal=causal, dropout_p=dropout_p,
                                     rng_state=rng_state, precision=precision)
        return o2, attention_backward(do, q, k, v, o2, lse2, mask_full, scale=scale, is_causal=causal,
                                      dropout_p=dropout_p, rng_state=rng_state, precision=precision)

    return o, lse, (dq, dk, dv), rerun


# (B, Hq, Hkv, L, S, E, Ev, causal)
SHAPES = [
    (1, 1, 1, 1, 1, 16, 16, False),
    (1, 1, 1, 1, 7, 40, 40, True),
    (2, 2, 2, 7, 33, 40, 40, False),
    (1, 2, 2, 33, 7, 64, 64, True),  # causal, L > S
    (2, 1, 1, 33, 129, 16, 16, True),  # causal, L < S
    (1, 2, 2, 129, 129, 64, 64, True),  # causal, L = S
    (1, 1, 1, 129, 7, 16, 24, False),
    (1, 4, 2, 33, 33, 40, 24, False),  # GQA, Ev != E
    (2, 4, 2, 33, 7, 16, 16, True),  # GQA causal
    (1, 4, 1, 7, 33, 16, 40, True),  # multi-query
    (1, 1, 1, 7, 33, 256, 256, False),
]


@pytest.mark.parametrize("B,Hq,Hkv,L,S,E,Ev,causal", SHAPES)
def test_shapes(B, Hq, Hkv, L, S, E, Ev, causal):
    run_case(B, Hq, Hkv, L, S, E, Ev, causal=causal)


@pytest.mark.parametrize("B,Hq,Hkv,L,S,E,Ev,causal", [SHAPES[4], SHAPES[8]])
def test_pointer_loads(B, Hq, Hkv, L, S, E, Ev, causal, monkeypatch):
    """The strided-load path that inputs TMA cannot read take (the other tests mostly take TMA)."""
    monkeypatch.setattr(attention, "TMA", False)
    run_case(B, Hq, Hkv, L, S, E, Ev, causal=causal)


def test_tma_and_pointer_paths_taken(monkeypatch):
    q = torch.randn(1, 1, 16, 16, device=DEVICE)
    assert attention._sources(q, q[..., :8])[1] is True  # rows of 64 bytes: aligned
    assert attention._sources(q, torch.randn(1, 1, 4, 5, device=DEVICE))[1] is False  # rows of 20 bytes
    assert attention._sources(q, q.transpose(-1, -2))[1] is False  # no unit stride in the last dim
    monkeypatch.setattr(attention, "TMA", False)
    assert attention._sources(q, q)[1] is False


def _bool_mask(B, H, L, S, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, H, L, S, generator=g) > 0.4
    if L > 2:
        m[..., 2, :] = False  # an all-masked row
    return m.to(DEVICE)


def _float_mask(B, H, L, S, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(B, H, L, S, generator=g, dtype=torch.float64)
    m[torch.rand(B, H, L, S, generator=g) > 0.7] = float("-inf")
    if L > 3:
        m[..., 3, :] = float("-inf")  # an all-masked row
    return m.to(DEVICE, torch.float32)


@pytest.mark.parametrize("kind,mshape,causal", [
    ("bool", "1,1,L,S", False),  # broadcast over batch and heads (stride 0)
    ("bool", "B,1,1,S", True),  # key padding, with causal on top
    ("float", "1,H,L,S", False),
    ("float", "B,1,L,1", False),  # a per-row bias: rows with -inf are empty
    ("float", "1,1,1,S", True),
])
def test_masks(kind, mshape, causal):
    B, H, L, S, E = 2, 2, 33, 40, 40
    dims = [{"B": B, "H": H, "L": L, "S": S, "1": 1}[d] for d in mshape.split(",")]
    mask = (_bool_mask if kind == "bool" else _float_mask)(*dims, seed=len(mshape))
    if mshape == "B,1,1,S":
        mask[1, ..., :] = False  # batch 1 attends to nothing at all
        mask[0, ..., 0] = True
    o, lse, (dq, dk, dv), _ = run_case(B, H, H, L, S, E, E, causal=causal, mask=mask)
    assert not any(torch.isnan(t).any() for t in (o, lse, dq, dk, dv))


def test_all_masked_rows_are_zero():
    B, H, L, S, E = 1, 2, 7, 33, 16
    mask = torch.ones(B, H, L, S, dtype=torch.bool, device=DEVICE)
    mask[:, :, 4] = False
    o, lse, (dq, dk, dv), _ = run_case(B, H, H, L, S, E, E, mask=mask)
    assert torch.all(o[:, :, 4] == 0) and torch.all(lse[:, :, 4] == float("-inf")) and torch.all(dq[:, :, 4] == 0)
    assert torch.all(o[:, :, 3] != 0)


def test_negative_scale():
    run_case(1, 2, 1, 33, 40, 16, 16, causal=True, mask=_float_mask(1, 1, 33, 40, seed=9), negative_scale=True)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_qkv_views(causal):
    run_case(2, 3, 3, 33, 33, 40, 40, causal=causal, fused_qkv=True)


@pytest.mark.parametrize("causal", [False, True])
def test_dropout(causal):
    p = 0.3
    o, lse, grads, rerun = run_case(2, 2, 1, 33, 40, 16, 16, causal=causal, dropout_p=p, seed=3)
    again, grads_again = rerun()  # same state, same mask
    assert torch.equal(o, again) and all(torch.equal(a, b) for a, b in zip(grads, grads_again))


def test_dropout_other_seed_differs():
    q = torch.randn(1, 1, 16, 16, device=DEVICE)
    outs = []
    for seed in (1, 2):
        state = torch.tensor([seed, 0], dtype=torch.int64, device=DEVICE)
        outs.append(attention_forward(q, q, q, None, scale=0.25, is_causal=False, dropout_p=0.5,
                                      rng_state=state, precision="ieee")[0])
    assert not torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("precision", ["tf32x3", "tf32"])
def test_fp32_precisions(precision):
    run_case(1, 2, 2, 33, 40, 64, 64, causal=True, precision=precision)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    run_case(1, 2, 1, 33, 40, 64, 40, causal=True, dtype=dtype)


@pytest.mark.skipif(not LARGE, reason="large shapes on the GPU only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_large(dtype, causal):
    run_case(1, 2, 1, 1000, 1100, 128, 128, causal=causal, dtype=dtype, precision="tf32x3")


@pytest.mark.skipif(not LARGE, reason="large shapes on the GPU only")
@pytest.mark.parametrize("E", [80, 256])
def test_large_head_dims(E):
    mask = _float_mask(1, 1, 700, 900, seed=E)
    run_case(2, 2, 2, 700, 900, E, E, causal=False, dtype=torch.bfloat16, mask=mask)  # 2.5M: untuned


@pytest.mark.skipif(not ON_GPU, reason="GPU only")
def test_matches_torch_sdpa():
    """bf16 at a training shape: o and the gradients as close to float64 as torch's own SDPA gets."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 8, 1024, 128, generator=g).to(DEVICE, torch.bfloat16) for _ in range(3))
    do = torch.randn(2, 8, 1024, 128, generator=g).to(DEVICE, torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True).backward(do)
    o_ref = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
    o_ref.backward(do.double())
    o, lse = attention_forward(q, k, v, None, scale=128 ** -0.5, is_causal=True, dropout_p=0.0, rng_state=None,
                               precision="ieee")
    grads = attention_backward(do, q, k, v, o, lse, None, scale=128 ** -0.5, is_causal=True, dropout_p=0.0,
                               rng_state=None, precision="ieee")
    torch_o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_matches(o, o_ref, torch_o, name="o")
    for name, ours, r, theirs in zip(("dq", "dk", "dv"), grads, ref, leaves):
        assert_matches(ours, r.grad, theirs.grad, name=name)
    assert rel_error(o, o_ref) <= 4 * EPS[torch.bfloat16]
