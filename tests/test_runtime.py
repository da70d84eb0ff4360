"""Runtime (device, interpreter, autotune helper, precision) and the op registry mechanics."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

import ge2
from ge2 import backend, runtime
from numerics import DEVICE, randn


def test_device_choice_matches_hardware():
    assert ge2.device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert ge2.is_interpreter() and os.environ["TRITON_INTERPRET"] == "1"
    assert ge2.zeros(2).device.type == ge2.device().type
    assert ge2.tensor([1.0, 2.0], device=str(DEVICE.type)).device.type == DEVICE.type


def test_matmul_precision_setting():
    assert ge2.get_matmul_precision() == "tf32x3"  # documented default
    old = ge2.set_matmul_precision("tf32")
    assert old == "tf32x3" and ge2.get_matmul_precision() == "tf32"
    ge2.set_matmul_precision("ieee")
    assert ge2.get_matmul_precision() == "ieee"


@runtime.autotune(
    [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)],
    key=["n"],
    default=1,
)
@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


def test_autotune_helper_runs_everywhere():
    x = randn(1000)
    y = torch.empty_like(x)
    _scale_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert torch.allclose(y, x * 3.0)
    if ge2.is_interpreter():
        # one pinned config (the designated default) where tuning cannot run
        assert len(_scale_kernel.configs) == 1 and _scale_kernel.configs[0].kwargs["BLOCK"] == 64
    else:
        assert len(_scale_kernel.configs) == 2 and _scale_kernel.best_config is not None


def test_use_backend_is_a_setter_and_a_context_manager():
    assert ge2.get_backend() == "triton"
    with ge2.use_backend("torch"):
        assert ge2.get_backend() == "torch"
    assert ge2.get_backend() == "triton"
    ge2.use_backend("torch")
    assert ge2.get_backend() == "torch"
    ge2.use_backend("triton")


def test_both_backends_agree_on_a_registered_op():
    x = randn(5, 3)
    y_triton = backend.call("exp", x)
    with ge2.use_backend("torch"):
        y_torch = backend.call("exp", x)
    assert torch.allclose(y_triton, y_torch, rtol=1e-6)


def test_registering_an_op_is_a_few_lines():
    from ge2.backend import registry

    name = "test_twice"
    dtypes = backend.FLOAT_DTYPES + (torch.int64,)  # the schema admits int64, no impl serves it
    backend.defop(name, backend.Schema((backend.TensorArg("x", dtypes, ndim=(1,)),)))
    backend.register(name, "triton")(lambda x: backend.call("add", x, x))
    backend.register(name, "torch")(lambda x: x * 2)
    try:
        x = randn(4)
        assert torch.allclose(backend.call(name, x), 2 * x)
        with pytest.raises(ValueError, match=r"test_twice: x must be 1-D, got shape \[2, 2\]"):
            backend.call(name, randn(2, 2))
        with pytest.raises(TypeError, match="test_twice: no triton implementation for dtype int64"):
            backend.call(name, torch.arange(3, device=DEVICE))
    finally:
        registry._OPS.pop(name)
