"""``DistributedDataParallel``: data parallelism over torch.distributed, with torch's behaviour.

Each rank holds a replica of the module and trains on its own share of the batch. At wrap time the
parameter and buffer shapes are compared across ranks (a mismatch raises on every rank, naming the
tensor) and rank 0's values are broadcast. The gradients of the parameters (in reverse registration
order, the order backward produces them) are packed into flat buckets of about ``bucket_cap_mb``
(the first one 1 MiB, so communication starts early, as torch does). A post-accumulate-grad hook on
each parameter copies its gradient into its slot of the bucket; when a bucket's last gradient is in,
its all-reduce is launched asynchronously, so communication overlaps the rest of backward. When the
backward ends (an engine callback) every all-reduce is waited for and the buckets hold the mean over
ranks: NCCL averages itself (``ReduceOp.AVG``); gloo has no AVG, so it sums and a ge2 kernel
multiplies each bucket by 1/world. With ``gradient_as_bucket_view`` each parameter's ``.grad`` is a
view into its bucket, so the optimizer reads the reduced gradients in place.

Buckets are launched in bucket order (a bucket ready early waits for the ones before it), so every
rank issues the same collectives in the same order. The bucket assignment is fixed at wrap time
(torch re-buckets after the first iteration by the observed order; ge2's engine produces gradients
in a fixed order, which reverse registration order usually matches).

Inside ``ge2.capture`` the hooks, the collectives and the waits are recorded into the step's CUDA
graph (NCCL supports capture; the communicator is created at wrap time and used in the warm-up
steps). The locally-unused bitmap of ``find_unused_parameters`` needs a host read, so a captured
step gives every parameter its bucket view (zeros where no rank used it) instead.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

from ge2 import backend, graphs
from ge2.autograd import engine
from ge2.autograd.function import Node
from ge2.autograd.grad_mode import is_grad_enabled, no_grad
from ge2.autograd.tensor import Tensor
from ge2.nn.module import Module

FIRST_BUCKET_BYTES = 1 << 20


class _Bucket:
    """A flat gradient buffer and the parameters (by index) whose gradients are views into it."""

    def __init__(self, indices: list[int], params: list[Tensor]):
        self.indices = indices
        first = params[indices[0]].data
        self.buffer = torch.zeros(sum(params[i].data.numel() for i in indices), dtype=first.dtype, device=first.device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for i in indices:
            n = params[i].data.numel()
            self.views.append(self.buffer[offset:offset + n].view(params[i].data.shape))
            offset += n
        self.pending = len(indices)
        self.work = None


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training across the ranks of the process group (see module doc).

    ``forward``/``state_dict``/``train``/``eval`` pass through to ``self.module`` (the state dict keys get
    torch's "module." prefix; save ``ddp.module.state_dict()`` for a checkpoint any world size loads).
    """

    def __init__(self, module: Module, device_ids: list | None = None, output_device: Any = None,
                 broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: float = 25,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = True):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be a ge2.nn.Module, got {type(module).__name__}")
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("DistributedDataParallel: no process group; call ge2.distributed.init_process_group() "
                               "first (or start the ranks with torchrun / ge2 train --nproc)")
        if not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb = bucket_cap_mb
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._nccl = dist.get_backend(process_group) == "nccl"
        self._check_shapes()
        self._sync_module_states()
        self._buckets, self._where = self._make_buckets(bucket_cap_mb * 2**20)
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self._params)]
        self._require_sync = True
        self._expect_hooks = False
        self._unused: list[int] = []

    # ---- wrap time -----------------------------------------------------------------------------
    def _check_shapes(self) -> None:
        """Compare every rank's parameter and buffer signatures; raise the same error on every rank."""
        mine = [("parameter", n, list(p.shape), str(p.dtype)) for n, p in zip(self._names, self._params)]
        mine += [("buffer", n, list(b.shape), str(b.dtype)) for n, b in self.module.named_buffers()]
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, mine, group=self.process_group)
        for r, theirs in enumerate(every):
            if theirs == every[0]:
                continue
            if len(theirs) != len(every[0]):
                raise ValueError(f"DistributedDataParallel: rank {r} has {len(theirs)} parameters and buffers, rank 0 "
                                 f"has {len(every[0])}: every rank must build the same model")
            for a, b in zip(every[0], theirs):
                if a != b:
                    raise ValueError(f"DistributedDataParallel: {a[0]} {a[1]!r} has shape {a[2]} ({a[3]}) on rank 0 "
                                     f"but {b[0]} {b[1]!r} has shape {b[2]} ({b[3]}) on rank {r}: every rank must "
                                     "build the same model")

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.numel() == 0:
                continue
            if t.is_contiguous():
                dist.broadcast(t, src=0, group=self.process_group)
            else:
                packed = t.contiguous()
                dist.broadcast(packed, src=0, group=self.process_group)
                t.copy_(packed)

    def _sync_module_states(self) -> None:
        """Every rank starts from rank 0's parameters and buffers."""
        if self.world_size > 1:
            self._broadcast([p.data for p in self.module.parameters()] + [b.data for b in self.module.buffers()])

    def _make_buckets(self, cap_bytes: float) -> tuple[list[_Bucket], list[tuple[int, int]]]:
        """Buckets over the parameters in reverse registration order, one dtype and device per bucket."""
        open_: dict[tuple, list[int]] = {}  # (dtype, device) -> the bucket being filled
        filled: dict[tuple, float] = {}
        closed: dict[tuple, int] = {}
        lists: list[list[int]] = []
        for i in reversed(range(len(self._params))):
            t = self._params[i].data
            key = (t.dtype, t.device)
            open_.setdefault(key, []).append(i)
            filled[key] = filled.get(key, 0) + t.numel() * t.element_size()
            limit = min(FIRST_BUCKET_BYTES, cap_bytes) if closed.get(key, 0) == 0 else cap_bytes
            if filled[key] >= limit:
                lists.append(open_.pop(key))
                filled[key], closed[key] = 0, closed.get(key, 0) + 1
        lists += [rest for rest in open_.values() if rest]
        buckets = [_Bucket(indices, self._params) for indices in lists]
        where = [(0, 0)] * len(self._params)
        for b, bucket in enumerate(buckets):
            for j, i in enumerate(bucket.indices):
                where[i] = (b, j)
        return buckets, where

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.world_size > 1:
            with no_grad():
                self._broadcast([b.data for b in self.module.buffers()])
        out = self.module(*args, **kwargs)
        if is_grad_enabled() and self._require_sync:
            self._prepare_for_backward(out)
        else:
            self._expect_hooks = False
        return out

    def _prepare_for_backward(self, out: Any) -> None:
        for bucket in self._buckets:
            bucket.pending, bucket.work = len(bucket.indices), None
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        self._queued = False
        self._expect_hooks = True
        self._used = None
        self._unused = []
        if self.find_unused_parameters:
            reached = _leaves_reached(out)
            self._unused = [i for i, p in enumerate(self._params) if id(p) not in reached]

    # ---- backward ------------------------------------------------------------------------------
    def _make_hook(self, index: int):
        def hook(param: Tensor) -> None:
            if self._expect_hooks:
                self._grad_ready(index)
        return hook

    def _grad_ready(self, index: int) -> None:
        if not self._queued:  # the first gradient of this backward
            self._queued = True
            engine.queue_callback(self._finalize)
            if self.find_unused_parameters and not graphs.is_capturing():
                self._used = torch.zeros(len(self._params), dtype=torch.int32, device=self._buckets[0].buffer.device)
            for i in self._unused:
                self._mark_ready(i)
        if self._used is not None:
            self._used[index] = 1
        self._mark_ready(index)

    def _mark_ready(self, index: int) -> None:
        if self._ready[index]:
            return
        self._ready[index] = True
        b, j = self._where[index]
        bucket = self._buckets[b]
        view, param = bucket.views[j], self._params[index]
        if param.grad is None:
            view.zero_()  # an unused parameter contributes nothing
        elif param.grad.data is not view:
            view.copy_(param.grad.data)
            if self.gradient_as_bucket_view:
                param.grad.data = view
        bucket.pending -= 1
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        op = dist.ReduceOp.AVG if self._nccl else dist.ReduceOp.SUM
        bucket.work = dist.all_reduce(bucket.buffer, op=op, group=self.process_group, async_op=True)

    def _finalize(self) -> None:
        """End of backward: wait for every bucket, average, and point the gradients at the results."""
        self._expect_hooks = False
        missing = [self._names[i] for i, ready in enumerate(self._ready) if not ready]
        if missing:
            for bucket in self._buckets[:self._next_bucket]:
                bucket.work.wait()
            raise RuntimeError(
                f"DistributedDataParallel: parameters {missing} received no gradient in this backward, so their "
                "buckets were never reduced (the ranks would diverge). Pass find_unused_parameters=True if some "
                "parameters do not take part in every forward, or make every parameter contribute to the loss")
        for bucket in self._buckets:
            bucket.work.wait()
            if not self._nccl and self.world_size > 1:
                # gloo has no ReduceOp.AVG: it summed; the mean is a ge2 kernel
                bucket.buffer.copy_(backend.call("mul", bucket.buffer, 1.0 / self.world_size))
        globally_unused: set[int] = set()
        if self._used is not None and self._unused:
            dist.all_reduce(self._used, group=self.process_group)
            counts = self._used.tolist()
            globally_unused = {i for i in self._unused if counts[i] == 0}
        for bucket in self._buckets:
            for i, view in zip(bucket.indices, bucket.views):
                param = self._params[i]
                if i in globally_unused and param.grad is None:
                    continue  # no rank used it: torch leaves .grad as it was
                if param.grad is None:
                    param.grad = Tensor(view if self.gradient_as_bucket_view else view.clone())
                elif param.grad.data is not view:
                    param.grad.data.copy_(view)

    # ---- gradient accumulation -----------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside the block, backward accumulates gradients locally without communicating; the first
        backward after it reduces the accumulated gradients."""
        old, self._require_sync = self._require_sync, False
        try:
            yield
        finally:
            self._require_sync = old

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, buckets={len(self._buckets)}, "
                f"find_unused_parameters={self.find_unused_parameters}")


def _leaves_reached(out: Any) -> set[int]:
    """ids of the leaf Tensors that a backward from the Tensors in ``out`` would reach."""
    stack: list[Any] = []

    def collect(o: Any) -> None:
        if isinstance(o, Tensor):
            if o.grad_fn is not None:
                stack.append(o.grad_fn)
        elif isinstance(o, (tuple, list)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)

    collect(out)
    seen, leaves = set(stack), set()
    while stack:
        node = stack.pop()
        for edge in node.edges:
            if edge is None:
                continue
            nxt = edge[0]
            if isinstance(nxt, Node):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
            else:
                leaves.add(id(nxt))
    return leaves
