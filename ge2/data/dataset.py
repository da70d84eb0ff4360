"""``TensorDataset`` and ``DataLoader``: batches of samples, shuffled with a seed, moved to the device.

Loading is data movement, not model math: a batch is gathered on the dataset's side (host
tensors, usually) with torch's indexing, then copied to the device.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from ge2 import runtime
from ge2.autograd.tensor import Tensor


def _torch(t: Any, name: str) -> torch.Tensor:
    if isinstance(t, Tensor):
        return t.data
    if isinstance(t, torch.Tensor):
        return t
    raise TypeError(f"TensorDataset: {name} must be a tensor, got {type(t).__name__}")


class Dataset:
    """Anything with ``__len__`` and ``__getitem__(i)`` returning a tuple of tensors/numbers."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int):
        raise NotImplementedError


class TensorDataset(Dataset):
    """Sample i is ``(t[i] for t in tensors)``; all tensors share their first dim."""

    def __init__(self, *tensors: Tensor | torch.Tensor):
        if not tensors:
            raise ValueError("TensorDataset: expected at least one tensor")
        self.tensors = tuple(_torch(t, f"tensors[{i}]") for i, t in enumerate(tensors))
        n = self.tensors[0].shape[0] if self.tensors[0].dim() else None
        for i, t in enumerate(self.tensors):
            if t.dim() == 0 or t.shape[0] != n:
                raise ValueError(f"TensorDataset: tensors[{i}] has shape {list(t.shape)}, but tensors[0] has "
                                 f"{n} samples (every tensor needs that first dim)")

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def __getitem__(self, i: int):
        return tuple(Tensor(t[i]) for t in self.tensors)

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rows ``idx`` of every tensor (one gather per tensor)."""
        return tuple(t.index_select(0, idx.to(t.device)) for t in self.tensors)


class DataLoader:
    """Iterate over ``dataset`` in batches of ge2 Tensors on ``device``.

    ``shuffle``: a new permutation each epoch, from ``seed`` and the epoch number only, so two
    loaders with the same seed give the same batches (and a resumed run can ``set_epoch``).
    ``sampler`` (e.g. ``DistributedSampler``): the order comes from it instead; the loader sets its
    epoch (``sampler.set_epoch``) to the loader's before each iteration.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, device=None, sampler=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler and shuffle=True are exclusive (the sampler shuffles)")
        self.sampler = sampler
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self.seed = seed
        self.device = runtime.resolve_device(device)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration uses."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> torch.Tensor:
        if self.sampler is not None:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(self.epoch)
            return torch.tensor(list(iter(self.sampler)), dtype=torch.int64)
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(n, generator=g)

    def _collate(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if isinstance(self.dataset, TensorDataset):
            return self.dataset.gather(idx)
        samples = [self.dataset[int(i)] for i in idx]
        cols = list(zip(*samples))
        return tuple(torch.stack([_torch(x, "sample") if not isinstance(x, (int, float)) else torch.tensor(x)
                                  for x in col]) for col in cols)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        order = self._order()
        self.epoch += 1
        n, bs = len(order), self.batch_size
        stop = n - n % bs if self.drop_last else n
        for start in range(0, stop, bs):
            batch = self._collate(order[start:start + bs])
            yield tuple(Tensor(t.to(self.device, non_blocking=True)) for t in batch)


def random_split_indices(n: int, fractions: Sequence[float], seed: int = 0) -> list[torch.Tensor]:
    """Deterministic disjoint index sets covering 0..n-1 in the given proportions."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out, start = [], 0
    for i, f in enumerate(fractions):
        size = n - start if i == len(fractions) - 1 else int(round(f * n))
        out.append(perm[start:start + size])
        start += size
    return out
