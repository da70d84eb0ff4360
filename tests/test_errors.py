"""Bad input gets a clear error naming the op, the argument and the shapes/dtypes."""
from __future__ import annotations

import pytest
import torch

import ge2
from ge2 import backend
from numerics import DEVICE, randn


def t(*shape, dtype=torch.float32):
    return ge2.from_torch(randn(*shape, dtype=dtype))


def test_broadcast_mismatch():
    with pytest.raises(ValueError, match=r"add: cannot broadcast a \[3, 4\] and b \[5\]"):
        t(3, 4) + t(5)


def test_dtype_not_supported():
    with pytest.raises(TypeError, match="neg: x has dtype bool, expected one of"):  # torch refuses it too
        -(ge2.arange(4) > 1)


def test_matmul_inner_dim_mismatch():
    with pytest.raises(ValueError, match=r"matmul: a \[3, 4\] and b \[5, 6\] do not match: a has 4 columns, b has 5 rows"):
        t(3, 4) @ t(5, 6)


def test_matmul_dtype_mismatch_and_0d():
    with pytest.raises(TypeError, match="matmul: a has dtype float32 but b has bfloat16"):
        t(3, 4) @ t(4, 2, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="matmul: a is 0-d"):
        t() @ t(3)


def test_matmul_batch_mismatch():
    with pytest.raises(ValueError, match=r"matmul: cannot broadcast a \[2\] and b \[3\]"):
        t(2, 3, 4) @ t(3, 4, 5)


def test_reduction_dim_out_of_range():
    with pytest.raises(ValueError, match="sum: dim 3 is out of range for a 2-D tensor"):
        t(2, 3).sum(3)


def test_reshape_invalid():
    with pytest.raises(ValueError, match=r"reshape: shape \[4, 4\] is invalid for input of size 12"):
        t(3, 4).reshape(4, 4)
    with pytest.raises(ValueError, match="view: cannot view a tensor of shape"):
        t(3, 4).T.view(12)


def test_cat_mismatch():
    with pytest.raises(ValueError, match=r"cat: tensors\[1\] has shape \[3, 5\], incompatible"):
        ge2.cat([t(2, 4), t(3, 5)], 0)


def test_expand_invalid():
    with pytest.raises(ValueError, match=r"expand: cannot expand shape \[3, 2\]"):
        t(3, 2).expand(3, 4)


def test_unsupported_index():
    with pytest.raises(TypeError, match="index: unsupported index type float"):
        t(3)[1.5]
    with pytest.raises(IndexError, match="tensor shape"):
        t(3)[5]


def test_activation_arguments():
    with pytest.raises(ValueError, match="activation: unknown activation 'swish'"):
        backend.call("activation", randn(3), act="swish")
    with pytest.raises(ValueError, match="leaky_relu slope must be > 0"):
        backend.call("activation", randn(3), act="leaky_relu", alpha=-0.1)


def test_wrong_argument_types():
    with pytest.raises(TypeError, match="add: got a torch.Tensor; wrap it with ge2.from_torch"):
        t(3) + randn(3)
    with pytest.raises(TypeError, match="exp: x must be a tensor, got list"):
        backend.call("exp", [1.0])
    with pytest.raises(TypeError, match="where: cond has dtype float32, expected one of bool"):
        backend.call("where", randn(3), 1.0, 2.0)


def test_unknown_op_and_backend():
    with pytest.raises(KeyError, match="no op named 'conv9d'"):
        backend.call("conv9d", randn(3))
    with pytest.raises(ValueError, match="use_backend: backend must be one of"):
        ge2.use_backend("numpy")
    with pytest.raises(ValueError, match="set_matmul_precision: precision must be one of"):
        ge2.set_matmul_precision("fp8")


def test_devices():
    with pytest.raises(ValueError, match="device: ge2 runs on 'cuda' or 'cpu'"):
        ge2.zeros(2, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU is available"):
            ge2.zeros(2, device="cuda")
    else:
        a = ge2.from_torch(randn(3))
        b = ge2.from_torch(torch.randn(3))  # cpu tensor
        with pytest.raises(ValueError, match="add: b is on cpu but the other inputs are on cuda"):
            a + b


def test_item_and_bool_of_many_elements():
    with pytest.raises(ValueError, match=r"item: only one-element tensors can be converted, got shape \[3\]"):
        t(3).item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(t(3))
