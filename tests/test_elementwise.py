"""Elementwise ops at the backend level: the triton backend vs the torch oracle and float64.

Every op over broadcasting (size-1 dims, 0-d tensors, scalars on either side), non-contiguous
inputs (transposed, stepped slices, expanded), odd sizes, mixed dtypes, NaN/inf, and the schema
errors. Ops that are correctly rounded (add/sub/mul/div in one rounding, comparisons, where) must
match torch bit for bit; the others must be within 2x torch's own error against float64.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ge2
from ge2.backend import call
from ge2.kernels import elementwise
from numerics import DEVICE, LARGE, assert_matches, randn

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def oracle(op, *args, **attrs):
    with ge2.use_backend("torch"):
        return call(op, *args, **attrs)


def oracle64(op, *args, **attrs):
    """The torch oracle on float64 copies of the floating-point tensor inputs."""
    up = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in args]
    return oracle(op, *up, **attrs)


def check(op, *args, exact=False, **attrs):
    """Run op on both backends; exact: bitwise equal (NaN == NaN), else ≤ 2x torch's error vs fp64."""
    out, ref = call(op, *args, **attrs), oracle(op, *args, **attrs)
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, ref.dtype, out.shape, ref.shape)
    assert same_layout(out, ref), (out.stride(), ref.stride())
    if exact or not out.is_floating_point():
        same = (out == ref) | (out.isnan() & ref.isnan()) if out.is_floating_point() else out == ref
        assert same.all(), f"{op}: differs from torch at {same.logical_not().nonzero()[:5].tolist()}"
    else:
        assert_matches(out, oracle64(op, *args, **attrs), ref, name=op)
    return out


def same_layout(out, ref):
    """Whether out is laid out like torch's result: the same strides wherever a dim has more than one element."""
    return all(o == r for o, r, n in zip(out.stride(), ref.stride(), ref.shape) if n > 1)


def operand(shape, dtype, kind="contig", seed=0, positive=False):
    """A random tensor of ``shape``: contiguous, transposed, stepped slice or expanded (stride 0)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "transposed" and len(shape) >= 2:
        base = torch.randn((*shape[:-2], shape[-1], shape[-2]), generator=g, dtype=torch.float64).transpose(-1, -2)
    elif kind == "stepped" and shape:
        base = torch.randn((*shape[:-1], 3 * shape[-1]), generator=g, dtype=torch.float64)[..., ::3]
    elif kind == "expanded" and shape:
        base = torch.randn((*shape[:-1], 1), generator=g, dtype=torch.float64).expand(shape)
    else:
        base = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    if positive:
        base = base.abs() + 0.5
    return base.to(device=DEVICE, dtype=dtype)


# Broadcast pairs: equal shapes, size-1 dims on both sides, rank mismatch, 0-d, odd sizes.
SHAPES = [
    ((7,), (7,)),
    ((5, 1, 33), (4, 1)),
    ((1,), (3, 40)),
    ((), (7, 3)),
    ((33, 7), ()),
    ((2, 3, 1, 5), (3, 4, 1)),
]
KINDS = ["contig", "transposed", "stepped", "expanded"]


# ---------------------------------------------------------------------------------------------
# binary arithmetic
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary_broadcast(op, dtype, shapes):
    a = operand(shapes[0], dtype, seed=1, positive=op == "pow")
    b = operand(shapes[1], dtype, seed=2)
    # One rounding of an exact result: identical to torch for fp32/fp64 (bf16/fp16 too: torch rounds once).
    check(op, a, b, exact=op != "pow")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("kind_a", KINDS)
@pytest.mark.parametrize("kind_b", ["contig", "transposed", "expanded"])
def test_binary_noncontiguous_exact(op, kind_a, kind_b):
    a = operand((6, 33), torch.float32, kind_a, seed=3)
    b = operand((6, 33), torch.float32, kind_b, seed=4)
    check(op, a, b, exact=True)
    check(op, a[:, None, :5], b[None, :4, 3:8], exact=True)  # views that broadcast against each other


def test_channels_last_results_stay_channels_last():
    # Like torch: the result takes the first full-size operand's memory order, and the launch runs
    # over one flat dim (a strided NCHW walk of channels-last operands was 2.4x slower on the GPU).
    x = operand((3, 5, 4, 6), torch.float32, seed=7).contiguous(memory_format=torch.channels_last)
    y = operand((3, 5, 4, 6), torch.float32, seed=8).contiguous(memory_format=torch.channels_last)
    for out in (check("add", x, y, exact=True), check("mul", x, operand((5, 1, 1), torch.float32, seed=9), exact=True),
                check("exp", x), check("activation", x, act="gelu"), check("where", x > 0, x, 0.5, exact=True)):
        assert out.is_contiguous(memory_format=torch.channels_last)
    assert elementwise._Launch(x.shape, [x, y], torch.float32).rank == 1
    check("add", operand((3, 5, 4, 6), torch.float32, seed=10), x, exact=True)  # a contiguous first operand wins
    gx, gy = call("binary_backward", y, x, y, op_name="mul")
    assert gx.is_contiguous(memory_format=torch.channels_last) and gy.is_contiguous(memory_format=torch.channels_last)
    assert_matches(gx, oracle64("binary_backward", y, x, y, op_name="mul")[0],
                   oracle("binary_backward", y, x, y, op_name="mul")[0])


def test_binary_rank_beyond_max_is_copied():
    # 7 dims that merge in neither operand: the launcher copies instead of indexing 7-D.
    a = operand((2, 3, 2, 3, 2, 3, 2), torch.float32, seed=5).permute(6, 5, 4, 3, 2, 1, 0)
    b = operand((2, 3, 2, 3, 2, 3, 2), torch.float32, seed=6)
    check("mul", a, b, exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("scalar", [0.1, -3, 1e-3])
def test_scalar_stays_in_opmath(op, dtype, scalar):
    """A Python scalar is applied in fp32 and the result rounded once, as torch's CUDA kernels do:
    bf16(float(x) op float(s)) on either side, never x op bf16(s). Division is correctly rounded
    (torch's CUDA kernel multiplies by the scalar's reciprocal instead: up to 1.5 ulp off), so the
    reference divides by a device tensor of the scalar."""
    x = operand((5, 33), dtype, seed=7)
    f = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op]
    s32 = torch.full((), scalar, dtype=torch.float32, device=DEVICE)
    assert torch.equal(call(op, x, scalar), f(x.float(), s32).to(dtype))
    assert torch.equal(call(op, scalar, x), f(s32, x.float()).to(dtype))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_scalar_fp64_is_exact(op):
    """An fp64 scalar reaches the kernel with all its bits: x op 0.1 is one correctly rounded op."""
    x = operand((7, 5), torch.float64, seed=8, positive=True)
    if op == "pow":
        check(op, x, 0.1)
        check(op, 1.7, x)
        return
    f = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op]
    assert torch.equal(call(op, x, 0.1), f(x, torch.full_like(x, 0.1)))
    assert torch.equal(call(op, 1.7, x), f(torch.full_like(x, 1.7), x))


@pytest.mark.parametrize("a_dtype,b,expected", [
    (torch.float16, torch.bfloat16, torch.float32),
    (torch.int32, torch.float16, torch.float16),
    (torch.int8, torch.int16, torch.int16),
    (torch.int64, 2.5, torch.float32),
    (torch.bfloat16, 0.5, torch.bfloat16),
    (torch.uint8, 7, torch.uint8),
    (torch.float32, "0d-float64", torch.float32),  # a 0-d tensor does not promote a dimensioned one
])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_mixed_dtypes(op, a_dtype, b, expected):
    a = (operand((4, 9), torch.float64, seed=9) * 20).to(a_dtype)
    if isinstance(b, torch.dtype):
        b = (operand((9,), torch.float64, seed=10) * 20).to(b)
    elif b == "0d-float64":
        b = torch.tensor(1.3, dtype=torch.float64, device=DEVICE)
    # (torch divides by a Python scalar through its reciprocal, we divide: compare to float64 there)
    out = check(op, a, b, exact=op != "div" or isinstance(b, torch.Tensor))
    assert out.dtype == (torch.float32 if op == "div" and not expected.is_floating_point else expected)


def test_integer_arithmetic_wraps_like_torch():
    a = torch.tensor([200, 100, 255, 3], dtype=torch.uint8, device=DEVICE)
    b = torch.tensor([100, 200, 2, 5], dtype=torch.uint8, device=DEVICE)
    for op in ("add", "sub", "mul"):
        check(op, a, b)
    i = torch.tensor([2**62, -(2**62), 7, -7], dtype=torch.int64, device=DEVICE)
    check("mul", i, 3)
    check("add", i, i)
    check("div", i, -2)  # true division of ints: float32


def test_pow_special_values():
    a = torch.tensor([-2.0, -0.0, 0.0, -1.0, float("nan"), 1.0, -8.0, 0.0, float("-inf"), float("-inf"), -1.0, 2.0],
                     device=DEVICE)
    b = torch.tensor([3.0, -1.0, -1.0, float("inf"), 0.0, float("nan"), 1 / 3, 0.0, 0.5, 3.0, -2.0, -1075.0],
                     device=DEVICE)
    check("pow", a, b, exact=True)
    for dtype in (torch.float32, torch.float64):
        x = operand((7, 9), dtype, seed=11)  # negative bases: integer exponents keep the sign
        check("pow", x, 3)
        check("pow", x, 2.0)
        check("pow", x, -1)
        check("pow", 2.0, x)
        out = check("pow", x, 0.5)
        assert out.isnan().equal(x < 0)  # NaN for negative x, like torch


def test_nan_and_inf_propagate():
    a = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, 0.0], device=DEVICE)
    b = torch.tensor([1.0, float("inf"), float("inf"), float("nan"), 0.0], device=DEVICE)
    for op in ("add", "sub", "mul", "div"):
        check(op, a, b, exact=True)


# ---------------------------------------------------------------------------------------------
# comparisons and where
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_compare(op, dtype):
    # Few distinct values so that equality happens; NaN for floats.
    a = (operand((5, 1, 7), torch.float64, seed=12) * 2).round().to(dtype)
    b = (operand((4, 7), torch.float64, "transposed", seed=13) * 2).round().to(dtype)
    if dtype.is_floating_point:
        a[0, 0, :2] = float("nan")
    check(op, a, b)
    check(op, a, True if dtype == torch.bool else 1)
    check(op, 0 if dtype == torch.bool else -1.5, b)  # scalar on the left


def test_compare_mixed_dtypes_in_promoted_dtype():
    ints = torch.arange(-3, 4, device=DEVICE, dtype=torch.int32)
    check("lt", ints, 2.5)  # int tensor vs float scalar: compared as float
    check("ge", 0.5, ints)
    big = torch.tensor([2**24 + 1], dtype=torch.int64, device=DEVICE)
    check("eq", big, torch.tensor([2**24 + 1], dtype=torch.int64, device=DEVICE))
    check("eq", torch.tensor([1.0, 2.0], device=DEVICE, dtype=torch.float16), torch.tensor([1, 2], device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_where(dtype):
    cond = operand((5, 1, 33), torch.float32, seed=14) > 0
    a = (operand((4, 33), torch.float64, "stepped", seed=15) * 5).to(dtype)
    b = (operand((33,), torch.float64, seed=16) * 5).to(dtype)
    check("where", cond, a, b)
    check("where", cond, a, True if dtype == torch.bool else 2)
    check("where", cond, 0.25 if dtype.is_floating_point else 0, b)
    check("where", cond.t() if cond.dim() == 2 else cond[:, 0], 1.5, -2.0)  # both scalars


def test_where_promotes_and_keeps_scalar_rounding():
    cond = operand((3, 7), torch.float32, seed=17) > 0
    x = operand((3, 7), torch.bfloat16, seed=18)
    out = check("where", cond, x, 0.1)
    assert out.dtype == torch.bfloat16
    check("where", cond, x, operand((3, 7), torch.float32, seed=19))  # -> float32


# ---------------------------------------------------------------------------------------------
# unary, activations and their gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["neg", "exp", "log", "sqrt", "abs"])
@pytest.mark.parametrize("kind", ["contig", "transposed", "expanded"])
def test_unary(op, dtype, kind):
    x = operand((7, 33), dtype, kind, seed=20, positive=op in ("log", "sqrt"))
    check(op, x, exact=op in ("neg", "abs"))  # (torch's CPU sqrt is not correctly rounded; ours is)


@pytest.mark.parametrize("op", ["neg", "abs"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_unary_integers(op, dtype):
    x = (operand((5, 9), torch.float64, seed=21) * 50).to(dtype)
    check(op, x)


def test_unary_special_values():
    x = torch.tensor([-1.0, 0.0, -0.0, float("inf"), -float("inf"), float("nan"), 100.0, -100.0], device=DEVICE)
    for op in ("exp", "log", "sqrt", "abs", "neg"):
        check(op, x, exact=op not in ("exp", "log"))
        assert torch.isnan(call(op, x)).eq(torch.isnan(oracle(op, x))).all()
    assert call("exp", x)[6].item() == float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", ["neg", "exp", "log", "sqrt", "abs"])
def test_unary_backward(op, dtype):
    x = operand((6, 17), dtype, "transposed", seed=22, positive=op in ("log", "sqrt"))
    gy = operand((6, 17), dtype, seed=23)
    y = call(op, x)
    check("unary_backward", gy, x, y, op_name=op)


ACTS = ["none", "relu", "leaky_relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("act", ACTS)
def test_activation_and_backward(act, dtype):
    x = operand((5, 37), dtype, "stepped", seed=24) * 3
    gy = operand((5, 37), dtype, seed=25)
    y = check("activation", x, act=act, alpha=0.2)
    check("activation_backward", gy, x, None, act=act, alpha=0.2)
    if act in ("none", "relu", "leaky_relu", "sigmoid", "tanh"):
        check("activation_backward", gy, None, y, act=act, alpha=0.2)


def test_gelu_fp32_over_its_whole_range():
    """The fp32 gelu's normal CDF (one exp2, no erf) is as accurate as torch's erf form everywhere,
    the tails and the special values included (torch: gelu(-inf) = nan, gelu(-1e30) = -0). H100:
    max error 3.8e-7 vs torch's 9.3e-7 forward, 1.3e-7 vs 1.9e-7 backward."""
    z = torch.cat([torch.linspace(-12, 12, 4099, dtype=torch.float64),
                   torch.tensor([0.0, 1e-30, -1e-30, 1e30, -1e30, 5.0, -5.0, 6.5, -6.5, 37.0, -37.0],
                                dtype=torch.float64)])
    x = z.to(torch.float32).to(DEVICE)
    x64 = x.double().cpu()  # the references of the fp32 inputs themselves
    ref64 = torch.nn.functional.gelu(x64)
    grad64 = torch.func.grad(lambda v: torch.nn.functional.gelu(v).sum())(x64)
    xt = x.cpu().requires_grad_()
    torch.nn.functional.gelu(xt).sum().backward()
    for got, torch_out, ref in ((call("activation", x, act="gelu"), torch.nn.functional.gelu(x.cpu()), ref64),
                                (call("activation_backward", torch.ones_like(x), x, None, act="gelu"), xt.grad, grad64)):
        err = (got.double().cpu() - ref).abs().max().item()
        torch_err = (torch_out.double() - ref).abs().max().item()
        assert err <= 2 * torch_err, f"max abs error {err:.3e} vs torch's {torch_err:.3e}"
        assert_matches(got, ref.to(DEVICE), torch_out.to(DEVICE))
    # torch's own kernel on the same device (its CPU kernel gives gelu(inf) = nan in torch 2.11, inf in 2.13)
    special = torch.tensor([float("inf"), -float("inf"), float("nan")], device=DEVICE)
    torch.testing.assert_close(call("activation", special, act="gelu"), torch.nn.functional.gelu(special), equal_nan=True)


# ---------------------------------------------------------------------------------------------
# binary_backward: both gradients in one pass, reduced to the operand shapes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
@pytest.mark.parametrize("shapes", [((7, 33), (7, 33)), ((5, 1, 33), (4, 1)), ((), (6, 7)), ((3, 1), (1, 1, 9))])
def test_binary_backward(op, dtype, shapes):
    a = operand(shapes[0], dtype, seed=26, positive=op == "pow")
    b = operand(shapes[1], dtype, "transposed" if len(shapes[1]) == 2 else "contig", seed=27)
    out_shape = torch.broadcast_shapes(a.shape, b.shape)
    gy = operand(out_shape, dtype, seed=28)
    got = call("binary_backward", gy, a, b, op_name=op)
    ref = oracle("binary_backward", gy, a, b, op_name=op)
    ref64 = oracle64("binary_backward", gy, a, b, op_name=op)
    for g, r, r64, t in zip(got, ref, ref64, (a, b)):
        assert g.shape == t.shape and g.dtype == t.dtype
        assert_matches(g, r64, r, name=f"{op} grad")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary_backward_scalars_and_needs(op):
    x = operand((4, 9), torch.float32, seed=29, positive=True)
    gy = operand((4, 9), torch.float32, seed=30)
    ga, gb = call("binary_backward", gy, x, 1.5, op_name=op)
    assert gb is None
    assert_matches(ga, oracle64("binary_backward", gy, x, 1.5, op_name=op)[0],
                   oracle("binary_backward", gy, x, 1.5, op_name=op)[0])
    ga, gb = call("binary_backward", gy, 0.7, x, op_name=op)
    assert ga is None
    assert_matches(gb, oracle64("binary_backward", gy, 0.7, x, op_name=op)[1],
                   oracle("binary_backward", gy, 0.7, x, op_name=op)[1])
    y = operand((9,), torch.float32, seed=31, positive=True)
    ga, gb = call("binary_backward", gy, x, y, op_name=op, need_a=False)
    assert ga is None and gb.shape == (9,)


# ---------------------------------------------------------------------------------------------
# random layouts (hypothesis): exact agreement of add/mul with torch
# ---------------------------------------------------------------------------------------------
@st.composite
def _layouts(draw):
    rank = draw(st.integers(0, 4))
    shape = [draw(st.sampled_from([1, 2, 3, 5, 8])) for _ in range(rank)]
    views = []
    for seed in (40, 41):
        sub = [s if draw(st.booleans()) else 1 for s in shape][draw(st.integers(0, rank)):]
        x = operand(tuple(sub), torch.float32, seed=seed + draw(st.integers(0, 99)))
        if x.dim() >= 2 and draw(st.booleans()):
            x = x.transpose(0, -1).contiguous().transpose(0, -1)  # same values, transposed strides
        if x.dim() >= 1 and draw(st.booleans()):
            x = x.repeat_interleave(2, dim=-1)[..., ::2]  # stepped view of the same values
        views.append(x)
    return views


@settings(max_examples=40, deadline=None)
@given(_layouts(), st.sampled_from(["add", "mul"]))
def test_random_layouts(views, op):
    check(op, *views, exact=True)


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large(dtype):
    a = operand((2049, 1031), dtype, seed=50)
    b = operand((1031,), dtype, seed=51)
    check("add", a, b, exact=True)
    check("mul", a.t(), 0.1, exact=True)
    check("exp", a)
    gy = operand((2049, 1031), dtype, seed=52)
    for g, r64, r in zip(call("binary_backward", gy, a, b, op_name="mul"),
                         oracle64("binary_backward", gy, a, b, op_name="mul"),
                         oracle("binary_backward", gy, a, b, op_name="mul")):
        assert_matches(g, r64, r)


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
def test_int64_indexing_past_2_to_the_31():
    # 2**31 + 7 bytes: linear indices and offsets no longer fit in int32.
    x = torch.randint(0, 100, (2**31 + 7,), dtype=torch.uint8, device=DEVICE)
    check("add", x, 3)
    check("mul", x[:-1:2], x[1::2])  # stepped views: offsets past 2**31, indices not
    assert call("sum", x).item() == oracle("sum", x).item()


# ---------------------------------------------------------------------------------------------
# schema errors
# ---------------------------------------------------------------------------------------------
def test_errors():
    x = randn(3, 4)
    with pytest.raises(ValueError, match=r"add: cannot broadcast a \[3, 4\] and b \[5\]"):
        call("add", x, randn(5))
    with pytest.raises(TypeError, match=r"pow: a has dtype int32, expected one of"):
        call("pow", torch.ones(3, dtype=torch.int32, device=DEVICE), 2)
    with pytest.raises(TypeError, match=r"mul: b must be a tensor or a number, got str"):
        call("mul", x, "2")
    with pytest.raises(TypeError, match=r"sub: at least one input must be a tensor"):
        call("sub", 1.0, 2.0)
    with pytest.raises(TypeError, match=r"add: a has dtype bool"):
        call("add", x > 0, x)
    with pytest.raises(TypeError, match=r"neg: x has dtype bool"):  # exp of integers is float, as in torch
        call("neg", torch.ones(2, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match=r"activation: unknown activation 'swish'"):
        call("activation", x, act="swish")
    with pytest.raises(ValueError, match=r"activation_backward: the gelu gradient needs the input x"):
        call("activation_backward", x, None, x, act="gelu")
    with pytest.raises(ValueError, match=r"unary_backward: the exp gradient needs y, got None"):
        call("unary_backward", x, x, None, op_name="exp")
    with pytest.raises(ValueError, match=r"unary_backward: op_name must be one of"):
        call("unary_backward", x, x, x, op_name="tanh")
    with pytest.raises(ValueError, match=r"binary_backward: gy has shape \[2, 3, 4\] but a and b broadcast to \[3, 4\]"):
        call("binary_backward", randn(2, 3, 4), x, x, op_name="mul")
    with pytest.raises(TypeError, match=r"where: cond has dtype float32, expected one of bool"):
        call("where", x, x, 0.0)
    with pytest.raises(ValueError, match=r"where: cannot broadcast cond \[3, 4\] and a \[2\]"):
        call("where", x > 0, randn(2), 0.0)
    with pytest.raises(ValueError, match=r"add: scalar b = 100000000000000000000 does not fit in int64"):
        call("add", torch.ones(2, dtype=torch.int64, device=DEVICE), 10**20)


def test_empty_and_zero_d():
    e = randn(0, 3)
    assert call("add", e, randn(3)).shape == (0, 3)
    z = torch.tensor(2.5, device=DEVICE)
    out = check("mul", z, z, exact=True)
    assert out.shape == ()
    check("exp", z)
    assert math.isclose(call("sub", 1, z).item(), -1.5)
