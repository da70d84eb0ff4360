"""torch reference implementations of the GEMM ops (the oracle the tests compare with)."""
from __future__ import annotations

import torch

from ge2.backend.registry import register
from ge2.backend.torch_backend.elementwise import _ACT
from ge2.kernels import activations

GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _op(t: torch.Tensor, trans: bool) -> torch.Tensor:
    return t.transpose(-1, -2) if trans else t


def _bias_view(bias: torch.Tensor, bias_kind: str) -> torch.Tensor:
    return {"scalar": lambda: bias.reshape(()), "per_m": lambda: bias[:, None], "per_n": lambda: bias}[bias_kind]()


@register("gemm", "torch", dtypes=GEMM_DTYPES)
def gemm(a, b, c=None, bias=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias_kind="none",
         act="none", act_alpha=0.01, save_z=False, out_dtype=None):
    # Accumulate and run the epilogue in fp32 (fp64 for fp64), like the kernel.
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    z = torch.matmul(_op(a, trans_a).to(acc), _op(b, trans_b).to(acc)) * alpha
    if c is not None and beta != 0.0:
        z = z + beta * c.to(z.dtype)
    if bias_kind != "none":
        z = z + _bias_view(bias, bias_kind).to(z.dtype)
    y = _ACT[act](z, act_alpha)
    dtype = out_dtype or a.dtype
    keep_z = save_z and activations.needs_z(activations.act_code("gemm", act, act_alpha))
    return y.to(dtype).contiguous(), (z.to(dtype).contiguous() if keep_z else None)


def _act_grad(z, y, act, act_alpha):
    """act'(·) from z, or from y for the activations that allow it (as the kernel does)."""
    if z is not None:
        with torch.enable_grad():
            zv = z.detach().requires_grad_()
            (g,) = torch.autograd.grad(_ACT[act](zv, act_alpha), zv, torch.ones_like(zv))
        return g
    return {"none": lambda: torch.ones_like(y), "relu": lambda: (y > 0).to(y.dtype),
            "leaky_relu": lambda: torch.where(y > 0, 1.0, act_alpha).to(y.dtype),
            "sigmoid": lambda: y * (1 - y), "tanh": lambda: 1 - y * y}[act]()


def _grad_for(t: torch.Tensor, g: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """g summed over the batch when t is an expanded (batch stride 0) operand, in dtype (default t's)."""
    if t.dim() == 3 and t.shape[0] > 1 and t.stride(0) == 0:
        g = g.sum(0, keepdim=True)
    return g.to(dtype or t.dtype).contiguous()


@register("gemm_backward", "torch", dtypes=GEMM_DTYPES)
def gemm_backward(gy, a, b, z=None, y=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                  bias_kind="none", act="none", act_alpha=0.01, has_c=False, need_a=True, need_b=True,
                  db_dtype=None):
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    saved = (z if z is not None else y if y is not None else gy).to(acc)
    gz = gy.to(acc) * _act_grad(saved if z is not None else None, saved if z is None else None, act, act_alpha)
    op_a, op_b = _op(a, trans_a).to(acc), _op(b, trans_b).to(acc)
    gz_op = gz.to(a.dtype).to(acc)  # the kernel's dA/dB GEMMs read gZ rounded to the operands' dtype
    da = db = None
    if need_a:
        da = _grad_for(a, _op(alpha * gz_op @ op_b.transpose(-1, -2), trans_a))
    if need_b:
        db = _grad_for(b, _op(alpha * op_a.transpose(-1, -2) @ gz_op, trans_b), db_dtype)
    sum_dims = {"none": None, "scalar": tuple(range(gz.dim())), "per_m": (0, 2) if gz.dim() == 3 else (1,),
                "per_n": tuple(range(gz.dim() - 1))}[bias_kind]
    dbias = gz.sum(sum_dims).reshape(-1).to(gy.dtype) if sum_dims is not None else None
    dc = (beta * gz).to(gy.dtype).contiguous() if has_c else None
    return da, db, dbias, dc
