"""Indexing, gather and scatter: ge2 against torch (values exact; gradients against torch autograd).

Advanced reads and writes (int tensors, lists, masks, negative indices, mixed with slices, None
and ..., adjacent and separated index dims), setitem recorded on non-leaves, index_select/add/
copy/fill, masked_*, gather/scatter/scatter_add/scatter_reduce (every reduce and its gradient, prod
with zeros; include_self),
take_along_dim, nonzero, one_hot; duplicates accumulating in every backward that scatters; the
out-of-range and bad-argument errors; a hypothesis property test of reads and writes; no torch
arithmetic in the path.
"""
import contextlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ge2
import ge2.nn.functional as F
from ge2.testing import torch_op_guard
from numerics import DEVICE, LARGE, assert_matches, randn

T = ge2.from_torch


def leaf(t: torch.Tensor):
    """(ge2 leaf, torch leaf) holding the same values, both requiring grad."""
    return T(t.clone()).requires_grad_(), t.clone().requires_grad_()


def idx(*values):
    """A torch index tensor: idx(0, 2) or idx([[0, 1], [2, 3]])."""
    return torch.tensor(values[0] if len(values) == 1 and isinstance(values[0], list) else list(values),
                        device=DEVICE)


def as_ge2(key):
    """The same key with torch tensors wrapped for ge2."""
    if isinstance(key, tuple):
        return tuple(as_ge2(k) for k in key)
    return T(key) if isinstance(key, torch.Tensor) else key


def check_grad(a, at, name="grad"):
    assert_matches(a.grad.data, at.grad.double(), at.grad, name=name)


# ---------------------------------------------------------------------------------------------
# advanced indexing
# ---------------------------------------------------------------------------------------------
def _keys(x: torch.Tensor):
    i = idx([0, -1, 2, 2])
    return [
        i, [1, -2], (slice(None), i), (i, slice(1, 4), idx(1, 0, 5, -6)), (i, None, idx(1)), (Ellipsis, idx(-1, 0)),
        (slice(None), idx([[0, 1], [2, 4]]), idx([1, 0])), (idx([0, 2]), slice(None), idx([[1], [3]])),
        (1, slice(None), idx(0, 5)), (idx(1, 2), 0), x > 0, (slice(None), x[0] > 0.5), (slice(None), x[0, :, 0] > 0),
        (idx(2), Ellipsis, None), idx(3).reshape(()), idx([]).long(), (slice(None, None, 2), [0, 4], 3),
        [True, False, True, False],
    ]


@pytest.mark.parametrize("noncontig", [False, True])
def test_advanced_read_matches_torch(noncontig):
    x = randn(4, 5, 6, noncontig=noncontig, seed=1)
    for key in _keys(x):
        ref = x[key]
        out = T(x)[as_ge2(key)]
        assert out.shape == ref.shape and torch.equal(out.data, ref), key


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.bool, torch.float64])
def test_advanced_read_write_dtypes(dtype):
    x = randn(5, 7, seed=2).mul(4).to(dtype)
    key = (idx(0, 3, -1), slice(1, 6))
    assert torch.equal(T(x)[as_ge2(key)].data, x[key])
    v = randn(3, 5, seed=3).mul(4).to(dtype)
    a, ref = T(x.clone()), x.clone()
    a[as_ge2(key)] = T(v)
    ref[key] = v
    assert torch.equal(a.data, ref)


def test_advanced_read_backward_duplicates_accumulate():
    x = randn(6, 5, 4, dtype=torch.float64, seed=4)
    for key in [(idx(1, 1, 1, -5),), (slice(None), idx([[0, 0], [4, 0]]), idx(3, 3)),
                (idx(2, 2), slice(None), idx(0, 0)), (x[:, :, 0] > 0,)]:
        a, at = leaf(x)
        y, yt = a[as_ge2(key)], at[key]
        g = torch.randn(yt.shape, dtype=torch.float64, device=DEVICE)
        y.backward(T(g))
        yt.backward(g)
        check_grad(a, at, f"grad of x[{key}]")


def test_advanced_read_backward_bf16():
    x = randn(9, 5, dtype=torch.bfloat16, seed=5)
    a, at = leaf(x)
    key = idx(0, 0, 0, 8, -1, 3)
    g = randn(6, 5, dtype=torch.bfloat16, seed=6)
    a[T(key)].backward(T(g))
    at[key].backward(g)
    ref64 = torch.zeros(9, 5, dtype=torch.float64, device=DEVICE).index_put_((key % 9,), g.double(), accumulate=True)
    assert_matches(a.grad.data, ref64, at.grad)


def test_setitem_forms_match_torch():
    base = randn(4, 5, 6, seed=7)
    cases = [
        (idx(0, -1), randn(2, 5, 6, seed=8)), ((slice(None), [1, 3]), 2.5), (base > 0, -1.0),
        (base > 0, randn(int((base > 0).sum()), seed=9)), ((idx(1, 2), slice(0, 3), idx(0, 5)), randn(3, seed=10)),
        ((slice(1, 3), None, idx(2)), randn(1, 6, seed=11)), (2, randn(6, seed=12)), ((Ellipsis, idx(0)), 7.0),
    ]
    for key, v in cases:
        a, ref = T(base.clone()), base.clone()
        a[as_ge2(key)] = T(v) if isinstance(v, torch.Tensor) else v
        ref[key] = v
        assert torch.equal(a.data, ref), key
    # writes through a strided view land in the base tensor's memory
    buf, ref = T(base.clone()), base.clone()
    view = buf[:, ::2]
    view[T(idx(0, 2)), 1] = T(randn(2, 6, seed=13))
    ref[:, ::2][idx(0, 2), 1] = view.data[idx(0, 2), 1]
    assert torch.equal(buf.data, ref)


def test_setitem_recorded_on_non_leaf():
    x = randn(5, 4, dtype=torch.float64, seed=14)
    v0 = randn(3, 4, dtype=torch.float64, seed=15)
    for key in [idx(0, 3, -1), (slice(1, 4),), (idx(1, 2, 4), slice(None))]:
        a, at = leaf(x)
        v, vt = leaf(v0)
        h, ht = a * 2.0, at * 2.0
        h[as_ge2(key)] = v
        ht[key] = vt
        (h * h).sum().backward()
        (ht * ht).sum().backward()
        assert torch.equal(h.data, ht.detach())
        check_grad(a, at, "x grad")
        check_grad(v, vt, "value grad")
    a, _ = leaf(x)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        a[T(idx(0))] = 1.0
    with ge2.no_grad():
        a[T(idx(0))] = 1.0
    assert torch.equal(a.data[0], torch.ones(4, dtype=torch.float64, device=DEVICE))


def test_index_put_accumulate_duplicates():
    x = randn(6, 3, dtype=torch.float64, seed=16)
    v0 = randn(5, 3, dtype=torch.float64, seed=17)
    key = idx(1, 1, 4, 1, -2)
    a, at = leaf(x)
    v, vt = leaf(v0)
    out, ref = a.index_put((T(key),), v, accumulate=True), at.index_put((key,), vt, accumulate=True)
    assert_matches(out.data, ref.detach(), ref.detach())
    g = torch.randn(6, 3, dtype=torch.float64, device=DEVICE)
    out.backward(T(g))
    ref.backward(g)
    check_grad(a, at)
    check_grad(v, vt)
    b, bt = T(x.clone()), x.clone()  # the function form, in place (torch.index_put_)
    assert ge2.index_put_(b, (T(key),), T(v0), accumulate=True) is b
    torch.index_put_(bt, (key,), v0, accumulate=True)
    assert_matches(b.data, bt, bt)


# ---------------------------------------------------------------------------------------------
# index_select / index_add / index_copy / index_fill / masked_*
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, -1])
def test_index_select_add_copy_fill(dim):
    x = randn(5, 1, 7, dtype=torch.float64, noncontig=True, seed=18)
    i = idx(4, 0, 4, 2)
    n = x.shape[dim]
    src0 = randn(*(4 if d == dim % 3 else s for d, s in enumerate(x.shape)), dtype=torch.float64, seed=19)
    for name in ("index_select", "index_add", "index_copy", "index_fill"):
        a, at = leaf(x)
        s, st_ = leaf(src0)
        key = idx(4, 0, 2) if name == "index_copy" else i  # index_copy's duplicates are undefined in torch
        sk, stk = (s[T(idx(0, 1, 2))], st_[idx(0, 1, 2)]) if name == "index_copy" and dim == 0 else (s, st_)
        if name == "index_copy" and dim != 0:
            sk, stk = s[:, :, T(idx(0, 1, 2))], st_[:, :, idx(0, 1, 2)]
        if name == "index_select":
            out, ref = a.index_select(dim, T(key)), at.index_select(dim, key)
        elif name == "index_add":
            out, ref = a.index_add(dim, T(key), sk, alpha=0.5), at.index_add(dim, key, stk, alpha=0.5)
        elif name == "index_copy":
            out, ref = a.index_copy(dim, T(key), sk), at.index_copy(dim, key, stk)
        else:
            out, ref = a.index_fill(dim, T(key), -3.0), at.index_fill(dim, key, -3.0)
        assert_matches(out.data, ref.detach(), ref.detach(), name=name)
        g = torch.randn(ref.shape, dtype=torch.float64, device=DEVICE)
        out.backward(T(g))
        ref.backward(g)
        check_grad(a, at, f"{name} x grad")
        if name in ("index_add", "index_copy"):
            check_grad(s, st_, f"{name} source grad")
    assert n  # the dim exists in both orientations


def test_index_ops_in_place_and_low_precision():
    x = randn(6, 4, dtype=torch.bfloat16, seed=20)
    src = randn(3, 4, dtype=torch.bfloat16, seed=21)
    a, ref = T(x.clone()), x.clone()
    a.index_add_(0, T(idx(5, 5, 0)), T(src))
    ref.index_add_(0, idx(5, 5, 0), src)
    ref64 = x.double().index_add(0, idx(5, 5, 0), src.double())
    assert_matches(a.data, ref64, ref)
    ints = torch.arange(12, device=DEVICE, dtype=torch.int32).reshape(3, 4)
    b = T(ints.clone())
    b.index_fill_(1, T(idx(0, 3)), 9)
    assert torch.equal(b.data, ints.clone().index_fill_(1, idx(0, 3), 9))


def test_masked_fill_and_select():
    x = randn(4, 6, dtype=torch.float64, noncontig=True, seed=22)
    mask = randn(6, seed=23) > 0
    a, at = leaf(x)
    out, ref = a.masked_fill(T(mask), 2.0), at.masked_fill(mask, 2.0)
    assert torch.equal(out.data, ref.detach())
    sel, sel_t = a.masked_select(T(mask)), at.masked_select(mask)
    assert torch.equal(sel.data, sel_t.detach())
    g1 = torch.randn(ref.shape, dtype=torch.float64, device=DEVICE)
    g2 = torch.randn(sel_t.shape, dtype=torch.float64, device=DEVICE)
    ((out * T(g1)).sum() + (sel * T(g2)).sum()).backward()
    ((ref * g1).sum() + (sel_t * g2).sum()).backward()
    check_grad(a, at)
    h = T(x.clone())
    h.masked_fill_(T(mask), -1.0)
    assert torch.equal(h.data, x.masked_fill(mask, -1.0))


# ---------------------------------------------------------------------------------------------
# gather / scatter
# ---------------------------------------------------------------------------------------------
def test_gather_and_take_along_dim():
    x = randn(4, 6, 3, dtype=torch.float64, noncontig=True, seed=24)
    index = torch.randint(0, 6, (3, 8, 2), device=DEVICE)  # duplicates along dim 1; smaller elsewhere
    a, at = leaf(x)
    out, ref = a.gather(1, T(index)), at.gather(1, index)
    assert torch.equal(out.data, ref.detach())
    g = torch.randn(ref.shape, dtype=torch.float64, device=DEVICE)
    out.backward(T(g))
    ref.backward(g)
    check_grad(a, at, "gather grad")
    ii = torch.randint(0, 6, (1, 6, 3), device=DEVICE)
    a, at = leaf(x)
    out, ref = ge2.take_along_dim(a, T(ii), dim=-2), torch.take_along_dim(at, ii, dim=-2)
    assert torch.equal(out.data, ref.detach())
    out.sum().backward()
    ref.sum().backward()
    check_grad(a, at, "take_along_dim grad")
    rows = torch.randint(0, 4, (7, 1), device=DEVICE).expand(7, 3)  # an embedding-like expanded index
    table = randn(4, 3, seed=124)
    assert torch.equal(T(table).gather(0, T(rows)).data, table.gather(0, rows))
    src = randn(7, 3, seed=125)
    assert_matches(ge2.scatter_add(T(table), 0, T(rows), T(src)).data,
                   table.double().scatter_add(0, rows, src.double()), table.scatter_add(0, rows, src))
    flat = torch.randint(0, x.numel(), (5,), device=DEVICE)
    assert torch.equal(ge2.take_along_dim(T(x), T(flat)).data, torch.take_along_dim(x, flat))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce):
    x = randn(5, 4, dtype=torch.float64, seed=25)
    src0 = randn(6, 3, dtype=torch.float64, seed=26)  # (torch's own backward refuses a src larger than index)
    big = randn(7, 4, dtype=torch.float64, seed=126)
    index = torch.randint(0, 4, (6, 3), device=DEVICE)  # duplicates; row 4 never written
    if reduce == "prod":  # zeros: a lone zero src, two zero srcs in one group, a zero in x (torch's cases)
        index[1, 1] = index[2, 1]
        src0[0, 0] = src0[1, 1] = src0[2, 1] = 0.0
        x[index[3, 2], 2] = 0.0
        with ge2.no_grad():
            out = ge2.scatter_reduce(T(x), 0, T(index), T(big), reduce)
        ref = x.scatter_reduce(0, index, big, reduce)
        assert_matches(out.data, ref, ref, name="prod with a src larger than index")
    for include_self in (True, False):
        a, at = leaf(x)
        s, st_ = leaf(src0)
        out = ge2.scatter_reduce(a, 0, T(index), s, reduce, include_self=include_self)
        ref = at.scatter_reduce(0, index, st_, reduce, include_self=include_self)
        assert_matches(out.data, ref.detach(), ref.detach(), name=f"{reduce} include_self={include_self}")
        g = torch.randn(ref.shape, dtype=torch.float64, device=DEVICE)
        out.backward(T(g))
        ref.backward(g)
        check_grad(a, at, f"{reduce} x grad")
        check_grad(s, st_, f"{reduce} src grad")


def test_scatter_multiply_value_gradient():
    """scatter(value=v, reduce="multiply") is scatter_reduce(prod) of a constant: x's gradient by the same rule
    (torch has none for the legacy form; its scatter_reduce with a constant src is the reference)."""
    x = randn(4, 6, seed=29)
    x[1, 2] = 0.0
    index = torch.randint(0, 6, (4, 3), device=DEVICE)
    index[1, 0] = 2
    a, at = leaf(x)
    out = a.scatter(1, T(index), value=1.5, reduce="multiply")
    ref = at.scatter_reduce(1, index, torch.full((4, 3), 1.5, device=DEVICE), "prod")
    assert_matches(out.data, ref.detach(), ref.detach())
    g = torch.randn(4, 6, device=DEVICE)
    out.backward(T(g))
    ref.backward(g)
    check_grad(a, at, "multiply x grad")


def test_scatter_and_scatter_add():
    x = randn(3, 6, dtype=torch.float64, seed=27)
    src0 = randn(3, 4, dtype=torch.float64, seed=28)
    index = torch.stack([torch.randperm(6, device=DEVICE)[:4] for _ in range(3)])  # unique per row: defined
    a, at = leaf(x)
    s, st_ = leaf(src0)
    out, ref = a.scatter(1, T(index), s), at.scatter(1, index, st_)
    out2, ref2 = ge2.scatter_add(a, 1, T(index.flip(1)[:, :2].repeat(1, 2)), s), \
        torch.scatter_add(at, 1, index.flip(1)[:, :2].repeat(1, 2), st_)
    assert torch.equal(out.data, ref.detach())
    assert_matches(out2.data, ref2.detach(), ref2.detach())
    g = torch.randn(3, 6, dtype=torch.float64, device=DEVICE)
    ((out + out2) * T(g)).sum().backward()
    ((ref + ref2) * g).sum().backward()
    check_grad(a, at)
    check_grad(s, st_)
    assert torch.equal(ge2.scatter(T(x), 1, T(index), value=1.5).data, x.scatter(1, index, 1.5))
    h = T(x.clone())
    rows = index[:1].expand(3, 4) % 3  # every src row into the same x row: duplicates add up
    h.scatter_add_(0, T(rows), T(src0))
    assert_matches(h.data, x.scatter_add(0, rows, src0), x.scatter_add(0, rows, src0))


def test_scatter_add_low_precision_and_ints():
    x = randn(8, 5, dtype=torch.float16, seed=29)
    src = randn(12, 5, dtype=torch.float16, seed=30)
    index = torch.randint(0, 8, (12, 5), device=DEVICE)
    out = ge2.scatter_add(T(x), 0, T(index), T(src))
    assert_matches(out.data, x.double().scatter_add(0, index, src.double()), x.scatter_add(0, index, src))
    xi = torch.randint(-9, 9, (4, 5), device=DEVICE)
    si = torch.randint(-9, 9, (4, 5), device=DEVICE)
    ii = torch.randint(0, 5, (4, 5), device=DEVICE)
    for reduce in ("sum", "mean", "amax", "prod"):
        got = ge2.scatter_reduce(T(xi), 1, T(ii), T(si), reduce, include_self=False).data
        assert torch.equal(got, xi.scatter_reduce(1, ii, si, reduce, include_self=False)), reduce


# ---------------------------------------------------------------------------------------------
# nonzero / one_hot
# ---------------------------------------------------------------------------------------------
def test_nonzero_and_one_hot():
    x = (randn(3, 1, 5, seed=31) > 0.3).float()
    assert torch.equal(ge2.nonzero(T(x)).data, torch.nonzero(x))
    for got, ref in zip(ge2.nonzero(T(x), as_tuple=True), torch.nonzero(x, as_tuple=True)):
        assert torch.equal(got.data, ref)
    assert ge2.nonzero(T(torch.zeros(4, device=DEVICE))).shape == (0, 1)
    c = torch.randint(0, 5, (2, 3), device=DEVICE)
    assert torch.equal(F.one_hot(T(c)).data, torch.nn.functional.one_hot(c))
    assert torch.equal(F.one_hot(T(c), 7).data, torch.nn.functional.one_hot(c, 7))


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def raises_now(exc, match):
    """pytest.raises that also waits for a deferred out-of-range count (on the GPU it arrives after the launch)."""
    with pytest.raises(exc, match=match):
        yield
        ge2.check_pending_indices()


def test_errors():
    x = T(randn(4, 5, seed=32))
    with raises_now(ValueError, match=r"index: 1 index value\(s\) out of range: dim 0 has size 4"):
        x[T(idx(0, 4))]
    with raises_now(ValueError, match="index_put: 1 index value"):
        x[T(idx(-5)), 1] = 0.0
    with raises_now(ValueError, match=r"gather: 1 index value\(s\) out of range: gather indices must be in \[0, 5\)"):
        x.gather(1, T(idx([[5]])))
    with raises_now(ValueError, match="scatter_add: 2 index value"):
        ge2.scatter_add(x, 0, T(idx([[-1, 4]])), T(randn(1, 2, seed=33)))
    with raises_now(ValueError, match="index_select: 1 index value"):
        x.index_select(1, T(idx(-1)))
    with raises_now(ValueError, match=r"one_hot: 1 index value.*\[0, 3\)"):
        F.one_hot(T(idx(0, 3)), 3)
    with raises_now(IndexError, match=r"mask of shape \[3\] does not match"):
        x[T(idx(True, False, True))]
    with raises_now(IndexError, match="could not be broadcast"):
        x[T(idx(0, 1)), T(idx(0, 1, 2))]
    with raises_now(TypeError, match="integer or bool"):
        x[T(torch.zeros(2, device=DEVICE))]
    with raises_now(TypeError, match="wrap it with ge2.from_torch"):
        x[idx(0)]
    with raises_now(IndexError, match="too many indices"):
        x[T(idx(0)), 0, 0]
    with raises_now(ValueError, match=r"index larger than x|is larger than x"):
        x.gather(0, T(torch.zeros(2, 6, dtype=torch.int64, device=DEVICE)))
    with raises_now(TypeError, match="src has dtype"):
        ge2.scatter_add(x, 0, T(idx([[0]])), T(torch.ones(1, 1, dtype=torch.float64, device=DEVICE)))
    with raises_now(ValueError, match="cannot be broadcast"):
        x[T(idx(0, 1))] = T(randn(3, 5, seed=34))
    with raises_now(ValueError, match=r"value of shape \[2, 3\] cannot be broadcast to the indexed shape \[2, 1\]"):
        x[T(idx(0, 1)), 1:2] = T(randn(2, 3, seed=35))
    with raises_now(TypeError, match="int64"):
        x.gather(0, T(idx([[0]]).int()))
    with raises_now(ValueError, match="index: step must be greater than zero"):
        x[::-1, T(idx(0))]
    with raises_now(IndexError, match=r"index: index 7 is out of bounds.*tensor shape \[4, 5\]"):
        x[7, T(idx(0))] = 1.0


def test_refusals_name_op_and_argument():
    """Every documented refusal of the family on its message (the ones test_errors does not reach)."""
    x = T(randn(4, 5, seed=38))
    i = T(idx(0, 1))
    cases = [
        (TypeError, "index: a Python bool is not a supported index", lambda: x[True]),
        (TypeError, "index: a 0-d bool mask is not supported", lambda: x[T(torch.tensor(True, device=DEVICE))]),
        (IndexError, "index: at most 8 indexed dims are supported, got 9",
         lambda: T(randn(*[2] * 9, seed=39))[(T(idx(0)),) * 9]),
        (IndexError, r"index: an index can only have a single ellipsis", lambda: x[..., T(idx(0)), ...]),
        (ValueError, "gather: sparse_grad=True is not supported", lambda: x.gather(1, T(idx([[0]])), sparse_grad=True)),
        (ValueError, r"index_fill: value must be a number or a 0-d Tensor, got shape \[2\]",
         lambda: x.index_fill(0, i, T(randn(2, seed=40)))),
        (TypeError, "index_select: index must be an integer Tensor, got dtype torch.float32",
         lambda: x.index_select(0, T(randn(2, seed=41)))),
        (TypeError, "index_add: source must be a Tensor, got float", lambda: x.index_add(0, i, 1.0)),
        (TypeError, "index_copy: source has dtype torch.float64, x has torch.float32",
         lambda: x.index_copy(0, i, T(randn(2, 5, dtype=torch.float64, seed=42)))),
        (TypeError, "masked_fill: mask must be a bool Tensor, got torch.float32", lambda: x.masked_fill(x, 0.0)),
        (ValueError, r"masked_fill: mask \[3\] cannot be broadcast to x \[4, 5\]",
         lambda: x.masked_fill(T(torch.ones(3, dtype=torch.bool, device=DEVICE)), 0.0)),
        (ValueError, r"masked_fill: value must be a number or a 0-d Tensor, got shape \[5\]",
         lambda: x.masked_fill(x > 0, x[0])),
        (ValueError, r"masked_select: mask \[3\] and x \[4, 5\] do not broadcast",
         lambda: x.masked_select(T(torch.ones(3, dtype=torch.bool, device=DEVICE)))),
        (TypeError, "scatter: pass exactly one of src and value", lambda: x.scatter(0, T(idx([[0]])))),
        (ValueError, "scatter: reduce must be None, 'add' or 'multiply', got 'max'",
         lambda: x.scatter(0, T(idx([[0]])), value=1.0, reduce="max")),
        (ValueError, "scatter_reduce: reduce must be one of sum, prod, mean, amax, amin, got 'max'",
         lambda: x.scatter_reduce(0, T(idx([[0]])), x, "max")),
        (ValueError, r"take_along_dim: x \[4, 5\] and indices \[2\] must have the same number of dims",
         lambda: ge2.take_along_dim(x, i, 0)),
        (ValueError, r"take_along_dim: x \[4, 5\] and indices \[2, 3\] do not broadcast outside dim 1",
         lambda: ge2.take_along_dim(x, T(torch.zeros(2, 3, dtype=torch.int64, device=DEVICE)), 1)),
        (TypeError, "one_hot: tensor must be an int64 Tensor of class indices, got torch.int32",
         lambda: F.one_hot(T(idx(0, 1).int()))),
        (ValueError, "one_hot: cannot infer num_classes from an empty tensor",
         lambda: F.one_hot(T(torch.zeros(0, dtype=torch.int64, device=DEVICE)))),
    ]
    for exc, match, fn in cases:
        with raises_now(exc, match=match):
            fn()


# ---------------------------------------------------------------------------------------------
# property test, torch math guard, larger shapes
# ---------------------------------------------------------------------------------------------
@st.composite
def _index_case(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    key = []
    for size in shape:
        kind = draw(st.sampled_from(["slice", "int", "tensor", "list", "mask", "none"]))
        if kind == "slice":
            start = draw(st.integers(0, size - 1))
            key.append(slice(start, None, draw(st.integers(1, 2))))
        elif kind == "int":
            key.append(draw(st.integers(-size, size - 1)))
        elif kind in ("tensor", "list"):
            vals = draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=3))
            key.append(vals if kind == "list" else torch.tensor(vals, device=DEVICE))
        elif kind == "mask":
            key.append(torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)), device=DEVICE))
        else:
            key.append(None)
            key.append(slice(None))
    return shape, tuple(key)


@settings(max_examples=30, deadline=None)
@given(_index_case(), st.integers(0, 2 ** 16))
def test_property_advanced_read_write(case, seed):
    shape, key = case
    x = randn(*shape, seed=seed)
    try:
        ref = x[key]
    except IndexError:  # lists of different lengths, masks with other counts: torch refuses too
        with pytest.raises(IndexError):
            T(x)[as_ge2(key)]
        return
    assert torch.equal(T(x)[as_ge2(key)].data, ref)
    value = randn(*ref.shape[1:], seed=seed + 1)  # broadcast over the first result dim
    a, b = T(x.clone()), x.clone()
    a[as_ge2(key)] = T(value)
    b[key] = value
    # duplicate positions may keep any one of their values: compare where the key names each once
    counts = torch.zeros(x.numel(), dtype=torch.int64, device=DEVICE)
    counts.index_add_(0, torch.arange(x.numel(), device=DEVICE).reshape(x.shape)[key].reshape(-1),
                      torch.ones(ref.numel(), dtype=torch.int64, device=DEVICE))
    single = counts.reshape(x.shape) <= 1
    assert torch.equal(a.data[single], b[single])


def test_no_torch_math_in_indexing():
    x0 = randn(6, 5, seed=35)
    a = T(x0.clone()).requires_grad_()
    with torch_op_guard():
        h = a * 1.0
        h[T(idx(0, 2))] = 0.5
        y = h[T(idx(1, 1, 3)), 1:4].sum() + a.gather(1, T(idx([[0, 0], [4, 1]]))).sum()
        y = y + ge2.scatter_add(a, 0, T(idx([[1, 1, 1, 1, 1]])), a).sum() + a.index_select(0, T(idx(5, 5))).sum()
        y.backward()


@pytest.mark.skipif(not LARGE, reason="larger shapes on the GPU only")
def test_large_shapes_and_deferred_check():
    V, D, N = 20000, 768, 8191
    x = randn(V, D, seed=36)
    ids = torch.randint(-V, V, (N,), device=DEVICE)
    assert torch.equal(T(x)[T(ids)].data, x[ids])
    assert torch.equal(T(x).index_select(0, T(ids % V)).data, x.index_select(0, ids % V))
    src = randn(N, D, seed=37)
    out = ge2.scatter_add(T(torch.zeros(V, D, device=DEVICE)), 0, T((ids % V)[:, None].expand(N, D)), T(src))
    ref = torch.zeros(V, D, device=DEVICE).scatter_add(0, (ids % V)[:, None].expand(N, D), src)
    ref64 = torch.zeros(V, D, device=DEVICE, dtype=torch.float64).scatter_add(0, (ids % V)[:, None].expand(N, D),
                                                                              src.double())
    assert_matches(out.data, ref64, ref)
    if torch.cuda.is_available():  # out of range on the GPU: no host sync at the call, raised later
        T(x)[T(idx(V))]
        with pytest.raises(ValueError, match="found by an earlier call"):
            ge2.check_pending_indices()
