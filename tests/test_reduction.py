"""Reductions at the backend level: the triton backend vs the torch oracle and float64.

sum / mean / amax over every kind of dims (None, int, negative, tuple, ()), keepdim, 0-d inputs,
non-contiguous inputs (transposed, stepped, expanded, layouts that must be copied), odd sizes,
fp32/bf16/fp16/fp64 and integers; max over a dim returns torch's values and first indices, NaN
included; empty reductions; the split path (partials reduced by a second launch); schema errors.
"""
import pytest
import torch

import ge2
from ge2.backend import call
from ge2.kernels import reduction as R
from numerics import DEVICE, LARGE, assert_matches, randn

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def oracle(op, x, **attrs):
    with ge2.use_backend("torch"):
        return call(op, x, **attrs)


def check(op, x, **attrs):
    """Triton vs torch: same dtype and shape; floats within 2x torch's error vs float64, ints exact."""
    out, ref = call(op, x, **attrs), oracle(op, x, **attrs)
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, ref.dtype, out.shape, ref.shape)
    if out.is_floating_point():
        ref64 = oracle(op, x.double() if x.is_floating_point() else x, **attrs)
        assert_matches(out, ref64, ref, name=op)
    else:
        assert torch.equal(out, ref), op
    return out


def check_max(x, dim, keepdim=False):
    """Values and indices exactly torch's (the first maximum; NaN is the maximum, its first index)."""
    values, indices = call("max", x, dim=dim, keepdim=keepdim)
    ref_values, ref_indices = oracle("max", x, dim=dim, keepdim=keepdim)
    assert indices.dtype == torch.int64 and values.dtype == x.dtype and values.shape == ref_values.shape
    assert torch.equal(indices, ref_indices), (indices, ref_indices)
    assert ((values == ref_values) | (values.isnan() & ref_values.isnan())).all()


def layout(shape, kind, dtype=torch.float32, seed=0):
    """A random tensor of shape: contiguous, transposed (last two dims), stepped or expanded dim 0."""
    g = torch.Generator().manual_seed(seed)
    if kind == "transposed":
        x = torch.randn((*shape[:-2], shape[-1], shape[-2]), generator=g, dtype=torch.float64).transpose(-1, -2)
    elif kind == "stepped":
        x = torch.randn((*shape[:-1], 2 * shape[-1] + 1), generator=g, dtype=torch.float64)[..., 1::2]
    elif kind == "expanded":
        x = torch.randn((1, *shape[1:]), generator=g, dtype=torch.float64).expand(shape)
    else:
        x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    return x.to(device=DEVICE, dtype=dtype)


DIMS = [None, 0, -1, 1, (0, 2), (2, 0), (1, 2), (0, 1, 2), ()]


# Every float dtype on contiguous inputs; fp32 and bf16 on each strided layout.
LAYOUTS = [("contig", dt) for dt in FLOATS] + [
    (kind, dt) for kind in ("transposed", "stepped", "expanded") for dt in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("kind,dtype", LAYOUTS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_float_reductions(op, kind, dtype):
    x = layout((5, 7, 33), kind, dtype, seed=1)
    for i, dims in enumerate(DIMS):
        check(op, x, dims=dims, keepdim=i % 2 == 1)


@pytest.mark.parametrize("shape", [(1,), (7,), (1000,), (1, 1), (33, 1), (1, 33), (3, 1, 999)])
def test_odd_shapes(shape):
    x = layout(shape, "contig", seed=2)
    for dims in (None, 0, -1):
        check("sum", x, dims=dims)
        check("mean", x, dims=dims, keepdim=True)
        check("amax", x, dims=dims)
        if dims is not None:
            check_max(x, dims)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool])
def test_integer_sum_and_max(dtype):
    x = (layout((6, 5, 9), "transposed", seed=3) * 60).to(dtype)  # int8 sums overflow int8, not int64
    for dims in (None, 1, (0, 2)):
        out = check("sum", x, dims=dims)
        assert out.dtype == torch.int64
        if dtype != torch.bool:
            check("amax", x, dims=dims, keepdim=True)
    if dtype != torch.bool:
        for dim in (0, 1, 2):
            check_max(x, dim)
    big = torch.full((3, 5), 2**40 + 3, dtype=torch.int64, device=DEVICE)
    assert call("sum", big).item() == 15 * (2**40 + 3)  # int64 accumulation, exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kind", ["contig", "transposed", "stepped"])
def test_max_dim(kind, dtype):
    x = layout((6, 7, 9), kind, dtype, seed=4)
    for dim in (0, 1, 2, -1):
        for keepdim in (False, True):
            check_max(x, dim, keepdim)


def test_max_ties_nan_and_infinities():
    # Few distinct values: many ties, the first index must win.
    x = (layout((9, 40), "contig", seed=5) * 1.5).round()
    check_max(x, 1)
    check_max(x, 0)
    x[2, 7] = float("nan")
    x[2, 30] = float("nan")
    x[5, 0] = float("nan")
    x[:, 11] = float("nan")
    check_max(x, 1)
    check("amax", x, dims=1)
    inf = torch.full((3, 17), -float("inf"), device=DEVICE)
    check_max(inf, 1)
    check("amax", inf, dims=1)
    inf[1, 9] = float("inf")
    check_max(inf, 1)
    ints = torch.tensor([[-(2**63), -(2**63), 5], [7, 7, 7]], device=DEVICE)
    check_max(ints, 1)


def test_zero_d_and_empty():
    z = torch.tensor(2.5, device=DEVICE)
    for op in ("sum", "mean", "amax"):
        for dims in (None, 0, -1, ()):
            check(op, z, dims=dims)
            check(op, z, dims=dims, keepdim=True)
    check_max(z, 0)
    empty = randn(4, 0, 3)
    check("sum", empty, dims=1)  # zeros
    out = check("mean", empty, dims=(1, 2))  # NaN, like torch
    assert out.isnan().all()
    assert call("sum", randn(0, 5), dims=1).shape == (0,)
    check("sum", torch.ones(0, 3, dtype=torch.int32, device=DEVICE), dims=0)


def test_layouts_that_do_not_merge_are_copied():
    # Reduced and kept dims alternate in memory: 4 runs per side, more than MAX_RANK.
    x = layout((2, 3, 2, 3, 2, 3, 2, 3), "contig", seed=6)
    check("sum", x, dims=(0, 2, 4, 6))
    check("amax", x.permute(7, 0, 6, 1, 5, 2, 4, 3), dims=(1, 3, 5, 7), keepdim=True)
    check("mean", x, dims=(1, 2, 3))  # merges: no copy


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
@pytest.mark.parametrize("shape,dims", [((3, 2000), 1), ((1500, 40), 0), ((700, 30), (0, 1)), ((4, 50, 60), (0, 2))])
def test_split_partials(monkeypatch, op, shape, dims):
    monkeypatch.setattr(R, "SPLIT_MIN_ELEMENTS", 64)  # split small problems into many chunks
    check(op, layout(shape, "contig", seed=7), dims=dims)
    check(op, layout(shape, "transposed", torch.bfloat16, seed=7), dims=dims)


def test_split_max_keeps_first_index_across_chunks(monkeypatch):
    monkeypatch.setattr(R, "SPLIT_MIN_ELEMENTS", 64)
    x = (layout((3, 3000), "contig", seed=8) * 1.5).round()  # ties in every chunk
    check_max(x, 1)
    x[0, 2500] = float("nan")
    x[0, 2900] = float("nan")
    x[1, 100] = 50.0
    x[1, 2999] = 50.0
    check_max(x, 1)
    check_max(x.t().contiguous(), 0)


def test_split_without_patching():
    x = layout((40000,), "contig", seed=9)  # over 2 * SPLIT_MIN_ELEMENTS: split for real
    check("sum", x)
    check("mean", x)
    check_max(x, 0)
    check("sum", (x > 0), dims=0)


def test_sum_to():
    g = layout((4, 5, 6), "transposed", seed=10)
    for shape in [(5, 1), (1, 5, 6), (6,), (), (4, 1, 1)]:
        out = R.sum_to(g, shape)
        ref = g.double().sum_to_size(shape) if shape else g.double().sum()
        assert out.shape == torch.Size(shape)
        assert_matches(out, ref, g.sum_to_size(shape) if shape else g.sum())
    assert R.sum_to(g, (4, 5, 6), dtype=torch.float64).dtype == torch.float64


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large(dtype):
    # Mean 1: a sum of zero-mean data cancels to ~sqrt(n), and its relative error is then a lottery
    # between two summation orders rather than a measure of either.
    x = layout((2049, 1031), "contig", torch.float64, seed=11).add(1.0).to(dtype)
    for dims in (None, 0, 1):
        check("sum", x, dims=dims)
        check("amax", x, dims=dims)
        check("mean", x.t(), dims=dims)
    check_max(x, 0)
    check_max(x, 1)
    check("sum", layout((2, 3_000_001), "contig", dtype, seed=12), dims=1)


def test_errors():
    x = randn(3, 4)
    with pytest.raises(ValueError, match=r"sum: dim 2 is out of range for a 2-D tensor \(expected -2..1\)"):
        call("sum", x, dims=2)
    with pytest.raises(ValueError, match=r"mean: dim 1 appears more than once"):
        call("mean", x, dims=(1, -1))
    with pytest.raises(TypeError, match=r"sum: dim must be an int, got float"):
        call("sum", x, dims=(0.5,))
    with pytest.raises(TypeError, match=r"mean: x has dtype int32, expected one of"):
        call("mean", torch.ones(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match=r"amax: x has dtype bool, expected one of"):
        call("amax", x > 0)
    with pytest.raises(ValueError, match=r"max: cannot reduce an empty tensor of shape \[0, 4\]"):
        call("max", randn(0, 4), dim=1)
    with pytest.raises(ValueError, match=r"amax: cannot reduce an empty tensor of shape \[3, 0\]"):
        call("amax", randn(3, 0), dims=1)
    with pytest.raises(TypeError, match=r"sum: x must be a tensor, got list"):
        call("sum", [1.0, 2.0])
