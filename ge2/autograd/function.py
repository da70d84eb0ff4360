"""``Function``: an op's forward and backward side by side; ``apply`` records a ``Node``.

Forward and backward take and return torch tensors (ge2 Tensors arrive unwrapped) and do their
math through ``ge2.backend.call``. The engine (``engine.py``) replays Nodes in reverse.
"""
from __future__ import annotations

from typing import Any

import torch

from ge2.autograd import grad_mode


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns ``t``'s memory (``t`` itself unless it is a view)."""
    return t._base if t._base is not None else t


class Version:
    """A counter shared by a tensor and its views, bumped by every in-place write."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class Context:
    """What forward leaves for backward: saved tensors (version-checked) and any attributes."""

    # defaults on the class: a context is made per op call, most never save or mark anything
    _saved: tuple[torch.Tensor, ...] | None = ()
    _versions: tuple = ()
    _non_differentiable: frozenset[int] = frozenset()
    _released = False
    _node_name = ""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        """Keep ``tensors`` for backward; modifying one in place before backward makes backward raise."""
        self._saved = tensors

    def mark_non_differentiable(self, *outputs: torch.Tensor) -> None:
        """These forward outputs get no gradient (e.g. argmax indices)."""
        self._non_differentiable = self._non_differentiable | {id(o) for o in outputs}

    @property
    def saved_tensors(self) -> tuple[torch.Tensor, ...]:
        if self._released:
            raise RuntimeError(
                f"{self._node_name}: trying to backward through the graph a second time (or to read "
                "saved tensors after they were freed). Pass retain_graph=True to the first backward "
                "if you need to backward twice."
            )
        for i, entry in enumerate(self._versions):
            if entry is not None and entry[0].value != entry[1]:
                raise RuntimeError(
                    f"{self._node_name}: one of the tensors needed for gradient computation (saved "
                    f"tensor {i}) has been modified by an in-place operation: it is at version "
                    f"{entry[0].value}, expected version {entry[1]}."
                )
        return self._saved  # type: ignore[return-value]

    def _track_versions(self, tensors: list[Any]) -> None:
        # Saved tensors that are inputs or outputs of the op (or views of them, e.g. x.reshape)
        # can be modified later through their ge2 Tensor; remember the version they had when saved.
        by_root = {id(_root(t.data)): t for t in tensors}
        self._versions = []
        for s in self._saved or ():
            owner = by_root.get(id(_root(s))) if s is not None else None
            self._versions.append((owner._version_counter, owner._version_counter.value) if owner is not None else None)

    def _release(self) -> None:
        self._saved = None
        self._released = True


class Node:
    """One recorded op: its backward, its context and the edges to the producers of its inputs.

    ``edges[i]`` is None (input i needs no grad), ``(leaf_tensor, 0)`` or ``(node, output_index)``.
    """

    __slots__ = ("fn", "ctx", "edges", "input_meta", "n_outputs", "retained", "__weakref__")

    def __init__(self, fn: type, ctx: Context, edges: list, input_meta: list, n_outputs: int):
        self.fn = fn
        self.ctx = ctx
        self.edges = edges
        self.input_meta = input_meta  # (shape, dtype) of each input that needs grad, for checks
        self.n_outputs = n_outputs
        self.retained: dict[int, Any] | None = None  # output index -> weakref of a retain_grad tensor

    @property
    def name(self) -> str:
        return self.fn.__name__ + "Backward"

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Function:
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call ``apply``."""

    @staticmethod
    def forward(ctx: Context, *args: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, *grads: Any) -> Any:
        raise NotImplementedError

    # apply(*args): run forward on the inputs (Tensors unwrapped) and wrap its outputs, recording a
    # Node when an input requires grad and grad mode is on. Set below: ge2_native's ``apply`` (the
    # path without recording in C) or ``_python_apply``.
    apply: Any


def _python_apply(cls: type, *args: Any) -> Any:
    """Function.apply in Python: forward on the raw inputs, then the outputs wrapped (and a Node recorded)."""
    raw, needs, inputs = [], [], []
    for a in args:
        if isinstance(a, _Tensor):
            raw.append(a.data)
            needs.append(a._requires_grad)
            inputs.append(a)
        else:
            raw.append(a)
            needs.append(False)
    needs = tuple(needs)
    record = True in needs and grad_mode.is_grad_enabled()
    # Nothing recorded (no_grad, or no input needs a gradient): the forward is told so, and skips
    # what only a backward would use (saved tensors, gradients computed alongside the output).
    ctx = Context(needs if record else (False,) * len(needs))
    out = cls.forward(ctx, *raw)
    if not record:
        if isinstance(out, torch.Tensor):
            return _wrap(out, inputs)
        return tuple([_wrap(o, inputs) for o in out])
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    node = Node(
        cls,
        ctx,
        [a._edge() if need else None for a, need in zip(args, needs)],
        [(a.shape, a.dtype) if need else None for a, need in zip(args, needs)],
        len(outs),
    )
    ctx._node_name = node.name
    results = tuple(
        _Tensor._from_op(o, inputs, None if id(o) in ctx._non_differentiable else node, i)
        for i, o in enumerate(outs)
    )
    ctx._track_versions(inputs + list(results))
    return results[0] if isinstance(out, torch.Tensor) else results


from ge2.autograd.tensor import Tensor as _Tensor, _wrap  # noqa: E402 (tensor.py imports this module first)
from ge2.kernels import native as _native  # noqa: E402

Function.apply = classmethod(_native.function_apply(_Tensor, Context, Version, grad_mode._state, _python_apply)
                             or _python_apply)
