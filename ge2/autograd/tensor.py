"""``ge2.Tensor``: a torch tensor (the memory) plus what autograd needs (grad, grad_fn, version).

The arithmetic methods and operators are thin calls into the functional ops of
``ge2.autograd.math`` / ``ge2.autograd.linalg``; this file holds the data model and backward().
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from ge2 import graphs, runtime
from ge2.autograd import grad_mode
from ge2.autograd.function import Node, Version, _root


class RemovableHandle:
    """What a hook registration returns: ``remove()`` takes the hook out of its table again."""

    _next_id = 0

    def __init__(self, table: dict, hook) -> None:
        RemovableHandle._next_id += 1
        self.table, self.id = table, RemovableHandle._next_id
        table[self.id] = hook

    def remove(self) -> None:
        self.table.pop(self.id, None)


class Tensor:
    """A multi-dimensional array on the GPU (or CPU under the Triton interpreter) with autograd."""

    __slots__ = ("data", "_requires_grad", "grad", "grad_fn", "_out_idx", "_version_counter",
                 "_post_accumulate_grad_hooks", "__weakref__")
    __array_priority__ = 1000  # numpy scalars defer to Tensor's reflected operators

    def __init__(self, data: torch.Tensor, requires_grad: bool = False):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"Tensor: expected a torch.Tensor, got {type(data).__name__}; use ge2.tensor(...)")
        self.data = data
        self.grad: Tensor | None = None
        self.grad_fn: Node | None = None
        self._out_idx = 0
        self._version_counter = Version()
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _from_op(cls, data: torch.Tensor, inputs: Sequence["Tensor"], node: Node | None, idx: int) -> "Tensor":
        t = _wrap(data, inputs)
        if node is not None:
            t.grad_fn, t._out_idx, t._requires_grad = node, idx, True
        return t

    # ---- autograd state --------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if not value and self.grad_fn is not None:
            raise RuntimeError(
                "requires_grad: cannot set requires_grad=False on a non-leaf tensor; use detach()"
            )
        if value and not (self.data.is_floating_point() or self.data.is_complex()):
            raise RuntimeError(
                f"requires_grad: only floating-point tensors can require gradients, got {self.data.dtype}"
            )
        self._requires_grad = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set requires_grad in place; returns self."""
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def _version(self) -> int:
        return self._version_counter.value

    def _edge(self) -> tuple[Any, int]:
        return (self.grad_fn, self._out_idx) if self.grad_fn is not None else (self, 0)

    def retain_grad(self) -> None:
        """Keep .grad for this non-leaf tensor after backward."""
        if self.grad_fn is None:
            return
        if self.grad_fn.retained is None:
            self.grad_fn.retained = {}
        self.grad_fn.retained[self._out_idx] = weakref.ref(self)

    def register_post_accumulate_grad_hook(self, hook) -> "RemovableHandle":
        """Call ``hook(self)`` after each backward has accumulated this leaf's gradient into ``.grad``.

        As torch's: once per backward that reaches the leaf, after all of its gradient contributions
        are summed and added; the hook may read or replace ``self.grad``. Returns a handle whose
        ``remove()`` unregisters it.
        """
        if self.grad_fn is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors accumulate a .grad; "
                               "this tensor has a grad_fn")
        if not callable(hook):
            raise TypeError(f"register_post_accumulate_grad_hook: hook must be callable, got {type(hook).__name__}")
        hooks = getattr(self, "_post_accumulate_grad_hooks", None)
        if hooks is None:
            hooks = self._post_accumulate_grad_hooks = {}
        return RemovableHandle(hooks, hook)

    def backward(self, gradient: "Tensor | torch.Tensor | None" = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) · gradient into every leaf's ``.grad``."""
        from ge2.autograd.engine import run_backward

        if not self.requires_grad:
            raise RuntimeError("backward: tensor does not require grad and has no grad_fn")
        if gradient is None:
            if self.data.numel() != 1:
                raise RuntimeError(
                    f"backward: grad can be implicitly created only for scalar outputs; this tensor "
                    f"has shape {list(self.shape)}, pass gradient= of that shape"
                )
            g = torch.ones_like(self.data)
        else:
            g = gradient.data if isinstance(gradient, Tensor) else gradient
            if not isinstance(g, torch.Tensor):
                raise TypeError(f"backward: gradient must be a Tensor, got {type(gradient).__name__}")
            if tuple(g.shape) != tuple(self.shape):
                raise ValueError(
                    f"backward: gradient has shape {list(g.shape)} but the tensor has shape {list(self.shape)}"
                )
            if g.device != self.data.device:
                raise ValueError(f"backward: gradient is on {g.device} but the tensor is on {self.data.device}")
            g = g.to(self.dtype)
        run_backward(self, g, retain_graph)

    def detach(self) -> "Tensor":
        """A tensor sharing this one's memory (and version counter) but outside the graph."""
        t = Tensor(self.data.detach())
        t._version_counter = self._version_counter
        return t

    def detach_(self) -> "Tensor":
        """Cut this tensor from the graph in place; it becomes a leaf."""
        self.grad_fn, self._out_idx, self._requires_grad = None, 0, False
        return self

    # ---- metadata and conversion -------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def ndim(self) -> int:
        return self.data.dim()

    def dim(self) -> int:
        return self.data.dim()

    def size(self, dim: int | None = None):
        return self.data.shape if dim is None else self.data.shape[dim]

    def numel(self) -> int:
        return self.data.numel()

    def stride(self, dim: int | None = None):
        return self.data.stride() if dim is None else self.data.stride(dim)

    def is_contiguous(self, memory_format=torch.contiguous_format) -> bool:
        return self.data.is_contiguous(memory_format=memory_format)

    def element_size(self) -> int:
        return self.data.element_size()

    def is_floating_point(self) -> bool:
        return self.data.is_floating_point()

    def to_torch(self) -> torch.Tensor:
        """The underlying torch tensor (shares memory)."""
        return self.data

    def numpy(self):
        """A NumPy copy of the data (on the host)."""
        graphs.check_not_capturing("Tensor.numpy()")
        if self.requires_grad:
            raise RuntimeError("numpy: tensor requires grad; call .detach().numpy()")
        return self.data.detach().cpu().numpy()

    def item(self) -> float | int | bool:
        """The value of a one-element tensor as a Python number (synchronises with the device)."""
        graphs.check_not_capturing("Tensor.item()")
        if self.data.numel() != 1:
            raise ValueError(f"item: only one-element tensors can be converted, got shape {list(self.shape)}")
        return self.data.item()

    def tolist(self):
        graphs.check_not_capturing("Tensor.tolist()")
        return self.data.detach().cpu().tolist()

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.data.shape[0]))

    def __bool__(self) -> bool:
        graphs.check_not_capturing("bool(tensor)")
        if self.data.numel() != 1:
            raise RuntimeError(
                f"bool: the truth value of a tensor with {self.data.numel()} elements is ambiguous"
            )
        return bool(self.data.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        graphs.check_not_capturing("using a tensor as an index")
        if self.data.dtype.is_floating_point or self.data.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.data.item())

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        graphs.check_not_capturing("printing a tensor")
        body = repr(self.data.detach())
        if self.grad_fn is not None:
            body = body[:-1] + f", grad_fn=<{self.grad_fn.name}>)"
        elif self.requires_grad:
            body = body[:-1] + ", requires_grad=True)"
        return body

    def __format__(self, spec: str) -> str:
        if self.data.numel() == 1 and spec:
            return format(self.item(), spec)
        return repr(self)

    def __reduce_ex__(self, protocol):
        raise TypeError("ge2.Tensor: pickle the torch tensor (t.data) or use ge2.save")

    def __deepcopy__(self, memo: dict) -> "Tensor":
        """A copy of a leaf with its own memory (and grad); torch's rule: tensors made by ops do not deep-copy."""
        if self.grad_fn is not None:
            raise RuntimeError("ge2.Tensor: only leaf tensors (not the results of ops) support deepcopy; "
                               "detach() first")
        new = type(self)(self.data.clone(), requires_grad=self.requires_grad)
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        return new

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self) -> "Tensor":
        return self.to("cuda")

    def float(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.float32, memory_format=memory_format)

    def double(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.float64, memory_format=memory_format)

    def half(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.float16, memory_format=memory_format)

    def bfloat16(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.bfloat16, memory_format=memory_format)

    def long(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.int64, memory_format=memory_format)

    def int(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.int32, memory_format=memory_format)

    def bool(self, memory_format=torch.preserve_format) -> "Tensor":
        return self.to(torch.bool, memory_format=memory_format)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)


def clear_grads(tensors, set_to_none: bool = True) -> None:
    """Drop (set_to_none) or zero the ``.grad`` of each tensor: zero_grad of modules and optimizers."""
    for t in tensors:
        if t.grad is None:
            continue
        if set_to_none:
            t.grad = None
        else:
            t.grad.data.zero_()


def _check_inplace(t: Tensor, op: str) -> None:
    if t.requires_grad and t.is_leaf and grad_mode.is_grad_enabled():
        raise RuntimeError(
            f"{op}: a leaf tensor that requires grad is being used in an in-place operation; "
            "wrap it in `with ge2.no_grad():`"
        )


def parse_to_args(args: tuple, kwargs: dict) -> tuple[Any, torch.dtype | None]:
    """(device, dtype) from ``.to(...)`` arguments: a dtype, a device, a Tensor (both), or keywords."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    if kwargs:
        raise TypeError(f"to: unexpected arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        else:
            device = a
    return device, dtype


def _resolve(dev) -> torch.device:
    return runtime.resolve_device(dev)


_new_tensor = object.__new__


def _wrap(data: torch.Tensor, inputs: Sequence[Tensor]) -> Tensor:
    """An op's output as a Tensor without a grad_fn, sharing the version counter of the input whose
    memory it is (the input itself, a view of it, or the base of an input that is a view)."""
    t = _new_tensor(Tensor)
    t.data, t.grad, t.grad_fn, t._out_idx, t._requires_grad = data, None, None, 0, False
    base = data._base
    if base is None:  # not a view: only an input that is this very tensor or a view of it shares memory
        for x in inputs:
            if x.data is data or x.data._base is data:
                t._version_counter = x._version_counter
                return t
    else:
        for x in inputs:
            if _root(x.data) is base:
                t._version_counter = x._version_counter
                return t
    t._version_counter = Version()
    return t
