"""``GradScaler``: dynamic loss scaling for fp16 training, decided on the device.

torch's algorithm (``torch.amp.GradScaler``): the loss is multiplied by ``scale`` before backward
so small fp16 gradients do not flush to zero; before the update the gradients are checked for
inf/NaN and divided by ``scale``; a step whose gradients overflowed is skipped and the scale
backs off (x ``backoff_factor``), and after ``growth_interval`` clean steps it grows
(x ``growth_factor``).

Here nothing of it reads a value back to the host. ``step`` launches one check over all the
gradients (``amp_unscale_``: an inf/NaN flag on the device, the gradients untouched), then the
optimizer's own fused update reads the scale and the flag: it divides each gradient by the scale
as it loads it and stores nothing (its step count included) when the flag is set. ``update`` is
one single-program kernel. A step with a scaler therefore captures into a CUDA graph
(``ge2.capture``) like any other. After ``unscale_`` (for gradient clipping) the gradients are
divided in place and ``step`` only reads the flag. Unlike torch, the gradients a fused ``step``
leaves in ``.grad`` are still scaled.
"""
from __future__ import annotations

from typing import Any

import torch

from ge2 import backend

_READY, _UNSCALED, _STEPPED = range(3)


class GradScaler:
    """torch.amp.GradScaler's API: ``scale(loss)``, ``unscale_(opt)``, ``step(opt)``, ``update()``."""

    def __init__(self, device: str | torch.device | None = None, init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval <= 0:
            raise ValueError(f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}")
        self._device = None if device is None else torch.device(device)
        self._enabled = bool(enabled)
        self._init_scale, self._growth_factor = float(init_scale), float(growth_factor)
        self._backoff_factor, self._growth_interval = float(backoff_factor), growth_interval
        self._init_growth_tracker = 0
        self._scale: torch.Tensor | None = None  # fp32 [] on the device
        self._growth_tracker: torch.Tensor | None = None  # int32 []
        self._found_total: torch.Tensor | None = None  # fp32 []: any optimizer's inf/NaN since update()
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # ---- device state ------------------------------------------------------------------------
    def _lazy_init(self, device: torch.device) -> None:
        if self._scale is None:
            self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
            self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)
            self._found_total = torch.zeros((), dtype=torch.float32, device=device)

    def _optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        st = self._per_optimizer.get(id(optimizer))
        if st is None:
            found = torch.zeros((), dtype=torch.float32, device=self._scale.device)
            st = self._per_optimizer[id(optimizer)] = {"stage": _READY, "found_inf": found, "optimizer": optimizer}
        return st

    def _check_grads(self, optimizer: Any, write: bool) -> torch.Tensor:
        """Raise this optimizer's found-inf flag on the device if a gradient overflowed (write: unscale them)."""
        if self._scale is None:
            raise RuntimeError("GradScaler: call scale(loss) (and backward) before unscale_ or step")
        st = self._optimizer_state(optimizer)
        found = st["found_inf"]
        found.zero_()
        grads = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if not p.grad.data.is_contiguous():
                        p.grad.data = p.grad.data.contiguous()  # as the optimizer itself would
                    grads.append(p.grad.data)
        if grads:
            backend.call("amp_unscale_", self._scale, grads=grads, found_inf=found, found_total=self._found_total,
                         write=write)
        return found

    # ---- the training-step API ---------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """outputs * scale (a Tensor, or a list/tuple of them); outputs unchanged when disabled."""
        from ge2.autograd.tensor import Tensor

        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            self._lazy_init(outputs.device)
            return outputs * Tensor(self._scale)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: outputs must be a Tensor or a list/tuple of Tensors, "
                        f"got {type(outputs).__name__}")

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place (e.g. before clipping); flags inf/NaN."""
        if not self._enabled:
            return
        if self._scale is not None and self._optimizer_state(optimizer)["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if self._scale is not None and self._optimizer_state(optimizer)["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        self._check_grads(optimizer, write=True)
        self._optimizer_state(optimizer)["stage"] = _UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        """optimizer.step() with the gradients unscaled, skipped on the device if any is inf/NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if args or kwargs:
            raise TypeError("GradScaler.step: ge2 optimizers take no step arguments (closures are not supported)")
        st = self._optimizer_state(optimizer) if self._scale is not None else None
        if st is not None and st["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        unscaled = st is not None and st["stage"] == _UNSCALED
        found = st["found_inf"] if unscaled else self._check_grads(optimizer, write=False)
        fused = getattr(optimizer, "_step", None)
        if fused is not None:
            fused({"scale": None if unscaled else self._scale, "found_inf": found})
        else:
            # an optimizer that cannot read the flag on the device: torch's way, with a host read
            if not unscaled:
                self._check_grads(optimizer, write=True)
            if found.item() == 0:
                optimizer.step()
        self._optimizer_state(optimizer)["stage"] = _STEPPED

    def update(self, new_scale: float | Any | None = None) -> None:
        """Back off or grow the scale from the inf/NaN checks since the last update (or set ``new_scale``)."""
        if not self._enabled:
            return
        if new_scale is not None:
            if self._scale is None:
                raise RuntimeError("GradScaler.update: no scale yet (call scale(loss) first)")
            if isinstance(new_scale, (int, float)):
                self._scale.fill_(float(new_scale))
            else:
                data = getattr(new_scale, "data", new_scale)
                if not isinstance(data, torch.Tensor) or data.numel() != 1 or data.dtype != torch.float32:
                    raise ValueError("GradScaler.update: new_scale must be a float or a one-element float32 tensor")
                self._scale.copy_(data.reshape(()))
            self._found_total.zero_()
        else:
            if not any(st["stage"] != _READY for st in self._per_optimizer.values()):
                raise RuntimeError("GradScaler.update: no inf checks were recorded prior to update() "
                                   "(call step(optimizer) or unscale_(optimizer) first)")
            backend.call("amp_update_scale_", self._scale, growth_tracker=self._growth_tracker,
                         found_total=self._found_total, growth_factor=self._growth_factor,
                         backoff_factor=self._backoff_factor, growth_interval=self._growth_interval)
        for st in self._per_optimizer.values():
            st["stage"] = _READY

    # ---- settings and checkpoints ------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (a host read of the device value; 1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def state_dict(self) -> dict[str, Any]:
        """torch's format: {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict`` (ge2's or torch's GradScaler's)."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("GradScaler.load_state_dict: the state_dict is empty (saved from a disabled scaler?)")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
            self._growth_tracker.fill_(self._init_growth_tracker)

    def __repr__(self) -> str:
        return (f"GradScaler(enabled={self._enabled}, growth_factor={self._growth_factor}, "
                f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval})")
