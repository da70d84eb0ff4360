"""``Dropout``: Philox dropout with a module-owned RNG state on the device."""
from __future__ import annotations

from ge2 import runtime
from ge2.autograd.dropout import dropout, new_rng_state
from ge2.autograd.tensor import Tensor
from ge2.nn.module import Module


class Dropout(Module):
    """Zero elements with probability p in training (scaling the rest by 1/(1-p)); identity in eval.

    The RNG state [seed, offset] is a non-persistent buffer: it moves with ``to()``, its seed comes
    from torch's generator at construction (``ge2.manual_seed`` makes runs repeatable), and every
    call advances it on the device.
    """

    def __init__(self, p: float = 0.5, device=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p}")
        self.p = p
        self.register_buffer("rng_state", Tensor(new_rng_state(runtime.resolve_device(device))), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        state = self.rng_state.data
        if self.training and self.p > 0 and state.device != x.device:
            raise ValueError(f"Dropout: the module is on {state.device} but x is on {x.device}; call .to()")
        return dropout(x, self.p, self.training, state)

    def extra_repr(self) -> str:
        return f"p={self.p}"
