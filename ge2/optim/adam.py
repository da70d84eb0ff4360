"""Adam and AdamW: one fused launch per dtype per step (fp32 moments)."""
from __future__ import annotations

from typing import Iterable

from ge2 import backend
from ge2.autograd.grad_mode import no_grad
from ge2.kernels import optim as K
from ge2.optim.optimizer import Optimizer


class Adam(Optimizer):
    """torch.optim.Adam: L2 weight decay added to the gradient; bias-corrected moments."""

    _slots = {"lr": K.LR, "beta1": K.BETA1, "beta2": K.BETA2, "eps": K.EPS, "weight_decay": K.WEIGHT_DECAY}
    _decoupled = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        name = type(self).__name__
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def add_param_group(self, group) -> None:
        betas = group.get("betas", self.defaults["betas"])
        super().add_param_group({**group, "beta1": betas[0], "beta2": betas[1]})

    def _sync_hyper(self):
        for g in self.param_groups:
            g["beta1"], g["beta2"] = g["betas"]
        return super()._sync_hyper()

    @no_grad()
    def step(self) -> None:
        """Update every parameter that has a gradient."""
        params, grads, groups = self._with_grads()
        hyper = self._sync_hyper()
        if not params:
            return
        backend.call("adam_step", hyper, params=[p.data for p in params], grads=grads,
                     exp_avgs=[self._state_tensor(p, "exp_avg") for p in params],
                     exp_avg_sqs=[self._state_tensor(p, "exp_avg_sq") for p in params],
                     group_ids=groups, decoupled=self._decoupled)
        for p in params:
            p._version_counter.value += 1


class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (p *= 1 - lr wd) before the Adam update; default wd 0.01."""

    _decoupled = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
