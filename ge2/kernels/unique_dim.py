"""unique over slices (``torch.unique(x, dim=d)``), built on the sort and scan kernels.

unique_dim(x, dim, *, return_inverse, return_counts) -> (values, inverse [n] | None, counts [U] | None)

The n slices of x along ``dim`` are ordered lexicographically (their elements compared in the
row-major order of the other dims, as torch does) by **rank doubling**: the L = numel / n columns
of the slices are sorted all at once (one batched stable sort of an [L, n] view), and each column
element is replaced by its dense rank among its column (1 + the number of distinct smaller values:
an adjacent-difference of the sorted column, scanned). Two neighbouring columns' ranks then fold
into one int64 key ``rank_a * (n + 1) + rank_b`` whose order is the pair's lexicographic order, and
the [ceil(L / 2), n] keys are ranked the same way: after ceil(log2 L) folds one column is left, and
its dense ranks are the slices' group numbers (0-based: the inverse map). Each group's first slice
in the final sorted order (the stable sort keeps equal slices in input order) is its representative;
counts are differences of the groups' first positions. Values compare as the sort keys do: -0 equals
+0 and a NaN equals nothing, so a slice containing a NaN is a group of its own (as in torch).

**Host sync:** the number of groups U is read back once to size the output (as torch does).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels import scan as scan_kernels
from ge2.kernels import sort as sort_kernels
from ge2.kernels.indexing import index_select
from ge2.runtime import cdiv

BLOCK = 1024


@triton.jit
def _starts_kernel(v_ptr, flag_ptr, total, n, BLOCK: tl.constexpr):
    """flag[c, j] = 1 where the sorted column c [C, n] starts a new value at j (j = 0, or v[j] != v[j - 1])."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < total
    first = i % n == 0
    v = tl.load(v_ptr + i, mask=live)
    prev = tl.load(v_ptr + i - 1, mask=live & ~first)
    tl.store(flag_ptr + i, (first | (v != prev)).to(tl.int64), mask=live)


@triton.jit
def _fold_kernel(rank_ptr, key_ptr, C, n, total, BLOCK: tl.constexpr):
    """key[k, i] = rank[2k, i] * (n + 1) + rank[2k + 1, i] (rank 0 past the last column), key [ceil(C / 2), n]."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = o < total
    k = o // n
    i = o - k * n
    hi = tl.load(rank_ptr + 2 * k * n + i, mask=live, other=0)
    lo = tl.load(rank_ptr + (2 * k + 1) * n + i, mask=live & (2 * k + 1 < C), other=0)
    tl.store(key_ptr + o, hi * (n + 1) + lo, mask=live)


def unique_dim(x: torch.Tensor, dim: int, *, return_inverse: bool = False, return_counts: bool = False):
    """Sorted distinct slices of x along ``dim`` -> (values with dim sized U, inverse [n] | None, counts [U] | None).

    x has at least one dim; a zero-size dim other than ``dim`` is refused by the caller (torch's rule)."""
    n = x.shape[dim]
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return x.clone(), empty if return_inverse else None, empty if return_counts else None
    cols = x.movedim(dim, -1)
    keys = cols.reshape(-1, n)  # [L, n]: column c of every slice in one row; a view where x's dims allow
    while True:
        C = keys.shape[0]
        sorted_keys, order = sort_kernels.sort(keys, dim=1)
        total = C * n
        flags = torch.empty((C, n), dtype=torch.int64, device=x.device)
        grid = (cdiv(total, BLOCK),)
        _starts_kernel[grid](sorted_keys, flags, total, n, BLOCK=BLOCK)
        group = scan_kernels.scan(flags, dim=1, op="sum")  # 1-based dense rank, in sorted order
        if C == 1:
            break
        rank = sort_kernels.place(group, order, n)  # each element's rank at its own position
        C2 = cdiv(C, 2)
        keys = torch.empty((C2, n), dtype=torch.int64, device=x.device)
        _fold_kernel[(cdiv(C2 * n, BLOCK),)](rank, keys, C, n, C2 * n, BLOCK=BLOCK)
    order, flags, group = order.reshape(n), flags.reshape(n), group.reshape(n)
    U = int(group[n - 1].item())  # the documented host sync
    first = torch.empty(U, dtype=torch.int64, device=x.device)
    inverse = torch.empty(n, dtype=torch.int64, device=x.device)
    start = torch.empty(U + 1, dtype=torch.int64, device=x.device).fill_(n)
    # sort's unique kernel with the sorted order as the values: first[g] = the group's first slice,
    # start[g] its first sorted position, inverse[slice] = its group
    sort_kernels._unique_kernel[(cdiv(n, BLOCK),)](order, order, group, flags, first, inverse, start, n, BLOCK=BLOCK)
    counts = None
    if return_counts:
        counts = torch.empty(U, dtype=torch.int64, device=x.device)
        sort_kernels._counts_kernel[(cdiv(U, BLOCK),)](start, counts, U, BLOCK=BLOCK)
    return index_select(x, dim, first, check=False), inverse if return_inverse else None, counts
