"""SGD with momentum, dampening, Nesterov and weight decay: one fused launch per dtype per step."""
from __future__ import annotations

from typing import Iterable

from ge2 import backend
from ge2.kernels import optim as K
from ge2.optim.optimizer import Optimizer


class SGD(Optimizer):
    """torch.optim.SGD's rule: d = g + wd p; buf = momentum buf + (1 - dampening) d; p -= lr (d + momentum buf | buf)."""

    _slots = {"lr": K.LR, "momentum": K.MOMENTUM, "dampening": K.DAMPENING, "weight_decay": K.WEIGHT_DECAY}

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        if momentum < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {momentum}")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))
        # whether a momentum buffer exists is fixed per optimizer (it selects the kernel variant)
        self._has_momentum = any(g["momentum"] != 0 for g in self.param_groups)
        self._nesterov = any(g["nesterov"] for g in self.param_groups)

    def _update(self, hyper, params, grads, groups, **amp) -> None:
        bufs = self._states(params, "momentum_buffer") if self._has_momentum else None
        backend.call("sgd_step", hyper, params=[p.data for p in params], grads=grads, momentum_buffers=bufs,
                     group_ids=groups, has_momentum=self._has_momentum, nesterov=self._nesterov, **amp)
