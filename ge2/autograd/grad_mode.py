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


class _GradMode(contextlib.ContextDecorator):
    mode = True

    def __enter__(self) -> None:
        # A stack, not one saved value: a decorated function may recurse into itself.
        self.__dict__.setdefault("_saved", []).append(is_grad_enabled())
        _set(self.mode)

    def __exit__(self, *exc) -> None:
        _set(self._saved.pop())


class no_grad(_GradMode):
    """Context manager / decorator: ops inside record nothing and their results need no grad."""

    mode = False


class enable_grad(_GradMode):
    """Context manager / decorator: re-enable recording inside a ``no_grad`` region."""

    mode = True


class set_grad_enabled(_GradMode):
    """Enable or disable recording now (a plain call), or for a block (context manager / decorator)."""

    def __init__(self, mode: bool):
        self.mode = bool(mode)
        self._before_call = is_grad_enabled()
        _set(self.mode)

    def __enter__(self) -> None:
        # `with set_grad_enabled(m):` must restore what was there before the call, not after it.
        prev = self.__dict__.pop("_before_call", None)
        self.__dict__.setdefault("_saved", []).append(is_grad_enabled() if prev is None else prev)
        _set(self.mode)
