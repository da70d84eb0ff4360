"""Reference of the sampling ops: torch's top-k threshold, and the inverse-CDF draw in float64 with
the kernel's uniforms (Triton's Philox, ``philox_uniform``), so the oracle draws the kernel's index."""
from __future__ import annotations

import numpy as np
import torch

from ge2.backend.registry import register
from ge2.backend.torch_backend.dropout import philox_uniform


@register("topk_mask", "torch")
def topk_mask(x, *, k):
    kth = torch.topk(x.float(), k, dim=1).values[:, -1:]
    return torch.where(x.float() >= kth, x.float(), float("-inf")).to(x.dtype).contiguous()


@register("multinomial", "torch")
def multinomial(p, state):
    seed, offset = (int(v) for v in state.tolist())
    M, V = p.shape
    u = torch.from_numpy(philox_uniform(seed, offset + np.arange(M, dtype=np.int64)).astype(np.float64))
    w = p.detach().double().cpu()
    running = w.cumsum(1)
    hit = (running > (u * w.sum(1))[:, None]) & (w > 0)
    idx = torch.arange(V).expand(M, V)
    first = torch.where(hit, idx, V).amin(1) if V else torch.full((M,), V)
    last = torch.where(w > 0, idx, -1).amax(1) if V else torch.full((M,), -1)
    return torch.where(first == V, last, first).to(torch.int64).to(p.device)
