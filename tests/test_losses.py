"""nll_loss, mse_loss and binary_cross_entropy_with_logits (ops and autograd) against torch.

Forward and backward in float64 references, judged against torch's own error in the same dtype,
for every reduction, with class weights / ignored targets (nll), non-contiguous inputs, target
gradients (mse, bce) and broadcast weight / pos_weight (bce).
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from ge2.backend import call
from tests.numerics import DEVICE, LARGE, assert_matches, randn

REDUCTIONS = ("mean", "sum", "none")


def _grads(fn, inputs, gy):
    """(out, grads) of fn over torch tensors, grads w.r.t. every input, seeded by gy."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, gy)
    return out.detach(), grads


def _gy(shape, dtype, seed):
    return randn(*shape, dtype=dtype, seed=seed) if shape else torch.tensor(0.7, dtype=dtype, device=DEVICE)


# ---------------------------------------------------------------------------------------------
# nll_loss
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction,weighted,spatial", list(itertools.product(REDUCTIONS, (False, True),
                                                                              (False, True))))
def test_nll_loss(reduction, weighted, spatial):
    C = 6
    shape = (3, C, 2, 3) if spatial else (7, C)
    logp = torch.log_softmax(randn(*shape, seed=1), 1)
    tshape = (shape[0],) + shape[2:]
    t = torch.randint(0, C, tshape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    t.view(-1)[::4] = -3
    w = randn(C, seed=3).abs() + 0.2 if weighted else None
    x = ge2.from_torch(logp, requires_grad=True)
    loss = F.nll_loss(x, ge2.from_torch(t), ge2.from_torch(w) if w is not None else None, ignore_index=-3,
                      reduction=reduction)
    gy = _gy(tuple(loss.shape), torch.float32, 4)
    loss.backward(ge2.from_torch(gy))

    def f(lp):
        return TF.nll_loss(lp, t, weight=w.to(lp.dtype) if w is not None else None, ignore_index=-3,
                           reduction=reduction)

    out64, (g64,) = _grads(f, [logp.double()], gy.double())
    out32, (g32,) = _grads(f, [logp], gy)
    assert_matches(loss.data, out64, out32, name="nll loss")
    assert_matches(x.grad.data, g64, g32, name="nll dlogp")
    assert torch.equal(x.grad.data.movedim(1, -1)[t == -3].cpu(), torch.zeros(int((t == -3).sum()), C))


def test_nll_all_ignored_mean_is_nan():
    logp = torch.log_softmax(randn(3, 4, seed=5), 1)
    t = torch.full((3,), -100, device=DEVICE)
    assert torch.isnan(call("nll_loss", logp, t)) and torch.isnan(TF.nll_loss(logp, t))


# ---------------------------------------------------------------------------------------------
# mse_loss
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction,noncontig", list(itertools.product(REDUCTIONS, (False, True))))
def test_mse_loss(reduction, noncontig):
    shape = (5, 3, 7)
    x0 = randn(*shape, noncontig=noncontig, seed=6)
    y0 = randn(*shape, seed=7)
    x = ge2.from_torch(x0, requires_grad=True)
    y = ge2.from_torch(y0, requires_grad=True)
    loss = F.mse_loss(x, y, reduction=reduction)
    gy = _gy(tuple(loss.shape), torch.float32, 8)
    loss.backward(ge2.from_torch(gy))
    f = lambda a, b: TF.mse_loss(a, b, reduction=reduction)  # noqa: E731
    out64, (gx64, gt64) = _grads(f, [x0.double(), y0.double()], gy.double())
    out32, (gx32, gt32) = _grads(f, [x0, y0], gy)
    assert_matches(loss.data, out64, out32, name="mse loss")
    assert_matches(x.grad.data, gx64, gx32, name="mse dx")
    assert_matches(y.grad.data, gt64, gt32, name="mse dtarget")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mse_half_precision(dtype):
    n = 100_000 if LARGE else 3000
    x0, y0 = randn(n, dtype=dtype, seed=9), randn(n, dtype=dtype, seed=10)
    out = call("mse_loss", x0, y0)
    assert out.dtype == dtype
    assert_matches(out, TF.mse_loss(x0.double(), y0.double()), TF.mse_loss(x0, y0), name="mse")


def test_mse_more_than_four_dims_and_empty():
    x0, y0 = randn(2, 3, 1, 2, 3, seed=11), randn(2, 3, 1, 2, 3, seed=12)
    assert_matches(call("mse_loss", x0, y0, reduction="sum"), TF.mse_loss(x0.double(), y0.double(), reduction="sum"),
                   TF.mse_loss(x0, y0, reduction="sum"), name="5-D mse")
    e = torch.empty(0, 3, device=DEVICE)
    assert torch.isnan(call("mse_loss", e, e)) and call("mse_loss", e, e, reduction="sum").item() == 0.0


# ---------------------------------------------------------------------------------------------
# binary_cross_entropy_with_logits
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction,weight_kind,pos_weight_kind", [
    (r, w, p) for r, (w, p) in zip(itertools.cycle(REDUCTIONS),
                                   itertools.product(("none", "full", "row"), ("none", "class", "scalar")))
])
def test_bce_with_logits(reduction, weight_kind, pos_weight_kind):
    N, C = 6, 5
    x0 = randn(N, C, seed=13) * 4  # wide logits: the stable softplus form matters
    t0 = torch.rand(N, C, generator=torch.Generator().manual_seed(14), dtype=torch.float64).float().to(DEVICE)
    w = {"none": None, "full": randn(N, C, seed=15).abs(), "row": randn(N, 1, seed=16).abs()}[weight_kind]
    pw = {"none": None, "class": randn(C, seed=17).abs() + 0.5, "scalar": torch.tensor([2.5], device=DEVICE)}[
        pos_weight_kind]
    x = ge2.from_torch(x0, requires_grad=True)
    t = ge2.from_torch(t0, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(x, t, ge2.from_torch(w) if w is not None else None,
                                              pos_weight=ge2.from_torch(pw) if pw is not None else None,
                                              reduction=reduction)
    gy = _gy(tuple(loss.shape), torch.float32, 18)
    loss.backward(ge2.from_torch(gy))

    def f(a, b):
        return TF.binary_cross_entropy_with_logits(
            a, b, weight=w.to(a.dtype) if w is not None else None,
            pos_weight=pw.to(a.dtype) if pw is not None else None, reduction=reduction)

    out64, (gx64, gt64) = _grads(f, [x0.double(), t0.double()], gy.double())
    out32, (gx32, gt32) = _grads(f, [x0, t0], gy)
    assert_matches(loss.data, out64, out32, name="bce loss")
    assert_matches(x.grad.data, gx64, gx32, name="bce dx")
    assert_matches(t.grad.data, gt64, gt32, name="bce dtarget")


def test_bce_half_precision():
    x0 = randn(40, 33, dtype=torch.bfloat16, seed=19)
    t0 = (randn(40, 33, seed=20) > 0).to(torch.bfloat16)
    out = call("binary_cross_entropy_with_logits", x0, t0)
    f = TF.binary_cross_entropy_with_logits
    assert_matches(out, f(x0.double(), t0.double()), f(x0, t0), name="bce bf16")


def test_loss_schema_errors():
    x = randn(4, 5)
    with pytest.raises(ValueError, match=r"mse_loss: target has shape \[4, 4\] but input has \[4, 5\]"):
        call("mse_loss", x, randn(4, 4))
    with pytest.raises(ValueError, match="mse_loss: reduction must be one of"):
        call("mse_loss", x, x, reduction="max")
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits: pos_weight \[3\] must broadcast|"
                                         r"binary_cross_entropy_with_logits: cannot broadcast"):
        call("binary_cross_entropy_with_logits", x, x, None, randn(3))
    with pytest.raises(ValueError, match=r"mse_loss_backward: gy has shape \[4, 5\], expected \[\]"):
        call("mse_loss_backward", x, x, x)
    with pytest.raises(ValueError, match=r"nll_loss: target has shape \[5\] but logits \[4, 5\] needs target \[4\]"):
        call("nll_loss", x, torch.zeros(5, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="binary_cross_entropy_with_logits: no gradient for pos_weight"):
        F.binary_cross_entropy_with_logits(ge2.from_torch(x), ge2.from_torch(x),
                                           pos_weight=ge2.from_torch(randn(5), requires_grad=True))
