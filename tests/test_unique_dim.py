"""unique over slices (``unique(x, dim=d)``) against torch: values, inverse and counts exactly, for every
dtype, any dim (negative too), non-contiguous inputs, size-0/1 dims, odd and even slice lengths (the
rank-doubling folds), NaN and -0 slices; the refusals on their messages."""
import math

import pytest
import torch

import ge2
from numerics import DEVICE, LARGE


def slices(n, rest, dim, *, dtype=torch.float32, pool=4, seed=0):
    """x whose n slices along dim are drawn from ``pool`` distinct random slices of shape ``rest`` (duplicates)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(-3, 4, (pool, *rest), generator=g)
    x = base[torch.randint(0, pool, (n,), generator=g)]
    if dtype.is_floating_point:
        x = x.double() * 0.37 + 0.11
    return x.to(dtype).movedim(0, dim).to(DEVICE)


def check(x, dim, **flags):
    out = ge2.unique(ge2.from_torch(x), dim=dim, return_inverse=True, return_counts=True, **flags)
    ref = torch.unique(x, dim=dim, return_inverse=True, return_counts=True)
    for got, want, what in zip(out, ref, ("values", "inverse", "counts")):
        got = got.data
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
        if got.is_floating_point():  # NaN where NaN
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), what
        else:
            assert torch.equal(got, want), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32,
                                   torch.uint8, torch.bool])
def test_unique_dim_dtypes(dtype):
    if dtype == torch.uint8:
        x = (slices(9, (3, 2), 1, dtype=torch.int16, seed=1) + 3).to(dtype)
    else:
        x = slices(9, (3, 2), 1, dtype=dtype, seed=1)
    check(x, 1)
    check(x, -1)


@pytest.mark.parametrize("n,rest,dim", [(7, (5,), 0), (6, (1,), 0), (5, (3, 1, 2), 2), (1, (4,), 1),
                                        (8, (), 0), (11, (7,), -2)])
def test_unique_dim_shapes(n, rest, dim):
    x = slices(n, rest, dim % (len(rest) + 1), seed=n)
    check(x, dim)


def test_unique_dim_noncontiguous_and_api():
    x = slices(10, (6, 3), 0, seed=3)
    check(x.transpose(1, 2), 0)  # strided slices
    check(x[:, ::2], 1)
    check(x.transpose(0, 1), 1)
    g = ge2.from_torch(x)
    values = g.unique(dim=0)  # Tensor method, values only
    assert torch.equal(values.data, torch.unique(x, dim=0))
    values, counts = ge2.unique(g, dim=0, return_counts=True, sorted=False)  # torch sorts along a dim anyway
    ref = torch.unique(x, dim=0, return_counts=True)
    assert torch.equal(values.data, ref[0]) and torch.equal(counts.data, ref[1])


def test_unique_dim_nan_zero_and_empty():
    x = torch.tensor([[1.0, math.nan], [0.0, 2.0], [1.0, math.nan], [-0.0, 2.0], [0.0, -1.5]], device=DEVICE)
    out = ge2.unique(ge2.from_torch(x), dim=0, return_inverse=True, return_counts=True)
    # -0 equals +0 (one slice); a NaN equals nothing, so each slice with a NaN is its own group, sorted last
    assert out[0].shape == (4, 2) and out[2].data.tolist() == [1, 2, 1, 1]
    assert out[1].data.tolist() == [2, 1, 3, 1, 0]
    check(x, 0)
    empty = torch.empty(0, 3, device=DEVICE)
    check(empty, 0)


def test_unique_dim_refusals():
    with pytest.raises(ValueError, match=r"unique: dim=0 given but x is 0-d"):
        ge2.unique(ge2.from_torch(torch.tensor(2.0, device=DEVICE)), dim=0)
    with pytest.raises(ValueError, match=r"unique: x \[3, 0\] has a zero-size dim other than dim 0"):
        ge2.unique(ge2.from_torch(torch.empty(3, 0, device=DEVICE)), dim=0)
    with pytest.raises((ValueError, IndexError), match=r"unique"):
        ge2.unique(ge2.from_torch(torch.ones(3, 2, device=DEVICE)), dim=2)


@pytest.mark.skipif(not LARGE, reason="larger shapes on the GPU only")
def test_unique_dim_large():
    x = slices(50_000, (13,), 0, pool=3000, seed=7)
    check(x, 0)
    check(slices(4000, (2, 300), 2, dtype=torch.int64, pool=40, seed=8), 2)
