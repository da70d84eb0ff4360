"""Flash attention: forward and backward Triton kernels and their launchers.

    scores = scale * q @ k^T (+ mask; causal: column j only for row i >= j)
    P = softmax(scores) (fp32),  o = (P * keep / (1 - p)) @ v,  lse = log sum exp(scores)

Shapes: q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], any strides; q head h reads kv head
h // (Hq // Hkv) (grouped queries, k and v never repeated). The head dims are padded inside the
kernels to HEAD_DIM = max(16, next_pow2(E)) with masked loads. No L x S tensor exists anywhere:

* forward (``attention_fwd_kernel``): a program owns BLOCK_M query rows of one head, keeps them in
  registers and sweeps the key/value blocks once with an online softmax (a running max and sum per
  row, the accumulator rescaled when the max grows). Scores live in the log2 domain (log2(e) folded
  into the scale) so each probability is one exp2. It stores o and the row's lse (fp32).
* backward: ``delta = rowsum(dO * O)`` (``attention_bwd_preprocess_kernel``), then P is recomputed
  from q, k and lse. ``attention_bwd_dkdv_kernel`` owns BLOCK_N keys of one kv head and walks the
  query blocks of every q head of its group, so dk and dv are summed in registers in a fixed order
  (deterministic, no atomics); ``attention_bwd_dq_kernel`` owns BLOCK_M query rows and walks the
  key blocks.

Causal programs stop at their diagonal (the key blocks after it are never loaded) and only the
blocks that straddle it, or the ragged end of the sequence, pay for the element masks: each sweep
runs twice, an unmasked stage over the full blocks and a masked stage over the rest.

A row with nothing to attend to (every score -inf) gets o = 0, lse = -inf and zero gradients: the
running max is shifted by 0 instead of -inf, and backward reads its lse as +inf so that P = 0.

Dropout regenerates its keep mask wherever P is (re)computed: element (b, h, i, j) keeps when
``tl.rand(seed, offset + ((b*Hq + h)*L + i)*S + j) >= p``, [seed, offset] read from the device.

Loads: where q, k, v (and dO) have a unit-stride last dim and 16-byte aligned base and strides
(``_sources``), tiles come through 4-D TMA descriptors ([B, H, rows, E] boxes of [1, 1, BLOCK, HEAD_DIM];
the copy engine zero-fills past the sequence end and E), else through masked pointer loads. On the
H100 (bf16, E = 128) TMA was 4% faster in the forward kernel and 12% in dQ than the pointer loads.

Measured and left out (H100, Triton 3.6, bf16 4x16x2048x128): warp-specialized forward loops
(``tl.range(warp_specialize=True)``, 128x64 tiles: 430 TFLOP/s against 491 for the tuned 64x64
tiles), and dq added atomically by the dK/dV kernel in fp32 (5 matmuls a block pair instead of 7,
but 1.35 ms against 0.99 ms for the deterministic dK/dV + dQ pair).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels.gemm import _round_to_tf32, _tma_sms
from ge2.runtime import cdiv

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SMEM_BUDGET = 200 * 1024  # bytes of shared memory a config may plan for (H100: 227 KB per block)
SMALL_WORK = 1 << 22  # B*Hq*L*S below this: one config, no tuning (launch-bound, and the GPU tests stay fast)

MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2


def _block_shapes(nargs) -> None:
    """TMA boxes follow the config: BLOCK_M rows of q and dO, BLOCK_N rows of k and v (set before each launch)."""
    if not nargs.get("USE_TMA"):
        return
    bm, bn, hd, hdv = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"], nargs["HEAD_DIM_V"]
    for name, rows, width in (("q_ptr", bm, hd), ("do_ptr", bm, hdv), ("k_ptr", bn, hd), ("v_ptr", bn, hdv)):
        if name in nargs:
            nargs[name].block_shape = [1, 1, rows, width]


def _cfg(bm: int, bn: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps, pre_hook=_block_shapes)


INTERPRETER_CONFIG = _cfg(16, 16, 1, 4)

# Per head-dim bucket (padded HEAD_DIM <= 64, 128, 256): (BLOCK_M, BLOCK_N, stages, warps). The first
# of each is the one small problems take untuned. Forward: BLOCK_M query rows x BLOCK_N keys.
FWD_SPACES = {
    64: [_cfg(64, 64, 3, 4), _cfg(128, 64, 3, 4), _cfg(128, 128, 3, 8), _cfg(128, 64, 4, 8), _cfg(64, 32, 4, 4)],
    128: [_cfg(64, 64, 3, 4), _cfg(128, 64, 3, 8), _cfg(128, 128, 3, 8), _cfg(128, 64, 4, 8), _cfg(128, 32, 4, 4)],
    256: [_cfg(64, 32, 2, 4), _cfg(64, 64, 2, 4), _cfg(128, 64, 2, 8), _cfg(64, 32, 3, 4), _cfg(32, 32, 2, 4)],
}
# dK/dV: BLOCK_N keys held, BLOCK_M query rows a step (the accumulators are two [BLOCK_N, HEAD_DIM] tiles).
DKDV_SPACES = {
    64: [_cfg(32, 64, 3, 4), _cfg(32, 128, 3, 4), _cfg(64, 128, 3, 8), _cfg(64, 64, 3, 4)],
    128: [_cfg(32, 64, 3, 4), _cfg(32, 128, 2, 8), _cfg(64, 128, 2, 8), _cfg(64, 64, 2, 4)],
    256: [_cfg(32, 64, 2, 8), _cfg(32, 32, 2, 4), _cfg(64, 64, 1, 8), _cfg(16, 64, 2, 4), _cfg(16, 32, 2, 4)],
}
# dQ: BLOCK_M query rows held, BLOCK_N keys a step.
DQ_SPACES = {
    64: [_cfg(64, 32, 3, 4), _cfg(128, 32, 3, 4), _cfg(128, 64, 3, 8), _cfg(64, 64, 3, 4)],
    128: [_cfg(64, 32, 3, 4), _cfg(128, 32, 3, 8), _cfg(128, 64, 2, 8), _cfg(64, 64, 2, 4)],
    256: [_cfg(64, 32, 2, 4), _cfg(64, 64, 2, 8), _cfg(128, 32, 2, 8), _cfg(64, 16, 2, 4), _cfg(32, 16, 2, 4)],
}
# The last config of each 256 bucket is for fp32 heads of 256, whose resident tiles count twice.


def _bucket(head_dim: int) -> int:
    return 64 if head_dim <= 64 else head_dim


# fp32 operands of the 256-wide heads (pointer loads) stage the resident tile a second time (measured on
# the H100: a 64 x 32, 2-stage forward asked for 262144 bytes, the estimate's 196608 plus one more q tile).
def _resident(size: int, hd: int) -> int:
    return 2 if size == 4 and hd > 128 else 1


def _smem_fwd(c: triton.Config, hd: int, hdv: int, size: int) -> int:
    # q stays resident; each pipeline stage holds one k and one v tile.
    return (_resident(size, hd) * c.kwargs["BLOCK_M"] * hd + c.num_stages * c.kwargs["BLOCK_N"] * (hd + hdv)) * size


def _smem_dkdv(c: triton.Config, hd: int, hdv: int, size: int) -> int:
    # k, v resident; each stage holds a q and a dO tile.
    return (_resident(size, hd) * c.kwargs["BLOCK_N"] * (hd + hdv) + c.num_stages * c.kwargs["BLOCK_M"] * (hd + hdv)) * size


def _smem_dq(c: triton.Config, hd: int, hdv: int, size: int) -> int:
    return (_resident(size, hd) * c.kwargs["BLOCK_M"] * (hd + hdv) + c.num_stages * c.kwargs["BLOCK_N"] * (hd + hdv)) * size


def _pruner(spaces: dict, smem):
    """An early_config_prune: the configs of the head-dim bucket whose shared memory fits."""

    def prune(configs, named_args, **kwargs):
        a = {**named_args, **kwargs}
        hd, hdv = a["HEAD_DIM"], a["HEAD_DIM_V"]
        space = spaces[_bucket(max(hd, hdv))]
        q = a["q_ptr"]
        size = getattr(q, "base", q).element_size()  # a tensor or a TMA descriptor of one
        fits = [c for c in configs if c in space and smem(c, hd, hdv, size) <= SMEM_BUDGET]
        fits = fits or [min(space, key=lambda c: smem(c, hd, hdv, size))]
        if a["B"] * a["Hq"] * a["L"] * a["S"] < SMALL_WORK:
            return fits[:1]
        return fits

    return prune


def _all(spaces: dict) -> list[triton.Config]:
    return [c for space in spaces.values() for c in space]


_SIZES = ["B", "Hq", "L", "S", "GROUP"]  # not specialized: fewer compiled variants (nothing divides them)
_KEY = ["B", "Hq", "L", "S", "HEAD_DIM", "HEAD_DIM_V", "CAUSAL", "MASK_KIND", "DROPOUT", "PRECISION", "USE_TMA"]


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _operand(x, UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr):
    """A dot operand as the kernel multiplies it: fp32 under the interpreter (16-bit storage), rounded
    to nearest tf32 for "tf32" on the GPU (fed raw fp32 bits, the tensor cores truncate: twice the error)."""
    if UPCAST:
        x = x.to(tl.float32)
    if ROUND_TF32:
        x = _round_to_tf32(x)
    return x


@triton.jit
def _tile(src, b, h, r0, rows, n_rows, s_row, cols, n_cols, s_col, USE_TMA: tl.constexpr,
          BLOCK: tl.constexpr, WIDTH: tl.constexpr):
    """The [BLOCK, WIDTH] tile of rows r0.. of head (b, h): a TMA box, or masked loads from the
    pointer ``src`` to the head's first element."""
    if USE_TMA:
        t = src.load([b, h, r0, 0]).reshape(BLOCK, WIDTH)
    else:
        t = tl.load(src + rows.to(tl.int64)[:, None] * s_row + cols[None, :] * s_col,
                    mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)
    return t


@triton.jit
def _fwd_sweep(acc, l_i, m_i, q, k_src, v_src, mask_base, lo, hi, b, hk, rows, L, S, E, EV,
               sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
               UPCAST: tl.constexpr, PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr, USE_TMA: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax over the key blocks [lo, hi); MASKED blocks check the sequence end and the diagonal.

    k_src, v_src: TMA descriptors of [B, Hkv, S, E] (USE_TMA) or the pointers to (b, hk)'s first key.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    cols = lo + offs_n
    if not USE_TMA:
        k_ptrs = k_src + cols.to(tl.int64)[:, None] * sk_s + offs_e[None, :] * sk_e
        v_ptrs = v_src + cols.to(tl.int64)[:, None] * sv_s + offs_ev[None, :] * sv_e
    if MASK_KIND != 0:
        m_ptrs = mask_base + cols.to(tl.int64)[None, :] * sm_s
        row_ok = (rows < L)[:, None]
    # Only the unmasked plain sweep takes the short form (max of raw q.k, then one FMA per score).
    FAST: tl.constexpr = not MASKED and MASK_KIND == 0
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if USE_TMA:  # the copy engine zero-fills past S and E
            k = k_src.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        elif MASKED:
            k = tl.load(k_ptrs, mask=(cols < S)[:, None] & (offs_e < E)[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs, mask=(offs_e < E)[None, :], other=0.0)
        k = _operand(k, UPCAST, ROUND_TF32)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if FAST:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        else:
            s = qk * qk_scale
            if MASK_KIND == 1:
                s = tl.where(tl.load(m_ptrs, mask=row_ok & (cols < S)[None, :], other=0) != 0, s, float("-inf"))
            elif MASK_KIND == 2:
                s += tl.load(m_ptrs, mask=row_ok & (cols < S)[None, :], other=0.0).to(tl.float32) * 1.4426950408889634
            if MASKED:
                ok = (cols < S)[None, :]
                if CAUSAL:
                    ok = ok & (cols[None, :] <= rows[:, None])
                s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if MASK_KIND != 0:
                # A row whose scores so far are all -inf: shift by 0 so exp2 gives 0, not NaN.
                m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DROPOUT:
            keep = tl.rand(seed, drop_base + rows.to(tl.int64)[:, None] * S + cols[None, :]) >= dropout_p
            p = tl.where(keep, p, 0.0)
        if USE_TMA:
            v = v_src.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM_V)
        elif MASKED:
            v = tl.load(v_ptrs, mask=(cols < S)[:, None] & (offs_ev < EV)[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs, mask=(offs_ev < EV)[None, :], other=0.0)
        v = _operand(v, UPCAST, ROUND_TF32)
        # P rounded to v's dtype for the tensor cores (as flash attention does); fp32 stays fp32.
        acc = tl.dot(_operand(p.to(v.dtype), False, ROUND_TF32), v, acc, input_precision=PRECISION)
        m_i = m_new
        if not USE_TMA:
            k_ptrs += BLOCK_N * sk_s
            v_ptrs += BLOCK_N * sv_s
        if MASK_KIND != 0:
            m_ptrs += BLOCK_N * sm_s
    return acc, l_i, m_i


@runtime.autotune(_all(FWD_SPACES), key=_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _pruner(FWD_SPACES, _smem_fwd)},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, lse_ptr, rng_ptr,
    B, Hq, L, S, E, EV, GROUP,
    sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
    sm_b, sm_h, sm_l, sm_s, so_b, so_h, so_l, so_e,
    qk_scale, dropout_p, keep_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    DROPOUT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr,
    NEGATE: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """o and lse of BLOCK_M query rows of head (program_id 1) of batch (program_id 2).

    q_ptr, k_ptr, v_ptr are TMA descriptors of the 4-D tensors when USE_TMA. qk_scale = |scale| * log2(e);
    NEGATE (scale < 0) negates q instead, so the running max can be taken before scaling.
    """
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows first: the last wave of programs is the short one
        pid_m = tl.num_programs(0) - 1 - pid_m
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)

    if USE_TMA:
        q = _tile(q_ptr, b, h, m0, rows, L, sq_l, offs_e, E, sq_e, True, BLOCK_M, HEAD_DIM)
        k_src = k_ptr
        v_src = v_ptr
    else:
        q = _tile(q_ptr + b64 * sq_b + h64 * sq_h, b, h, m0, rows, L, sq_l, offs_e, E, sq_e, False,
                  BLOCK_M, HEAD_DIM)
        k_src = k_ptr + b64 * sk_b + hk.to(tl.int64) * sk_h
        v_src = v_ptr + b64 * sv_b + hk.to(tl.int64) * sv_h
    if NEGATE:
        q = -q
    q = _operand(q, UPCAST, ROUND_TF32)
    mask_base = mask_ptr + b64 * sm_b + h64 * sm_h + rows.to(tl.int64)[:, None] * sm_l
    seed = 0
    drop_base = 0
    if DROPOUT:
        seed = tl.load(rng_ptr)
        drop_base = tl.load(rng_ptr + 1) + (b64 * Hq + h) * L * S

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    # Full key blocks need no element masks: those before the diagonal (causal) and the sequence end.
    n_full = (S // BLOCK_N) * BLOCK_N
    hi = S
    if CAUSAL:
        n_full = tl.minimum(n_full, ((m0 + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(S, m0 + BLOCK_M)
    acc, l_i, m_i = _fwd_sweep(acc, l_i, m_i, q, k_src, v_src, mask_base, 0, n_full, b, hk, rows, L, S, E, EV,
                               sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p,
                               False, CAUSAL, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32, USE_TMA,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_N)
    acc, l_i, m_i = _fwd_sweep(acc, l_i, m_i, q, k_src, v_src, mask_base, n_full, hi, b, hk, rows, L, S, E, EV,
                               sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p,
                               True, CAUSAL, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32, USE_TMA,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_N)

    dead = l_i == 0.0  # nothing to attend to: o = 0, lse = -inf
    inv = tl.where(dead, 0.0, keep_scale / tl.where(dead, 1.0, l_i))
    o = acc * inv[:, None]
    lse = tl.where(dead, float("-inf"), (m_i + tl.math.log2(tl.where(dead, 1.0, l_i))) * 0.6931471805599453)
    o_ptrs = o_ptr + b64 * so_b + h64 * so_h + rows.to(tl.int64)[:, None] * so_l + offs_ev[None, :] * so_e
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=(rows < L)[:, None] & (offs_ev < EV)[None, :])
    tl.store(lse_ptr + (b64 * Hq + h) * L + rows, lse, mask=rows < L)


# ---------------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------------
def _prune_preprocess(configs, named_args, **kwargs):
    a = {**named_args, **kwargs}
    return configs if a["B"] * a["Hq"] * a["L"] * a["HEAD_DIM_V"] >= SMALL_WORK else configs[-1:]


@runtime.autotune([triton.Config({"BLOCK_M": bm}, num_warps=w) for bm, w in ((64, 4), (128, 8), (32, 4))],
                  key=["B", "Hq", "L", "HEAD_DIM_V"], default=2, do_bench=runtime.tuning_bench,
                  prune_configs_by={"early_config_prune": _prune_preprocess})
@triton.jit
def attention_bwd_preprocess_kernel(
    o_ptr, do_ptr, delta_ptr, B, Hq, L, EV,
    so_b, so_h, so_l, so_e, sd_b, sd_h, sd_l, sd_e,
    HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta [B, Hq, L] fp32 = rowsum(dO * O)."""
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM_V)
    ok = (rows < L)[:, None] & (cols < EV)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    o = tl.load(o_ptr + b * so_b + h * so_h + r64 * so_l + cols[None, :] * so_e, mask=ok, other=0.0)
    do = tl.load(do_ptr + b * sd_b + h * sd_h + r64 * sd_l + cols[None, :] * sd_e, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + (b * Hq + h) * L + rows, delta, mask=rows < L)


@triton.jit
def _dkdv_sweep(dk, dv, k, v, q_src, do_src, lse_base, delta_base, mask_base, lo, hi, b, h, cols, L, S, E, EV,
                sq_l, sq_e, sd_l, sd_e, sm_l, qk_scale, seed, drop_base, dropout_p, keep_scale,
                MASKED: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr, USE_TMA: tl.constexpr,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr):
    """dk, dv [BLOCK_N, *] += the query blocks [lo, hi) of head (b, h) (P^T computed key-major)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    if MASK_KIND != 0:
        m_ptrs = mask_base + (lo + offs_m).to(tl.int64)[None, :] * sm_l
        col_ok = (cols < S)[:, None]
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < L
        q = _operand(_tile(q_src, b, h, start_m, rows, L, sq_l, offs_e, E, sq_e, USE_TMA, BLOCK_M, HEAD_DIM),
                     UPCAST, ROUND_TF32)
        # Rows past L and empty rows read lse = +inf: their P is 0, so they add nothing.
        lse = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
        lse = tl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
        if MASK_KIND == 1:
            s_t = tl.where(tl.load(m_ptrs, mask=col_ok & row_ok[None, :], other=0) != 0, s_t, float("-inf"))
        elif MASK_KIND == 2:
            s_t += tl.load(m_ptrs, mask=col_ok & row_ok[None, :], other=0.0).to(tl.float32) * 1.4426950408889634
        if MASKED:
            s_t = tl.where(rows[None, :] >= cols[:, None], s_t, float("-inf"))
        p_t = tl.math.exp2(s_t - lse[None, :])
        do = _operand(_tile(do_src, b, h, start_m, rows, L, sd_l, offs_ev, EV, sd_e, USE_TMA, BLOCK_M, HEAD_DIM_V),
                      UPCAST, ROUND_TF32)
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if DROPOUT:
            keep = tl.rand(seed, drop_base + rows.to(tl.int64)[None, :] * S + cols[:, None]) >= dropout_p
            pd_t = tl.where(keep, p_t * keep_scale, 0.0)
            dp_t = tl.where(keep, dp_t * keep_scale, 0.0)
        else:
            pd_t = p_t
        dv = tl.dot(_operand(pd_t.to(do.dtype), False, ROUND_TF32), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(_operand(ds_t.to(q.dtype), False, ROUND_TF32), q, dk, input_precision=PRECISION)
        if MASK_KIND != 0:
            m_ptrs += BLOCK_M * sm_l
    return dk, dv


@runtime.autotune(_all(DKDV_SPACES), key=_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _pruner(DKDV_SPACES, _smem_dkdv)},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, rng_ptr,
    B, Hq, L, S, E, EV, GROUP,
    sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
    sm_b, sm_h, sm_l, sm_s, sd_b, sd_h, sd_l, sd_e,
    sdk_b, sdk_h, sdk_s, sdk_e, sdv_b, sdv_h, sdv_s, sdv_e,
    qk_scale, scale, dropout_p, keep_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    DROPOUT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr,
    NEGATE: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dk, dv of BLOCK_N keys of kv head (program_id 1), summed over the GROUP q heads that read it."""
    n0 = tl.program_id(0) * BLOCK_N
    hk = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    hk64 = hk.to(tl.int64)
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    c64 = cols.to(tl.int64)[:, None]
    col_ok = (cols < S)[:, None]
    if USE_TMA:
        k_src = k_ptr
        v_src = v_ptr
    else:
        k_src = k_ptr + b64 * sk_b + hk64 * sk_h
        v_src = v_ptr + b64 * sv_b + hk64 * sv_h
    k = _tile(k_src, b, hk, n0, cols, S, sk_s, offs_e, E, sk_e, USE_TMA, BLOCK_N, HEAD_DIM)
    if NEGATE:  # s = |scale| * (-k) . q
        k = -k
    k = _operand(k, UPCAST, ROUND_TF32)
    v = _operand(_tile(v_src, b, hk, n0, cols, S, sv_s, offs_ev, EV, sv_e, USE_TMA, BLOCK_N, HEAD_DIM_V),
                 UPCAST, ROUND_TF32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], tl.float32)
    # Causal: query blocks before the one holding row n0 see none of these keys; those up to
    # m_full straddle the diagonal, the rest see all of them.
    m_start = 0
    m_full = 0
    if CAUSAL:
        m_start = (n0 // BLOCK_M) * BLOCK_M
        m_full = tl.minimum(m_start + tl.cdiv(n0 + BLOCK_N - 1 - m_start, BLOCK_M) * BLOCK_M, L)
    seed = 0
    drop_root = 0
    if DROPOUT:
        seed = tl.load(rng_ptr)
        drop_root = tl.load(rng_ptr + 1)
    for g in range(GROUP):
        h = hk * GROUP + g
        h64 = h.to(tl.int64)
        if USE_TMA:
            q_src = q_ptr
            do_src = do_ptr
        else:
            q_src = q_ptr + b64 * sq_b + h64 * sq_h
            do_src = do_ptr + b64 * sd_b + h64 * sd_h
        lse_base = lse_ptr + (b64 * Hq + h) * L
        delta_base = delta_ptr + (b64 * Hq + h) * L
        mask_base = mask_ptr + b64 * sm_b + h64 * sm_h + c64 * sm_s
        drop_base = drop_root + (b64 * Hq + h) * L * S
        if CAUSAL:
            dk, dv = _dkdv_sweep(dk, dv, k, v, q_src, do_src, lse_base, delta_base, mask_base, m_start, m_full,
                                 b, h, cols, L, S, E, EV, sq_l, sq_e, sd_l, sd_e, sm_l, qk_scale, seed, drop_base,
                                 dropout_p, keep_scale, True, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32,
                                 USE_TMA, HEAD_DIM, HEAD_DIM_V, BLOCK_M)
        dk, dv = _dkdv_sweep(dk, dv, k, v, q_src, do_src, lse_base, delta_base, mask_base, m_full, L,
                             b, h, cols, L, S, E, EV, sq_l, sq_e, sd_l, sd_e, sm_l, qk_scale, seed, drop_base,
                             dropout_p, keep_scale, False, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32,
                             USE_TMA, HEAD_DIM, HEAD_DIM_V, BLOCK_M)
    tl.store(dk_ptr + b64 * sdk_b + hk64 * sdk_h + c64 * sdk_s + offs_e[None, :] * sdk_e,
             (dk * scale).to(dk_ptr.dtype.element_ty), mask=col_ok & (offs_e < E)[None, :])
    tl.store(dv_ptr + b64 * sdv_b + hk64 * sdv_h + c64 * sdv_s + offs_ev[None, :] * sdv_e,
             dv.to(dv_ptr.dtype.element_ty), mask=col_ok & (offs_ev < EV)[None, :])


@triton.jit
def _dq_sweep(dq, q, do, lse, delta, k_src, v_src, mask_base, lo, hi, b, hk, rows, L, S, E, EV,
              sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p, keep_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr, USE_TMA: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr):
    """dq [BLOCK_M, HEAD_DIM] += the key blocks [lo, hi)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    if MASK_KIND != 0:
        m_ptrs = mask_base + (lo + offs_n).to(tl.int64)[None, :] * sm_s
        row_ok = (rows < L)[:, None]
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        # Unmasked blocks lie inside S: the bound check on their loads folds away only for TMA,
        # so the pointer loads keep it (cheap next to the two dots).
        k = _operand(_tile(k_src, b, hk, start_n, cols, S, sk_s, offs_e, E, sk_e, USE_TMA, BLOCK_N, HEAD_DIM),
                     UPCAST, ROUND_TF32)
        v = _operand(_tile(v_src, b, hk, start_n, cols, S, sv_s, offs_ev, EV, sv_e, USE_TMA, BLOCK_N, HEAD_DIM_V),
                     UPCAST, ROUND_TF32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASK_KIND == 1:
            s = tl.where(tl.load(m_ptrs, mask=row_ok & (cols < S)[None, :], other=0) != 0, s, float("-inf"))
        elif MASK_KIND == 2:
            s += tl.load(m_ptrs, mask=row_ok & (cols < S)[None, :], other=0.0).to(tl.float32) * 1.4426950408889634
        if MASKED:
            # Past S too: a zero key row still gives exp2(0 - lse), which may overflow.
            ok = (cols < S)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None])
            s = tl.where(ok, s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            keep = tl.rand(seed, drop_base + rows.to(tl.int64)[:, None] * S + cols[None, :]) >= dropout_p
            dp = tl.where(keep, dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(_operand(ds.to(k.dtype), False, ROUND_TF32), k, dq, input_precision=PRECISION)
        if MASK_KIND != 0:
            m_ptrs += BLOCK_N * sm_s
    return dq


@runtime.autotune(_all(DQ_SPACES), key=_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _pruner(DQ_SPACES, _smem_dq)},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, rng_ptr,
    B, Hq, L, S, E, EV, GROUP,
    sq_b, sq_h, sq_l, sq_e, sk_b, sk_h, sk_s, sk_e, sv_b, sv_h, sv_s, sv_e,
    sm_b, sm_h, sm_l, sm_s, sd_b, sd_h, sd_l, sd_e, sdq_b, sdq_h, sdq_l, sdq_e,
    qk_scale, scale, dropout_p, keep_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
    DROPOUT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr,
    NEGATE: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dq of BLOCK_M query rows of head (program_id 1) of batch (program_id 2)."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    r64 = rows.to(tl.int64)[:, None]
    offs_e = tl.arange(0, HEAD_DIM)
    offs_ev = tl.arange(0, HEAD_DIM_V)
    if USE_TMA:
        q_src = q_ptr
        do_src = do_ptr
        k_src = k_ptr
        v_src = v_ptr
    else:
        q_src = q_ptr + b64 * sq_b + h64 * sq_h
        do_src = do_ptr + b64 * sd_b + h64 * sd_h
        k_src = k_ptr + b64 * sk_b + hk.to(tl.int64) * sk_h
        v_src = v_ptr + b64 * sv_b + hk.to(tl.int64) * sv_h
    q = _tile(q_src, b, h, m0, rows, L, sq_l, offs_e, E, sq_e, USE_TMA, BLOCK_M, HEAD_DIM)
    if NEGATE:
        q = -q
    q = _operand(q, UPCAST, ROUND_TF32)
    do = _operand(_tile(do_src, b, h, m0, rows, L, sd_l, offs_ev, EV, sd_e, USE_TMA, BLOCK_M, HEAD_DIM_V),
                  UPCAST, ROUND_TF32)
    lse = tl.load(lse_ptr + (b64 * Hq + h) * L + rows, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634
    delta = tl.load(delta_ptr + (b64 * Hq + h) * L + rows, mask=row_ok, other=0.0)
    mask_base = mask_ptr + b64 * sm_b + h64 * sm_h + r64 * sm_l
    seed = 0
    drop_base = 0
    if DROPOUT:
        seed = tl.load(rng_ptr)
        drop_base = tl.load(rng_ptr + 1) + (b64 * Hq + h) * L * S
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = (S // BLOCK_N) * BLOCK_N
    hi = S
    if CAUSAL:
        n_full = tl.minimum(n_full, ((m0 + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(S, m0 + BLOCK_M)
    dq = _dq_sweep(dq, q, do, lse, delta, k_src, v_src, mask_base, 0, n_full, b, hk, rows, L, S, E, EV,
                   sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p, keep_scale,
                   False, CAUSAL, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32, USE_TMA,
                   HEAD_DIM, HEAD_DIM_V, BLOCK_N)
    dq = _dq_sweep(dq, q, do, lse, delta, k_src, v_src, mask_base, n_full, hi, b, hk, rows, L, S, E, EV,
                   sk_s, sk_e, sv_s, sv_e, sm_s, qk_scale, seed, drop_base, dropout_p, keep_scale,
                   True, CAUSAL, MASK_KIND, DROPOUT, UPCAST, PRECISION, ROUND_TF32, USE_TMA,
                   HEAD_DIM, HEAD_DIM_V, BLOCK_N)
    tl.store(dq_ptr + b64 * sdq_b + h64 * sdq_h + r64 * sdq_l + offs_e[None, :] * sdq_e,
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_e < E)[None, :])


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
TMA = True  # off: pointer loads everywhere (A/B comparisons, tests of the pointer path)


def padded(n: int) -> int:
    """n rounded up to a power of two, at least 16 (the smallest side of a tensor-core tile)."""
    return max(16, triton.next_power_of_2(n))


def _descriptor(t: torch.Tensor):
    """A 4-D TMA descriptor over t [B, H, rows, E] (box set per config), or None where TMA cannot read
    it: the last dim unit-stride, the base and the other strides 16-byte aligned."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    size = t.element_size()
    # A size-1 dim's stride is never stepped: give it an aligned one.
    strides = [st if n != 1 else 16 for n, st in zip(t.shape, t.stride())]
    if strides[-1] != 1 and t.shape[-1] != 1 or t.data_ptr() % 16 or any(st * size % 16 for st in strides[:-1]):
        return None
    strides[-1] = 1
    return TensorDescriptor(t, list(t.shape), strides, [1, 1, 16, 16])


TMA_MAX_HEAD_DIM = 128  # wider heads load by pointers: TMA's 256-wide boxes were never timed or run on the GPU


def _sources(*tensors: torch.Tensor) -> tuple[list, bool]:
    """The tensors as TMA descriptors when every one allows it (and TMA exists here), else the tensors."""
    if TMA and (runtime.is_interpreter() or _tma_sms(tensors[0].device) > 0) \
            and all(t.shape[-1] <= TMA_MAX_HEAD_DIM for t in tensors):
        descs = [_descriptor(t) for t in tensors]
        if all(d is not None for d in descs):
            return descs, True
    return list(tensors), False


def _common(q, k, v, mask, scale, dropout_p, rng_state, precision):
    """Kernel arguments shared by the forward and backward launches."""
    B, Hq, L, E = q.shape
    Hkv, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    if mask is None:
        mask_kind, mask, sm = MASK_NONE, q, (0, 0, 0, 0)
    else:
        mask_kind, sm = (MASK_BOOL if mask.dtype == torch.bool else MASK_FLOAT), mask.stride()
        if mask.dtype == torch.bool:  # read as bytes (the same strides)
            mask = mask.view(torch.uint8)
    dropout = dropout_p > 0.0
    precision = precision if q.dtype == torch.float32 else "ieee"
    consts = dict(HEAD_DIM=padded(E), HEAD_DIM_V=padded(Ev), MASK_KIND=mask_kind, DROPOUT=dropout,
                  UPCAST=runtime.is_interpreter() and q.element_size() == 2, PRECISION=precision,
                  ROUND_TF32=precision == "tf32" and not runtime.is_interpreter(), NEGATE=scale < 0)
    rng = rng_state if dropout else q
    keep_scale = 1.0 / (1.0 - dropout_p) if dropout else 1.0
    return (B, Hq, L, S, E, Ev, Hq // Hkv), mask, sm, rng, keep_scale, consts


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
                      scale: float, is_causal: bool, dropout_p: float, rng_state: torch.Tensor | None,
                      precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, L, Ev] in q's dtype, lse [B, Hq, L] fp32 (natural log of sum exp(scores); -inf for empty rows).

    q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], mask None or [B, Hq, L, S] (bool or float,
    stride-0 dims allowed); o's memory is [B, L, Hq, Ev], so o.transpose(1, 2) merges heads for free.
    """
    sizes, mask, sm, rng, keep_scale, consts = _common(q, k, v, mask, scale, dropout_p, rng_state, precision)
    B, Hq, L, S, E, Ev, group = sizes
    o = torch.empty(B, L, Hq, Ev, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(B, Hq, L, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    (qs, ks, vs), use_tma = _sources(q, k, v)
    grid = lambda meta: (cdiv(L, meta["BLOCK_M"]), Hq, B)  # noqa: E731
    attention_fwd_kernel[grid](
        qs, ks, vs, mask, o, lse, rng, B, Hq, L, S, E, Ev, group,
        *q.stride(), *k.stride(), *v.stride(), *sm, *o.stride(),
        abs(float(scale)) * LOG2E, float(dropout_p), keep_scale, CAUSAL=bool(is_causal), USE_TMA=use_tma, **consts)
    return o, lse


def _gradient_buffers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv to write: slices of one buffer laid out as q, k, v are when those are slices of one
    projection's output (so the projection's gradient needs no copy), else three new tensors."""
    layout = runtime.packed_layout((q, k, v))
    if layout is not None:
        return tuple(torch.empty_strided(*layout, dtype=q.dtype, device=q.device).unbind(0))
    return tuple(torch.empty(t.shape, dtype=q.dtype, device=q.device) for t in (q, k, v))


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, mask: torch.Tensor | None, *, scale: float, is_causal: bool,
                       dropout_p: float, rng_state: torch.Tensor | None,
                       precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq [B, Hq, L, E], dk [B, Hkv, S, E], dv [B, Hkv, S, Ev] in q's dtype, from do [B, Hq, L, Ev] (any strides).

    Deterministic: each dk/dv program sums the Hq // Hkv query heads of its kv head in a fixed order.
    """
    sizes, mask, sm, rng, keep_scale, consts = _common(q, k, v, mask, scale, dropout_p, rng_state, precision)
    B, Hq, L, S, E, Ev, group = sizes
    Hkv = k.shape[1]
    dq, dk, dv = _gradient_buffers(q, k, v)
    if B * Hq * L == 0:
        return dq, dk.zero_(), dv.zero_()
    delta = torch.empty(B, Hq, L, dtype=torch.float32, device=q.device)
    attention_bwd_preprocess_kernel[lambda meta: (cdiv(L, meta["BLOCK_M"]), Hq, B)](
        o, do, delta, B, Hq, L, Ev, *o.stride(), *do.stride(), HEAD_DIM_V=consts["HEAD_DIM_V"])
    (qs, ks, vs, dos), use_tma = _sources(q, k, v, do)
    scalars = (abs(float(scale)) * LOG2E, float(scale), float(dropout_p), keep_scale)
    attention_bwd_dkdv_kernel[lambda meta: (cdiv(S, meta["BLOCK_N"]), Hkv, B)](
        qs, ks, vs, mask, dos, lse, delta, dk, dv, rng, B, Hq, L, S, E, Ev, group,
        *q.stride(), *k.stride(), *v.stride(), *sm, *do.stride(), *dk.stride(), *dv.stride(),
        *scalars, CAUSAL=bool(is_causal), USE_TMA=use_tma, **consts)
    attention_bwd_dq_kernel[lambda meta: (cdiv(L, meta["BLOCK_M"]), Hq, B)](
        qs, ks, vs, mask, dos, lse, delta, dq, rng, B, Hq, L, S, E, Ev, group,
        *q.stride(), *k.stride(), *v.stride(), *sm, *do.stride(), *dq.stride(),
        *scalars, CAUSAL=bool(is_causal), USE_TMA=use_tma, **consts)
    return dq, dk, dv

