"""batch_norm with each channel's reduction split over several programs (issue 26): tiny tiles force the
split on CPU shapes; forward, running statistics and gradients vs torch (same dtype) and float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from ge2.kernels import norm as KN
from numerics import DEVICE, LARGE, assert_matches, randn


def _layouts(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """x of ``shape`` in the named layout (values ~ 2 * N(0, 1) + 1)."""
    if name == "noncontig":
        return randn(*shape, noncontig=True, seed=1) * 2 + 1
    x = randn(*shape, seed=1) * 2 + 1
    if name == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if name == "batch_inner":  # N is the innermost dim in memory
        return x.permute(*range(1, x.dim()), 0).contiguous().permute(x.dim() - 1, *range(x.dim() - 1))
    return x


def _check(x: torch.Tensor, *, training: bool, affine: bool = True) -> None:
    """F.batch_norm on x vs torch in x's dtype and in float64: y, running stats, gradients of x, w, b."""
    C = x.shape[1]
    w, b = (randn(C, seed=s).to(x.dtype) if affine else None for s in (2, 3))
    rm, rv = randn(C, seed=4).to(x.dtype), (randn(C, seed=5).abs() + 0.5).to(x.dtype)
    gy = randn(*x.shape, seed=6).to(x.dtype)
    tracked = ge2.from_torch(torch.tensor(3, device=DEVICE))
    gx = ge2.from_torch(x.clone(), requires_grad=True)
    gp = [ge2.from_torch(p.clone(), requires_grad=True) if p is not None else None for p in (w, b)]
    grm, grv = ge2.from_torch(rm.clone()), ge2.from_torch(rv.clone())
    y = F.batch_norm(gx, grm, grv, *gp, training=training, momentum=0.3, eps=1e-5, num_batches_tracked=tracked)
    y.backward(ge2.from_torch(gy))
    outs = {}
    for dt in (x.dtype, torch.float64):
        tx = x.to(dt).clone().requires_grad_()
        tp = [p.to(dt).clone().requires_grad_() if p is not None else None for p in (w, b)]
        trm, trv = rm.to(dt).clone(), rv.to(dt).clone()
        ty = TF.batch_norm(tx, trm, trv, *tp, training=training, momentum=0.3, eps=1e-5)
        ty.backward(gy.to(dt))
        outs[dt] = {"y": ty.detach(), "running_mean": trm, "running_var": trv, "grad x": tx.grad,
                    **({"grad w": tp[0].grad, "grad b": tp[1].grad} if affine else {})}
    ours = {"y": y.data, "running_mean": grm.data, "running_var": grv.data, "grad x": gx.grad.data,
            **({"grad w": gp[0].grad.data, "grad b": gp[1].grad.data} if affine else {})}
    for name, out in ours.items():
        assert out.dtype == x.dtype and out.shape == outs[x.dtype][name].shape, name
        assert_matches(out, outs[torch.float64][name], outs[x.dtype][name], name=name)
    assert int(tracked.data.item()) == 3 + training


@pytest.fixture
def split(monkeypatch):
    """Tiles of 8 elements and a one-SM 'device', so that ``BN_PROGRAMS_PER_SM`` is the programs per channel."""
    monkeypatch.setattr(KN, "BN_TILE", 8)
    monkeypatch.setattr(KN, "_sm_count", lambda device: 1)
    return lambda per_channel: monkeypatch.setattr(KN, "BN_PROGRAMS_PER_SM", per_channel * 3)


@pytest.mark.parametrize("shape", [(5, 3, 7, 3), (1, 3, 5, 7), (6, 3, 1, 1), (7, 3), (4, 3, 9), (3, 1, 2, 5)])
@pytest.mark.parametrize("per_channel", [1, 3, 100])
def test_batch_norm_split_shapes(split, shape, per_channel):
    split(per_channel)
    _check(_layouts("contiguous", shape), training=True)


@pytest.mark.parametrize("layout", ["noncontig", "channels_last", "batch_inner"])
def test_batch_norm_split_layouts(split, layout):
    split(2)
    _check(_layouts(layout, (3, 3, 5, 6)), training=True)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_split_eval_no_affine_float64(split, training):
    split(2)
    _check(_layouts("contiguous", (3, 3, 5, 2)).double(), training=training)
    _check(_layouts("contiguous", (3, 3, 5, 2)), training=training, affine=False)


def test_batch_norm_split_bf16_and_large_mean(split):
    split(4)
    _check(_layouts("contiguous", (4, 3, 3, 5)).to(torch.bfloat16), training=True)
    # |mean| / std = 2e4: the shifted sums must not cancel (E[x^2] - E[x]^2 would lose every digit)
    x = randn(4, 3, 3, 5, seed=9) * 0.05 + 1000
    _check(x, training=True)


@pytest.mark.parametrize("shape", [(4, 3, 3, 5), (2, 3, 1, 1), (9, 2)])
def test_batch_norm_one_tile_large_mean(shape):
    # the default tiles: each channel is one tile, reduced and normalised by one program (no stats kernel)
    assert KN._bn_grid(shape[0], shape[1], math.prod(shape[2:]), DEVICE)[3] == 1
    _check(randn(*shape, seed=9) * 0.05 + 1000, training=True)
    _check(randn(*shape, seed=10) * 3 - 1, training=True)


def test_batch_norm_split_deterministic(split):
    split(3)
    x = ge2.from_torch(randn(5, 3, 7, 3, seed=11))
    a, b = (F.batch_norm(x, None, None, training=True) for _ in range(2))
    assert torch.equal(a.data, b.data)


@pytest.mark.skipif(not LARGE, reason="GPU-sized shapes (the default tiles and split)")
@pytest.mark.parametrize("shape, layout, dtype", [((16, 64, 28, 28), "contiguous", torch.float32),
                                                  ((8, 32, 7, 7), "channels_last", torch.float32),
                                                  ((1000, 37), "contiguous", torch.float32),
                                                  ((3, 5, 4099), "noncontig", torch.float32),
                                                  ((16, 64, 14, 14), "contiguous", torch.bfloat16),
                                                  ((4, 8, 9, 9), "contiguous", torch.float64)])
def test_batch_norm_default_split_large(shape, layout, dtype):
    _check(_layouts(layout, shape).to(dtype), training=True)
