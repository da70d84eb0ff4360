"""The reductions of issue 25 against torch: min/amin/argmax/argmin, prod, var/std, vector norms,
logsumexp, all/any (backend level: triton vs the torch oracle and float64), their gradients through
ge2.Tensor against torch autograd, NaN/inf/empty/0-d edge cases, the split path, and the refusals.
"""
import functools
import math

import pytest
import torch

import ge2
from ge2.backend import call
from ge2.kernels import reduction as R
import numerics
from numerics import DEVICE, LARGE, assert_matches

def oracle(op, x, **attrs):
    with ge2.use_backend("torch"):
        return call(op, x, **attrs)


def check(op, x, **attrs):
    """Triton vs torch: dtype, shape; floats within 2x torch's error vs float64, the rest exact."""
    out, ref = call(op, x, **attrs), oracle(op, x, **attrs)
    if isinstance(out, tuple):  # picked (values, indices): exactly torch's
        for o, r in zip(out, ref):
            assert o.dtype == r.dtype and o.shape == r.shape, (op, attrs, o.dtype, r.dtype, o.shape, r.shape)
            assert torch.equal(o, r) or (o.is_floating_point() and torch.equal(o.nan_to_num(), r.nan_to_num())), (
                op, attrs, o, r)
        return
    assert out.dtype == ref.dtype and out.shape == ref.shape, (op, attrs, out.dtype, ref.dtype, out.shape, ref.shape)
    if out.is_floating_point():
        ref64 = oracle(op, x.double() if x.is_floating_point() else x, **attrs)
        assert_matches(out, ref64, ref, name=f"{op} {attrs}")
    else:
        assert torch.equal(out, ref), (op, attrs, out, ref)


def sample(shape, kind="contig", dtype=torch.float32, seed=0):
    """Random tensor of shape: contiguous, transposed (last two dims) or stepped (every other element)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "transposed":
        x = torch.randn((*shape[:-2], shape[-1], shape[-2]), generator=g, dtype=torch.float64).transpose(-1, -2)
    elif kind == "stepped":
        x = torch.randn((*shape[:-1], 2 * shape[-1] + 1), generator=g, dtype=torch.float64)[..., 1::2]
    else:
        x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    return x.to(device=DEVICE, dtype=dtype)


DIMS = [None, -1, (0, 2), ()]


@pytest.mark.parametrize("kind,dtype", [("contig", torch.float64), ("transposed", torch.float32),
                                        ("stepped", torch.bfloat16)])
def test_float_reductions(kind, dtype):
    x = sample((4, 6, 21), kind, dtype, seed=1)
    for i, dims in enumerate(DIMS):
        keepdim = i % 2 == 1
        check("amin", x, dims=dims, keepdim=keepdim)
        check("var", x, dims=dims, keepdim=keepdim)
        check("std", x, dims=dims, correction=0, keepdim=keepdim)
        check("logsumexp", x, dims=dims, keepdim=keepdim)
        check("vector_norm", x, dims=dims, keepdim=keepdim)
        check("all", x > 0, dims=dims, keepdim=keepdim)
        check("any", x > 1.5, dims=dims, keepdim=keepdim)
    for dim in (0, 1, -1):
        check("min", x, dim=dim, keepdim=dim == 1)
        check("argmax", x, dim=dim, keepdim=dim == 0)
        check("argmin", x, dim=dim)
        check("prod", x[:, :, :5], dims=dim)
    check("argmax", x)
    check("argmin", x, keepdim=True)


@pytest.mark.parametrize("ord", [1, 3.5, -1.5, math.inf, -math.inf, 0])
def test_vector_norm_ords(ord):
    x = sample((5, 19), "stepped", seed=2)
    x[1, 3] = 0.0
    for dims in (None, 1, 0):
        check("vector_norm", x, ord=ord, dims=dims)


def test_integer_and_bool_inputs():
    g = torch.Generator().manual_seed(3)
    i = torch.randint(-4, 5, (5, 9), generator=g).to(DEVICE)
    for dt in (torch.int32, torch.int64, torch.uint8, torch.bool):
        x = (i > 0) if dt == torch.bool else (i.abs() if dt == torch.uint8 else i).to(dt)
        for dim in (0, 1):
            check("min", x, dim=dim)
            check("argmax", x, dim=dim)
            check("argmin", x, dim=dim)
            check("prod", x, dims=dim)
            check("all", x, dims=dim)
            check("any", x, dims=dim)
        check("amin", x)
        check("argmax", x)
    assert call("prod", i.to(torch.int32)).dtype == torch.int64


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_nan_inf_and_empty():
    x = sample((4, 9), seed=4)
    x[0, 3] = float("nan")
    x[1, 2] = -math.inf
    x[2, :] = -math.inf
    x[3, 5] = math.inf
    for dim in (0, 1):
        check("min", x, dim=dim)
        check("argmin", x, dim=dim)
        check("argmax", x, dim=dim)
        check("logsumexp", x, dims=dim)
        check("amin", x, dims=dim)
    empty = torch.zeros((3, 0), device=DEVICE)
    for op in ("all", "any", "logsumexp", "var", "prod"):
        check(op, empty, dims=1)
    for op in ("var", "std", "logsumexp", "prod", "amin", "argmax"):
        check(op, torch.tensor(2.5, device=DEVICE))
    check("var", sample((3, 1), seed=5), dims=1)  # N - correction = 0 -> NaN like torch


def test_split_path(monkeypatch):
    monkeypatch.setattr(R, "SPLIT_MIN_ELEMENTS", 512)
    x = sample((3, 2500), "contig", seed=6)
    for op in ("var", "std", "logsumexp", "vector_norm", "amin"):
        check(op, x, dims=1)
    check("argmin", x, dim=1)
    check("all", x > -3.0, dims=1)
    check("prod", 1.0 + 0.001 * x[:, :1100], dims=1)


grad_check = functools.partial(numerics.grad_check, seed=7, dtype=torch.float32)


@pytest.mark.parametrize("name,fn", [
    ("min_dim", lambda t: t.min(1)),
    ("min_all", lambda t: t.min()),
    ("amin", lambda t: t.amin((0, 2), keepdim=True)),
    ("prod", lambda t: t.prod(1)),
    ("var", lambda t: t.var((0, 2))),
    ("var_unbiased_false", lambda t: t.var(1, False, True)),
    ("std", lambda t: t.std(-1, correction=0)),
    ("norm", lambda t: t.norm()),
    ("norm_1", lambda t: t.norm(1, dim=1)),
    ("norm_3", lambda t: t.norm(3, dim=(0, 1))),
    ("norm_inf", lambda t: t.norm(math.inf, dim=2)),
    ("logsumexp", lambda t: t.logsumexp(1)),
])
def test_gradients(name, fn):
    grad_check(fn, sample((3, 5, 7), "stepped", torch.float64, seed=8))


def test_prod_gradient_with_zeros():
    x = sample((4, 6), seed=9, dtype=torch.float64)
    x[1, 2] = 0.0
    x[2, 0] = 0.0
    x[2, 4] = 0.0
    for dtype in (torch.float32, torch.float64):
        grad_check(lambda t: t.prod(1), x, dtype=dtype)
        grad_check(lambda t: t.prod(), x[:2], dtype=dtype)


def test_functional_api():
    x = sample((4, 5), seed=10)
    t = ge2.from_torch(x)
    values, indices = ge2.min(t, 1, keepdim=True)
    ref = x.min(1, keepdim=True)
    assert torch.equal(values.data, ref.values) and torch.equal(indices.data, ref.indices)
    assert torch.equal(t.min(1).indices.data, ref.indices.squeeze(1))
    assert torch.equal(ge2.argmax(t).data, x.argmax()) and ge2.argmax(t, keepdim=True).shape == (1, 1)
    assert torch.equal(t.min(ge2.from_torch(x.flip(0))).data, torch.minimum(x, x.flip(0)))
    assert torch.equal(ge2.all(t > -10).data, torch.tensor(True, device=DEVICE))
    assert torch.equal(t.any(1).data, x.any(1))
    assert_matches(ge2.linalg.vector_norm(t, 2, dim=1).data, x.double().norm(dim=1), x.norm(dim=1))
    assert_matches(ge2.std(t, unbiased=False).data, x.double().std(unbiased=False), x.std(unbiased=False))
    assert_matches(t.var(True).data, x.double().var(True), x.var(True))
    assert t.prod(dtype=torch.float64).dtype == torch.float64
    # mean of a 0-d tensor over dim 0 / -1 is the value itself (issue 25 defect)
    s = ge2.from_torch(torch.tensor(1.5, device=DEVICE)).requires_grad_()
    for dim in (0, -1):
        out = s.mean(dim)
        assert out.shape == () and out.item() == 1.5
    s.mean(0).backward()
    assert s.grad.item() == 1.0


def test_refusals():
    x = ge2.from_torch(sample((3, 4), seed=11))
    empty = ge2.from_torch(torch.zeros((3, 0), device=DEVICE))
    with pytest.raises(ValueError, match="min: cannot reduce an empty tensor"):
        empty.min(1)
    with pytest.raises(ValueError, match="argmax: cannot reduce an empty tensor"):
        ge2.argmax(empty)
    with pytest.raises(ValueError, match="amin: dim 2 is out of range"):
        x.amin(2)
    with pytest.raises(ValueError, match="var: pass either unbiased= or correction="):
        x.var(1, unbiased=True, correction=0)
    with pytest.raises(TypeError, match="var: x has dtype int64"):
        ge2.from_torch(torch.ones(3, dtype=torch.int64, device=DEVICE)).var()
    with pytest.raises(ValueError, match=r"norm: p='nuc' is not supported: the nuclear norm .* needs an SVD"):
        x.norm("nuc")
    with pytest.raises(ValueError, match="norm: p='max' is not a norm ge2 knows; use 'fro' or a number"):
        x.norm("max")
    with pytest.raises(TypeError, match="vector_norm: ord must be a number"):
        ge2.linalg.vector_norm(x, "fro")
    with pytest.raises(TypeError, match="logsumexp: x has dtype bool"):
        (x > 0).logsumexp(1)


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
def test_large():
    x = sample((8, 300_000), seed=12)
    for op in ("var", "std", "logsumexp", "vector_norm", "amin"):
        check(op, x, dims=1)
        check(op, x.T, dims=0)
    check("argmin", x, dim=1)
    check("prod", 1.0 + 1e-5 * x, dims=1)
    check("any", x > 4.5, dims=1)
