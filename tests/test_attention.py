"""scaled_dot_product_attention and MultiheadAttention against float64 references and torch.

Forward and every gradient, error vs float64 within 2x torch's own SDPA error in the same dtype, over
sequence lengths 1..1000 (larger on the GPU), head dims 16..256 including 40 and 80, causal with
L < S, L = S and L > S, grouped queries, bool and additive masks of every broadcast shape, the
strided q/k/v views of a fused QKV projection, rows with nothing to attend to, dropout (the kernels'
mask equals the oracle's Philox mask), decode shapes (few query rows, long S), bad input, the
O(L) memory of the forward on the GPU, and MultiheadAttention loaded from a torch module.
"""
from __future__ import annotations

import copy
import math
import os

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2.backend import call
from ge2.testing import torch_op_guard
from tests.numerics import DEVICE, LARGE, assert_matches, randn, rel_error

CUDA = torch.cuda.is_available()
LOW = (torch.bfloat16, torch.float16)
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if CUDA else [torch.bfloat16])


def _reference(q, k, v, mask=None, is_causal=False, scale=None, dtype=torch.float64):
    """Attention written out in ``dtype`` (float64 for the reference); empty rows give 0, like ge2."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if q.ndim > 2:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(dtype)
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    empty = torch.isinf(s).all(-1, keepdim=True) & (s < 0).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v


def _torch_sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    """torch's own SDPA in the inputs' dtype (its error is the budget)."""
    group = q.shape[-3] // k.shape[-3] if q.ndim > 2 else 1
    if mask is not None:  # torch's fused CUDA kernels want a mask whose last dim is contiguous
        mask = mask.expand(*q.shape[:-1], k.shape[-2]).contiguous()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                            enable_gqa=group > 1)


def _leaves(*ts):
    return [ge2.from_torch(t.detach().clone(), requires_grad=True) for t in ts]


def check_sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, grads=True, name="sdpa"):
    """ge2's forward and gradients vs float64 within 2x torch's error in q's dtype."""
    gq, gk, gv = _leaves(q, k, v)
    gmask = ge2.from_torch(mask) if mask is not None else None
    out = F.scaled_dot_product_attention(gq, gk, gv, gmask, is_causal=is_causal, scale=scale,
                                         enable_gqa=q.ndim > 2 and q.shape[-3] != k.shape[-3])
    tq, tk, tv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _reference(*ref_leaves, mask, is_causal, scale)
    t_out = _torch_sdpa(tq, tk, tv, mask, is_causal, scale)
    assert out.shape == t_out.shape and out.dtype == q.dtype
    assert torch.isfinite(t_out).all(), "torch's own output must be finite to give a budget"
    assert_matches(out.data, ref, t_out, name=f"{name} forward")
    if not grads:
        return out
    go = randn(*out.shape, dtype=q.dtype)
    out.backward(ge2.from_torch(go))
    ref_grads = torch.autograd.grad(ref, ref_leaves, go.double())
    t_grads = torch.autograd.grad(t_out, (tq, tk, tv), go)
    for label, g, r, t in zip("qkv", (gq, gk, gv), ref_grads, t_grads):
        assert g.grad is not None and g.grad.shape == g.shape
        assert_matches(g.grad.data, r, t, name=f"{name} d{label}")
    return out


def qkv(B, Hq, Hkv, L, S, E, Ev=None, dtype=torch.float32, noncontig=False):
    Ev = E if Ev is None else Ev
    return (randn(B, Hq, L, E, dtype=dtype, noncontig=noncontig), randn(B, Hkv, S, E, dtype=dtype, noncontig=noncontig),
            randn(B, Hkv, S, Ev, dtype=dtype, noncontig=noncontig))


# ---------------------------------------------------------------------------------------------
# shapes, head dims, causal, GQA
# ---------------------------------------------------------------------------------------------
LS = [(1, 1), (7, 7), (1, 129), (129, 7), (33, 129)] + [(1000, 7), (7, 1000)] + ([(1000, 1000), (2048, 2048)] if LARGE else [])


@pytest.mark.parametrize("L,S", LS)
def test_sequence_lengths(L, S):
    check_sdpa(*qkv(1, 2, 2, L, S, 16, dtype=torch.float32))


@pytest.mark.parametrize("E,Ev", [(16, 16), (40, 40), (64, 24), (80, 80), (128, 128), (256, 256), (3, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims(E, Ev, dtype):
    L, S = (200, 300) if LARGE else (9, 21)
    check_sdpa(*qkv(2, 2, 2, L, S, E, Ev, dtype=dtype), name=f"E={E} Ev={Ev}")


@pytest.mark.parametrize("L,S", [(5, 19), (19, 19), (19, 5)] + ([(300, 1000), (1000, 300)] if LARGE else []))
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal(L, S, dtype):
    check_sdpa(*qkv(2, 3, 3, L, S, 32, dtype=dtype), is_causal=True, name=f"causal L={L} S={S}")


@pytest.mark.parametrize("Hq,Hkv,causal", [(4, 2, False), (6, 1, True), (8, 2, True)])
def test_grouped_query_attention(Hq, Hkv, causal):
    check_sdpa(*qkv(2, Hq, Hkv, 13, 27, 16, dtype=DTYPES[-1]), is_causal=causal, name=f"gqa {Hq}/{Hkv}")


def test_scale_leading_dims_and_unbatched():
    q, k, v = randn(2, 3, 2, 5, 16), randn(2, 3, 2, 9, 16), randn(2, 3, 2, 9, 8)
    check_sdpa(q, k, v, scale=0.37, name="5-D")
    check_sdpa(randn(5, 16), randn(9, 16), randn(9, 8), name="2-D [L, E]")
    # a key/value batch of 1 broadcasts against the query's batch, as in torch
    check_sdpa(randn(3, 2, 5, 16), randn(1, 2, 9, 16), randn(1, 2, 9, 8), name="broadcast batch")


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_of_a_fused_qkv_projection(dtype):
    """q, k, v as the transposed views a packed projection gives: read in place (no copy)."""
    B, L, H, E = 2, 11, 3, 16
    qkv_buf = randn(B, L, 3, H, E, dtype=dtype)
    q, k, v = (qkv_buf[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check_sdpa(q, k, v, is_causal=True, name="fused qkv")
    check_sdpa(*qkv(1, 2, 2, 6, 10, 24, dtype=dtype, noncontig=True), name="last-dim stride 2")


TRITON = pytest.mark.skipif(os.environ.get("GE2_TEST_BACKEND", "triton") != "triton",
                            reason="a property of ge2's kernels, not of the torch oracle")


@TRITON
def test_output_layout_merges_heads_for_free():
    """o is laid out [B, L, H, Ev], so merging heads for the output projection is a view."""
    q, k, v = (ge2.from_torch(t) for t in qkv(2, 3, 3, 5, 7, 8))
    o = F.scaled_dot_product_attention(q, k, v)
    assert o.transpose(1, 2).data.is_contiguous()


@TRITON
def test_packed_qkv_gradient_is_one_buffer():
    """unbind of a packed projection -> attention: the projection's gradient is the one buffer the attention
    backward wrote (no stack copy), equal to torch autograd's; other layouts keep separate buffers."""
    from ge2 import runtime

    B, L, H, E = 2, 9, 3, 8
    x64 = randn(B, L, 3 * H * E, dtype=torch.float64, seed=21)
    g64 = randn(B, L, H * E, dtype=torch.float64, seed=22)
    outs = {}
    for kind, dt in (("ge2", torch.float32), ("torch", torch.float32), ("ref", torch.float64)):
        if kind == "ge2":
            x = ge2.from_torch(x64.to(dt).clone(), requires_grad=True)
            q, k, v = (t.transpose(1, 2) for t in ge2.unbind(x.view(B, L, 3, H, E), 2))
            assert runtime.packed_layout((q.data, k.data, v.data)) == ([3, B, H, L, E],
                                                                        [H * E, L * 3 * H * E, E, 3 * H * E, 1])
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, H * E)
            y.backward(ge2.from_torch(g64.to(dt)))
            grad = x.grad.data
        else:
            x = x64.to(dt).clone().requires_grad_()
            q, k, v = (t.transpose(1, 2) for t in x.view(B, L, 3, H, E).unbind(2))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.transpose(1, 2).reshape(B, L, H * E).backward(g64.to(dt))
            grad = x.grad
        outs[kind] = grad
    assert_matches(outs["ge2"], outs["ref"], outs["torch"], name="packed qkv gradient")
    buf = x64.to(torch.float32).view(B, L, 3, H, E)
    q, k, v = (buf[:, :, i].transpose(1, 2) for i in range(3))
    assert runtime.packed_layout((q, q, q)) is None  # one tensor three times: shared elements
    assert runtime.packed_layout((q, v, k)) is None  # offsets not evenly spaced in order
    assert runtime.packed_layout((q, k.contiguous(), v)) is None  # another storage
    halves = x64.to(torch.float32).view(B, L, 2, -1)  # slices that overlap: [:, :, 0, :k] and [:, :, 0, 1:k+1]
    assert runtime.packed_layout((halves[..., 0, :5], halves[..., 0, 1:6])) is None


# ---------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------
MASK_SHAPES = [(9, 13), (1, 1, 9, 13), (2, 1, 1, 13), (2, 3, 9, 13), (1, 13), (3, 1, 13), (2, 1, 9, 1)]


@pytest.mark.parametrize("shape", MASK_SHAPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_of_every_broadcast_shape(shape, kind):
    q, k, v = qkv(2, 3, 3, 9, 13, 16, dtype=DTYPES[-1] if kind == "bool" else torch.float32)
    if kind == "bool":
        mask = torch.rand(shape) > 0.3
        mask[..., 0] = True  # every row keeps a column (empty rows have their own test)
    else:
        mask = randn(*shape, dtype=q.dtype)
        mask = mask.masked_fill(torch.rand(shape, device=mask.device) > 0.8, float("-inf"))
        mask[..., 0] = 0.5
    check_sdpa(q, k, v, mask.to(DEVICE), name=f"{kind} mask {list(shape)}")


def test_rows_with_nothing_to_attend_to():
    """All-masked rows give 0 and zero gradients (torch's math path gives NaN for a float -inf row)."""
    q, k, v = qkv(2, 2, 2, 6, 10, 16)
    mask = torch.rand(2, 1, 6, 10, device=DEVICE) > 0.4
    mask[..., 0] = True
    mask[0, :, 2] = False  # rows 2 of batch 0 and 5 of batch 1 attend to nothing
    mask[1, :, 5] = False
    gq, gk, gv = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(gq, gk, gv, ge2.from_torch(mask))
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _reference(*ref_leaves, mask)
    assert torch.isfinite(out.data).all()
    assert torch.equal(out.data[0, :, 2], torch.zeros_like(out.data[0, :, 2]))
    assert torch.equal(out.data[1, :, 5], torch.zeros_like(out.data[1, :, 5]))
    assert rel_error(out.data, ref) < 1e-5
    go = randn(*out.shape)
    out.backward(ge2.from_torch(go))
    for g, r in zip((gq, gk, gv), torch.autograd.grad(ref, ref_leaves, go.double())):
        assert torch.isfinite(g.grad.data).all()
        assert rel_error(g.grad.data, r) < 1e-5
    assert torch.equal(gq.grad.data[0, :, 2], torch.zeros_like(gq.grad.data[0, :, 2]))


# ---------------------------------------------------------------------------------------------
# decode: few query rows against a long key sequence (the split-S kernel)
# ---------------------------------------------------------------------------------------------
DECODE = [(1, 300), (4, 1000), (16, 777)] + ([(1, 4096), (1, 32768), (16, 32768)] if LARGE else [])


@pytest.mark.parametrize("L,S", DECODE)
def test_decode_shapes(L, S):
    q, k, v = qkv(1, 4, 2, L, S, 64, dtype=DTYPES[-1])
    check_sdpa(q, k, v, name=f"decode L={L} S={S}")


def test_decode_from_a_kv_cache_slice():
    """A KV cache [B, H, Smax, E] read up to the current length, with a padding mask, no grad."""
    cache_k, cache_v = randn(2, 2, 64, 32), randn(2, 2, 64, 32)
    k, v = cache_k[:, :, :41], cache_v[:, :, :41]
    mask = torch.ones(2, 1, 1, 41, dtype=torch.bool, device=DEVICE)
    mask[1, ..., 30:] = False
    check_sdpa(randn(2, 2, 1, 32), k, v, mask, grads=False, name="kv cache")


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------
def _dropout_call(q, k, v, state, p, is_causal=False):
    o, lse = call("attention", q, k, v, None, state, scale=0.25, is_causal=is_causal, dropout_p=p)
    return o, lse


def test_dropout_matches_the_philox_oracle():
    """Forward and backward with dropout equal the oracle that draws the same Philox mask in NumPy."""
    q, k, v = qkv(2, 2, 1, 9, 21, 16)
    state = torch.tensor([1234, 77], dtype=torch.int64, device=DEVICE)
    attrs = dict(scale=0.25, is_causal=True, dropout_p=0.3)
    o, lse = call("attention", q, k, v, None, state, **attrs)
    do = randn(*o.shape)
    grads = call("attention_backward", do, q, k, v, o, lse, None, state, **attrs)
    with ge2.use_backend("torch"):
        o_ref, lse_ref = call("attention", q, k, v, None, state, **attrs)
        grads_ref = call("attention_backward", do, q, k, v, o_ref, lse_ref, None, state, **attrs)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(lse, lse_ref) < 1e-5
    for g, r in zip(grads, grads_ref):
        assert rel_error(g, r) < 1e-5


def test_dropout_mask_statistics_and_seeding():
    """v = identity makes o the dropped-out probabilities: the dropped fraction is p, a state gives one mask."""
    S, p = 64, 0.25
    q, k = randn(2, 2, 32, 16), randn(2, 2, S, 16)
    v = torch.eye(S, device=DEVICE).expand(2, 2, S, S)
    state = torch.tensor([99, 0], dtype=torch.int64, device=DEVICE)
    o1, _ = _dropout_call(q, k, v, state, p)
    o2, _ = _dropout_call(q, k, v, state.clone(), p)
    assert torch.equal(o1, o2)  # same state, same mask
    dropped = (o1 == 0).double().mean().item()
    assert abs(dropped - p) < 0.03, dropped  # 8192 draws: 4 standard deviations is 0.019
    o_no, _ = _dropout_call(q, k, v, state, 0.0)
    kept = o1 != 0
    assert rel_error(o1[kept], o_no[kept] / (1 - p)) < 1e-5  # survivors scaled by 1/(1-p)
    o3, _ = _dropout_call(q, k, v, torch.tensor([99, 2 * 2 * 32 * S], device=DEVICE), p)
    assert not torch.equal(o1 == 0, o3 == 0)  # the advanced offset draws a new mask


def test_dropout_through_the_functional_advances_the_state():
    q, k, v = _leaves(*qkv(1, 2, 2, 8, 8, 16))
    state = torch.tensor([5, 0], dtype=torch.int64, device=DEVICE)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng_state=state)
    assert state.tolist() == [5, 2 * 8 * 8]
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng_state=state)
    assert not torch.equal(a.data, b.data)
    (a.sum() + b.sum()).backward()
    assert torch.isfinite(q.grad.data).all() and q.grad.data.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# precision, errors, purity
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["ieee", "tf32x3"] + (["tf32"] if CUDA else []))
def test_fp32_matmul_precisions(precision):
    ge2.set_matmul_precision(precision)
    q, k, v = qkv(1, 2, 2, 17, 23, 32)
    if precision == "tf32":  # one-pass tf32: judged against torch's tf32 error, not fp32's
        gq, gk, gv = (ge2.from_torch(t) for t in (q, k, v))
        out = F.scaled_dot_product_attention(gq, gk, gv)
        assert rel_error(out.data, _reference(q, k, v)) < 3e-3
    else:
        check_sdpa(q, k, v, name=precision)


def _t(*shape, dtype=torch.float32):
    return ge2.from_torch(randn(*shape, dtype=dtype))


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((_t(4), _t(4), _t(4)), {}, ValueError, "query must have at least 2 dims"),
    ((_t(1, 3, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8)), dict(enable_gqa=True), ValueError,
     "query's 3 heads are not a multiple of key's and value's 2 heads"),
    ((_t(1, 4, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8)), {}, ValueError, "pass enable_gqa=True"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 4), _t(1, 2, 6, 8)), {}, ValueError, "query's head dim 8 differs from key's 4"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 7, 8)), {}, ValueError, "key .* and value .* must agree"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8), _t(5, 7)), {}, ValueError, "cannot broadcast attn_mask \\[5, 7\\]"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8, dtype=torch.bfloat16), _t(1, 2, 6, 8)), {}, TypeError, "one dtype"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8)), dict(dropout_p=1.0), ValueError, "dropout_p must be in"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8)), dict(dropout_p=-0.1), ValueError, "dropout_p must be in"),
    ((_t(1, 2, 5, 300), _t(1, 2, 6, 300), _t(1, 2, 6, 8)), {}, ValueError, "head dim 300 is outside 1..256"),
    ((_t(1, 2, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8), _t(5, 6)), dict(is_causal=True), ValueError, "not both"),
])
def test_bad_input_gets_a_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        F.scaled_dot_product_attention(*args, **kwargs)


def test_mask_dtype_and_grad_errors():
    q = _t(1, 2, 5, 8)
    with pytest.raises(TypeError, match="attn_mask must be bool or a float dtype, got int64"):
        F.scaled_dot_product_attention(q, q, q, ge2.from_torch(torch.ones(5, 5, dtype=torch.int64, device=DEVICE)))
    with pytest.raises(NotImplementedError, match="attn_mask requires grad"):
        F.scaled_dot_product_attention(q, q, q, ge2.from_torch(randn(5, 5), requires_grad=True))


@TRITON
def test_attention_step_does_no_torch_math():
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = ge2.from_torch(randn(2, 7, 16))
    causal = ge2.from_torch(torch.ones(7, 7, dtype=torch.bool, device=DEVICE).triu(1))
    padding = ge2.from_torch(torch.tensor([[False] * 6 + [True], [False] * 7], device=DEVICE))
    with torch_op_guard():
        out, _ = mha(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)
        out2, _ = mha(x, x, x, need_weights=False, key_padding_mask=padding, attn_mask=causal)
        (out.sum() + out2.sum()).backward()
    assert mha.in_proj_weight.grad is not None


@pytest.mark.skipif(not CUDA, reason="device memory is measured on the GPU")
def test_forward_memory_is_linear_in_the_sequence():
    """At S = 16384 the forward and backward allocate O(L·H) beyond their inputs and outputs, never L x S."""
    B, H, L, E = 1, 4, 16384, 64
    q, k, v = (randn(B, H, L, E, dtype=torch.bfloat16) for _ in range(3))
    do = randn(B, H, L, E, dtype=torch.bfloat16)
    attrs = dict(scale=0.125, is_causal=True, dropout_p=0.0)
    o, lse = call("attention", q, k, v, None, None, **attrs)  # compile and tune outside the measurement
    call("attention_backward", do, q, k, v, o, lse, None, None, **attrs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    o, lse = call("attention", q, k, v, None, None, **attrs)
    grads = call("attention_backward", do, q, k, v, o, lse, None, None, **attrs)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    io = 4 * q.numel() * q.element_size() + lse.numel() * 4  # o, dq, dk, dv
    assert extra <= io + 64 * B * H * L * 4, (extra, io)  # the L x S scores alone would be 2 GiB
    del grads


# ---------------------------------------------------------------------------------------------
# MultiheadAttention
# ---------------------------------------------------------------------------------------------
def _mha_pair(E, H, **kw):
    tm = torch.nn.MultiheadAttention(E, H, **kw).to(DEVICE)
    gm = nn.MultiheadAttention(E, H, **kw)
    gm.load_state_dict({k: ge2.from_torch(v.detach().clone()) for k, v in tm.state_dict().items()})
    return tm, gm


def test_mha_state_dict_keys_and_init_match_torch():
    torch.manual_seed(3)
    tm = torch.nn.MultiheadAttention(24, 4, kdim=10, vdim=12, device=DEVICE)
    torch.manual_seed(3)
    gm = nn.MultiheadAttention(24, 4, kdim=10, vdim=12)
    assert list(gm.state_dict()) == list(tm.state_dict())
    for key, value in tm.state_dict().items():
        assert torch.equal(gm.state_dict()[key].data, value), key
    assert list(nn.MultiheadAttention(8, 2).state_dict()) == list(torch.nn.MultiheadAttention(8, 2).state_dict())


@pytest.mark.parametrize("batch_first,need_weights,masks,average", [
    (True, False, "none", True), (False, False, "causal", True), (True, True, "both", True),
    (False, True, "padding", False), (True, False, "both", True), (False, False, "float3d", True),
])
def test_mha_matches_torch(batch_first, need_weights, masks, average):
    E, H, N, L = 32, 4, 3, 9
    tm, gm = _mha_pair(E, H, batch_first=batch_first)
    x = randn(N, L, E) if batch_first else randn(L, N, E)
    kpm = attn = None
    is_causal = masks == "causal"
    if masks in ("padding", "both"):
        kpm = torch.rand(N, L, device=DEVICE) > 0.7
        kpm[:, 0] = False
    if masks in ("causal", "both"):
        attn = torch.ones(L, L, dtype=torch.bool, device=DEVICE).triu(1)
    if masks == "float3d":
        attn = randn(N * H, L, L)
    xt = x.clone().requires_grad_()
    t_out, t_w = tm(xt, xt, xt, key_padding_mask=kpm, need_weights=need_weights, attn_mask=attn,
                    average_attn_weights=average, is_causal=is_causal)
    xg = ge2.from_torch(x.clone(), requires_grad=True)
    g_out, g_w = gm(xg, xg, xg, key_padding_mask=ge2.from_torch(kpm) if kpm is not None else None,
                    need_weights=need_weights, attn_mask=ge2.from_torch(attn) if attn is not None else None,
                    average_attn_weights=average, is_causal=is_causal)
    assert rel_error(g_out.data, t_out) < 1e-5
    assert (g_w is None) == (t_w is None)
    if t_w is not None:
        assert rel_error(g_w.data, t_w) < 1e-5
    go = randn(*t_out.shape)
    t_out.backward(go)
    g_out.backward(ge2.from_torch(go))
    assert rel_error(xg.grad.data, xt.grad) < 1e-5
    t_params = dict(tm.named_parameters())
    for name, p in gm.named_parameters():
        assert rel_error(p.grad.data, t_params[name].grad) < 1e-5, name


def test_mha_cross_attention_kdim_vdim_and_unbatched():
    tm, gm = _mha_pair(16, 2, kdim=6, vdim=10, batch_first=True)
    q, k, v = randn(2, 5, 16), randn(2, 7, 6), randn(2, 7, 10)
    t_out, _ = tm(q, k, v, need_weights=False)
    g_out, _ = gm(*(ge2.from_torch(t) for t in (q, k, v)), need_weights=False)
    assert rel_error(g_out.data, t_out) < 1e-5
    tm2, gm2 = _mha_pair(16, 4)
    x, mem = randn(5, 16), randn(8, 16)  # unbatched [L, E], cross attention with one in_proj_weight
    t_out, t_w = tm2(x, mem, mem)
    g_out, g_w = gm2(ge2.from_torch(x), ge2.from_torch(mem), ge2.from_torch(mem))
    assert g_out.shape == t_out.shape and g_w.shape == t_w.shape
    assert rel_error(g_out.data, t_out) < 1e-5 and rel_error(g_w.data, t_w) < 1e-5


def test_mha_dropout_only_in_training_and_errors():
    _, gm = _mha_pair(16, 2, dropout=0.5, batch_first=True)
    x = ge2.from_torch(randn(2, 6, 16))
    a, _ = gm(x, x, x, need_weights=False)
    b, _ = gm(x, x, x, need_weights=False)
    assert not torch.equal(a.data, b.data)
    gm.eval()
    a, _ = gm(x, x, x, need_weights=False)
    b, _ = gm(x, x, x, need_weights=False)
    assert torch.equal(a.data, b.data)
    with pytest.raises(ValueError, match="embed_dim 10 is not divisible by num_heads 3"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="query has 12 features but the module expects 16"):
        gm(_t(2, 6, 12), x, x)
    with pytest.raises(ValueError, match="pass attn_mask too"):
        gm(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="key_padding_mask \\[2, 5\\] must be \\[N, S\\]"):
        gm(x, x, x, key_padding_mask=ge2.from_torch(torch.zeros(2, 5, dtype=torch.bool, device=DEVICE)))


@pytest.mark.skipif(not CUDA, reason="bf16 MultiheadAttention at size runs on the GPU")
def test_mha_bf16_on_the_gpu_matches_torch():
    tm, gm = _mha_pair(256, 4, batch_first=True, dtype=torch.bfloat16)
    x = randn(4, 300, 256, dtype=torch.bfloat16)
    mask = torch.ones(300, 300, dtype=torch.bool, device=DEVICE).triu(1)
    xt = x.clone().requires_grad_()
    t_out, _ = tm(xt, xt, xt, attn_mask=mask, is_causal=True, need_weights=False)
    xg = ge2.from_torch(x.clone(), requires_grad=True)
    g_out, _ = gm(xg, xg, xg, attn_mask=ge2.from_torch(mask), is_causal=True, need_weights=False)
    with torch.no_grad():
        ref = copy.deepcopy(tm).double()(*(x.double(),) * 3, attn_mask=mask, need_weights=False)[0]
    assert_matches(g_out.data, ref.double(), t_out, name="mha bf16")
    go = randn(*t_out.shape, dtype=torch.bfloat16)
    t_out.backward(go)
    g_out.backward(ge2.from_torch(go))
    assert rel_error(xg.grad.data, xt.grad) < 3e-2


def test_autocast_runs_attention_in_the_low_dtype():
    """Under autocast fp32 q, k, v run in bf16 (torch's lower-precision list); gradients reach them in fp32."""
    q, k, v = qkv(1, 2, 2, 9, 13, 16)
    gq, gk, gv = _leaves(q, k, v)
    with ge2.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(gq, gk, gv, is_causal=True)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        t_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == t_out.dtype == torch.bfloat16
    assert_matches(out.data, _reference(q, k, v, is_causal=True), t_out, name="autocast sdpa")
    out.to(torch.float32).sum().backward()
    assert gq.grad.dtype == torch.float32 and gv.grad.dtype == torch.float32
