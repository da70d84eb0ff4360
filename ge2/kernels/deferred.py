"""Bad-input counts that kernels leave on the device, raised without a host sync.

A kernel that finds out-of-range class targets or indices counts them into a device tensor. On the
CPU (or when the caller asks) the count is read at once; on the GPU it is copied to pinned memory
behind an event and raised by a later call that finds the copy landed (``raise_pending``), so the
launching call never waits for the GPU; inside a CUDA-graph capture it is not checked at all.
Cross-entropy's targets and the indexing ops each keep one ``DeferredCounts``.
"""
from __future__ import annotations

import collections
from typing import Callable

import torch

from ge2.kernels import launch


class DeferredCounts:
    """A queue of device counts [1] waiting to be raised as ValueError(message(n) + note)."""

    def __init__(self, note: str):
        self.note = note  # appended to a message raised by a later call than the one that launched
        self._pending: collections.deque = collections.deque()  # (message, pinned count, event), oldest first
        self._pinned: list[torch.Tensor] = []  # reusable pinned buffers

    def report(self, count: torch.Tensor, message: Callable[[int], str], check: bool | None) -> None:
        """Raise ValueError(message(n)) if the count n is non-zero: now (a CPU tensor, or check=True),
        deferred (a GPU tensor, check=None), never (check=False, or a CUDA graph being captured)."""
        if check is False:
            return
        now = bool(check) or not count.is_cuda
        # host work (a read, or a pinned copy, an event and a queue entry): a call plan keeps it as a
        # host step and runs it again on each replay's count
        launch.host_step(lambda c: self._check(c, message, now), count)

    def _check(self, count: torch.Tensor, message: Callable[[int], str], now: bool) -> None:
        """Raise now, or copy the count to pinned memory behind an event to be raised once it has landed."""
        if count.is_cuda and torch.cuda.is_current_stream_capturing():  # not checked inside a capture
            return
        if now:
            n_bad = int(count.item())
            if n_bad:
                raise ValueError(message(n_bad))
            return
        try:  # earlier calls' counts that have landed first (a replayed call runs only its host steps) ...
            self.raise_pending(wait=False)
        finally:  # ... and this call's count queued even when one of them raises
            host = next((h for h in self._pinned if h.dtype == count.dtype), None)
            if host is None:
                host = torch.empty(1, dtype=count.dtype, pin_memory=True)
            else:
                self._pinned.remove(host)
            host.copy_(count.reshape(1), non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending.append((message, host, done))

    def raise_pending(self, wait: bool = True) -> None:
        """Raise the first non-zero pending count (waiting for the copies if ``wait``)."""
        while self._pending:
            message, host, done = self._pending[0]
            if not wait and not done.query():
                return
            done.synchronize()
            self._pending.popleft()
            n_bad = int(host.item())
            self._pinned.append(host)
            if n_bad:
                raise ValueError(message(n_bad) + self.note)
