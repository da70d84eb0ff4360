"""Matrix products with gradients: ``matmul`` with torch's broadcasting rules, on the "gemm" op."""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.amp.autocast_mode import state as _amp_state
from ge2.amp import autocast_mode as _amp
from ge2.autograd.function import Function
from ge2.autograd.math import sum_to_shape
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import broadcast_shapes, dtype_name


def _gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return backend.call("gemm", a, b)[0]


def _batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., M, K] @ [..., K, N] -> [..., M, N] (batch dims broadcast; both at least 2-D)."""
    (m, k), n = a.shape[-2:], b.shape[-1]
    if b.dim() == 2:
        # A weight-like b: fold a's batch into M, one 2-D GEMM (a view when a is contiguous).
        return _gemm(a.reshape(-1, k), b).reshape(*a.shape[:-2], m, n)
    batch = broadcast_shapes("matmul", ("a", "b"), (a.shape[:-2], b.shape[:-2]))
    # expand gives stride-0 batch dims; the GEMM reads them through strides, no copy.
    a3 = a.expand(*batch, m, k).reshape(-1, m, k)
    b3 = b.expand(*batch, k, n).reshape(-1, k, n)
    return _gemm(a3, b3).reshape(*batch, m, n)


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a_vec, ctx.b_vec = a.dim() == 1, b.dim() == 1
        a2 = a.unsqueeze(0) if ctx.a_vec else a
        b2 = b.unsqueeze(-1) if ctx.b_vec else b
        ctx.save_for_backward(a, b)
        y = _batched_matmul(a2, b2)
        ctx.y2_shape = y.shape
        # Drop the dims that 1-D operands were promoted with, as torch.matmul does.
        shape = list(y.shape)
        if ctx.b_vec:
            del shape[-1]
        if ctx.a_vec:
            del shape[-1 if ctx.b_vec else -2]
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, gy):
        a, b = ctx.saved_tensors
        a2 = a.unsqueeze(0) if ctx.a_vec else a
        b2 = b.unsqueeze(-1) if ctx.b_vec else b
        gy = gy.reshape(ctx.y2_shape)
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = sum_to_shape(_batched_matmul(gy, b2.mT), a2.shape).reshape(a.shape)
        if ctx.needs_input_grad[1]:
            if b2.dim() == 2:
                k, n = b2.shape
                gb = _gemm(a2.reshape(-1, k).mT, gy.reshape(-1, n))
            else:
                gb = sum_to_shape(_batched_matmul(a2.mT, gy), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with torch.matmul's rules: 1-D vectors, [..., M, K] @ [..., K, N], batch broadcast."""
    if _amp_state.on:
        a, b = _amp.cast_low(a, b)
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, Tensor):
            raise TypeError(f"matmul: {name} must be a Tensor, got {type(t).__name__}")
        if t.ndim == 0:
            raise ValueError(f"matmul: {name} is 0-d; both arguments need at least one dimension")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a has dtype {dtype_name(a.dtype)} but b has {dtype_name(b.dtype)}")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ValueError(
            f"matmul: a {list(a.shape)} and b {list(b.shape)} do not match: a has {k_a} columns, b has {k_b} rows"
        )
    if a.ndim > 2 and b.ndim > 2:
        broadcast_shapes("matmul", ("a", "b"), (a.shape[:-2], b.shape[:-2]))
    return MatMul.apply(a, b)
