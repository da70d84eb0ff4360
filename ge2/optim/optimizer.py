"""``Optimizer``: parameter groups, per-parameter state, and the device tensor of hyper-parameters.

Each step is one call of a fused multi-tensor op (``sgd_step``, ``adam_step``): one or a few
kernel launches for all parameters. Hyper-parameters live in ``hyper``, a float64 [groups,
HYPER_SLOTS] device tensor that the kernels read; the step count is advanced there by the kernels
themselves. Changing ``param_groups[i]["lr"]`` (or a scheduler doing it) is mirrored into that
tensor before the next step: no recompilation, nothing frozen into a captured CUDA graph.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from ge2 import graphs
from ge2.autograd.grad_mode import no_grad
from ge2.autograd.tensor import Tensor, clear_grads
from ge2.kernels import optim as K


class Optimizer:
    """Base class: subclasses define ``_slots`` (group key -> hyper slot) and ``_update`` (the fused op)."""

    _slots: dict[str, int] = {}

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]):
        self.defaults = defaults
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Tensor, dict[str, torch.Tensor]] = {}
        self._hyper: torch.Tensor | None = None
        self._written: list[dict[str, float]] = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group of parameters with its own hyper-parameters (unset ones take the defaults)."""
        name = type(self).__name__
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: params[{i}] is a {type(p).__name__}, expected a ge2 Tensor")
            if not p.is_leaf:
                raise ValueError(f"{name}: params[{i}] is not a leaf tensor; optimizers update leaves")
            if id(p) in seen:
                raise ValueError(f"{name}: a parameter appears in more than one group")
            seen.add(id(p))
        full = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": params}
        full.setdefault("initial_lr", full["lr"])
        if "betas" in full:
            betas = full["betas"]
            if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
                raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas!r}")
            full["betas"] = tuple(betas)
        self._validate(full)
        self.param_groups.append(full)
        self._hyper = None  # rebuilt (with the right number of rows) at the next step

    def _validate(self, group: dict[str, Any]) -> None:
        name = type(self).__name__
        for key in ("lr", "weight_decay", "eps"):
            v = group.get(key)
            if v is not None and (not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v)):
                raise ValueError(f"{name}: {key} must be a finite non-negative number, got {v!r}")

    # ---- device hyper-parameters -------------------------------------------------------------
    def _device(self) -> torch.device:
        return self.param_groups[0]["params"][0].device

    def _sync_hyper(self) -> torch.Tensor:
        """Create the hyper tensor on first use, then write any group value that changed since."""
        for g in self.param_groups:
            if "betas" in g:  # the kernels read the two betas from their own slots
                g["beta1"], g["beta2"] = g["betas"]
        if self._hyper is None or self._hyper.device != self._device():
            rows = []
            for g in self.param_groups:
                row = [0.0] * K.HYPER_SLOTS
                for key, slot in self._slots.items():
                    row[slot] = float(g[key])
                row[K.BETA1_POW] = row[K.BETA2_POW] = 1.0
                rows.append(row)
            old = self._hyper
            self._hyper = torch.tensor(rows, dtype=torch.float64).to(self._device())
            if old is not None and old.shape == self._hyper.shape:
                # same groups, new device: carry the step and the running powers over
                for slot in (K.STEP, K.BETA1_POW, K.BETA2_POW):
                    self._hyper[:, slot].copy_(old[:, slot])
            self._written = [{k: g[k] for k in self._slots} for g in self.param_groups]
        for i, g in enumerate(self.param_groups):
            for key, slot in self._slots.items():
                if g[key] != self._written[i][key]:
                    if graphs.is_capturing():
                        raise graphs.CaptureError(
                            f"{type(self).__name__}: {key} changed inside a captured step (a scheduler "
                            f"stepped there?); a graph would replay the value of the capture forever. "
                            f"Call scheduler.step() outside the captured step: ge2 writes the new "
                            f"value into the device before each replay")
                    self._hyper[i, slot].fill_(float(g[key]))
                    self._written[i][key] = g[key]
        return self._hyper

    def set_lr(self, lr: float, group: int | None = None) -> None:
        """Set the learning rate of one group (or all) on the host and in the device tensor."""
        for i, g in enumerate(self.param_groups):
            if group is None or group == i:
                g["lr"] = lr
        if self._hyper is not None:
            self._sync_hyper()

    @property
    def step_count(self) -> int:
        """Steps taken so far (a host read of the device counter)."""
        return 0 if self._hyper is None else int(self._hyper[0, K.STEP].item())

    # ---- gradients ---------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (set_to_none) or zero the ``.grad`` of every parameter."""
        clear_grads((p for g in self.param_groups for p in g["params"]), set_to_none)

    def _with_grads(self) -> tuple[list[Tensor], list[torch.Tensor], list[int]]:
        params, grads, groups = [], [], []
        for gi, g in enumerate(self.param_groups):
            for p in g["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                if not grad.is_contiguous():
                    grad = p.grad.data = grad.contiguous()
                if grad.shape != p.data.shape:
                    raise ValueError(f"{type(self).__name__}: a gradient of shape {list(grad.shape)} for a parameter "
                                     f"of shape {list(p.shape)}")
                params.append(p)
                grads.append(grad)
                groups.append(gi)
        return params, grads, groups

    def _states(self, params: list[Tensor], key: str) -> list[torch.Tensor]:
        """The state tensor ``key`` of each parameter (created fp32 zeros where missing)."""
        state = self.state
        try:
            return [state[p][key] for p in params]
        except KeyError:
            return [self._state_tensor(p, key) for p in params]

    def _state_tensor(self, p: Tensor, key: str) -> torch.Tensor:
        st = self.state.setdefault(p, {})
        if key not in st:
            st[key] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        return st[key]

    @no_grad()
    def step(self) -> None:
        """Update every parameter that has a gradient: one fused launch per dtype."""
        self._step({})

    @no_grad()
    def _step(self, amp: dict[str, torch.Tensor | None]) -> None:
        """step(), with ``amp`` = GradScaler's {"scale", "found_inf"} device tensors passed to the update."""
        graphs.note_optimizer(self)
        params, grads, groups = self._with_grads()
        hyper = self._sync_hyper()
        if not params:
            return
        self._update(hyper, params, grads, groups, **amp)
        for p in params:
            p._version_counter.value += 1  # the update wrote each parameter in place

    def _update(self, hyper: torch.Tensor, params: list[Tensor], grads: list[torch.Tensor], groups: list[int],
                **amp: torch.Tensor | None) -> None:
        """Launch the optimizer's fused update kernel over ``params`` (group index of each in ``groups``).

        ``amp``: ``scale``/``found_inf`` for the update op (``ge2.amp.GradScaler``), passed through.
        """
        raise NotImplementedError

    # ---- checkpoints -------------------------------------------------------------------------
    def _index(self) -> dict[int, Tensor]:
        return {i: p for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def state_dict(self) -> dict[str, Any]:
        """{"state": {param index: {name: tensor}}, "param_groups": [...], "hyper": the device scalars}."""
        index = {id(p): i for i, p in self._index().items()}
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        state = {index[id(p)]: dict(st) for p, st in self.state.items()}
        hyper = self._sync_hyper() if self.param_groups else None
        return {"state": state, "param_groups": groups, "hyper": hyper}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore state and hyper-parameters saved by ``state_dict`` (groups must have the same sizes)."""
        name = type(self).__name__
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"{name}.load_state_dict: the saved groups have sizes "
                             f"{[len(g['params']) for g in groups]}, this optimizer has "
                             f"{[len(g['params']) for g in self.param_groups]}")
        index = self._index()
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, st in state_dict["state"].items():
            p = index[int(i)]
            self.state[p] = {}
            for k, v in st.items():
                v = v.data if isinstance(v, Tensor) else v
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"{name}.load_state_dict: state {k!r} of parameter {i} has shape "
                                     f"{list(v.shape)}, the parameter has {list(p.shape)}")
                self.state[p][k] = v.to(device=p.device, dtype=torch.float32).clone()
        self._hyper = None
        hyper = self._sync_hyper()
        saved = state_dict.get("hyper")
        if saved is not None:
            saved = saved.data if isinstance(saved, Tensor) else saved
            if tuple(saved.shape) != tuple(hyper.shape):
                raise ValueError(f"{name}.load_state_dict: hyper has shape {list(saved.shape)}, expected "
                                 f"{list(hyper.shape)}")
            hyper.copy_(saved)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(k for k in g if k != "params"):
                lines.append(f"    {k}: {g[k]}")
        return "\n".join(lines) + "\n)"
