"""Reduction kernels: sum, mean, prod, amax/amin, max/min over a dim (values + first index),
argmax/argmin, var/std, vector norms, logsumexp, all/any.

sum(x, *, dims=None, keepdim=False) -> out      # floats keep dtype (fp32 accumulation), ints/bool -> int64
mean(x, *, dims=None, keepdim=False) -> out
prod(x, *, dims=None, keepdim=False, skip_zeros=False) -> out   # dtype as sum; skip_zeros: zeros count as 1
amax / amin(x, *, dims=None, keepdim=False) -> out              # NaN propagates
max_dim / min_dim(x, *, dim, keepdim=False) -> (values, indices int64)   # first extremum; NaN wins
argmax / argmin(x, *, dim=None, keepdim=False) -> int64         # dim None: index into the flattened x
var / std(x, *, dims=None, correction=1, keepdim=False) -> out  # two passes: mean, then squared deviations
vector_norm(x, *, ord=2, dims=None, keepdim=False) -> out       # ord: any float, inf, -inf, 0
logsumexp(x, *, dims=None, keepdim=False) -> out                # two passes: max, then sum of exp(x - max)
all / any(x, *, dims=None, keepdim=False) -> bool (uint8 for uint8, like torch)
count_nan(x, *, dims=None, keepdim=False) -> int64
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
from ge2.kernels.elementwise import _float_arg, _float_bits, _sqrt, collapse_dims, div, strided_offsets
from ge2.runtime import INTERPRETER, autotune, cdiv

# How lanes combine (OP), what each element becomes first (PRE), what the total becomes (POST).
SUM, MAX, ARGMAX, PROD, MIN, ARGMIN = (tl.constexpr(i) for i in range(6))
NONE, ABS, SQUARE, POW_ABS, SQUARED_DEV, EXP_DEV, NONZERO, IS_ZERO, ZERO_AS_ONE, IS_NAN = (tl.constexpr(i) for i in range(10))
DIVIDE, SQRT_DIVIDE, ROOT, LOG_PLUS_CENTER, EQ_ZERO, GT_ZERO = (tl.constexpr(i) for i in range(1, 7))
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


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def _worst(ACC: tl.constexpr, LOWEST_WINS: tl.constexpr):
    """The value every element beats: -inf for a maximum, +inf for a minimum (int64 bounds for ints)."""
    if LOWEST_WINS:
        if ACC.is_floating():
            return float("inf")
        else:
            return _INT64_MAX
    else:
        return _lowest(ACC)


@triton.jit
def _better(x, acc, LOWEST_WINS: tl.constexpr):
    if LOWEST_WINS:
        return x < acc
    else:
        return x > acc


@triton.jit
def _shift(center):
    # logsumexp's shift: an infinite maximum shifts by 0 (all -inf stays -inf, +inf stays +inf).
    return tl.where(tl.abs(center) == float("inf"), 0.0, center)


@triton.jit
def _pow_nonnegative(a, b):
    # a >= 0 and b != 0 (norms): exp(b log a) in fp64 covers 0 and inf; fp64 keeps fp32 results exact-ish.
    return tl.exp(b * tl.log(a.to(tl.float64)))


@triton.jit
def _pre(x, center, p, PRE: tl.constexpr, ACC: tl.constexpr):
    """The element a reduction accumulates: x itself, |x|, |x|**p, (x - c)**2, exp(x - c), indicators."""
    if PRE == ABS:
        x = tl.abs(x)
    elif PRE == SQUARE:
        x = x * x
    elif PRE == POW_ABS:
        x = _pow_nonnegative(tl.abs(x), _float_arg(p, tl.float64)).to(ACC)
    elif PRE == SQUARED_DEV:
        x = (x - center[:, None]) * (x - center[:, None])
    elif PRE == EXP_DEV:
        x = tl.exp(x - _shift(center)[:, None])
    elif PRE == NONZERO:
        x = (x != 0).to(ACC)
    elif PRE == IS_ZERO:
        x = (x == 0).to(ACC)
    elif PRE == ZERO_AS_ONE:
        x = tl.where(x == 0, 1, x).to(ACC)
    elif PRE == IS_NAN:
        x = (x != x).to(ACC)
    return x


@triton.jit
def _post(total, center, count, inv_p, POST: tl.constexpr, ACC: tl.constexpr):
    """The finished row: total / count (mean, var), its root (std), total**(1/p), log(total) + c, tests."""
    if POST == DIVIDE:
        total = div(total, _float_arg(count, ACC))
    elif POST == SQRT_DIVIDE:
        total = _sqrt(div(total, _float_arg(count, ACC)))
    elif POST == ROOT:
        total = _pow_nonnegative(total, _float_arg(inv_p, tl.float64)).to(ACC)
    elif POST == LOG_PLUS_CENTER:
        total = tl.log(total) + _shift(center)
    elif POST == EQ_ZERO:
        total = total == 0
    elif POST == GT_ZERO:
        total = total > 0
    return total


@autotune(_INNER_CONFIGS + _OUTER_CONFIGS, key=["tune_m", "tune_n", "inner"], default=_INTERPRETER_CONFIG,
          prune_configs_by={"early_config_prune": _prune}, do_bench=_quick_bench)
@triton.jit(do_not_specialize=["tune_m", "tune_n", "count", "p", "inv_p"])
def _reduce_kernel(
    x_ptr, out_ptr, index_out_ptr, index_in_ptr, center_ptr,
    M, N, chunk, count, p, inv_p, tune_m, tune_n, inner,
    m_sizes, m_strides, n_sizes, n_strides,
    OP: tl.constexpr, ACC: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, GATHER_INDEX: tl.constexpr,
    M_RANK: tl.constexpr, N_RANK: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out[s, m] = POST(reduce(PRE(x[m, n]) for n in chunk s)); x[m, n] lives at offset(m) + offset(n).

    ARGMAX/ARGMIN also write the index of the first extremum (NaN counts as the extremum); with
    GATHER_INDEX, x holds partial extrema and the index is looked up in index_in[s, m]. center[m]
    is the per-row value PRE and POST may use (a mean, a maximum); count, p, inv_p are fp64 bits.
    tune_m, tune_n, inner are the autotune key only.
    """
    EXTREMUM: tl.constexpr = OP == MAX or OP == ARGMAX or OP == MIN or OP == ARGMIN
    WITH_INDEX: tl.constexpr = OP == ARGMAX or OP == ARGMIN
    LOWEST_WINS: tl.constexpr = OP == MIN or OP == ARGMIN
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if WIDE:  # column bounds (split * chunk + chunk) and offsets may pass 2**31
        split = split.to(tl.int64)
        rows = rows.to(tl.int64)
    row_mask = rows < M
    row_offsets = strided_offsets(rows, m_sizes, m_strides, M_RANK)
    n_start = split * chunk
    n_end = tl.minimum(n_start + chunk, N)
    center = tl.zeros([BLOCK_M], ACC)
    if PRE == SQUARED_DEV or PRE == EXP_DEV or POST == LOG_PLUS_CENTER:
        center = tl.load(center_ptr + rows, mask=row_mask, other=0).to(ACC)

    if OP == SUM:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    elif OP == PROD:
        acc = tl.full([BLOCK_M, BLOCK_N], 1, ACC)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N], _worst(ACC, LOWEST_WINS), ACC)
        first = tl.full([BLOCK_M, BLOCK_N], -1, tl.int64)  # per lane: index of its extremum so far
    for start in range(n_start, n_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if WIDE:
            cols = cols.to(tl.int64)
        mask = row_mask[:, None] & (cols < n_end)[None, :]
        col_offsets = strided_offsets(cols, n_sizes, n_strides, N_RANK)
        x = tl.load(x_ptr + row_offsets[:, None] + col_offsets[None, :], mask=mask, other=0).to(ACC)
        if PRE != NONE:
            x = _pre(x, center, p, PRE, ACC)
        if OP == SUM:
            if PRE != NONE:  # masked lanes loaded 0, which PRE may not keep 0
                x = tl.where(mask, x, 0)
            acc += x
        elif OP == PROD:
            acc *= tl.where(mask, x, 1)
        elif not WITH_INDEX:
            acc = tl.where(mask & (_better(x, acc, LOWEST_WINS) | (x != x)), x, acc)
        else:
            # Strictly better keeps each lane's first extremum; a lane's first valid element is
            # taken whatever its value (-inf, INT_MIN); the first NaN wins and stays.
            take = mask & ((first < 0) | _better(x, acc, LOWEST_WINS) | ((x != x) & (acc == acc)))
            acc = tl.where(take, x, acc)
            first = tl.where(take, cols[None, :].to(tl.int64), first)

    out_rows = split * M + rows
    if not EXTREMUM:
        if OP == SUM:
            total = tl.sum(acc, axis=1)
        else:
            total = tl.reduce(acc, 1, _multiply)
        if POST != NONE:
            total = _post(total, center, count, inv_p, POST, ACC)
        tl.store(out_ptr + out_rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        lane_nan = acc != acc
        has_nan = tl.max(lane_nan.to(tl.int32), axis=1) > 0
        if LOWEST_WINS:
            best = tl.min(tl.where(lane_nan, _worst(ACC, LOWEST_WINS), acc), axis=1)
        else:
            best = tl.max(tl.where(lane_nan, _worst(ACC, LOWEST_WINS), acc), axis=1)
        if ACC.is_floating():
            best = tl.where(has_nan, float("nan"), best)
        tl.store(out_ptr + out_rows, best.to(out_ptr.dtype.element_ty), mask=row_mask)
        if WITH_INDEX:
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


def _launch(x, M, N, m_side, n_side, op, acc, out, index_out=None, index_in=None, split=1, chunk=None,
            pre=NONE, post=NONE, center=None, count=1, p=1.0):
    (m_sizes, m_strides), (n_sizes, n_strides) = m_side, n_side
    chunk = chunk if chunk is not None else N
    inner = n_strides[-1] == 1 and n_sizes[-1] > 1
    wide = max(_max_offset(m_sizes, m_strides) + _max_offset(n_sizes, n_strides), split * M, N + chunk) > _INT32_MAX
    tuned = M * N >= 2**20
    args = (
        x, out, index_out if index_out is not None else out, index_in if index_in is not None else out,
        center if center is not None else out,
        M, N, chunk, _float_bits(count), _float_bits(p), _float_bits(1.0 / p if p else math.inf),
        *((M, N) if tuned else (0, 0)), int(inner),
        m_sizes, m_strides, n_sizes, n_strides,
    )
    constexprs = dict(OP=op, ACC=_TL_DTYPE[acc], PRE=pre, POST=post, GATHER_INDEX=index_in is not None,
                      M_RANK=len(m_sizes), N_RANK=len(n_sizes), WIDE=wide)
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]), split)  # noqa: E731
    if tuned:
        _reduce_kernel[grid](*args, **constexprs)
    else:  # never tuned: skip the autotuner's per-call bookkeeping, take the config it would pin
        config = _INTERPRETER_CONFIG if INTERPRETER else (_INNER_CONFIGS if inner else _OUTER_CONFIGS)[0]
        kwargs = config.all_kwargs()
        if INTERPRETER and op == PROD:  # the interpreter multiplies a tile's lanes one by one: keep tiles small
            kwargs.update(BLOCK_M=8, BLOCK_N=min(64, triton.next_power_of_2(max(chunk, 1))))
        _reduce_kernel.fn[grid](*args, **constexprs, **kwargs)


def _splits(M: int, N: int, inner: bool, device: torch.device) -> int:
    """How many column chunks to give each block of rows: enough programs to fill the GPU."""
    target = _target_programs(device.index if device.type == "cuda" else None)
    rows_per_program = 1 if inner else 64  # roughly what the tuned configs of each family take
    row_programs = cdiv(M, rows_per_program)
    if row_programs >= target:
        return 1
    by_work = (rows_per_program * N) // SPLIT_MIN_ELEMENTS
    return max(1, min(cdiv(target, row_programs), by_work))


def _reduced_dims(name: str, x: torch.Tensor, dims) -> tuple[int, ...]:
    return normalize_dims(name, dims, x.dim()) or tuple(range(x.dim()))  # () means all, like torch


def _reduce(name: str, op, x: torch.Tensor, dims, keepdim: bool, out_dtype: torch.dtype, *, pre=NONE, post=NONE,
            center: torch.Tensor | None = None, count=1, p: float = 1.0):
    """Reduce PRE(x) over dims with op, then POST -> out [kept shape] (and int64 indices for ARGMAX/ARGMIN).

    center: a per-row tensor of the kept shape (contiguous) that PRE/POST read; count: POST's divisor.
    """
    if x.dim() == 0:
        x, reduced, out_shape = x.reshape(1), (0,), ()
    else:
        reduced = _reduced_dims(name, x, dims)
        out_shape = tuple(1 if d in reduced else s for d, s in enumerate(x.shape) if keepdim or d not in reduced)
    with_index = op in (ARGMAX, ARGMIN)
    kept = [d for d in range(x.dim()) if d not in reduced]
    # Columns in memory order (largest stride first) so that they merge and the last is the fastest;
    # an index is counted in logical order, so those keep it.
    columns = sorted(reduced, key=lambda d: -x.stride(d)) if not with_index else list(reduced)
    M = math.prod(x.shape[d] for d in kept)
    N = math.prod(x.shape[d] for d in columns)
    m_side, n_side = _side(x, kept), _side(x, columns)
    if len(m_side[0]) > MAX_RANK or len(n_side[0]) > MAX_RANK:
        x = x.permute(kept + columns).contiguous()
        m_side, n_side = ((M,), (N,)), ((N,), (1,))

    out = torch.empty(M, dtype=out_dtype, device=x.device)
    index = torch.empty(M, dtype=torch.int64, device=x.device) if with_index else None
    acc = _ACC.get(x.dtype, torch.int64)
    center = center.reshape(M) if center is not None else None
    if M > 0:
        inner = n_side[1][-1] == 1
        split = _splits(M, N, inner, x.device)
        if split == 1:
            _launch(x, M, N, m_side, n_side, op, acc, out, index, pre=pre, post=post, center=center, count=count, p=p)
        else:
            chunk = cdiv(cdiv(N, split), 256) * 256  # aligned chunks for vector loads
            split = cdiv(N, chunk)  # no empty chunk
            partial = torch.empty((split, M), dtype=acc, device=x.device)
            partial_index = torch.empty((split, M), dtype=torch.int64, device=x.device) if with_index else None
            _launch(x, M, N, m_side, n_side, op, acc, partial, partial_index, split=split, chunk=chunk,
                    pre=pre, center=center, p=p)
            # The partials are [split, M]: rows contiguous, reduced across memory. PRE is done; POST is left.
            _launch(partial, M, split, ((M,), (1,)), ((split,), (M,)), op, acc, out,
                    index, index_in=partial_index, post=post, center=center, count=count, p=p)
    out = out.reshape(out_shape)
    return (out, index.reshape(out_shape)) if with_index else out


def _count(x: torch.Tensor, reduced: tuple[int, ...]) -> int:
    return math.prod(x.shape[d] for d in reduced) if x.dim() else 1


# ---------------------------------------------------------------------------------------------
# Public launchers (the contract above)
# ---------------------------------------------------------------------------------------------
def sum(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:  # noqa: A001 (the op's name)
    """Sum over dims -> [kept shape]; floats keep their dtype (fp32 accumulation), ints/bool give int64."""
    return _reduce("sum", SUM, x, dims, keepdim, x.dtype if x.dtype.is_floating_point else torch.int64)


def mean(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Mean over dims -> [kept shape], x.dtype; the mean of nothing is NaN."""
    count = _count(x, _reduced_dims("mean", x, dims) if x.dim() else ())
    return _reduce("mean", SUM, x, dims, keepdim, x.dtype, post=DIVIDE, count=count)


def amax(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Maximum over dims -> [kept shape], x.dtype; NaN if any element is NaN."""
    return _reduce("amax", MAX, x, dims, keepdim, x.dtype)


def amin(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Minimum over dims -> [kept shape], x.dtype; NaN if any element is NaN."""
    return _reduce("amin", MIN, x, dims, keepdim, x.dtype)


def max_dim(x: torch.Tensor, *, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int64 indices) of the first maximum along dim -> [kept shape]; NaN wins, first NaN's index."""
    return _reduce("max", ARGMAX, x, dim, keepdim, x.dtype)


def min_dim(x: torch.Tensor, *, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int64 indices) of the first minimum along dim -> [kept shape]; NaN wins, first NaN's index."""
    return _reduce("min", ARGMIN, x, dim, keepdim, x.dtype)


def _arg(name: str, op, x: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    if dim is None:  # torch: the index into the flattened tensor; keepdim keeps every dim as size 1
        flat = x.reshape(-1) if x.dim() else x
        index = _reduce(name, op, flat, 0, False, x.dtype)[1]
        return index.reshape((1,) * x.dim()) if keepdim else index
    return _reduce(name, op, x, dim, keepdim, x.dtype)[1]


def argmax(x: torch.Tensor, *, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """int64 index of the first maximum along dim (of the flattened x for dim None) -> [kept shape]."""
    return _arg("argmax", ARGMAX, x, dim, keepdim)


def argmin(x: torch.Tensor, *, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """int64 index of the first minimum along dim (of the flattened x for dim None) -> [kept shape]."""
    return _arg("argmin", ARGMIN, x, dim, keepdim)


def prod(x: torch.Tensor, *, dims=None, keepdim: bool = False, skip_zeros: bool = False) -> torch.Tensor:
    """Product over dims -> [kept shape]; floats keep dtype, ints/bool -> int64; skip_zeros: zeros count as 1."""
    dtype = x.dtype if x.dtype.is_floating_point else torch.int64
    return _reduce("prod", PROD, x, dims, keepdim, dtype, pre=ZERO_AS_ONE if skip_zeros else NONE)


def _variance(name: str, x: torch.Tensor, dims, correction: float, keepdim: bool, post) -> torch.Tensor:
    # Two passes (mean, then squared deviations from it): no cancellation, unlike E[x^2] - E[x]^2.
    reduced = _reduced_dims(name, x, dims) if x.dim() else ()
    centre = mean(x, dims=dims) if x.dim() else x.reshape(())
    count = builtins.max(0.0, _count(x, reduced) - correction)
    return _reduce(name, SUM, x, dims, keepdim, x.dtype, pre=SQUARED_DEV, post=post, center=centre, count=float(count))


def var(x: torch.Tensor, *, dims=None, correction: float = 1, keepdim: bool = False) -> torch.Tensor:
    """sum((x - mean)^2) / max(0, N - correction) over dims -> [kept shape], x.dtype."""
    return _variance("var", x, dims, correction, keepdim, DIVIDE)


def std(x: torch.Tensor, *, dims=None, correction: float = 1, keepdim: bool = False) -> torch.Tensor:
    """sqrt(var) over dims -> [kept shape], x.dtype."""
    return _variance("std", x, dims, correction, keepdim, SQRT_DIVIDE)


def vector_norm(x: torch.Tensor, *, ord: float = 2.0, dims=None, keepdim: bool = False) -> torch.Tensor:  # noqa: A002
    """(sum |x|^ord)^(1/ord) over dims -> [kept shape], x.dtype; ord inf/-inf: max/min |x|; ord 0: nonzero count."""
    ord = float(ord)
    if ord == math.inf:
        return _reduce("vector_norm", MAX, x, dims, keepdim, x.dtype, pre=ABS)
    if ord == -math.inf:
        return _reduce("vector_norm", MIN, x, dims, keepdim, x.dtype, pre=ABS)
    if ord == 0:
        return _reduce("vector_norm", SUM, x, dims, keepdim, x.dtype, pre=NONZERO)
    if ord == 1:
        return _reduce("vector_norm", SUM, x, dims, keepdim, x.dtype, pre=ABS)
    if ord == 2:
        return _reduce("vector_norm", SUM, x, dims, keepdim, x.dtype, pre=SQUARE, post=SQRT_DIVIDE)
    return _reduce("vector_norm", SUM, x, dims, keepdim, x.dtype, pre=POW_ABS, post=ROOT, p=ord)


def logsumexp(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """log(sum(exp(x))) over dims -> [kept shape], x.dtype; shifted by the maximum (inf rows stay inf)."""
    top = _reduce("logsumexp", MAX, x, dims, False, x.dtype)
    return _reduce("logsumexp", SUM, x, dims, keepdim, x.dtype, pre=EXP_DEV, post=LOG_PLUS_CENTER, center=top)


def all(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:  # noqa: A001
    """True where every element over dims is nonzero -> bool [kept shape] (True for nothing; uint8 for uint8, as torch)."""
    return _reduce("all", SUM, x, dims, keepdim, _truth_dtype(x), pre=IS_ZERO, post=EQ_ZERO)


def any(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:  # noqa: A001
    """True where some element over dims is nonzero -> bool [kept shape] (False for nothing; uint8 for uint8)."""
    return _reduce("any", SUM, x, dims, keepdim, _truth_dtype(x), pre=NONZERO, post=GT_ZERO)


def _truth_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.uint8 if x.dtype == torch.uint8 else torch.bool


def count_nan(x: torch.Tensor, *, dims=None, keepdim: bool = False) -> torch.Tensor:
    """Number of NaNs over dims -> int64 [kept shape]."""
    return _reduce("count_nan", SUM, x, dims, keepdim, torch.int64, pre=IS_NAN)


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
