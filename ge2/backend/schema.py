"""Op schemas: what each input of an op may be, checked before any launch.

A schema lists the op's positional inputs (tensor or scalar specs) and an optional ``check``
for relations between them (broadcastable shapes, matching inner dims). Every failure raises
a ValueError/TypeError that names the op, the argument and the offending shapes or dtypes.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def shape_str(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


@dataclass(frozen=True)
class TensorArg:
    """A tensor input. ``scalar_ok``: a Python number is accepted in its place."""

    name: str
    dtypes: tuple[torch.dtype, ...] | None = None
    ndim: tuple[int, ...] | None = None
    optional: bool = False
    scalar_ok: bool = False


@dataclass(frozen=True)
class Schema:
    inputs: tuple[TensorArg, ...]
    check: Callable[..., None] | None = None
    same_device: bool = True

    def validate(self, op: str, inputs: tuple[Any, ...], attrs: dict[str, Any]) -> torch.Tensor:
        """Raise on bad input; return the tensor whose device and dtype pick the implementation."""
        if len(inputs) > len(self.inputs):
            raise TypeError(f"{op}: takes {len(self.inputs)} inputs, got {len(inputs)}")
        lead: torch.Tensor | None = None
        for spec, value in zip(self.inputs, inputs):
            if value is None:
                if not spec.optional:
                    raise TypeError(f"{op}: {spec.name} is required, got None")
                continue
            if isinstance(value, torch.Tensor):
                if spec.dtypes is not None and value.dtype not in spec.dtypes:
                    allowed = ", ".join(dtype_name(d) for d in spec.dtypes)
                    raise TypeError(
                        f"{op}: {spec.name} has dtype {dtype_name(value.dtype)}, expected one of {allowed}"
                    )
                if spec.ndim is not None and value.dim() not in spec.ndim:
                    want = " or ".join(f"{n}-D" for n in spec.ndim)
                    raise ValueError(
                        f"{op}: {spec.name} must be {want}, got shape {shape_str(value.shape)}"
                    )
                if lead is None:
                    lead = value
                elif self.same_device and value.device != lead.device:
                    raise ValueError(
                        f"{op}: {spec.name} is on {value.device} but the other inputs are on {lead.device}"
                    )
            elif spec.scalar_ok and isinstance(value, numbers.Number):
                pass
            else:
                kind = "a tensor or a number" if spec.scalar_ok else "a tensor"
                raise TypeError(f"{op}: {spec.name} must be {kind}, got {type(value).__name__}")
        for spec in self.inputs[len(inputs):]:
            if not spec.optional:
                raise TypeError(f"{op}: missing input {spec.name}")
        if lead is None:
            raise TypeError(f"{op}: at least one input must be a tensor")
        if self.check is not None:
            self.check(op, *inputs, **attrs)
        return lead


def broadcast_shapes(op: str, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """NumPy broadcasting of ``shapes``; a clear ValueError naming the args if they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    pairs = " and ".join(f"{n} {shape_str(s)}" for n, s in zip(names, shapes))
                    raise ValueError(f"{op}: cannot broadcast {pairs}")
                out[i] = size
    return tuple(out)


def normalize_dims(op: str, dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Dims as a sorted tuple of non-negative ints (None = all); IndexError-free clear errors."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = []
    for d in dims:
        if not isinstance(d, int):
            raise TypeError(f"{op}: dim must be an int, got {type(d).__name__}")
        lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
        if not lo <= d <= hi:
            raise ValueError(f"{op}: dim {d} is out of range for a {ndim}-D tensor (expected {lo}..{hi})")
        d = d % ndim if ndim > 0 else 0
        if d in out:
            raise ValueError(f"{op}: dim {d} appears more than once")
        out.append(d)
    return tuple(sorted(out))


def _category(x) -> int:
    dt = x.dtype if isinstance(x, torch.Tensor) else None
    if dt == torch.bool or isinstance(x, bool):
        return 0
    if (dt is not None and not dt.is_floating_point) or (dt is None and isinstance(x, numbers.Integral)):
        return 1
    return 2


def result_dtype(*operands: Any) -> torch.dtype:
    """torch's type promotion for tensors and Python scalars, without dispatching an aten op.

    The highest category (bool < int < float) wins; within it, dimensioned tensors outrank 0-d
    tensors, which outrank Python scalars; a float Python scalar over int tensors gives float32.
    """
    top = max(_category(x) for x in operands)
    for rank in (lambda x: isinstance(x, torch.Tensor) and x.dim() > 0,
                 lambda x: isinstance(x, torch.Tensor) and x.dim() == 0):
        tensors = [x for x in operands if _category(x) == top and rank(x)]
        if tensors:
            dt = tensors[0].dtype
            for t in tensors[1:]:
                dt = torch.promote_types(dt, t.dtype)
            return dt
    return {0: torch.bool, 1: torch.int64, 2: torch.get_default_dtype()}[top]
