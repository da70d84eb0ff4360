"""``DistributedSampler``: each rank's share of a dataset's indices, as torch's sampler draws them.

Shuffling permutes the indices with a generator seeded by ``seed + epoch`` (``set_epoch`` before each
epoch, or let ``DataLoader`` do it), the same permutation ``torch.utils.data.DistributedSampler``
draws; without ``drop_last`` the list is padded with its own head to a multiple of the world size,
with it the tail is dropped; rank r takes every world-th index from r. Index bookkeeping on the host,
no model math.
"""
from __future__ import annotations

import math
from typing import Iterator

import torch


class DistributedSampler:
    """Indices ``rank, rank + world, ...`` of the (shuffled, padded) dataset order; ``len`` is per rank."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        from ge2 import distributed

        num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
        rank = distributed.get_rank() if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: need 0 <= rank < num_replicas, got rank {rank} of {num_replicas}")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration draws (every rank must set the same one)."""
        self.epoch = epoch

    def indices(self) -> torch.Tensor:
        """This rank's indices for the current epoch, as an int64 tensor."""
        n = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(n)
        if self.drop_last:
            order = order[:self.total_size]
        elif self.total_size > n:
            order = order.repeat(math.ceil(self.total_size / max(n, 1)))[:self.total_size]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
