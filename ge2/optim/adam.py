"""Adam and AdamW: one fused launch per dtype per step (fp32 moments)."""
from __future__ import annotations

from typing import Iterable

from ge2 import backend
from ge2.kernels import optim as K
from ge2.optim.optimizer import Optimizer


class Adam(Optimizer):
    """torch.optim.Adam: L2 weight decay added to the gradient; bias-corrected moments."""

    _slots = {"lr": K.LR, "beta1": K.BETA1, "beta2": K.BETA2, "eps": K.EPS, "weight_decay": K.WEIGHT_DECAY}
    _decoupled = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _update(self, hyper, params, grads, groups, **amp) -> None:
        backend.call("adam_step", hyper, params=[p.data for p in params], grads=grads,
                     exp_avgs=self._states(params, "exp_avg"),
                     exp_avg_sqs=self._states(params, "exp_avg_sq"),
                     group_ids=groups, decoupled=self._decoupled, **amp)


class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (p *= 1 - lr wd) before the Adam update; default wd 0.01."""

    _decoupled = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
