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
