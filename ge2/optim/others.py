"""RMSprop, Adagrad and Lion on the same fused multi-tensor machinery (one launch per dtype per step)."""
from __future__ import annotations

from typing import Iterable

from ge2 import backend
from ge2.kernels import optim as K
from ge2.optim.optimizer import Optimizer


class RMSprop(Optimizer):
    """torch.optim.RMSprop (centered=False): v = alpha v + (1 - alpha) g^2, p -= lr g / (sqrt(v) + eps)."""

    _slots = {"lr": K.LR, "momentum": K.MOMENTUM, "alpha": K.ALPHA, "eps": K.EPS, "weight_decay": K.WEIGHT_DECAY}

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False):
        if centered:
            raise ValueError("RMSprop: centered=True is not supported (it needs a third state tensor)")
        if not 0.0 <= alpha <= 1.0 or momentum < 0:
            raise ValueError(f"RMSprop: alpha must be in [0, 1] and momentum >= 0, got {alpha}, {momentum}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum))
        self._has_momentum = any(g["momentum"] != 0 for g in self.param_groups)

    def _update(self, hyper, params, grads, groups, **amp) -> None:
        bufs = self._states(params, "momentum_buffer") if self._has_momentum else None
        backend.call("rmsprop_step", hyper, params=[p.data for p in params], grads=grads,
                     square_avgs=self._states(params, "square_avg"), momentum_buffers=bufs,
                     group_ids=groups, has_momentum=self._has_momentum, **amp)


class Adagrad(Optimizer):
    """torch.optim.Adagrad: s += g^2, p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)."""

    _slots = {"lr": K.LR, "lr_decay": K.LR_DECAY, "eps": K.EPS, "weight_decay": K.WEIGHT_DECAY}

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
                                      initial_accumulator_value=initial_accumulator_value))

    def _update(self, hyper, params, grads, groups, **amp) -> None:
        sums = []
        for p, gi in zip(params, groups):
            fresh = "sum" not in self.state.get(p, {})
            s = self._state_tensor(p, "sum")
            if fresh:
                s.fill_(float(self.param_groups[gi]["initial_accumulator_value"]))
            sums.append(s)
        backend.call("adagrad_step", hyper, params=[p.data for p in params], grads=grads, state_sums=sums,
                     group_ids=groups, **amp)


class Lion(Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign updates, one moment."""

    _slots = {"lr": K.LR, "beta1": K.BETA1, "beta2": K.BETA2, "weight_decay": K.WEIGHT_DECAY}

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def _update(self, hyper, params, grads, groups, **amp) -> None:
        backend.call("lion_step", hyper, params=[p.data for p in params], grads=grads,
                     exp_avgs=self._states(params, "exp_avg"), group_ids=groups, **amp)
