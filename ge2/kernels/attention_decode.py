"""Split-S attention for decoding: few query rows (L <= 16) against a long key sequence (a KV cache).

One program per (batch, kv head) would leave most of the GPU idle when B * Hkv is small, and the
work is a pass over K and V, so the time is their bytes over memory bandwidth. The key sequence is
cut into ``n_splits`` chunks: one program per (batch, kv head, chunk, block of query rows) computes,
for its chunk, the normalised partial output and the partial log-sum-exp of every query row that
reads its kv head, and a combine kernel merges the chunks of each row:

    o = sum_c exp(lse_c - lse) * o_c,     lse = log sum_c exp(lse_c)

The M dimension of a program's tiles is made of the Hq // Hkv query heads of one kv head times the
L rows (grouped queries): K and V are read once per kv head, not once per query head. With one
chunk the split kernel writes o and lse itself and no combine runs.

    q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], mask [B, Hq, L, S] or None (bool: True
    takes part; float: added to the scaled scores), any strides (stride-0 mask dims are read in
    place)  ->  o [B, Hq, L, Ev] in q's dtype (laid out as [B, L, Hq, Ev]), lse [B, Hq, L] fp32

Causal attention uses torch's top-left alignment (column j takes part in row i only if j <= i), so
only the first min(S, L) keys can take part and the pass stops there. A row with nothing to attend
to gives o = 0 and lse = -inf, never NaN.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels.attention import padded
from ge2.kernels.gemm import _round_to_tf32, _sm_count
from ge2.runtime import autotune, cdiv

MAX_ROWS = 16  # the most query rows L for which prefers_decode takes this kernel
# The fewest keys worth a program of their own: below it the combine and the programs' start-up
# cost more than the extra parallelism gives. Chunks are multiples of it, so of every BLOCK_N.
MIN_CHUNK = 256
ACC_ELEMENTS = 8192  # BLOCK_M * EV_PAD cap: the fp32 accumulator and scores stay in registers
TUNED_CHUNK = 1024  # chunks shorter than this run one config untuned (launch-bound; GPU tests stay quick)
SMEM_BYTES = 200 * 1024  # what a config's K/V pipeline stages may take of the H100's 227 KB

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# (BLOCK_N, warps, stages). 8 warps for the 64-row tiles (4 q heads x 16 rows): at 4 warps their
# fp32 scores and accumulator take all 255 registers a thread may have, one program per SM.
CONFIGS = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)
           for n, w, s in ((64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (32, 4, 4),
                           (64, 8, 3), (128, 8, 2), (128, 8, 3), (32, 8, 4))]
DEFAULT_CONFIG = CONFIGS[3]  # BLOCK_N 128: few loop trips, which is what the interpreter's time goes by
WIDE_CONFIG = CONFIGS[6]  # short chunks of 64-row tiles (untuned)


def _prune(configs, named_args, **kwargs):
    """Drop configs whose K/V stages overflow shared memory or whose key block exceeds the chunk;
    one config, untuned, for chunks too short for the choice to matter (launch-bound)."""
    meta = {**named_args, **kwargs}
    size = meta["k_ptr"].element_size()
    fits = [c for c in configs
            if c.num_stages * c.kwargs["BLOCK_N"] * (meta["E_PAD"] + meta["EV_PAD"]) * size <= SMEM_BYTES]
    fits = fits or [min(configs, key=lambda c: c.num_stages * c.kwargs["BLOCK_N"])]
    if meta["chunk"] < TUNED_CHUNK:
        # 64-row tiles need 8 warps (see CONFIGS); 16-32 rows run best on 4.
        wanted = DEFAULT_CONFIG if meta["BLOCK_M"] <= 32 else WIDE_CONFIG
        return [wanted if wanted in fits else fits[0]]
    return fits


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@autotune(CONFIGS, key=["chunk", "BLOCK_M", "E_PAD", "EV_PAD", "MASK_KIND", "PRECISION"],
          default=DEFAULT_CONFIG, prune_configs_by={"early_config_prune": _prune})
@triton.jit
def attention_decode_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, lse_ptr,
    Hkv, L, S, G, chunk, n_splits, m_blocks,
    sqb, sqh, sql, sqe, skb, skh, sks, ske, svb, svh, svs, sve, smb, smh, sml, sms,
    sob, soh, sol, soc, soe, slb, slh, sll, slc,
    qk_scale,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ROUND_TF32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    E: tl.constexpr, EV: tl.constexpr, E_PAD: tl.constexpr, EV_PAD: tl.constexpr,
):
    """Keys [c * chunk, (c + 1) * chunk) of one (batch, kv head) against BLOCK_M of its G * L query rows.

    Writes the chunk's o_c = softmax-weighted sum of v (normalised within the chunk) and its
    lse_c (natural log) at [b, h, i, c] of (o_ptr, lse_ptr); MASK_KIND 0 none, 1 bool, 2 additive.
    """
    # The row blocks of one (b, kv head, chunk) are neighbours in launch order: they read the
    # same K/V tiles, which then come from L2.
    pid = tl.program_id(0)
    mb = pid % m_blocks
    unit = pid // m_blocks
    c = unit % n_splits
    bh = unit // n_splits
    b = bh // Hkv
    hkv = bh - b * Hkv

    # Row r of the tile is query row i of q head hkv * G + g, with r = i * G + g: neighbouring rows
    # are neighbouring heads, which o's [B, L, Hq, Ev] layout stores side by side.
    r = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < G * L
    i = r // G
    h = hkv * G + (r - i * G)
    offs_e = tl.arange(0, E_PAD)
    offs_ev = tl.arange(0, EV_PAD)
    offs_n = tl.arange(0, BLOCK_N)

    q_rows = b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i.to(tl.int64) * sql
    q = tl.load(q_ptr + q_rows[:, None] + offs_e[None, :] * sqe,
                mask=row_ok[:, None] & (offs_e < E)[None, :], other=0.0)
    if UPCAST:  # the interpreter cannot do 16-bit arithmetic; the products are exact either way
        q = q.to(tl.float32)
    if ROUND_TF32:
        q = _round_to_tf32(q)
    k_base = k_ptr + b.to(tl.int64) * skb + hkv.to(tl.int64) * skh
    v_base = v_ptr + b.to(tl.int64) * svb + hkv.to(tl.int64) * svh
    if MASK_KIND != 0:
        m_rows = b.to(tl.int64) * smb + h.to(tl.int64) * smh + i.to(tl.int64) * sml

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the base-2 scores
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, EV_PAD], tl.float32)
    start = c * chunk
    end = tl.minimum(start + chunk, S)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < end
        kt = tl.load(k_base + cols[None, :].to(tl.int64) * sks + offs_e[:, None] * ske,
                     mask=col_ok[None, :] & (offs_e < E)[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * svs + offs_ev[None, :] * sve,
                    mask=col_ok[:, None] & (offs_ev < EV)[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        if ROUND_TF32:
            kt = _round_to_tf32(kt)
            v = _round_to_tf32(v)
        # Scores in base 2 (exp2 is the hardware's): s2 = log2(e) * (scale * q.k + mask).
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        ok = row_ok[:, None] & col_ok[None, :]
        if IS_CAUSAL:
            ok = ok & (cols[None, :] <= i[:, None])
        if MASK_KIND == 1:
            keep = tl.load(mask_ptr + m_rows[:, None] + cols[None, :].to(tl.int64) * sms, mask=ok, other=0)
            ok = ok & (keep != 0)
        elif MASK_KIND == 2:
            add = tl.load(mask_ptr + m_rows[:, None] + cols[None, :].to(tl.int64) * sms, mask=ok, other=0.0)
            s += add.to(tl.float32) * 1.4426950408889634
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen only -inf so far shifts by 0, not -inf: exp2 then gives 0, not NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - shift)
        p = tl.exp2(s - shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if ROUND_TF32:
            p = _round_to_tf32(p)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    dead = l_i == 0.0  # every score -inf (masked, or an empty chunk): o_c = 0, lse_c = -inf
    o = acc / tl.where(dead, 1.0, l_i)[:, None]
    lse = tl.where(dead, float("-inf"), (m_i + tl.log2(tl.where(dead, 1.0, l_i))) * 0.6931471805599453)
    o_rows = b.to(tl.int64) * sob + h.to(tl.int64) * soh + i.to(tl.int64) * sol + c.to(tl.int64) * soc
    tl.store(o_ptr + o_rows[:, None] + offs_ev[None, :] * soe, o.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_ev < EV)[None, :])
    l_rows = b.to(tl.int64) * slb + h.to(tl.int64) * slh + i.to(tl.int64) * sll + c.to(tl.int64) * slc
    tl.store(lse_ptr + l_rows, lse, mask=row_ok)


@triton.jit
def attention_decode_combine_kernel(
    o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, Hq, L, EV, n_splits,
    sob, soh, sol, soe, slb, slh, sll,
    BLOCK_C: tl.constexpr, EV_PAD: tl.constexpr,
):
    """One query row: o = sum_c w_c o_c / sum_c w_c, lse = log sum_c exp(lse_c), w_c = exp(lse_c - max).

    o_part [rows, n_splits, EV] and lse_part [rows, n_splits] fp32, contiguous, rows in (b, h, i) order.
    """
    row = tl.program_id(0)
    i = row % L
    bh = row // L
    h = bh % Hq
    b = bh // Hq
    offs_c = tl.arange(0, BLOCK_C)
    offs_ev = tl.arange(0, EV_PAD)
    part = row.to(tl.int64) * n_splits
    top = tl.full([], float("-inf"), tl.float32)
    den = tl.zeros([], tl.float32)
    acc = tl.zeros([EV_PAD], tl.float32)
    for c0 in range(0, n_splits, BLOCK_C):
        cs = c0 + offs_c
        lse_c = tl.load(lse_part_ptr + part + cs, mask=cs < n_splits, other=float("-inf"))
        o_c = tl.load(o_part_ptr + (part + cs)[:, None] * EV + offs_ev[None, :],
                      mask=(cs < n_splits)[:, None] & (offs_ev < EV)[None, :], other=0.0)
        new_top = tl.maximum(top, tl.max(lse_c, 0))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # all chunks empty so far: no NaN
        alpha = tl.exp(top - shift)
        w = tl.exp(lse_c - shift)
        den = den * alpha + tl.sum(w, 0)
        acc = acc * alpha + tl.sum(w[:, None] * o_c, 0)
        top = new_top
    dead = den == 0.0
    o = acc / tl.where(dead, 1.0, den)
    lse = tl.where(dead, float("-inf"), top + tl.log(tl.where(dead, 1.0, den)))
    o_row = b.to(tl.int64) * sob + h.to(tl.int64) * soh + i.to(tl.int64) * sol
    tl.store(o_ptr + o_row + offs_ev * soe, o.to(o_ptr.dtype.element_ty), mask=offs_ev < EV)
    tl.store(lse_ptr + b.to(tl.int64) * slb + h.to(tl.int64) * slh + i.to(tl.int64) * sll, lse)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _split(units: int, keys: int, device: torch.device) -> tuple[int, int]:
    """(n_splits, chunk) of ``keys`` for ``units`` programs per chunk: at most one wave of programs
    (units * n_splits <= SMs), chunks of at least MIN_CHUNK keys.

    Measured on the H100 (bench/profile_attention_decode.py, CUDA-graph times): one wave of long
    chunks streams K/V at 3.0-3.1 TB/s; a partial second wave costs its imbalance (GQA 8x32/8 heads
    at S = 32768: 128 programs 354 us, 192 programs 363 us, 256 programs 353 us), and many short
    chunks cost their start-up and partial outputs (1x32/8 heads x 16 rows: 128 programs 54 us,
    512 programs 72 us).
    """
    splits = max(1, min(_sm_count(device) // units, cdiv(keys, MIN_CHUNK)))
    if splits == 1:
        return 1, keys
    chunk = cdiv(cdiv(keys, splits), MIN_CHUNK) * MIN_CHUNK
    return cdiv(keys, chunk), chunk


def plan(B: int, Hq: int, Hkv: int, L: int, keys: int, Ev: int, device: torch.device,
         num_splits: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, row blocks per kv head, n_splits, chunk) of a launch over ``keys`` keys."""
    rows = Hq // Hkv * L
    block_m = min(padded(rows), max(16, ACC_ELEMENTS // padded(Ev)))
    m_blocks = cdiv(rows, block_m)
    if num_splits is None:
        n_splits, chunk = _split(B * Hkv * m_blocks, keys, device)
    else:
        chunk = cdiv(keys, max(1, min(num_splits, keys)))
        n_splits = cdiv(keys, chunk)
    return block_m, m_blocks, n_splits, chunk


def prefers_decode(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    """Whether the split-S decode kernel is at least as fast as the flash forward for q [B, Hq, L, E]
    against k [B, Hkv, S, E]: L <= 16 and no dropout, at any S.

    Both are one pass over K/V; decode reads it once per kv head (flash once per q head), pads L
    rows to 16 instead of a 64-128 row tile, and splits S when B * Hkv leaves SMs idle. Measured on
    the H100 at E = 128, bf16: MHA with B * H = 1024 at S = 256..4096 the same time (61 / 61,
    187 / 189, 708 / 711 us), GQA 8x32/8 heads L = 1, S = 4096: 66 / 78 us; at short S both are one
    launch of a few us. With one chunk the decode kernel writes o directly (one launch, like flash).
    """
    return q.shape[2] <= MAX_ROWS and dropout_p == 0.0


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
                     scale: float, is_causal: bool, precision: str,
                     num_splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, L, Ev] in q's dtype (stored as [B, L, Hq, Ev]) and lse [B, Hq, L] fp32 (natural log)
    of softmax(scale * q @ k^T + mask) @ v, for q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev].

    Any L works; the kernel is made for L <= 16. ``num_splits`` overrides the chunk count (benchmarks).
    """
    B, Hq, L, E = q.shape
    _, Hkv, S, Ev = v.shape
    G = Hq // Hkv
    o = torch.empty(B, L, Hq, Ev, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(B, Hq, L, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    keys = min(S, L) if is_causal else S  # top-left causal: no row reaches past key L - 1
    block_m, m_blocks, n_splits, chunk = plan(B, Hq, Hkv, L, keys, Ev, q.device, num_splits)
    if n_splits == 1:  # the split kernel writes o and lse itself
        o_out, lse_out = o, lse
        so, sl = (*o.stride()[:3], 0, o.stride(3)), (*lse.stride(), 0)
    else:
        o_out = torch.empty(B, Hq, L, n_splits, Ev, dtype=torch.float32, device=q.device)
        lse_out = torch.empty(B, Hq, L, n_splits, dtype=torch.float32, device=q.device)
        so, sl = o_out.stride(), lse_out.stride()
    if mask is None:
        mask_kind, mask_arg, sm = 0, q, (0, 0, 0, 0)
    else:
        # A bool mask is read as its bytes (the same strides).
        mask_kind, sm = (1 if mask.dtype == torch.bool else 2), mask.stride()
        mask_arg = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    interpreter = runtime.is_interpreter()
    fp32 = q.dtype == torch.float32
    attention_decode_split_kernel[(B * Hkv * m_blocks * n_splits,)](
        q, k, v, mask_arg, o_out, lse_out,
        Hkv, L, keys, G, chunk, n_splits, m_blocks,
        *q.stride(), *k.stride(), *v.stride(), *sm, *so, *sl,
        float(scale) * LOG2E,
        IS_CAUSAL=bool(is_causal), MASK_KIND=mask_kind,
        PRECISION=precision if fp32 else "ieee", UPCAST=interpreter and not fp32,
        ROUND_TF32=fp32 and precision == "tf32" and not interpreter,
        BLOCK_M=block_m, E=E, EV=Ev, E_PAD=padded(E), EV_PAD=padded(Ev),  # head dims constant: padding masks fold away
    )
    if n_splits > 1:
        block_c = min(triton.next_power_of_2(n_splits), max(1, 8192 // padded(Ev)))
        attention_decode_combine_kernel[(B * Hq * L,)](
            o_out, lse_out, o, lse, Hq, L, Ev, n_splits, *o.stride(), *lse.stride(),
            BLOCK_C=block_c, EV_PAD=padded(Ev), num_warps=4,
        )
    return o, lse
