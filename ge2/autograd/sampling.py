"""Drawing tokens: ``top_k_mask`` and ``multinomial`` on the device (ops in ``ge2.backend.sampling``).

No gradients flow through either (they pick tokens); both return Tensors that do not require grad.
``multinomial`` draws from ge2's device-side [seed, offset] Philox state and advances it on the
device, like dropout, so successive calls draw fresh numbers without a host round trip.
"""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.autograd.dropout import new_rng_state
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import shape_str

call = backend.call


def _rows(op: str, x: Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a ge2 Tensor, got {type(x).__name__}")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: {name} must be [..., V] with V >= 1, got {shape_str(x.shape)}")
    return x.data.reshape(-1, x.shape[-1])


def top_k_mask(logits: Tensor, k: int) -> Tensor:
    """logits [..., V] -> [..., V]: each row's k largest values kept (ties with the k-th too), the rest -inf.

    k larger than V keeps every value (as nanoGPT's ``min(top_k, V)``)."""
    rows = _rows("top_k_mask", logits, "logits")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_k_mask: k must be a positive int, got {k!r}")
    return Tensor(call("topk_mask", rows, k=min(k, rows.shape[1])).reshape(logits.shape))


def multinomial(probs: Tensor, rng_state: torch.Tensor | None = None) -> Tensor:
    """probs [..., V] (non-negative weights, not necessarily normalised) -> int64 [..., 1]: one draw per row.

    ``rng_state``: the int64 [seed, offset] device tensor to draw from (advanced by the number of
    rows); default a fresh one seeded from torch's generator, so ``ge2.manual_seed`` repeats the draw.
    A row without a positive weight draws -1.
    """
    rows = _rows("multinomial", probs, "probs")
    state = rng_state if rng_state is not None else new_rng_state(probs.device)
    if state.device != probs.device:
        raise ValueError(f"multinomial: rng_state is on {state.device} but probs is on {probs.device}")
    idx = call("multinomial", rows, state)
    call("philox_advance", state, n=rows.shape[0])
    return Tensor(idx.reshape(*probs.shape[:-1], 1))
