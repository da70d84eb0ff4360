"""Launch plans: the repeated-call path of a ge2 kernel launch, without Triton's generic dispatch.

Triton's ``JITFunction.run`` binds and specialises every argument, builds a cache key, reads its
knobs and evaluates the grid on every call (~30-50 µs of Python on the H100 machine's host, a third
to a half of a ge2 op's host time). A ge2 kernel's launches repeat with the same shapes, so the
first launch with a given *launch key* records a plan (the compiled kernel, the evaluated grid, the
full argument list) and later launches with that key only put the new tensors into the argument
list and call the compiled kernel's launcher.

The launch key holds everything the compiled kernel and its arguments depend on: the evaluated
grid; per tensor argument its dtype and whether its address is 16-byte aligned (Triton's pointer
specialisation); every other argument's exact value (finer than Triton's specialisation, so a hit
is always the same kernel with the same scalar arguments); and the same for keyword arguments
(constexprs, config options). Only tensor addresses vary between hits.

Under the Triton interpreter the plan replays the recorded argument list through the interpreter,
so the CPU test suite checks that keys are complete and tensors land in the right slots. On the
GPU the replay launches through ge2's own launcher with the parameters packed at record time
(``native.packed_launch``), else through the compiled kernel's C launcher directly (``_direct``),
else through Triton's own ``CompiledKernel.run`` (scratch memory, a launch hook set); the whole
test suite runs through them there.
``GE2_LAUNCH_PLANS=0`` turns plans off.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch
from triton import knobs
from triton.runtime.autotuner import Autotuner, Heuristics

from ge2 import runtime
from ge2.kernels import native

ENABLED: bool = os.environ.get("GE2_LAUNCH_PLANS", "1") not in ("", "0")
MAX_PLANS = 4096  # per kernel; a full table is cleared (shapes beyond that are a workload's churn)
STATS = {"hits": 0, "plans": 0}


class _Plan:
    __slots__ = ("kernel", "grid", "values", "slots", "options", "direct", "packed")

    def __init__(self, kernel, grid, values, slots, options, direct=None, packed=None):
        self.kernel, self.grid, self.values, self.slots, self.options = kernel, grid, values, slots, options
        # GPU: the compiled launcher's C entry and its fixed leading arguments (see _PlannedJIT._replay)
        self.direct = direct
        # GPU: (ge2's launch function, packed launch, positions of the tensor arguments) (native.packed_launch)
        self.packed = packed


_PLAIN = frozenset((int, bool, str, tuple, type(None)))
_Tensor = torch.Tensor


def _spec(value: Any) -> Any:
    """What the compiled kernel and its scalar arguments depend on, for one argument."""
    kind = type(value)
    if kind is torch.Tensor:  # ints never get here (``run`` keys them as themselves): tensors next
        return value.dtype, value.data_ptr() & 15 == 0
    if kind in _PLAIN:
        return kind, value  # True == 1, but Triton types a bool argument differently from an int
    if kind is float:  # 0.0 == -0.0, but a replay must pass the very value
        return float, value, math.copysign(1.0, value)
    if isinstance(value, torch.Tensor):  # subclasses
        return value.dtype, value.data_ptr() & 15 == 0
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor):  # a TMA TensorDescriptor: the launcher encodes it per launch
        return (kind, base.dtype, base.data_ptr() & 15 == 0, tuple(value.shape), tuple(value.strides),
                tuple(value.block_shape), getattr(value, "padding", "zero"), getattr(value, "round_f32_to_tf32", False))
    return kind, value


def _is_slot(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or isinstance(getattr(value, "base", None), torch.Tensor)


class _PlannedLaunch:
    """The methods given to a kernel's class (JITFunction on the GPU, InterpretedFunction on the CPU);
    ``self._base`` is that original class."""

    _base: type

    def run(self, *args, grid, warmup, **kwargs):
        if warmup or not ENABLED:
            _refuse("a launch without a plan")
            return self._base.run(self, *args, grid=grid, warmup=warmup, **kwargs)
        try:
            if callable(grid):
                meta = dict(zip(self.arg_names, args))
                meta.update(kwargs)
                grid = grid(meta)
            grid = tuple(grid) + (1,) * (3 - len(grid))
            # Plain ints (most arguments: sizes, strides) are their own spec and tensors are keyed
            # inline (the same tuple _spec gives): no call per argument for either. An int never
            # equals a _spec tuple, so this stays as exact as _spec itself.
            key = (grid, tuple([a if type(a) is int else (a.dtype, a.data_ptr() & 15 == 0)
                                if type(a) is _Tensor else _spec(a) for a in args]),
                   tuple([(k, v if type(v) is int else _spec(v)) for k, v in kwargs.items()]))
            plans = self.__dict__.setdefault("_ge2_plans", {})
            plan = plans.get(key)
        except (KeyError, TypeError):  # a grid reading a defaulted argument, an unhashable value
            _refuse("a launch without a plan")
            return self._base.run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if plan is not None:
            STATS["hits"] += 1
            values = list(plan.values)
            for at, src in plan.slots:
                values[at] = args[src] if isinstance(src, int) else kwargs[src]
            return replay(self, plan, values)
        _refuse(NEW_PLAN)  # compiling or autotuning: not a steady-state call
        out = self._base.run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plans[key] = self._record(out, grid, args, kwargs)
        STATS["plans"] += 1
        return out

    def _slots(self, names: list[str], values: list, kwargs: dict) -> list:
        """Where the tensors (and TMA descriptors) sit; their places in ``values`` are emptied, so a
        plan does not keep its first call's tensors alive."""
        slots = []
        for at, (name, value) in enumerate(zip(names, values)):
            if _is_slot(value):
                slots.append((at, name if name in kwargs else self.arg_names.index(name)))
                values[at] = None
        return slots


class _PlannedJIT(_PlannedLaunch):
    """GPU: replay through the compiled kernel's launcher."""


    def _record(self, kernel, grid, args, kwargs) -> _Plan:
        from triton.runtime.driver import driver

        if hasattr(kernel, "result"):
            kernel = kernel.result()
        binder = self.device_caches[driver.active.get_current_device()][4]
        bound, _, _ = binder(*args, **kwargs)
        names, values = list(bound), list(bound.values())
        recorded = list(values)  # _slots empties the slots; the packer encodes TMA maps from these
        slots = self._slots(names, values, kwargs)
        positions = [at for at, _ in slots]
        packed = native.packed_launch(kernel, grid, recorded, positions)
        return _Plan(kernel, grid, values, slots, None, _direct(kernel, grid),
                     None if packed is None else (*packed, positions))

    def _replay(self, plan: _Plan, values: list):
        packed = plan.packed
        if packed is not None and _no_hooks():
            entry, launch, positions = packed
            # addresses of the tensors and of TMA descriptors' bases (or the addresses a call plan
            # passes); a tensor off the GPU is left to Triton's launcher, which rejects it clearly
            addresses = [v if type(v) is int else _address(v) for v in map(values.__getitem__, positions)]
            if None not in addresses and entry(launch, _stream(_device()), *addresses):
                return plan.kernel
        direct = plan.direct
        if direct is not None and _no_hooks():
            # Triton's C launcher itself, as CompiledKernel.run would call it with no scratch and no hooks
            direct[0](*direct[1], _stream(_device()), *direct[2], *values)
            return plan.kernel
        from triton.runtime.driver import driver

        kernel = plan.kernel
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        metadata = kernel.launch_metadata(plan.grid, stream, *values) if enter is not None else None
        kernel.run(plan.grid[0], plan.grid[1], plan.grid[2], stream, kernel.function, kernel.packed_metadata,
                   metadata, enter, leave, *values)
        return kernel


def _address(value) -> int | None:
    """The device address a packed launch takes for a tensor or TMA descriptor argument (None off the GPU)."""
    base = value if isinstance(value, torch.Tensor) else value.base
    if isinstance(base, torch.Tensor):
        return base.data_ptr() if base.is_cuda else None
    return base.data_ptr()  # a call plan's descriptor (call_plans._Descriptor): the address it replays


def _direct(kernel, grid: tuple) -> tuple | None:
    """(C launch function, (grid x, y, z), (function, cooperative, pdl, no scratch x2, metadata, no hooks x3)),
    or None when the kernel needs what only Triton's Python launcher provides (scratch memory)."""
    launcher = kernel.run  # initialises the module and function handles
    if native.needs_triton_launcher(launcher):
        return None
    return (launcher.launch, tuple(grid),
            (kernel.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
             kernel.packed_metadata, None, None, None))


def _no_hooks() -> bool:
    """No launch hooks are set (a profiler such as proton sets them: then the full launch path runs).
    Triton 3.6 keeps them as (normally empty) chains and calls a chain on every launch: ~2 µs of Python."""
    enter, leave = _RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook
    return ((enter is None or (type(enter) is _HookChain and not enter.calls))
            and (leave is None or (type(leave) is _HookChain and not leave.calls)))


_RUNTIME_KNOBS = knobs.runtime
_HookChain = getattr(knobs, "HookChain", type(None))
# the current device and its current stream, as Triton's driver reads them (torch's C functions)
_device = getattr(torch._C, "_cuda_getDevice", None)
_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _PlannedInterpreted(_PlannedLaunch):
    """CPU: replay the recorded argument list through the interpreter (verifies keys and slots)."""


    def _record(self, _out, grid, args, kwargs) -> _Plan:
        import inspect

        signature = inspect.signature(self.fn)
        named = {k: v for k, v in kwargs.items() if k in signature.parameters}
        bound = signature.bind(*args, **named)
        bound.apply_defaults()
        names, values = list(bound.arguments), list(bound.arguments.values())
        options = {k: v for k, v in kwargs.items() if k not in signature.parameters}
        return _Plan(None, grid, values, self._slots(names, values, kwargs), options)

    def _replay(self, plan: _Plan, values: list):
        return self._base.run(self, *values, grid=plan.grid, warmup=False, **plan.options)


class Recorder:
    """The launches made while it is active (``recording``), for call plans (ge2.backend.call_plans)."""

    __slots__ = ("launches", "refused", "launching")

    def __init__(self):
        self.launches: list[tuple[Any, _Plan, list]] = []  # (kernel, plan, argument values)
        self.refused: str | None = None
        self.launching = False  # inside a launch (the interpreter's own torch work is not the op's)

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why


_RECORDERS: list[Recorder] = []
NEW_PLAN = "a launch that made a new launch plan"


class recording:
    """Context manager: launches inside are appended to ``recorder`` (nested recorders all see them)."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def __enter__(self) -> Recorder:
        _RECORDERS.append(self.recorder)
        return self.recorder

    def __exit__(self, *exc) -> None:
        _RECORDERS.remove(self.recorder)


HOST = "host"  # a recorded host step: (None, HOST, (fn, device tensor)), replayed as fn(the replay's tensor)


def host_step(fn, tensor: torch.Tensor) -> None:
    """Run ``fn(tensor)``, host work on a device tensor the op made (a deferred bad-input check); an
    active recording keeps it as a step, so a call plan's replay runs it on the replay's tensor."""
    for recorder in _RECORDERS:
        recorder.launches.append((None, HOST, (fn, tensor)))
        recorder.launching = True  # fn's own torch work (a pinned copy) is not the op's
    try:
        fn(tensor)
    finally:
        for recorder in _RECORDERS:
            recorder.launching = False


def _refuse(why: str) -> None:
    for recorder in _RECORDERS:
        recorder.refuse(why)


def replay(kernel, plan: _Plan, values: list):
    """Launch ``kernel`` from ``plan`` with these argument values (tensors or, on the GPU, addresses)."""
    if not _RECORDERS:
        return kernel._replay(plan, values)
    for recorder in _RECORDERS:
        recorder.launches.append((kernel, plan, values))
        recorder.launching = True
    try:
        return kernel._replay(plan, values)
    finally:
        for recorder in _RECORDERS:
            recorder.launching = False


_CLASSES: dict[type, type] = {}


def _planned(obj: Any) -> None:
    """Give a JIT/interpreted kernel object the planned launch path (its class gets the mix-in)."""
    while isinstance(obj, (Autotuner, Heuristics)):
        obj = obj.fn
    cls = type(obj)
    if cls in _CLASSES.values() or not hasattr(cls, "run") or not hasattr(obj, "arg_names"):
        return
    if cls not in _CLASSES:
        # cls stays the only base (so instances keep its layout and __class__ can be reassigned);
        # the planned methods are copied in, and reach cls's own run through _base.
        mixin = _PlannedInterpreted if runtime.is_interpreter() else _PlannedJIT
        methods = {name: fn for klass in reversed(mixin.__mro__[:-1]) for name, fn in vars(klass).items()
                   if callable(fn) and not name.startswith("__")}
        _CLASSES[cls] = type(f"Planned{cls.__name__}", (cls,), {**methods, "_base": cls})
    obj.__class__ = _CLASSES[cls]


def install() -> None:
    """Put every kernel of the loaded ``ge2.kernels`` modules on the planned launch path (when enabled
    at import: with plans off the kernels keep Triton's own classes)."""
    if not ENABLED:
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if not name.startswith("ge2.kernels.") or module is None:
            continue
        for value in list(vars(module).values()):
            inner = value
            while isinstance(inner, (Autotuner, Heuristics)):
                inner = inner.fn
            if isinstance(inner, (JITFunction, InterpretedFunction)):
                _planned(value)
