"""``clip_grad_norm_``: rescale gradients so their total norm is at most max_norm (one Triton reduction)."""
from __future__ import annotations

import math
from typing import Iterable

import torch

from ge2 import backend
from ge2.autograd.tensor import Tensor


def clip_grad_norm_(parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale every ``.grad`` in place by min(max_norm / (total_norm + 1e-6), 1); returns total_norm (0-d).

    The norm and the scale factor stay on the device (no host sync) unless ``error_if_nonfinite``.
    norm_type: 2 or inf.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad.data for p in params if p.grad is not None]
    if not grads:
        dev = params[0].device if params else None
        return Tensor(torch.zeros((), dtype=torch.float32, device=dev))
    for p in params:
        if p.grad is not None and not p.grad.data.is_contiguous():
            p.grad.data = p.grad.data.contiguous()
    grads = [p.grad.data for p in params if p.grad is not None]
    norm = torch.empty(1, dtype=torch.float32, device=grads[0].device)
    backend.call("clip_grad_norm_", norm, grads=grads, max_norm=float(max_norm),
                 norm_type=math.inf if norm_type in (math.inf, "inf") else float(norm_type))
    for p in params:
        if p.grad is not None:
            p.grad._version_counter.value += 1
    total = Tensor(norm.reshape(()))
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite")
    return total
