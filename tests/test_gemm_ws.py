"""The warp-specialised Gluon GEMM (ge2/kernels/gemm_ws.py) against torch on the GPU.

Gluon has no interpreter, so on the CPU these tests skip; there the Triton kernels, which
tests/test_gemm.py covers everywhere, are the path every GEMM takes.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from ge2.backend import call
from ge2.kernels import gemm as gemm_kernels
from tests.numerics import assert_matches, randn
from tests.test_gemm import _bias, _operand, _reference, only_config

from ge2.kernels import gemm_ws

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="the Gluon kernel runs on sm_90 only"),
              pytest.mark.skipif(not gemm_ws.USE_WS, reason="gemm_ws.USE_WS is off (GE2_GEMM_WS=0)")]
CONFIGS = gemm_ws.WS_CONFIGS

LAYOUTS = list(itertools.product((False, True), (False, True)))  # (trans_a, trans_b): K- or MN-major operands


def _launches(monkeypatch) -> list[bool]:
    """The answers of every gemm_ws.launch call from now on (True: the Gluon kernel ran)."""
    ran = []
    launch = gemm_ws.launch
    monkeypatch.setattr(gemm_ws, "launch", lambda *a, **k: ran.append(launch(*a, **k)) or ran[-1])
    return ran


def _only(cfg, monkeypatch):
    """Leave cfg the only config (and forget earlier picks), let every operand layout in, and record
    whether the kernel ran."""
    only_config(gemm_ws.gemm_ws_kernel, cfg, monkeypatch)
    monkeypatch.setattr(gemm_ws, "KMAJOR_ONLY", False)
    return _launches(monkeypatch)


def _check(a, b, bias, attrs, ran, name, out_dtype=None):
    y, z = call("gemm", a, b, None, bias, save_z=True, out_dtype=out_dtype, **attrs)
    assert ran and ran[-1], "the Gluon kernel did not run"
    (y64, z64), (y_t, z_t) = (_reference(a, b, None, bias, dtype=torch.float64, **attrs),
                              _reference(a, b, None, bias, **attrs))
    if out_dtype is not None:
        y_t, z_t = y_t.to(out_dtype), z_t.to(out_dtype)
    assert y.dtype == (out_dtype or a.dtype)
    assert_matches(y, y64, y_t, name=f"y {name}")
    if z is not None:
        assert_matches(z, z64, z_t, name=f"z {name}")


@pytest.mark.parametrize("index", range(len(CONFIGS)))
@pytest.mark.parametrize("trans_a,trans_b", LAYOUTS)
def test_every_config_and_layout(index, trans_a, trans_b, monkeypatch):
    """Each config alone, every operand layout, ragged M and N (TMA clips the stores) and a K that
    is not a multiple of BLOCK_K (the loads zero-fill); bias per column, gelu with Z saved."""
    ran = _only(CONFIGS[index], monkeypatch)
    M, N, K = 3000, 1560, 776  # 24 x 13 tiles of 128x128 (more than two per SM); 16-byte rows either way
    a = _operand(M, K, trans_a, dtype=torch.bfloat16, seed=3)
    b = _operand(K, N, trans_b, dtype=torch.bfloat16, seed=4)
    attrs = dict(trans_a=trans_a, trans_b=trans_b, alpha=1.0, beta=0.0, bias_kind="per_n", act="gelu", act_alpha=0.01)
    _check(a, b, _bias("per_n", M, N, torch.bfloat16, seed=5), attrs, ran, f"config {index}")


@pytest.mark.parametrize("act,bias_kind,out", [("none", "none", None), ("relu", "scalar", None),
                                               ("silu", "per_m", None), ("tanh", "per_n", torch.float32),
                                               ("gelu", "per_m", torch.float32), ("gelu_tanh", "none", None)])
def test_epilogues(act, bias_kind, out, monkeypatch):
    """Every bias kind, activations with and without Z, alpha != 1, fp16 and an fp32 output."""
    out_bytes = (out or torch.bfloat16).itemsize  # a 4-deep ring and two fp32 output tiles overflow shared memory
    ran = _only(next(c for c in CONFIGS if gemm_ws._smem_bytes(c.kwargs, out_bytes) <= gemm_ws.SMEM_BYTES), monkeypatch)
    M, N, K = 4103, 2056, 520
    dtype = torch.float16 if act == "silu" else torch.bfloat16
    a, b = randn(M, K, dtype=dtype, seed=7), randn(N, K, dtype=dtype, seed=8)
    attrs = dict(trans_a=False, trans_b=True, alpha=0.75, beta=0.0, bias_kind=bias_kind, act=act, act_alpha=0.01)
    _check(a, b, _bias(bias_kind, M, N, dtype, seed=9), attrs, ran, f"{act}/{bias_kind}", out_dtype=out)


@pytest.mark.parametrize("trans_a,trans_b", [(True, True), (False, False)])
def test_mn_major_operands_stay_with_triton(trans_a, trans_b, monkeypatch):
    """By default an MN-major operand goes to the Triton kernel (faster there); the answer is the same."""
    ran = _launches(monkeypatch)
    M, N, K = 3000, 1560, 776
    a = _operand(M, K, trans_a, dtype=torch.bfloat16, seed=13)
    b = _operand(K, N, trans_b, dtype=torch.bfloat16, seed=14)
    attrs = dict(trans_a=trans_a, trans_b=trans_b, alpha=1.0, beta=0.0, bias_kind="none", act="none", act_alpha=0.01)
    y = call("gemm", a, b, None, None, **attrs)[0]
    assert ran == [False], "an MN-major operand reached the Gluon kernel"
    assert_matches(y, _reference(a, b, None, None, dtype=torch.float64, **attrs)[0],
                   _reference(a, b, None, None, **attrs)[0], name="y")


def test_same_bits_every_call_and_no_tile_left(monkeypatch):
    """Two launches into NaN-filled outputs agree bit for bit: every tile is written, in a fixed order."""
    ran = _only(CONFIGS[0], monkeypatch)
    M, N, K = 8192 + 77, 768, 2304
    x, w = randn(M, K, dtype=torch.bfloat16, seed=11), randn(N, K, dtype=torch.bfloat16, seed=12)
    outs = []
    for _ in range(2):
        y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=x.device)
        gemm_kernels._launch(gemm_kernels._view(x, False), gemm_kernels._view(w, True), y)
        outs.append(y)
    assert ran == [True, True]
    assert torch.equal(outs[0], outs[1]) and not outs[0].isnan().any()
    assert_matches(outs[0], x.double() @ w.double().t(), (x @ w.t()), name="y")


def test_declines_what_it_cannot_take(monkeypatch):
    """Too few tiles, a non-16-bit operand, unaligned output rows: the Triton kernels run."""
    monkeypatch.setattr(gemm_ws, "KMAJOR_ONLY", False)  # w is MN-major here: each case declines for its own reason
    sms = gemm_kernels._sm_count(torch.device("cuda"))

    def takes(x, w, y):
        operands = gemm_kernels._tma_operands(gemm_kernels._view(x, False), gemm_kernels._view(w, False))
        assert operands is not None, "TMA must be able to read the operands: the case is about something else"
        return gemm_ws.launch(operands, x.shape[0], w.shape[1], x.shape[1], y, z=None, bias=None, bias_kind=0,
                              act=0, act_alpha=0.01, alpha=1.0, num_sms=sms)

    x, w = randn(256, 512, dtype=torch.bfloat16, seed=1), randn(512, 512, dtype=torch.bfloat16, seed=2)
    assert not takes(x, w, torch.empty(256, 512, dtype=torch.bfloat16, device=x.device))
    big_x = randn(4096, 1024, dtype=torch.float32, seed=3)
    big_w = randn(1024, 4096, dtype=torch.float32, seed=4)
    assert not takes(big_x, big_w, torch.empty(4096, 4096, dtype=torch.float32, device=x.device))
    y_odd = torch.empty(4096, 4100, dtype=torch.bfloat16, device=x.device)[:, :4096]  # rows of 8200 bytes
    assert not takes(big_x.bfloat16(), big_w.bfloat16(), y_odd)
