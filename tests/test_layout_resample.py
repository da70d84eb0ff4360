"""Joins/splits/reshapes (flip, roll, repeat, tile, repeat_interleave, tril/triu, diag_embed and the
views) and padding/resampling (pad, interpolate, unfold/fold, pixel shuffle) vs torch: forward,
gradients against torch autograd and float64, size-1 dims, non-contiguous inputs, refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from numerics import DEVICE, LARGE, assert_matches, randn


def _check(g_fn, t_fn, x, *, exact=True, seed=0):
    """ge2's g_fn vs torch's t_fn on x: forward (bit-exact for data movement), then the input
    gradient against torch's (same dtype) and float64's."""
    xg = ge2.from_torch(x.clone(), requires_grad=True)
    xt = x.clone().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    yg, yt, y64 = g_fn(xg), t_fn(xt), t_fn(x64)
    ys = yg if isinstance(yg, (tuple, list)) else [yg]
    yts = yt if isinstance(yt, (tuple, list)) else [yt]
    y64s = y64 if isinstance(y64, (tuple, list)) else [y64]
    assert len(ys) == len(yts)
    loss_g = loss_t = loss_64 = 0
    for i, (a, b, c) in enumerate(zip(ys, yts, y64s)):
        assert tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
        if exact:
            assert torch.equal(a.data, b.detach()), f"output {i}"
        else:
            assert_matches(a.data, c, b, name=f"output {i}")
        w = randn(*b.shape, dtype=x.dtype, seed=seed + 10 + i)
        loss_g = loss_g + (a * ge2.from_torch(w)).sum()
        loss_t = loss_t + (b * w).sum()
        loss_64 = loss_64 + (c * w.double()).sum()
    loss_g.backward()
    loss_t.backward()
    loss_64.backward()
    assert_matches(xg.grad.data, x64.grad, xt.grad, name="grad x")


def _x(*shape, dtype=torch.float32, seed=0):
    """A non-contiguous input (every other column of a wider buffer)."""
    return randn(*shape, dtype=dtype, noncontig=True, seed=seed)


# ---------------------------------------------------------------------------------------------
# joins, splits, reshapes
# ---------------------------------------------------------------------------------------------
LAYOUT_CASES = {
    "flip": (lambda t: t.flip(0, 2), lambda t: t.flip(0, 2)),
    "flip_neg": (lambda t: ge2.flip(t, (-1,)), lambda t: torch.flip(t, (-1,))),
    "roll": (lambda t: t.roll((1, -7), (0, 2)), lambda t: t.roll((1, -7), (0, 2))),
    "roll_flat": (lambda t: t.roll(5), lambda t: t.roll(5)),
    "repeat": (lambda t: t.repeat(2, 1, 3, 2), lambda t: t.repeat(2, 1, 3, 2)),
    "tile": (lambda t: ge2.tile(t, (2, 1)), lambda t: torch.tile(t, (2, 1))),
    "repeat_interleave": (lambda t: t.repeat_interleave(3, dim=2), lambda t: t.repeat_interleave(3, dim=2)),
    "repeat_interleave_flat": (lambda t: t.repeat_interleave(2), lambda t: t.repeat_interleave(2)),
    "repeat_interleave_tensor": (
        lambda t: t.repeat_interleave(ge2.from_torch(torch.tensor([2, 0, 1, 3, 1], device=DEVICE)), dim=2),
        lambda t: t.repeat_interleave(torch.tensor([2, 0, 1, 3, 1], device=DEVICE), dim=2)),
    "repeat_interleave_size": (
        lambda t: ge2.repeat_interleave(t, ge2.from_torch(torch.tensor([2, 3, 1], device=DEVICE)), 0, output_size=6),
        lambda t: torch.repeat_interleave(t, torch.tensor([2, 3, 1], device=DEVICE), 0, output_size=6)),
    "tril": (lambda t: t.tril(1), lambda t: t.tril(1)),
    "triu": (lambda t: ge2.triu(t, -1), lambda t: torch.triu(t, -1)),
    "diag_embed": (lambda t: t.diag_embed(1, 0, 2), lambda t: t.diag_embed(1, 0, 2)),
    "diag_embed_neg": (lambda t: ge2.diag_embed(t, -2), lambda t: torch.diag_embed(t, -2)),
    "diagonal": (lambda t: t.diagonal(-1, 2, 0), lambda t: t.diagonal(-1, 2, 0)),
    "movedim": (lambda t: t.movedim((0, 2), (2, 0)), lambda t: t.movedim((0, 2), (2, 0))),
    "moveaxis": (lambda t: ge2.moveaxis(t, -1, 0), lambda t: torch.moveaxis(t, -1, 0)),
    "narrow": (lambda t: t.narrow(2, -3, 2), lambda t: t.narrow(2, -3, 2)),
    "split": (lambda t: t.split(2, 2), lambda t: t.split(2, 2)),
    "split_sections": (lambda t: ge2.split(t, [1, 0, 4], 2), lambda t: torch.split(t, [1, 0, 4], 2)),
    "chunk": (lambda t: t.chunk(2, 0), lambda t: t.chunk(2, 0)),
    "unbind": (lambda t: t.unbind(1), lambda t: t.unbind(1)),
}


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
def test_layout_op(name):
    g_fn, t_fn = LAYOUT_CASES[name]
    _check(g_fn, t_fn, _x(3, 1, 5, seed=1))


def test_layout_large_and_tril_batched():
    _check(lambda t: t.tril(-2), lambda t: t.tril(-2), _x(2, 7, 9, seed=2))
    _check(lambda t: t.triu(3), lambda t: t.triu(3), randn(7, 9, seed=3).t())
    if LARGE:
        x = _x(64, 33, 517, seed=4)
        for name in ("flip", "roll", "repeat", "repeat_interleave_tensor", "tril"):
            _check(*LAYOUT_CASES[name], x[:, :1, :5] if "tensor" in name else x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16, torch.float64])
def test_layout_dtypes(dtype):
    x = randn(3, 4, 5, seed=5)
    x = (x > 0) if dtype == torch.bool else (x * 10).to(dtype)
    g = ge2.from_torch(x)
    for a, b in ((g.flip(1), x.flip(1)), (g.roll(2, 2), x.roll(2, 2)), (g.repeat(1, 2, 1), x.repeat(1, 2, 1)),
                 (g.tril(), x.tril()), (g.repeat_interleave(2, 0), x.repeat_interleave(2, 0)),
                 (ge2.diag_embed(g), torch.diag_embed(x)), (F.pad(g, (1, 2), value=1), TF.pad(x, (1, 2), value=1))):
        assert a.dtype == b.dtype and torch.equal(a.data, b)


def test_meshgrid_and_transpose_0d():
    a, b, c = (torch.arange(n, dtype=torch.float32, device=DEVICE) for n in (3, 1, 4))
    for indexing in ("ij", "xy"):
        got = ge2.meshgrid(ge2.from_torch(a), ge2.from_torch(b), ge2.from_torch(c), indexing=indexing)
        want = torch.meshgrid(a, b, c, indexing=indexing)
        assert all(torch.equal(g.data, w) for g, w in zip(got, want))
    s = ge2.tensor(2.5, requires_grad=True)
    t = s.transpose(0, 0)
    assert t.shape == () and t.item() == 2.5 and s.transpose(-1, 0).shape == ()
    (t * 3).backward()
    assert s.grad.item() == 3.0


def test_layout_refusals():
    x = ge2.from_torch(randn(3, 4, 5, seed=6))
    cases = [
        (lambda: x.flip(0, 0), ValueError, "flip: dims"),
        (lambda: x.roll((1, 2), 0), ValueError, "roll: shifts [1, 2] and dims [0]"),
        (lambda: x.repeat(2, 2), ValueError, "repeat: 2 sizes"),
        (lambda: x.repeat(2, -1, 1), ValueError, "repeat: repeats must be non-negative"),
        (lambda: x.split([1, 1], 1), ValueError, "split: sections [1, 1]"),
        (lambda: x.narrow(2, 4, 2), ValueError, "narrow: start 4 and length 2"),
        (lambda: x.diagonal(0, 1, 1), ValueError, "diagonal: dim1 1 and dim2 1"),
        (lambda: x.movedim((0, 1), 2), ValueError, "movedim: source [0, 1] and destination [2]"),
        (lambda: ge2.tril(ge2.from_torch(randn(4, seed=0))), ValueError, "tril: x must have at least 2 dims, got shape [4]"),
        (lambda: x.repeat_interleave(ge2.from_torch(torch.tensor([1, 2], device=DEVICE)), 2), ValueError,
         "repeat_interleave: repeats of shape [2]"),
        (lambda: x.repeat_interleave(ge2.from_torch(torch.tensor([1, -1, 1], device=DEVICE)), 0), ValueError,
         "repeat_interleave: repeats must be non-negative"),
        (lambda: x.chunk(0), ValueError, "chunk: chunks must be a positive int"),
        (lambda: ge2.meshgrid(x), ValueError, "meshgrid: tensors[0] must be a 0-D or 1-D Tensor, got [3, 4, 5]"),
        (lambda: ge2.tensor(1.0).transpose(0, 1), ValueError, "transpose: dim 1 is out of range"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg.replace("[", r"\[").replace("]", r"\]")):
            fn()


# ---------------------------------------------------------------------------------------------
# padding
# ---------------------------------------------------------------------------------------------
PAD_CASES = [
    ("constant", (2, 3), (1, 2, -1, 3)),         # 2 dims of a 3-D x, a negative pad crops
    ("constant", (2, 1, 3, 4), (1, 1, 0, 2, 1, 0, 2, 1)),  # every dim
    ("reflect", (2, 3, 5), (2, 4)),
    ("reflect", (1, 3, 4, 5), (-1, 2, 3, 1)),
    ("replicate", (2, 3, 4), (5, 1)),
    ("replicate", (1, 2, 3, 4, 5), (1, 2, 0, 3, 2, 1)),
    ("circular", (2, 3, 5), (5, 2)),
    ("circular", (2, 1, 3, 4), (1, 2, 3, 1)),  # torch 2.13 fills negative circular pads with garbage
]


@pytest.mark.parametrize("case", PAD_CASES, ids=lambda c: f"{c[0]}-{len(c[1])}d")
def test_pad(case):
    mode, shape, pads = case
    value = 0.5 if mode == "constant" else None
    _check(lambda t: F.pad(t, pads, mode, value), lambda t: TF.pad(t, pads, mode, value), _x(*shape, seed=7))


def test_pad_modules_and_large():
    x = ge2.from_torch(randn(2, 3, 4, 5, seed=8))
    t = x.data
    for mod, want in ((nn.ZeroPad2d(1), TF.pad(t, (1, 1, 1, 1))), (nn.ConstantPad1d((1, 2), 3.0), TF.pad(t, (1, 2), value=3.0)),
                      (nn.ReflectionPad2d((1, 2, 0, 3)), TF.pad(t, (1, 2, 0, 3), mode="reflect")),
                      (nn.ReplicationPad2d(2), TF.pad(t, (2,) * 4, mode="replicate")),
                      (nn.CircularPad2d(1), TF.pad(t, (1,) * 4, mode="circular"))):
        assert torch.equal(mod(x).data, want), type(mod).__name__
    if LARGE:
        for mode in ("reflect", "replicate", "circular", "constant"):
            _check(lambda t: F.pad(t, (3, 1, 2, 2), mode), lambda t: TF.pad(t, (3, 1, 2, 2), mode),
                   randn(8, 16, 56, 56, dtype=torch.bfloat16, seed=9))


def test_pad_refusals():
    x = ge2.from_torch(randn(2, 3, 4, seed=10))
    cases = [
        (lambda: F.pad(x, (4, 0), "reflect"), "pad: reflect padding (4, 0) must be smaller than dim 2 of size 4"),
        (lambda: F.pad(x, (5, 0), "circular"), "pad: circular padding (5, 0) must be at most dim 2 of size 4"),
        (lambda: F.pad(x, (1, 1, 1), "constant"), "pad: pad must hold (before, after) pairs"),
        (lambda: F.pad(x, (1,) * 8), "pad: pad [1, 1, 1, 1, 1, 1, 1, 1] pads 4 dims but x of shape [2, 3, 4]"),
        (lambda: F.pad(x, (1,) * 6, "replicate"), "pad: replicate padding of the last 3 dims takes a 4-D or 5-D x"),
        (lambda: F.pad(x, (-3, -2)), "pad: padding (-3, -2) of dim 2 of size 4 gives a negative size"),
        (lambda: F.pad(x, (1, 1), "wrap"), "pad: mode must be one of"),
        (lambda: F.pad(x, (1, 1), "reflect", 2.0), "pad: mode 'reflect' does not take a value"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError) as e:
            fn()
        assert msg in str(e.value)


# ---------------------------------------------------------------------------------------------
# interpolate
# ---------------------------------------------------------------------------------------------
INTERP_CASES = [
    # (mode, input shape, kwargs)
    ("nearest", (2, 3, 5), dict(size=8)),
    ("nearest", (1, 2, 5, 7), dict(scale_factor=(1.7, 0.6))),
    ("nearest-exact", (1, 2, 5, 7), dict(size=(3, 10))),
    ("nearest", (1, 2, 2, 3, 4), dict(size=(3, 1, 7))),
    ("linear", (2, 3, 7), dict(size=4)),
    ("linear", (2, 3, 7), dict(size=12, align_corners=True)),
    ("bilinear", (1, 2, 5, 6), dict(scale_factor=1.5)),
    ("bilinear", (1, 2, 5, 6), dict(size=(3, 11), align_corners=True)),
    ("bilinear", (1, 2, 1, 6), dict(size=(4, 1))),
    ("bilinear", (1, 2, 5, 6), dict(scale_factor=(2.3, 0.5), recompute_scale_factor=True)),
    ("bicubic", (1, 2, 4, 5), dict(size=(7, 3))),
    ("bicubic", (1, 2, 4, 5), dict(scale_factor=2, align_corners=True)),
    ("trilinear", (1, 1, 3, 4, 5), dict(size=(5, 2, 6))),
]


@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: f"{c[0]}-{c[2]}")
def test_interpolate(case):
    mode, shape, kw = case
    _check(lambda t: F.interpolate(t, mode=mode, **kw), lambda t: TF.interpolate(t, mode=mode, **kw),
           _x(*shape, seed=11), exact=False)


def test_interpolate_bf16_area_upsample_module():
    x = randn(1, 3, 4, 6, dtype=torch.bfloat16, seed=12)
    _check(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
           lambda t: TF.interpolate(t, scale_factor=2, mode="bilinear"), x, exact=False)
    _check(lambda t: F.interpolate(t, size=(3, 4), mode="area"), lambda t: TF.interpolate(t, size=(3, 4), mode="area"),
           _x(1, 2, 6, 8, seed=13), exact=False)
    g = ge2.from_torch(randn(1, 2, 3, 4, seed=14))
    assert torch.allclose(nn.Upsample(scale_factor=2, mode="nearest")(g).data, TF.interpolate(g.data, scale_factor=2))
    if LARGE:
        for mode in ("bilinear", "bicubic", "nearest"):
            _check(lambda t: F.interpolate(t, scale_factor=2, mode=mode),
                   lambda t: TF.interpolate(t, scale_factor=2, mode=mode),
                   randn(4, 16, 56, 56, dtype=torch.bfloat16, seed=15), exact=False)


def test_interpolate_refusals():
    x = ge2.from_torch(randn(1, 2, 4, 5, seed=16))
    cases = [
        (lambda: F.interpolate(x, size=3, mode="linear"), ValueError, "interpolate: mode 'linear' takes a 3-D input"),
        (lambda: F.interpolate(x, size=3, mode="nearest", align_corners=True), ValueError, "align_corners can only"),
        (lambda: F.interpolate(x, mode="bilinear"), ValueError, "give exactly one of size and scale_factor"),
        (lambda: F.interpolate(x, size=(3, 4, 5), mode="bilinear"), ValueError, "size must be an int or 2 ints"),
        (lambda: F.interpolate(x, scale_factor=0.1, mode="bilinear"), ValueError, "must give 2 positive output sizes"),
        (lambda: F.interpolate(x, size=3, mode="bilinear", antialias=True), ValueError, "antialias"),
        (lambda: F.interpolate(ge2.from_torch(randn(1, 2, 4, 5, dtype=torch.float64, seed=0)), size=3,
                               mode="bilinear"), TypeError, "interpolate: x has dtype float64"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc) as e:
            fn()
        assert msg in str(e.value)


# ---------------------------------------------------------------------------------------------
# unfold / fold, pixel shuffle
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(kernel_size=(2, 3), padding=1, stride=(2, 1), dilation=(1, 2)),
                                dict(kernel_size=3, padding=(0, 1))], ids=["strided", "overlapping"])
def test_unfold_fold(kw):
    _check(lambda t: F.unfold(t, **kw), lambda t: TF.unfold(t, **kw), _x(2, 3, 5, 6, seed=17))
    cols = TF.unfold(torch.zeros(2, 3, 5, 6, device=DEVICE), **kw).shape
    _check(lambda t: F.fold(t, (5, 6), **kw), lambda t: TF.fold(t, (5, 6), **kw), _x(*cols, seed=18), exact=False)
    m = nn.Fold((5, 6), **kw)(nn.Unfold(**kw)(ge2.from_torch(randn(3, 5, 6, seed=19))))
    assert tuple(m.shape) == (3, 5, 6)
    with pytest.raises(ValueError, match="fold: x of shape"):
        F.fold(ge2.from_torch(randn(2, 5, 7, seed=0)), (5, 6), **kw)
    with pytest.raises(ValueError, match="unfold: no 9-wide window"):
        F.unfold(ge2.from_torch(randn(1, 1, 4, 4, seed=0)), 9)


def test_pixel_shuffle():
    _check(lambda t: F.pixel_shuffle(t, 2), lambda t: TF.pixel_shuffle(t, 2), _x(2, 8, 3, 5, seed=20))
    _check(lambda t: nn.PixelUnshuffle(3)(t), lambda t: TF.pixel_unshuffle(t, 3), _x(1, 2, 6, 3, seed=21))
    with pytest.raises(ValueError, match=r"pixel_shuffle: channels 6 of x \[1, 6, 2, 2\] are not divisible"):
        F.pixel_shuffle(ge2.from_torch(randn(1, 6, 2, 2, seed=0)), 2)


def test_torch_backend_twins():
    x = randn(2, 3, 5, 6, seed=22)
    g = ge2.from_torch(x)
    ops = [lambda t: F.pad(t, (1, 2, 2, 1), "reflect"), lambda t: F.interpolate(t, scale_factor=1.5, mode="bicubic"),
           lambda t: t.repeat_interleave(ge2.from_torch(torch.tensor([1, 2, 0], device=DEVICE)), 1),
           lambda t: t.diag_embed(), lambda t: F.unfold(t, 2)]
    for op in ops:
        a = op(g).data
        with ge2.use_backend("torch"):
            b = op(g).data
        assert_matches(a, b.double(), b, name="triton vs torch backend")
