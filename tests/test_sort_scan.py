"""Scans, sorting and multinomial against torch: cumsum/cumprod/logcumsumexp (forward, reversed,
segmented long rows, gradients incl. cumprod at zeros), sort/argsort (stable, exact indices; NaN,
-0, every dtype; the merge passes and the packed tl.sort tiles), topk/kthvalue/median (capped
merges, ties, NaN, gradients), unique (inverse, counts, NaN), multinomial (the oracle's Philox
draws, both modes, fresh draws per call), and the refusals.
"""
import functools
import math

import pytest
import torch

import ge2
from ge2.backend import call
from ge2.kernels import scan as SC
from ge2.kernels import sort as SO
import numerics
from numerics import DEVICE, LARGE, assert_matches


def oracle(op, *args, **attrs):
    with ge2.use_backend("torch"):
        return call(op, *args, **attrs)


def sample(*shape, dtype=torch.float32, seed=0, stepped=False):
    g = torch.Generator().manual_seed(seed)
    if stepped:
        x = torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)[..., ::2]
    else:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return x.to(device=DEVICE, dtype=dtype)


def same(a, b):
    """Equal, NaN where NaN."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num()) and \
        torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# scans
# ---------------------------------------------------------------------------------------------
def check_scan(op, x, dim, reverse=False):
    out, ref = call(op, x, dim=dim, reverse=reverse), oracle(op, x, dim=dim, reverse=reverse)
    assert out.dtype == ref.dtype and out.shape == ref.shape, (op, out.dtype, ref.dtype)
    if out.is_floating_point():
        assert_matches(out, oracle(op, x.double(), dim=dim, reverse=reverse), ref, name=f"{op} dim {dim}")
    else:
        assert torch.equal(out, ref), op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_scans(dtype):
    x = sample(4, 3, 13, dtype=dtype, seed=1, stepped=True)
    for dim in (0, 1, -1):
        check_scan("cumsum", x, dim)
        check_scan("cumprod", x, dim, reverse=dim == 1)
        check_scan("logcumsumexp", x, dim, reverse=dim == 0)
    check_scan("cumsum", x.transpose(0, 2), 1, reverse=True)


def test_scan_integers_special_values_and_0d():
    i = torch.randint(-3, 4, (5, 7), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    for x in (i.to(torch.int32), i > 0, i.to(torch.uint8)):
        check_scan("cumsum", x, 1)
        check_scan("cumprod", x, 0)
    y = torch.tensor([-math.inf, -math.inf, 1.0, math.inf, math.inf, 2.0, math.nan, 1.0], device=DEVICE)
    assert same(call("logcumsumexp", y, dim=0), torch.logcumsumexp(y, 0))
    assert same(call("cumsum", torch.tensor(2.5, device=DEVICE), dim=0), torch.tensor(2.5, device=DEVICE))
    assert call("cumsum", torch.zeros(3, 0, device=DEVICE), dim=1).shape == (3, 0)


def test_scan_segmented_rows(monkeypatch):
    """Few long rows are cut into segments: totals, their scan, then the segments from their carry."""
    monkeypatch.setattr(SC, "BLOCK", 32)
    monkeypatch.setattr(SC, "MIN_PROGRAMS", 16)
    x = sample(2, 200, seed=3)
    for reverse in (False, True):
        check_scan("cumsum", x, 1, reverse)
        check_scan("cumprod", 1.0 + 0.01 * x, 1, reverse)
    check_scan("logcumsumexp", x, 1)


grad_check = functools.partial(numerics.grad_check, seed=4, dtype=torch.float64)


def test_scan_gradients():
    x = sample(3, 4, 6, seed=5, dtype=torch.float64, stepped=True)
    grad_check(lambda t: t.cumsum(1), x, dtype=torch.float32)
    grad_check(lambda t: t.logcumsumexp(-1), x)
    grad_check(lambda t: t.cumprod(0), x)
    z = x.clone()
    z[0, 1, 2] = 0.0  # one zero in a row
    z[1, 2, 0] = 0.0  # two zeros in a row
    z[1, 2, 4] = 0.0
    z[2, 3, 5] = 0.0  # a zero at the row's end
    grad_check(lambda t: t.cumprod(2), z)
    grad_check(lambda t: t.cumsum(0, dtype=torch.float64), x, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# sort, argsort
# ---------------------------------------------------------------------------------------------
def check_sort(x, dim=-1, descending=False):
    """Values and indices exactly torch's stable sort (equal values keep their input order)."""
    values, indices = call("sort", x, dim=dim, descending=descending)
    ref = torch.sort(x, dim=dim, descending=descending, stable=True)
    assert same(values, ref.values) and torch.equal(indices, ref.indices), (x.dtype, dim, descending)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool])
def test_sort_dtypes(dtype):
    x = (4 * sample(3, 4, 11, seed=6, stepped=True)).round()  # ties on purpose
    x = x.abs() if dtype == torch.uint8 else (x > 0 if dtype == torch.bool else x)
    x = x.to(dtype)
    check_sort(x, -1)
    check_sort(x, 0, descending=True)
    check_sort(x.transpose(1, 2), 1)


def test_sort_nan_zero_and_edges():
    x = sample(3, 9, seed=7)
    x[0, 2] = x[0, 6] = math.nan
    x[1, 1], x[1, 4], x[1, 7] = -0.0, 0.0, -0.0
    x[2, 3], x[2, 5] = math.inf, -math.inf
    for descending in (False, True):
        check_sort(x, 1, descending)
        check_sort(x.double(), 1, descending)
    check_sort(torch.tensor(1.5, device=DEVICE), 0)
    check_sort(torch.zeros(2, 0, device=DEVICE), 1)
    check_sort(sample(1, 1, seed=8), 1)


def test_sort_merge_passes(monkeypatch):
    """Rows longer than a tile: tiles sorted, then merged pairwise (the path rows of 32k/128k take)."""
    monkeypatch.setattr(SO, "RANK_TILE", 16)
    monkeypatch.setattr(SO, "BLOCK", 64)
    x = (3 * sample(3, 100, seed=9)).round()
    x[0, 50] = math.nan
    check_sort(x, 1)
    check_sort(x, 1, descending=True)
    check_sort(x.to(torch.int64), 1)


def test_sort_packed_tiles(monkeypatch):
    """The GPU's tile sort (tl.sort of packed key|index pairs), on the interpreter for one small case."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 16)
    x = (3 * sample(3, 21, seed=10)).round()
    x[1, 4] = math.nan
    check_sort(x, 1)
    check_sort(x.to(torch.bfloat16), 1, descending=True)
    values, indices = call("topk", x, k=3, dim=1)
    assert same(values, torch.topk(x, 3, dim=1).values)


@pytest.mark.parametrize("kind", ["lanes", "bitonic", "search"])
def test_sort_packed_merges(monkeypatch, kind):
    """The GPU's merges of packed keys (merge path per lane or per block, or a search per element):
    several passes, several programs per pair of runs."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 8)
    monkeypatch.setattr(SO, "MERGE_BLOCK", 8)
    monkeypatch.setattr(SO, "MERGE_SEQ", 2)
    monkeypatch.setattr(SO, "MERGE", kind)
    monkeypatch.setattr(SO, "BEST_OF_TILES", False)  # small k takes the capped merges too
    x = (3 * sample(2, 45, seed=24)).round()  # ties on purpose: stability across merges
    x[0, 30] = x[1, 3] = math.nan
    check_sort(x, 1)
    check_sort(x.to(torch.bfloat16).T, 0, descending=True)
    for k in (1, 5):  # capped merges (runs of k): blocks of 2 and 8
        check_topk(x, k)


def test_sort_radix(monkeypatch):
    """The radix sort of whole rows (off by default, see sort.RADIX_SORT): 6 counting passes (the top
    digit partial), several tiles a row and steps a tile, a short last tile, the offsets' loop over a
    row's tiles in steps; stable (ties keep their input order both ways), NaN last, -0 == +0."""
    monkeypatch.setattr(SO, "RADIX_SORT", True)
    monkeypatch.setattr(SO, "RADIX_MIN_N", 2)
    monkeypatch.setattr(SO, "RADIX_BITS", 6)
    monkeypatch.setattr(SO, "RADIX_TILE", 8)
    monkeypatch.setattr(SO, "RADIX_SUB", 4)
    monkeypatch.setattr(SO, "RADIX_CHUNK", 2)
    x = (3 * sample(2, 37, seed=30)).round()  # ties on purpose
    x[0, 7] = x[0, 30] = x[1, 36] = math.nan
    x[1, 2], x[1, 9], x[1, 20] = -0.0, 0.0, -0.0
    x[0, 0], x[1, 5] = math.inf, -math.inf
    check_sort(x.T, 0, descending=True)  # rows read through strides
    check_sort((5 * sample(2, 21, seed=31)).round().to(torch.int32), 1)


def test_topk_best_of_tiles(monkeypatch):
    """Small k on the GPU's path: each tile's best k on 32-bit keys (the k-th key's ties by lowest index),
    unsorted, then rounds of chunks of candidates (three rounds for k = 5 here) down to one sorted run."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 8)
    monkeypatch.setattr(SO, "BEST_TILE", 16)
    monkeypatch.setattr(SO, "BEST_CHUNK", 8)
    x = (2 * sample(3, 70, seed=32)).round()  # ties at the k-th place inside tiles
    x[1, 5] = x[1, 60] = x[2, 69] = math.nan
    x[0, 3], x[0, 9] = -0.0, 0.0
    for k, largest in ((1, True), (5, False), (9, True), (20, False)):
        check_topk(x, k, largest=largest)
    check_topk((5 * sample(2, 45, seed=33)).round().to(torch.int32).T, 7, dim=0, largest=False)  # strided rows
    check_topk(sample(2, 37, seed=34).to(torch.bfloat16), 4)
    values, indices = call("kthvalue", x, k=4, dim=1)
    ref = torch.kthvalue(x, 4, dim=1)
    assert same(values, ref.values) and same(torch.gather(x, 1, indices[:, None])[:, 0], values)


@pytest.mark.parametrize("programs, atomic", [(512, True), (1, False)])
def test_topk_radix_select(monkeypatch, programs, atomic):
    """Large-k topk on long rows: digit-histogram select, then the k sorted (ties: lowest index first).
    Several programs per row (the last to finish a pass makes the row's choice), or one program
    looping over the row's chunks with per-program histograms in every pass."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 8)
    monkeypatch.setattr(SO, "SELECT_MIN_K", 1)
    monkeypatch.setattr(SO, "SELECT_BLOCK", 32)
    monkeypatch.setattr(SO, "SELECT_PROGRAMS", programs)
    monkeypatch.setattr(SO, "SELECT_ATOMIC_PASSES", atomic)
    x = (2 * sample(2, 70, seed=26)).round()  # many ties at the k-th place: the index digits decide
    x[1, 5] = x[1, 60] = math.nan
    x[0, 3], x[0, 9], x[0, 40] = -0.0, 0.0, -0.0  # -0 == +0: tied, lowest index first
    for k, largest in ((1, True), (2, True), (40, False), (69, True)):
        check_topk(x, k, largest=largest)
    check_topk(x, 70)  # k = n: the sort
    check_topk(sample(2, 100, seed=27).to(torch.bfloat16), 9)  # distinct keys: their digits finish the select
    check_topk((5 * sample(3, 45, seed=28)).round().to(torch.int32), 20, largest=False)
    values, indices = call("kthvalue", x, k=30, dim=1)
    ref = torch.kthvalue(x, 30, dim=1)
    assert same(values, ref.values) and same(torch.gather(x, 1, indices[:, None])[:, 0], values)


@pytest.mark.parametrize("block", [32, 16])
def test_topk_row_select(monkeypatch, block):
    """The select with one program a row (SELECT_ROW): digit passes counted in registers, then the
    row walked in order (ties at the k-th key: lowest index first, no index digits)."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 8)
    monkeypatch.setattr(SO, "SELECT_MIN_K", 1)
    monkeypatch.setattr(SO, "SELECT_ROW", True)  # off by default (slower on the H100), kept tested
    monkeypatch.setattr(SO, "SELECT_ROW_MIN_M", 1)
    monkeypatch.setattr(SO, "SELECT_ROW_BLOCK", block)

    def refuse(*args):
        raise AssertionError("the multi-program select ran")

    monkeypatch.setattr(SO, "select_rows", refuse)
    x = (2 * sample(3, 70, seed=35)).round()  # ties at the k-th place
    x[1, 5] = x[1, 60] = math.nan
    x[0, 3], x[0, 9], x[0, 40] = -0.0, 0.0, -0.0
    for k, largest in ((1, True), (40, False), (69, True)):
        check_topk(x, k, largest=largest)
    check_topk(sample(2, 100, seed=36).to(torch.bfloat16), 9)  # distinct keys: stops after the key's digits
    check_topk((5 * sample(3, 45, seed=37)).round().to(torch.int32).T, 20, dim=0, largest=False)  # strided
    values, indices = call("kthvalue", x, k=30, dim=1)
    ref = torch.kthvalue(x, 30, dim=1)
    assert same(values, ref.values) and same(torch.gather(x, 1, indices[:, None])[:, 0], values)


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
def test_large_row_select(monkeypatch):
    """The bench's k = 1024 over rows of 32k and 128k, with rows enough for one program a row."""
    monkeypatch.setattr(SO, "SELECT_ROW", True)
    for rows, n in ((40, 32768 + 3), (SO.SELECT_ROW_MIN_M, 131072)):
        x = sample(rows, n, seed=38)
        check_topk(x, 1024)
        check_topk((4 * x).round(), 1024, largest=False)  # ties at the k-th place
        check_topk(x.to(torch.bfloat16), 300)


def test_topk_select_row_limit(monkeypatch):
    """Rows longer than SELECT_MAX_N (2^24: the index's bits must fit beside the key's in an int64)
    take the capped merges, not the radix select."""
    monkeypatch.setattr(SO, "PACKED_SORT", True)
    monkeypatch.setattr(SO, "TILE", 8)
    monkeypatch.setattr(SO, "SELECT_MIN_K", 1)
    monkeypatch.setattr(SO, "SELECT_MAX_N", 32)

    def refuse(*args):
        raise AssertionError("the radix select took a row longer than SELECT_MAX_N")

    monkeypatch.setattr(SO, "select_rows", refuse)
    check_topk((2 * sample(2, 33, seed=29)).round(), 5)


def test_sort_api_and_gradient():
    x = sample(4, 7, seed=11)
    t = ge2.from_torch(x)
    out = t.sort(0, descending=True)
    assert torch.equal(out.values.data, x.sort(0, descending=True).values)
    assert torch.equal(ge2.argsort(t, dim=1).data, torch.argsort(x, dim=1, stable=True))
    grad_check(lambda v: v.sort(1, descending=True), sample(3, 5, 6, seed=12, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# topk, kthvalue, median
# ---------------------------------------------------------------------------------------------
def check_topk(x, k, dim=-1, largest=True):
    """Values exactly torch's; indices point at them (torch leaves ties' order open; ge2: lowest index first)."""
    values, indices = call("topk", x, k=k, dim=dim, largest=largest)
    ref = torch.topk(x, k, dim=dim, largest=largest)
    assert same(values, ref.values), (k, dim, largest)
    assert same(torch.gather(x, dim, indices), values)
    assert torch.equal(indices, oracle("topk", x, k=k, dim=dim, largest=largest)[1])


def test_topk(monkeypatch):
    x = (3 * sample(3, 5, 20, seed=13)).round()
    x[0, 0, 3] = math.nan
    for k, dim, largest in ((1, -1, True), (4, -1, False), (5, 1, True), (20, 2, False), (0, 0, True)):
        check_topk(x, k, dim, largest)
    monkeypatch.setattr(SO, "RANK_TILE", 8)  # capped merges: every tile keeps its k best
    monkeypatch.setattr(SO, "BLOCK", 64)
    y = sample(2, 70, seed=14)
    check_topk(y, 1)
    check_topk(y, 13, largest=False)


def test_kthvalue_median():
    x = (2 * sample(4, 9, seed=15)).round()
    for k in (1, 4, 9):
        values, indices = call("kthvalue", x, k=k, dim=1)
        ref = torch.kthvalue(x, k, dim=1)
        assert same(values, ref.values) and same(torch.gather(x, 1, indices[:, None])[:, 0], values)
    even = sample(5, 6, seed=16)
    even[2, 3] = math.nan  # a row with NaN: its median is NaN, at a NaN's index
    for v in (even, even.T, x):
        values, indices = call("median", v, dim=1, keepdim=True)
        ref = torch.median(v, dim=1, keepdim=True)
        assert same(values, ref.values)
        assert same(torch.gather(v, 1, indices), values)
    assert same(call("median", x), torch.median(x)) and same(call("median", even), torch.median(even))
    assert same(call("median", x.to(torch.int32), dim=0)[0], torch.median(x.to(torch.int32), dim=0).values)


@pytest.mark.parametrize("name,fn", [
    ("topk", lambda t: t.topk(3, dim=1)),
    ("kthvalue", lambda t: t.kthvalue(2, 0)),
    ("median_dim", lambda t: t.median(-1, keepdim=True)),
    ("median", lambda t: t.median()),
])
def test_selection_gradients(name, fn):
    grad_check(fn, sample(4, 6, seed=17, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# unique
# ---------------------------------------------------------------------------------------------
def test_unique():
    x = (2 * sample(3, 7, seed=18)).round()
    x[0, 1] = x[2, 2] = math.nan
    x[1, 1], x[1, 2] = -0.0, 0.0
    for v in (x, x.to(torch.int32), x > 0):
        v = v.nan_to_num(5.0) if not v.is_floating_point() else v
        values, inverse, counts = call("unique", v, return_inverse=True, return_counts=True)
        ref = torch.unique(v, return_inverse=True, return_counts=True)
        assert same(values, ref[0]) and torch.equal(counts, ref[2])
        # each NaN is its own value; torch's order among them is not specified, ge2 keeps input order
        assert same(values[inverse], v) and torch.equal(inverse[~v.isnan()], ref[1][~v.isnan()])
    t = ge2.from_torch(x)
    assert same(ge2.unique(t).data, torch.unique(x))
    out, inv = t.unique(return_inverse=True)
    assert inv.shape == x.shape


# ---------------------------------------------------------------------------------------------
# multinomial
# ---------------------------------------------------------------------------------------------
def test_multinomial_matches_oracle():
    p = torch.rand(3, 17, generator=torch.Generator().manual_seed(19)).to(DEVICE)
    p[0, :5] = 0.0
    state = torch.tensor([1234, 40], dtype=torch.int64, device=DEVICE)
    for replacement, n in ((True, 12), (False, 12), (False, 1)):
        out = call("multinomial_sample", p, state, num_samples=n, replacement=replacement)
        assert torch.equal(out, oracle("multinomial_sample", p, state, num_samples=n, replacement=replacement))
        assert (p.gather(1, out) > 0).all()
        if not replacement:
            assert all(len(set(row.tolist())) == n for row in out)


def test_multinomial_api():
    ge2.manual_seed(0)
    p = ge2.from_torch(torch.tensor([[0.1, 0.0, 0.6, 0.3]] * 2, device=DEVICE))
    a = ge2.multinomial(p, 4000, replacement=True)
    b = p.multinomial(4000, replacement=True)
    assert a.shape == (2, 4000) and a.dtype == torch.int64 and not torch.equal(a.data, b.data)  # fresh draws
    freq = torch.bincount(a.data.reshape(-1), minlength=4).double() / 8000
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64, device=DEVICE), atol=0.03)
    one = ge2.multinomial(p[0], 3)
    assert one.shape == (3,) and 1 not in one.data.tolist() and len(set(one.data.tolist())) == 3


def test_multinomial_in_a_captured_step():
    """Replays of a captured step draw afresh (the state advances on the device) and match the oracle."""
    from ge2.autograd.dropout import default_rng_state

    p = ge2.from_torch(torch.rand(2, 33, generator=torch.Generator().manual_seed(23)).to(DEVICE))
    step = ge2.capture(lambda w: (ge2.multinomial(w, 6, replacement=True), ge2.multinomial(w, 6)), warmup=1)
    state = default_rng_state(p.device)
    draws = []
    for _ in range(4):
        before = state.clone()
        with_r, without_r = (t.data.clone() for t in step(p))
        assert torch.equal(with_r, oracle("multinomial_sample", p.data, before, num_samples=6, replacement=True))
        before[1] += 2 * 6
        assert torch.equal(without_r, oracle("multinomial_sample", p.data, before, num_samples=6, replacement=False))
        draws.append(with_r)
    assert not torch.equal(draws[2], draws[3])


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------
def test_refusals():
    x = ge2.from_torch(sample(3, 4, seed=20))
    with pytest.raises(ValueError, match=r"topk: k must be in \[0, 4\]"):
        x.topk(5)
    with pytest.raises(ValueError, match=r"kthvalue: k must be in \[1, 3\]"):
        x.kthvalue(0, dim=0)
    with pytest.raises(ValueError, match="sort: dim 2 is out of range"):
        x.sort(2)
    with pytest.raises(ValueError, match="median: cannot take the median over dim 1 of size 0"):
        ge2.from_torch(torch.zeros(2, 0, device=DEVICE)).median(1)
    with pytest.raises(ValueError, match="unique: dim 2 is out of range"):  # unique over slices: test_unique_dim.py
        x.unique(dim=2)
    with pytest.raises(TypeError, match="cumsum: dim must be an int"):
        x.cumsum(None)
    with pytest.raises(TypeError, match="logcumsumexp: x has dtype int64"):
        ge2.from_torch(torch.ones(3, dtype=torch.int64, device=DEVICE)).logcumsumexp(0)
    with pytest.raises(ValueError, match="multinomial_sample: cannot draw 5 samples without replacement from 4"):
        ge2.multinomial(x.abs(), 5)
    with pytest.raises(ValueError, match="multinomial: input must be 1-D or 2-D"):
        ge2.multinomial(ge2.from_torch(torch.ones(2, 2, 2, device=DEVICE)), 1)


@pytest.mark.skipif(not LARGE, reason="large shapes run on the GPU")
def test_large_rows():
    """The benchmark's shapes: rows of 32k and 128k (sort, topk 1/50/1024), cumsum over 8192 and 1M."""
    for n in (32768, 131072 + 7):
        x = sample(4, n, seed=21)
        check_sort(x, 1)
        check_sort(x.to(torch.bfloat16), 1, descending=True)
        check_sort((4 * x).round(), 1)  # ties across the radix sort's tiles: input order kept
        check_sort(x.double(), 1)
        for k in (1, 50, 1024):
            check_topk(x, k)
        check_topk((4 * x).round(), 1024, largest=False)  # ties at the k-th place: the select's index passes
        check_topk(x.to(torch.bfloat16), 50)
    for n, rows in ((8192, 64), (1 << 20, 3)):
        x = sample(rows, n, seed=22)
        check_scan("cumsum", x, 1)
        check_scan("logcumsumexp", x, 1, reverse=True)
