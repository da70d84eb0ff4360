"""Matrix products with gradients: ``matmul`` with torch's broadcasting rules, on the "gemm" op."""
from __future__ import annotations

import math

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


def _rows(t: torch.Tensor, *tail: int) -> torch.Tensor:
    """t reshaped to [prod(leading dims), *tail]; explicit sizes, since -1 is ambiguous for 0 elements (K = 0)."""
    return t.reshape(math.prod(t.shape[:t.dim() - len(tail)]), *tail)


def _batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., M, K] @ [..., K, N] -> [..., M, N] (batch dims broadcast; both at least 2-D).

    An empty contraction (K = 0) gives zeros, as torch does: the GEMM kernel's accumulator starts at 0.
    """
    (m, k), n = a.shape[-2:], b.shape[-1]
    if b.dim() == 2:
        # A weight-like b: fold a's batch into M, one 2-D GEMM (a view when a is contiguous).
        return _gemm(_rows(a, k), b).reshape(*a.shape[:-2], m, n)
    batch = broadcast_shapes("matmul", ("a", "b"), (a.shape[:-2], b.shape[:-2]))
    # expand gives stride-0 batch dims; the GEMM reads them through strides, no copy.
    a3 = _rows(a.expand(*batch, m, k), m, k)
    b3 = _rows(b.expand(*batch, k, n), k, n)
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
                gb = _gemm(_rows(a2, k).mT, _rows(gy, n))
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


def mm(a: Tensor, b: Tensor) -> Tensor:
    """[M, K] @ [K, N] -> [M, N] (torch.mm: 2-D only, no broadcasting)."""
    for name, t in (("input", a), ("mat2", b)):
        if isinstance(t, Tensor) and t.ndim != 2:
            raise ValueError(f"mm: {name} must be 2-D, got {list(t.shape)}")
    return matmul(a, b)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """[B, M, K] @ [B, K, N] -> [B, M, N] (torch.bmm: 3-D, equal batches, no broadcasting)."""
    for name, t in (("input", a), ("mat2", b)):
        if isinstance(t, Tensor) and t.ndim != 3:
            raise ValueError(f"bmm: {name} must be 3-D, got {list(t.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"bmm: batch sizes differ: input {list(a.shape)} and mat2 {list(b.shape)}")
    return matmul(a, b)


class AddMM(Function):
    """y = beta * c + alpha * a @ b in one GEMM (c broadcast to [M, N] through zero strides)."""

    @staticmethod
    def forward(ctx, c, a, b, beta, alpha):
        ctx.save_for_backward(a, b)
        ctx.c_shape, ctx.beta, ctx.alpha = tuple(c.shape), beta, alpha
        y_shape = (a.shape[0], b.shape[1])
        # beta == 0 ignores c, NaNs included (torch's rule), so the GEMM does not read it.
        return backend.call("gemm", a, b, c=c.expand(y_shape) if beta != 0 else None, alpha=alpha, beta=beta)[0]

    @staticmethod
    def backward(ctx, gy):
        a, b = ctx.saved_tensors
        need_c, need_a, need_b = ctx.needs_input_grad[:3]
        ga, gb, _, gc = backend.call("gemm_backward", gy, a, b, alpha=ctx.alpha, beta=ctx.beta, has_c=need_c,
                                     need_a=need_a, need_b=need_b)
        if need_c:
            gc = sum_to_shape(gc, ctx.c_shape)
        return gc, ga, gb, None, None


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1.0, alpha: float = 1.0) -> Tensor:
    """beta * input + alpha * mat1 @ mat2: mat1 [M, K], mat2 [K, N], input broadcastable to [M, N] (torch.addmm)."""
    if _amp_state.on:
        input, mat1, mat2 = _amp.cast_low(input, mat1, mat2)
    for name, t in (("input", input), ("mat1", mat1), ("mat2", mat2)):
        if not isinstance(t, Tensor):
            raise TypeError(f"addmm: {name} must be a Tensor, got {type(t).__name__}")
    for name, t in (("mat1", mat1), ("mat2", mat2)):
        if t.ndim != 2:
            raise ValueError(f"addmm: {name} must be 2-D, got {list(t.shape)}")
    if mat1.shape[1] != mat2.shape[0]:
        raise ValueError(f"addmm: mat1 {list(mat1.shape)} and mat2 {list(mat2.shape)} do not match: "
                         f"mat1 has {mat1.shape[1]} columns, mat2 has {mat2.shape[0]} rows")
    y_shape = (mat1.shape[0], mat2.shape[1])
    if broadcast_shapes("addmm", ("input", "mat1 @ mat2"), (tuple(input.shape), y_shape)) != y_shape:
        raise ValueError(f"addmm: input {list(input.shape)} does not broadcast to mat1 @ mat2's {list(y_shape)}")
    if len({input.dtype, mat1.dtype, mat2.dtype}) != 1:
        raise TypeError(f"addmm: input, mat1 and mat2 must share a dtype, got {dtype_name(input.dtype)}, "
                        f"{dtype_name(mat1.dtype)} and {dtype_name(mat2.dtype)}")
    return AddMM.apply(input, mat1, mat2, float(beta), float(alpha))


Tensor.mm = mm
Tensor.bmm = bmm
Tensor.addmm = lambda self, mat1, mat2, *, beta=1.0, alpha=1.0: addmm(self, mat1, mat2, beta=beta, alpha=alpha)
