"""Pointwise math and the pointwise-only activations (issue 25) against torch: forward, gradients vs
torch autograd (both judged against float64), integer and bool dtypes exactly, broadcasting,
non-contiguous inputs, size-1 dims, in-place variants, modules, and the refused cases' messages."""
import math

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from numerics import DEVICE, assert_matches, randn


def _leaves(tensors, dtype):
    """ge2 leaves, torch leaves and float64 torch leaves of the same values (grad for floats only)."""
    g, t, r = [], [], []
    for x in tensors:
        x = x.to(dtype) if x.is_floating_point() else x
        grad = x.is_floating_point()
        g.append(ge2.from_torch(x, requires_grad=grad))
        t.append(x.detach().clone().requires_grad_(grad))
        r.append(x.detach().double().requires_grad_(grad) if grad else x)
    return g, t, r


def check(fn_ge2, fn_torch, *tensors, dtype=torch.float32, grad=True, seed=0):
    """fn on ge2 vs torch: the same dtype and shape; values within 2x torch's error vs float64 (exact
    for integer and bool results); with ``grad``, every float input's gradient the same way."""
    g, t, r = _leaves(tensors, dtype)
    out, ref, ref64 = fn_ge2(*g), fn_torch(*t), fn_torch(*r)
    assert out.dtype == ref.dtype and tuple(out.shape) == tuple(ref.shape), (out.dtype, ref.dtype, out.shape, ref.shape)
    if not ref.is_floating_point():
        assert torch.equal(out.data.cpu(), ref.cpu()), (out.data, ref)
        return out
    assert_matches(out.data, ref64, ref, name="forward")
    if grad and any(x.requires_grad for x in t):
        gy = randn(*ref.shape, dtype=ref.dtype, seed=seed + 1)
        out.backward(ge2.from_torch(gy))
        ref.backward(gy)
        ref64.backward(gy.double())
        for i, (a, b, c) in enumerate(zip(g, t, r)):
            if b.requires_grad:
                assert a.grad is not None, f"input {i} got no gradient"
                assert_matches(a.grad.data, c.grad, b.grad, name=f"grad of input {i}")
    return out


def positive(*shape, seed=0, **kw):
    return randn(*shape, seed=seed, **kw).abs() + 0.1


# (name, ge2 fn, torch fn, input maker) -- each op on a non-contiguous [3, 1, 7] input.
UNARY = [
    ("sign", ge2.sign, torch.sign, randn),
    ("floor", ge2.floor, torch.floor, lambda *s, **k: 3 * randn(*s, **k)),
    ("ceil", lambda x: x.ceil(), torch.ceil, lambda *s, **k: 3 * randn(*s, **k)),
    ("trunc", ge2.trunc, torch.trunc, lambda *s, **k: 3 * randn(*s, **k)),
    ("round", ge2.round, torch.round, lambda *s, **k: 3 * randn(*s, **k)),
    ("round_decimals", lambda x: x.round(decimals=2), lambda x: torch.round(x, decimals=2), randn),
    ("round_negative_decimals", lambda x: ge2.round(x, decimals=-1), lambda x: torch.round(x, decimals=-1),
     lambda *s, **k: 100 * randn(*s, **k)),
    ("log1p", ge2.log1p, torch.log1p, lambda *s, **k: positive(*s, **k) - 0.95),
    ("expm1", ge2.expm1, torch.expm1, randn),
    ("log2", ge2.log2, torch.log2, positive),
    ("exp2", lambda x: x.exp2(), torch.exp2, randn),
    ("rsqrt", ge2.rsqrt, torch.rsqrt, positive),
    ("reciprocal", ge2.reciprocal, torch.reciprocal, positive),
    ("square", ge2.square, torch.square, randn),
    ("sin", ge2.sin, torch.sin, lambda *s, **k: 4 * randn(*s, **k)),
    ("cos", lambda x: x.cos(), torch.cos, lambda *s, **k: 4 * randn(*s, **k)),
    ("erf", ge2.erf, torch.erf, randn),
]


@pytest.mark.parametrize("name,fn,ref,make", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, ref, make):
    x = make(3, 1, 7, noncontig=True, seed=1)
    check(fn, ref, x)
    check(fn, ref, x, dtype=torch.bfloat16, grad=False)


def test_unary_special_values_and_ties():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, -0.3, 0.0, 1e-8, -1e-8, math.inf, -math.inf, math.nan], device=DEVICE)
    for fn, ref in ((ge2.round, torch.round), (ge2.floor, torch.floor), (ge2.ceil, torch.ceil),
                    (ge2.trunc, torch.trunc), (ge2.sign, torch.sign), (ge2.log1p, torch.log1p),
                    (ge2.expm1, torch.expm1), (ge2.exp2, torch.exp2), (ge2.erf, torch.erf), (ge2.square, torch.square)):
        out, want = fn(ge2.from_torch(x)).data, ref(x)
        assert torch.allclose(out, want, rtol=1e-6, atol=0, equal_nan=True), (fn.__name__, out, want)
    for fn, ref in ((ge2.isnan, torch.isnan), (ge2.isinf, torch.isinf), (ge2.isfinite, torch.isfinite),
                    (ge2.logical_not, torch.logical_not)):
        assert torch.equal(fn(ge2.from_torch(x)).data, ref(x))


def test_nan_to_num_forward_and_gradient():
    x = randn(4, 5, seed=2)
    x[0, 1], x[1, 2], x[3, 4] = math.nan, math.inf, -math.inf
    for dtype in (torch.float32, torch.float16):  # exact: the finite values pass, the others are replaced
        xd = x.to(dtype)
        assert torch.equal(ge2.nan_to_num(ge2.from_torch(xd)).data, torch.nan_to_num(xd))
        assert torch.equal(ge2.from_torch(xd).nan_to_num(1.5, 9.0, -7.0).data, xd.nan_to_num(1.5, 9.0, -7.0))
    g = ge2.from_torch(x, requires_grad=True)
    t = x.clone().requires_grad_()
    gy = randn(4, 5, seed=3)
    ge2.nan_to_num(g).backward(ge2.from_torch(gy))
    torch.nan_to_num(t).backward(gy)
    assert torch.equal(g.grad.data, t.grad)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool])
def test_unary_integers_and_bool(dtype):
    x = torch.randint(-9, 10, (3, 5), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x = x.to(dtype) if dtype != torch.uint8 else x.abs().to(dtype)
    ops = [(ge2.sign, torch.sign), (ge2.square, torch.square), (ge2.isnan, torch.isnan), (ge2.isinf, torch.isinf),
           (ge2.isfinite, torch.isfinite), (ge2.logical_not, torch.logical_not), (ge2.bitwise_not, torch.bitwise_not),
           (lambda t: ~t, lambda t: ~t), (ge2.nan_to_num, torch.nan_to_num), (ge2.sin, torch.sin),
           (ge2.reciprocal, torch.reciprocal), (ge2.log1p, torch.log1p)]
    if dtype != torch.bool:
        ops += [(ge2.floor, torch.floor), (ge2.trunc, torch.trunc), (ge2.ceil, torch.ceil)]
    for fn, ref in ops:
        out, want = fn(ge2.from_torch(x)), ref(x)
        assert out.dtype == want.dtype, (fn, out.dtype, want.dtype)
        assert torch.allclose(out.data.double(), want.double(), rtol=1e-6, equal_nan=True), (fn, out.data, want)


# Binary ops over broadcast operands: a non-contiguous [3, 1, 7] against [4, 1].
BINARY = [
    ("maximum", ge2.maximum, torch.maximum),
    ("minimum", lambda a, b: a.minimum(b), torch.minimum),
    ("max_overload", lambda a, b: ge2.max(a, b), torch.max),
    ("method_max_overload", lambda a, b: a.max(b), lambda a, b: a.max(b)),
    ("fmod", ge2.fmod, torch.fmod),
    ("remainder", ge2.remainder, torch.remainder),
    ("mod_operator", lambda a, b: a % b, lambda a, b: a % b),
    ("atan2", ge2.atan2, torch.atan2),
    ("add_alpha", lambda a, b: ge2.add(a, b, alpha=0.25), lambda a, b: torch.add(a, b, alpha=0.25)),
    ("sub_alpha", lambda a, b: a.sub(b, alpha=-3), lambda a, b: torch.sub(a, b, alpha=-3)),
    ("div_trunc", lambda a, b: ge2.div(a, b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("div_floor", lambda a, b: a // b, lambda a, b: a // b),
]


@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, fn, ref):
    a = 3 * randn(3, 1, 7, noncontig=True, seed=4)
    b = randn(4, 1, seed=5) + 0.3
    check(fn, ref, a, b, grad=name != "div_floor")  # torch has no derivative for floor_divide
    check(fn, ref, a, b, dtype=torch.bfloat16, grad=False)


def test_binary_scalars_on_either_side():
    a = 3 * randn(2, 6, seed=6)
    check(lambda x: x % 1.5, lambda x: x % 1.5, a)
    check(lambda x: 2.5 % x, lambda x: 2.5 % x, a, grad=False)  # torch has no derivative here
    check(lambda x: ge2.maximum(x, ge2.tensor(0.25)), lambda x: torch.maximum(x, torch.tensor(0.25)), a)
    check(lambda x: ge2.atan2(x, -1.0), lambda x: torch.atan2(x, torch.tensor(-1.0)), a)
    check(lambda x: ge2.fmod(x, -0.75), lambda x: torch.fmod(x, -0.75), a)


def test_maximum_minimum_ties_and_nan_gradients():
    a = torch.tensor([1.0, 2.0, math.nan, 3.0, -1.0], device=DEVICE)
    b = torch.tensor([1.0, 5.0, 0.0, math.nan, -2.0], device=DEVICE)
    for fn, ref in ((ge2.maximum, torch.maximum), (ge2.minimum, torch.minimum)):
        ga, gb = ge2.from_torch(a, requires_grad=True), ge2.from_torch(b, requires_grad=True)
        ta, tb = a.clone().requires_grad_(), b.clone().requires_grad_()
        out, want = fn(ga, gb), ref(ta, tb)
        assert torch.equal(out.data.isnan(), want.isnan()) and torch.equal(out.data.nan_to_num(), want.nan_to_num())
        out.sum().backward()
        want.sum().backward()
        assert torch.equal(ga.grad.data, ta.grad) and torch.equal(gb.grad.data, tb.grad), (ga.grad, ta.grad)


def test_atan2_quadrants_and_signed_zeros():
    y = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.inf, 3.0, math.nan], device=DEVICE)
    x = torch.tensor([0.0, 0.0, -0.0, -0.0, -math.inf, math.inf, math.inf, -math.inf, 2.0, -1e-30, 1.0], device=DEVICE)
    for dtype in (torch.float32, torch.float64):
        out, want = ge2.atan2(ge2.from_torch(y.to(dtype)), ge2.from_torch(x.to(dtype))).data, torch.atan2(y.to(dtype), x.to(dtype))
        assert torch.allclose(out, want, rtol=1e-15 if dtype == torch.float64 else 1e-6, equal_nan=True), (out, want)
        assert torch.equal(out.signbit()[:8], want.signbit()[:8])


def test_float64_transcendentals_are_float64_accurate():
    x = randn(64, dtype=torch.float64, seed=7)
    for fn, ref, arg in ((ge2.log1p, torch.log1p, x.abs()), (ge2.expm1, torch.expm1, x), (ge2.erf, torch.erf, x),
                         (ge2.sin, torch.sin, 3 * x), (ge2.log2, torch.log2, x.abs()), (ge2.exp2, torch.exp2, x)):
        assert_matches(fn(ge2.from_torch(arg)).data, ref(arg), ref(arg), name=fn.__name__)
    out = ge2.atan2(ge2.from_torch(x), ge2.from_torch(x.flip(0)))
    assert_matches(out.data, torch.atan2(x, x.flip(0)), name="atan2")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool])
def test_binary_integers_and_bool(dtype):
    gen = torch.Generator().manual_seed(8)
    a = torch.randint(-50, 50, (3, 5), generator=gen).to(DEVICE)
    b = torch.randint(1, 9, (5,), generator=gen).to(DEVICE) * torch.tensor([1, -1, 1, -1, 1], device=DEVICE)
    a, b = a.to(dtype), b.to(dtype)
    ops = [(ge2.maximum, torch.maximum), (ge2.minimum, torch.minimum), (ge2.logical_and, torch.logical_and),
           (ge2.logical_or, torch.logical_or), (ge2.logical_xor, torch.logical_xor),
           (lambda x, y: x & y, lambda x, y: x & y), (lambda x, y: x | y, lambda x, y: x | y),
           (lambda x, y: x ^ y, lambda x, y: x ^ y), (lambda x, y: x & True, lambda x, y: x & True)]
    if dtype != torch.bool:
        ops += [(ge2.fmod, torch.fmod), (ge2.remainder, torch.remainder), (lambda x, y: x % y, lambda x, y: x % y),
                (lambda x, y: -7 % y, lambda x, y: -7 % y), (lambda x, y: x // y, lambda x, y: x // y),
                (lambda x, y: x.div(y, rounding_mode="trunc"), lambda x, y: x.div(y, rounding_mode="trunc")),
                (lambda x, y: ge2.add(x, y, alpha=3), lambda x, y: torch.add(x, y, alpha=3)),
                (ge2.atan2, torch.atan2), (lambda x, y: x ^ 5, lambda x, y: x ^ 5)]
    for fn, ref in ops:
        out, want = fn(ge2.from_torch(a), ge2.from_torch(b)), ref(a, b)
        assert out.dtype == want.dtype, (out.dtype, want.dtype)
        assert torch.allclose(out.data.double(), want.double(), rtol=1e-6), (out.data, want)


def test_clamp_tensor_bounds_broadcast_with_gradients():
    x = 2 * randn(3, 4, 7, noncontig=True, seed=9)
    lo, hi = randn(4, 1, seed=10) - 0.5, randn(7, seed=11) + 0.5
    check(lambda a, b, c: ge2.clamp(a, b, c), lambda a, b, c: torch.clamp(a, b, c), x, lo, hi)
    check(lambda a, b: a.clamp(min=b), lambda a, b: a.clamp(min=b), x, lo)
    check(lambda a, c: ge2.clip(a, max=c), lambda a, c: torch.clip(a, max=c), x, hi)
    check(lambda a: a.clamp(-0.3, 0.7), lambda a: a.clamp(-0.3, 0.7), x)
    check(lambda a: a.clamp(max=0.1), lambda a: a.clamp(max=0.1), x, dtype=torch.bfloat16)
    xn = torch.tensor([math.nan, 0.5, 2.0], device=DEVICE)
    check(lambda a: a.clamp(0.0, 1.0), lambda a: a.clamp(0.0, 1.0), xn)
    xi = torch.arange(-4, 5, device=DEVICE, dtype=torch.int32)
    check(lambda a: a.clamp(-2, 3), lambda a: a.clamp(-2, 3), xi)
    check(lambda a: a.clamp(min=0.5), lambda a: a.clamp(min=0.5), xi)  # promotes to float32


def test_lerp_addcmul_addcdiv():
    a, b = randn(3, 1, 5, noncontig=True, seed=12), randn(4, 5, seed=13)
    w = torch.rand(1, 5, generator=torch.Generator().manual_seed(14)).to(DEVICE) * 1.4 - 0.2
    check(ge2.lerp, torch.lerp, a, b, w)
    check(lambda s, e: s.lerp(e, 0.7), lambda s, e: s.lerp(e, 0.7), a, b)
    c = positive(4, 1, seed=15)
    check(lambda x, t1, t2: ge2.addcmul(x, t1, t2, value=-0.5), lambda x, t1, t2: torch.addcmul(x, t1, t2, value=-0.5), a, b, c)
    check(lambda x, t1, t2: x.addcdiv(t1, t2, value=2), lambda x, t1, t2: x.addcdiv(t1, t2, value=2), a, b, c)
    check(lambda x, t1, t2: ge2.addcmul(x, t1, t2), torch.addcmul, a, b, c, dtype=torch.bfloat16, grad=False)
    i = torch.arange(6, device=DEVICE).reshape(2, 3)
    check(lambda x, t1, t2: ge2.addcmul(x, t1, t2, value=2), lambda x, t1, t2: torch.addcmul(x, t1, t2, value=2), i, i, i)


# The activations: functional (ge2.nn.functional), module, torch's counterparts.
ACTIVATIONS = [
    ("silu", F.silu, TF.silu, ge2.nn.SiLU(), 1.0),
    ("mish", F.mish, TF.mish, ge2.nn.Mish(), 3.0),
    ("softplus", lambda x: F.softplus(x, beta=2.0, threshold=3.0), lambda x: TF.softplus(x, beta=2.0, threshold=3.0),
     ge2.nn.Softplus(2.0, 3.0), 3.0),
    ("elu", lambda x: F.elu(x, alpha=0.7), lambda x: TF.elu(x, alpha=0.7), ge2.nn.ELU(0.7), 2.0),
    ("selu", F.selu, TF.selu, ge2.nn.SELU(), 2.0),
    ("hardswish", F.hardswish, TF.hardswish, ge2.nn.Hardswish(), 4.0),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.8), lambda x: TF.hardtanh(x, -0.5, 0.8), ge2.nn.Hardtanh(-0.5, 0.8), 1.0),
    ("relu6", F.relu6, TF.relu6, ge2.nn.ReLU6(), 5.0),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid, ge2.nn.LogSigmoid(), 8.0),
    ("glu", lambda x: F.glu(x, 1), lambda x: TF.glu(x, 1), ge2.nn.GLU(1), 2.0),
]


@pytest.mark.parametrize("name,fn,ref,module,scale", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation(name, fn, ref, module, scale):
    x = scale * randn(3, 6, 5, noncontig=True, seed=16)
    check(fn, ref, x)
    check(fn, ref, x, dtype=torch.bfloat16, grad=False)
    check(module, ref, x[:1])  # size-1 dim, through the module


def test_activation_inplace_variants():
    x = 2 * randn(4, 7, seed=17)
    for fn, ref in ((lambda t: F.elu(t, 0.5, inplace=True), lambda t: TF.elu(t, 0.5)),
                    (lambda t: F.hardtanh(t, -1.0, 0.5, inplace=True), lambda t: TF.hardtanh(t, -1.0, 0.5)),
                    (lambda t: ge2.nn.Hardswish(inplace=True)(t), TF.hardswish)):
        leaf = ge2.from_torch(x.clone(), requires_grad=True)
        h = leaf * 1.0
        out = fn(h)
        assert out is h
        t = x.clone().requires_grad_()
        want = ref(t)
        assert_matches(out.data, ref(x.double()), want)
        out.sum().backward()
        want.sum().backward()
        assert_matches(leaf.grad.data, t.grad, t.grad)


def test_relu_passes_gradient_at_nan_like_torch():
    x = torch.tensor([math.nan, -1.0, 0.0, 2.0], device=DEVICE)
    g, t = ge2.from_torch(x, requires_grad=True), x.clone().requires_grad_()
    out = ge2.relu(g)
    assert out.data.isnan()[0]
    out.sum().backward()
    torch.relu(t).sum().backward()
    assert torch.equal(g.grad.data, t.grad), (g.grad, t.grad)


def test_inplace_methods():
    x = 3 * randn(3, 5, seed=18)
    lo = randn(5, seed=19) - 1
    for name, args, kwargs in (("clamp_", (lo,), {}), ("clamp_", (), {"max": 0.5}), ("clip_", (-1, 1), {}),
                               ("floor_", (), {}), ("round_", (), {"decimals": 1}), ("fmod_", (1.5,), {}),
                               ("remainder_", (-1.25,), {}), ("lerp_", (lo, 0.3), {}), ("sin_", (), {}),
                               ("addcmul_", (lo, lo), {"value": 0.5}), ("add_", (lo,), {"alpha": 2}),
                               ("nan_to_num_", (), {}), ("log1p_", (), {})):
        if name == "log1p_":
            x = x.abs()
        g = ge2.from_torch(x.clone())
        gargs = [ge2.from_torch(a) if isinstance(a, torch.Tensor) else a for a in args]
        t = x.clone()
        assert getattr(g, name)(*gargs, **kwargs) is g
        getattr(t, name)(*args, **kwargs)
        assert torch.allclose(g.data, t, rtol=1e-6, atol=1e-7), name
    n = ge2.from_torch(torch.arange(6, device=DEVICE))
    n %= 4
    n &= 2
    n |= 1
    assert n.data.tolist() == [1, 1, 3, 3, 1, 1]


@pytest.mark.parametrize("call,match", [
    (lambda: ge2.bitwise_and(ge2.tensor([1.5]), ge2.tensor([2.0])), "bitwise_and: a has dtype float32"),
    (lambda: ge2.tensor([1, 2]) & 1.5, "bitwise_and: is defined for integer and bool operands"),
    (lambda: ge2.clamp(ge2.tensor([1.0])), "clamp: at least one of min and max"),
    (lambda: ge2.clamp(ge2.ones(3), ge2.ones(4)), r"clamp: cannot broadcast x \[3\] and min \[4\]"),
    (lambda: ge2.lerp(ge2.ones(2), ge2.ones(2, dtype=ge2.float64), 0.5), "lerp: expected end of dtype float32, got float64"),
    (lambda: ge2.addcdiv(ge2.ones(2), ge2.tensor([1, 2]), ge2.tensor([3, 4])), "addcdiv: integer division"),
    (lambda: ge2.add(ge2.tensor([1, 2]), ge2.tensor([1, 2]), alpha=0.5), "add: for integer tensors, alpha must not be a float"),
    (lambda: ge2.div(ge2.ones(2), 2.0, rounding_mode="round"), "div: rounding_mode must be None, 'trunc' or 'floor'"),
    (lambda: ge2.round(ge2.tensor([1, 2]), decimals=1), "round: decimals is only supported for floating-point"),
    (lambda: F.glu(ge2.ones(2, 5), 1), "glu: the halved dim 1 must have an even size, got 5"),
    (lambda: F.hardtanh(ge2.ones(2), 1.0, 0.0), r"hardtanh: min_val \(1.0\) cannot be greater than max_val"),
    (lambda: ge2.tensor([1, 2]).div_(2), "div_: result type float32 can't be cast to the desired output type int64"),
    (lambda: ge2.floor(ge2.tensor([True])), "floor: x has dtype bool"),
])
def test_refused(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()
