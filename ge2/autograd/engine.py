"""The backward engine: walk the recorded Nodes in reverse topological order, iteratively.

Dependencies are counted first (how many edges point at each node), then nodes run once all
their consumers have delivered gradients (Kahn's algorithm), so a tensor used several times gets
the sum of its gradients and a 10,000-op chain needs no recursion. A leaf is counted too: its
gradients are summed and accumulated into ``.grad`` once per backward, when its last consumer has
run (torch's AccumulateGrad), and then its post-accumulate-grad hooks run
(``Tensor.register_post_accumulate_grad_hook``; DistributedDataParallel starts a bucket's
all-reduce from one). ``queue_callback(fn)`` called during a backward runs ``fn()`` once that
backward has finished.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from ge2 import backend, graphs
from ge2.autograd.function import Node
from ge2.autograd.grad_mode import no_grad

if TYPE_CHECKING:
    from ge2.autograd.tensor import Tensor


_callbacks: list | None = None  # the running backward's queue_callback list (None outside a backward)


def queue_callback(fn: Callable[[], None]) -> None:
    """Run ``fn()`` when the backward now running has delivered every gradient (torch's
    ``Variable._execution_engine.queue_callback``); callable only from inside a backward (a hook)."""
    if _callbacks is None:
        raise RuntimeError("queue_callback: no backward is running (call it from a gradient hook)")
    _callbacks.append(fn)


def _accumulate(tensor: "Tensor", grad: torch.Tensor, owned: set[int]) -> None:
    """tensor.grad += grad, never letting two .grad buffers alias one another or a view."""
    from ge2.autograd.tensor import Tensor

    if tensor.grad is None:
        # torch's layout for .grad: the leaf's own strides where it is dense (a channels-last input
        # gets a channels-last grad, and later accumulations run over one flat dim), else row-major.
        leaf = tensor.data
        laid_out = grad.is_contiguous() if leaf.is_contiguous() else grad.stride() == torch.empty_like(leaf).stride()
        if id(grad) in owned or grad._base is not None or not laid_out:
            grad = torch.empty_like(leaf, dtype=grad.dtype).copy_(grad)
        owned.add(id(grad))
        tensor.grad = Tensor(grad)
    elif graphs.is_capturing():
        # A captured graph must accumulate into the buffer it read, so that every replay adds to it.
        tensor.grad.data.copy_(backend.call("add", tensor.grad.data, grad))
    else:
        tensor.grad.data = backend.call("add", tensor.grad.data, grad)
    graphs.note_grad(tensor)
    hooks = getattr(tensor, "_post_accumulate_grad_hooks", None)  # the slot is unset on most tensors
    if hooks:
        for hook in tuple(hooks.values()):
            hook(tensor)


def _add(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else backend.call("add", a, b)


def run_backward(root: "Tensor", gradient: torch.Tensor, retain_graph: bool) -> None:
    """Propagate ``gradient`` (d loss / d root) to every leaf that requires grad, then run the
    callbacks queued during it."""
    global _callbacks
    outer, _callbacks = _callbacks, []
    try:
        _propagate(root, gradient, retain_graph)
        queued = _callbacks
    finally:
        _callbacks = outer
    with no_grad():
        for fn in queued:
            fn()


def _propagate(root: "Tensor", gradient: torch.Tensor, retain_graph: bool) -> None:
    owned: set[int] = {id(gradient)}
    with no_grad():
        if root.grad_fn is None:
            _accumulate(root, gradient, owned)
            return
        deps: dict[Node, int] = {}
        leaf_deps: dict[int, int] = {}  # id(leaf) -> edges still to deliver into it
        leaf_grads: dict[int, torch.Tensor] = {}
        stack = [root.grad_fn]
        seen = {root.grad_fn}
        while stack:
            node = stack.pop()
            for edge in node.edges:
                if edge is None:
                    continue
                nxt = edge[0]
                if isinstance(nxt, Node):
                    deps[nxt] = deps.get(nxt, 0) + 1
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
                else:
                    leaf_deps[id(nxt)] = leaf_deps.get(id(nxt), 0) + 1

        buffers: dict[Node, list] = {root.grad_fn: [None] * root.grad_fn.n_outputs}
        buffers[root.grad_fn][root._out_idx] = gradient
        ready = [root.grad_fn]
        while ready:
            node = ready.pop()
            grads_out = buffers.pop(node)
            if node.retained:
                for i, ref in node.retained.items():
                    t = ref()
                    if t is not None and grads_out[i] is not None:
                        _accumulate(t, grads_out[i], owned)
            if all(g is None for g in grads_out):
                grads_in = (None,) * len(node.edges)
            else:
                grads_in = node.fn.backward(node.ctx, *grads_out)
                if not isinstance(grads_in, tuple):
                    grads_in = (grads_in,)
                if len(grads_in) != len(node.edges):
                    raise RuntimeError(
                        f"{node.name} returned {len(grads_in)} gradients, expected {len(node.edges)}"
                    )
            if not retain_graph:
                node.ctx._release()
            for i, (edge, g) in enumerate(zip(node.edges, grads_in)):
                if edge is None:
                    continue
                if g is not None:
                    shape, dtype = node.input_meta[i]
                    if tuple(g.shape) != tuple(shape):
                        raise RuntimeError(
                            f"{node.name} returned a gradient of shape {list(g.shape)} for input {i} "
                            f"of shape {list(shape)}"
                        )
                    if g.dtype != dtype:
                        g = g.to(dtype)
                target, idx = edge
                if isinstance(target, Node):
                    buf = buffers.setdefault(target, [None] * target.n_outputs)
                    if g is not None:
                        buf[idx] = _add(buf[idx], g)
                    deps[target] -= 1
                    if deps[target] == 0:
                        ready.append(target)
                else:
                    key = id(target)
                    if g is not None:
                        leaf_grads[key] = _add(leaf_grads.get(key), g)
                    leaf_deps[key] -= 1
                    if leaf_deps[key] == 0 and key in leaf_grads:
                        _accumulate(target, leaf_grads.pop(key), owned)
