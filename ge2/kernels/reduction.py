"""Reduction kernels: sum, mean, amax and max over a dim (values + first index).

sum(x, *, dims=None, keepdim=False) -> out      # floats keep dtype (fp32 accumulation), ints/bool -> int64
mean(x, *, dims=None, keepdim=False) -> out
amax(x, *, dims=None, keepdim=False) -> out     # NaN propagates
max_dim(x, *, dim, keepdim=False) -> (values, indices int64)   # first maximum; NaN propagates
sum_to(x, shape, *, dtype=None) -> out          # sum a broadcast result back to ``shape`` (gradients)
dims: int, tuple of ints or None (= all; an empty tuple also means all, like torch); negative dims
allowed; a 0-d x is fine.

Every reduction is one 2-D problem: the kept dims become M rows and the reduced dims N columns,
each addressed through its own (merged) sizes and strides, so a transposed or sliced input is read
in place; only a layout whose dims do not merge into MAX_RANK dims per side is copied first. A
program owns BLOCK_M rows and walks their columns in BLOCK_N tiles, accumulating in fp32 (fp64 for
fp64, int64 for integers) and reducing the tile lanes at the end. When there are too few rows to fill
the GPU (sum of everything, sum over dim 0 of a tall matrix), the columns are split into chunks, one
program per (rows, chunk), each writing a partial; a second launch reduces the partials. The order
of additions depends only on the shape and the config, so results are deterministic (no atomics).
"""
import builtins
import functools
import math

import torch
import triton
import triton.language as tl

from ge2.backend.schema import normalize_dims
from ge2.kernels.elementwise import collapse_dims, div, strided_offsets
from ge2.runtime import INTERPRETER, autotune, cdiv

SUM, MAX, ARGMAX = (tl.constexpr(i) for i in range(3))
_INT64_MIN = tl.constexpr(-(2**63))
_INT64_MAX = tl.constexpr(2**63 - 1)

# Max merged dims per side (rows, columns) read in place; more are copied contiguous first.
MAX_RANK = 3
# A split program gets at least this many elements: fewer would cost more in launch and partials
# than it gains in parallelism. (Module-level so tests can exercise splitting on small inputs.)
SPLIT_MIN_ELEMENTS = 16384
_INT32_MAX = 2**31 - 1

_ACC = {torch.float64: torch.float64, torch.float32: torch.float32, torch.float16: torch.float32,
        torch.bfloat16: torch.float32}
_TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64, torch.int64: tl.int64}


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------
# Two families: reducing along contiguous memory wants long rows per program (few rows, wide
# tiles); reducing across it (dim 0 of a row-major matrix) wants many contiguous rows and short
# column tiles. Tuned per (layout, M, N); problems under 2**20 elements share one key per layout
# (tune_m = tune_n = 0) and take the family's first config untuned.
_INNER_CONFIGS = [
    triton.Config({"BLOCK_M": 1, "BLOCK_N": 2048}, num_warps=8),
    triton.Config({"BLOCK_M": 1, "BLOCK_N": 1024}, num_warps=4),
    triton.Config({"BLOCK_M": 2, "BLOCK_N": 1024}, num_warps=8),
    triton.Config({"BLOCK_M": 4, "BLOCK_N": 512}, num_warps=4),
    triton.Config({"BLOCK_M": 1, "BLOCK_N": 4096}, num_warps=16),
]
_OUTER_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 16}, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 8}, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 16}, num_warps=8),
]
# Under the interpreter (no tuning) large tiles keep the program and loop counts, its cost, low.
_INTERPRETER_CONFIG = triton.Config({"BLOCK_M": 128, "BLOCK_N": 256}, num_warps=4)


def _prune(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    family = [c for c in configs if (c in _INNER_CONFIGS) == bool(args["inner"])]
    return family if args["tune_m"] else family[:1]


def _quick_bench(fn, quantiles):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


@triton.jit
def _lowest(ACC: tl.constexpr):
    if ACC.is_floating():
        return float("-inf")
    else:
        return _INT64_MIN


@autotune(_INNER_CONFIGS + _OUTER_CONFIGS, key=["tune_m", "tune_n", "inner"], default=_INTERPRETER_CONFIG,
          prune_configs_by={"early_config_prune": _prune}, do_bench=_quick_bench)
@triton.jit(do_not_specialize=["tune_m", "tune_n", "count"])
def _reduce_kernel(
    x_ptr, out_ptr, index_out_ptr, index_in_ptr,
    M, N, chunk, count, tune_m, tune_n, inner,
    m_sizes, m_strides, n_sizes, n_strides,
    OP: tl.constexpr, ACC: tl.constexpr, MEAN: tl.constexpr, GATHER_INDEX: tl.constexpr,
    M_RANK: tl.constexpr, N_RANK: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out[s, m] = reduce(x[m, n] for n in chunk s); x[m, n] lives at offset(m) + offset(n).

    ARGMAX also writes the index of the first maximum (NaN counts as the maximum); with
    GATHER_INDEX, x holds partial maxima and the index is looked up in index_in[s, m].
    tune_m, tune_n, inner are the autotune key only.
    """
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if WIDE:  # column bounds (split * chunk + chunk) and offsets may pass 2**31
        split = split.to(tl.int64)
        rows = rows.to(tl.int64)
    row_mask = rows < M
    row_offsets = strided_offsets(rows, m_sizes, m_strides, M_RANK)
    n_start = split * chunk
    n_end = tl.minimum(n_start + chunk, N)

    if OP == SUM:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N], _lowest(ACC), ACC)
        first = tl.full([BLOCK_M, BLOCK_N], -1, tl.int64)  # per lane: index of its maximum so far
    for start in range(n_start, n_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if WIDE:
            cols = cols.to(tl.int64)
        mask = row_mask[:, None] & (cols < n_end)[None, :]
        col_offsets = strided_offsets(cols, n_sizes, n_strides, N_RANK)
        x = tl.load(x_ptr + row_offsets[:, None] + col_offsets[None, :], mask=mask, other=0).to(ACC)
        if OP == SUM:
            acc += x
        elif OP == MAX:
            acc = tl.where(mask & ((x > acc) | (x != x)), x, acc)
        else:
            # Strictly greater keeps each lane's first maximum; a lane's first valid element is
            # taken whatever its value (-inf, INT_MIN); the first NaN wins and stays.
            take = mask & ((first < 0) | (x > acc) | ((x != x) & (acc == acc)))
            acc = tl.where(take, x, acc)
            first = tl.where(take, cols[None, :].to(tl.int64), first)

    out_rows = split * M + rows
    if OP == SUM:
        total = tl.sum(acc, axis=1)
        if MEAN:
            total = div(total, count.to(ACC))
        tl.store(out_ptr + out_rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        lane_nan = acc != acc
        has_nan = tl.max(lane_nan.to(tl.int32), axis=1) > 0
        best = tl.max(tl.where(lane_nan, _lowest(ACC), acc), axis=1)
        if ACC.is_floating():
            best = tl.where(has_nan, float("nan"), best)
        tl.store(out_ptr + out_rows, best.to(out_ptr.dtype.element_ty), mask=row_mask)
        if OP == ARGMAX:
            is_best = tl.where(has_nan[:, None], lane_nan, acc == best[:, None]) & (first >= 0)
            index = tl.min(tl.where(is_best, first, _INT64_MAX), axis=1)
            if GATHER_INDEX:
                index = tl.load(index_in_ptr + index * M + rows, mask=row_mask)
            tl.store(index_out_ptr + out_rows, index, mask=row_mask)


# ---------------------------------------------------------------------------------------------
# Launch plumbing
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _target_programs(device_index: int | None) -> int:
    """Programs that fill the GPU several times over (all SMs busy, tails short)."""
    if device_index is None:  # the interpreter: parallelism buys nothing, but keep the path exercised
        return 64
    return 8 * torch.cuda.get_device_properties(device_index).multi_processor_count


def _side(x: torch.Tensor, dims) -> tuple[tuple[int, ...], tuple[int, ...]]:
    sizes, (strides,) = collapse_dims([x.shape[d] for d in dims], [[x.stride(d) for d in dims]])
    return sizes, strides


def _max_offset(sizes, strides) -> int:
    return builtins.sum((s - 1) * st for s, st in zip(sizes, strides))


def _launch(x, M, N, m_side, n_side, op, acc, out, index_out=None, index_in=None, mean_count=None, split=1, chunk=None):
    (m_sizes, m_strides), (n_sizes, n_strides) = m_side, n_side
    chunk = chunk if chunk is not None else N
    inner = n_strides[-1] == 1 and n_sizes[-1] > 1
    wide = max(_max_offset(m_sizes, m_strides) + _max_offset(n_sizes, n_strides), split * M, N + chunk) > _INT32_MAX
    tuned = M * N >= 2**20
    args = (
        x, out, index_out if index_out is not None else out, index_in if index_in is not None else out,
        M, N, chunk, mean_count if mean_count is not None else 1, *((M, N) if tuned else (0, 0)), int(inner),
        m_sizes, m_strides, n_sizes, n_strides,
    )
    constexprs = dict(OP=op, ACC=_TL_DTYPE[acc], MEAN=mean_count is not None, GATHER_INDEX=index_in is not None,
                      M_RANK=len(m_sizes), N_RANK=len(n_sizes), WIDE=wide)
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]), split)  # noqa: E731
    if tuned:
        _reduce_kernel[grid](*args, **constexprs)
    else:  # never tuned: skip the autotuner's per-call bookkeeping, take the config it would pin
        config = _INTERPRETER_CONFIG if INTERPRETER else (_INNER_CONFIGS if inner else _OUTER_CONFIGS)[0]
        _reduce_kernel.fn[grid](*args, **constexprs, **config.all_kwargs())


def _splits(M: int, N: int, inner: bool, device: torch.device) -> int:
    """How many column chunks to give each block of rows: enough programs to fill the GPU."""
    target = _target_programs(device.index if device.type == "cuda" else None)
    rows_per_program = 1 if inner else 64  # roughly what the tuned configs of each family take
    row_programs = cdiv(M, rows_per_program)
    if row_programs >= target:
        return 1
    by_work = (rows_per_program * N) // SPLIT_MIN_ELEMENTS
    return max(1, min(cdiv(target, row_programs), by_work))


def _reduce(name: str, op, x: torch.Tensor, dims, keepdim: bool, out_dtype: torch.dtype, mean: bool = False):
    """Reduce x over dims with op (SUM, MAX or ARGMAX) -> out [kept shape] (and int64 indices)."""
    if x.dim() == 0:
        x, reduced, out_shape = x.reshape(1), (0,), ()
    else:
        reduced = normalize_dims(name, dims, x.dim()) or tuple(range(x.dim()))  # () means all, like torch
        out_shape = tuple(1 if d in reduced else s for d, s in enumerate(x.shape) if keepdim or d not in reduced)
    kept = [d for d in range(x.dim()) if d not in reduced]
    # Columns in memory order (largest stride first) so that they merge and the last is the fastest.
    columns = sorted(reduced, key=lambda d: -x.stride(d)) if op != ARGMAX else list(reduced)
    M = math.prod(x.shape[d] for d in kept)
    N = math.prod(x.shape[d] for d in columns)
    m_side, n_side = _side(x, kept), _side(x, columns)
    if len(m_side[0]) > MAX_RANK or len(n_side[0]) > MAX_RANK:
        x = x.permute(kept + columns).contiguous()
        m_side, n_side = ((M,), (N,)), ((N,), (1,))

    out = torch.empty(M, dtype=out_dtype, device=x.device)
    index = torch.empty(M, dtype=torch.int64, device=x.device) if op == ARGMAX else None
    acc = _ACC.get(x.dtype, torch.int64)
    if M > 0:
        inner = n_side[1][-1] == 1
        split = _splits(M, N, inner, x.device)
        if split == 1:
            _launch(x, M, N, m_side, n_side, op, acc, out, index, mean_count=N if mean else None)
        else:
            chunk = cdiv(cdiv(N, split), 256) * 256  # aligned chunks for vector loads
            split = cdiv(N, chunk)  # no empty chunk
            partial = torch.empty((split, M), dtype=acc, device=x.device)
            partial_index = torch.empty((split, M), dtype=torch.int64, device=x.device) if op == ARGMAX else None
            _launch(x, M, N, m_side, n_side, op, acc, partial, partial_index, split=split, chunk=chunk)
            # The partials are [split, M]: rows contiguous, reduced across memory.
            _launch(partial, M, split, ((M,), (1,)), ((split,), (M,)), SUM if op == SUM else op, acc, out,
                    index, index_in=partial_index, mean_count=N if mean else None)
    out = out.reshape(out_shape)
    return (out, index.reshape(out_shape)) if op == ARGMAX else out


# ---------------------------------------------------------------------------------------------
# Public launchers (the contract above)
# ---------------------------------------------------------------------------------------------
def sum(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:  # noqa: A001 (the op's name)
    """Sum over dims -> [kept shape]; floats keep their dtype (fp32 accumulation), ints/bool give int64."""
    return _reduce("sum", SUM, x, dims, keepdim, x.dtype if x.dtype.is_floating_point else torch.int64)


def mean(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Mean over dims -> [kept shape], x.dtype; the mean of nothing is NaN."""
    return _reduce("mean", SUM, x, dims, keepdim, x.dtype, mean=True)


def amax(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Maximum over dims -> [kept shape], x.dtype; NaN if any element is NaN."""
    return _reduce("amax", MAX, x, dims, keepdim, x.dtype)


def max_dim(x: torch.Tensor, *, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int64 indices) of the first maximum along dim -> [kept shape]; NaN wins, first NaN's index."""
    return _reduce("max", ARGMAX, x, dim, keepdim, x.dtype)


def sum_to(x: torch.Tensor, shape, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum x [broadcast of shape] back to shape (the gradient of a broadcast) -> [shape], dtype or x.dtype."""
    shape = tuple(shape)
    lead = x.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    dtype = dtype or x.dtype
    if not dims:
        out = x.reshape(shape)
        return out if out.dtype == dtype else out.to(dtype)
    return _reduce("sum_to", SUM, x, dims, True, dtype).reshape(shape)
