"""GEMM epilogue ops ("gemm", "gemm_backward") against float64 references and torch autograd.

Every act x bias kind x trans_a x trans_b combination runs forward and backward on tiny odd
shapes (the interpreter's budget); the precision tests (fp32 ieee/tf32, bf16, fp16) judge the
error against torch's own in the same mode, on larger shapes when ``numerics.LARGE``.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import ge2
from ge2.backend import call
from ge2.backend.torch_backend.elementwise import _ACT
from ge2.kernels import gemm as gemm_kernels
from ge2.kernels.activations import ACTIVATIONS, act_code, needs_z
from tests.numerics import DEVICE, LARGE, assert_matches, randn, rel_error

BIAS_KINDS = ("none", "scalar", "per_m", "per_n")
# (M, N, K): odd sizes, size-1 dims, one shape over the interpreter's 32-wide tiles in every dim.
SHAPES = [(7, 5, 3), (1, 9, 4), (6, 1, 5), (33, 17, 65), (5, 8, 1), (3, 40, 7)]
COMBOS = list(itertools.product(ACTIVATIONS, BIAS_KINDS, (False, True), (False, True)))


def _operand(rows: int, cols: int, trans: bool, *, dtype=torch.float32, noncontig=False, seed=None, batch=None):
    """A tensor whose op(...) is [rows, cols]: stored [cols, rows] when ``trans``."""
    shape = (cols, rows) if trans else (rows, cols)
    if batch is not None:
        shape = (batch, *shape)
    return randn(*shape, dtype=dtype, noncontig=noncontig, seed=seed)


def _bias(kind: str, M: int, N: int, dtype=torch.float32, seed=None):
    n = {"none": 0, "scalar": 1, "per_m": M, "per_n": N}[kind]
    return randn(n, dtype=dtype, seed=seed) if n else None


def _reference(a, b, c, bias, *, trans_a, trans_b, alpha, beta, bias_kind, act, act_alpha, dtype=None):
    """(y, z) of the same expression with torch ops (in ``dtype``, default the inputs' dtype)."""
    dtype = dtype or a.dtype
    op_a = a.to(dtype).transpose(-1, -2) if trans_a else a.to(dtype)
    op_b = b.to(dtype).transpose(-1, -2) if trans_b else b.to(dtype)
    z = alpha * (op_a @ op_b)
    if c is not None and beta != 0.0:
        z = z + beta * c.to(dtype)
    if bias_kind == "scalar":
        z = z + bias.to(dtype).reshape(())
    elif bias_kind == "per_m":
        z = z + bias.to(dtype)[:, None]
    elif bias_kind == "per_n":
        z = z + bias.to(dtype)
    return _ACT[act](z, act_alpha), z


def _case(i: int, act: str, bias_kind: str, trans_a: bool, trans_b: bool, dtype=torch.float32):
    """Inputs for combination ``i``: shapes cycle through SHAPES; every other case is strided and has C."""
    M, N, K = SHAPES[i % len(SHAPES)]
    noncontig = i % 2 == 1
    a = _operand(M, K, trans_a, dtype=dtype, noncontig=noncontig, seed=i)
    b = _operand(K, N, trans_b, dtype=dtype, noncontig=not noncontig, seed=1000 + i)
    c = randn(M, N, dtype=dtype, seed=2000 + i) if noncontig else None
    attrs = dict(trans_a=trans_a, trans_b=trans_b, alpha=0.75 if noncontig else 1.0, beta=-0.5 if noncontig else 0.0,
                 bias_kind=bias_kind, act=act, act_alpha=0.05 if act == "leaky_relu" and noncontig else 0.01)
    return a, b, c, _bias(bias_kind, M, N, dtype, seed=3000 + i), attrs


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act,bias_kind,trans_a,trans_b", COMBOS)
def test_forward_every_combination(act, bias_kind, trans_a, trans_b):
    i = COMBOS.index((act, bias_kind, trans_a, trans_b))
    a, b, c, bias, attrs = _case(i, act, bias_kind, trans_a, trans_b)
    y, z = call("gemm", a, b, c, bias, save_z=True, **attrs)
    y64, z64 = _reference(a, b, c, bias, dtype=torch.float64, **attrs)
    y32, _ = _reference(a, b, c, bias, **attrs)
    assert y.shape == y64.shape and y.is_contiguous() and y.dtype == a.dtype
    assert_matches(y, y64, y32, name=f"y[{act},{bias_kind}]")
    if needs_z(act_code("test", act)):
        assert_matches(z, z64, name="z")
        # Y == act(Z): the epilogue applies act to exactly the Z it stores.
        assert rel_error(y, _ACT[act](z.double(), attrs["act_alpha"])) <= 2e-6
    else:
        assert z is None  # act' comes from Y: no Z stash


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("act,bias_kind,trans_a,with_c", [("gelu", "per_n", False, True), ("relu", "per_m", True, False),
                                                          ("none", "scalar", False, False)])
def test_split_k(act, bias_kind, trans_a, with_c, dtype, monkeypatch):
    """Few output tiles and a long K: K is split over programs whose fp32 partials are added in a
    second pass with the epilogue; chunk edges and a short last chunk included."""
    if LARGE:  # the first FC layer of the training benchmark's CNN, at the real thresholds
        M, N, K = 64, 128, 3136
    else:  # the interpreter's 32-deep steps: chunks of 32, the last one 4 long
        monkeypatch.setattr(gemm_kernels, "SPLIT_K_MIN_K", 16)
        monkeypatch.setattr(gemm_kernels, "SPLIT_K_CHUNK", 32)
        M, N, K = 5, 9, 100
    splits, chunk = gemm_kernels._split_k(M, N, K, 1, DEVICE)
    assert splits > 1 and (splits - 1) * chunk < K <= splits * chunk, (splits, chunk)
    a = _operand(M, K, trans_a, dtype=dtype, noncontig=True, seed=5)
    b = _operand(K, N, True, dtype=dtype, seed=6)
    c = randn(M, N, dtype=dtype, seed=7) if with_c else None
    bias = _bias(bias_kind, M, N, dtype, seed=8)
    attrs = dict(trans_a=trans_a, trans_b=True, alpha=0.5, beta=0.25 if with_c else 0.0, bias_kind=bias_kind,
                 act=act, act_alpha=0.01)
    y, z = call("gemm", a, b, c, bias, save_z=True, **attrs)
    y64, z64 = _reference(a, b, c, bias, dtype=torch.float64, **attrs)
    y_torch, _ = _reference(a, b, c, bias, **attrs)
    assert y.shape == (M, N) and y.dtype == dtype
    assert_matches(y, y64, y_torch, name=f"split-k y {dtype}")
    if z is not None:
        assert_matches(z, z64, name="split-k z")


def test_forward_batched_broadcast_and_strided():
    B, M, N, K = 3, 9, 6, 13
    a = randn(B, M, K, noncontig=True, seed=1)
    w = randn(N, K, seed=2)  # one weight for every batch entry, transposed, batch stride 0
    b = w.expand(B, N, K)
    bias = randn(N, seed=3)
    y, z = call("gemm", a, b, None, bias, trans_b=True, bias_kind="per_n", act="silu", save_z=True)
    y64, z64 = _reference(a, b, None, bias, trans_a=False, trans_b=True, alpha=1.0, beta=0.0,
                          bias_kind="per_n", act="silu", act_alpha=0.01, dtype=torch.float64)
    y32, _ = _reference(a, b, None, bias, trans_a=False, trans_b=True, alpha=1.0, beta=0.0,
                        bias_kind="per_n", act="silu", act_alpha=0.01)
    assert y.shape == (B, M, N)
    assert_matches(y, y64, y32, name="y")
    assert_matches(z, z64, name="z")


def test_forward_matches_torch_backend():
    a, b, c, bias, attrs = _case(3, "gelu", "per_m", True, False)
    y, z = call("gemm", a, b, c, bias, save_z=True, **attrs)
    with ge2.use_backend("torch"):
        yt, zt = call("gemm", a, b, c, bias, save_z=True, **attrs)
    assert rel_error(y, yt) <= 2e-6 and rel_error(z, zt) <= 2e-6


def test_beta_zero_ignores_c():
    a, b = randn(5, 4, seed=1), randn(4, 3, seed=2)
    c = torch.full((5, 3), float("nan"), device=DEVICE)
    y, _ = call("gemm", a, b, c, beta=0.0)
    assert torch.isfinite(y).all()


def test_out_dtype():
    a, b = randn(7, 5, dtype=torch.bfloat16, seed=1), randn(5, 3, dtype=torch.bfloat16, seed=2)
    y, _ = call("gemm", a, b, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    assert_matches(y, a.double() @ b.double(), name="y")


# ---------------------------------------------------------------------------------------------
# Backward: gradients vs torch autograd of the same expression
# ---------------------------------------------------------------------------------------------
def _autograd(a, b, c, bias, gy, dtype, attrs):
    """Gradients (da, db, dbias, dc) of the expression by torch autograd, computed in ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None for t in (a, b, bias, c)]
    la, lb, lbias, lc = leaves
    y, _ = _reference(la, lb, lc, lbias, **attrs)
    wrt = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, wrt, gy.to(dtype)))
    return tuple(next(grads) if t is not None else None for t in (la, lb, lbias, lc))


def _check_backward(a, b, c, bias, attrs, *, seed, noncontig_gy=False, name=""):
    """gemm_backward on gemm's own outputs, judged two ways.

    1. The op on its inputs (gy, a, b and the saved z or y): error vs the float64 evaluation of
       the same inputs <= 2x the error of torch doing the same in the inputs' dtype. (act' read
       from a rounded y is ill-conditioned where |tanh| or sigmoid saturate: this compares like
       with like.)
    2. In float64 end to end (forward + backward), the gradients equal torch autograd's of the
       same expression (to the fp32 rounding of the epilogue's constants): this is what proves
       the formulas, strides and reductions right.
    """
    y, z = call("gemm", a, b, c, bias, save_z=True, **attrs)
    gy = randn(*y.shape, dtype=y.dtype, noncontig=noncontig_gy, seed=seed)
    saved_y = None if z is not None else y
    inputs = (gy, a, b, z, saved_y)
    got = call("gemm_backward", *inputs, has_c=c is not None, **attrs)
    with ge2.use_backend("torch"):
        theirs = call("gemm_backward", *inputs, has_c=c is not None, **attrs)
        exact = call("gemm_backward", *[t.double() if t is not None else None for t in inputs],
                     has_c=c is not None, **attrs)
    for label, g, want, t in zip(("da", "db", "dbias", "dc"), got, exact, theirs):
        assert (g is None) == (want is None), f"{label}: {g is None=} but reference {want is None=}"
        if g is not None:
            assert g.is_contiguous() and g.shape == want.shape
            assert_matches(g, want, t, name=f"{name} {label}")

    as64 = [t.double() if t is not None else None for t in (a, b, c, bias)]
    y64, z64 = call("gemm", *as64, save_z=True, **attrs)
    got64 = call("gemm_backward", gy.double(), as64[0], as64[1], z64, None if z64 is not None else y64,
                 has_c=c is not None, **attrs)
    autograd = _autograd(*as64[:2], as64[2], as64[3], gy, torch.float64, attrs)
    for label, g, want in zip(("da", "db", "dbias", "dc"), got64, autograd):
        assert (g is None) == (want is None), label
        if g is not None:
            # Not 1e-15: the epilogue's scalars (act_alpha, the gelu constants) are fp32 literals
            # even in fp64 kernels. A wrong formula, stride or reduction is off by O(1).
            assert rel_error(g.reshape(want.shape), want) <= 1e-6, f"{name} {label} vs autograd"


@pytest.mark.parametrize("act,bias_kind,trans_a,trans_b", COMBOS)
def test_backward_every_combination(act, bias_kind, trans_a, trans_b):
    i = COMBOS.index((act, bias_kind, trans_a, trans_b))
    a, b, c, bias, attrs = _case(i, act, bias_kind, trans_a, trans_b)
    _check_backward(a, b, c, bias, attrs, seed=4000 + i, noncontig_gy=i % 3 == 0, name=f"[{act},{bias_kind}]")


@pytest.mark.parametrize("broadcast", ["a", "b"])
def test_backward_batched_broadcast(broadcast):
    B, M, N, K = 3, 7, 5, 9
    if broadcast == "b":  # x @ W^T with one W expanded over the batch: dW is summed over it
        a, b = randn(B, M, K, noncontig=True, seed=1), randn(N, K, seed=2).expand(B, N, K)
        attrs = dict(trans_a=False, trans_b=True)
    else:
        a, b = randn(K, M, seed=3).expand(B, K, M), randn(B, K, N, seed=4)
        attrs = dict(trans_a=True, trans_b=False)
    attrs.update(alpha=1.0, beta=0.0, bias_kind="per_m", act="gelu_tanh", act_alpha=0.01)
    bias = randn(M, seed=5)
    y, z = call("gemm", a, b, None, bias, save_z=True, **attrs)
    gy = randn(B, M, N, seed=6)
    da, db, dbias, _ = call("gemm_backward", gy, a, b, z, **attrs)
    ga, gb, gbias, _ = _autograd(a, b, None, bias, gy, torch.float64, attrs)
    ta, tb, tbias, _ = _autograd(a, b, None, bias, gy, torch.float32, attrs)
    reduce = lambda t, g: g.sum(0, keepdim=True) if t.stride(0) == 0 else g  # autograd of expand
    assert (da.shape[0], db.shape[0]) == ((1, B) if broadcast == "a" else (B, 1))
    assert_matches(da, reduce(a, ga), reduce(a, ta), name="da")
    assert_matches(db, reduce(b, gb), reduce(b, tb), name="db")
    assert_matches(dbias, gbias, tbias, name="dbias")


def test_backward_matches_torch_backend_and_is_deterministic():
    M, N, K = (2048, 1536, 512) if LARGE else (70, 90, 20)
    a, b, bias = randn(M, K, seed=1), randn(K, N, seed=2), randn(N, seed=3)
    attrs = dict(bias_kind="per_n", act="silu")
    y, z = call("gemm", a, b, None, bias, save_z=True, **attrs)
    gy = randn(M, N, seed=4)
    first = call("gemm_backward", gy, a, b, z, **attrs)
    again = call("gemm_backward", gy, a, b, z, **attrs)
    assert all(torch.equal(x, w) for x, w in zip(first[:3], again[:3])), "run-to-run difference"
    with ge2.use_backend("torch"):
        oracle = call("gemm_backward", gy, a, b, z, **attrs)
    for label, x, w in zip(("da", "db", "dbias"), first, oracle):
        assert rel_error(x, w) <= 1e-5, label


@pytest.mark.parametrize("trans_b", [False, True])
def test_backward_db_dtype_writes_the_fp32_weight_gradient(trans_b):
    """bf16 operands, db_dtype=float32 (an autocast weight's gradient): db leaves the fp32 accumulator unrounded,
    at least as close to float64 as torch's bf16 gradient rounded up, and da keeps a's dtype."""
    M, N, K = (1000, 300, 200) if LARGE else (33, 20, 17)
    a64, gy64 = randn(M, K, dtype=torch.float64, seed=5), randn(M, N, dtype=torch.float64, seed=6)
    b64 = randn(N, K, dtype=torch.float64, seed=7) if trans_b else randn(K, N, dtype=torch.float64, seed=7)
    a, b, gy = (t.to(torch.bfloat16) for t in (a64, b64, gy64))
    da, db, _, _ = call("gemm_backward", gy, a, b, trans_b=trans_b, db_dtype=torch.float32)
    assert (da.dtype, db.dtype, tuple(db.shape)) == (torch.bfloat16, torch.float32, tuple(b.shape))
    ref = a.double().T @ gy.double()  # the exact gradient of the bf16 operands
    ref = ref.T if trans_b else ref
    theirs = (a.T @ gy).float()  # torch's bf16 GEMM, then the cast autocast's copy would do
    assert_matches(db, ref, theirs.T if trans_b else theirs, name="db in fp32")
    # fp32 sums of exact bf16 products: ~1e-6 (tensor cores' truncating fp32 adds: up to ~1e-4 at K = 1000);
    # a result rounded to bf16 on the way would be ~2e-3 off
    assert rel_error(db, ref) <= 2e-4
    with pytest.raises(TypeError, match="gemm_backward: db_dtype must be one of"):
        call("gemm_backward", gy, a, b, trans_b=trans_b, db_dtype=torch.int32)


def test_backward_need_flags_and_scalar_bias_total():
    a, b, bias = randn(6, 4, seed=1), randn(4, 5, seed=2), randn(1, seed=3)
    gy = randn(6, 5, seed=4)
    da, db, dbias, dc = call("gemm_backward", gy, a, b, bias_kind="scalar", need_a=False, need_b=False)
    assert da is None and db is None and dc is None
    assert dbias.shape == (1,) and abs(dbias.item() - gy.double().sum().item()) <= 1e-5 * gy.abs().sum().item()


@pytest.mark.parametrize("args,attrs,message", [
    ((randn(4, 5), randn(4, 3), randn(3, 5)), {"act": "gelu"}, "the gelu gradient needs z"),
    ((randn(4, 5), randn(4, 3), randn(3, 5)), {"act": "relu"}, "needs z or y"),
    ((randn(5, 4), randn(4, 3), randn(3, 5)), {}, "gy has shape [5, 4]"),
    ((randn(4, 5), randn(4, 3), randn(3, 5), randn(4, 4)), {"act": "silu"}, "z has shape [4, 4]"),
    ((randn(4, 5), randn(4, 3), randn(2, 5)), {}, "inner dimensions differ"),
])
def test_backward_bad_input(args, attrs, message):
    with pytest.raises(ValueError) as info:
        call("gemm_backward", *args, **attrs)
    assert str(info.value).startswith("gemm_backward:") and message in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------
# Precision modes: error vs float64 <= 2x torch's own error in the same mode
# ---------------------------------------------------------------------------------------------
PRECISION_CASES = [(torch.float32, "ieee"), (torch.float32, "tf32"), (torch.float32, "tf32x3"),
                   (torch.bfloat16, "ieee"), (torch.float16, "ieee")]


@pytest.mark.parametrize("dtype,precision", PRECISION_CASES)
def test_precision_modes(dtype, precision):
    M, N, K = (1031, 771, 1283) if LARGE else (37, 29, 45)
    a = _operand(M, K, True, dtype=dtype, seed=11)
    b = _operand(K, N, False, dtype=dtype, seed=12)
    bias = _bias("per_n", M, N, dtype, seed=13)
    attrs = dict(trans_a=True, trans_b=False, alpha=1.0, beta=0.0, bias_kind="per_n", act="gelu", act_alpha=0.01)
    old = ge2.set_matmul_precision(precision)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        y, z = call("gemm", a, b, None, bias, save_z=True, **attrs)
        # torch's own result in the same mode: tf32 on cuBLAS, 16-bit operands with fp32
        # accumulation; tf32x3 is ge2's default fp32 mode, so it is held to cuBLAS's full fp32.
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        y_torch, z_torch = _reference(a, b, None, bias, **attrs)
    finally:
        ge2.set_matmul_precision(old)
        torch.backends.cuda.matmul.allow_tf32 = tf32
    y64, z64 = _reference(a, b, None, bias, dtype=torch.float64, **attrs)
    assert_matches(z, z64, z_torch, name=f"z {dtype} {precision}")
    assert_matches(y, y64, y_torch, name=f"y {dtype} {precision}")


@pytest.mark.parametrize("precision", ["tf32x3", "tf32", "ieee"])
def test_tf32x3_special_values(precision):
    """inf, NaN, values near the fp32 maximum and denormals come out where torch's fp32 puts them:
    tf32x3 splits each operand into hi + lo, and inf - inf would be NaN if the split were naive."""
    n = 256 if LARGE else 40
    a, b = randn(n, n, seed=41), randn(n, n, seed=42)
    a[3, 5], a[7, 9], a[20, 20], b[11, 2], b[5, 30] = float("inf"), 3.0e38, 1e-40, -float("inf"), float("nan")
    old = ge2.set_matmul_precision(precision)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        y, _ = call("gemm", a, b)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        ref = a @ b
    finally:
        ge2.set_matmul_precision(old)
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), "NaN pattern differs from torch's"
    assert torch.equal(torch.isinf(y) & (y > 0), torch.isinf(ref) & (ref > 0)), "+inf pattern differs"
    assert torch.equal(torch.isinf(y) & (y < 0), torch.isinf(ref) & (ref < 0)), "-inf pattern differs"
    finite = torch.isfinite(ref)
    assert finite.sum() > n * n // 2  # most entries stay finite: the comparison below means something
    if precision != "tf32":
        assert rel_error(y[finite], ref[finite]) <= 1e-5


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("dtype,precision", [(torch.bfloat16, "ieee"), (torch.float32, "tf32")])
def test_layouts_forward_backward(dtype, precision, trans_a, trans_b, monkeypatch):
    """Every operand layout at a size that takes the GPU's tuned paths (TMA: 16-byte rows; tf32
    backward: operands copied K-major)."""
    M, N, K = (1000, 520, 776) if LARGE else (37, 29, 45)
    if ge2.is_interpreter():  # take the large-problem paths (the K-major copies) at this size too
        monkeypatch.setattr(gemm_kernels, "SMALL_PROBLEM", 0)
        monkeypatch.setattr(gemm_kernels, "KMAJOR_COPY_MIN", 0)
    a = _operand(M, K, trans_a, dtype=dtype, seed=21)
    b = _operand(K, N, trans_b, dtype=dtype, seed=22)
    c, bias = randn(M, N, dtype=dtype, seed=23), _bias("per_m", M, N, dtype, seed=24)
    attrs = dict(trans_a=trans_a, trans_b=trans_b, alpha=0.5, beta=0.25, bias_kind="per_m", act="gelu",
                 act_alpha=0.01)
    old = ge2.set_matmul_precision(precision)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        y, z = call("gemm", a, b, c, bias, save_z=True, **attrs)
        gy = randn(M, N, dtype=dtype, seed=25)
        grads = call("gemm_backward", gy, a, b, z, has_c=True, **attrs)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        y_torch, _ = _reference(a, b, c, bias, **attrs)
        with ge2.use_backend("torch"):
            grads_torch = call("gemm_backward", gy, a, b, z, has_c=True, **attrs)
    finally:
        ge2.set_matmul_precision(old)
        torch.backends.cuda.matmul.allow_tf32 = tf32
    y64, _ = _reference(a, b, c, bias, dtype=torch.float64, **attrs)
    assert_matches(y, y64, y_torch, name="y")
    with ge2.use_backend("torch"):
        exact = call("gemm_backward", gy.double(), a.double(), b.double(), z.double(), has_c=True, **attrs)
    for label, g, want, theirs in zip(("da", "db", "dbias", "dc"), grads, exact, grads_torch):
        assert_matches(g, want, theirs, name=label)


def _round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to nearest (ties to even) at tf32's 10 mantissa bits (finite inputs)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0xFFF + ((bits >> 13) & 1)) & -0x2000).view(torch.float32)


def _without_tf32_ties(t: torch.Tensor) -> torch.Tensor:
    """t with its lowest mantissa bit set: no value lies halfway between two tf32 numbers, so every
    round-to-nearest (ties to even as TMA, away as cuBLAS) gives the same operands."""
    return (t.contiguous().view(torch.int32) | 1).view(torch.float32)


TMA_CONFIGS = gemm_kernels.TMA_CONFIGS_16BIT + gemm_kernels.TMA_CONFIGS_FP32


def only_config(kernel, cfg, monkeypatch) -> None:
    """Leave cfg the only config of an autotuned kernel, and forget its earlier picks (in one
    process, another config's)."""
    for name, value in (("configs", [cfg]), ("best_config", None), ("cache", {}), ("_fast", {})):
        monkeypatch.setattr(kernel, name, value, raising=name != "best_config")


def _tma_case(cfg, monkeypatch, M: int, N: int, K: int, seed: int):
    """(fp32, x [M, K], W [N, K], bias [N], Linear+gelu attrs) in cfg's dtype, with only cfg left to run
    (and the picks of earlier calls of this shape forgotten: in one process, another config's)."""
    fp32 = cfg in gemm_kernels.TMA_CONFIGS_FP32
    dtype = torch.float32 if fp32 else torch.bfloat16
    only_config(gemm_kernels.gemm_tma_kernel, cfg, monkeypatch)
    monkeypatch.setattr(gemm_kernels._gemm_ws(), "USE_WS", False)  # these shapes would go to the Gluon kernel
    x, w = randn(M, K, dtype=dtype, seed=seed), randn(N, K, dtype=dtype, seed=seed + 1)
    if fp32:  # for the tf32-rounding check: no operand exactly between two tf32 values
        x, w = _without_tf32_ties(x), _without_tf32_ties(w)
    attrs = dict(trans_a=False, trans_b=True, alpha=1.0, beta=0.0, bias_kind="per_n", act="gelu", act_alpha=0.01)
    return fp32, x, w, randn(N, dtype=dtype, seed=seed + 2), attrs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the TMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("index", range(len(TMA_CONFIGS)))
def test_tma_every_config(index, monkeypatch):
    """Each TMA config alone (tuning picks any of them), with more tiles than programs and ragged
    edges in M, N and K. fp32-tf32: the operands must reach the tensor cores rounded to nearest tf32
    (by the copy engine): z equals float64 arithmetic on the rounded operands to fp32 accumulation
    error, ~100x below what truncated (or unrounded) operands give."""
    if gemm_kernels._tma_sms(torch.device("cuda")) == 0:
        pytest.skip("no TMA before Hopper")
    cfg = TMA_CONFIGS[index]
    fp32, x, w, bias, attrs = _tma_case(cfg, monkeypatch, 3000, 1560, 776, seed=31)
    old = ge2.set_matmul_precision("tf32")
    try:
        y, z = call("gemm", x, w, None, bias, save_z=True, **attrs)
    finally:
        ge2.set_matmul_precision(old)
    assert gemm_kernels.gemm_tma_kernel.best_config is cfg, "the TMA kernel did not run"
    # Y == act(Z); in bf16 both are roundings of the same fp32 z, so they agree to a bf16 ulp.
    assert rel_error(y, _ACT["gelu"](z.double(), 0.01)) <= (2e-6 if fp32 else 2 ** -8)
    if fp32:
        _, z_rounded = _reference(_round_to_tf32(x), _round_to_tf32(w), None, bias, dtype=torch.float64, **attrs)
        assert rel_error(z, z_rounded) <= 1e-5, "operands not rounded to nearest tf32"
    else:
        y64, _ = _reference(x, w, None, bias, dtype=torch.float64, **attrs)
        y_torch, _ = _reference(x, w, None, bias, **attrs)
        assert_matches(y, y64, y_torch, name=f"y bf16 config {index}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the TMA kernel runs on Hopper GPUs only")
@pytest.mark.parametrize("index", range(len(TMA_CONFIGS)))
@pytest.mark.parametrize("waves", ["one wave and a tail", "fewer tiles than SMs"])
def test_tma_split_tail(index, waves, monkeypatch):
    """Each TMA config on a long, ragged K and either a full wave plus 20-27 tiles or only 32 tiles:
    those tiles are split along K (gemm_kernels.SPLIT_TAIL_MIN_K) over every SM, their partials
    summed by whichever program arrives last. Epilogue (bias, gelu, z) on the summed tiles, ragged
    M and N, and the same bits on every call (the partials are added in split order whoever sums
    them; a tile some program never finished would leave the output's old bytes)."""
    sms = gemm_kernels._tma_sms(torch.device("cuda"))
    if sms == 0:
        pytest.skip("no TMA before Hopper")
    cfg = TMA_CONFIGS[index]
    bm, bn, bk = (cfg.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    tiles_m = 8
    if waves == "one wave and a tail":
        tiles_n = (sms + 20) // tiles_m + 1
    elif bm * bn < 128 * 128:  # 64x64 tiles: fewer than SMs would also be too few for the TMA path
        pytest.skip("as few 64x64 tiles as this go to split-K (gemm._split_k), not to the TMA kernel")
    else:  # 16-32 tiles, more 64x64 ones than split-K takes
        tiles_n = 4 * 128 * 128 // (bm * bn)
    M, N, K = tiles_m * bm - 5, tiles_n * bn - 7, 2104  # K: 16-byte rows (TMA), ragged against BLOCK_K
    left, k_tiles = (tiles_m * tiles_n) % sms, -(-K // bk)
    if not gemm_kernels._split_tail_on(M, N, K, sms):
        pytest.skip("a wave of tiles this large is more than the split tail considers")
    pieces = min(sms // left, k_tiles // gemm_kernels.SPLIT_TAIL_MIN_K_TILES.value)  # as gemm._tail_splits
    assert 0 < 2 * left <= sms and pieces > 1, "the shape must take the split tail"
    fp32, x, w, bias, attrs = _tma_case(cfg, monkeypatch, M, N, K, seed=41)
    old = ge2.set_matmul_precision("tf32")
    try:
        y, z = call("gemm", x, w, None, bias, save_z=True, **attrs)
        y2, z2 = (torch.full_like(t, float("nan")) for t in (y, z))  # no tile may be left unwritten
        gemm_kernels._launch(gemm_kernels._view(x, False), gemm_kernels._view(w, True), y2, z=z2, bias=bias,
                             bias_kind=gemm_kernels.BIAS_KINDS["per_n"], act=act_code("gemm", "gelu", 0.01))
    finally:
        ge2.set_matmul_precision(old)
    assert gemm_kernels.gemm_tma_kernel.best_config is cfg, "the TMA kernel did not run"
    assert torch.equal(y, y2) and torch.equal(z, z2), "the split tail is not deterministic"
    if fp32:  # float64 arithmetic on the tf32-rounded operands, to fp32 accumulation error
        _, z_rounded = _reference(_round_to_tf32(x), _round_to_tf32(w), None, bias, dtype=torch.float64, **attrs)
        assert rel_error(z, z_rounded) <= 1e-5
    else:
        (y64, z64), (y_torch, z_torch) = (_reference(x, w, None, bias, dtype=torch.float64, **attrs),
                                          _reference(x, w, None, bias, **attrs))
        assert_matches(y, y64, y_torch, name=f"y bf16 config {index}")
        assert_matches(z, z64, z_torch, name=f"z bf16 config {index}")


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error naming the op and the argument
# ---------------------------------------------------------------------------------------------
def _bad_inputs():
    a, b = randn(4, 3, seed=1), randn(3, 5, seed=2)
    return [
        ((a, randn(4, 5)), {}, ValueError, "inner dimensions differ"),
        ((a, b.t()), {"trans_b": False}, ValueError, "inner dimensions differ"),
        ((a, b, None, randn(4)), {"bias_kind": "per_n"}, ValueError, "bias_kind 'per_n' needs a bias of [5]"),
        ((a, b, None, randn(5)), {"bias_kind": "per_m"}, ValueError, "bias_kind 'per_m' needs a bias of [4]"),
        ((a, b, None, randn(2)), {"bias_kind": "scalar"}, ValueError, "needs a bias of 1 element"),
        ((a, b, None, randn(5)), {}, ValueError, "bias_kind is 'none'"),
        ((a, b), {"bias_kind": "per_n"}, ValueError, "bias is None"),
        ((a, b, None, randn(5)), {"bias_kind": "per_col"}, ValueError, "bias_kind must be one of"),
        ((a, b.double()), {}, TypeError, "same dtype"),
        ((a.int(), b), {}, TypeError, "a has dtype int32"),
        ((randn(3), b), {}, ValueError, "a must be 2-D or 3-D, got shape [3]"),
        ((a, randn(2, 3, 5)), {}, ValueError, "must both be 2-D or both 3-D"),
        ((randn(2, 4, 3), randn(3, 3, 5)), {}, ValueError, "batch sizes differ"),
        ((a, b, randn(5, 4)), {"beta": 1.0}, ValueError, "c has shape [5, 4]"),
        ((a, b), {"act": "swish"}, ValueError, "unknown activation 'swish'"),
        ((a, b), {"act": "leaky_relu", "act_alpha": 0.0}, ValueError, "slope must be > 0"),
        ((a, b.to("meta")), {}, ValueError, "b is on meta"),
    ]


@pytest.mark.parametrize("inputs,attrs,error,message", _bad_inputs())
def test_bad_input(inputs, attrs, error, message):
    with pytest.raises(error) as info:
        call("gemm", *inputs, **attrs)
    assert str(info.value).startswith("gemm:") and message in str(info.value), str(info.value)


@pytest.mark.parametrize("rows, length", [(700, 40), (5, 300), (300, 4100), (1, 1)])
def test_sum_partials_one_and_two_levels(rows, length):
    # Many rows of a short length (a conv's bias gradient) add 128-row chunks first, then the chunks.
    part = randn(rows, length, seed=rows + length)
    out = torch.empty(length, dtype=torch.float32, device=DEVICE)
    gemm_kernels.sum_partials(part, out)
    torch.testing.assert_close(out.double(), part.double().sum(0), rtol=1e-5, atol=1e-5)
    again = torch.empty_like(out)
    gemm_kernels.sum_partials(part, again)
    assert torch.equal(out, again)  # a fixed order
