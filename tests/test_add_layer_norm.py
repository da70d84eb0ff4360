"""F.add_layer_norm (a residual add fused with the LayerNorm after it) against torch's add + layer_norm."""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from tests.numerics import assert_matches, randn


def _run(x, r, w, b, gs, gy, out_dtype, *, ge2_side: bool):
    """(s, y, grad x, grad residual, grad weight, grad bias) of s = x + r, y = layer_norm(s).to(out_dtype)."""
    N = x.shape[-1]
    if ge2_side:
        xg, wg, bg = (ge2.from_torch(t.detach().clone(), requires_grad=True) for t in (x, w, b))
        rg = ge2.from_torch(r.detach().clone(), requires_grad=True) if r is not None else None
        s, y = F.add_layer_norm(xg, rg, (N,), wg, bg, 1e-5, out_dtype=out_dtype)
        ((s * ge2.from_torch(gs)).sum() + (y * ge2.from_torch(gy)).sum()).backward()
        return [s.data, y.data, xg.grad.data] + ([rg.grad.data] if r is not None else []) + [wg.grad.data,
                                                                                               bg.grad.data]
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    r = r.detach().clone().requires_grad_() if r is not None else None
    s = x + r if r is not None else x
    y = torch.nn.functional.layer_norm(s, (N,), w, b, 1e-5).to(out_dtype or s.dtype)
    ((s * gs).sum() + (y * gy).sum()).backward()
    return [s.detach(), y.detach(), x.grad] + ([r.grad] if r is not None else []) + [w.grad, b.grad]


@pytest.mark.parametrize("shape, x_dtype, r_dtype, out_dtype, noncontig", [
    ((2, 3, 13), torch.float32, torch.float32, None, False),
    ((5, 40), torch.float32, torch.bfloat16, torch.bfloat16, True),   # a pre-LN block under bf16 autocast
    ((1, 1, 7), torch.float32, torch.float16, torch.float16, False),
    ((3, 1), torch.float32, torch.float32, None, True),               # one element per row
    ((4, 9), torch.float64, torch.float64, None, False),
    ((2, 4100), torch.float32, torch.bfloat16, torch.bfloat16, False),  # rows past one tile: the add runs first
])
def test_add_layer_norm_vs_torch(shape, x_dtype, r_dtype, out_dtype, noncontig):
    N = shape[-1]
    x64 = randn(*shape, dtype=torch.float64, seed=1, noncontig=noncontig) * 3 + 2
    r64 = randn(*shape, dtype=torch.float64, seed=2, noncontig=noncontig)
    w64, b64 = randn(N, dtype=torch.float64, seed=3), randn(N, dtype=torch.float64, seed=4)
    s_dtype = torch.promote_types(x_dtype, r_dtype)
    gs64, gy64 = randn(*shape, dtype=torch.float64, seed=5), randn(*shape, dtype=torch.float64, seed=6)
    gs, gy = gs64.to(s_dtype), gy64.to(out_dtype or s_dtype)
    x, r, w, b = x64.to(x_dtype), r64.to(r_dtype), w64.to(x_dtype), b64.to(x_dtype)
    mine = _run(x, r, w, b, gs, gy, out_dtype, ge2_side=True)
    theirs = _run(x, r, w, b, gs, gy, out_dtype, ge2_side=False)
    ref = _run(x.double(), r.double(), w64, b64, gs.double(), gy.double(), None, ge2_side=False)
    names = ("s", "y", "grad x", "grad residual", "grad weight", "grad bias")
    for name, m, t, f in zip(names, mine, theirs, ref):
        assert m.dtype == t.dtype, f"{name}: dtype {m.dtype}, torch {t.dtype}"
        assert_matches(m, f, t, name=f"add_layer_norm {shape} {name}")


def test_without_residual_is_layer_norm_in_out_dtype():
    x64 = randn(6, 10, dtype=torch.float64, seed=7) + 1
    w64, b64 = randn(10, dtype=torch.float64, seed=8), randn(10, dtype=torch.float64, seed=9)
    gy = randn(6, 10, dtype=torch.float64, seed=10).to(torch.bfloat16)
    zeros = torch.zeros_like(x64, dtype=torch.float32)  # s is x itself: its gradient term is absent
    mine = _run(x64.float(), None, w64.float(), b64.float(), zeros, gy, torch.bfloat16, ge2_side=True)
    theirs = _run(x64.float(), None, w64.float(), b64.float(), zeros, gy, torch.bfloat16, ge2_side=False)
    ref = _run(x64, None, w64, b64, zeros.double(), gy.double(), None, ge2_side=False)
    for name, m, t, f in zip(("s", "y", "grad x", "grad weight", "grad bias"), mine, theirs, ref):
        assert m.dtype == t.dtype, name
        assert_matches(m, f, t, name=f"add_layer_norm without residual {name}")


def test_module_method_and_autocast_dtypes():
    """LayerNorm.add_forward uses the module's parameters; under autocast the norm's output is fp32 unless
    out_dtype asks for the low dtype, and the add keeps the inputs' promoted dtype (torch's rules)."""
    ln = nn.LayerNorm(12)
    x = ge2.from_torch(randn(3, 12, seed=11))
    r = ge2.from_torch(randn(3, 12, seed=12).to(torch.bfloat16))
    s, y = ln.add_forward(x, r)
    expect = torch.nn.functional.layer_norm(x.data + r.data, (12,), ln.weight.data, ln.bias.data)
    assert_matches(y.data, expect.double(), expect, name="LayerNorm.add_forward")
    with ge2.autocast(x.device.type, dtype=torch.bfloat16):
        s, y = ln.add_forward(x, r)
        assert (s.dtype, y.dtype) == (torch.float32, torch.float32)
        _, y_low = ln.add_forward(x, r, torch.bfloat16)
        assert y_low.dtype == torch.bfloat16
    assert torch.equal(y_low.data, y.data.to(torch.bfloat16))  # one rounding of the same fp32 result


def test_bad_input_is_named():
    x = ge2.from_torch(randn(3, 8, seed=13))
    with pytest.raises(ValueError, match=r"add_layer_norm: residual has shape \[1, 8\] but x has \[3, 8\]"):
        F.add_layer_norm(x, ge2.from_torch(randn(1, 8, seed=14)), (8,))
    with pytest.raises(ValueError, match="add_layer_norm: normalized_shape"):
        F.add_layer_norm(x, x, (5,))
    with pytest.raises(TypeError, match="add_layer_norm: out_dtype must be a float dtype"):
        F.add_layer_norm(x, x, (8,), out_dtype=torch.int32)
