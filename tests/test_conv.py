"""conv2d: forward and backward vs torch and a float64 reference, every option, both layouts, all dtypes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2.backend import call
from ge2.kernels.conv import is_channels_last
from ge2.testing import torch_op_guard
from numerics import DEVICE, LARGE, assert_matches, randn

# (N, C, H, W, K, (R, S), stride, padding, dilation, groups): odd sizes, every option somewhere.
CASES = [
    (2, 3, 7, 9, 5, (3, 3), 1, 1, 1, 1),
    (1, 4, 8, 7, 6, (3, 2), 2, (1, 0), 2, 2),            # stride 2, dilation 2, grouped, pair padding
    (2, 6, 5, 6, 6, (3, 3), 1, "same", 1, 6),            # depthwise
    (3, 5, 6, 6, 4, (2, 2), (2, 1), "valid", 1, 1),
    (1, 3, 6, 8, 4, (4, 4), 1, "same", (1, 2), 1),       # even kernel: asymmetric "same" padding
    (2, 8, 9, 5, 4, (1, 1), (2, 3), 0, 1, 2),            # 1x1, strided, grouped
    (2, 20, 5, 4, 40, (3, 3), 3, 2, 1, 1),               # C past one K block, K past one N tile; stride 3
    (1, 1, 1, 1, 1, (1, 1), 1, 0, 1, 1),                 # size-1 everything
    (1, 34, 5, 4, 34, (2, 3), 1, 1, (2, 1), 2),          # 17 channels/group: tap-major fwd, dX and dW
    (2, 5, 7, 6, 5, (3, 3), 2, 1, 1, 5),                 # depthwise, strided
]
LARGE_CASES = [
    (8, 64, 56, 56, 64, (3, 3), 1, 1, 1, 1),
    (8, 256, 14, 14, 256, (3, 3), 1, 1, 1, 1),
    (16, 3, 32, 32, 64, (3, 3), 1, 1, 1, 1),
    (8, 128, 28, 28, 128, (1, 1), 1, 0, 1, 1),
    (8, 256, 28, 28, 256, (3, 3), 1, 1, 1, 256),
    (8, 64, 56, 56, 128, (3, 3), 2, 1, 1, 1),
]


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "nhwc":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # a non-dense view: every other column of a wider image
        return torch.stack([x, -x], dim=4).reshape(*x.shape[:3], -1)[..., ::2]
    return x


def _check_conv(case, layout="nchw", dtype=torch.float32, bias=True, act=None, slope=0.01, seed=0):
    """ge2's conv2d forward and x/W/b gradients vs torch in ``dtype`` and float64 on the CPU."""
    N, C, H, W, K, (R, S), stride, padding, dilation, groups = case
    x = _layout(randn(N, C, H, W, dtype=dtype, seed=seed), layout)
    w = randn(K, C // groups, R, S, dtype=dtype, seed=seed + 1)
    b = randn(K, dtype=dtype, seed=seed + 2) if bias else None
    t_act = {None: lambda z: z, "relu": TF.relu, "gelu": TF.gelu, "leaky_relu": lambda z: TF.leaky_relu(z, slope),
             "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": TF.silu}[act]

    _compare_conv(x, w, b, lambda xt, wt, bt: t_act(TF.conv2d(xt, wt, bt, stride, padding, dilation, groups)),
                  lambda xg, wg, bg: F.conv2d(xg, wg, bg, stride, padding, dilation, groups, act, slope), seed)


def _compare_conv(x, w, b, torch_conv, ge2_conv, seed):
    """ge2_conv(x, w, b) forward and x/W/b gradients vs torch_conv in x's dtype and in float64 on the CPU."""
    leaves = [t for t in (x, w, b) if t is not None]
    ref = [t.detach().double().cpu().requires_grad_() for t in leaves]
    tor = [t.detach().clone().requires_grad_() for t in leaves]
    gen = [ge2.from_torch(t.detach().clone(), requires_grad=True) for t in leaves]
    has_bias = b is not None
    y64 = torch_conv(ref[0], ref[1], ref[2] if has_bias else None)
    yt = torch_conv(tor[0], tor[1], tor[2] if has_bias else None)
    yg = ge2_conv(gen[0], gen[1], gen[2] if has_bias else None)
    assert tuple(yg.shape) == tuple(yt.shape) and yg.dtype == x.dtype
    assert yg.data.is_contiguous(memory_format=torch.channels_last if is_channels_last(x) else torch.contiguous_format)
    assert_matches(yg.data, y64, yt, name="forward")
    gy = randn(*yt.shape, seed=seed + 3).to(x.dtype)
    y64.backward(gy.double().cpu())
    yt.backward(gy)
    yg.backward(ge2.from_torch(gy))
    for name, g, t, r in zip(("x", "weight", "bias"), gen, tor, ref):
        assert_matches(g.grad.data, r.grad, t.grad, name=f"grad {name}")


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-g{c[9]}")
def test_conv2d_fp32_every_option(case, layout):
    _check_conv(case, layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[2]], ids=["3x3", "strided-dilated-grouped", "depthwise"])
def test_conv2d_half_dtypes(case, layout, dtype):
    _check_conv(case, layout, dtype)


@pytest.mark.parametrize("act", ["relu", "gelu", "leaky_relu", "sigmoid", "tanh", "silu"])
def test_conv2d_fused_activation(act):
    _check_conv(CASES[1], "nhwc", act=act, slope=0.2, seed=5)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_depthwise_large_strided_dilated_kernel_with_activation(layout):
    # 20 taps: past DEPTHWISE_HOISTED_TAPS the forward loads each weight at its use. Row stride 2
    # and dilation 2 make output row j's tap r and row j+1's tap r-1 read the same input row,
    # which the kernels load once for both (and gelu keeps Z for its backward).
    _check_conv((2, 4, 11, 8, 4, (5, 4), (2, 1), 2, (2, 1), 4), layout, act="gelu", seed=31)


def test_conv2d_no_bias_and_activation_without_bias():
    _check_conv(CASES[0], "nchw", bias=False, seed=11)
    _check_conv(CASES[3], "nhwc", bias=False, act="gelu", seed=12)


def test_conv2d_weight_gradient_split_is_deterministic(monkeypatch):
    # Small splits so that a tiny problem takes the split path: dW = fixed-order sum of partials.
    from ge2.kernels import conv as K

    monkeypatch.setattr(K, "DW_MIN_SPLIT", 2)
    monkeypatch.setattr(K, "DW_TARGET_PROGRAMS", 528)
    case = (2, 2, 8, 9, 3, (3, 3), 1, 1, 1, 1)
    assert K._dw_splits(2 * 8, 1)[0] > 1  # steps: one per output row
    _check_conv(case, "nchw", seed=21)
    x, w, gy = randn(2, 2, 8, 9, seed=22), randn(3, 2, 3, 3, seed=23), randn(2, 3, 8, 9, seed=24)
    runs = [call("conv2d_backward", gy, x, w, padding=1, has_bias=True)[1:] for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("path", ["direct", "dot", "dot-one-row"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", [(3, 2, 6, 7, 5, (3, 3), 1, 1, 1, 1), (2, 17, 6, 7, 18, (3, 2), 1, 1, 1, 1)],
                         ids=["flat", "per-tap"])
def test_conv2d_weight_and_bias_gradients_over_splits_with_activation(case, layout, path, monkeypatch):
    # dW forms gZ = gY * act'(Y) as it loads gY and sums db in extra programs of its grid; with
    # tiny splits the partials (dW and db in one row per split) go through the fixed-order sum.
    # fp32 dW runs on the CUDA cores ("direct") up to DW_DIRECT_MACS, else through tl.dot, whose
    # steps take several output rows (here 4: the rows are 7 wide, 16-pixel segments) or one.
    from ge2.kernels import conv as K
    from ge2.kernels import conv_framed

    monkeypatch.setattr(conv_framed, "ENABLED", False)  # the per-tap case is stride 1: keep it off the framed path
    monkeypatch.setattr(K, "DW_MIN_SPLIT", 2)
    monkeypatch.setattr(K, "DW_TARGET_PROGRAMS", 528)
    if path.startswith("dot"):
        monkeypatch.setattr(K, "DW_DIRECT_MACS", {})
        if path == "dot-one-row":
            monkeypatch.setattr(K, "DW_STEP_PIXELS", 16)
    else:
        assert case[0] * case[2] * case[3] * case[4] * case[1] * 9 <= min(K.DW_DIRECT_MACS.values())
    assert K._dw_splits(case[0] * case[2], 1)[0] > 2  # steps: one per output row
    _check_conv(case, layout, act="relu", seed=27)
    _check_conv(case, layout, act="gelu", seed=28)


def test_conv2d_narrow_weight_gradient_runs_direct_in_every_precision():
    # A 1-channel stem's [K, 9] dW wastes most of a tensor-core tile: CUDA cores up to the largest
    # cap in tf32 too; wide dWs keep their precision's cap; 16-bit never runs direct.
    from ge2.kernels import conv as K

    old = ge2.set_matmul_precision("tf32")
    try:
        big = K.DW_DIRECT_MACS["tf32"] * 4
        assert big <= K.DW_DIRECT_MACS["ieee"]
        assert K._direct_dw(torch.float32, big, 9) and not K._direct_dw(torch.float32, big, 288)
        assert not K._direct_dw(torch.float32, K.DW_DIRECT_MACS["ieee"] + 1, 9)
        assert not K._direct_dw(torch.bfloat16, 1, 9)
    finally:
        ge2.set_matmul_precision(old)


def test_conv2d_channels_last_weight_and_unbatched_input():
    x, w, b = randn(3, 6, 5, seed=31), randn(4, 3, 2, 2, seed=32), randn(4, seed=33)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    y = F.conv2d(ge2.from_torch(x), ge2.from_torch(w_cl), ge2.from_torch(b), padding=1)
    y64 = TF.conv2d(x.double(), w.double(), b.double(), padding=1)
    assert_matches(y.data, y64, TF.conv2d(x, w, b, padding=1))


def test_conv2d_z_stash_rule():
    x, w = randn(1, 2, 5, 5, seed=41), randn(3, 2, 3, 3, seed=42)
    assert call("conv2d", x, w, act="relu", save_z=True)[1] is None  # relu' comes from y
    y, z = call("conv2d", x, w, act="gelu", save_z=True)
    assert z is not None
    assert_matches(z, TF.conv2d(x.double(), w.double()), TF.conv2d(x, w), name="z")
    assert call("conv2d", x, w, act="gelu")[1] is None


def test_conv2d_backward_keeps_the_input_layout():
    x = randn(2, 3, 5, 6, seed=45).contiguous(memory_format=torch.channels_last)
    w = randn(4, 3, 3, 3, seed=46)
    y, _ = call("conv2d", x, w, padding=1)
    dx, dw, db = call("conv2d_backward", randn(2, 4, 5, 6, seed=47), x, w, padding=1, has_bias=True)
    assert is_channels_last(y) and is_channels_last(dx) and dw.is_contiguous() and db.shape == (4,)


def test_conv2d_backward_strided_gradient_with_one_output_column():
    # gy [N, K, P, 1] sliced from a wider tensor: P and Q merge through P's stride, not Q's.
    x, w = randn(2, 3, 6, 3, seed=48), randn(4, 3, 3, 3, seed=49)
    gy = randn(2, 4, 6, 2, seed=50)[..., :1]
    dx, dw, db = call("conv2d_backward", gy, x, w, padding=(1, 0), has_bias=True)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    TF.conv2d(x64, w64, padding=(1, 0)).backward(gy.double())
    TF.conv2d(xt, wt, padding=(1, 0)).backward(gy)
    assert_matches(dx, x64.grad, xt.grad, name="grad x")
    assert_matches(dw, w64.grad, wt.grad, name="grad weight")
    assert_matches(db, gy.double().sum((0, 2, 3)), gy.sum((0, 2, 3)), name="grad bias")


@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
def test_conv2d_honours_matmul_precision(precision):
    from ge2.kernels.conv import _numerics

    ge2.set_matmul_precision(precision)
    assert _numerics(torch.float32)["PRECISION"] == precision  # what tl.dot gets for fp32 operands
    assert _numerics(torch.bfloat16)["PRECISION"] == "ieee"  # 16-bit: tensor cores, fp32 accumulation
    # 5 channels: a 45-long flat reduction (tensor cores); 3 (an RGB stem's 27): tensor cores in
    # tf32, the exact fp32 FMA loop in tf32x3 (DIRECT_MAX_REDUCTION).
    for c in (5, 3):
        x, w = randn(2, c, 6, 6, seed=51), randn(7, c, 3, 3, seed=52)
        y = F.conv2d(ge2.from_torch(x), ge2.from_torch(w), padding=1)
        y64 = TF.conv2d(x.double(), w.double(), padding=1).cpu()
        # tf32 keeps 10 mantissa bits: ~1e-3 relative error at worst; the interpreter runs ieee.
        tol = 2e-3 if precision == "tf32" and not ge2.is_interpreter() else 1e-5
        assert (y.data.double().cpu() - y64).norm() / y64.norm() < tol


def test_conv2d_errors_name_op_argument_and_shapes():
    x, w = torch.ones(2, 4, 5, 5, device=DEVICE), torch.ones(6, 2, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"conv2d: channels must be divisible by groups=3: x \[2, 4, 5, 5\]"):
        call("conv2d", x, torch.ones(6, 1, 3, 3, device=DEVICE), groups=3)
    with pytest.raises(ValueError, match=r"conv2d: weight \[6, 2, 3, 3\] expects 2 channels per group x 1 groups"):
        call("conv2d", x, w)
    with pytest.raises(ValueError, match=r"kernel \(dilated 7x7\) is larger than the padded input 5x5"):
        call("conv2d", x, torch.ones(6, 4, 7, 7, device=DEVICE))
    with pytest.raises(ValueError, match=r"conv2d: weight must be 4-D, got shape \[6, 4\]"):
        call("conv2d", x, torch.ones(6, 4, device=DEVICE))
    with pytest.raises(TypeError, match="conv2d: x has dtype float32 but weight has bfloat16"):
        call("conv2d", x, w.to(torch.bfloat16), groups=2)
    with pytest.raises(ValueError, match="conv2d: weight is on meta but the other inputs are on"):
        call("conv2d", x, torch.ones(6, 2, 3, 3, device="meta"), groups=2)
    with pytest.raises(ValueError, match=r"conv2d: bias must be \[6\]"):
        call("conv2d", x, w, torch.ones(5, device=DEVICE), groups=2)
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        call("conv2d", x, w, groups=2, stride=2, padding="same")
    with pytest.raises(ValueError, match="conv2d: stride must be >= 1"):
        call("conv2d", x, w, groups=2, stride=0)
    with pytest.raises(ValueError, match="conv2d: unknown activation 'swish'"):
        call("conv2d", x, w, groups=2, act="swish")
    with pytest.raises(ValueError, match=r"conv2d: weight must be 4-D \[K, C/groups, R, S\]"):
        F.conv2d(ge2.from_torch(x), ge2.from_torch(torch.ones(6, 4, device=DEVICE)))
    with pytest.raises(ValueError, match="Conv2d: in_channels=4 and out_channels=6 must be divisible by groups=4"):
        nn.Conv2d(4, 6, 3, groups=4)


def test_conv2d_layer_matches_torch_init_and_forward():
    torch.manual_seed(3)
    g = nn.Conv2d(3, 5, (3, 2), stride=(1, 2), padding=1, activation="relu")
    torch.manual_seed(3)
    t = torch.nn.Conv2d(3, 5, (3, 2), stride=(1, 2), padding=1, device=DEVICE)  # drawn on the same device as ge2's
    assert torch.equal(g.weight.data, t.weight.data) and torch.equal(g.bias.data, t.bias.data)
    x = randn(2, 3, 6, 7, seed=61)
    y = g(ge2.from_torch(x))
    t64 = TF.relu(TF.conv2d(x.double(), t.weight.double(), t.bias.double(), (1, 2), 1))
    assert_matches(y.data, t64, TF.relu(t(x)))
    assert "activation='relu'" in repr(g)


def test_cnn_training_step_does_no_torch_math():
    if ge2.get_backend() == "torch":
        pytest.skip("the torch oracle does arithmetic by design; the guard checks the triton path")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 6, 3, padding="same", activation="gelu"), nn.AvgPool2d(2, ceil_mode=True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    opt = ge2.optim.SGD(model.parameters(), lr=0.1)
    x = ge2.from_torch(randn(2, 1, 8, 8, seed=71))
    labels = ge2.from_torch(torch.tensor([0, 2], device=DEVICE))
    with torch_op_guard() as ops:
        loss = nn.CrossEntropyLoss()(model(x), labels)
        loss.backward()
        opt.step()
    assert sum(ops.values()) > 0
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.skipif(not LARGE, reason="ResNet-sized shapes run on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", LARGE_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-g{c[9]}")
def test_conv2d_resnet_shapes(case, layout, dtype):
    _check_conv(case, layout, dtype)


# ---------------------------------------------------------------------------------------------
# Stride-1 convs with >= 16 channels on both sides and one group: framed TMA GEMMs (conv_framed)
# ---------------------------------------------------------------------------------------------
FRAMED_CASES = [
    (2, 16, 5, 6, 16, (3, 3), 1, 1, 1, 1),
    (1, 20, 6, 5, 17, (3, 2), 1, (2, 0), (2, 1), 1),  # pair padding, dilation; K, C past a tile
    (2, 18, 4, 7, 24, (2, 2), 1, "same", 1, 1),        # even kernel: asymmetric padding
    (1, 16, 1, 9, 16, (3, 3), 1, 1, 1, 1),             # a one-row image
    (2, 16, 3, 4, 16, (3, 3), 1, 3, 1, 1),             # padding past the kernel's reach: dX's is negative
]


class _Counting:
    """Stands in for a kernel and counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.mark.parametrize("path", ["framed", "tap-major"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided"])
@pytest.mark.parametrize("case", FRAMED_CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_conv2d_stride1_framed_and_tap_major(case, layout, dtype, path, monkeypatch):
    # The framed path where TMA exists (Hopper, interpreter); the tap-major kernels elsewhere.
    from ge2.kernels import conv_framed as FR

    # Channels-last x (forward) and gZ (dX; the relu makes it channels-last) with 16-byte aligned
    # pixel rows are read in place through 4-D descriptors (conv2d_nhwc_kernel; 16-bit dW when both
    # are: conv2d_nhwc_dw_kernel), the rest framed.
    monkeypatch.setattr(FR, "ENABLED", path == "framed")
    fwd = _Counting(FR.conv2d_framed_kernel)
    direct = _Counting(FR.conv2d_nhwc_kernel)
    dw = _Counting(FR.conv2d_framed_dw_kernel)
    direct_dw = _Counting(FR.conv2d_nhwc_dw_kernel)
    monkeypatch.setattr(FR, "conv2d_framed_kernel", fwd)
    monkeypatch.setattr(FR, "conv2d_nhwc_kernel", direct)
    monkeypatch.setattr(FR, "conv2d_framed_dw_kernel", dw)
    monkeypatch.setattr(FR, "conv2d_nhwc_dw_kernel", direct_dw)
    if DEVICE.type == "cuda" and FR._tma_sms(DEVICE) == 0 and path == "framed":
        pytest.skip("no TMA on this GPU")
    _check_conv(case, layout, dtype, act="relu", seed=31)
    framed = path == "framed"
    in_place = [layout == "nhwc" and channels * dtype.itemsize % 16 == 0 for channels in (case[1], case[4])]
    assert direct.launches == (sum(in_place) if framed else 0)  # forward (C channels), dX (K)
    assert fwd.launches + direct.launches == (2 if framed else 0)
    rows_dw = framed and dtype != torch.float32  # fp32 dW: the planar frames (conv2d_planar_dw_kernel)
    assert (dw.launches, direct_dw.launches) == ((0, 1) if all(in_place) else (1, 0)) if rows_dw else (0, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("view", ["dense", "channel slice", "one image"])
def test_conv2d_channels_last_input_is_read_in_place(view, dtype, monkeypatch):
    # No frame: forward, dX and 16-bit dW read x and gZ where they are, padding from the copy
    # engine's zero fill; results as good as the framed path's, for a channel slice of a wider NHWC
    # tensor too.
    from ge2.kernels import conv_framed as FR

    if DEVICE.type == "cuda" and FR._tma_sms(DEVICE) == 0:
        pytest.skip("no TMA on this GPU")
    N, C, K = (1 if view == "one image" else 2), 16, 24
    wide = randn(N, 2 * C if view == "channel slice" else C, 5, 7, dtype=dtype, seed=7)
    x = wide.contiguous(memory_format=torch.channels_last)[:, :C]
    w, b = randn(K, C, 3, 3, dtype=dtype, seed=8), randn(K, dtype=dtype, seed=9)
    gy = randn(N, K, 5, 7, dtype=dtype, seed=10).contiguous(memory_format=torch.channels_last)
    assert FR.nhwc_dims(x) is not None and FR.nhwc_dims(gy) is not None
    results = []
    for direct in (True, False):
        monkeypatch.setattr(FR, "NHWC_DIRECT", direct)
        counting = _Counting(FR.conv2d_nhwc_kernel)
        counting_dw = _Counting(FR.conv2d_nhwc_dw_kernel)
        monkeypatch.setattr(FR, "conv2d_nhwc_kernel", counting)
        monkeypatch.setattr(FR, "conv2d_nhwc_dw_kernel", counting_dw)
        xg, wg, bg = (ge2.from_torch(t.clone(), requires_grad=True) for t in (x, w, b))
        y = F.conv2d(xg, wg, bg, padding=(1, 2), dilation=(1, 2), activation="gelu")
        y.backward(ge2.from_torch(gy))
        assert counting.launches == (2 if direct else 0)  # forward, dX
        assert counting_dw.launches == (1 if direct and dtype != torch.float32 else 0)  # fp32 dW: planar frames
        assert y.data.is_contiguous(memory_format=torch.channels_last)
        results.append([y.data, xg.grad.data, wg.grad.data, bg.grad.data])
    ref = [x.double().cpu().requires_grad_(), w.double().cpu().requires_grad_(), b.double().cpu().requires_grad_()]
    y64 = TF.gelu(TF.conv2d(*ref, padding=(1, 2), dilation=(1, 2)))
    y64.backward(gy.double().cpu())
    tor = [t.clone().requires_grad_() for t in (x, w, b)]
    yt = TF.gelu(TF.conv2d(*tor, padding=(1, 2), dilation=(1, 2)))
    yt.backward(gy)
    names = ("forward", "grad x", "grad weight", "grad bias")
    for i, (name, r, t) in enumerate(zip(names, [y64] + [t.grad for t in ref], [yt] + [t.grad for t in tor])):
        for path, got in zip(("in place", "framed"), results):
            assert_matches(got[i], r.detach(), t.detach(), name=f"{name} ({path})")


def _nhwc_configs() -> list:
    """(dtype, config) for every config of the in-place channels-last kernel that tuning can pick."""
    from ge2.kernels import conv_framed as FR

    if DEVICE.type != "cuda":  # the interpreter's config, persistent and not
        pinned = FR.NHWC_INTERPRETER_CONFIG
        kw = pinned.kwargs
        one_tile = FR._nhwc_cfg(kw["BI"], kw["BH"], kw["BW"], kw["BLOCK_N"], kw["BLOCK_K"], pinned.num_warps,
                                pinned.num_stages, kw["TMA_STORE"], 0)
        configs = [pinned, one_tile]
        return [(dtype, c) for dtype in (torch.float32, torch.bfloat16) for c in configs]
    return [(torch.bfloat16, c) for c in FR.NHWC_CONFIGS_16] + [(torch.float32, c) for c in FR.NHWC_CONFIGS_32]


@pytest.mark.parametrize("dtype,config", _nhwc_configs(), ids=lambda v: str(v) if isinstance(v, torch.dtype) else
                         "{BI}x{BH}x{BW}-n{BLOCK_N}-tma{TMA_STORE}-ps{PERSISTENT}".format(**v.kwargs))
def test_conv2d_nhwc_every_config(dtype, config, monkeypatch):
    # Each in-place config alone, forward and dX: tiles of several images (a ragged last group),
    # ragged rows, columns and channel tiles; persistent configs with one SM's worth of programs, so
    # that each program walks many tiles. Z (gelu) comes with the pointer stores only.
    from ge2.kernels import conv_framed as FR

    if DEVICE.type == "cuda" and FR._tma_sms(DEVICE) == 0:
        pytest.skip("no TMA on this GPU")
    kernel = FR.conv2d_nhwc_kernel
    monkeypatch.setattr(kernel, "configs", [config])
    monkeypatch.setattr(kernel, "cache", {})
    monkeypatch.setattr(kernel, "_fast", {}, raising=False)
    monkeypatch.setattr(FR, "_sm_count", lambda device: 1)
    counting = _Counting(kernel)
    monkeypatch.setattr(FR, "conv2d_nhwc_kernel", counting)
    case = (5, 24, 10, 19, 136, (3, 3), 1, 1, 1, 1) if DEVICE.type == "cuda" else (3, 16, 6, 7, 24, (3, 3), 1, 1, 1, 1)
    # fp32 in tf32, the tensor-core kernels these configs are for (fp32-ieee stores by pointers, so
    # the TMA-store configs are not its to run: the launcher passes TMA_OUT=False there).
    old = ge2.set_matmul_precision("tf32")
    try:
        _check_conv(case, "nhwc", dtype, act="relu" if config.kwargs["TMA_STORE"] else "gelu", seed=41)
    finally:
        ge2.set_matmul_precision(old)
    assert counting.launches == 2 and kernel.best_config is config  # forward, dX


def test_conv2d_framed_weight_gradient_over_splits(monkeypatch):
    # dW's frame rows split over programs; the fp32 partials are added in a fixed order.
    from ge2.kernels import conv_framed as FR

    monkeypatch.setattr(FR, "DW_TARGET_PROGRAMS", 64)
    monkeypatch.setattr(FR, "DW_MIN_STEPS", 2)
    monkeypatch.setattr(FR, "DW_SUM_SPLITS", 2)  # the sum walks its 4 splits in two loads of 2
    case = (3, 16, 6, 7, 20, (3, 3), 1, 1, 1, 1)
    assert FR.dw_splits(3 * 7 * 8 // 16, 9)[0] > 2  # 16-row steps over the 7x8 frames
    _check_conv(case, "nhwc", torch.bfloat16, act="gelu", seed=33)
    x, w = randn(3, 16, 6, 7, dtype=torch.bfloat16, seed=34), randn(20, 16, 3, 3, dtype=torch.bfloat16, seed=35)
    gy = randn(3, 20, 6, 7, dtype=torch.bfloat16, seed=36)
    runs = [call("conv2d_backward", gy, x, w, padding=1, has_bias=True)[1:] for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_framed_fp32_weight_gradient_from_planar_frames(layout, monkeypatch):
    # fp32 dW past the CUDA-core sizes: a GEMM per tap over channel-major ("planar") frames.
    from ge2.kernels import conv as K
    from ge2.kernels import conv_framed as FR

    monkeypatch.setattr(K, "DW_DIRECT_MACS", {})
    monkeypatch.setattr(FR, "DW_TARGET_PROGRAMS", 64)
    monkeypatch.setattr(FR, "DW_MIN_STEPS", 2)
    dw = _Counting(FR.conv2d_planar_dw_kernel)
    monkeypatch.setattr(FR, "conv2d_planar_dw_kernel", dw)
    # One launch for all taps, whatever their shifts' residues mod 4 (x is read by pointers).
    _check_conv((2, 17, 5, 6, 20, (3, 2), 1, (1, 0), (1, 2), 1), layout, act="silu", seed=37)
    assert dw.launches == 1
    _check_conv((1, 16, 4, 5, 16, (3, 3), 1, 1, 1, 1), layout, seed=38)
    _check_conv((2, 16, 6, 5, 16, (2, 3), 1, (0, 2), (2, 1), 1), layout, act="relu", seed=39)  # shifts -2, -1, 0
    assert dw.launches == 3


@pytest.mark.parametrize("split", [True, False], ids=["split planes", "triton tf32x3"])
def test_conv2d_framed_tf32x3_weight_gradient_from_split_planes(split, monkeypatch):
    # tf32x3 dW from frames pre-split into tf32 high and low planes (three tf32 dots a step), or
    # Triton's register-split tf32x3 dot: both as accurate as torch's fp32 dW.
    from ge2.kernels import conv as K
    from ge2.kernels import conv_framed as FR

    monkeypatch.setattr(K, "DW_DIRECT_MACS", {})
    monkeypatch.setattr(FR, "PLANAR_SPLIT", split)
    frames = []
    real_frame = FR.frame
    monkeypatch.setattr(FR, "frame", lambda *a, **kw: frames.append(kw.get("split", False)) or real_frame(*a, **kw))
    old = ge2.set_matmul_precision("tf32x3")
    try:
        _check_conv((2, 16, 5, 7, 20, (3, 3), 1, 1, 1, 1), "nchw", act="relu", seed=44)
    finally:
        ge2.set_matmul_precision(old)
    assert frames.count(True) == (2 if split else 0)  # gZ's and x's planar frames


def test_conv2d_frame_split_planes_are_tf32_high_and_exact_low():
    from ge2.kernels.conv_framed import frame

    t = randn(2, 3, 4, 5, seed=45) * torch.logspace(-20, 20, 5, device=DEVICE)  # exponents far apart
    planes = frame(t, 5, 6, planar=True, origin=3, split=True)
    plain = frame(t, 5, 6, planar=True, origin=3)
    assert planes.shape == (2, *plain.shape)
    hi, lo = planes[0], planes[1]
    assert ((hi.view(torch.int32) & 0x1FFF) == 0).all()  # 10 mantissa bits: exact in tf32
    assert torch.equal(hi + lo, plain)  # the low part is the exact rest
    assert (lo.abs() <= hi.abs() * 2.0 ** -11).all()  # rounded to nearest
    rounded = plain.double()  # round to nearest, ties away from zero, in float64
    scale = torch.exp2(torch.floor(torch.log2(rounded.abs().clamp_min(1e-300))) - 10)
    assert torch.equal(hi.double(), torch.where(rounded == 0, rounded, torch.sign(rounded) * torch.floor(
        rounded.abs() / scale + 0.5) * scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_conv2d_framed_channels_last_weight_is_read_in_place(dtype):
    from ge2.kernels.conv_framed import _weight_rows

    x = randn(2, 16, 5, 6, dtype=dtype, seed=41).contiguous(memory_format=torch.channels_last)
    w = randn(24, 16, 3, 3, dtype=dtype, seed=42).contiguous(memory_format=torch.channels_last)
    assert _weight_rows(w).data_ptr() == w.data_ptr()  # [K, R*S*C] is W's own memory
    assert _weight_rows(w.contiguous()).data_ptr() != w.data_ptr()
    _compare_conv(x, w, None, lambda xt, wt, bt: TF.conv2d(xt, wt, None, 1, 1),
                  lambda xg, wg, bg: F.conv2d(xg, wg, None, 1, 1), seed=43)


def test_conv2d_frame_holds_the_padding_of_every_pass():
    from ge2.kernels.conv_framed import frame_dims

    assert frame_dims(14, 14, 14, 14, 3, 3, (1, 1), (1, 1)) == (15, 15)
    assert frame_dims(5, 7, 5, 7, 2, 2, (0, 0), (1, 1)) == (6, 8)  # "same", even: bottom/right pad 1
    assert frame_dims(3, 4, 7, 8, 3, 3, (3, 3), (1, 1)) == (7, 8)  # gZ larger than x: its frame rules


# ---------------------------------------------------------------------------------------------
# 1x1 convolutions (stride 1, no padding, one group) run as GEMMs (``gemm_1x1_layout``)
# ---------------------------------------------------------------------------------------------
# (N, C, H, W, K): C past one 32-deep K step of the interpreter's GEMM tile, K past one 32-wide
# N tile, N*H*W past one M tile; a batch of one (NCHW: a 2-D GEMM instead of a batched one).
CASES_1X1 = [(3, 37, 5, 7, 33), (1, 6, 4, 9, 5), (2, 3, 1, 1, 4)]


class _Forbidden:
    """Stands in for an implicit-GEMM conv kernel that a 1x1 conv must not launch."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        raise AssertionError(f"the 1x1 GEMM route launched {self.name}")


def _forbid_conv_kernels(monkeypatch) -> None:
    from ge2.kernels import conv as K

    for name in ("conv2d_fwd_kernel", "conv2d_dx_kernel", "conv2d_dw_kernel", "conv2d_depthwise_kernel",
                 "conv2d_depthwise_dw_kernel"):
        monkeypatch.setattr(K, name, _Forbidden(name))


def _layout_1x1(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "nhwc-sliced":  # channels 8..8+C of a wider channels-last tensor: pixel stride C + 11
        wide = torch.cat([x[:, :1].expand(-1, 8, -1, -1), x, x[:, :3]], dim=1)
        return wide.contiguous(memory_format=torch.channels_last)[:, 8:8 + x.shape[1]]
    if layout == "nchw-sliced":  # channels 4..4+C of a wider NCHW tensor: image stride (C + 7)*H*W
        return torch.cat([x[:, :1].expand(-1, 4, -1, -1), x, x[:, :3]], dim=1)[:, 4:4 + x.shape[1]]
    return _layout(x, layout)


def _check_conv_1x1(shape, layout, dtype=torch.float32, bias=True, act=None, seed=0):
    """ge2's 1x1 conv (forward, dx, dW, db) vs torch and float64, on a prepared layout of x."""
    N, C, H, W, K = shape
    x = _layout_1x1(randn(N, C, H, W, dtype=dtype, seed=seed), layout)
    w = randn(K, C, 1, 1, dtype=dtype, seed=seed + 1)
    b = randn(K, dtype=dtype, seed=seed + 2) if bias else None
    t_act = {None: lambda z: z, "relu": TF.relu, "gelu": TF.gelu, "tanh": torch.tanh, "silu": TF.silu}[act]
    _compare_conv(x, w, b, lambda xt, wt, bt: t_act(TF.conv2d(xt, wt, bt)),
                  lambda xg, wg, bg: F.conv2d(xg, wg, bg, activation=act), seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided", "nhwc-sliced"])
@pytest.mark.parametrize("shape", CASES_1X1, ids=lambda s: "x".join(map(str, s)))
def test_conv2d_1x1_runs_as_gemm(shape, layout, dtype, monkeypatch):
    from ge2.kernels import conv as K

    x = _layout_1x1(randn(*shape[:4], dtype=dtype), layout)
    geo = ConvGeometryFor(x, shape[4])
    # (an [N, C, 1, 1] image is both layouts: NCHW wins the tie, as everywhere)
    expected = "nhwc" if layout.startswith("nhwc") and shape[2] * shape[3] > 1 else "nchw"
    assert is_channels_last(x) == (expected == "nhwc")
    assert K.gemm_1x1_layout(x, randn(shape[4], shape[1], 1, 1, dtype=dtype), geo) == expected
    _forbid_conv_kernels(monkeypatch)  # the implicit-GEMM kernels would raise: the GEMM's run
    _check_conv_1x1(shape, layout, dtype, seed=81)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("act", ["relu", "gelu", "tanh", "silu"])
def test_conv2d_1x1_gemm_bias_activation(act, layout, monkeypatch):
    # gelu/silu take act' from the stashed Z (the GEMM epilogue's SAVE_Z), relu/tanh from Y.
    _forbid_conv_kernels(monkeypatch)
    _check_conv_1x1((2, 9, 3, 5, 7), layout, act=act, seed=83)
    _check_conv_1x1((2, 9, 3, 5, 7), layout, torch.bfloat16, bias=False, act=act, seed=84)


def test_conv2d_1x1_gemm_gradient_layout_and_needs(monkeypatch):
    # gY in the other layout (pixels do not merge: copied once), and only some gradients asked for.
    _forbid_conv_kernels(monkeypatch)
    x = randn(2, 6, 3, 4, seed=85).contiguous(memory_format=torch.channels_last)
    w, gy = randn(5, 6, 1, 1, seed=86), randn(2, 5, 3, 4, seed=87)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    TF.conv2d(x64, w64).backward(gy.double())
    TF.conv2d(xt, wt).backward(gy)
    dx, dw, db = call("conv2d_backward", gy, x, w, has_bias=True)
    assert is_channels_last(dx) and dw.is_contiguous()
    assert_matches(dx, x64.grad, xt.grad, name="grad x")
    assert_matches(dw, w64.grad, wt.grad, name="grad weight")
    assert_matches(db, gy.double().sum((0, 2, 3)), gy.sum((0, 2, 3)), name="grad bias")
    dx2, dw2, db2 = call("conv2d_backward", gy, x, w, need_x=False, has_bias=False)
    assert dx2 is None and db2 is None and torch.equal(dw2, dw)
    dx3, dw3, _ = call("conv2d_backward", gy, x, w, need_w=False)
    assert dw3 is None and torch.equal(dx3, dx)


# NCHW 1x1 convs whose pixel rows are 16-byte aligned: conv_1x1's TMA kernel (forward and dX).
# (N, C, H, W, K): C and K past the interpreter's 16-wide tiles, C not a 16-byte row (a padded W copy).
CASES_1X1_TMA = [(2, 37, 4, 4, 33), (3, 8, 2, 8, 20)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nchw-sliced"])
@pytest.mark.parametrize("shape", CASES_1X1_TMA, ids=lambda s: "x".join(map(str, s)))
def test_conv2d_1x1_nchw_tma_kernel(shape, layout, dtype, monkeypatch):
    from ge2.kernels import conv_1x1

    monkeypatch.setattr(conv_1x1, "ENABLED", True)
    monkeypatch.setattr(conv_1x1, "DW_ENABLED", True)
    x = _layout_1x1(randn(*shape[:4], dtype=dtype), layout)
    assert conv_1x1.supports(x.flatten(2), shape[4])
    _forbid_conv_kernels(monkeypatch)
    counting = _Counting(conv_1x1.conv1x1_nchw_kernel)
    monkeypatch.setattr(conv_1x1, "conv1x1_nchw_kernel", counting)
    counting_dw = _Counting(conv_1x1.conv1x1_nchw_dw_kernel)
    monkeypatch.setattr(conv_1x1, "conv1x1_nchw_dw_kernel", counting_dw)
    _check_conv_1x1(shape, layout, dtype, seed=93)
    assert counting.launches == 2 and counting_dw.launches == 1  # forward and dX; dW


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_conv2d_1x1_nchw_tma_kernel_activation_and_z(dtype, monkeypatch):
    # gelu stashes Z (a second TMA store), relu takes act' from Y; unaligned pixel rows fall back.
    from ge2.kernels import conv_1x1

    monkeypatch.setattr(conv_1x1, "ENABLED", True)
    counting = _Counting(conv_1x1.conv1x1_nchw_kernel)
    monkeypatch.setattr(conv_1x1, "conv1x1_nchw_kernel", counting)
    _check_conv_1x1((2, 9, 2, 8, 7), "nchw", dtype, act="gelu", seed=94)
    _check_conv_1x1((2, 9, 4, 4, 7), "nchw", dtype, bias=False, act="relu", seed=95)
    assert counting.launches == 4
    assert not conv_1x1.supports(randn(2, 9, 15, dtype=dtype), 7)  # 15-pixel rows: not 16-byte aligned
    _check_conv_1x1((2, 9, 3, 5, 7), "nchw", dtype, act="gelu", seed=96)
    assert counting.launches == 4


def test_conv2d_1x1_nchw_weight_gradient_fallback(monkeypatch):
    # NCHW dW sums per-image partials; where those would outweigh gZ and X (tiny H*W, many
    # channels) it takes the implicit-GEMM dW kernel instead, which must then be launched.
    from ge2.kernels import conv as K

    monkeypatch.setattr(K, "GEMM_1X1_PARTIAL_BYTES", 0)
    launches = []
    kernel = K.conv2d_dw_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(K, "conv2d_dw_kernel", Counting())
    _check_conv_1x1((3, 8, 1, 2, 9), "nchw", act="relu", seed=88)
    assert len(launches) == 1


def ConvGeometryFor(x: torch.Tensor, k: int, stride=1, padding=0, groups=1):  # noqa: N802
    from ge2.backend.conv import conv_geometry

    return conv_geometry("conv2d", tuple(x.shape), (k, x.shape[1] // groups, 1, 1), stride, padding, 1, groups)


def test_conv2d_1x1_gemm_route_only_where_it_is_a_gemm():
    from ge2.kernels import conv as K

    x, w = randn(2, 8, 6, 6, seed=89), randn(4, 8, 1, 1, seed=90)
    assert K.gemm_1x1_layout(x, w, ConvGeometryFor(x, 4)) == "nchw"
    assert K.gemm_1x1_layout(x, w, ConvGeometryFor(x, 4, stride=2)) is None      # strided: implicit GEMM
    assert K.gemm_1x1_layout(x, w, ConvGeometryFor(x, 4, padding=1)) is None     # zero border
    assert K.gemm_1x1_layout(x, w[:, :4], ConvGeometryFor(x, 4, groups=2)) is None
    assert K.gemm_1x1_layout(x, randn(4, 8, 3, 3), ConvGeometryFor(x, 4)) is None
    nhwc = x.contiguous(memory_format=torch.channels_last)
    assert K.gemm_1x1_layout(nhwc, w, ConvGeometryFor(x, 4)) == "nhwc"
    rows = nhwc[:, :, ::2]  # every other row: n, h, w do not merge into one pixel stride
    assert K.gemm_1x1_layout(rows, w, ConvGeometryFor(rows, 4)) is None
    transposed = x.transpose(2, 3)  # h, w do not merge in NCHW
    assert K.gemm_1x1_layout(transposed, w, ConvGeometryFor(transposed, 4)) is None
    misaligned = randn(2 * 8 * 6 * 6 + 1, seed=92)[1:].view(2, 8, 6, 6)  # base 4 bytes past 16-byte alignment
    assert K.gemm_1x1_layout(misaligned, w, ConvGeometryFor(misaligned, 4)) is None
    # The cases that stay off the route still compute the right thing (strided, padded, every other row).
    _check_conv((2, 8, 6, 6, 4, (1, 1), 2, 1, 1, 1), "nhwc", seed=91)
    y = F.conv2d(ge2.from_torch(rows), ge2.from_torch(w))
    assert_matches(y.data, TF.conv2d(rows.double(), w.double()), TF.conv2d(rows, w))
