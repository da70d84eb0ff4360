"""2-D pooling: max / avg / adaptive avg forward and backward vs torch and float64, both layouts, all dtypes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2.backend import call
from ge2.kernels.conv import is_channels_last
from numerics import DEVICE, LARGE, assert_matches, randn

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _input(shape, layout, dtype, seed):
    x = randn(*shape, dtype=dtype, seed=seed)
    if layout == "nhwc":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # a non-dense view: every other column of a wider image
        return torch.stack([x, -x], dim=4).reshape(*x.shape[:3], -1)[..., ::2]
    return x


def _check_pool(g_fn, t_fn, x, seed=0):
    """Forward and input gradient of ge2's pool vs torch in x's dtype and in float64."""
    xg = ge2.from_torch(x.clone(), requires_grad=True)
    xt = x.clone().requires_grad_()
    x64 = x.detach().double().cpu().requires_grad_()
    yg, yt, y64 = g_fn(xg), t_fn(xt), t_fn(x64)
    assert tuple(yg.shape) == tuple(yt.shape) and yg.dtype == x.dtype
    assert yg.data.is_contiguous(memory_format=torch.channels_last if is_channels_last(x) else torch.contiguous_format)
    assert_matches(yg.data, y64, yt, name="forward")
    gy = randn(*yt.shape, dtype=x.dtype, seed=seed + 100)
    yg.backward(ge2.from_torch(gy))
    yt.backward(gy)
    y64.backward(gy.double().cpu())
    assert_matches(xg.grad.data, x64.grad, xt.grad, name="grad x")


# (kernel, stride, padding, dilation, ceil_mode): overlapping windows, padding, dilation, ceil rounding,
# and windows that tile the input (stride == kernel, no padding: one window per pixel in the backward).
MAX_CASES = [
    (2, None, 0, 1, False),
    ((2, 3), (2, 3), 0, 1, True),                        # windows tile the input (backward's one-window case), ceil

    (3, 2, 1, 1, True),
    (3, 1, 1, 2, False),
    ((3, 2), (2, 1), (1, 0), 1, True),
    (1, 1, 0, 1, False),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided"])
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pool2d(case, layout):
    k, st, pad, dil, ceil = case
    x = _input((2, 3, 9, 8), layout, torch.float32, seed=1)
    _check_pool(lambda t: F.max_pool2d(t, k, st, pad, dil, ceil), lambda t: TF.max_pool2d(t, k, st, pad, dil, ceil), x)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_max_pool2d_half_dtypes(layout, dtype):
    x = _input((2, 4, 7, 6), layout, dtype, seed=2)
    _check_pool(lambda t: F.max_pool2d(t, 3, 2, 1), lambda t: TF.max_pool2d(t, 3, 2, 1), x)


def test_max_pool2d_indices_match_torch_and_ties_take_the_first():
    x = randn(2, 3, 7, 9, seed=3)
    x[0, 0, :2, :2] = 1.5  # a tie inside one window: torch keeps the first (row-major) maximum
    y, idx = F.max_pool2d(ge2.from_torch(x), 3, 2, 1, return_indices=True)
    yt, it = TF.max_pool2d(x, 3, 2, 1, return_indices=True)
    assert idx.dtype == torch.int64 and torch.equal(idx.data, it) and torch.equal(y.data, yt)


def test_max_pool2d_propagates_nan_and_handles_all_minus_inf():
    x = randn(1, 2, 4, 4, seed=4)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1] = float("-inf")
    y, idx = F.max_pool2d(ge2.from_torch(x), 2, return_indices=True)
    yt, it = TF.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(y.data.isnan(), yt.isnan()) and torch.equal(idx.data, it)
    assert torch.equal(y.data[~yt.isnan()], yt[~yt.isnan()])


# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    (2, None, 0, False, True, None),
    ((3, 2), None, 0, True, True, None),                  # windows tile the input, partial last window (ceil)

    (3, 2, 1, True, False, None),
    (3, 2, 1, True, True, None),
    ((3, 2), (2, 1), (1, 0), True, False, 3),
    (3, 1, 1, False, True, 5),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided"])
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool2d(case, layout):
    k, st, pad, ceil, cip, div = case
    x = _input((2, 3, 9, 8), layout, torch.float32, seed=5)
    _check_pool(lambda t: F.avg_pool2d(t, k, st, pad, ceil, cip, div),
                lambda t: TF.avg_pool2d(t, k, st, pad, ceil, cip, div), x)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_avg_pool2d_half_dtypes(layout, dtype):
    x = _input((2, 4, 7, 6), layout, dtype, seed=6)
    _check_pool(lambda t: F.avg_pool2d(t, 3, 2, 1, True, False), lambda t: TF.avg_pool2d(t, 3, 2, 1, True, False), x)


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "strided"])
@pytest.mark.parametrize("output_size", [1, (3, 5), (4, 11), (9, 8), (None, 2)], ids=str)
def test_adaptive_avg_pool2d(output_size, layout):
    x = _input((2, 3, 9, 8), layout, torch.float32, seed=7)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, output_size), lambda t: TF.adaptive_avg_pool2d(t, output_size), x)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_adaptive_avg_pool2d_half_dtypes(dtype):
    x = _input((2, 5, 7, 6), "nhwc", dtype, seed=8)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: TF.adaptive_avg_pool2d(t, 1), x)


@pytest.mark.parametrize("layout", ["nchw", "strided"])
def test_nchw_rows_of_32_and_more(layout):
    """NCHW tiles run along rows of >= 32 pixels and over whole planes for narrower rows (pool._launch):
    the shapes above are all narrow, these rows are wide (forward output and backward input)."""
    x = _input((2, 3, 4, 37), layout, torch.float32, seed=13)
    _check_pool(lambda t: F.max_pool2d(t, (2, 3), (1, 1), (1, 1)),
                lambda t: TF.max_pool2d(t, (2, 3), (1, 1), (1, 1)), x)
    _check_pool(lambda t: F.avg_pool2d(t, 3, 1, 1), lambda t: TF.avg_pool2d(t, 3, 1, 1), x)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, (3, 33)), lambda t: TF.adaptive_avg_pool2d(t, (3, 33)), x)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: TF.adaptive_avg_pool2d(t, 1), x)


def test_size_one_dims():
    x = randn(1, 1, 1, 1, seed=9)
    _check_pool(lambda t: F.max_pool2d(t, 1), lambda t: TF.max_pool2d(t, 1), x)
    _check_pool(lambda t: F.avg_pool2d(t, 1), lambda t: TF.avg_pool2d(t, 1), x)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: TF.adaptive_avg_pool2d(t, 1), x)


def test_pool_layers():
    x = randn(2, 3, 8, 8, seed=10)
    for g, t in ((nn.MaxPool2d(3, 2, 1, ceil_mode=True), torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)),
                 (nn.AvgPool2d(2, count_include_pad=False), torch.nn.AvgPool2d(2, count_include_pad=False)),
                 (nn.AdaptiveAvgPool2d((2, 3)), torch.nn.AdaptiveAvgPool2d((2, 3)))):
        _check_pool(g, t, x)
    y, idx = nn.MaxPool2d(2, return_indices=True)(ge2.from_torch(x))
    assert torch.equal(idx.data, TF.max_pool2d(x, 2, return_indices=True)[1])


def test_pool_errors_name_op_argument_and_shapes():
    x = torch.ones(2, 3, 4, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"max_pool2d: kernel \(5, 5\) \(dilation \(1, 1\)\) is larger than the padded "
                                         r"input 4x4 \(x \[2, 3, 4, 4\]"):
        call("max_pool2d", x, kernel_size=5)
    with pytest.raises(ValueError, match=r"avg_pool2d: padding \(2, 2\) must be at most half the \(dilated\) kernel"):
        call("avg_pool2d", x, kernel_size=3, padding=2)
    with pytest.raises(ValueError, match="max_pool2d: x must be 4-D, got shape"):
        call("max_pool2d", torch.ones(3, 4, device=DEVICE), kernel_size=2)
    with pytest.raises(TypeError, match="max_pool2d: x has dtype int64"):
        call("max_pool2d", torch.ones(1, 1, 4, 4, dtype=torch.int64, device=DEVICE), kernel_size=2)
    with pytest.raises(ValueError, match="avg_pool2d: divisor_override must be a positive int"):
        call("avg_pool2d", x, kernel_size=2, divisor_override=0)
    with pytest.raises(TypeError, match="max_pool2d: stride must be an int or a pair of ints"):
        call("max_pool2d", x, kernel_size=2, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="adaptive_avg_pool2d: output_size must be >= 1"):
        call("adaptive_avg_pool2d", x, output_size=0)
    with pytest.raises(ValueError, match=r"max_pool2d_backward: gy has shape \[2, 3, 3, 3\] but pooling x "
                                         r"\[2, 3, 4, 4\] gives \[2, 3, 2, 2\]"):
        call("max_pool2d_backward", torch.ones(2, 3, 3, 3, device=DEVICE),
             torch.zeros(2, 3, 3, 3, dtype=torch.int64, device=DEVICE), input_size=(2, 3, 4, 4), kernel_size=2)
    with pytest.raises(ValueError, match=r"max_pool2d: x must be 4-D \[N, C, H, W\] or 3-D \[C, H, W\]"):
        F.max_pool2d(ge2.from_torch(torch.ones(4, 4, device=DEVICE)), 2)  # (3-D is an unbatched image)


@pytest.mark.skipif(not LARGE, reason="ResNet-sized shapes run on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pool_resnet_shapes(layout, dtype):
    x = _input((32, 64, 112, 112), layout, dtype, seed=11)
    _check_pool(lambda t: F.max_pool2d(t, 3, 2, 1), lambda t: TF.max_pool2d(t, 3, 2, 1), x)
    x = _input((32, 512, 7, 7), layout, dtype, seed=12)
    _check_pool(lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: TF.adaptive_avg_pool2d(t, 1), x)
    _check_pool(lambda t: F.avg_pool2d(t, 2, 1), lambda t: TF.avg_pool2d(t, 2, 1), x)
