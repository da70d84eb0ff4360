"""Whole-step CUDA graphs: capture a training step once per input signature, then replay it.

A small model's step is bound by Python launching kernels, not by the GPU. ``ge2.capture(fn)``
returns a ``CapturedStep``: its first ``warmup`` calls for an input signature (shapes, dtypes,
devices, non-tensor arguments) run ``fn`` eagerly on a side stream, as real steps on the real
batches, which compiles and autotunes every kernel and creates the optimizer state; the next call
captures ``fn`` into a ``torch.cuda.CUDAGraph`` (its own memory pool, static input buffers) and
replays it, and later calls only copy the batch in and replay. One step then costs one graph
launch. What a step mutates lives on the device and advances on every replay: parameters and
optimizer state (updated in place, so eager code sees them), the optimizer's step count and
hyper-parameters (``lr`` set by a scheduler between calls is written into the device tensor before
each replay), dropout's [seed, offset] state, batch-norm running statistics.

Outputs are static: a replay overwrites the tensors the previous replay returned (clone to keep).
Capture-unsafe work (a host sync such as ``.item()``, ``.numpy()``, printing a tensor, a
data-dependent shape, a kernel meeting a shape for the first time, a scheduler stepped inside the
step) raises ``CaptureError`` at capture time. On the CPU (Triton interpreter) there are no CUDA
graphs: a ``CapturedStep`` runs ``fn`` eagerly and says so in ``captured``.
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


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
    """One captured signature: the graph, its static inputs and outputs, and the .grad it leaves."""

    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor | None]
    outputs: Any
    grads: list[tuple[Any, torch.Tensor | None]]  # (leaf, the buffer its .grad is after a replay)
    optimizers: list[Any]
    keep: list[Any]


def _signature(args: tuple) -> tuple:
    from ge2.autograd.tensor import Tensor

    sig = []
    for i, a in enumerate(args):
        t = a.data if isinstance(a, Tensor) else a
        if isinstance(t, torch.Tensor):
            sig.append(("tensor", tuple(t.shape), t.dtype, t.device, isinstance(a, Tensor) and a.requires_grad))
        elif a is None or isinstance(a, (bool, int, float, str)):
            sig.append(("value", type(a), a))
        else:  # a tuple of tensors would be keyed by identity: every call a new signature, never captured
            raise TypeError(f"ge2.capture: argument {i} is a {type(a).__name__}; a captured step takes tensors "
                            f"(and plain numbers or strings) as separate arguments, e.g. step(x, y)")
    return tuple(sig)


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


class CapturedStep:
    """``fn`` captured into one CUDA graph per input signature (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, warmup: int = 2, max_graphs: int = 8):
        if not callable(fn):
            raise TypeError(f"ge2.capture: fn must be callable, got {type(fn).__name__}")
        if warmup < 1:
            raise ValueError(f"ge2.capture: warmup must be >= 1 (kernels must be compiled and tuned "
                             f"before capture), got {warmup}")
        if max_graphs < 1:
            raise ValueError(f"ge2.capture: max_graphs must be >= 1, got {max_graphs}")
        self.fn, self.warmup, self.max_graphs = fn, warmup, max_graphs
        self.graphs: collections.OrderedDict[tuple, _Graph] = collections.OrderedDict()
        self._warm: dict[tuple, tuple[int, Any]] = {}  # signature -> (eager calls so far, output shapes)
        self.captures = 0  # graphs recorded so far (a re-capture after eviction counts again)
        self.replays = 0
        self._stream: torch.cuda.Stream | None = None
        self._optimizers: dict[int, Any] = {}  # every optimizer a call of fn has stepped
        self._modules: dict[int, Any] = {}  # every module a call of fn has run (their modes key the graphs)

    @property
    def captured(self) -> bool:
        """Whether any call has been captured (False on the CPU, where steps always run eagerly)."""
        return bool(self.graphs)

    def reset(self) -> None:
        """Drop every captured graph: the next calls warm up and capture again."""
        self.graphs.clear()
        self._warm.clear()

    def __call__(self, *args: Any) -> Any:
        from ge2.amp.autocast_mode import clear_cache

        # Parameter casts cached by an autocast region around this call must not cross a graph's
        # boundary: the step makes its own (recorded into the graph), and code after it recasts.
        clear_cache()
        try:
            return self._call(args)
        finally:
            clear_cache()

    def _call(self, args: tuple) -> Any:
        sig = _signature(args)
        devices = {s[3] for s in sig if s[0] == "tensor"}
        if not devices or any(d.type != "cuda" for d in devices):
            return self.fn(*args)  # CPU / interpreter, or no tensor input: documented eager fallback
        key = self._key(sig)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            return self._replay(graph, args)
        calls, shapes = self._warm.pop(key, (0, None))
        if calls < self.warmup:
            out = self._eager(args)
            new_shapes = _shapes(out)
            if shapes is not None and new_shapes != shapes:
                raise CaptureError(
                    f"ge2.capture: two calls with the same input signature returned outputs of different "
                    f"shapes ({shapes} vs {new_shapes}); a data-dependent shape cannot be captured")
            self._warm[self._key(sig)] = (calls + 1, new_shapes)  # the modules it ran are known now
            return out
        graph = self._capture(args)
        if len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)  # least recently used
        self.graphs[key] = graph
        return self._replay(graph, args)

    def _key(self, sig: tuple) -> tuple:
        # model.train()/eval() changes what a step computes (dropout, batch-norm statistics): a graph
        # belongs to the modes of the modules it ran, and other modes get their own graph.
        return sig, tuple(m.training for m in self._modules.values())

    # ---- the three ways to run a call --------------------------------------------------------
    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def _eager(self, args: tuple) -> Any:
        """A warm-up call: fn on a side stream (as torch's capture recipe does), recording optimizers."""
        stream = self._side_stream()
        stream.wait_stream(torch.cuda.current_stream())
        record = _Recording(capturing=False)
        try:
            with _recorded(record), torch.cuda.stream(stream):
                out = self.fn(*args)
        finally:
            self._optimizers.update(record.optimizers)
            self._modules.update(record.modules)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def _capture(self, args: tuple) -> _Graph:
        from ge2.autograd.tensor import Tensor

        static = []
        for a in args:
            t = a.data if isinstance(a, Tensor) else a
            static.append(torch.empty_like(t, memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else None)
        call_args = tuple(
            (Tensor(s, requires_grad=a.requires_grad) if isinstance(a, Tensor) else s) if s is not None else a
            for a, s in zip(args, static))
        for opt in self._optimizers.values():
            opt._sync_hyper()  # hyper-parameters set since the warm-up are written before, not inside
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        record = _Recording(capturing=True)
        try:
            with _recorded(record), torch.cuda.graph(graph, stream=self._side_stream()):
                out = self.fn(*call_args)
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
        return _Graph(graph, static, out, grads, list(record.optimizers.values()), record.keep)

    def _replay(self, graph: _Graph, args: tuple) -> Any:
        from ge2.autograd.tensor import Tensor

        for a, s in zip(args, graph.static_inputs):
            if s is not None:
                s.copy_(a.data if isinstance(a, Tensor) else a)
        for opt in graph.optimizers:
            opt._sync_hyper()  # an lr changed by a scheduler since the last call reaches the graph
        for leaf, grad in graph.grads:
            if grad is None:
                leaf.grad = None
            elif leaf.grad is None or leaf.grad.data is not grad:
                leaf.grad = Tensor(grad)  # another graph or an eager step had replaced it
        graph.graph.replay()
        self.replays += 1
        return graph.outputs

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return f"CapturedStep({name}, graphs={len(self.graphs)}, captures={self.captures}, replays={self.replays})"


def capture(fn: Callable[..., Any] | None = None, *, warmup: int = 2, max_graphs: int = 8):
    """Wrap a whole training step ``fn(*batch) -> outputs`` so it replays from a CUDA graph.

    The first ``warmup`` calls per input signature run eagerly (as real steps), the next one
    captures; up to ``max_graphs`` signatures keep a graph (least recently used evicted). Also a
    decorator: ``@ge2.capture`` or ``@ge2.capture(warmup=3)``.
    """
    if fn is None:
        return lambda f: CapturedStep(f, warmup=warmup, max_graphs=max_graphs)
    return CapturedStep(fn, warmup=warmup, max_graphs=max_graphs)
