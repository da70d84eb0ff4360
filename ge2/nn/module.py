"""``Module``: the base class of every layer. It holds Parameters, buffers and sub-modules.

Assigning a Parameter, a Module or a registered buffer to an attribute registers it (the order of
assignment is the order of ``parameters()`` and of the state dict), as in PyTorch. A Module
knows nothing of gradients: its ``forward`` calls functional ops, which record the graph.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, NamedTuple

import torch

from ge2 import graphs, runtime
from ge2.autograd.grad_mode import no_grad
from ge2.autograd.tensor import Tensor, clear_grads, parse_to_args
from ge2.backend.schema import dtype_name, shape_str
from ge2.nn.parameter import Parameter


class StateDictError(ValueError, RuntimeError):
    """load_state_dict found missing or unexpected keys or mismatched shapes (a RuntimeError, like torch's)."""


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of layers: subclass it, assign Parameters / sub-modules in ``__init__``, write ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration ------------------------------------------------------------------------
    def _registry(self, name: str) -> dict:
        try:
            return object.__getattribute__(self, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__}: call super().__init__() before assigning attributes"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        params, buffers, modules = self._registry("_parameters"), self._registry("_buffers"), self._registry("_modules")
        if isinstance(value, Parameter):
            for d in (buffers, modules):
                d.pop(name, None)
            self.__dict__.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            for d in (params, buffers):
                d.pop(name, None)
            self.__dict__.pop(name, None)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name}: cannot assign a {type(value).__name__} to a "
                                "parameter (expected a ge2.nn.Parameter or None)")
            params[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name}: cannot assign a {type(value).__name__} to a "
                                "buffer (expected a ge2.Tensor or None)")
            buffers[name] = value
        elif name in modules:
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name}: cannot assign a {type(value).__name__} to a "
                                "sub-module (expected a ge2.nn.Module or None)")
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: parameters, buffers and sub-modules live in dicts.
        for registry in ("_parameters", "_buffers", "_modules"):
            d = self.__dict__.get(registry)
            if d is not None and name in d:
                return d[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for registry in ("_parameters", "_buffers", "_modules"):
            d = self.__dict__[registry]
            if name in d:
                del d[name]
                self.__dict__["_non_persistent"].discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (or None: a declared but absent parameter, like a bias=False Linear's)."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name} must be a Parameter or None, got {type(param).__name__}")
        self._registry("_parameters")[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is state but not trained (running statistics); in the state dict if ``persistent``."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name} must be a ge2.Tensor or None, got {type(tensor).__name__}")
        self._registry("_buffers")[name] = tensor
        if persistent:
            self._registry("_non_persistent").discard(name)
        else:
            self._registry("_non_persistent").add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name} must be a Module, got {type(module).__name__}")
        self._registry("_modules")[name] = module

    # ---- traversal ---------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs; a parameter shared by two modules is listed once."""
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in mods:
            for name, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in mods:
            for name, b in m._buffers.items():
                if b is not None:
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), b

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ---- modes and state ---------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout active, batch norm uses batch statistics); returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train: mode must be a bool, got {type(mode).__name__}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (set_to_none) or zero every parameter's ``.grad``."""
        clear_grads(self.parameters(), set_to_none)

    def to(self, *args: Any, **kwargs: Any) -> "Module":
        """Move parameters and buffers to a device and/or cast floating ones to a dtype, in place."""
        device, dtype = parse_to_args(args, kwargs)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"to: a module can only be cast to a floating dtype, got {dtype_name(dtype)}")
        dev = runtime.resolve_device(device) if device is not None else None

        def convert(t: Tensor) -> None:
            target_dtype = dtype if dtype is not None and t.data.is_floating_point() else t.data.dtype
            target_dev = dev if dev is not None else t.data.device
            if target_dtype != t.data.dtype or target_dev != t.data.device:
                # Replace the memory, keep the object: optimizers and shared references still hold it.
                t.data = t.data.to(device=target_dev, dtype=target_dtype)
                if t.grad is not None:
                    t.grad.data = t.grad.data.to(device=target_dev, dtype=target_dtype)

        for p in self.parameters():
            convert(p)
        for b in self.buffers():
            convert(b)
        return self

    def cpu(self) -> "Module":
        return self.to("cpu")

    def cuda(self) -> "Module":
        return self.to("cuda")

    def float(self) -> "Module":
        return self.to(torch.float32)

    def state_dict(self, prefix: str = "") -> "OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by dotted name, as Tensors sharing the module's memory."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_prefix, m in self.named_modules(prefix.rstrip(".")):
            for name, p in m._parameters.items():
                if p is not None:
                    out[f"{mod_prefix}.{name}" if mod_prefix else name] = p.detach()
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    out[f"{mod_prefix}.{name}" if mod_prefix else name] = b.detach()
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict`` (ge2 or torch tensors) into this module's parameters and buffers.

        Shape mismatches always raise; with ``strict`` missing and unexpected keys raise too. Every
        problem is named in one message (a ``StateDictError``, both a ValueError and a RuntimeError).
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: expected a dict, got {type(state_dict).__name__}")
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        for key, dst in own.items():
            if key not in state_dict:
                continue
            src = state_dict[key]
            src = src.data if isinstance(src, Tensor) else src
            if not isinstance(src, torch.Tensor):
                problems.append(f"{key}: expected a tensor, got {type(src).__name__}")
            elif tuple(src.shape) != tuple(dst.shape):
                problems.append(f"size mismatch for {key}: the checkpoint has shape {shape_str(src.shape)}, "
                                f"the model has {shape_str(dst.shape)}")
        if strict:
            if missing:
                problems.insert(0, "missing key(s): " + ", ".join(missing))
            if unexpected:
                problems.insert(1 if missing else 0, "unexpected key(s): " + ", ".join(unexpected))
        if problems:
            raise StateDictError(f"load_state_dict for {type(self).__name__}: " + "; ".join(problems))
        with no_grad():
            for key, dst in own.items():
                if key in state_dict:
                    src = state_dict[key]
                    # detach: a torch Parameter copied in must not make the memory part of torch's graph
                    dst.data.copy_((src.data if isinstance(src, Tensor) else src).detach())
                    dst._version_counter.value += 1
        return IncompatibleKeys(missing, unexpected)

    # ---- call and repr -----------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: forward is not implemented")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        graphs.note_module(self)  # a captured step is keyed by its modules' train/eval modes
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr (its hyper-parameters)."""
        return ""

    def __repr__(self) -> str:
        children = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()
                    if m is not None]
        extra = self.extra_repr()
        if not children:
            return f"{type(self).__name__}({extra})"
        lines = ([extra] if extra else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))
