"""``Parameter``: a leaf Tensor that a Module registers as trainable (requires_grad=True)."""
from __future__ import annotations

import torch

from ge2.autograd.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that requires grad and is registered by ``Module.__setattr__``; shares ``data``'s memory."""

    def __init__(self, data: "Tensor | torch.Tensor | None" = None, requires_grad: bool = True):
        if data is None:
            data = torch.empty(0)
        if isinstance(data, Tensor):
            data = data.data
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"Parameter: expected a Tensor, got {type(data).__name__}")
        super().__init__(data.detach(), requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
