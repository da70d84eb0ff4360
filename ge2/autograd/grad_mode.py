"""Whether ops record the graph: ``no_grad``, ``enable_grad``, ``set_grad_enabled`` (thread-local)."""
from __future__ import annotations

import contextlib
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    """True when ops on tensors that require grad record nodes for backward."""
    return getattr(_state, "enabled", True)


def _set(enabled: bool) -> None:
    _state.enabled = enabled


class set_grad_enabled(contextlib.ContextDecorator):
    """Enable or disable graph recording: a function call, a context manager or a decorator."""

    def __init__(self, mode: bool):
        self._prev = is_grad_enabled()
        self._mode = bool(mode)
        _set(self._mode)

    def __enter__(self) -> None:
        _set(self._mode)

    def __exit__(self, *exc) -> None:
        _set(self._prev)


class no_grad(contextlib.ContextDecorator):
    """Context manager / decorator: ops inside record nothing and their results need no grad."""

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        _set(False)

    def __exit__(self, *exc) -> None:
        _set(self._prev)


class enable_grad(contextlib.ContextDecorator):
    """Context manager / decorator: re-enable recording inside a ``no_grad`` region."""

    def __enter__(self) -> None:
        self._prev = is_grad_enabled()
        _set(True)

    def __exit__(self, *exc) -> None:
        _set(self._prev)
