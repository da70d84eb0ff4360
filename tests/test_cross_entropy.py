"""Fused cross-entropy and linear_cross_entropy against float64 references and torch.

Every reduction x weight x label_smoothing combination, with ignored rows, on [N, C] and
[N, C, d1, d2] logits, class counts 1, 7 and ~1000 (33000 and 128256 on the GPU: the split
path there, cooperative; under the interpreter the split path is forced with a small register
limit or an explicit slice width, and runs as two launches).
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from ge2.backend import call
from ge2.kernels import cross_entropy as K
from tests.numerics import DEVICE, LARGE, assert_matches, randn


def _targets(shape, n_classes, *, seed, ignore_every=3, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, n_classes, shape, generator=g)
    if ignore_every:
        t.view(-1)[::ignore_every] = ignore_index
    return t.to(DEVICE)


def _torch_ce(logits, target, weight, **kw):
    """(loss, dlogits for gy = 1) from torch autograd, in logits' dtype."""
    x = logits.detach().requires_grad_()
    w = weight.to(logits.dtype) if weight is not None else None
    loss = TF.cross_entropy(x, target, weight=w, **kw)
    (g,) = torch.autograd.grad(loss, x, torch.ones_like(loss))
    return loss.detach(), g


def _check(logits, target, weight=None, *, max_fused_c=None, split_config=None, persistent_warps=None,
           two_pass_config=None, **kw):
    loss, grad = K.cross_entropy_fwd_bwd(logits, target, weight=weight, max_fused_c=max_fused_c,
                                         split_config=split_config, persistent_warps=persistent_warps,
                                         two_pass_config=two_pass_config, **kw)
    loss64, grad64 = _torch_ce(logits.double(), target, weight.double() if weight is not None else None, **kw)
    loss_t, grad_t = _torch_ce(logits, target, weight, **kw)
    assert loss.dtype == logits.dtype and grad.shape == logits.shape
    assert_matches(loss, loss64, loss_t, name="loss")
    assert_matches(grad, grad64, grad_t, name="dlogits")
    return loss, grad


COMBOS = list(itertools.product(("mean", "sum", "none"), (False, True), (0.0, 0.15)))


@pytest.mark.parametrize("reduction,weighted,smoothing", COMBOS)
def test_every_option_combination(reduction, weighted, smoothing):
    C = 7
    x = randn(9, C, seed=1)
    w = (randn(C, seed=2).abs() + 0.3) if weighted else None
    _check(x, _targets((9,), C, seed=3), w, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("reduction,weighted,smoothing", COMBOS[::2])
def test_spatial_logits_and_split_path(reduction, weighted, smoothing):
    # [N, C, d1, d2]: the class dim is not last (strided rows); the split path via a 16-wide limit.
    C = 37
    x = randn(2, C, 3, 2, seed=4)
    w = (randn(C, seed=5).abs() + 0.3) if weighted else None
    t = _targets((2, 3, 2), C, seed=6)
    _check(x, t, w, reduction=reduction, label_smoothing=smoothing)
    _check(x, t, w, reduction=reduction, label_smoothing=smoothing, max_fused_c=16)


@pytest.mark.parametrize("C", [1, 7, 1000] + ([32768, 33000, 128256] if LARGE else []))
def test_class_counts(C):
    n = 3 if C <= 1000 else 64
    _check(randn(n, C, seed=C), _targets((n,), C, seed=7, ignore_every=0), label_smoothing=0.1)


@pytest.mark.skipif(not LARGE, reason="rows of 32768 classes")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_persistent_rows_of_32768_classes(dtype):
    # 700 rows, every 5th ignored: the programs (as many as fit) loop over rows with ignored rows between.
    x = randn(700, 32768, dtype=dtype, seed=57) * 2
    t = _targets((700,), 32768, seed=58, ignore_every=5)
    _check(x, t, persistent_warps=32)
    _check(x, t, persistent_warps=16, reduction="sum", label_smoothing=0.1)


def test_split_path_long_rows_with_options():
    x = randn(4, 1000, noncontig=True, seed=8) * 20
    w = randn(1000, seed=9).abs() + 0.1
    _check(x, _targets((4,), 1000, seed=10, ignore_every=4), w, label_smoothing=0.2, max_fused_c=128)


@pytest.mark.parametrize("path", [dict(split_config=(16, 1)), dict(two_pass_config=(16, 1))],
                         ids=["split", "two-pass"])
@pytest.mark.parametrize("reduction,weighted,smoothing", COMBOS)
def test_long_row_paths_every_option(reduction, weighted, smoothing, path):
    # Rows split over 16-class slices (the cooperative kernel on the GPU, two launches here) or
    # streamed twice in 16-class tiles (3 programs here looping over the 6 rows), with ignored rows,
    # an all -inf slice / first tile (rows of C=37: 3 slices, the last of 5 classes).
    C = 37
    x = randn(6, C, noncontig=True, seed=41) * 4
    x[1, :16] = float("-inf")
    w = (randn(C, seed=42).abs() + 0.3) if weighted else None
    t = _targets((6,), C, seed=43)
    t[1] = 20  # a finite target in a row whose first slice is all -inf
    _check(x, t, w, reduction=reduction, label_smoothing=smoothing, **path)


def test_split_rows_in_place_and_forward_only():
    C = 45
    x = randn(5, C, seed=44) * 3
    t = _targets((5,), C, seed=45)
    w = randn(C, seed=46).abs() + 0.2
    kw = dict(weight=w, label_smoothing=0.1, split_config=(8, 1))
    loss, g = K.cross_entropy_fwd_bwd(x, t, **kw)
    buf = x.clone()
    loss_i, g_i = K.cross_entropy_fwd_bwd(buf, t, inplace=True, **kw)
    assert g_i.data_ptr() == buf.data_ptr()
    assert torch.equal(loss_i, loss) and torch.equal(g_i, g)  # x[t] is read before any slice is overwritten
    loss_f, g_f = K.cross_entropy_fwd_bwd(x, t, compute_grad=False, **kw)
    assert g_f is None and torch.equal(loss_f, loss)


@pytest.mark.parametrize("reduction,weighted,smoothing", COMBOS)
def test_persistent_whole_rows_every_option(reduction, weighted, smoothing):
    # The persistent kernel: programs loop over rows (3 programs here: rows 0, 3, 6, ...; on the GPU as
    # many as fit), loading the next row and target while finishing one; ignored rows between others.
    C = 37
    x = randn(11, C, noncontig=True, seed=51) * 4
    w = (randn(C, seed=52).abs() + 0.3) if weighted else None
    t = _targets((11,), C, seed=53, ignore_every=4)
    _check(x, t, w, reduction=reduction, label_smoothing=smoothing, persistent_warps=1)


@pytest.mark.parametrize("path", [dict(persistent_warps=1), dict(two_pass_config=(16, 1))],
                         ids=["persistent", "two-pass"])
def test_looping_row_paths_in_place_spatial_and_forward_only(path):
    C = 23
    x = randn(2, C, 3, 2, seed=54) * 3  # rows (n, d1, d2), classes strided
    t = _targets((2, 3, 2), C, seed=55)
    w = randn(C, seed=56).abs() + 0.2
    kw = dict(weight=w, label_smoothing=0.1, **path)
    loss, g = _check(x, t, w, label_smoothing=0.1, **path)
    buf = x.clone()
    loss_i, g_i = K.cross_entropy_fwd_bwd(buf, t, inplace=True, **kw)
    assert g_i.data_ptr() == buf.data_ptr()
    assert torch.equal(loss_i, loss) and torch.equal(g_i, g)  # x[t] is read before the row's dx is written
    loss_f, g_f = K.cross_entropy_fwd_bwd(x, t, compute_grad=False, **kw)
    assert g_f is None
    if "persistent_warps" in path:  # forward only: one row per program, another kernel
        assert torch.allclose(loss_f, loss, rtol=1e-6, atol=0)
    else:  # the same kernel without its second pass
        assert torch.equal(loss_f, loss)


@pytest.mark.skipif(not LARGE, reason="rows of 128256 classes")
@pytest.mark.parametrize("path", [{}, dict(two_pass_config=(16384, 32))], ids=["default", "two-pass"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_long_rows(dtype, path):
    # 16-bit rows of 128256 classes, the default (split) and the two-pass kernel: more rows than
    # programs, every 5th ignored.
    x = randn(300, 128256, dtype=dtype, seed=67) * 3
    t = _targets((300,), 128256, seed=68, ignore_every=5)
    _check(x, t, label_smoothing=0.1, **path)
    _check(x, t, reduction="sum", **path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cooperative split runs on the GPU only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cooperative_split_many_rows(dtype):
    # Many more programs than the GPU holds at once (3001 rows x 12 slices): the ticket order must
    # keep every row's slices co-resident; equal to the two-launch path bit for bit.
    N, C = 3001, 3000
    x = randn(N, C, dtype=dtype, seed=47) * 3
    t = _targets((N,), C, seed=48, ignore_every=7)
    loss, g = _check(x, t, label_smoothing=0.05, split_config=(256, 2))
    loss2, g2 = K.cross_entropy_fwd_bwd(x, t, label_smoothing=0.05, split_config=(256, 2), cooperative=False)
    assert torch.equal(loss, loss2) and torch.equal(g, g2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_half_precision_within_twice_torch_error(dtype, reduction):
    C = 32768 if LARGE else 300
    n = 32 if LARGE else 5
    _check(randn(n, C, dtype=dtype, seed=11) * 3, _targets((n,), C, seed=12, ignore_every=5), reduction=reduction)


def test_ignored_rows_get_zero_gradient_even_for_nan_logits():
    x = randn(6, 9, seed=13)
    t = _targets((6,), 9, seed=14, ignore_every=0)
    t[[1, 4]] = 5
    t[[2, 3]] = -7  # a custom ignore_index
    x[2] = float("nan")
    loss, g = K.cross_entropy_fwd_bwd(x, t, ignore_index=-7, label_smoothing=0.1)
    assert torch.equal(g[[2, 3]].cpu(), torch.zeros(2, 9))
    assert torch.isfinite(loss) and torch.isfinite(g).all()


def test_all_ignored_mean_is_nan_like_torch():
    x = randn(4, 5, seed=15)
    t = torch.full((4,), -100, device=DEVICE)
    for kw in ({}, {"label_smoothing": 0.1}, {"weight": randn(5, seed=16).abs()}):
        loss, g = K.cross_entropy_fwd_bwd(x, t, **kw)
        ref = TF.cross_entropy(x, t, **kw)
        assert torch.isnan(loss) and torch.isnan(ref)
        assert torch.equal(g.cpu(), torch.zeros(4, 5))
    loss, _ = K.cross_entropy_fwd_bwd(x, t, reduction="sum")
    assert loss.item() == 0.0


BAD_TARGET = (r"cross_entropy: 1 target value\(s\) out of range: class targets must be in \[0, 5\) "
              r"or equal ignore_index=-100")


@pytest.mark.parametrize("bad", [5, -1, 1000])
def test_out_of_range_targets_raise(bad):
    x = randn(3, 5, seed=17)
    t = torch.tensor([0, bad, 2], device=DEVICE)
    # CPU: raised by the call. GPU (default): raised without a host sync, by the next class-target
    # call or by check_pending_targets(); check_targets=True raises at the call on both.
    with pytest.raises(ValueError, match=BAD_TARGET):
        call("cross_entropy", x, t)
        K.check_pending_targets()
    with pytest.raises(ValueError, match=BAD_TARGET):
        call("cross_entropy", x, t, check_targets=True)
    # Unchecked, the bad row is NaN (never an out-of-bounds read, never a silent number).
    loss, g = K.cross_entropy_fwd_bwd(x, t, reduction="none", check_targets=False)
    assert torch.isnan(loss[1]) and torch.isnan(g[1]).all() and torch.isfinite(loss[[0, 2]]).all()
    with pytest.raises(ValueError, match="nll_loss: 1 target value"):
        call("nll_loss", x, t)
        K.check_pending_targets()
    K.check_pending_targets()  # nothing left over


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the deferred check is the GPU default")
def test_out_of_range_target_is_raised_by_the_next_call_without_a_sync():
    x = randn(3, 5, seed=17)
    good = torch.tensor([0, 1, 2], device=DEVICE)
    loss = call("cross_entropy", x, torch.tensor([0, 7, 2], device=DEVICE))  # returns: no host read here
    assert loss.shape == ()
    torch.cuda.synchronize()  # (the copy has landed; the next call only queries its event)
    with pytest.raises(ValueError, match=r"cross_entropy: 1 target value.*found by an earlier call"):
        call("nll_loss", x, good)
    call("cross_entropy", x, good)
    K.check_pending_targets()  # good targets leave nothing to raise


def test_schema_errors():
    x = randn(4, 5)
    t = _targets((4,), 5, seed=18, ignore_every=0)
    with pytest.raises(ValueError, match=r"cross_entropy: target has shape \[3\] but logits \[4, 5\] needs target \[4\]"):
        call("cross_entropy", x, t[:3])
    with pytest.raises(TypeError, match="cross_entropy: target has dtype float32"):
        call("cross_entropy", x, x[:, 0])
    with pytest.raises(ValueError, match=r"cross_entropy: weight must be \[5\] \(one per class\), got \[4\]"):
        call("cross_entropy", x, t, randn(4))
    with pytest.raises(ValueError, match="cross_entropy: reduction must be one of"):
        call("cross_entropy", x, t, reduction="avg")
    with pytest.raises(ValueError, match=r"cross_entropy_fwd_bwd: label_smoothing must be in \[0, 1\]"):
        call("cross_entropy_fwd_bwd", x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"cross_entropy_backward: gy must be 0-d"):
        call("cross_entropy_backward", randn(3), x)


def test_one_dim_logits():
    x, t = randn(11, seed=19), torch.tensor(4, device=DEVICE)
    loss, g = call("cross_entropy_fwd_bwd", x, t, label_smoothing=0.1)
    loss64, g64 = _torch_ce(x.double(), t, None, label_smoothing=0.1)
    assert_matches(loss, loss64, name="loss")
    assert_matches(g, g64, name="dlogits")


# ---------------------------------------------------------------------------------------------
# autograd and the in-place rule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_autograd_scales_by_upstream_gradient(reduction):
    x0 = randn(5, 8, seed=20)
    t = _targets((5,), 8, seed=21)
    x = ge2.from_torch(x0, requires_grad=True)
    loss = F.cross_entropy(x, ge2.from_torch(t), reduction=reduction, label_smoothing=0.05)
    gy = randn(*loss.shape, seed=23)
    loss.backward(ge2.from_torch(gy))
    xt = x0.double().requires_grad_()
    TF.cross_entropy(xt, t, reduction=reduction, label_smoothing=0.05).backward(gy.double())
    assert_matches(x.grad.data, xt.grad, name="dx")


def _nonleaf_logits(seed):
    """Logits produced by an op (a non-leaf), as a model's head gives them, and the leaf behind them."""
    h = ge2.from_torch(randn(6, 4, seed=seed), requires_grad=True)
    w = ge2.from_torch(randn(4, 10, seed=seed + 1))
    return h, h @ w


def test_inplace_backward_reuses_the_logits_buffer():
    h, logits = _nonleaf_logits(24)
    t = _targets((6,), 10, seed=26)
    before = logits.data.clone()
    ptr = logits.data.data_ptr()
    loss = F.cross_entropy(logits, ge2.from_torch(t), inplace_backward=True)
    _, g_ref = _torch_ce(before.double(), t, None)
    assert logits.data.data_ptr() == ptr
    assert_matches(logits.data, g_ref, name="logits buffer holds dlogits")
    loss.backward()
    ht = h.data.double().requires_grad_()
    TF.cross_entropy(ht @ ge2.from_torch(randn(4, 10, seed=25)).data.double(), t).backward()
    assert_matches(h.grad.data, ht.grad, name="dh through the in-place gradient")


def test_inplace_backward_is_refused_for_a_leaf_or_a_view():
    x = ge2.from_torch(randn(3, 4), requires_grad=True)
    before = x.data.clone()
    t = ge2.from_torch(torch.tensor([0, 1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="cross_entropy: inplace_backward=True needs logits produced by an earlier op"):
        F.cross_entropy(x, t, inplace_backward=True)
    with pytest.raises(ValueError, match="cross_entropy: inplace_backward=True needs logits that own their buffer"):
        F.cross_entropy(x.reshape(3, 4), t, inplace_backward=True)
    assert torch.equal(x.data, before)  # refused before any write


def test_inplace_backward_over_saved_logits_raises_at_backward():
    x = ge2.from_torch(randn(3, 4, seed=27), requires_grad=True)
    logp = F.log_softmax(x, 1)  # log_softmax saves its output for backward
    loss = F.cross_entropy(logp, ge2.from_torch(torch.tensor([0, 1, 2], device=DEVICE)), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        loss.backward()


def test_second_backward_is_a_clear_error():
    x = ge2.from_torch(randn(3, 4, seed=28), requires_grad=True)
    loss = F.cross_entropy(x, ge2.from_torch(torch.tensor([0, 1, 2], device=DEVICE)))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="cross_entropy: backward ran a second time"):
        loss.backward()


def test_no_grad_logits_compute_only_the_loss():
    x = randn(4, 6, seed=29)
    t = _targets((4,), 6, seed=30)
    loss = F.cross_entropy(ge2.from_torch(x), ge2.from_torch(t))
    assert not loss.requires_grad
    assert_matches(loss.data, TF.cross_entropy(x.double(), t), name="loss")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_ce_allocates_no_n_by_c_buffer(dtype):
    N, C, K_ = 4096, 32768, 16
    a = ge2.from_torch(randn(N, K_, dtype=dtype, seed=31), requires_grad=True)
    w = ge2.from_torch(randn(K_, C, dtype=dtype, seed=32))
    t = ge2.from_torch(_targets((N,), C, seed=33))
    for _ in range(2):  # the first call autotunes (which copies the logits to restore them)
        F.cross_entropy(a @ w, t, inplace_backward=True).backward()
    logits = a @ w  # a non-leaf that owns its buffer, as a model's head gives it
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = F.cross_entropy(logits, t, inplace_backward=True)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    logits_bytes = N * C * logits.data.element_size()
    assert extra <= 0.1 * logits_bytes, f"extra {extra / logits_bytes:.3f} x the logits"


# ---------------------------------------------------------------------------------------------
# linear_cross_entropy
# ---------------------------------------------------------------------------------------------
def _lce_reference(x, W, b, t, transposed, dtype, **kw):
    xr = x.to(dtype).requires_grad_()
    Wr = W.to(dtype).requires_grad_()
    br = b.to(dtype).requires_grad_() if b is not None else None
    logits = xr @ (Wr if transposed else Wr.t())
    loss = TF.cross_entropy(logits + br if br is not None else logits, t, **kw)
    loss.backward()
    return loss.detach(), xr.grad, Wr.grad, br.grad if br is not None else None


@pytest.mark.parametrize("transposed,with_bias,chunk_rows,reduction", [
    (False, True, None, "mean"), (False, False, 8, "sum"), (True, True, 8, "mean"), (True, False, None, "sum"),
])
def test_linear_cross_entropy(transposed, with_bias, chunk_rows, reduction):
    N, H, V = 37, 24, 53
    x = ge2.from_torch(randn(N, H, seed=33), requires_grad=True)
    W0 = randn(H, V, seed=34) * 0.3 if transposed else randn(V, H, seed=34) * 0.3
    W = ge2.from_torch(W0, requires_grad=True)
    b = ge2.from_torch(randn(V, seed=35), requires_grad=True) if with_bias else None
    t = _targets((N,), V, seed=36, ignore_every=5)
    loss = F.linear_cross_entropy(x, W, ge2.from_torch(t), linear_bias=b, transposed_weight=transposed,
                                  chunk_rows=chunk_rows, reduction=reduction, label_smoothing=0.1)
    gy = 0.7
    loss.backward(ge2.from_torch(torch.tensor(gy, device=DEVICE)))
    args = (x.data, W0, b.data if b is not None else None, t, transposed)
    ref64 = _lce_reference(*args, torch.float64, reduction=reduction, label_smoothing=0.1)
    ref32 = _lce_reference(*args, torch.float32, reduction=reduction, label_smoothing=0.1)
    assert_matches(loss.data, ref64[0], ref32[0], name="loss")
    for name, got, r64, r32 in zip(("dx", "dW", "db"), (x.grad, W.grad, b.grad if b is not None else None),
                                   ref64[1:], ref32[1:]):
        if r64 is not None:
            assert_matches(got.data, r64 * gy, r32 * gy, name=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_linear_cross_entropy_half_precision(dtype):
    N, H, V = (512, 256, 4099) if LARGE else (19, 16, 45)
    x = ge2.from_torch(randn(N, H, dtype=dtype, seed=37), requires_grad=True)
    W0 = (randn(V, H, seed=38) * 0.1).to(dtype)
    W = ge2.from_torch(W0, requires_grad=True)
    t = _targets((N,), V, seed=39, ignore_every=7)
    F.linear_cross_entropy(x, W, ge2.from_torch(t), chunk_rows=N // 3 + 1).backward()
    ref64 = _lce_reference(x.data, W0, None, t, False, torch.float64)
    ref16 = _lce_reference(x.data, W0, None, t, False, dtype)
    assert_matches(x.grad.data, ref64[1], ref16[1], name="dx")
    assert_matches(W.grad.data, ref64[2], ref16[2], name="dW")


def test_linear_cross_entropy_errors():
    x, W = randn(4, 5), randn(7, 6)
    t = _targets((4,), 7, seed=40, ignore_every=0)
    with pytest.raises(ValueError, match=r"linear_cross_entropy: x \[4, 5\] has 5 features but weight \[7, 6\]"):
        call("linear_cross_entropy", x, W, None, t)
    with pytest.raises(ValueError, match="linear_cross_entropy: reduction must be one of"):
        call("linear_cross_entropy", x, randn(7, 5), None, t, reduction="avg")
    with pytest.raises(ValueError, match=r"linear_cross_entropy: weight must be \[7\] \(one per class\)"):
        call("linear_cross_entropy", x, randn(7, 5), None, t, randn(6))
    with pytest.raises(ValueError, match="linear_cross_entropy: 1 target value"):
        call("linear_cross_entropy", x, randn(7, 5), None, torch.tensor([0, 1, 7, 2], device=DEVICE))
        K.check_pending_targets()  # (on the GPU the count is read without a sync, by the next check)


def test_autotune_pruning_keeps_a_config_for_both_kernel_families():
    from ge2.kernels.softmax import num_warps_configs, prune_by_elements_per_thread

    for meta in ({"BLOCK_M": 1, "BLOCK_N": 32768}, {"BLOCK_M": 4, "BLOCK_C": 512}, {"BLOCK_M": 256, "BLOCK_C": 8}):
        kept = prune_by_elements_per_thread(num_warps_configs(), {}, **meta)
        tile = meta["BLOCK_M"] * meta.get("BLOCK_N", meta.get("BLOCK_C"))
        assert kept and all(tile // (32 * c.num_warps) <= 64 for c in kept), (meta, kept)
