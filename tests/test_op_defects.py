"""Issue 25's defects in existing ops, tried as a PyTorch user would: each against torch.

- matmul / mm / bmm / addmm with an empty contraction dim give zeros (and zero gradients);
- float64 is computed in float64 (errors ~1e-16 against torch's float64, where fp32 math gives
  ~1e-8) by softmax/log_softmax, the losses, the norms and embedding's gradient; what is refused
  (long fp64 cross-entropy rows, fp64 linear_cross_entropy) says so;
- the arguments a PyTorch user passes: softmax(dtype=), class-probability cross_entropy targets,
  unbatched pooling inputs, one-element geometry tuples, memory_format= on casts;
- linear_cross_entropy with torch 2.13's signature, and fp32 losses under autocast.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from ge2.kernels import cross_entropy as CE
from ge2.kernels import softmax as SK
from tests.numerics import DEVICE, assert_matches, randn, rel_error

F64 = torch.float64
F64_BUDGET = 1e-14  # ge2 vs torch, both in float64: a few ulps; fp32 math would give ~1e-8


def _g(t: torch.Tensor, grad: bool = True) -> ge2.Tensor:
    return ge2.from_torch(t.clone(), requires_grad=grad)


def _t(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _close64(name: str, out, ref) -> None:
    err = rel_error(out.data if isinstance(out, ge2.Tensor) else out, ref)
    assert err <= F64_BUDGET, f"{name}: relative error {err:.2e} against torch's float64 (> {F64_BUDGET})"


def _backward_both(out: ge2.Tensor, ref: torch.Tensor, seed: int) -> None:
    g = randn(*ref.shape, dtype=ref.dtype, seed=seed)
    out.backward(ge2.from_torch(g))
    ref.backward(g)


# ---------------------------------------------------------------------------------------------
# empty contraction dims
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((5, 0), (0, 10)), ((5, 5, 0), (0, 5)), ((2, 5, 0), (2, 0, 3)),
                                   ((0,), (0,)), ((3, 0), (0,))])
def test_matmul_with_an_empty_contraction_gives_zeros(sa, sb):
    a, b = randn(*sa, seed=1), randn(*sb, seed=2)
    ga, gb = _g(a), _g(b)
    ta, tb = _t(a), _t(b)
    y, ref = ga @ gb, ta @ tb
    assert y.shape == ref.shape and torch.equal(y.data, ref.detach())
    _backward_both(y, ref, seed=3)
    assert torch.equal(ga.grad.data, ta.grad) and torch.equal(gb.grad.data, tb.grad)


def test_mm_bmm_addmm_vs_torch():
    assert torch.equal(ge2.mm(_g(randn(5, 0, seed=4)), _g(randn(0, 4, seed=5))).data, torch.zeros(5, 4, device=DEVICE))
    x, y = randn(2, 3, 4, seed=6, dtype=F64), randn(2, 4, 5, seed=7, dtype=F64)
    _close64("bmm", ge2.bmm(_g(x), _g(y)), torch.bmm(x, y))
    # addmm: a broadcast input, alpha and beta, gradients of all three; and K = 0 (beta * input)
    for k in (3, 0):
        c, m1, m2 = randn(5, seed=8, dtype=F64), randn(4, k, seed=9, dtype=F64), randn(k, 5, seed=10, dtype=F64)
        gs, ts = [_g(v) for v in (c, m1, m2)], [_t(v) for v in (c, m1, m2)]
        out, ref = ge2.addmm(*gs, beta=0.5, alpha=-2.0), torch.addmm(*ts, beta=0.5, alpha=-2.0)
        _close64(f"addmm K={k}", out, ref.detach())
        _backward_both(out, ref, seed=11)
        for name, g, t in zip(("input", "mat1", "mat2"), gs, ts):
            _close64(f"addmm K={k} d{name}", g.grad, t.grad)
    with pytest.raises(ValueError, match=r"mm: input must be 2-D, got \[2, 3, 4\]"):
        ge2.mm(_g(x), _g(y))
    with pytest.raises(ValueError, match=r"addmm: cannot broadcast input \[3\] and mat1 @ mat2 \[4, 5\]"):
        ge2.addmm(_g(randn(3, seed=12)), _g(randn(4, 2, seed=13)), _g(randn(2, 5, seed=14)))


# ---------------------------------------------------------------------------------------------
# float64 computed in float64
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True])
def test_softmax_float64(log):
    x = randn(5, 9, 4, dtype=F64, noncontig=True, seed=20) * 4
    for dim in (-1, 1):
        gx, tx = _g(x), _t(x)
        y = (F.log_softmax if log else F.softmax)(gx, dim)
        ref = (TF.log_softmax if log else TF.softmax)(tx, dim)
        _close64("softmax", y, ref.detach())
        _backward_both(y, ref, seed=21)
        _close64("softmax grad", gx.grad, tx.grad)
    # the online (long-row) kernels, reached with tiny rows by lowering the in-register limit; a scale
    y = SK.softmax_fwd(x, 1, scale=0.3, log=log, max_fused_n=4)
    ref = (TF.log_softmax if log else TF.softmax)(x * 0.3, 1)
    _close64("softmax online", y, ref)
    gy = randn(*x.shape, dtype=F64, seed=22)
    tx = _t(x)
    ((TF.log_softmax if log else TF.softmax)(tx * 0.3, 1)).backward(gy)
    _close64("softmax online grad", SK.softmax_bwd(gy, y, 1, scale=0.3, log=log, max_fused_n=4), tx.grad)


def test_class_losses_float64():
    x = randn(6, 5, 3, dtype=F64, seed=30) * 3
    t = torch.randint(0, 5, (6, 3), generator=torch.Generator().manual_seed(31)).to(DEVICE)
    t[1, 2] = -100
    w = torch.rand(5, generator=torch.Generator().manual_seed(32), dtype=F64).to(DEVICE) + 0.5
    for reduction, smoothing in (("mean", 0.1), ("none", 0.0), ("sum", 0.3)):
        gx, tx = _g(x), _t(x)
        loss = F.cross_entropy(gx, ge2.from_torch(t), ge2.from_torch(w), reduction=reduction,
                               label_smoothing=smoothing)
        ref = TF.cross_entropy(tx, t, w, reduction=reduction, label_smoothing=smoothing)
        assert loss.dtype == F64
        _close64(f"cross_entropy {reduction}", loss, ref.detach())
        _backward_both(loss, ref, seed=33)
        _close64(f"cross_entropy {reduction} grad", gx.grad, tx.grad)
        lp = TF.log_softmax(x, 1)
        gp, tp = _g(lp), _t(lp)
        loss = F.nll_loss(gp, ge2.from_torch(t), ge2.from_torch(w), reduction=reduction)
        ref = TF.nll_loss(tp, t, w, reduction=reduction)
        _close64(f"nll_loss {reduction}", loss, ref.detach())
        _backward_both(loss, ref, seed=34)
        _close64(f"nll_loss {reduction} grad", gp.grad, tp.grad)


def test_float64_refusals_say_what_is_unsupported():
    with pytest.raises(ValueError, match="cross_entropy: float64 logits are computed in float64 only for rows of "
                                         "up to 16384 classes, got 16385"):
        F.cross_entropy(_g(randn(1, 16385, dtype=F64, seed=35)), ge2.from_torch(torch.zeros(1, dtype=torch.long,
                                                                                             device=DEVICE)))
    with pytest.raises(TypeError, match="linear_cross_entropy: x has dtype float64"):
        F.linear_cross_entropy(_g(randn(3, 4, dtype=F64, seed=36)), _g(randn(5, 4, dtype=F64, seed=37)),
                               ge2.from_torch(torch.zeros(3, dtype=torch.long, device=DEVICE)))


def test_pointwise_losses_float64():
    x, t = randn(4, 7, dtype=F64, seed=40), torch.rand(4, 7, dtype=F64, generator=torch.Generator().manual_seed(41))
    t = t.to(DEVICE)
    w, pw = randn(7, dtype=F64, seed=42).abs(), randn(7, dtype=F64, seed=43).abs() + 0.5
    for reduction in ("mean", "none"):
        gx, tx = _g(x), _t(x)
        loss, ref = F.mse_loss(gx, _g(t, False), reduction=reduction), TF.mse_loss(tx, t, reduction=reduction)
        _close64("mse_loss", loss, ref.detach())
        _backward_both(loss, ref, seed=44)
        _close64("mse_loss grad", gx.grad, tx.grad)
        gx, tx = _g(x), _t(x)
        loss = F.binary_cross_entropy_with_logits(gx, _g(t, False), _g(w, False), pos_weight=_g(pw, False),
                                                  reduction=reduction)
        ref = TF.binary_cross_entropy_with_logits(tx, t, w, pos_weight=pw, reduction=reduction)
        _close64("bce_with_logits", loss, ref.detach())
        _backward_both(loss, ref, seed=45)
        _close64("bce_with_logits grad", gx.grad, tx.grad)


def test_norms_float64():
    x, w, b = randn(5, 6, dtype=F64, seed=50) * 3 + 2, randn(6, dtype=F64, seed=51), randn(6, dtype=F64, seed=52)
    gs, ts = [_g(v) for v in (x, w, b)], [_t(v) for v in (x, w, b)]
    y, ref = F.layer_norm(gs[0], (6,), gs[1], gs[2]), TF.layer_norm(ts[0], (6,), ts[1], ts[2])
    _close64("layer_norm", y, ref.detach())
    _backward_both(y, ref, seed=53)
    for name, g, t in zip(("x", "weight", "bias"), gs, ts):
        _close64(f"layer_norm d{name}", g.grad, t.grad)
    gs, ts = [_g(v) for v in (x, w)], [_t(v) for v in (x, w)]
    y, ref = F.rms_norm(gs[0], (6,), gs[1], eps=1e-6), TF.rms_norm(ts[0], (6,), ts[1], eps=1e-6)
    _close64("rms_norm", y, ref.detach())
    _backward_both(y, ref, seed=54)
    for name, g, t in zip(("x", "weight"), gs, ts):
        _close64(f"rms_norm d{name}", g.grad, t.grad)
    # batch norm: output, gradients and the running statistics (train), then eval from them
    x4 = randn(3, 4, 2, 5, dtype=F64, seed=55) + 1.5
    w4, b4 = randn(4, dtype=F64, seed=56), randn(4, dtype=F64, seed=57)
    rm, rv = randn(4, dtype=F64, seed=58), randn(4, dtype=F64, seed=59).abs() + 0.5
    grm, grv, trm, trv = _g(rm, False), _g(rv, False), rm.clone(), rv.clone()
    gs, ts = [_g(v) for v in (x4, w4, b4)], [_t(v) for v in (x4, w4, b4)]
    y = F.batch_norm(gs[0], grm, grv, gs[1], gs[2], training=True, momentum=0.3, eps=1e-5)
    ref = TF.batch_norm(ts[0], trm, trv, ts[1], ts[2], training=True, momentum=0.3, eps=1e-5)
    _close64("batch_norm", y, ref.detach())
    _close64("batch_norm running_mean", grm, trm)
    _close64("batch_norm running_var", grv, trv)
    _backward_both(y, ref, seed=60)
    for name, g, t in zip(("x", "weight", "bias"), gs, ts):
        _close64(f"batch_norm d{name}", g.grad, t.grad)
    y = F.batch_norm(_g(x4, False), grm, grv, _g(w4, False), _g(b4, False), training=False)
    _close64("batch_norm eval", y, TF.batch_norm(x4, trm, trv, w4, b4, training=False))


def test_embedding_gradient_float64():
    table = randn(7, 5, dtype=F64, seed=61)
    idx = torch.randint(0, 7, (40,), generator=torch.Generator().manual_seed(62)).to(DEVICE)  # many repeats
    gw, tw = _g(table), _t(table)
    y, ref = F.embedding(ge2.from_torch(idx), gw, padding_idx=3), TF.embedding(idx, tw, padding_idx=3)
    # gy rows of very different magnitudes: an fp32 accumulation would lose the small ones
    g = randn(40, 5, dtype=F64, seed=63) * torch.logspace(-8, 0, 40, dtype=F64, device=DEVICE)[:, None]
    y.backward(ge2.from_torch(g))
    ref.backward(g)
    _close64("embedding grad", gw.grad, tw.grad)


# ---------------------------------------------------------------------------------------------
# arguments a PyTorch user passes
# ---------------------------------------------------------------------------------------------
def test_softmax_dtype_argument():
    x = randn(4, 6, seed=70)
    gx, tx = _g(x), _t(x)
    y, ref = F.log_softmax(gx, 1, dtype=F64), TF.log_softmax(tx, 1, dtype=F64)
    assert y.dtype == F64
    _close64("log_softmax(dtype=float64)", y, ref.detach())
    _backward_both(y, ref, seed=71)
    assert gx.grad.dtype == torch.float32
    assert_matches(gx.grad.data, tx.grad.double(), tx.grad, name="grad")
    assert gx.softmax(0, dtype=F64).dtype == F64
    with pytest.raises(TypeError, match="softmax: dtype must be a floating torch.dtype"):
        F.softmax(gx, 1, dtype=torch.int64)


@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 4), (5,)])
def test_cross_entropy_with_class_probabilities(shape):
    class_dim = 0 if len(shape) == 1 else 1
    x = randn(*shape, seed=72) * 2
    t = torch.softmax(randn(*shape, seed=73) * 2, class_dim)
    w = randn(5, seed=74).abs() + 0.2
    for reduction, smoothing, weight in (("mean", 0.2, w), ("none", 0.0, None), ("sum", 0.0, w)):
        gx, tx = _g(x), _t(x)
        loss = F.cross_entropy(gx, _g(t, False), _g(weight, False) if weight is not None else None,
                               reduction=reduction, label_smoothing=smoothing)
        kw = dict(reduction=reduction, label_smoothing=smoothing)
        ref = TF.cross_entropy(tx, t, weight, **kw)
        tx64 = _t(x.double())
        ref64 = TF.cross_entropy(tx64, t.double(), weight.double() if weight is not None else None, **kw)
        assert_matches(loss.data, ref64.detach(), ref.detach(), name=f"loss {reduction}")
        g = randn(*ref.shape, seed=75)
        loss.backward(ge2.from_torch(g))
        ref.backward(g)
        ref64.backward(g.double())
        assert_matches(gx.grad.data, tx64.grad, tx.grad, name=f"grad {reduction}")
    with pytest.raises(ValueError, match="cross_entropy: a float .class-probability. target must have the logits' shape"):
        F.cross_entropy(_g(x), _g(t.flatten()[:4], False))
    with pytest.raises(TypeError, match="cross_entropy: class-probability target has dtype torch.float64"):
        F.cross_entropy(_g(x), _g(t.double(), False))


def test_pooling_unbatched_and_one_element_tuples():
    x = randn(3, 7, 6, seed=80)
    w = randn(4, 3, 3, 3, seed=81)
    cases = [
        ("max_pool2d", lambda f, a: f.max_pool2d(a, (3,), stride=(2,), padding=(1,))),
        ("avg_pool2d", lambda f, a: f.avg_pool2d(a, (2,), (), count_include_pad=False)),
        ("adaptive_avg_pool2d", lambda f, a: f.adaptive_avg_pool2d(a, (3, 2))),
        ("conv2d", lambda f, a: f.conv2d(a, ge2.from_torch(w) if f is F else w, padding=(1,), stride=(2,))),
    ]
    for name, fn in cases:
        gx, tx = _g(x), _t(x)
        y, ref = fn(F, gx), fn(TF, tx)
        assert tuple(y.shape) == tuple(ref.shape), name
        assert_matches(y.data, fn(TF, x.double()) if name != "conv2d" else TF.conv2d(x.double(), w.double(),
                       padding=1, stride=2), ref.detach(), name=name)
        g = randn(*ref.shape, seed=82)
        y.backward(ge2.from_torch(g))
        ref.backward(g)
        assert_matches(gx.grad.data, tx.grad.double(), tx.grad, name=f"{name} grad")
    y, idx = F.max_pool2d(_g(x, False), 2, return_indices=True)
    assert torch.equal(idx.data, TF.max_pool2d(x, 2, return_indices=True)[1])
    with pytest.raises(ValueError, match=r"max_pool2d: x must be 4-D \[N, C, H, W\] or 3-D \[C, H, W\], got shape \[7, 6\]"):
        F.max_pool2d(_g(x[0], False), 2)


# ---------------------------------------------------------------------------------------------
# linear_cross_entropy: torch 2.13's signature; fp32 losses under autocast
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction,one_row", [("mean", False), ("none", False), ("sum", True), ("none", True)])
def test_linear_cross_entropy_torch_signature(reduction, one_row):
    N, H, V = 11, 6, 9
    x, W, b = randn(N, H, seed=90), randn(V, H, seed=91) * 0.5, randn(V, seed=92)
    cw = randn(V, seed=93).abs() + 0.3
    t = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(94)).to(DEVICE)
    t[3] = -100
    if one_row:
        x, t = x[2], t[2]
    kw = dict(reduction=reduction, label_smoothing=0.1)
    gs = [_g(v) for v in (x, W, b)]
    loss = F.linear_cross_entropy(gs[0], gs[1], ge2.from_torch(t), linear_bias=gs[2], weight=_g(cw, False),
                                  chunk_rows=4, **kw)
    ts, ts64 = [_t(v) for v in (x, W, b)], [_t(v.double()) for v in (x, W, b)]
    # torch >= 2.13's F.linear_cross_entropy where it exists; its definition (linear, then CE) on older torch
    lce = getattr(TF, "linear_cross_entropy", None) or (
        lambda x_, w_, t_, *, linear_bias, **k: TF.cross_entropy(TF.linear(x_, w_, linear_bias), t_, **k))
    ref = lce(ts[0], ts[1], t, linear_bias=ts[2], weight=cw, **kw)
    ref64 = lce(ts64[0], ts64[1], t, linear_bias=ts64[2], weight=cw.double(), **kw)
    assert loss.shape == ref.shape
    assert_matches(loss.data, ref64.detach(), ref.detach(), name="loss")
    g = randn(*ref.shape, seed=95)
    loss.backward(ge2.from_torch(g))
    ref.backward(g)
    ref64.backward(g.double())
    for name, got, r64, r32 in zip(("dx", "dW", "db"), gs, ts64, ts):
        assert_matches(got.grad.data, r64.grad, r32.grad, name=name)


def test_losses_are_fp32_under_autocast():
    N, H, V = 5, 8, 7
    x, W = randn(N, H, seed=96), randn(V, H, seed=97)
    t = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(98)).to(DEVICE)
    with ge2.autocast(DEVICE.type, dtype=torch.bfloat16):
        gx, gW = _g(x), _g(W)
        loss = F.linear_cross_entropy(gx, gW, ge2.from_torch(t))
        logits = F.linear(gx, gW)
        assert logits.dtype == torch.bfloat16
        ce = F.cross_entropy(logits, ge2.from_torch(t))
    assert loss.dtype == torch.float32 and ce.dtype == torch.float32
    ref = TF.cross_entropy(x.bfloat16().double() @ W.bfloat16().double().T, t)
    assert rel_error(loss.data, ref) < 2e-2  # bf16 operands, fp32 loss
    loss.backward()
    assert gx.grad.dtype == torch.float32 and gW.grad.dtype == torch.float32


def test_memory_format_on_casts_to_and_contiguous():
    x0 = randn(2, 3, 4, 5, seed=99)
    x = _g(x0)
    y = x.to(F64, memory_format=torch.channels_last)
    assert y.dtype == F64 and y.data.is_contiguous(memory_format=torch.channels_last)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last) and torch.equal(cl.data, x0)
    # preserve_format (the default) keeps a dense input's strides, as torch's casts do
    assert cl.half().data.stride() == x0.half().contiguous(memory_format=torch.channels_last).stride()
    assert x.float(memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last)
    assert x.to(memory_format=torch.contiguous_format) is x and cl.contiguous().data.is_contiguous()
    (y.sum() + cl.sum() * 2.0 + cl.half().float().sum()).backward()
    assert torch.equal(x.grad.data, torch.full_like(x0, 4.0))
    with pytest.raises(ValueError, match=r"to: torch.channels_last needs a 4-D tensor, got shape \[3, 4\]"):
        _g(randn(3, 4, seed=100), False).to(memory_format=torch.channels_last)
    with pytest.raises(TypeError, match="contiguous: memory_format must be a torch.memory_format"):
        x.contiguous(memory_format="channels_last")
