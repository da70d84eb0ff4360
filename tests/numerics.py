"""Numerics helpers shared by the tests: errors against float64 references, judged against torch."""
from __future__ import annotations

import os

import torch

import ge2

# On a GPU the suite runs larger shapes too; GE2_TEST_LARGE=0/1 overrides.
LARGE: bool = os.environ.get("GE2_TEST_LARGE", "1" if torch.cuda.is_available() else "0") == "1"
DEVICE: torch.device = ge2.device()

# What each dtype's arithmetic gives on a well-conditioned op (~ a few ulps, relative).
EPS = {
    torch.float64: 1e-13,
    torch.float32: 2e-6,
    torch.bfloat16: 1e-2,
    torch.float16: 2e-3,
}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN in ``out`` where ref is finite counts as infinite)."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if out64.shape != ref64.shape:
        raise AssertionError(f"shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}")
    if torch.isnan(out64).ne(torch.isnan(ref64)).any():
        return float("inf")
    finite = torch.isfinite(ref64)
    if torch.isinf(ref64).any() and not torch.equal(out64[~finite], ref64[~finite]):
        return float("inf")
    diff = (out64[finite] - ref64[finite]).norm().item()
    scale = ref64[finite].norm().item()
    return diff / scale if scale > 0 else diff


def assert_matches(out, ref64, torch_out=None, *, factor: float = 2.0, name: str = "output") -> None:
    """ge2's error vs the float64 reference must be ≤ factor × torch's own error (or a few ulps)."""
    floor = EPS[out.dtype] if out.dtype in EPS else 0.0
    err = rel_error(out, ref64)
    budget = floor
    if torch_out is not None:
        budget = max(budget, factor * rel_error(torch_out, ref64))
    assert err <= budget, f"{name}: relative error {err:.3e} > budget {budget:.3e} ({out.dtype})"


def randn(*shape: int, dtype=torch.float32, device=None, noncontig: bool = False, seed: int | None = None):
    """Random normal torch tensor; ``noncontig`` gives a strided view (every other element of a wider buffer)."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    device = device or DEVICE
    if noncontig and shape:
        wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)
        return wide.to(device=device, dtype=dtype)[..., 1::2]
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def grad_check(fn, x64: torch.Tensor, *, seed: int, dtype: torch.dtype) -> None:
    """fn on a ge2 Tensor and on torch tensors: ge2's output and input gradient (for a random output
    gradient) vs torch autograd in ``dtype`` and float64, x64 the float64 input; a tuple output is
    judged by its first element."""
    x = x64.to(dtype)
    t = ge2.from_torch(x.clone()).requires_grad_()
    out = fn(t)
    out = out[0] if isinstance(out, tuple) else out
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x.device)
    (out * ge2.from_torch(g.to(dtype))).sum().backward()
    refs = []
    for dt in (dtype, torch.float64):
        xt = x64.to(dt).clone().requires_grad_()
        o = fn(xt)
        o = o[0] if isinstance(o, tuple) else o
        (o * g.to(dt)).sum().backward()
        refs.append((o.detach(), xt.grad))
    assert_matches(out.data, refs[1][0], refs[0][0], name="forward")
    assert_matches(t.grad.data, refs[1][1], refs[0][1], name="gradient")
