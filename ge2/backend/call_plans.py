"""Call plans: the repeated-call path of a registry op, without the op's Python.

A ge2 op call runs the schema check, the dispatch, the kernel module's launcher (shape logic,
config choice, output allocation, TMA descriptors) and then its kernel launches: ~50-80 µs of
Python on the H100 machine's host for one launch that itself costs ~7 µs. Training steps repeat
the same calls with the same shapes, so a call is recorded once per *call key* (op, backend,
precision, and per input its shape, strides, dtype, device and address mod 16; per attribute its
value) and later calls with that key only allocate the outputs and launch the recorded kernels
with the new tensors' addresses.

A recording is kept only when it is provably a function of the key:

* every launch went through a launch plan that already existed (so no autotuning or compiling
  happened inside; the first calls of a shape are never recorded);
* torch did nothing but allocate, view, copy and fill (a ``TorchDispatchMode`` watches; copies and
  fills are replayed as steps on the new tensors; any other torch op, or a host read, refuses the
  recording);
* every tensor a kernel (or a torch step) touched lies inside an input, a returned output, or a
  buffer the op allocated (scratch, reallocated on replay). Inputs may overlap: the same bytes
  twice (x * x: the key says which earlier input shares an input's address, and the kernel
  arguments are read from that one), or interleaved slices of one buffer (attention's q, k, v),
  where a kernel argument must be one of the inputs itself (a view inside several is ambiguous and
  refuses the recording). A cached buffer the op kept from an earlier call refuses the recording.

Host state that changes between calls without changing the key would make a replay stale; ge2's
ops keep none (dropout's seed and offset live in a device tensor, advanced by a kernel).

Replays skip the schema check (the key was checked before) and pass raw addresses to Triton's
launcher on the GPU; under the interpreter they rebuild tensor views, so the CPU test suite runs
every replay path. ``GE2_CALL_PLANS=0`` turns them off; ``clear()`` forgets them (tests that
change a module's tuning constants start from a clean table).
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ge2 import runtime
from ge2.kernels import launch, native

ENABLED: bool = os.environ.get("GE2_CALL_PLANS", "1") not in ("", "0")
MAX_PLANS = 16384  # call keys of all ops; a full table is cleared (shapes beyond that are a workload's churn)
STATS = {"hits": 0, "native": 0, "plans": 0, "refused": 0}  # native: hits replayed in C
REFUSED: dict[tuple[str, str], int] = {}  # (op, why) -> recordings refused: what keeps an op off the fast path
_Tensor = torch.Tensor
_SCALARS = (int, bool, str, type(None))
_FACTORIES = frozenset(("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                        "aten::new_empty_strided"))


def key(op: str, inputs: tuple, attrs: dict) -> tuple | None:
    """The call key, or None when an input or attribute cannot be keyed (lists, tensors in attrs)."""
    return compute_key(op, runtime._matmul_precision, inputs, attrs)


def python_key(op: str, precision: str, inputs: tuple, attrs: dict) -> tuple | None:
    """The call key in Python (``native.c``'s call_key builds the same tuple).

    Flat: each input adds its items to one tuple (a tensor six, led by its torch.Size; a scalar two
    or three, led by its type), so hashing and comparing it walks no nested tuples; a Size never
    equals a type, so the flat sequence reads back one way only.
    """
    parts: list = [op, precision]
    ptrs: list = []
    for v in inputs:
        if type(v) is _Tensor:
            ptr = v.data_ptr()
            # which earlier input shares this address (x * x): the plan reads that input's address
            parts += (v.shape, v.stride(), v.dtype, v.device, ptr & 15, ptrs.index(ptr) if ptr in ptrs else -1)
            ptrs.append(ptr)
            continue
        kind = type(v)
        if kind in _SCALARS:
            parts += (kind, v)
        elif kind is float:
            parts += (float, v, math.copysign(1.0, v))
        else:
            return None
    if attrs:
        for name, v in attrs.items():
            kind = type(v)
            if kind in _SCALARS or kind is tuple:
                parts.append((name, kind, v))
            elif kind is float:
                parts.append((name, float, v, math.copysign(1.0, v)))
            elif kind is torch.dtype:
                parts.append((name, v))
            else:
                return None
    return tuple(parts)


# (op, precision, inputs, attrs) -> call key: ge2_native's where the module builds (the registry's
# entry is built from the same module at import), else python_key
compute_key: Callable[[str, str, tuple, dict], tuple | None] = native.call_key() or python_key


class _Watch(TorchDispatchMode):
    """Records torch's allocations, copies and fills inside the op; refuses on anything else."""

    def __init__(self, recorder: launch.Recorder):
        super().__init__()
        self.recorder = recorder
        self.allocated: list[torch.Tensor] = []  # kept alive while recording: no address is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.recorder.launching or func.is_view:
            return out
        name = func._schema.name
        if name in _FACTORIES:
            self.allocated.append(out)
        elif func in _DATA_OPS:
            if _DATA_OPS[func][1]:  # it made a new tensor: an allocation, then the step fills it
                self.allocated.append(out)
            self.recorder.launches.append((None, func, (args, kwargs or {}, out)))
        elif not _metadata_only(func):
            self.recorder.refuse(f"torch ran {func}")
        return out


_aten = torch.ops.aten
# torch's data movement inside an op, replayed as in-place steps on the replay's tensors:
# op -> (which argument is the destination ("out": the result), allocates a new tensor?)
_DATA_OPS = {
    _aten.copy_.default: (0, False), _aten.zero_.default: (0, False), _aten.fill_.Scalar: (0, False),
    _aten.clone.default: ("out", True), _aten._to_copy.default: ("out", True), _aten.zeros.default: ("out", True),
}


def _metadata_only(func) -> bool:
    """An aten op that returns no tensor and reads no tensor data (promote_types, sizes); not a host read."""
    schema = func._schema
    return (schema.name != "aten::_local_scalar_dense" and not schema.is_mutable
            and all("Tensor" not in str(r.type) for r in schema.returns))


class _Address:
    """What a replayed TMA descriptor's base needs to be for Triton's launcher."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _Descriptor:
    """A host TMA descriptor as Triton's launcher reads it (base address, shape, strides, block)."""

    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, base, shape, strides, block_shape, padding):
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, padding


class CallPlan:
    """Outputs and scratch to allocate, and the launches to replay, each kernel tensor argument as (source, offset).

    ``replay(inputs)`` is generated Python (``_compile``): one straight-line function per plan, with the
    recorded constants bound in, so a replay runs no loop over a template and no per-launch dispatch.
    """

    __slots__ = ("in_index", "in_layouts", "outputs", "result", "launches", "replay", "source", "native")

    def __init__(self, in_index, in_layouts, outputs, result, launches):
        self.in_index = in_index  # positions of the tensor inputs; sources 0.. are these, then the outputs
        self.in_layouts = in_layouts  # (shape, stride, dtype, device) per tensor input if it is dense, else None
        self.outputs = outputs    # (shape, stride, dtype, device) per fresh output, then per scratch buffer
        self.result = result      # returned: ("in", input i) / ("out", source) / ("view", (source, offset, view)) /
        # ("const", v) / (tuple or list, items)
        self.launches = launches  # (kernel, launch plan, values with None in the slots, slots); for a torch
        # step: (None, "copy" | "fill", fill value, [(source, offset, view) of the destination, of the source]);
        # for host work: (None, launch.HOST, fn, [(source, offset, view) of its tensor])
        self.source, self.replay = _compile(self)
        self.native = _native_replay(self)  # the same replay for ge2_native's dispatch, or None


def _output_recipes(plan: CallPlan) -> list:
    """Per output: the index of a tensor input whose layout it has (allocated with empty_like: fewer
    arguments for torch to parse), else its (shape, stride, dtype, device) for empty_strided."""
    n_in = len(plan.in_index)
    return [next((j for j in range(n_in) if plan.in_layouts[j] == layout),
                 (tuple(layout[0]), tuple(layout[1]), layout[2], layout[3])) for layout in plan.outputs]


def _native_replay(plan: CallPlan):
    """The plan as a ``ge2_native.Replay``, or None where the generated Python must run it: under the
    interpreter, without the compiled module, or with a launch not packed for ge2's launcher, a torch
    copy or fill, or a result that is a view."""
    built = native.module()
    if built is None or runtime.is_interpreter():
        return None
    launches = []
    for kernel, lp, _template, slots in plan.launches:
        if kernel is None or lp.packed is None:
            return None
        by_position = {at: (src, delta) for at, src, delta, _ in slots}  # a TMA descriptor's: its base
        if any(at not in by_position for at in lp.packed[2]):
            return None
        launches.append((lp.packed[1], tuple(by_position[at] for at in lp.packed[2])))

    def source(item) -> int | None:
        kind, value = item
        return value if kind == "out" else plan.in_index.index(value) if kind == "in" else None

    kind, value = plan.result
    if kind in ("out", "in"):
        result = source(plan.result)
    elif kind in (tuple, list) and all(item[0] in ("out", "in", "const") for item in value):
        result = (kind is list, tuple((True, source(item)) if item[0] != "const" else (False, item[1])
                                      for item in value))
    else:
        return None
    try:
        return built.Replay(tuple(plan.in_index), tuple(_output_recipes(plan)), tuple(launches), result)
    except ValueError:  # more sources than a Replay holds
        return None


def _compile(plan: CallPlan) -> tuple[str, Callable[[tuple], Any]]:
    """(source, function): ``replay(inputs)`` for this plan as straight-line Python.

    On the GPU a launch whose launch plan has a direct C entry (``launch._direct``) calls it with
    the sources' addresses, unless a recording or a launch hook is active (then ``launch.replay``);
    under the interpreter every launch goes through ``launch.replay`` with tensor views.
    """
    interpreted = runtime.is_interpreter()
    env: dict[str, Any] = {"_empty": torch.empty_strided, "_empty_like": torch.empty_like, "_view": _view,
                           "_replay": launch.replay, "_RECORDERS": launch._RECORDERS, "_no_hooks": launch._no_hooks,
                           "_stream": launch._stream, "_device": launch._device, "_Descriptor": _Descriptor,
                           "_Address": _Address, "_STATS": STATS,
                           "_host_step": launch.host_step}
    if interpreted:
        from triton.tools.tensor_descriptor import TensorDescriptor

        env["_TensorDescriptor"] = TensorDescriptor

    def const(value) -> str:
        """A recorded value as source: ints, bools and None inline, anything else bound by name."""
        if value is None or type(value) in (int, bool):
            return repr(value)
        name = f"_c{len(env)}"
        env[name] = value
        return name

    n_in = len(plan.in_index)
    lines = ["def replay(inputs):"]
    lines += [f"    t{k} = inputs[{i}]" for k, i in enumerate(plan.in_index)]
    for k, recipe in enumerate(_output_recipes(plan), start=n_in):
        if type(recipe) is int:
            lines.append(f"    t{k} = _empty_like(t{recipe})")
        else:
            shape, stride, dtype, device = recipe
            lines.append(f"    t{k} = _empty({const(shape)}, {const(stride)}, dtype={const(dtype)}, device={const(device)})")
    direct = not interpreted and any(kernel is not None and (lp.direct or lp.packed) is not None
                                     for kernel, lp, _, _ in plan.launches)
    if not interpreted:
        used = sorted({src for kernel, _, _, slots in plan.launches if kernel is not None for _, src, _, _ in slots})
        lines += [f"    p{k} = t{k}.data_ptr()" for k in used]
    if direct:
        lines.append("    fast = not _RECORDERS and _no_hooks()")
        lines.append("    if fast:")
        lines.append("        stream = _stream(_device())")

    def view(item) -> str:
        src, delta, meta = item
        return f"_view(t{src}, {delta}, {const(meta)})"

    for kernel, lp, template, slots in plan.launches:
        if kernel is None and lp == launch.HOST:  # host work on a tensor: launch.host_step again
            lines.append(f"    _host_step({const(template)}, {view(slots[0])})")
            continue
        if kernel is None:  # a torch copy or fill
            dst = view(slots[0])
            lines.append(f"    {dst}.copy_({view(slots[1])})" if lp == "copy" else f"    {dst}.fill_({const(template)})")
            continue
        args = [const(v) for v in template]
        for at, src, delta, meta in slots:
            if interpreted and len(meta) == 5:  # a TMA descriptor over a view of the source
                args[at] = f"_TensorDescriptor({view((src, delta, meta[4]))}, *{const(tuple(meta[:4]))})"
            elif interpreted:
                args[at] = view((src, delta, meta))
            elif meta is None:
                args[at] = f"p{src} + {delta}" if delta else f"p{src}"
            else:
                args[at] = f"_Descriptor(_Address(p{src} + {delta}), *{const(tuple(meta))})"
        k, p = const(kernel), const(lp)
        if lp.packed is not None and not interpreted:
            # ge2's launcher (the launch plan's packed parameters: the same values, the key saw to
            # it), the addresses in argument order (a TMA descriptor's: its base; the launch re-aims
            # the tensor map encoded at record time); if it cannot (hooks, no CUDA context), Triton's
            # launcher through launch.replay
            entry, packed, positions = lp.packed
            bases = {at: f"p{src} + {delta}" if delta else f"p{src}" for at, src, delta, _ in slots}
            addresses = ", ".join(bases[at] for at in positions)
            lines.append(f"    if not (fast and {const(entry)}({const(packed)}, stream, {addresses})):")
            lines.append(f"        _replay({k}, {p}, [{', '.join(args)}])")
        elif lp.direct is not None and not interpreted:
            entry, grid, fixed = lp.direct
            lines.append("    if fast:")
            lines.append(f"        {const(entry)}({', '.join(map(str, grid))}, stream, *{const(fixed)}, {', '.join(args)})")
            lines.append("    else:")
            lines.append(f"        _replay({k}, {p}, [{', '.join(args)}])")
        else:
            lines.append(f"    _replay({k}, {p}, [{', '.join(args)}])")

    def build(result) -> str:
        kind, value = result
        if kind == "out":
            return f"t{value}"
        if kind == "in":
            return f"inputs[{value}]"
        if kind == "const":
            return const(value)
        if kind == "view":
            return view(value)
        items = "".join(build(item) + ", " for item in value)
        return f"({items})" if kind is tuple else f"[{items}]"

    lines.append('    _STATS["hits"] += 1')
    lines.append(f"    return {build(plan.result)}")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<ge2 call plan>", "exec"), env)
    return source, env["replay"]


def _view(base: torch.Tensor, delta: int, meta: tuple) -> torch.Tensor:
    """A recorded tensor (size, stride, dtype) at byte ``delta`` from ``base``'s start, as a view of its storage."""
    size, stride, dtype = meta
    offset = (base.data_ptr() + delta - base.untyped_storage().data_ptr()) // dtype.itemsize
    return torch.empty(0, dtype=dtype, device=base.device).set_(base.untyped_storage(), offset, size, stride)


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


ALIASED = "a kernel argument inside inputs that overlap that is none of them (a view)"
UNSEEN = "outputs allocated but no launch or torch copy seen (a kernel off the planned launch path)"
# Refusals that say nothing about the key's next call: they do not count against RECORD_TRIES.
TRANSIENT = (launch.NEW_PLAN,)


def record(op: str, fn: Callable[..., Any], inputs: tuple, attrs: dict) -> tuple[Any, CallPlan | None, str | None]:
    """Run ``fn(*inputs, **attrs)`` while recording its launches: (its result, a plan or None, why not)."""
    recorder = launch.Recorder()
    with launch.recording(recorder), _Watch(recorder) as watch:
        out = fn(*inputs, **attrs)
    if not recorder.launches and watch.allocated:
        # memory allocated and nothing seen writing it: a kernel launched off the planned path (a
        # module loaded after import ge2 installed the plans), which a replay would silently skip
        recorder.refuse(UNSEEN)
    plan = _plan(recorder, inputs, out, watch.allocated) if recorder.refused is None else None
    why = None
    if plan is None:
        STATS["refused"] += 1
        why = recorder.refused or "a kernel argument outside the inputs and outputs (scratch kept by the op)"
        REFUSED[(op, why)] = REFUSED.get((op, why), 0) + 1
    else:
        STATS["plans"] += 1
    return out, plan, why


def _plan(recorder: launch.Recorder, inputs: tuple, out: Any, allocated: list) -> CallPlan | None:
    interpreted = runtime.is_interpreter()
    # Sources: the tensor inputs, then fresh outputs, then scratch; each with the bytes it spans.
    in_index = [i for i, v in enumerate(inputs) if type(v) is _Tensor]
    sources: list[torch.Tensor] = []
    ranges: list[tuple[int, int]] = []

    def add_source(t: torch.Tensor) -> bool:
        """Register ``t`` as the next source unless its bytes overlap an earlier source's."""
        lo = t.data_ptr()
        hi = lo + _extent(t)
        if any(lo < h and l < hi for l, h in ranges):
            return False
        sources.append(t)
        ranges.append((lo, hi))
        return True

    for i in in_index:
        t = inputs[i]
        span = (t.data_ptr(), t.data_ptr() + _extent(t))
        # The bytes of an earlier input (x * x: source() resolves its addresses to that input, and the
        # key keeps the two aliased on every replay), or inputs that overlap (q, k, v: interleaved
        # slices of one projection): an address inside several inputs is resolved by identity.
        sources.append(t)
        ranges.append(span)
    views: list = []

    def template(value):
        kind = type(value)
        if kind is _Tensor:
            for i in in_index:
                if value is inputs[i]:
                    return "in", i
            if (value.storage_offset() or value.untyped_storage().nbytes() != _extent(value)
                    or value.data_ptr() & 15 or not add_source(value)):
                views.append(value)  # a view of an input or of a buffer the op allocated: resolved below
                return "view", len(views) - 1
            return "out", len(sources) - 1
        if kind in (tuple, list):
            return kind, [template(v) for v in value]
        if kind in _SCALARS or kind is float:
            return "const", value
        raise LookupError

    try:
        result = template(out)
    except LookupError:
        return None
    if views and any(t is v for t in allocated for v in views):
        return None  # an allocation returned as a view of itself would not be told apart
    # Scratch: what the op allocated and did not return. Its contents come only from the recorded
    # torch steps and launches, so a fresh allocation of the same layout replays it.
    for t in allocated:
        if any(t.data_ptr() == o.data_ptr() for o in sources[len(in_index):]):
            continue
        if t.storage_offset() or not add_source(t):
            return None
    if any(hi == lo for lo, hi in ranges):
        return None  # an empty tensor has no address to tell it apart

    def source(ptr: int, t: torch.Tensor | None = None) -> tuple[int, int]:
        """(source, byte offset) of an address; inside inputs that overlap, only the input itself is."""
        hits = [src for src, (lo, hi) in enumerate(ranges) if lo <= ptr < hi]
        if hits and all(ranges[src] == ranges[hits[0]] for src in hits):
            return hits[0], ptr - ranges[hits[0]][0]
        for src in hits:
            if sources[src] is t:
                return src, 0
        raise LookupError(ALIASED)

    def view_of(t: torch.Tensor) -> tuple:
        src, delta = source(t.data_ptr(), t)
        if t.device != sources[src].device:  # an address range of another device
            raise LookupError
        return src, delta, (t.shape, t.stride(), t.dtype)

    def resolve_views(item):
        kind, value = item
        if kind == "view":
            return "view", view_of(views[value])
        if kind in (tuple, list):
            return kind, [resolve_views(v) for v in value]
        return item

    launches = []
    try:
        result = resolve_views(result)
        for kernel, plan, values in recorder.launches:
            if kernel is None and plan == launch.HOST:  # host work on a tensor (a deferred check)
                fn, t = values
                launches.append((None, launch.HOST, fn, [view_of(t)]))
                continue
            if kernel is None:  # a torch data step: (func, (args, kwargs, result))
                func, (args, _kwargs, made) = plan, values
                dst = made if _DATA_OPS[func][0] == "out" else args[0]
                if func in (_aten.zero_.default, _aten.zeros.default):
                    launches.append((None, "fill", 0, [view_of(dst)]))
                elif func is _aten.fill_.Scalar:
                    launches.append((None, "fill", args[1], [view_of(dst)]))
                else:  # copy_(dst, src), clone(src), _to_copy(src, dtype=...): a copy from args' source
                    src = args[1] if func is _aten.copy_.default else args[0]
                    if type(src) is not _Tensor:
                        raise LookupError
                    launches.append((None, "copy", None, [view_of(dst), view_of(src)]))
                continue
            tmpl, slots = list(values), []
            for at, _ in plan.slots:
                v = values[at]
                tmpl[at] = None
                if isinstance(v, _Tensor):
                    src, delta = source(v.data_ptr(), v)
                    slots.append((at, src, delta, (v.shape, v.stride(), v.dtype) if interpreted else None))
                elif type(v) is int:  # an address: an inner op's call plan replayed inside this op (GPU)
                    src, delta = source(v)
                    slots.append((at, src, delta, None))
                else:  # a TMA descriptor (under the interpreter also its base tensor's view, to rebuild it)
                    src, delta = source(v.base.data_ptr(), v.base)
                    meta = (list(v.shape), list(v.strides), list(v.block_shape), getattr(v, "padding", "zero"))
                    if interpreted:
                        meta += ((v.base.shape, v.base.stride(), v.base.dtype),)
                    slots.append((at, src, delta, meta))
            launches.append((kernel, plan, tmpl, slots))
    except LookupError as e:
        if e.args:
            recorder.refuse(e.args[0])
        return None  # a scratch buffer (or a cached tensor) the replay would not provide
    outputs = [(t.shape, t.stride(), t.dtype, t.device) for t in sources[len(in_index):]]
    # an input whose layout torch.empty_like reproduces (dense, non-overlapping: strides kept)
    in_layouts = [(t.shape, t.stride(), t.dtype, t.device) if torch.empty_like(t).stride() == t.stride()
                  else None for t in sources[:len(in_index)]]
    return CallPlan(in_index, in_layouts, outputs, result, launches)


PLANS: dict[tuple, CallPlan] = {}  # call key (its first item is the op) -> plan; the registry reads it directly
_SEEN: dict[tuple, int] = {}  # call key -> calls without a plan so far
RECORD_TRIES = 3  # recordings refused before a key runs plainly for good (a scratch buffer, a fill)


def find(op: str, inputs: tuple, attrs: dict) -> tuple[tuple | None, CallPlan | None]:
    """(the call key, its plan or None)."""
    call_key = key(op, inputs, attrs)
    return call_key, (PLANS.get(call_key) if call_key is not None else None)


def run(op: str, call_key: tuple, fn: Callable[..., Any], inputs: tuple, attrs: dict) -> Any:
    """A call without a plan: the first time for this key it only runs, then it records (a few tries)."""
    calls = _SEEN.get(call_key, 0)
    if calls == 0:
        if len(_SEEN) >= MAX_PLANS:
            _SEEN.clear()
        _SEEN[call_key] = 1
    if calls == 0 or calls > RECORD_TRIES:
        return fn(*inputs, **attrs)
    out, plan, why = record(op, fn, inputs, attrs)
    if why not in TRANSIENT:
        _SEEN[call_key] = calls + 1
    if plan is not None:
        if len(PLANS) >= MAX_PLANS:
            PLANS.clear()
        PLANS[call_key] = plan
    return out


def native_dispatch(slow: Callable[[str, tuple, dict, tuple | None], Any], registry_globals: dict):
    """ge2_native's ``call(op, *inputs, **attrs)`` set up to replay this module's plans and to hand
    other calls to ``slow(op, inputs, attrs, call key or None)``; None where the module cannot be built."""
    built = native.module()
    if built is None:
        return None
    built.set_dispatch(PLANS, slow, STATS, launch._RECORDERS, launch._RUNTIME_KNOBS, launch._HookChain,
                       launch._device, launch._stream, torch.empty_like, torch.empty_strided, registry_globals,
                       globals(), vars(launch), vars(runtime))
    return built.call


def clear() -> None:
    """Forget every call plan (and which keys were seen)."""
    PLANS.clear()
    _SEEN.clear()
