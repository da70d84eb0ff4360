"""Dropout with gradients: the mask is never stored, backward regenerates it from the RNG state.

The RNG state is an int64 [seed, offset] device tensor (``rng_state``). Forward copies it (the
snapshot backward needs), draws with the copy, then advances the live state on the device, so
the next call, or the next replay of a captured CUDA graph, draws a fresh mask.
"""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor

call = backend.call

_DEFAULT_STATES: dict[torch.device, torch.Tensor] = {}


def new_rng_state(device) -> torch.Tensor:
    """A fresh [seed, 0] state; the seed is drawn from torch's generator (so ``ge2.manual_seed`` fixes it)."""
    seed = torch.randint(0, 2 ** 62, (1,)).item()
    return torch.tensor([seed, 0], dtype=torch.int64).to(device)


def default_rng_state(device: torch.device) -> torch.Tensor:
    """The per-device state used when no module-owned state is given."""
    if device not in _DEFAULT_STATES:
        _DEFAULT_STATES[device] = new_rng_state(device)
    return _DEFAULT_STATES[device]


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, state, p):
        snapshot = state.clone()
        y = call("dropout", x, snapshot, p=p)
        call("philox_advance", state, n=x.numel())
        ctx.snapshot, ctx.p = snapshot, p
        return y

    @staticmethod
    def backward(ctx, gy):
        return call("dropout_backward", gy, ctx.snapshot, p=ctx.p), None, None


def dropout(x: Tensor, p: float = 0.5, training: bool = True, rng_state: torch.Tensor | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (identity when not training)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    state = rng_state if rng_state is not None else default_rng_state(x.device)
    if state.device != x.device:
        raise ValueError(f"dropout: rng_state is on {state.device} but x is on {x.device}")
    return Dropout.apply(x, state, p)
