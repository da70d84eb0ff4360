"""The product path does no torch arithmetic: record every aten op of a forward + backward."""
from __future__ import annotations

import pytest

import ge2
from ge2.testing import torch_op_guard
from numerics import randn


def composite_step(x, w, b):
    h = (x @ w + b).tanh() * 0.5 + (x @ w).relu()
    loss = (h * h).mean() + h.amax(1).sum() - (h.exp() / (h.abs() + 1.0)).log().mean()
    loss = loss + ge2.cat([h, h.T.reshape(h.shape)], 0).sigmoid().sqrt().sum() / 7
    loss.backward()
    return loss


def test_forward_backward_issues_only_memory_ops():
    x = ge2.from_torch(randn(6, 5))
    w = ge2.from_torch(randn(5, 6), requires_grad=True)
    b = ge2.from_torch(randn(6), requires_grad=True)
    with torch_op_guard() as ops:
        composite_step(x, w, b)
    assert w.grad is not None and b.grad is not None
    assert sum(ops.values()) > 0  # the recorder saw the allocations


def test_guard_catches_torch_arithmetic():
    # The same step on the torch oracle backend must trip the guard: the check can fail.
    x = ge2.from_torch(randn(6, 5))
    w = ge2.from_torch(randn(5, 6), requires_grad=True)
    b = ge2.from_torch(randn(6), requires_grad=True)
    with ge2.use_backend("torch"):
        with pytest.raises(AssertionError, match="torch did arithmetic"):
            with torch_op_guard():
                composite_step(x, w, b)
