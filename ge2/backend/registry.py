"""The op registry: ``call(op, *inputs, **attrs)`` checks the op's schema, then dispatches.

Repeated calls (same shapes, strides, dtypes, attributes) replay a call plan instead
(``ge2.backend.call_plans``): no schema check, no launcher Python, only the kernel launches. ``call``
is compiled (``ge2/kernels/native.c``) where a C compiler is available, ``python_call`` otherwise;
both take the same steps.

An implementation is registered for (op, backend, device kind, dtype); the dtype that dispatches
is the dtype of the op's first tensor input. Two backends exist: "triton" (the product, every op
a ge2 Triton kernel) and "torch" (the oracle, the same op written with torch).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from ge2 import runtime
from ge2.backend import call_plans
from ge2.backend.schema import Schema
from ge2.kernels import launch

BACKENDS = ("triton", "torch")
DEVICE_KINDS = ("cuda", "cpu")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
BOOL_DTYPES = (torch.bool,)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES


@dataclass
class OpDef:
    name: str
    schema: Schema
    impls: dict[tuple[str, str, torch.dtype], Callable[..., Any]] = field(default_factory=dict)


_OPS: dict[str, OpDef] = {}
_PLANS = call_plans.PLANS
_backend = "triton"


def defop(name: str, schema: Schema) -> OpDef:
    """Declare an op and its input schema. Implementations are added with ``register``."""
    if name in _OPS:
        raise ValueError(f"defop: op {name!r} is already defined")
    op = _OPS[name] = OpDef(name, schema)
    return op


def register(
    name: str,
    backend: str,
    dtypes: Iterable[torch.dtype] = FLOAT_DTYPES,
    devices: Iterable[str] = DEVICE_KINDS,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as op ``name``'s implementation on ``backend`` for these dtypes/devices."""
    if backend not in BACKENDS:
        raise ValueError(f"register: unknown backend {backend!r}; expected one of {BACKENDS}")
    if name not in _OPS:
        raise KeyError(f"register: op {name!r} is not defined; call defop first")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        impls = _OPS[name].impls
        for dev in devices:
            for dt in dtypes:
                impls[(backend, dev, dt)] = fn
        return fn

    return deco


def python_call(name: str, *inputs: Any, **attrs: Any) -> Any:
    """Validate ``inputs``/``attrs`` against op ``name``'s schema and run the current backend's impl."""
    call_key = None
    if _backend == "triton" and call_plans.ENABLED and launch.ENABLED:
        call_key = call_plans.compute_key(name, runtime._matmul_precision, inputs, attrs)
        plan = _PLANS.get(call_key) if call_key is not None else None
        if plan is not None:  # this key passed the schema check before
            return plan.replay(inputs)
    return _dispatch(name, inputs, attrs, call_key)


def _dispatch(name: str, inputs: tuple, attrs: dict, call_key: tuple | None) -> Any:
    """A call without a plan: check the schema, pick the implementation, run it (recording a plan)."""
    op = _OPS.get(name)
    if op is None:
        raise KeyError(f"ge2 has no op named {name!r}")
    lead = op.schema.validate(name, inputs, attrs)
    key = (_backend, lead.device.type, lead.dtype)
    fn = op.impls.get(key)
    if fn is None:
        supported = sorted(
            {str(dt).replace("torch.", "") for (b, d, dt) in op.impls if b == _backend and d == key[1]}
        )
        raise TypeError(
            f"{name}: no {_backend} implementation for dtype {str(lead.dtype).replace('torch.', '')} "
            f"on {key[1]} (supported: {', '.join(supported) or 'none'})"
        )
    if call_key is not None:
        return call_plans.run(name, call_key, fn, inputs, attrs)
    return fn(*inputs, **attrs)


# call(name, *inputs, **attrs): ge2_native's dispatch where it builds (the same steps as python_call,
# with a recorded plan replayed without Python frames: ge2/kernels/native.c), else python_call.
call: Callable[..., Any] = call_plans.native_dispatch(_dispatch, globals()) or python_call


def ops() -> list[str]:
    """Names of all registered ops."""
    return sorted(_OPS)


def get_op(name: str) -> OpDef:
    """The definition (schema + implementations) of op ``name``."""
    return _OPS[name]


def get_backend() -> str:
    """The backend ``call`` dispatches to: "triton" (default) or "torch"."""
    return _backend


class use_backend(contextlib.AbstractContextManager):
    """Switch the backend globally; as a context manager, switch back on exit.

    ``ge2.use_backend("torch")`` sets it for the process; ``with ge2.use_backend("torch"): ...``
    sets it for the block.
    """

    def __init__(self, name: str):
        global _backend
        if name not in BACKENDS:
            raise ValueError(f"use_backend: backend must be one of {BACKENDS}, got {name!r}")
        self._previous = _backend
        _backend = name

    def __exit__(self, *exc: Any) -> None:
        global _backend
        _backend = self._previous
