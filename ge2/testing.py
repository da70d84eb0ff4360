"""Test tooling: prove that torch only moves memory while ge2 computes.

``torch_op_guard()`` records every aten op torch dispatches inside the block (a
``TorchDispatchMode``) and raises if any is outside ``MEMORY_OPS``: allocation, views, copies,
fills and the RNG fills of initialisers. ge2's Triton kernels never go through torch's dispatcher,
so any arithmetic torch did would show up here.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MEMORY_OPS = frozenset({
    # allocation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor",
    "arange", "lift_fresh", "lift_fresh_copy",
    # views and metadata
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "permute",
    "transpose", "t", "unsqueeze", "squeeze", "select", "slice", "narrow", "alias", "detach",
    "split", "split_with_sizes", "unbind", "chunk", "unfold", "diagonal", "view_as", "expand_as",
    "numpy_T", "movedim", "_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type",
    "promote_types", "result_type",  # dtype computations on metadata, not on data
    # copies and fills
    "copy_", "_to_copy", "clone", "contiguous", "_copy_from", "_copy_from_and_resize", "fill_",
    "zero_", "set_", "resize_", "to",
    # RNG fills (initialisation)
    "normal_", "uniform_", "random_", "bernoulli_", "randn", "rand", "randint", "randperm",
})


# torch.distributed's collectives as the dispatcher names them (c10d::allreduce_, ...): data movement
# between ranks done by NCCL/gloo. DistributedDataParallel's step issues allreduce_ (and broadcast_
# of buffers); allowed with torch_op_guard(MEMORY_OPS | COLLECTIVE_OPS).
COLLECTIVE_OPS = frozenset({"allreduce", "allreduce_coalesced", "broadcast", "allgather", "reduce_scatter", "barrier"})


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._schema.name.split("::")[-1]] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def record_torch_ops() -> Iterator[Counter]:
    """Count every aten op (by name, e.g. "add") torch executes inside the block."""
    rec = _Recorder()
    with rec:
        yield rec.ops


@contextlib.contextmanager
def torch_op_guard(allowed: frozenset[str] = MEMORY_OPS) -> Iterator[Counter]:
    """Fail if torch executes any aten op outside ``allowed`` inside the block."""
    with record_torch_ops() as ops:
        yield ops
    bad = {name: n for name, n in ops.items() if name.rstrip("_") not in allowed and name not in allowed}
    if bad:
        raise AssertionError(f"torch did arithmetic in the ge2 path: {dict(sorted(bad.items()))}")
