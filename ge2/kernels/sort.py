"""Sort kernels: sort/argsort, topk, kthvalue, median, unique, multinomial draws, and the scatter
of a gradient back to the sorted-out positions.

sort(x, *, dim=-1, descending=False) -> (values, int64 indices)     # stable
topk(x, k, *, dim=-1, largest=True) -> (values, indices)            # sorted; ties: lowest index first
kthvalue(x, k, *, dim=-1, keepdim=False) -> (values, indices)       # k-th smallest (1-based)
median(x, *, dim, keepdim=False) -> (values, indices)               # lower median; NaN if the row has one
unique(x, *, return_inverse, return_counts) -> (values, inverse | None, counts | None)   # one host sync
place(g, index, n) -> out [M, n]                                    # out[m, index[m, j]] = g[m, j], else 0
multinomial(p, num_samples, replacement, state) -> int64 [M, num_samples]

**Order keys.** Every element becomes an int64 whose signed order is the sort order: a float's bits
with the magnitude bits of negatives flipped (-0 is made +0 first, every NaN the largest key, so
NaN sorts last as in torch), an integer its value; descending flips all the bits. Ties are broken by
the element's index, so (key, index) pairs are unique and the sort is stable in both directions
(torch's stable=True order; equal values keep their input order).

**Rows of any length.** A row is cut into tiles. Pass 1 sorts each tile in registers: for keys of
32 bits (fp32/fp16/bf16 and the small integers) the pair packs into one int64 (key << 32 | index)
and ``tl.sort`` sorts TILE of them (``tl.topk`` when only the first k of a tile are kept); 64-bit
keys (fp64, int64) are ranked by counting, in tiles of RANK_TILE (each element's rank is how many
pairs of its tile are smaller). Under the interpreter every tile is ranked (its tl.sort is an
element-by-element loop). Then sorted runs are merged pairwise, log2(N / TILE) passes, each one
launch with no shared state. Packed keys (unique int64s) merge by merge path: the split of the
merged run's first d outputs between the two runs is one binary search, done once per lane, and
each lane then writes its MERGE_SEQ outputs by taking the smaller head of the two runs (MERGE
"lanes"; "bitonic" merges a block's slice with tl.bitonic_merge instead). (key, index) pairs of
64-bit keys find their place by a binary search per element in the partner run. topk, kthvalue
and the draw without replacement cap every run at k: a tile keeps only its k best and a merge
writes only the first k of each merged pair.

**Small k** (k < SELECT_MIN_K, rows of 32-bit keys longer than a tile): each tile keeps its k best,
found by tl.topk on the 32-bit keys alone (the k-th key's ties by lowest index), unsorted; rounds of
tl.topk over chunks of packed candidates then leave one sorted run of k (BEST_OF_TILES).

**Radix sort** (off: RADIX_SORT). Whole rows of 32-bit keys, least significant digit first: per pass,
per-tile digit counts, a per-row scan into offsets, and a scatter that puts each step's keys in
(digit, position) order on chip (tl.sort, tl.gather) before storing them to their digit's run.

**Radix select.** For SELECT_MIN_K <= k <= 4096 out of rows longer than a tile and at most
SELECT_MAX_N long (packed keys), the first k are found without sorting the row: (key + 2^31) << IB
| index is one non-negative number per element, unique; pass p histograms its digit p (8 bits from
the top) over the elements whose higher digits equal the prefix chosen so far, until the chosen
bin holds exactly what is still needed (the index digits only run on a tie at the k-th place). A
row's G programs each loop over a span of it; the last of them to finish a pass (a ticket) makes
the row's choice and writes it as the row's state, which each program of the next pass reads
once. The k selected are written in any order and sorted by one tl.sort per row.

**multinomial.** With replacement: one scan of each row's weights gives the CDF (fp32, fp64 for
fp64), each draw u = rand(seed, offset + row * S + s) (ge2's device-side Philox state, as dropout)
binary-searches the first index whose CDF exceeds u * total. Without replacement: the exponential
race; each category gets the key -log(1 - u_i) / p_i (infinite where p_i = 0) and the S smallest
keys, in increasing order, are a draw of S categories one after another without replacement
(the Gumbel-top-k construction), found by the capped sort.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ge2.kernels import scan as scan_kernels
from ge2.runtime import INTERPRETER, cdiv

TILE = 1024       # pass-1 tile of packed 32-bit keys (tl.sort on a power of two)
RANK_TILE = 64    # pass-1 tile of 64-bit keys, ranked by a [RANK_TILE, RANK_TILE] comparison
BLOCK = 1024      # elements per program of the merge, gather and scatter passes
MERGE_BLOCK = 1024  # outputs per program of the merge-path merge of packed keys (a power of two)
# Radix select (topk/kthvalue/draws of k in [SELECT_MIN_K, SELECT_MAX_K] out of rows longer than a
# tile): 8-bit digit histograms find the k-th key, the k selected are then sorted in one tl.sort.
# H100, rows of 32k/128k fp32 (bench/results/sort_variants.txt): the select takes 0.19-0.24 ms at
# any k; the capped merges 0.19-0.20 ms at k = 50, 0.22-0.23 at 128, 0.30 at 256, 0.47 at 1024.
SELECT_MIN_K, SELECT_MAX_K = 128, 4096
# The select's (key + 2^31) << IB | index must stay below 2^63: IB <= 24 bits of index, rows of at
# most 2^24 (longer rows take the capped merges).
SELECT_MAX_N = 2**24
# A select pass runs SELECT_PROGRAMS programs over all rows (a row gets cdiv(SELECT_PROGRAMS, M),
# at least 1), each looping over its span in chunks of SELECT_BLOCK. H100, 256 rows of 32k and 64
# of 128k: 4096 programs of one 2048-element chunk on 4 warps were fastest of 256-4096 programs,
# chunks of 2048/4096 and 4/8 warps (the programs are latency-bound: more of them in flight help).
SELECT_PROGRAMS = 4096
SELECT_BLOCK = 2048
SELECT_WARPS = 4
# The select with one program a row (select_rows_each) where there are at least SELECT_ROW_MIN_M
# rows: histograms in registers, no atomics or tickets, each pass's chunk loads a step ahead. OFF:
# H100 (session 20, bench/profile_tensor_ops.py), k = 1024: 226-252 us on 256 rows of 32k and
# 440-689 us on 64 of 128k (the multi-program select: 244 / 215 us): each program's chunk loop is
# a serial chain of ~2.8 us a step, and 64-256 programs cannot hide it.
SELECT_ROW = False
SELECT_ROW_MIN_M = 32
SELECT_ROW_BLOCK = 4096
SELECT_ROW_WARPS = 16
# Pass 0 counts every element (tl.histogram: per-program counts, 256 atomics); later passes count
# only the few elements under the prefix, by masked atomics (tl.histogram's cost does not shrink
# with its mask). MERGE: how packed runs merge: "lanes" (merge path per lane, MERGE_SEQ outputs a
# lane, merged sequentially), "bitonic" (merge path per block, then tl.bitonic_merge), "search" (a
# binary search per element, as the 64-bit keys do).
SELECT_ATOMIC_PASSES = True
MERGE = "lanes"
MERGE_SEQ = 8
TILE_WARPS = 0  # warps of the tile pass; 0: 8 for tiles of 512+ elements, else 4
_INT64_MAX = tl.constexpr(2**63 - 1)
_SIGN32 = tl.constexpr(2**31)  # xor'd into a 32-bit key: its unsigned order
_WIDE_KEYS = (torch.float64, torch.int64)
# Radix sort (sort/argsort of whole rows of 32-bit keys or narrower, longer than RADIX_MIN_N - 1):
# cdiv(32, RADIX_BITS) counting passes over tiles of RADIX_TILE keys, each moving every key once, in
# place of the tile sort and the log2(N / TILE) merges (latency-bound: ~0.15 ms each on 8M keys).
# OFF by default: its first form (each lane storing its key where it goes) took 3.16 / 3.17 ms on
# 256 x 32k / 64 x 128k fp32 against the merges' 1.15 / 1.44 (H100, bench/results/
# tensor_ops_sort_radix_v1.json); the present form (stores in (digit, position) order) took 1.46 /
# 1.48 ms at its best (5 bits, SUB 256) and 2.0-4.7 ms otherwise (bench/results/
# sort_variants_radix_v2.txt): the step's tl.sort bounds it.
RADIX_SORT = False
RADIX_MIN_N = TILE + 1
RADIX_BITS = 5
RADIX_TILE = 1024
RADIX_WARPS = 8
RADIX_SUB = 256  # keys a step of the scatter (one tl.sort of digit | position each; 256 measured best)
RADIX_CHUNK = 64  # tiles a step of the offsets' loop over a row
# Small k (cap < SELECT_MIN_K) out of rows of 32-bit keys longer than a tile: each tile of
# BEST_TILE elements keeps its best cap, found on 32-bit keys (tl.topk of the keys alone, then the
# cap-th key's ties resolved by index), written unsorted; then rounds of tl.topk over chunks of
# BEST_CHUNK packed candidates until one chunk a row is left, whose topk is the sorted answer
# (in place of the int64 tile topk and log2(N / TILE) capped merges). H100, 256 rows of 32k fp32
# (bench/results/sort_variants_small_k.txt): k = 1 / 8 / 50 / 100 took 0.045 / 0.083 / 0.137 /
# 0.211 ms against the capped merges' 0.049 / 0.119 / 0.191 / 0.220; tiles of 1024 on 4 warps beat
# 2048-8192 on 4-16 warps at every k (0.16-0.31 ms at k = 50: cross-warp compare-and-swap stages).
BEST_OF_TILES = True
BEST_TILE = 1024
BEST_WARPS = 4
BEST_CHUNK = 2048  # a row's 6400 candidates (128k, k = 50) as 4 programs, not one of 8192
# tl.sort for 32-bit keys. The interpreter runs its compare-and-swap network element by element
# (seconds per tile), so there every tile is ranked instead; tests switch it on for one case.
PACKED_SORT = not INTERPRETER


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------
@triton.jit
def order_key(x, DESCENDING: tl.constexpr):
    """x -> int64 key whose signed order is x's sort order (NaN largest, -0 == +0); flipped when DESCENDING."""
    if x.dtype == tl.float64:
        f = tl.where(x == 0, 0.0, x)
        bits = f.to(tl.int64, bitcast=True)
        key = bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)
        key = tl.where(x != x, _INT64_MAX, key)
    elif x.dtype.is_floating():
        f = x.to(tl.float32)
        f = tl.where(f == 0, 0.0, f)
        bits = f.to(tl.int32, bitcast=True)
        key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)
        key = tl.where(f != f, 0x7FFFFFFF, key)
    else:
        key = x.to(tl.int64)
    if DESCENDING:
        key = ~key
    return key


# ---------------------------------------------------------------------------------------------
# Pass 1: sorted tiles (capped at CAP elements each)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_sort_kernel(x_ptr, key_ptr, index_ptr, M, N, L, stride_xm, stride_xn, DESCENDING: tl.constexpr,
                      ROWS: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, BEST: tl.constexpr):
    """Sort tile t of ROWS rows as packed (key << 32 | index) int64s -> each row's first CAP at [m, t * CAP].

    BEST < TILE: only the BEST (a power of two >= CAP, >= 2) smallest are needed: tl.topk's partial
    bitonic network instead of the full sort. index_ptr is unused (the index is the low 32 bits).
    """
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    tile = tl.program_id(1)
    cols = tile * TILE + tl.arange(0, TILE)
    live = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xn, mask=live, other=0)
    packed = (order_key(x, DESCENDING) << 32) | cols.to(tl.int64)[None, :]
    packed = tl.where(live, packed, _INT64_MAX)  # padding sorts after every real pair
    if BEST < TILE:
        packed = ~tl.topk(~packed, BEST, dim=1)  # the largest of ~packed, descending: the smallest, ascending
    else:
        packed = tl.sort(packed, 1)
    slots = tl.arange(0, BEST)
    keep = (rows < M)[:, None] & ((slots < CAP) & (tile * TILE + slots < N))[None, :]
    tl.store(key_ptr + rows[:, None] * L + tile * CAP + slots[None, :], packed, mask=keep)


@triton.jit
def _tile_rank_kernel(x_ptr, key_ptr, index_ptr, M, N, L, stride_xm, stride_xn,
                      DESCENDING: tl.constexpr, ROWS: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr):
    """Sort tile t of ROWS rows (any keys) by ranking: rank = number of smaller (key, index) pairs in the tile."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    tile = tl.program_id(1)
    cols = tile * TILE + tl.arange(0, TILE)
    live = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xn, mask=live, other=0)
    key = order_key(x, DESCENDING)
    # [ROWS, TILE (this element), TILE (the others)]
    smaller = (key[:, None, :] < key[:, :, None]) | ((key[:, None, :] == key[:, :, None]) &
                                                     (cols[None, None, :] < cols[None, :, None]))
    rank = tl.sum((smaller & live[:, None, :]).to(tl.int32), axis=2)
    keep = live & (rank < CAP)
    out = rows[:, None] * L + tile * CAP + rank
    tl.store(key_ptr + out, key, mask=keep)
    tl.store(index_ptr + out, cols.to(tl.int32)[None, :] + rank * 0, mask=keep)


# ---------------------------------------------------------------------------------------------
# Pass 2..: pairwise merges of sorted runs
# ---------------------------------------------------------------------------------------------
@triton.jit
def _merge_kernel(key_in, index_in, key_out, index_out, L_in, L_out, run_in, run_out, steps,
                  PACKED: tl.constexpr, BLOCK: tl.constexpr):
    """Merge runs 2r and 2r+1 (run_in long, the last may be shorter) of each row into run r (first run_out).

    PACKED: key holds key << 32 | index (one int64 compare and one array); else (key, index) pairs."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = p < L_in
    base_in = row * L_in
    key = tl.load(key_in + base_in + p, mask=live, other=0)
    if not PACKED:
        index = tl.load(index_in + base_in + p, mask=live, other=0)
    run = p // run_in
    partner = tl.minimum((run ^ 1) * run_in, L_in)
    lo = partner
    hi = tl.minimum(partner + run_in, L_in)
    for _ in range(steps):  # lower bound of (key, index) in the partner run
        active = lo < hi
        mid = (lo + hi) // 2
        mid_key = tl.load(key_in + base_in + mid, mask=live & active, other=0)
        if PACKED:
            smaller = mid_key < key
        else:
            mid_index = tl.load(index_in + base_in + mid, mask=live & active, other=0)
            smaller = (mid_key < key) | ((mid_key == key) & (mid_index < index))
        lo = tl.where(active & smaller, mid + 1, lo)
        hi = tl.where(active & ~smaller, mid, hi)
    slot = p - run * run_in + (lo - partner)
    keep = live & (slot < run_out)
    out = row * L_out + (run // 2) * run_out + slot
    tl.store(key_out + out, key, mask=keep)
    if not PACKED:
        tl.store(index_out + out, index, mask=keep)


@triton.jit
def _merge_path(base_a, base_b, d, n_a, n_b, live, steps):
    """For output positions d of the merge of sorted runs A (n_a keys at base_a) and B (n_b at base_b): how many
    of the first d outputs come from A (the merge path's binary search, ``steps`` rounds of halving)."""
    lo = tl.maximum(d - n_b, 0)
    hi = tl.minimum(d, n_a)
    for _ in range(steps):
        active = live & (lo < hi)
        mid = (lo + hi) // 2
        ka = tl.load(base_a + mid, mask=active, other=0)
        kb = tl.load(base_b + (d - 1 - mid), mask=active, other=0)
        lo = tl.where(active & (ka < kb), mid + 1, lo)
        hi = tl.where(active & (ka >= kb), mid, hi)
    return lo


@triton.jit
def _merge_path_kernel(key_in, key_out, L_in, L_out, run_in, run_out, per_pair, per_row, steps,
                       BLOCK: tl.constexpr):
    """Packed (unique) keys: merge runs 2p and 2p+1 of a row; program b writes merged[d0, d0 + BLOCK) of pair p.

    Merge path: a(d), the number of run 2p's elements among the first d merged ones, is one binary
    search per block end (A[a] < B[d - 1 - a] flips once). The block's elements, A[a0:a1] ascending
    then B[b0:b1] reversed (padding between), are a bitonic sequence: tl.bitonic_merge sorts it in
    log2(BLOCK) compare-and-swap stages, on chip. Each element is read and written once per pass.
    """
    pid = tl.program_id(0)
    row = (pid // per_row).to(tl.int64)
    blk = pid % per_row
    pair = blk // per_pair
    d0 = (blk % per_pair) * BLOCK
    a_start = pair.to(tl.int64) * 2 * run_in
    n_a = tl.minimum(run_in, L_in - a_start)
    n_b = tl.minimum(tl.maximum(L_in - a_start - run_in, 0), run_in)
    n_out = tl.minimum(n_a + n_b, run_out)
    live = d0 < n_out
    d1 = tl.minimum(d0 + BLOCK, n_out)
    base_a = key_in + row * L_in + a_start
    base_b = base_a + run_in
    ends = tl.arange(0, 2)
    d = tl.where(ends == 0, d0, d1)
    lo = _merge_path(base_a, base_b, d, n_a, n_b, live, steps)
    a0 = tl.sum(tl.where(ends == 0, lo, 0), 0)
    a1 = tl.sum(tl.where(ends == 1, lo, 0), 0)
    n_from_a = a1 - a0
    n_from_b = (d1 - d0) - n_from_a
    j = tl.arange(0, BLOCK)
    from_a = live & (j < n_from_a)
    q = BLOCK - 1 - j  # B's q-th element sits at j = BLOCK - 1 - q: descending along j
    from_b = live & (j >= n_from_a) & (q < n_from_b)
    ka = tl.load(base_a + a0 + j, mask=from_a, other=0)
    kb = tl.load(base_b + (d0 - a0) + q, mask=from_b, other=0)
    x = tl.where(from_a, ka, tl.where(from_b, kb, _INT64_MAX))
    x = tl.bitonic_merge(x)
    tl.store(key_out + row * L_out + pair.to(tl.int64) * run_out + d0 + j, x, mask=live & (j < d1 - d0))


@triton.jit
def _merge_lanes_kernel(key_in, key_out, L_in, L_out, run_in, run_out, per_pair, per_row, steps,
                        LANES: tl.constexpr, SEQ: tl.constexpr):
    """Packed (unique) keys: merge runs 2p and 2p+1; each lane writes SEQ consecutive merged outputs.

    Merge path per lane (one binary search finds where its first output comes from), then SEQ
    steps each taking the smaller head of the two runs: about two cached loads per element
    instead of a search per element or a compare-and-swap network."""
    pid = tl.program_id(0)
    row = (pid // per_row).to(tl.int64)
    blk = pid % per_row
    pair = blk // per_pair
    a_start = pair.to(tl.int64) * 2 * run_in
    n_a = tl.minimum(run_in, L_in - a_start)
    n_b = tl.minimum(tl.maximum(L_in - a_start - run_in, 0), run_in)
    n_out = tl.minimum(n_a + n_b, run_out)
    d = (blk % per_pair).to(tl.int64) * (LANES * SEQ) + tl.arange(0, LANES) * SEQ
    live = d < n_out
    base_a = key_in + row * L_in + a_start
    base_b = base_a + run_in
    lo = _merge_path(base_a, base_b, d, n_a, n_b, live, steps)
    i = lo
    j = d - lo
    out = key_out + row * L_out + pair.to(tl.int64) * run_out + d
    for s in tl.static_range(SEQ):
        ka = tl.load(base_a + i, mask=live & (i < n_a), other=_INT64_MAX)
        kb = tl.load(base_b + j, mask=live & (j < n_b), other=_INT64_MAX)
        take_a = ka < kb
        tl.store(out + s, tl.where(take_a, ka, kb), mask=live & (d + s < n_out))
        i = tl.where(take_a, i + 1, i)
        j = tl.where(take_a, j, j + 1)


def _run_lengths(n: int, run: int, cap: int) -> int:
    """Stored row length after capping each run of `run` elements (the last may be shorter) at cap."""
    runs = cdiv(n, run)
    return (runs - 1) * min(run, cap) + min(n - (runs - 1) * run, cap)


def sorted_rows(x2: torch.Tensor, descending: bool, cap: int | None = None) -> torch.Tensor:
    """x2 [M, N] (any strides) -> each row's first min(N, cap) elements in sort order, [M, min(N, cap)]:
    int32 indices, or int64 packed key << 32 | index (for 32-bit keys on the GPU)."""
    M, N = x2.shape
    cap = N if cap is None else min(cap, N)
    packed = x2.dtype not in _WIDE_KEYS and PACKED_SORT
    if packed and TILE < N <= SELECT_MAX_N and SELECT_MIN_K <= cap <= min(SELECT_MAX_K, N - 1):
        if SELECT_ROW and M >= SELECT_ROW_MIN_M:
            return select_rows_each(x2, descending, cap)
        return select_rows(x2, descending, cap)
    if packed and BEST_OF_TILES and TILE < N and cap < SELECT_MIN_K:
        return best_rows(x2, descending, cap)
    tile = min(TILE if packed else RANK_TILE, triton.next_power_of_2(N))
    kept = min(tile, cap)
    L = _run_lengths(N, tile, kept)
    keys = torch.empty((M, L), dtype=torch.int64, device=x2.device)
    index = keys if packed else torch.empty((M, L), dtype=torch.int32, device=x2.device)
    # Short rows share a program (ROWS of them) so that a program sorts about TILE elements.
    rows = min((TILE // tile) if packed else (RANK_TILE**2 // tile**2), triton.next_power_of_2(M))
    common = dict(DESCENDING=bool(descending), ROWS=rows, TILE=tile, CAP=kept,
                  num_warps=TILE_WARPS or (8 if tile * rows >= 512 else 4))
    grid = (cdiv(M, rows), cdiv(N, tile))  # rows on axis 0: it takes 2**31 - 1 programs, axis 1 65535
    if packed:
        _tile_sort_kernel[grid](x2, keys, index, M, N, L, x2.stride(0), x2.stride(1),
                                BEST=min(max(2, triton.next_power_of_2(kept)), tile), **common)
    else:
        _tile_rank_kernel[grid](x2, keys, index, M, N, L, x2.stride(0), x2.stride(1), **common)
    run = kept
    while L > run:
        run_out = min(2 * run, cap)
        L_out = _run_lengths(L, 2 * run, run_out)
        keys2 = torch.empty((M, L_out), dtype=torch.int64, device=x2.device)
        index2 = keys2 if packed else torch.empty((M, L_out), dtype=torch.int32, device=x2.device)
        if packed and MERGE == "lanes":
            lanes = min(MERGE_BLOCK // MERGE_SEQ, triton.next_power_of_2(cdiv(run_out, MERGE_SEQ)))
            per_pair = cdiv(run_out, lanes * MERGE_SEQ)
            per_row = cdiv(L, 2 * run) * per_pair
            _merge_lanes_kernel[(M * per_row,)](keys, keys2, L, L_out, run, run_out, per_pair, per_row,
                                                (run + 1).bit_length(), LANES=lanes, SEQ=MERGE_SEQ,
                                                num_warps=4 if lanes >= 128 else 1)
        elif packed and MERGE == "bitonic":
            block = min(MERGE_BLOCK, max(2, triton.next_power_of_2(run_out)))  # bitonic_merge needs 2+
            per_pair = cdiv(run_out, block)
            per_row = cdiv(L, 2 * run) * per_pair
            _merge_path_kernel[(M * per_row,)](keys, keys2, L, L_out, run, run_out, per_pair, per_row,
                                               (run + 1).bit_length(), BLOCK=block, num_warps=8 if block >= 2048 else 4)
        else:
            _merge_kernel[(M, cdiv(L, BLOCK))](keys, index, keys2, index2, L, L_out, run, run_out, run.bit_length(),
                                               PACKED=packed, BLOCK=BLOCK, num_warps=4)
        keys, index, L, run = keys2, index2, L_out, run_out
    return keys if packed else index


# ---------------------------------------------------------------------------------------------
# Small k: the best of each tile, then of chunks of candidates
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_best_kernel(x_ptr, out_ptr, N, L, stride_xm, stride_xn, DESCENDING: tl.constexpr, TILE: tl.constexpr,
                      CAP: tl.constexpr, BEST: tl.constexpr):
    """Tile t of row m -> its min(CAP, live) smallest (key, index) as packed key << 32 | index at
    out[m, t * CAP:], in index order (not sorted). BEST: a power of two >= CAP, >= 2.

    The keys fit 32 bits, so tl.topk runs on them alone (half the registers and shuffles of packed
    int64s); the CAP-th smallest key k_c then picks the keys below it and, of those equal to it,
    the lowest indices (the packed order's tie rule)."""
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    cols = tile * TILE + tl.arange(0, TILE)
    live = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols.to(tl.int64) * stride_xn, mask=live, other=0)
    key = order_key(x, DESCENDING).to(tl.int32)
    key = tl.where(live, key, 2**31 - 1)  # padding: never below k_c, and dropped by `live` when equal
    best = ~tl.topk(~key, BEST)  # the BEST smallest keys, ascending
    k_c = tl.max(tl.where(tl.arange(0, BEST) == CAP - 1, best, -2**31), 0)
    below = live & (key < k_c)
    tied = live & (key == k_c)
    keep = below | (tied & (tl.cumsum(tied.to(tl.int32), 0) <= CAP - tl.sum(below.to(tl.int32), 0)))
    slot = tl.cumsum(keep.to(tl.int32), 0) - 1
    packed = (key.to(tl.int64) << 32) | cols.to(tl.int64)
    tl.store(out_ptr + row * L + tile * CAP + slot, packed, mask=keep)


@triton.jit
def _chunk_best_kernel(key_in, key_out, L_in, L_out, CHUNK: tl.constexpr, CAP: tl.constexpr, BEST: tl.constexpr):
    """Chunk c of row m's packed candidates -> its min(CAP, live) smallest, ascending, at key_out[m, c * CAP:]."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    j = chunk * CHUNK + tl.arange(0, CHUNK)
    packed = tl.load(key_in + row * L_in + j, mask=j < L_in, other=_INT64_MAX)
    best = ~tl.topk(~packed, BEST)
    slots = tl.arange(0, BEST)
    tl.store(key_out + row * L_out + chunk * CAP + slots, best, mask=(slots < CAP) & (chunk * CAP + slots < L_out))


def best_rows(x2: torch.Tensor, descending: bool, cap: int) -> torch.Tensor:
    """x2 [M, N] (32-bit keys or narrower) -> packed key << 32 | index [M, min(N, cap)]: each row's first cap
    in sort order (ties: lowest index first), for small cap."""
    M, N = x2.shape
    cap = min(cap, N)
    best = max(2, triton.next_power_of_2(cap))
    tile = max(best, min(BEST_TILE, triton.next_power_of_2(N)))
    L = _run_lengths(N, tile, cap)
    keys = torch.empty((M, L), dtype=torch.int64, device=x2.device)
    _tile_best_kernel[(M, cdiv(N, tile))](x2, keys, N, L, x2.stride(0), x2.stride(1), DESCENDING=bool(descending),
                                          TILE=tile, CAP=cap, BEST=best, num_warps=BEST_WARPS)
    while True:  # at least one round: the tiles' picks are unsorted
        chunk = max(2 * best, min(BEST_CHUNK, triton.next_power_of_2(L)))  # halves L at least: it ends
        L_out = _run_lengths(L, chunk, cap)
        out = torch.empty((M, L_out), dtype=torch.int64, device=x2.device)
        _chunk_best_kernel[(M, cdiv(L, chunk))](keys, out, L, L_out, CHUNK=chunk, CAP=cap, BEST=best,
                                                num_warps=8 if chunk >= 4096 else 4)
        keys, L = out, L_out
        if L == cap:
            return keys


# ---------------------------------------------------------------------------------------------
# Radix sort: whole rows of 32-bit keys (or narrower), least significant digit first
# ---------------------------------------------------------------------------------------------
@triton.jit
def _radix_load(x_ptr, key_ptr, row, cols, live, N, stride_xm, stride_xn, DESCENDING: tl.constexpr,
                FIRST: tl.constexpr):
    """The keys at cols as int64 (key << 32 | index), key a uint32 in sort order: from x in the first
    pass, else from the previous pass's output."""
    if FIRST:
        x = tl.load(x_ptr + row * stride_xm + cols.to(tl.int64) * stride_xn, mask=live, other=0)
        key = (order_key(x, DESCENDING) + 2**31).to(tl.uint32).to(tl.int64)
        packed = (key << 32) | cols.to(tl.int64)
    else:
        packed = tl.load(key_ptr + row * N + cols, mask=live, other=0)
    return packed


@triton.jit
def _radix_digit(packed, SHIFT, BITS: tl.constexpr):
    """Digit bits 32 + SHIFT.. of the packed key (int32). The top digit's sign-extended bits keep its order."""
    return ((packed >> (SHIFT + 32)) & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def _radix_hist_kernel(x_ptr, key_ptr, hist_ptr, N, tiles, stride_xm, stride_xn, SHIFT, DESCENDING: tl.constexpr,
                       FIRST: tl.constexpr, BITS: tl.constexpr, TILE: tl.constexpr):
    """hist[row, tile, b] = how many of the tile's keys have digit b (SHIFT: a run-time argument, so one
    compilation serves every middle pass)."""
    pid = tl.program_id(0)
    row = (pid // tiles).to(tl.int64)
    cols = (pid % tiles) * TILE + tl.arange(0, TILE)
    live = cols < N
    digit = _radix_digit(_radix_load(x_ptr, key_ptr, row, cols, live, N, stride_xm, stride_xn, DESCENDING, FIRST),
                         SHIFT, BITS)
    NB: tl.constexpr = 1 << BITS
    tl.store(hist_ptr + pid.to(tl.int64) * NB + tl.arange(0, NB), tl.histogram(digit, NB, mask=live))


@triton.jit
def _radix_offsets_kernel(hist_ptr, tiles, NB: tl.constexpr, CHUNK: tl.constexpr):
    """In place, per row: hist[row, t, b] -> where tile t's first key of digit b goes in the row's output
    (the row's keys of smaller digits, plus digit b's keys in the tiles before t)."""
    base = hist_ptr + tl.program_id(0).to(tl.int64) * tiles * NB
    t = tl.arange(0, CHUNK)
    b = tl.arange(0, NB)
    total = tl.zeros([NB], tl.int32)
    for c in range(0, tiles, CHUNK):
        m = ((c + t) < tiles)[:, None] & (b < NB)[None, :]
        total += tl.sum(tl.load(base + (c + t)[:, None] * NB + b[None, :], mask=m, other=0), 0).to(tl.int32)
    carry = tl.cumsum(total, 0) - total
    for c in range(0, tiles, CHUNK):
        m = ((c + t) < tiles)[:, None] & (b < NB)[None, :]
        h = tl.load(base + (c + t)[:, None] * NB + b[None, :], mask=m, other=0)
        tl.store(base + (c + t)[:, None] * NB + b[None, :], tl.cumsum(h, 0) - h + carry[None, :], mask=m)
        carry += tl.sum(h, 0).to(tl.int32)


@triton.jit
def _radix_scatter_kernel(x_ptr, key_in, key_out, values_ptr, index_out, hist_ptr, N, tiles, stride_xm, stride_xn,
                          SHIFT, DESCENDING: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
                          BITS: tl.constexpr, TILE: tl.constexpr, SUB: tl.constexpr, LOG_SUB: tl.constexpr):
    """One stable counting pass over a tile, SUB keys a step: the step's keys are put in (digit, position)
    order on chip (tl.sort of digit << LOG_SUB | position, then tl.gather), so that neighbouring lanes
    store to neighbouring addresses: the digit's offset for this tile, plus the counts of the steps
    before, plus the key's place among the step's keys of its digit. LAST writes x's values and int64
    indices instead of the packed keys.

    (Storing each key straight from its lane, one 4-byte store per lane to 2^BITS places, took ~0.45 ms
    a pass on 8M keys: the stores were as many L2 requests as keys.)"""
    pid = tl.program_id(0)
    row = (pid // tiles).to(tl.int64)
    NB: tl.constexpr = 1 << BITS
    bins = tl.arange(0, NB)
    j = tl.arange(0, SUB)
    offset = tl.load(hist_ptr + pid.to(tl.int64) * NB + bins)  # where the tile's keys of each digit start
    for s in range(TILE // SUB):
        cols = (pid % tiles) * TILE + s * SUB + j
        live = cols < N
        packed = _radix_load(x_ptr, key_in, row, cols, live, N, stride_xm, stride_xn, DESCENDING, FIRST)
        digit = tl.where(live, _radix_digit(packed, SHIFT, BITS), NB)  # padding sorts after every digit
        order = tl.sort((digit << LOG_SUB) | j)
        counts = tl.histogram(digit, NB, mask=live)
        start = offset - (tl.cumsum(counts, 0) - counts)  # minus where the step's run of each digit starts
        offset += counts
        sorted_digit = order >> LOG_SUB
        keep = sorted_digit < NB
        dest = row * N + tl.gather(start, tl.minimum(sorted_digit, NB - 1), 0) + j
        moved = tl.gather(packed, order & (SUB - 1), 0)
        if LAST:
            index = moved & 0xFFFFFFFF
            tl.store(values_ptr + dest, tl.load(x_ptr + row * stride_xm + index * stride_xn, mask=keep), mask=keep)
            tl.store(index_out + dest, index, mask=keep)
        else:
            tl.store(key_out + dest, moved, mask=keep)


def radix_sort_rows(x2: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x2 [M, N] (32-bit keys or narrower, any strides) -> (values like x2, int64 indices), each row sorted, stable.

    cdiv(32, RADIX_BITS) passes from the lowest digit up over key << 32 | index int64s; each counts its
    digit per tile of RADIX_TILE (hist), turns the counts into offsets (one program per row) and moves
    every key once (scatter): stable within a tile by the (digit, position) order, across tiles by the
    offsets, so equal keys keep their input order (torch's stable sort; descending flips the key's bits)."""
    M, N = x2.shape
    dev = x2.device
    tiles = cdiv(N, RADIX_TILE)
    nb = 1 << RADIX_BITS
    passes = cdiv(32, RADIX_BITS)
    sub = min(RADIX_SUB, RADIX_TILE)
    hist = torch.empty((M * tiles * nb,), dtype=torch.int32, device=dev)
    keys = [torch.empty((M, N), dtype=torch.int64, device=dev) for _ in range(2)]
    values = torch.empty((M, N), dtype=x2.dtype, device=dev)
    indices = torch.empty((M, N), dtype=torch.int64, device=dev)
    if M * N == 0:
        return values, indices
    strides = (x2.stride(0), x2.stride(1))
    for p in range(passes):
        src, dst = keys[p % 2], keys[(p + 1) % 2]
        common = dict(DESCENDING=bool(descending), FIRST=p == 0, BITS=RADIX_BITS, TILE=RADIX_TILE)
        shift = p * RADIX_BITS
        _radix_hist_kernel[(M * tiles,)](x2, src, hist, N, tiles, *strides, shift, **common, num_warps=4)
        chunk = min(RADIX_CHUNK, triton.next_power_of_2(tiles))
        _radix_offsets_kernel[(M,)](hist, tiles, NB=nb, CHUNK=chunk, num_warps=4)
        _radix_scatter_kernel[(M * tiles,)](x2, src, dst, values, indices, hist, N, tiles, *strides, shift,
                                            LAST=p == passes - 1, SUB=sub, LOG_SUB=sub.bit_length() - 1, **common,
                                            num_warps=RADIX_WARPS)
    return values, indices


# ---------------------------------------------------------------------------------------------
# Radix select: the first k of a long row without sorting it
# ---------------------------------------------------------------------------------------------
@triton.jit
def _combined_key(x, cols, DESCENDING: tl.constexpr, IB: tl.constexpr):
    """(order key + 2^31) << IB | column: non-negative, unique per element of a row, in sort order."""
    return ((order_key(x, DESCENDING) + 2**31) << IB) | cols


@triton.jit
def _select_pass_kernel(x_ptr, hist_ptr, ticket_ptr, state_ptr, M, N, k, G, span, chunks, stride_xm, stride_xn,
                        DESCENDING: tl.constexpr, IB: tl.constexpr, PASS: tl.constexpr, ATOMIC: tl.constexpr,
                        BLOCK: tl.constexpr):
    """Digit PASS (8 bits from the top) of the row's elements under the prefix chosen so far -> the next choice.

    Program (row, part) counts its span of the row (chunks of BLOCK) into hist[PASS, row]; the row's
    last program to arrive (a ticket) reads the finished histogram and writes the row's state after
    this pass, state[PASS, row] = (prefix, bits fixed, k still needed, done): the next pass reads it
    once instead of every program replaying the earlier choices. done: the chosen bin holds exactly
    the count still needed, so every element under the prefix is among the k and later passes read
    nothing."""
    pid = tl.program_id(0)
    row = (pid // G).to(tl.int64)
    part = pid % G
    if PASS == 0:
        prefix = row * 0
        bits = row * 0
        k_rem = row * 0 + k
        done = row * 0
    else:
        st = state_ptr + ((PASS - 1) * M + row) * 4
        prefix = tl.load(st)
        bits = tl.load(st + 1)
        k_rem = tl.load(st + 2)
        done = tl.load(st + 3)
    TOP: tl.constexpr = 32 + IB - 8 * PASS
    hist_row = hist_ptr + (PASS * M + row) * 256
    bins = tl.arange(0, 256)
    h = tl.zeros([256], tl.int32)
    start = part.to(tl.int64) * span
    end = tl.minimum(start + span, N)
    for i in range(chunks):
        cols = start + i * BLOCK + tl.arange(0, BLOCK)
        live = (cols < end) & (done == 0)  # a finished row reads nothing
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=live, other=0)
        c = _combined_key(x, cols, DESCENDING, IB)
        match = live & ((c >> TOP) == prefix)
        digit = ((c >> (TOP - 8)) & 255).to(tl.int32)
        if ATOMIC:  # the few elements under a prefix: one atomic each (tl.histogram costs the same masked or not)
            tl.atomic_add(hist_row + digit, tl.full(digit.shape, 1, tl.int32), mask=match, sem="relaxed")
        else:
            h += tl.histogram(digit, 256, mask=match)
    if not ATOMIC:
        tl.atomic_add(hist_row + bins, h, mask=h > 0, sem="relaxed")
    tl.debug_barrier()  # every thread's counts are issued before the release below
    ticket = tl.atomic_add(ticket_ptr + PASS * M + row, 1, sem="acq_rel")
    if ticket == G - 1:
        # .cg: the other programs' counts from L2, never from a stale L1 line
        total = tl.load(hist_row + bins, cache_modifier=".cg")
        b = tl.sum((tl.cumsum(total, 0) < k_rem).to(tl.int64), 0)  # the bin holding the k_rem-th element
        below = tl.sum(tl.where(bins < b, total, 0).to(tl.int64), 0)
        at = tl.sum(tl.where(bins == b, total, 0).to(tl.int64), 0)
        open_row = done == 0
        left = tl.where(open_row, k_rem - below, k_rem)
        out = state_ptr + (PASS * M + row) * 4
        tl.store(out, tl.where(open_row, prefix * 256 + b, prefix))
        tl.store(out + 1, tl.where(open_row, bits + 8, bits))
        tl.store(out + 2, left)
        tl.store(out + 3, tl.where(open_row & (at == left), 1, done))


@triton.jit
def _select_take_kernel(x_ptr, state_ptr, count_ptr, order_ptr, M, N, k, G, span, chunks, stride_xm, stride_xn,
                        DESCENDING: tl.constexpr, IB: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    """Write the row's k selected elements as packed key << 32 | index, in any order, to order[m, :k]."""
    pid = tl.program_id(0)
    row = (pid // G).to(tl.int64)
    part = pid % G
    st = state_ptr + ((PASSES - 1) * M + row) * 4
    prefix = tl.load(st)
    shift = 32 + IB - tl.load(st + 1)
    start = part.to(tl.int64) * span
    end = tl.minimum(start + span, N)
    for i in range(chunks):
        cols = start + i * BLOCK + tl.arange(0, BLOCK)
        live = cols < end
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=live, other=0)
        c = _combined_key(x, cols, DESCENDING, IB)
        take = live & ((c >> shift) <= prefix)
        flags = take.to(tl.int32)
        # this chunk's slots (any order: the sort after restores it)
        first = tl.atomic_add(count_ptr + row, tl.sum(flags, 0), sem="relaxed")
        slot = first + tl.cumsum(flags, 0) - 1
        tl.store(order_ptr + row * k + slot, (((c >> IB) - 2**31) << 32) | cols, mask=take)


@triton.jit
def _sort_rows_kernel(key_ptr, K, KP: tl.constexpr):
    """Sort each row of K packed keys in place (one program per row, KP >= K a power of two)."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KP)
    v = tl.load(key_ptr + row * K + j, mask=j < K, other=_INT64_MAX)
    tl.store(key_ptr + row * K + j, tl.sort(v), mask=j < K)


def select_rows(x2: torch.Tensor, descending: bool, k: int) -> torch.Tensor:
    """x2 [M, N] (32-bit keys or narrower) -> packed key << 32 | index [M, k]: each row's first k in sort order.

    Digit passes over (key, index) as one (32 + IB)-bit number, 8 bits a pass from the top; the
    index's bits make every element distinct (ties: lowest index first) and cost a pass only when
    the key's bits leave a tie at the k-th place (a finished row's later passes read nothing). A
    row gets G programs (about SELECT_PROGRAMS in all), each looping over its span."""
    M, N = x2.shape
    ib = 8 * cdiv(max(1, (N - 1).bit_length()), 8)
    passes = (32 + ib) // 8
    G = max(1, min(cdiv(SELECT_PROGRAMS, M), cdiv(N, SELECT_BLOCK)))
    span = cdiv(cdiv(N, G), SELECT_BLOCK) * SELECT_BLOCK
    G = cdiv(N, span)
    # One zeroed buffer: histograms [passes, M, 256], tickets [passes, M], slot counters [M].
    counters = torch.zeros(passes * M * 257 + M, dtype=torch.int32, device=x2.device)
    hist, tickets = counters[:passes * M * 256], counters[passes * M * 256:passes * M * 257]
    count = counters[passes * M * 257:]
    state = torch.empty((passes, M, 4), dtype=torch.int64, device=x2.device)
    order = torch.empty((M, k), dtype=torch.int64, device=x2.device)
    args = (M, N, k, G, span, span // SELECT_BLOCK, x2.stride(0), x2.stride(1))
    for p in range(passes):
        _select_pass_kernel[(M * G,)](x2, hist, tickets, state, *args, DESCENDING=bool(descending), IB=ib, PASS=p,
                                      ATOMIC=p > 0 and SELECT_ATOMIC_PASSES, BLOCK=SELECT_BLOCK, num_warps=SELECT_WARPS)
    _select_take_kernel[(M * G,)](x2, state, count, order, *args, DESCENDING=bool(descending), IB=ib,
                                  PASSES=passes, BLOCK=SELECT_BLOCK, num_warps=SELECT_WARPS)
    kp = triton.next_power_of_2(k)
    _sort_rows_kernel[(M,)](order, k, KP=kp, num_warps=8 if kp >= 1024 else 4)
    return order


@triton.jit
def _select_row_kernel(x_ptr, order_ptr, N, k, chunks, stride_xm, stride_xn, DESCENDING: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Row m's first k in sort order -> packed key << 32 | index at order[m, :k], in index order.

    One program a row, so its histograms stay in registers and the passes need no atomics, tickets
    or state in memory: up to four passes count 8-bit digits of the 32-bit key (as an unsigned u,
    from the top) over the elements whose higher digits equal the prefix chosen so far, stopping once
    the chosen bin holds exactly the count still needed; a last pass takes every element below the
    prefix and, of those equal to it, the first by index (the row is walked in order, so ties need
    no index digits). Each loop loads its next chunk before counting this one."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_xm
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    prefix = tl.zeros((), tl.int64)  # the chosen digits, as a number of `bits` bits
    bits = tl.zeros((), tl.int32)
    k_rem = tl.zeros((), tl.int32) + k
    done = tl.zeros((), tl.int32)
    for p in tl.static_range(4):
        h = tl.zeros([256], tl.int32)
        steps = tl.where(done == 0, chunks, 0)
        nxt = tl.load(base + offs.to(tl.int64) * stride_xn, mask=(offs < N) & (steps > 0), other=0)
        for i in range(steps):
            cols = i * BLOCK + offs
            live = cols < N
            x = nxt
            ahead = cols + BLOCK
            nxt = tl.load(base + ahead.to(tl.int64) * stride_xn, mask=(ahead < N) & (i + 1 < steps), other=0)
            u = order_key(x, DESCENDING).to(tl.int32).to(tl.uint32, bitcast=True) ^ _SIGN32
            digit = ((u >> (24 - 8 * p)) & 255).to(tl.int32)
            if p == 0:
                match = live
            else:
                match = live & ((u >> (32 - 8 * p)) == prefix.to(tl.uint32))
            h += tl.histogram(digit, 256, mask=match)
        b = tl.sum((tl.cumsum(h, 0) < k_rem).to(tl.int32), 0)  # the bin holding the k_rem-th element
        below = tl.sum(tl.where(bins < b, h, 0), 0)
        at = tl.sum(tl.where(bins == b, h, 0), 0)
        open_row = done == 0
        prefix = tl.where(open_row, prefix * 256 + b, prefix)
        bits = tl.where(open_row, bits + 8, bits)
        left = tl.where(open_row, k_rem - below, k_rem)
        done = tl.where(open_row & (at == left), 1, done)
        k_rem = left
    # Take: below the prefix, or at it and among the first k_rem of those (index order); when the
    # select stopped early every element at the prefix is taken.
    shift = (32 - bits).to(tl.uint32)
    top_k = prefix.to(tl.uint32)
    taken = tl.zeros((), tl.int32)
    tied = tl.zeros((), tl.int32)
    nxt = tl.load(base + offs.to(tl.int64) * stride_xn, mask=offs < N, other=0)
    for i in range(chunks):
        cols = i * BLOCK + offs
        live = cols < N
        x = nxt
        ahead = cols + BLOCK
        nxt = tl.load(base + ahead.to(tl.int64) * stride_xn, mask=(ahead < N) & (i + 1 < chunks), other=0)
        key = order_key(x, DESCENDING).to(tl.int32)
        top = (key.to(tl.uint32, bitcast=True) ^ _SIGN32) >> shift
        level = live & (top == top_k)
        take = (live & (top < top_k)) | (level & (tied + tl.cumsum(level.to(tl.int32), 0) <= k_rem))
        slot = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(order_ptr + row * k + slot, (key.to(tl.int64) << 32) | cols, mask=take)
        taken += tl.sum(take.to(tl.int32), 0)
        tied += tl.sum(level.to(tl.int32), 0)


def select_rows_each(x2: torch.Tensor, descending: bool, k: int) -> torch.Tensor:
    """x2 [M, N] (32-bit keys or narrower) -> packed key << 32 | index [M, k]: each row's first k in sort
    order (ties: lowest index first), one program a row (SELECT_ROW)."""
    M, N = x2.shape
    order = torch.empty((M, k), dtype=torch.int64, device=x2.device)
    block = min(SELECT_ROW_BLOCK, triton.next_power_of_2(N))
    _select_row_kernel[(M,)](x2, order, N, k, cdiv(N, block), x2.stride(0), x2.stride(1),
                             DESCENDING=bool(descending), BLOCK=block, num_warps=SELECT_ROW_WARPS)
    kp = triton.next_power_of_2(k)
    _sort_rows_kernel[(M,)](order, k, KP=kp, num_warps=8 if kp >= 1024 else 4)
    return order


# ---------------------------------------------------------------------------------------------
# Gathering the result, scattering a gradient
# ---------------------------------------------------------------------------------------------
@triton.jit
def _gather_kernel(x_ptr, order_ptr, pos_ptr, values_ptr, indices_ptr, M, K, L, stride_xm, stride_xn,
                   PER_ROW: tl.constexpr, PACKED: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """values[m, j] = x[m, order[m, j]], indices[m, j] = order[m, j] (j < K); PER_ROW: order[m, pos[m]] (K = 1)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = (rows < M)[:, None] & (j < K)[None, :]
    if PER_ROW:
        at = tl.load(pos_ptr + rows, mask=rows < M, other=0)[:, None] + j[None, :] * 0
    else:
        at = j[None, :] + rows[:, None] * 0
    index = tl.load(order_ptr + rows[:, None] * L + at, mask=live, other=0).to(tl.int64)
    if PACKED:  # key << 32 | index: the low 32 bits
        index = index - ((index >> 32) << 32)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + index * stride_xn, mask=live)
    out = rows[:, None] * K + j[None, :]
    tl.store(values_ptr + out, x, mask=live)
    tl.store(indices_ptr + out, index, mask=live)


def _gather(x2: torch.Tensor, order: torch.Tensor, k: int, pos: torch.Tensor | None = None):
    """(values [M, k], int64 indices [M, k]): the first k of order (sorted_rows'), or the one at pos[m] (k = 1)."""
    M = x2.shape[0]
    values = torch.empty((M, k), dtype=x2.dtype, device=x2.device)
    indices = torch.empty((M, k), dtype=torch.int64, device=x2.device)
    if M and k:
        block = min(BLOCK, triton.next_power_of_2(k))
        rows = min(BLOCK // block, triton.next_power_of_2(M))
        _gather_kernel[(cdiv(M, rows), cdiv(k, block))](
            x2, order, pos if pos is not None else order, values, indices, M, k, order.shape[1], x2.stride(0),
            x2.stride(1), PER_ROW=pos is not None, PACKED=order.dtype == torch.int64, ROWS=rows, BLOCK=block)
    return values, indices


@triton.jit
def _place_kernel(g_ptr, index_ptr, out_ptr, K, N, BLOCK: tl.constexpr):
    """out[m, index[m, j]] = g[m, j]: indices of a row are distinct (a sort's), so plain stores suffice."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = j < K
    g = tl.load(g_ptr + row * K + j, mask=live)
    index = tl.load(index_ptr + row * K + j, mask=live, other=0)
    tl.store(out_ptr + row * N + index, g, mask=live)


def place(g: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """g [M, K], index int64 [M, K] (distinct per row, in [0, n)) -> out [M, n]: g at index, zeros elsewhere."""
    M, K = g.shape
    out = torch.zeros((M, n), dtype=g.dtype, device=g.device)
    if M and K:
        _place_kernel[(M, cdiv(K, BLOCK))](g.contiguous(), index.contiguous(), out, K, n,
                                           BLOCK=min(BLOCK, triton.next_power_of_2(K)))
    return out


# ---------------------------------------------------------------------------------------------
# The ops along a dim (rows = the dim moved last)
# ---------------------------------------------------------------------------------------------
def _rows(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """x with dim moved last, viewed (or copied) as [M, N]; and the moved shape without its last dim."""
    if x.dim() == 0:
        return x.reshape(1, 1), ()
    moved = x.movedim(dim, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1]), tuple(moved.shape[:-1])


def _unrows(t: torch.Tensor, lead: tuple[int, ...], dim: int, ndim: int) -> torch.Tensor:
    if ndim == 0:
        return t.reshape(())
    return t.reshape(*lead, t.shape[-1]).movedim(-1, dim)


def _select(x: torch.Tensor, dim: int, k: int, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x2, lead = _rows(x, dim)
    if RADIX_SORT and k == x2.shape[1] >= RADIX_MIN_N and x2.dtype not in _WIDE_KEYS:
        values, indices = radix_sort_rows(x2, descending)
        return _unrows(values, lead, dim, x.dim()), _unrows(indices, lead, dim, x.dim())
    if x2.numel() and k:
        order = sorted_rows(x2, descending, cap=k)
    else:
        order = torch.empty((x2.shape[0], 0), dtype=torch.int32, device=x.device)
    values, indices = _gather(x2, order, k)
    return _unrows(values, lead, dim, x.dim()), _unrows(indices, lead, dim, x.dim())


def sort(x: torch.Tensor, *, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort along dim -> (values like x, int64 indices); NaN sorts as the largest value."""
    n = x.shape[dim] if x.dim() else 1
    return _select(x, dim, n, descending)


def topk(x: torch.Tensor, k: int, *, dim: int = -1, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest (smallest) along dim, in order -> (values, int64 indices) with dim of size k."""
    return _select(x, dim, k, largest)


def _pick(x: torch.Tensor, dim: int, keepdim: bool, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-th smallest (1-based) along dim, or the lower median with NaN propagated (k None)."""
    x2, lead = _rows(x, dim)
    M, N = x2.shape
    if k is None:
        # A row with NaNs has its median at its first NaN (they sort last); else at (N - 1) // 2.
        order = sorted_rows(x2, False)
        nan_count = _count_nan_rows(x2)
        pos = _median_positions(nan_count, N)
        values, indices = _gather(x2, order, 1, pos)
    else:
        order = sorted_rows(x2, False, cap=k)
        pos = torch.empty((M,), dtype=torch.int64, device=x.device).fill_(k - 1)
        values, indices = _gather(x2, order, 1, pos)
    values, indices = _unrows(values, lead, dim, x.dim()), _unrows(indices, lead, dim, x.dim())
    if not keepdim and x.dim():
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@triton.jit
def _median_position_kernel(nan_ptr, pos_ptr, M, N, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < M
    nans = tl.load(nan_ptr + rows, mask=live, other=0)
    tl.store(pos_ptr + rows, tl.where(nans > 0, N - nans, (N - 1) // 2), mask=live)


def _count_nan_rows(x2: torch.Tensor) -> torch.Tensor:
    from ge2.kernels import reduction  # the reductions' NaN count over each row

    if not x2.dtype.is_floating_point:
        return torch.zeros(x2.shape[0], dtype=torch.int64, device=x2.device)
    return reduction.count_nan(x2, dims=1)


def _median_positions(nan_count: torch.Tensor, N: int) -> torch.Tensor:
    M = nan_count.shape[0]
    pos = torch.empty(M, dtype=torch.int64, device=nan_count.device)
    if M:
        _median_position_kernel[(cdiv(M, BLOCK),)](nan_count, pos, M, N, BLOCK=BLOCK)
    return pos


def kthvalue(x: torch.Tensor, k: int, *, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-th smallest element along dim (1-based) -> (values, int64 indices)."""
    return _pick(x, dim, keepdim, k)


def median(x: torch.Tensor, *, dim: int | None = None, keepdim: bool = False):
    """Lower median along dim -> (values, int64 indices); dim None: of all elements -> values only (0-d)."""
    if dim is None:
        return _pick(x.reshape(-1), 0, False, None)[0]
    return _pick(x, dim, keepdim, None)


# ---------------------------------------------------------------------------------------------
# unique
# ---------------------------------------------------------------------------------------------
@triton.jit
def _run_starts_kernel(v_ptr, flag_ptr, N, BLOCK: tl.constexpr):
    """flag[i] = 1 where sorted v[i] starts a new value (i = 0, or v[i] != v[i - 1]; NaNs never equal)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < N
    v = tl.load(v_ptr + i, mask=live)
    prev = tl.load(v_ptr + i - 1, mask=live & (i > 0))
    tl.store(flag_ptr + i, ((i == 0) | (v != prev)).to(tl.int64), mask=live)


@triton.jit
def _unique_kernel(v_ptr, order_ptr, group_ptr, flag_ptr, values_ptr, inverse_ptr, start_ptr, N, BLOCK: tl.constexpr):
    """values[group[i]] = v[i] and start[group[i]] = i where a value starts; inverse[order[i]] = group[i]."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < N
    group = tl.load(group_ptr + i, mask=live, other=0) - 1
    first = live & (tl.load(flag_ptr + i, mask=live, other=0) != 0)
    tl.store(values_ptr + group, tl.load(v_ptr + i, mask=live), mask=first)
    tl.store(start_ptr + group, i, mask=first)
    tl.store(inverse_ptr + tl.load(order_ptr + i, mask=live, other=0), group, mask=live)


@triton.jit
def _counts_kernel(start_ptr, counts_ptr, U, BLOCK: tl.constexpr):
    g = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = g < U
    tl.store(counts_ptr + g, tl.load(start_ptr + g + 1, mask=live) - tl.load(start_ptr + g, mask=live), mask=live)


def unique(x: torch.Tensor, *, return_inverse: bool = False, return_counts: bool = False):
    """Sorted distinct values of x (flattened) -> (values [U], inverse like x | None, counts [U] | None).

    U is read back to the host (one sync): the output's size depends on the data."""
    flat = x.reshape(1, -1)
    N = flat.shape[1]
    if N == 0:
        empty = torch.empty(0, dtype=torch.int64, device=x.device)
        return (torch.empty(0, dtype=x.dtype, device=x.device), empty.reshape(x.shape) if return_inverse else None,
                empty if return_counts else None)
    order = sorted_rows(flat, False)
    v, order64 = _gather(flat, order, N)
    v, order64 = v.reshape(N), order64.reshape(N)
    flags = torch.empty(N, dtype=torch.int64, device=x.device)
    grid = (cdiv(N, BLOCK),)
    _run_starts_kernel[grid](v, flags, N, BLOCK=BLOCK)
    group = scan_kernels.scan(flags, dim=0, op="sum")
    U = int(group[N - 1].item())  # the documented host sync
    values = torch.empty(U, dtype=x.dtype, device=x.device)
    inverse = torch.empty(N, dtype=torch.int64, device=x.device)
    start = torch.empty((U + 1,), dtype=torch.int64, device=x.device).fill_(N)
    _unique_kernel[grid](v, order64, group, flags, values, inverse, start, N, BLOCK=BLOCK)
    counts = None
    if return_counts:
        counts = torch.empty(U, dtype=torch.int64, device=x.device)
        _counts_kernel[(cdiv(U, BLOCK),)](start, counts, U, BLOCK=BLOCK)
    return values, inverse.reshape(x.shape) if return_inverse else None, counts


# ---------------------------------------------------------------------------------------------
# multinomial
# ---------------------------------------------------------------------------------------------
@triton.jit
def _draw_kernel(cdf_ptr, out_ptr, state_ptr, N, S, steps, BLOCK: tl.constexpr):
    """out[m, s] = first i with cdf[m, i] > u * cdf[m, N - 1], u = rand(seed, offset + m * S + s)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = s < S
    seed = tl.load(state_ptr)
    base = tl.load(state_ptr + 1)
    cdf_row = cdf_ptr + row * N
    total = tl.load(cdf_row + N - 1)
    target = tl.rand(seed, base + row * S + s) * total
    lo = tl.zeros([BLOCK], tl.int64)
    hi = lo + N
    last = lo + N  # where cdf reaches the total: the last positive weight, for u * total rounding to total
    lo2 = tl.zeros([BLOCK], tl.int64)
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        c = tl.load(cdf_row + mid, mask=live & active, other=0.0)
        above = c > target
        lo = tl.where(active & ~above, mid + 1, lo)
        hi = tl.where(active & above, mid, hi)
        active2 = lo2 < last
        mid2 = (lo2 + last) // 2
        c2 = tl.load(cdf_row + mid2, mask=live & active2, other=0.0)
        reached = c2 >= total
        lo2 = tl.where(active2 & ~reached, mid2 + 1, lo2)
        last = tl.where(active2 & reached, mid2, last)
    pick = tl.where(lo >= N, tl.minimum(last, N - 1), lo)
    tl.store(out_ptr + row * S + s, pick, mask=live)


@triton.jit
def _race_keys_kernel(p_ptr, key_ptr, state_ptr, N, stride_pm, stride_pn, BLOCK: tl.constexpr):
    """key[m, i] = -log(1 - u) / p[m, i] (inf where p = 0), u = rand(seed, offset + m * N + i)."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = i < N
    p = tl.load(p_ptr + row * stride_pm + i * stride_pn, mask=live, other=0).to(tl.float32)
    seed = tl.load(state_ptr)
    base = tl.load(state_ptr + 1)
    u = tl.rand(seed, base + row * N + i)
    wait = -tl.log(1.0 - u)
    tl.store(key_ptr + row * N + i, tl.where(p > 0, wait / p, float("inf")), mask=live)


def multinomial(p: torch.Tensor, num_samples: int, replacement: bool, state: torch.Tensor) -> torch.Tensor:
    """p [M, N] non-negative weights -> int64 [M, num_samples] drawn with state [seed, offset] (read, not advanced).

    Consumes M * num_samples random numbers with replacement, M * N without."""
    M, N = p.shape
    out = torch.empty((M, num_samples), dtype=torch.int64, device=p.device)
    if M == 0 or num_samples == 0:
        return out
    if replacement:
        weights = p if p.dtype in (torch.float32, torch.float64) else p.to(torch.float32)
        cdf = scan_kernels.scan(weights, dim=1, op="sum").contiguous()
        block = min(BLOCK, triton.next_power_of_2(num_samples))
        _draw_kernel[(M, cdiv(num_samples, block))](cdf, out, state, N, num_samples, N.bit_length() + 1, BLOCK=block)
        return out
    keys = torch.empty((M, N), dtype=torch.float32, device=p.device)
    block = min(BLOCK, triton.next_power_of_2(N))
    _race_keys_kernel[(M, cdiv(N, block))](p, keys, state, N, p.stride(0), p.stride(1), BLOCK=block)
    order = sorted_rows(keys, False, cap=num_samples)
    return _gather(keys, order, num_samples)[1]

