"""torch reference of the dropout ops.

The mask comes from torch's generator seeded with (seed, offset), not from Philox-in-Triton: the
oracle has the same distribution and the same determinism (one state, one mask; backward
rebuilds it) but not the same bits as the Triton kernel.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import register


def _keep(shape, state, p, device):
    seed, offset = (int(v) for v in state.tolist())
    g = torch.Generator().manual_seed((seed * 1_000_003 + offset) % (2 ** 63))
    return (torch.rand(shape, generator=g) >= p).to(device)


def _dropout(x, state, *, p):
    if p >= 1.0:
        return torch.zeros_like(x).contiguous()
    return (x.float() * _keep(x.shape, state, p, x.device) / (1.0 - p)).to(x.dtype).contiguous()


register("dropout", "torch")(_dropout)
register("dropout_backward", "torch")(_dropout)


@register("philox_advance", "torch", dtypes=(torch.int64,))
def philox_advance(state, *, n):
    state[1] += n
    return state
