"""Whole-step CUDA graphs: capture a training step once per path, then replay it.

A small model's step is bound by Python launching kernels, not by the GPU. ``ge2.capture(fn)``
returns a ``CapturedStep``. A *path* is what decides which kernels a call launches: the input
tensors' shapes, dtypes, devices and requires_grad, the values of the arguments named in
``static_argnames`` (Python control flow on them: a flag, a number of micro-batches) and the
train/eval modes of the modules the step ran. Per path, the first ``warmup`` calls run ``fn``
eagerly on a side stream, as real steps on the real batches, which compiles and autotunes every
kernel and creates the optimizer state; the next call captures ``fn`` into a
``torch.cuda.CUDAGraph`` (its own memory pool, static input buffers) and replays it, and later calls
only copy the batch in and replay. Up to ``max_graphs`` paths keep a graph (least recently used
evicted). What a step mutates lives on the device and advances on every replay: parameters and
optimizer state (updated in place, so eager code sees them), the optimizer's step count and
hyper-parameters (``lr`` set by a scheduler between calls is written into the device tensor before
each replay), dropout's [seed, offset] state, batch-norm running statistics.

Other plain Python arguments (numbers, strings, None) are not part of the path: a graph replays
whatever the call it captured did with them. So the launches of each eager call are recorded
(kernel, grid and scalar arguments of every ge2 launch, from the launch plans); a call whose
non-static values were never seen on its path runs eagerly and is compared with the path's
launches: the same launches, and the values join the path (later calls replay); different
launches raise ``CaptureError`` naming the argument to declare static. Two warm-up calls (after
the first, which creates state) with the same arguments but different launches (Python state
outside the arguments) raise too.

``repeat=n``: every tensor argument is a device-resident stack of n batches [n, ...]; one call runs
n steps (one graph launch) and returns the outputs stacked [n, ...]. ``stop_when(outputs) -> bool
tensor``: once true, later steps do not run, without a host sync: inside a graph each step sits in
a CUDA conditional (IF) node on a device flag where torch exposes them (``early_exit ==
"conditional"``: no step runs after the one that met the condition); otherwise the host reads a
pinned copy of the flag before each replay with at most ``MAX_IN_FLIGHT`` replays queued
(``"pinned-flag"``: at most ``MAX_IN_FLIGHT * n - 1`` steps run after it). Rows of steps that
did not run are NaN; ``step.stopped`` tells the host, ``step.resume()`` clears it.

Outputs are static: a replay overwrites the tensors the previous replay returned (clone to keep).
Capture-unsafe work (a host sync such as ``.item()``, ``.numpy()``, printing a tensor, a
data-dependent shape, a kernel meeting a shape for the first time, a scheduler stepped inside the
step) raises ``CaptureError`` at capture time. On the CPU (Triton interpreter) there are no CUDA
graphs: a ``CapturedStep`` runs ``fn`` eagerly and says so in ``captured``, with the same paths,
checks, repeat and stop_when (read on the host at once).
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ge2.kernels import launch


class CaptureError(RuntimeError):
    """Raised when a step cannot be captured into a CUDA graph (host sync, new shape, ...)."""


@dataclass
class _Recording:
    """What one call of a ``CapturedStep`` touched: its optimizers and the leaves given a .grad."""

    capturing: bool
    optimizers: dict[int, Any] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    leaves: dict[int, Any] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # host buffers the graph's copies read at replay


_recording: _Recording | None = None


@contextlib.contextmanager
def _recorded(record: _Recording):
    """Make ``record`` the recording that optimizers, modules and the engine report to."""
    global _recording
    outer, _recording = _recording, record
    try:
        yield record
    finally:
        _recording = outer


def is_capturing() -> bool:
    """True while ``ge2.capture`` is recording a CUDA graph (host syncs are not allowed then)."""
    return _recording is not None and _recording.capturing


def check_not_capturing(what: str) -> None:
    """Raise ``CaptureError`` if ``what`` (e.g. "Tensor.item()") is called during a capture."""
    if is_capturing():
        raise CaptureError(
            f"ge2.capture: {what} needs the host to wait for the GPU, which cannot happen inside a "
            f"captured CUDA graph; return the tensor from the step and read it after the call")


def note_optimizer(opt: Any) -> None:
    """Called by ``Optimizer.step``: a captured step re-syncs this optimizer's hyper-parameters."""
    if _recording is not None:
        _recording.optimizers[id(opt)] = opt


def note_module(module: Any) -> None:
    """Called by ``Module.__call__``: a graph captured in train mode must not replay in eval mode."""
    if _recording is not None:
        _recording.modules[id(module)] = module


def keep_alive(obj: Any) -> None:
    """While capturing, tie ``obj`` (e.g. a pinned host buffer a captured copy reads) to the graph's life."""
    if is_capturing():
        _recording.keep.append(obj)


def note_grad(leaf: Any) -> None:
    """Called by the backward engine when it creates ``leaf.grad`` (a graph-pool tensor while capturing)."""
    if _recording is not None:
        _recording.leaves[id(leaf)] = leaf


@dataclass
class _Graph:
    """One captured path: the graph, its static inputs and outputs, and the .grad it leaves."""

    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor | None]
    outputs: Any
    grads: list[tuple[Any, torch.Tensor | None]]  # (leaf, the buffer its .grad is after a replay)
    optimizers: list[Any]
    keep: list[Any]


@dataclass
class _Path:
    """One path of the step (one cache entry): the kernel launches its calls make, the non-static
    argument values known to make exactly those launches, and its graph (None on the CPU)."""

    launches: tuple | None  # None: unknown (no call of these values ran entirely on existing launch plans)
    values: set  # _value_keys of non-static values verified to launch `launches`
    captured_values: tuple  # the values the graph was captured with (named in errors)
    graph: _Graph | None = None


@dataclass
class _Warm:
    """The eager warm-up calls of one key so far."""

    calls: int = 0
    shapes: Any = None
    launches: tuple | None = None  # the launches of the first clean call (a reference for later calls)
    ref_values: tuple = ()
    values: set = field(default_factory=set)
    template: Any = None  # one step's output structure (shape, dtype, device leaves), for repeat/stop_when


@dataclass
class _Arg:
    """One argument of a call: its name (for errors), its value and where it goes back."""

    name: str
    value: Any
    where: int | str  # position in args, or keyword


def _shapes(out: Any) -> Any:
    from ge2.autograd.tensor import Tensor

    if isinstance(out, (Tensor, torch.Tensor)):
        return ("tensor", tuple(out.shape), out.dtype)
    if isinstance(out, (tuple, list)):
        return type(out).__name__, tuple(_shapes(o) for o in out)
    if isinstance(out, dict):
        return "dict", tuple((k, _shapes(v)) for k, v in out.items())
    return "value", type(out)


def _reset_rng_capture_state(stream: torch.cuda.Stream) -> None:
    """After a capture that CUDA aborted, torch's CUDA generator still believes it is capturing (its
    next random op raises "Offset increment outside graph capture"); an empty capture that ends
    normally takes it out of that state."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                pass
    except Exception:  # nothing more can be done here; the CaptureError that follows says what failed
        pass


def _value_key(values: tuple) -> tuple:
    # 1 == 1.0 == True and 0.0 == -0.0 for Python, but not for a kernel's scalar argument
    return tuple((type(v), v, math.copysign(1.0, v)) if isinstance(v, float) else (type(v), v) for v in values)


_PLAIN = (bool, int, float, str, type(None))


class _Launches(launch.Recorder):
    """Records the ge2 kernel launches of a call, as (kernel, grid, scalar arguments) per launch."""

    __slots__ = ("new_plan", "unplanned")

    def __init__(self):
        super().__init__()
        self.new_plan = False  # a launch made a new launch plan (it is not in `launches`)
        self.unplanned = False  # a launch ran off the plans (GE2_LAUNCH_PLANS=0): nothing can be said

    def refuse(self, why: str) -> None:
        super().refuse(why)
        if why == launch.NEW_PLAN:
            self.new_plan = True
        else:
            self.unplanned = True

    def fingerprint(self) -> tuple[tuple, str]:
        """(the launches, status): "clean" (every launch reused a plan: the list is complete), "new" (some
        launch had arguments never launched before: a first call compiling and tuning, or a new path),
        "unknown" (launches off the plans)."""
        status = "unknown" if self.unplanned else "new" if self.new_plan else "clean"
        return tuple((_kernel_name(k), plan.grid, _scalars(plan.values)) for k, plan, _ in self.launches
                     if k is not None), status  # not the host steps (launch.host_step)


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _scalars(values: list) -> tuple:
    """A launch's scalar arguments, less its bools: flags such as ALIGNED follow tensor addresses, which
    vary between eager calls (an allocator's state), not the step's path or values."""
    out = []
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        try:
            hash(v)
            out.append((type(v), v))
        except TypeError:
            out.append(repr(v))
    return tuple(out)


def conditional_nodes_available() -> bool:
    """Whether torch can capture CUDA conditional (IF) graph nodes (torch >= 2.11's
    ``CUDAGraph.begin_capture_to_if_node``, CUDA >= 12.4); ``GE2_CONDITIONAL_NODES=0`` turns them off."""
    if os.environ.get("GE2_CONDITIONAL_NODES", "1") in ("", "0"):
        return False
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or not hasattr(graph, "get_currently_capturing_graph") or not hasattr(graph, "begin_capture_to_if_node"):
        return False
    version = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    return version >= (12, 4)


@contextlib.contextmanager
def _if_node(flag: torch.Tensor):
    """While capturing: the kernels launched inside run at replay only if the device bool ``flag`` is true."""
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_if_node(flag)
    try:
        yield
    finally:
        graph.end_capture_to_conditional_node()


def _spec(out: Any, what: str) -> Any:
    """One step's output as a structure of (shape, dtype, device) leaves (a repeated step's outputs are stacked)."""
    from ge2.autograd.tensor import Tensor

    if isinstance(out, (Tensor, torch.Tensor)):
        t = out.data if isinstance(out, Tensor) else out
        return "tensor", isinstance(out, Tensor), tuple(t.shape), t.dtype, t.device
    if out is None:
        return None
    if isinstance(out, (tuple, list)):
        return type(out), tuple(_spec(o, what) for o in out)
    if isinstance(out, dict):
        return dict, tuple((k, _spec(v, what)) for k, v in out.items())
    raise TypeError(f"ge2.capture: {what} needs a step that returns tensors (or tuples, lists or dicts of them); "
                    f"it returned a {type(out).__name__}")


def _alloc(spec: Any, n: int) -> Any:
    """Buffers [n, *shape] for ``spec``'s leaves, filled with NaN (0 for integers): a step that did not run."""
    from ge2.autograd.tensor import Tensor

    if spec is None:
        return None
    if spec[0] == "tensor":
        _, wrap, shape, dtype, device = spec
        t = torch.empty((n, *shape), dtype=dtype, device=device)
        t.fill_(float("nan") if dtype.is_floating_point or dtype.is_complex else 0)
        return Tensor(t) if wrap else t
    kind, items = spec
    if kind is dict:
        return {k: _alloc(v, n) for k, v in items}
    return kind(_alloc(v, n) for v in items)


def _write(bufs: Any, out: Any, i: int) -> None:
    """Copy one step's outputs into row ``i`` of the stacked buffers."""
    from ge2.autograd.tensor import Tensor

    if bufs is None:
        return
    if isinstance(bufs, (Tensor, torch.Tensor)):
        dst = bufs.data if isinstance(bufs, Tensor) else bufs
        src = out.data if isinstance(out, Tensor) else out
        if tuple(src.shape) != tuple(dst.shape[1:]):
            raise CaptureError(f"ge2.capture: a repeated step returned an output of shape {list(src.shape)}, "
                               f"another step of the same call {list(dst.shape[1:])}; every step must return the same shapes")
        dst[i].copy_(src)
    elif isinstance(bufs, dict):
        for k, v in bufs.items():
            _write(v, out[k], i)
    else:
        for b, o in zip(bufs, out):
            _write(b, o, i)


class CapturedStep:
    """``fn`` captured into one CUDA graph per path (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, warmup: int = 2, max_graphs: int = 8,
                 static_argnames: tuple[str, ...] | str = (), repeat: int = 1,
                 stop_when: Callable[[Any], Any] | None = None):
        if not callable(fn):
            raise TypeError(f"ge2.capture: fn must be callable, got {type(fn).__name__}")
        if warmup < 1:
            raise ValueError(f"ge2.capture: warmup must be >= 1 (kernels must be compiled and tuned "
                             f"before capture), got {warmup}")
        if max_graphs < 1:
            raise ValueError(f"ge2.capture: max_graphs must be >= 1, got {max_graphs}")
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"ge2.capture: repeat must be an int >= 1 (steps per call), got {repeat!r}")
        if stop_when is not None and not callable(stop_when):
            raise TypeError(f"ge2.capture: stop_when must be callable (outputs -> bool tensor), got {type(stop_when).__name__}")
        self.fn, self.warmup, self.max_graphs = fn, warmup, max_graphs
        self.repeat, self.stop_when = repeat, stop_when
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        try:
            self._sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin: positional arguments, named by position
            self._sig = None
        names = set() if self._sig is None else {
            n for n, p in self._sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        has_var_kw = self._sig is not None and any(p.kind == p.VAR_KEYWORD for p in self._sig.parameters.values())
        for name in self.static_argnames:
            if name not in names and not has_var_kw:
                fn_name = getattr(fn, "__name__", "fn")
                raise ValueError(f"ge2.capture: static_argnames names {name!r}, which is not a parameter of "
                                 f"{fn_name}{self._sig if self._sig is not None else '(...)'}")
        params = [] if self._sig is None else list(self._sig.parameters.values())
        self._positional = ([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
                            next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args"))
        self.paths: collections.OrderedDict[tuple, _Path] = collections.OrderedDict()
        self._warm: dict[tuple, _Warm] = {}
        self.captures = 0  # graphs recorded so far (a re-capture after eviction counts again)
        self.replays = 0
        self._stream: torch.cuda.Stream | None = None
        self._optimizers: dict[int, Any] = {}  # every optimizer a call of fn has stepped
        self._modules: dict[int, Any] = {}  # every module a call of fn has run (their modes key the graphs)
        # early exit: a device bool "keep going" and its host mirror, read without a sync
        self._go: torch.Tensor | None = None
        self._go_host: torch.Tensor | None = None
        self._conditional: bool | None = None  # IF nodes or the pinned flag, chosen at the first call
        self._in_flight: collections.deque = collections.deque()  # pinned-flag mode: events of recent replays

    # ---- public state --------------------------------------------------------------------------
    @property
    def graphs(self) -> collections.OrderedDict:
        """The captured graphs by key (least recently used first); empty on the CPU."""
        return collections.OrderedDict((k, p.graph) for k, p in self.paths.items() if p.graph is not None)

    @property
    def captured(self) -> bool:
        """Whether any call has been captured (False on the CPU, where steps always run eagerly)."""
        return any(p.graph is not None for p in self.paths.values())

    @property
    def early_exit(self) -> str | None:
        """How ``stop_when`` stops replays: "conditional" (CUDA IF nodes skip the remaining steps on the
        device), "pinned-flag" (the host reads a pinned copy of the flag), "eager" (CPU), or None."""
        if self.stop_when is None:
            return None
        if not torch.cuda.is_available():
            return "eager"
        conditional = conditional_nodes_available() if self._conditional is None else self._conditional
        return "conditional" if conditional else "pinned-flag"

    @property
    def stopped(self) -> bool:
        """Whether ``stop_when`` has fired, as far as the host knows now (no sync: a pinned copy that the
        GPU writes after each replay, so it may lag the device by the replays in flight)."""
        return self._go_host is not None and not bool(self._go_host.item())

    def resume(self) -> None:
        """Clear a ``stop_when`` stop: the next calls run steps again."""
        if self._go is not None:
            self._go.fill_(True)
            self._go_host.fill_(True)
        self._in_flight.clear()

    def reset(self) -> None:
        """Drop every captured graph: the next calls warm up and capture again."""
        self.paths.clear()
        self._warm.clear()

    # ---- a call --------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from ge2.amp.autocast_mode import clear_cache

        # Parameter casts cached by an autocast region around this call must not cross a graph's
        # boundary: the step makes its own (recorded into the graph), and code after it recasts.
        clear_cache()
        try:
            return self._call(args, kwargs)
        finally:
            clear_cache()

    def _bind(self, args: tuple, kwargs: dict) -> list[_Arg]:
        """Each argument with its name: the parameter's, ``args[i]`` for a *args entry, else its position."""
        if self._sig is None:
            if kwargs:
                raise TypeError("ge2.capture: this step's parameters cannot be inspected; pass its arguments by position")
            return [_Arg(str(i), a, i) for i, a in enumerate(args)]
        positional, var = self._positional
        out = []
        for i, a in enumerate(args):
            name = positional[i] if i < len(positional) else f"{var}[{i - len(positional)}]"
            out.append(_Arg(name, a, i))
        out.extend(_Arg(k, v, k) for k, v in kwargs.items())
        return out

    def _signature(self, items: list[_Arg]) -> tuple[tuple, tuple, tuple]:
        """(key part, non-static plain values, their names): tensors by shape/dtype/device/requires_grad,
        static arguments by value, other plain values by type only (their values are checked, not keyed)."""
        from ge2.autograd.tensor import Tensor

        sig, values, names = [], [], []
        for it in items:
            a = it.value
            t = a.data if isinstance(a, Tensor) else a
            label = it.where if isinstance(it.where, int) else repr(it.name)
            if isinstance(t, torch.Tensor):
                if self.repeat > 1 and (t.dim() == 0 or t.shape[0] != self.repeat):
                    raise ValueError(
                        f"ge2.capture(repeat={self.repeat}): argument {it.name!r} is the batch stack of "
                        f"{self.repeat} steps and needs a leading dim of {self.repeat}, got shape {list(t.shape)}")
                sig.append(("tensor", it.name, tuple(t.shape), t.dtype, t.device, isinstance(a, Tensor) and a.requires_grad))
            elif it.name in self.static_argnames:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"ge2.capture: static argument {it.name!r} must be hashable (it keys the "
                                    f"graph cache), got a {type(a).__name__}") from None
                sig.append(("static", it.name, type(a), a))
            elif isinstance(a, _PLAIN):
                sig.append(("value", it.name, type(a)))
                values.append(a)
                names.append(it.name)
            else:  # a tuple of tensors would be keyed by identity: every call a new signature, never captured
                raise TypeError(f"ge2.capture: argument {label} is a {type(a).__name__}; a captured step takes tensors "
                                f"(and plain numbers or strings) as separate arguments, e.g. step(x, y), or a hashable "
                                f"value declared static (static_argnames=({it.name!r},)) that selects the step's path")
        return tuple(sig), tuple(values), tuple(names)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        items = self._bind(args, kwargs)
        sig, values, names = self._signature(items)
        devices = {s[4] for s in sig if s[0] == "tensor"}
        if not devices:
            return self._steps(items, eager=True)  # no tensor input: nothing to capture
        cuda = all(d.type == "cuda" for d in devices)  # else the CPU / interpreter: the documented eager fallback
        if self.stop_when is not None:
            self._flags(next(iter(devices)))
            if self.stopped:
                return None  # stopped: no step runs until resume()
        vkey = _value_key(values)
        key = self._key(sig)
        path = self.paths.get(key)
        if path is not None:
            self.paths.move_to_end(key)
            if vkey in path.values:
                return self._replay(path.graph, items) if path.graph is not None else self._steps(items, eager=True)
            # non-static values this path has not seen: an eager call shows whether they launch the same
            # kernels (a call that makes new launch plans tells nothing: the next one with them decides)
            out, (launches, status) = self._recorded_eager(items, cuda, copies=True)
            if self._same_launches(path.launches, path.captured_values, launches, status, values, names,
                                   "the call its graph was captured with"):
                path.values.add(vkey)
            return out
        warm = self._warm.pop(key, None) or _Warm()
        if warm.calls < self.warmup:
            out, (launches, status) = self._recorded_eager(items, cuda, warm=warm, copies=True)
            new_shapes = _shapes(out)
            if warm.shapes is not None and new_shapes != warm.shapes:
                raise CaptureError(
                    f"ge2.capture: two calls with the same input signature returned outputs of different "
                    f"shapes ({warm.shapes} vs {new_shapes}); a data-dependent shape cannot be captured")
            warm.shapes = new_shapes
            # A key's first call creates state (.grad, optimizer state: a later call accumulates
            # where it assigned) and compiles ("new"): only later clean calls are compared.
            if status == "clean" and warm.calls >= 1:
                if warm.launches is None:
                    warm.launches, warm.ref_values = launches, values
                    warm.values.add(vkey)
                elif self._same_launches(warm.launches, warm.ref_values, launches, status, values, names,
                                         "an earlier warm-up call"):
                    warm.values.add(vkey)
            warm.calls += 1
            self._warm[self._key(sig)] = warm  # the modules it ran are known now
            return out
        if cuda:
            graph, (launches, status) = self._capture(items, warm)
            out = self._replay(graph, items)
        else:  # the CPU: the call a GPU would capture runs eagerly, and its launches become the path's
            graph = None
            out, (launches, status) = self._recorded_eager(items, cuda, copies=True)
        path = _Path(None, {vkey}, values, graph)
        if status == "clean":
            path.launches = launches
            if vkey in warm.values:
                # the same arguments as a clean warm-up call: the same launches, unless the step reads
                # Python state outside its arguments
                self._same_launches(warm.launches, warm.ref_values, launches, status, values, names,
                                    "an earlier warm-up call", kernels_only=True)
                path.values |= warm.values
        elif vkey in warm.values:  # new plans for the static buffers' alignment: the warm-up's launches
            path.launches, path.values = warm.launches, set(warm.values)
        if len(self.paths) >= self.max_graphs:
            self.paths.popitem(last=False)  # least recently used
        self.paths[key] = path
        return out

    def _same_launches(self, ref: tuple | None, ref_values: tuple, launches: tuple, status: str, values: tuple,
                       names: tuple, when: str, kernels_only: bool = False) -> bool:
        """Whether a clean call launched ``ref``'s kernels with ``ref``'s grids and scalars (kernels_only:
        kernels and grids); False where either is unknown; a difference raises CaptureError naming the
        non-static arguments whose values changed."""
        if ref is None or status != "clean":  # "new": a plan made for new arguments or a new alignment
            return False
        if kernels_only:
            ref, launches = tuple(r[:2] for r in ref), tuple(r[:2] for r in launches)
        if launches == ref:
            return True
        changed = [f"{n!r} (was {a!r}, now {b!r})" for n, a, b in zip(names, ref_values, values)
                   if _value_key((a,)) != _value_key((b,))]
        at = next((i for i, (p, q) in enumerate(zip(ref, launches)) if p != q), min(len(ref), len(launches)))
        diff = (f"launch {at}: {ref[at][0] if at < len(ref) else 'nothing'} vs "
                f"{launches[at][0] if at < len(launches) else 'nothing'}; {len(ref)} vs {len(launches)} launches")
        fn_name = getattr(self.fn, "__name__", "step")
        if changed:
            first = changed[0].split(" ")[0]
            raise CaptureError(
                f"ge2.capture: {fn_name}'s argument {', '.join(changed)} changes the kernels the step launches "
                f"(its path, or a scalar a kernel takes) compared with {when} ({diff}); a graph would replay "
                f"the other path. Declare it static, ge2.capture({fn_name}, static_argnames=({first},)), for one "
                f"graph per value (for an argument with many values, such as a step counter, pass a flag derived "
                f"from it instead, e.g. do_eval=(i % k == 0)). This call ran eagerly")
        raise CaptureError(
            f"ge2.capture: {fn_name} launched different kernels on two calls with the same arguments ({diff}): "
            f"its path depends on Python state outside its arguments (a counter in a closure, a global); "
            f"pass that state as an argument declared static (static_argnames=...)")

    def _key(self, sig: tuple) -> tuple:
        # model.train()/eval() changes what a step computes (dropout, batch-norm statistics): a graph
        # belongs to the modes of the modules it ran, and other modes get their own graph.
        return sig, tuple(m.training for m in self._modules.values())

    # ---- the steps of one call -----------------------------------------------------------------
    def _flags(self, device: torch.device) -> None:
        if self._go is None:
            self._conditional = device.type == "cuda" and conditional_nodes_available()
            self._go = torch.ones((), dtype=torch.bool, device=device)
            self._go_host = torch.ones((), dtype=torch.bool, pin_memory=device.type == "cuda") if device.type == "cuda" else self._go

    def _step_args(self, items: list[_Arg], i: int | None, static: list | None = None) -> tuple[list, dict]:
        """fn's (args, kwargs) for step ``i`` of the call (a row of each batch stack; i None: the whole tensors)."""
        from ge2.autograd.tensor import Tensor

        args, kwargs = [], {}
        for k, it in enumerate(items):
            a = it.value
            s = static[k] if static is not None else None
            if s is not None or (i is not None and isinstance(a.data if isinstance(a, Tensor) else a, torch.Tensor)):
                t = s if s is not None else (a.data if isinstance(a, Tensor) else a)
                t = t if i is None else t[i]
                a = Tensor(t, requires_grad=a.requires_grad) if isinstance(a, Tensor) else t
            if isinstance(it.where, int):
                args.append(a)
            else:
                kwargs[it.where] = a
        return args, kwargs

    def _steps(self, items: list[_Arg], *, eager: bool, static: list | None = None, template: Any = None,
               recorder: _Launches | None = None) -> Any:
        """Run the call's steps: fn once, or ``repeat`` times over the batch stacks with stacked outputs.
        eager=False: being captured (early exit through IF nodes or the device flag)."""
        def run(i: int | None) -> Any:
            args, kwargs = self._step_args(items, i, static)
            if recorder is None:
                return self.fn(*args, **kwargs)
            with launch.recording(recorder):  # only fn's launches: the flag bookkeeping is not the path
                return self.fn(*args, **kwargs)

        if self.repeat == 1 and self.stop_when is None:
            return run(None)
        conditional = not eager and self.stop_when is not None and self._conditional
        bufs = None if template is None else _alloc(template, self.repeat)
        for i in range(self.repeat):
            if eager and self.stopped:
                break  # the rows left are NaN: steps that did not run
            with _if_node(self._go) if conditional else contextlib.nullcontext():
                out = run(i if self.repeat > 1 else None)
                if bufs is None:
                    bufs = _alloc(_spec(out, "repeat/stop_when"), self.repeat)
                _write(bufs, out, i)
                if self.stop_when is not None:
                    self._update_flag(out, eager, conditional)
        if not eager and self.stop_when is not None:
            self._go_host.copy_(self._go, non_blocking=True)  # the host's view, written when the replay ends
        return bufs

    def _update_flag(self, out: Any, eager: bool, conditional: bool) -> None:
        import ge2
        from ge2.autograd.tensor import Tensor

        raw = self.stop_when(out)
        stop = raw if isinstance(raw, Tensor) else Tensor(raw) if isinstance(raw, torch.Tensor) else None
        if stop is None or stop.numel() != 1 or stop.data.dtype != torch.bool:
            got = type(raw).__name__ if stop is None else f"{stop.data.dtype} of shape {list(stop.shape)}"
            raise TypeError(f"ge2.capture: stop_when must return a one-element bool tensor (e.g. loss < 0.1), got {got}")
        with ge2.no_grad():
            if eager:
                if bool(stop.data.reshape(()).item()):  # an eager step may sync: warm-up and CPU only
                    self._go.fill_(False)
                    if self._go_host is not self._go:
                        self._go_host.fill_(False)
                return
            keep = ge2.logical_not(stop)
            if not conditional:  # every step runs: the flag remembers a stop seen by any of them
                keep = ge2.logical_and(keep, Tensor(self._go))
            self._go.copy_(keep.data.reshape(()))

    # ---- the three ways to run a call --------------------------------------------------------
    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def _recorded_eager(self, items: list[_Arg], cuda: bool, *, warm: _Warm | None = None,
                        copies: bool = False) -> tuple[Any, tuple[tuple, str]]:
        """An eager call and the kernels it launched. copies=True: on contiguous copies of the input tensors
        (fresh allocations, aligned as a graph's static buffers are: a new launch plan then means new arguments)."""
        static = self._static_buffers(items, fill=True) if copies else None
        recorder = _Launches()
        if cuda:
            out = self._eager(items, recorder, static)
        else:
            out = self._steps(items, eager=True, static=static, recorder=recorder)
        if warm is not None and (self.repeat > 1 or self.stop_when is not None) and out is not None:
            warm.template = _spec(out, "repeat/stop_when")
        return out, recorder.fingerprint()

    def _eager(self, items: list[_Arg], recorder: _Launches, static: list | None = None) -> Any:
        """An eager call: fn on a side stream (as torch's capture recipe does), recording optimizers."""
        stream = self._side_stream()
        stream.wait_stream(torch.cuda.current_stream())
        record = _Recording(capturing=False)
        try:
            with _recorded(record), torch.cuda.stream(stream):
                out = self._steps(items, eager=True, static=static, recorder=recorder)
        finally:
            self._optimizers.update(record.optimizers)
            self._modules.update(record.modules)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    @staticmethod
    def _static_buffers(items: list[_Arg], fill: bool) -> list[torch.Tensor | None]:
        """A contiguous buffer per tensor argument (None elsewhere), holding a copy of it if ``fill``."""
        from ge2.autograd.tensor import Tensor

        static = []
        for it in items:
            t = it.value.data if isinstance(it.value, Tensor) else it.value
            if isinstance(t, torch.Tensor):
                s = torch.empty_like(t, memory_format=torch.contiguous_format)
                static.append(s.copy_(t) if fill else s)
            else:
                static.append(None)
        return static

    def _capture(self, items: list[_Arg], warm: _Warm) -> tuple[_Graph, tuple[tuple, str]]:
        static = self._static_buffers(items, fill=False)
        for opt in self._optimizers.values():
            opt._sync_hyper()  # hyper-parameters set since the warm-up are written before, not inside
        template = None
        if warm.template is not None:  # one step's output structure, without the stacked dim
            template = _unstacked(warm.template)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        record = _Recording(capturing=True)
        recorder = _Launches()
        try:
            with _recorded(record), torch.cuda.graph(graph, stream=self._side_stream()):
                out = self._steps(items, eager=False, static=static, template=template, recorder=recorder)
        except CaptureError:
            raise
        except Exception as e:
            _reset_rng_capture_state(self._side_stream())
            raise CaptureError(
                f"ge2.capture: capturing {getattr(self.fn, '__name__', 'the step')} into a CUDA graph failed: "
                f"{type(e).__name__}: {e}. A captured step must not synchronise with the host (.item(), "
                f".numpy(), .cpu(), printing a tensor), create tensors from host data, or depend on "
                f"data-dependent shapes") from e
        self.captures += 1
        grads = [(leaf, leaf.grad.data if leaf.grad is not None else None) for leaf in record.leaves.values()]
        return _Graph(graph, static, out, grads, list(record.optimizers.values()), record.keep), recorder.fingerprint()

    def _replay(self, graph: _Graph, items: list[_Arg]) -> Any:
        from ge2.autograd.tensor import Tensor

        for it, s in zip(items, graph.static_inputs):
            if s is not None:
                s.copy_(it.value.data if isinstance(it.value, Tensor) else it.value)
        for opt in graph.optimizers:
            opt._sync_hyper()  # an lr changed by a scheduler since the last call reaches the graph
        for leaf, grad in graph.grads:
            if grad is None:
                leaf.grad = None
            elif leaf.grad is None or leaf.grad.data is not grad:
                leaf.grad = Tensor(grad)  # another graph or an eager step had replaced it
        if self.stop_when is not None and not self._conditional:
            # pinned-flag mode: at most MAX_IN_FLIGHT replays queued, so the host's view of the flag
            # lags the device by a bounded number of steps (see STOP_LATENCY)
            while len(self._in_flight) >= MAX_IN_FLIGHT:
                self._in_flight.popleft().synchronize()
            if self.stopped:
                return None
        graph.graph.replay()
        if self.stop_when is not None and not self._conditional:
            event = torch.cuda.Event()
            event.record()
            self._in_flight.append(event)
        self.replays += 1
        return graph.outputs

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return (f"CapturedStep({name}, paths={len(self.paths)}, captures={self.captures}, replays={self.replays}"
                f"{f', repeat={self.repeat}' if self.repeat > 1 else ''})")


# pinned-flag early exit (no conditional nodes): replays queued before the host waits for the oldest
MAX_IN_FLIGHT = 2


def _unstacked(spec: Any) -> Any:
    """A stacked output's structure -> one step's (drop the leading [repeat] dim)."""
    if spec is None:
        return None
    if spec[0] == "tensor":
        _, wrap, shape, dtype, device = spec
        return "tensor", wrap, shape[1:], dtype, device
    kind, items = spec
    if kind is dict:
        return dict, tuple((k, _unstacked(v)) for k, v in items)
    return kind, tuple(_unstacked(v) for v in items)


def capture(fn: Callable[..., Any] | None = None, *, warmup: int = 2, max_graphs: int = 8,
            static_argnames: tuple[str, ...] | str = (), repeat: int = 1, stop_when: Callable[[Any], Any] | None = None):
    """Wrap a whole training step ``fn(*batch) -> outputs`` so it replays from CUDA graphs.

    The first ``warmup`` calls per path run eagerly (as real steps), the next one captures; up to
    ``max_graphs`` paths keep a graph (least recently used evicted). A path is the input tensors'
    shapes/dtypes, the values of ``static_argnames`` and the modules' modes. ``repeat=n``: each call
    runs n steps over batch stacks [n, ...] (outputs stacked [n, ...]) from one graph launch.
    ``stop_when(outputs) -> bool tensor``: steps stop once it is true, without a host sync. Also a
    decorator: ``@ge2.capture`` or ``@ge2.capture(warmup=3, static_argnames=("phase",))``.
    """
    def make(f):
        return CapturedStep(f, warmup=warmup, max_graphs=max_graphs, static_argnames=static_argnames,
                            repeat=repeat, stop_when=stop_when)
    return make if fn is None else make(fn)
