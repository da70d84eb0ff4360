"""Creating tensors: ``tensor``, ``from_torch``, ``zeros``/``ones``/``full``/``empty``, ``rand``/``randn``, ``arange``.

Factories only allocate and fill (torch's RNG fills randn/rand); they default to ``ge2.device()``
and, like torch, to float32 for floating data and int64 for integers.
"""
from __future__ import annotations

from typing import Any

import torch

from ge2 import runtime
from ge2.autograd.tensor import Tensor


def _shape(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, int) or s < 0:
            raise ValueError(f"size must be non-negative ints, got {list(size)}")
    return tuple(size)


def _dtype(dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a dtype such as ge2.float32, got {dtype!r}")
    return dtype or torch.get_default_dtype()


def tensor(data: Any, dtype: torch.dtype | None = None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, numbers, NumPy arrays, tensors)."""
    dev = runtime.resolve_device(device)
    if isinstance(data, Tensor):
        data = data.data
    if isinstance(data, torch.Tensor):
        t = data.detach().to(device=dev, dtype=dtype or data.dtype, copy=True)
    else:
        t = torch.tensor(data, dtype=dtype, device=dev)
    return Tensor(t, requires_grad=requires_grad)


def from_torch(t: torch.Tensor, requires_grad: bool = False) -> Tensor:
    """Wrap a torch tensor without copying (ge2 and torch share the memory)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_torch: expected a torch.Tensor, got {type(t).__name__}")
    return Tensor(t.detach(), requires_grad=requires_grad)


def empty(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return Tensor(torch.empty(_shape(size), dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return Tensor(torch.zeros(_shape(size), dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return Tensor(torch.ones(_shape(size), dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if dtype is None and isinstance(fill_value, bool):
        dtype = torch.bool
    elif dtype is None and isinstance(fill_value, int):
        dtype = torch.int64
    return Tensor(torch.full(_shape((size,)), fill_value, dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def randn(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples (torch's RNG, seeded by ``ge2.manual_seed``)."""
    return Tensor(torch.randn(_shape(size), dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def rand(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples on [0, 1)."""
    return Tensor(torch.rand(_shape(size), dtype=_dtype(dtype), device=runtime.resolve_device(device)), requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Values from start to end (exclusive) by step; int64 unless a bound or step is a float."""
    if end is None:
        start, end = 0, start
    return Tensor(torch.arange(start, end, step, dtype=dtype, device=runtime.resolve_device(device)), requires_grad)


def _like(fn, x: Tensor, dtype, device, requires_grad):
    return fn(*x.shape, dtype=dtype or x.dtype, device=device or x.device, requires_grad=requires_grad)


def zeros_like(x: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _like(zeros, x, dtype, device, requires_grad)


def ones_like(x: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _like(ones, x, dtype, device, requires_grad)


def empty_like(x: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _like(empty, x, dtype, device, requires_grad)


def randn_like(x: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _like(randn, x, dtype, device, requires_grad)


def manual_seed(seed: int) -> None:
    """Seed the random number generators used by ge2's factories and initialisers."""
    torch.manual_seed(seed)
