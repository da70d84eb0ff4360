"""Embedding: a row gather forward, a scatter-add backward.

Forward copies row ``weight[idx[i]]`` for each index (one program per (index block, column
block)). An out-of-range index writes NaN in its row, never reads out of bounds, and counts in
a device flag, raised as a clear error as the indexing ops' counts are (``scatter.report_bad_indices``:
at once on the CPU or with check=True, on the GPU by default without a host sync, by a later call).
Backward adds each gy row into dweight[idx[i]] with atomics (fp32 accumulation, fp64 for an fp64
table; order of additions, so the last bits, can vary between GPU runs), skipping ``padding_idx``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2.kernels.scatter import new_counter, report_bad_indices
from ge2.runtime import cdiv

BLOCK_I = 16


def _block_d(D: int) -> int:
    # Not autotuned: both kernels add into counters or gradients with atomics, and tuning re-runs
    # a kernel to time it (each re-run would add again). Gathers are memory-bound anyway.
    return min(triton.next_power_of_2(D), 256)


@triton.jit
def embedding_fwd_kernel(idx_ptr, w_ptr, y_ptr, bad_ptr, n_idx, V, D, stride_wv, stride_wd,
                         BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    live = rows < n_idx
    idx = tl.load(idx_ptr + rows, mask=live, other=0).to(tl.int64)
    valid = (idx >= 0) & (idx < V)
    safe = tl.where(valid, idx, 0)
    m = live[:, None] & (cols[None, :] < D)
    vals = tl.load(w_ptr + safe[:, None] * stride_wv + cols[None, :] * stride_wd, mask=m & valid[:, None], other=0.0)
    vals = tl.where(valid[:, None], vals, float("nan"))
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], vals.to(y_ptr.dtype.element_ty), mask=m)
    if tl.program_id(1) == 0:
        tl.atomic_add(bad_ptr, tl.sum(tl.where(live & ~valid, 1, 0), axis=0))


@triton.jit
def embedding_bwd_kernel(idx_ptr, gy_ptr, gw_ptr, n_idx, V, D, padding_idx,
                         BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    idx = tl.load(idx_ptr + rows, mask=rows < n_idx, other=-1).to(tl.int64)
    use = (rows < n_idx) & (idx >= 0) & (idx < V) & (idx != padding_idx)
    m = use[:, None] & (cols[None, :] < D)
    g = tl.load(gy_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], mask=m, other=0.0).to(gw_ptr.dtype.element_ty)
    tl.atomic_add(gw_ptr + tl.where(use, idx, 0)[:, None] * D + cols[None, :], g, mask=m)


def embedding(idx: torch.Tensor, weight: torch.Tensor, check: bool | None = None) -> torch.Tensor:
    """weight[idx]: idx any int shape, weight [V, D] -> [*idx.shape, D] (contiguous); out-of-range rows NaN."""
    flat = idx.contiguous().view(-1)  # the kernels read the ids packed; a strided view would be misread
    n, (V, D) = flat.numel(), weight.shape
    y = torch.empty((*idx.shape, D), dtype=weight.dtype, device=weight.device)
    if n == 0 or D == 0:
        return y
    bad = new_counter(weight.device)
    bd = _block_d(D)
    embedding_fwd_kernel[(cdiv(n, BLOCK_I), cdiv(D, bd))](
        flat, weight, y, bad, n, V, D, weight.stride(0), weight.stride(1), BLOCK_I=BLOCK_I, BLOCK_D=bd, num_warps=4)
    report_bad_indices("embedding", bad, f"a table of {V} rows (valid: 0..{V - 1}); their rows are NaN", check)
    return y


def embedding_backward(gy: torch.Tensor, idx: torch.Tensor, V: int, padding_idx: int | None,
                       dtype: torch.dtype) -> torch.Tensor:
    """dweight [V, D] of ``dtype``: the gy rows summed per index; padding_idx's row stays 0."""
    flat = idx.contiguous().view(-1)  # the kernels read the ids packed; a strided view would be misread
    D = gy.shape[-1]
    g2 = gy.reshape(-1, D).contiguous()
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    gw = torch.zeros((V, D), dtype=acc, device=gy.device)
    n = flat.numel()
    if n and D:
        bd = _block_d(D)
        embedding_bwd_kernel[(cdiv(n, BLOCK_I), cdiv(D, bd))](
            flat, g2, gw, n, V, D, -1 if padding_idx is None else padding_idx, BLOCK_I=BLOCK_I, BLOCK_D=bd,
            num_warps=4)
    return gw if dtype == acc else gw.to(dtype)
