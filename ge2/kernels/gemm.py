"""GEMM with a fused epilogue, and the fused first half of its backward.

Forward (``gemm``)::

    Z = alpha * op(A) @ op(B) + beta * C + bias        op = identity or transpose
    Y = act(Z)                                          Z is also written when asked

One Triton kernel, ``gemm_epilogue_kernel``, does it: a tiled GEMM (grouped tile order so that
neighbouring programs share A/B tiles in L2) whose accumulator never leaves registers before the
epilogue (alpha, beta*C, bias, activation, cast) is applied and Y (and Z) are stored. Operands are
addressed through their strides, so transposed views, expanded (stride-0) batches and sliced
inputs need no copy; ``trans_a``/``trans_b`` only swap the two strides of an operand. On Hopper,
large 2-D problems whose operands each have a unit stride take ``gemm_tma_kernel`` instead: the
same epilogue behind a persistent main loop fed by TMA tensor descriptors (docs/gemm.md has the
measurements behind each choice).

Backward (``gemm_backward``) is two steps:

1. ``bias_act_backward_kernel``: one pass over gY that computes gZ = gY * act'(Z or Y), writes gZ
   (and dC = beta * gZ), and reduces gZ per tile into a partial-sum buffer for the bias gradient;
   ``sum_partials_kernel`` then adds the partials in a fixed order. No atomics: the bias gradient
   is bitwise reproducible run to run.
2. dA = alpha * gZ @ op(B)^T and dB = alpha * op(A)^T @ gZ with the same GEMM kernel, written
   straight into dA's / dB's own layout (for trans_a, dA^T = op(B) @ gZ^T is computed instead, so
   the output is contiguous without a transpose pass). An operand whose batch stride is 0 (an
   expanded broadcast) gets its gradient summed over the batch inside the GEMM's reduction loop.

Numerics: bf16/fp16 operands go to the tensor cores with fp32 accumulation; the epilogue runs in
fp32 (fp64 for fp64 inputs). fp32 operands use ``ge2.runtime.get_matmul_precision()``: "ieee"
(exact fp32 FMA), "tf32" or "tf32x3" (Triton's 3-pass error-compensated tf32).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels import activations
from ge2.kernels.native import CU_TENSOR_MAP_DATA_TYPE_TFLOAT32
from ge2.kernels.activations import act_fwd, act_grad_from_y, act_grad_from_z

BIAS_KINDS: dict[str, int] = {"none": 0, "scalar": 1, "per_m": 2, "per_n": 3}

# ---------------------------------------------------------------------------------------------
# Config space (Hopper). 16-bit operands: wgmma tiles 128x128..128x256 with a 64-deep K step and
# 3-4 smem stages (a 128x256x64 bf16 stage is 48 KB; 3 fit in the 228 KB of an H100 SM). fp32
# (tf32) operands halve the K step to keep the same bytes per stage. Small problems get the
# 64-wide tiles so that 512x784-class outputs still fill the 132 SMs.
# ---------------------------------------------------------------------------------------------


def tile_config(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8,
                pre_hook=None) -> triton.Config:
    """A GEMM-style tile config (also used by the implicit-GEMM conv kernels)."""
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
                         num_warps=warps, num_stages=stages, pre_hook=pre_hook)


CONFIGS_16BIT = [
    tile_config(128, 256, 64, 8, 3),
    tile_config(128, 128, 64, 8, 4),
    tile_config(128, 128, 64, 4, 4),
    tile_config(256, 128, 64, 8, 3),
    tile_config(64, 128, 64, 4, 4),
    tile_config(64, 64, 64, 4, 4),
]
CONFIGS_FP32 = [  # tf32 / tf32x3 tensor-core tiles
    tile_config(128, 256, 32, 8, 3),
    tile_config(128, 128, 32, 8, 4),
    tile_config(128, 128, 32, 4, 4),
    tile_config(64, 128, 32, 4, 4),
    tile_config(64, 64, 32, 4, 4),
]
# "ieee" fp32 (and fp64) dots are CUDA-core FMAs: small tiles that fill the SMs win. Measured on
# the H100 at the MLP step's shapes, the tensor-core tiles above ran 1.2-30x slower (a 64x128 FMA
# tile through TMA spills: 2.3 ms for 64x1024x784), and TMA buys nothing for FMA tiles.
CONFIGS_FMA = [
    tile_config(32, 32, 32, 4, 3),
    tile_config(32, 64, 32, 4, 3),
    tile_config(64, 64, 32, 4, 3),
    tile_config(128, 64, 32, 8, 3),
]
# tf32: round operands to nearest before the tensor cores (cuBLAS's numerics); the bench turns
# this off once to measure what the rounding costs.
ROUND_TF32 = True
# Split-K: a GEMM whose output has too few tiles to fill the GPU but a long reduction (the
# 64x128x3136 first FC layer of a small CNN: 2 tiles, each walking K alone for ~30 us) splits K
# over up to SPLIT_K_MAX programs per tile, chunks of at least SPLIT_K_CHUNK, and adds the fp32
# partial sums in a second, fixed-order pass (deterministic, no atomics).
SPLIT_K_MIN_K = 512
SPLIT_K_CHUNK = 128
SPLIT_K_MAX = 32
SPLIT_EPILOGUE_BLOCKS = (16, 16, 32)  # (splits, rows, columns) summed per step: 8K values, 4 warps
# The backward's K-major operand copies (``_k_major``) pay from here up: measured on the H100 in
# tf32x3, 64x1024x1024 ran 22 us without them and 30 us with; 512x1024x1024, 46 without and 37 with.
KMAJOR_COPY_MIN = 1 << 27
# Split tail (gemm_tma_kernel): a GEMM of about one wave whose last wave leaves most SMs idle
# (the GPT's weight gradients, 768x3072 over K = 8192: 144 tiles on 132 SMs, two tile-times for
# 1.1 waves of work) splits that wave's tiles along K over all SMs. Considered from this K up, for
# outputs of at most 1.5 waves of 128x128 tiles: with more, smaller whole tiles measured as fast
# or faster (8192x768 over K = 2304: 48 us whole, 57 us with 128x256 tiles and a split tail).
SPLIT_TAIL_MIN_K = 1024
SPLIT_TAIL_MIN_K_TILES = tl.constexpr(8)  # a last wave filled to at most half splits into pieces of >= 8 k-steps
SPLIT_TAIL = True  # off: every tile whole (benchmarks compare the two)


def _split_tail_on(M: int, N: int, K: int, num_sms: int) -> bool:
    """Whether gemm_tma_kernel may split its last wave (each config then decides in the kernel)."""
    return SPLIT_TAIL and K >= SPLIT_TAIL_MIN_K and runtime.cdiv(M, 128) * runtime.cdiv(N, 128) <= 3 * num_sms // 2
# Problems under this many multiply-adds are launch-bound: one small config, no tuning.
SMALL_PROBLEM = 1 << 24
SMALL_CONFIG = tile_config(64, 64, 32, 4, 3)
# The interpreter runs one pinned config: small enough to be quick on tiny test shapes.
INTERPRETER_CONFIG = tile_config(32, 32, 32, 4, 1, group_m=4)


def _prune(configs, named_args, **_kwargs):
    """Keep the configs that suit the operand dtype and the problem size."""
    M, N, K, B = named_args["M"], named_args["N"], named_args["K"], named_args["B"]
    if M * N * K * B < SMALL_PROBLEM:
        return [SMALL_CONFIG]
    size = named_args["a_ptr"].element_size()
    if size <= 2:
        space = CONFIGS_16BIT
    elif {**named_args, **_kwargs}["PRECISION"] == "ieee":  # fp32 ieee and fp64
        space = CONFIGS_FMA
    else:
        space = CONFIGS_FP32
    return [c for c in configs if c in space] or [SMALL_CONFIG]


def _even_k(args) -> bool:
    return args["K"] % args["BLOCK_K"] == 0 and args["K_CHUNK"] % args["BLOCK_K"] == 0


@triton.jit
def _round_to_tf32(x):
    # Round to nearest (ties away), as cuBLAS does. Fed raw fp32 bits, the tensor cores truncate
    # to tf32 instead: a bias of -2**-11 per operand that doubled the error of a tf32 GEMM
    # relative to cuBLAS's (7.7e-4 vs 2.9e-4 at K=1283, measured on the H100).
    return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _tile_dot(acc, a_ptrs, b_ptrs, K, stride_ak, stride_bk,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
              ROUND_TF32: tl.constexpr):
    """acc += A[BLOCK_M, K] @ B[K, BLOCK_N], walking K in BLOCK_K steps."""
    offs_k = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if ROUND_TF32:
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile number ``tile`` in grouped order: GROUP_M row-tiles share each
    column-tile of B while it is hot in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_in_group = GROUP_M * num_pid_n
    first_m = (tile // pids_in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    return first_m + ((tile % pids_in_group) % group_rows), (tile % pids_in_group) // group_rows


@triton.jit
def _epilogue(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
              y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha,
              HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr):
    """Z = alpha*acc + beta*C + bias, Y = act(Z), in the accumulator's precision; store Y (and Z)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z = acc * alpha
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, mask=mask, other=0.0)
        z += beta * c.to(acc.dtype)
    if BIAS_KIND == 1:
        z += tl.load(bias_ptr).to(acc.dtype)
    elif BIAS_KIND == 2:
        z += tl.load(bias_ptr + offs_m * stride_bias, mask=offs_m < M, other=0.0).to(acc.dtype)[:, None]
    elif BIAS_KIND == 3:
        z += tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(acc.dtype)[None, :]
    y_offs = offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    if SAVE_Z:
        tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    y = act_fwd(z, ACT, act_alpha)
    tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(
    CONFIGS_16BIT + CONFIGS_FP32 + CONFIGS_FMA,
    key=["M", "N", "K", "B", "REDUCE_BATCH", "PRECISION", "ROUND_TF32", "ACT", "SAVE_Z"],  # as gemm_tma_kernel's
    exact_keys=("ACT",),
    default=INTERPRETER_CONFIG,
    prune_configs_by={"early_config_prune": _prune},
)
@triton.heuristics({"EVEN_K": _even_k})
@triton.jit
def gemm_epilogue_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr,
    M, N, K, B,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_yb, stride_ym, stride_yn,
    stride_bias, K_CHUNK,
    alpha, beta, act_alpha,
    HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    REDUCE_BATCH: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ROUND_TF32: tl.constexpr, ACC_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """Y[b] = act(alpha * A[b] @ B[b] + beta * C[b] + bias) for one BLOCK_M x BLOCK_N tile.

    grid = (tiles, batch); with REDUCE_BATCH, grid = (tiles, 1) and the batch is summed inside
    the reduction loop (Y = sum_b A[b] @ B[b]), which is how a broadcast operand's gradient is made.
    With SPLIT_K, grid = (tiles, splits): program (t, s) reduces K[s*K_CHUNK : (s+1)*K_CHUNK] and
    stores its raw fp32 sum into Y[s] (a [splits, M, N] buffer); ``split_k_epilogue_kernel`` adds
    the splits in a fixed order and applies the epilogue.
    """
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)  # batch offsets can pass 2**31 elements
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge wrap around (their results are masked at the store), so the
    # main loop's loads need no M/N masks.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    a_tile = offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_tile = offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    if REDUCE_BATCH:
        a_batch, b_batch = a_ptr, b_ptr  # 64-bit pointers step through the batch: no index overflow
        for _ in range(0, B):
            acc = _tile_dot(acc, a_batch + a_tile, b_batch + b_tile, K, stride_ak, stride_bk,
                            BLOCK_K, EVEN_K, PRECISION, UPCAST, ROUND_TF32)
            a_batch += stride_ab
            b_batch += stride_bb
    elif SPLIT_K:
        k0 = pid_b * K_CHUNK
        acc = _tile_dot(acc, a_ptr + k0 * stride_ak + a_tile, b_ptr + k0 * stride_bk + b_tile,
                        tl.minimum(K_CHUNK, K - k0), stride_ak, stride_bk, BLOCK_K, EVEN_K, PRECISION, UPCAST,
                        ROUND_TF32)
    else:
        acc = _tile_dot(acc, a_ptr + pid_b * stride_ab + a_tile, b_ptr + pid_b * stride_bb + b_tile,
                        K, stride_ak, stride_bk, BLOCK_K, EVEN_K, PRECISION, UPCAST, ROUND_TF32)

    if SPLIT_K:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y_ptr + pid_b * stride_yb + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, acc, mask=mask)
    else:
        _epilogue(acc, offs_m, offs_n, M, N, c_ptr + pid_b * stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                  y_ptr + pid_b * stride_yb, z_ptr + pid_b * stride_yb, stride_ym, stride_yn, alpha, beta, act_alpha,
                  HAS_C, BIAS_KIND, ACT, SAVE_Z)


@triton.jit
def split_k_epilogue_kernel(
    part_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, M, N, SPLITS,
    stride_cm, stride_cn, stride_ym, stride_yn, stride_bias,
    alpha, beta, act_alpha,
    HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Y = act(alpha * sum_s part[s] + beta * C + bias) for one tile; part is [SPLITS, M, N] contiguous.

    BLOCK_S splits are loaded at once: a loop of one load per split was a chain of ~25 memory
    latencies (35 us for a 64x128 output on the H100). The sum's order is fixed by the block shape.
    """
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_s = tl.arange(0, BLOCK_S)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=part_ptr.dtype.element_ty)
    for s0 in range(0, SPLITS, BLOCK_S):
        split = s0 + offs_s
        ptrs = part_ptr + split[:, None, None].to(tl.int64) * M * N + tile[None, :, :]
        acc += tl.sum(tl.load(ptrs, mask=(split[:, None, None] < SPLITS) & mask[None, :, :], other=0.0), axis=0)
    _epilogue(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
              y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha, HAS_C, BIAS_KIND, ACT, SAVE_Z)


# ---------------------------------------------------------------------------------------------
# Hopper variant: persistent, operands through TMA tensor descriptors
# ---------------------------------------------------------------------------------------------
# One program per SM walks the tiles (no tail wave, the next tile's loads overlap this tile's
# epilogue); the copy engine fetches A/B tiles into shared memory (zero-filled past the edges,
# so no masks and no address arithmetic in the main loop). Used for 2-D problems whose operands
# each have a unit stride (any of the 4 K-major / MN-major combinations) and 16-byte aligned rows.
# A config's shared memory (the sm_90 build's: stages plus the epilogue's layout-conversion
# buffer, which stays live beside the next tile's prefetched stages) must stay under 227 KB, or it
# cannot launch; the sizes below are the compiled ones, with an fp32 output.
USE_TMA = True


def _tma_block_shapes(nargs) -> None:
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk] if nargs["A_KMAJOR"] else [bk, bm]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]


def _tma_cfg(bm, bn, bk, warps, stages, group_m=8, epi_split=False) -> triton.Config:
    cfg = tile_config(bm, bn, bk, warps, stages, group_m, pre_hook=_tma_block_shapes)
    cfg.kwargs["EPI_SPLIT"] = epi_split
    return cfg


TMA_CONFIGS_16BIT = [
    _tma_cfg(128, 256, 64, 8, 3),
    _tma_cfg(128, 256, 64, 8, 4),           # 224 KB
    _tma_cfg(128, 128, 64, 8, 4),
    _tma_cfg(128, 128, 64, 4, 4),
    _tma_cfg(64, 128, 64, 4, 4),
    _tma_cfg(64, 64, 64, 4, 4),
]
TMA_CONFIGS_FP32 = [  # an fp32 tile's epilogue buffer is 2x a 16-bit one's: split it, or fewer stages fit
    _tma_cfg(128, 256, 32, 8, 3, epi_split=True),  # 208 KB (unsplit: 272 KB, cannot launch)
    _tma_cfg(128, 256, 32, 8, 2),           # 224 KB
    _tma_cfg(128, 128, 32, 8, 4),           # 192 KB
    _tma_cfg(128, 128, 32, 4, 4),           # 160 KB
    _tma_cfg(64, 128, 32, 4, 4),
    _tma_cfg(64, 64, 32, 4, 4),
]

TMA_MAX_TILE = max(c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in TMA_CONFIGS_16BIT + TMA_CONFIGS_FP32)


# tf32 through TMA: a tensor map of element type TFLOAT32 makes the copy engine round each fp32
# operand to nearest tf32 on its way into shared memory, so the tensor cores get cuBLAS's operands
# for free. Rounding in registers instead (_round_to_tf32) sent every B tile through registers and
# back to shared memory before a synchronous wgmma: 0.64x of cuBLAS at 4096^3 (TTGIR: local_load,
# cvt, local_alloc, warp_group_dot_wait pendings=0 in every k step). Later Tritons take
# TensorDescriptor(..., round_f32_to_tf32=True); Triton 3.6's launcher always encodes the element
# type the kernel was compiled for, so ``_tma_rounding`` teaches it the same flag (the same
# substitution as upstream's: element type 11, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32).
_TMA_ROUNDING: list = []  # [descriptor class taking round_f32_to_tf32] once probed; [None] if unsupported


def _tma_rounding():
    """A TensorDescriptor class whose ``round_f32_to_tf32=True`` makes TMA round fp32 to tf32, or None."""
    if _TMA_ROUNDING:
        return _TMA_ROUNDING[0]
    import dataclasses

    from triton.tools.tensor_descriptor import TensorDescriptor

    cls = None
    if "round_f32_to_tf32" in {f.name for f in dataclasses.fields(TensorDescriptor)}:
        cls = TensorDescriptor
    else:
        try:
            from triton.backends.nvidia import driver
            encode = driver.make_tensordesc_arg
            host_type = driver.TMA_DTYPE_DEVICE_TO_HOST
        except (ImportError, AttributeError):
            encode = host_type = None
        if encode is not None and host_type.get(CU_TENSOR_MAP_DATA_TYPE_TFLOAT32) == CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
            @dataclasses.dataclass
            class RoundingTensorDescriptor(TensorDescriptor):
                round_f32_to_tf32: bool = False

            def make_tensordesc_arg(arg, metadata):
                if metadata is not None and getattr(arg, "round_f32_to_tf32", False):
                    metadata = {**metadata, "elem_type": CU_TENSOR_MAP_DATA_TYPE_TFLOAT32}
                return encode(arg, metadata)

            driver.make_tensordesc_arg = make_tensordesc_arg  # looked up per launch by the launcher
            cls = RoundingTensorDescriptor
    _TMA_ROUNDING.append(cls)
    return cls


def _prune_tma(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}  # constexprs passed by keyword arrive in kwargs
    wide = args["OPERAND_BYTES"] <= 2
    keep = [c for c in configs if (c in TMA_CONFIGS_16BIT) == wide]
    # Small problems: tiles that leave SMs idle lose to smaller ones; let only those compete (unless
    # the split tail spreads a short last wave over every SM).
    fills = [c for c in keep if args["SPLIT_TAIL"] or runtime.cdiv(args["M"], c.kwargs["BLOCK_M"])
             * runtime.cdiv(args["N"], c.kwargs["BLOCK_N"]) >= args["NUM_SMS"] // 2]
    return fills or keep[-2:]


@runtime.autotune(
    TMA_CONFIGS_16BIT + TMA_CONFIGS_FP32,
    # the epilogue is part of the key: an erf-gelu epilogue favours smaller tiles than none does, and
    # shapes that share a size bucket (the GPT's c_attn and c_fc) must not share one pick
    key=["M", "N", "K", "A_KMAJOR", "B_KMAJOR", "PRECISION", "ROUND_TF32", "ACT", "SAVE_Z", "SPLIT_TAIL"],
    exact_keys=("ACT",),
    default=2,
    prune_configs_by={"early_config_prune": _prune_tma},
)
@triton.jit
def gemm_tma_kernel(
    a_desc, b_desc, c_ptr, bias_ptr, y_ptr, z_ptr, part_ptr, arrivals_ptr,
    M, N, K,
    stride_cm, stride_cn, stride_ym, stride_yn, stride_bias,
    alpha, beta, act_alpha,
    HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, OPERAND_BYTES: tl.constexpr,
    PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr, NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr, SPLIT_TAIL: tl.constexpr,
):
    """The same Y = act(alpha * A @ B + beta * C + bias) as gemm_epilogue_kernel; grid = (SMs,).

    ROUND_TF32 rounds the operands in registers: only where the descriptors cannot (``_tma_rounding``).
    SPLIT_TAIL: the tiles of a last, mostly idle wave are split along K (``_tail_splits``); part_ptr
    (fp32, NUM_SMS tiles) and arrivals_ptr (int32 [NUM_SMS], zero) are its scratch.
    """
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLIT_TAIL:
        splits = _tail_splits(num_tiles, k_tiles, NUM_SMS)
        whole = tl.where(splits > 1, num_tiles - num_tiles % NUM_SMS, num_tiles)  # tiles of the full waves
    else:
        splits = 1
        whole = num_tiles
    for tile in tl.range(tl.program_id(0), whole, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = _tma_tile_sum(a_desc, b_desc, m0, n0, 0, k_tiles, A_KMAJOR, B_KMAJOR, PRECISION, ROUND_TF32,
                            BLOCK_M, BLOCK_N, BLOCK_K)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        if EPI_SPLIT:  # two BLOCK_N/2 halves: half the epilogue's shared-memory buffer
            acc0, acc1 = acc.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
            offs_n = n0 + tl.arange(0, BLOCK_N // 2)
            _epilogue(acc0, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
                      y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha, HAS_C, BIAS_KIND, ACT, SAVE_Z)
            _epilogue(acc1, offs_m, offs_n + BLOCK_N // 2, M, N, c_ptr, stride_cm, stride_cn, bias_ptr,
                      stride_bias, y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha,
                      HAS_C, BIAS_KIND, ACT, SAVE_Z)
        else:
            offs_n = n0 + tl.arange(0, BLOCK_N)
            _epilogue(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
                      y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha, HAS_C, BIAS_KIND, ACT, SAVE_Z)
    if SPLIT_TAIL:
        # The last wave's tiles, each cut into `splits` K-ranges: a program adds one range into a
        # partial tile; the last of a tile's programs to arrive sums its partials in split order
        # (deterministic) and runs the epilogue. No program waits on another, so none can hang.
        chunk = tl.cdiv(k_tiles, splits)
        rows = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        part_tile = rows[:, None] * BLOCK_N + cols[None, :]
        for unit in range(tl.program_id(0), (num_tiles - whole) * splits, NUM_SMS):
            t = unit // splits
            pid_m, pid_n = _tile_coords(whole + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            m0 = pid_m * BLOCK_M
            n0 = pid_n * BLOCK_N
            acc = _tma_tile_sum(a_desc, b_desc, m0, n0, (unit % splits) * chunk,
                                tl.minimum(k_tiles, (unit % splits + 1) * chunk), A_KMAJOR, B_KMAJOR, PRECISION,
                                ROUND_TF32, BLOCK_M, BLOCK_N, BLOCK_K)
            tl.store(part_ptr + unit * (BLOCK_M * BLOCK_N) + part_tile, acc)
            tl.debug_barrier()  # every thread's partial is written before the tile's count moves
            if tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel") == splits - 1:
                tl.debug_barrier()  # no thread reads the partials before the count said they are in
                tl.store(arrivals_ptr + t, 0)  # ready for the next launch (autotuning reruns one buffer)
                _split_tail_epilogue(part_ptr + t * splits * (BLOCK_M * BLOCK_N), splits, m0, n0, M, N,
                                     c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias, y_ptr, z_ptr,
                                     stride_ym, stride_yn, alpha, beta, act_alpha,
                                     HAS_C, BIAS_KIND, ACT, SAVE_Z, BLOCK_M, BLOCK_N)


@triton.jit
def _tma_tile_sum(a_desc, b_desc, m0, n0, k_lo, k_hi, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr,
                  PRECISION: tl.constexpr, ROUND_TF32: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] sum of the tile at (m0, n0) over K-steps [k_lo, k_hi), operands by TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        k0 = ki * BLOCK_K
        a = a_desc.load([m0, k0]) if A_KMAJOR else a_desc.load([k0, m0]).T
        b = b_desc.load([n0, k0]).T if B_KMAJOR else b_desc.load([k0, n0])
        if ROUND_TF32:
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _tail_splits(num_tiles, k_tiles, NUM_SMS: tl.constexpr):
    """K-splits per tile of the last wave (1: none): enough to give every SM a piece."""
    left = num_tiles % NUM_SMS
    splits = tl.minimum(NUM_SMS // tl.maximum(left, 1), k_tiles // SPLIT_TAIL_MIN_K_TILES)
    return tl.where((left > 0) & (2 * left <= NUM_SMS) & (splits > 1), splits, 1)


@triton.jit
def _split_tail_epilogue(parts_ptr, splits, m0, n0, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
                         y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha,
                         HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sum a tile's `splits` fp32 partials (at parts_ptr, in order) and run the epilogue, a quarter
    of the tile's columns at a time; four partials are loaded at once (fewer latencies in a row)."""
    SUB_N: tl.constexpr = BLOCK_N // 4
    rows = tl.arange(0, BLOCK_M)
    offs_m = m0 + rows
    for q in tl.static_range(4):
        cols = q * SUB_N + tl.arange(0, SUB_N)
        sub = rows[:, None] * BLOCK_N + cols[None, :]
        total = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
        for s0 in range(0, splits, 4):
            p0 = tl.load(parts_ptr + s0 * (BLOCK_M * BLOCK_N) + sub, cache_modifier=".cg")
            p1 = tl.load(parts_ptr + (s0 + 1) * (BLOCK_M * BLOCK_N) + sub, mask=s0 + 1 < splits, other=0.0,
                         cache_modifier=".cg")
            p2 = tl.load(parts_ptr + (s0 + 2) * (BLOCK_M * BLOCK_N) + sub, mask=s0 + 2 < splits, other=0.0,
                         cache_modifier=".cg")
            p3 = tl.load(parts_ptr + (s0 + 3) * (BLOCK_M * BLOCK_N) + sub, mask=s0 + 3 < splits, other=0.0,
                         cache_modifier=".cg")
            total = (((total + p0) + p1) + p2) + p3
        _epilogue(total, offs_m, n0 + cols, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_bias,
                  y_ptr, z_ptr, stride_ym, stride_yn, alpha, beta, act_alpha, HAS_C, BIAS_KIND, ACT, SAVE_Z)


_SM_COUNT: dict[int, tuple[int, int]] = {}  # device index -> (SMs, compute capability major)
INTERPRETER_SMS = 132  # what the interpreter pretends to have, so that it takes the GPU's decisions


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    if device.index not in _SM_COUNT:
        props = torch.cuda.get_device_properties(device)
        _SM_COUNT[device.index] = (props.multi_processor_count, props.major)
    return _SM_COUNT[device.index][0]


def _tma_sms(device: torch.device) -> int:
    """The SM count on Hopper+ GPUs (persistent TMA grid), 0 elsewhere (no TMA path)."""
    sms = _sm_count(device)
    return sms if device.type == "cuda" and _SM_COUNT[device.index][1] >= 9 else 0


def _split_k(M: int, N: int, K: int, batch: int, device: torch.device) -> tuple[int, int]:
    """(splits, chunk) of K for one GEMM: (1, K) unless too few output tiles meet a long K."""
    if batch != 1 or K < SPLIT_K_MIN_K:
        return 1, K
    sms = _sm_count(device)
    tiles = runtime.cdiv(M, 64) * runtime.cdiv(N, 64)
    splits = min(SPLIT_K_MAX, sms // tiles, runtime.cdiv(K, SPLIT_K_CHUNK))
    if tiles * 2 > sms or splits < 2:
        return 1, K
    chunk = runtime.cdiv(runtime.cdiv(K, splits), SPLIT_K_CHUNK) * SPLIT_K_CHUNK
    return runtime.cdiv(K, chunk), chunk


def _tma_operands(a_view, b_view):
    """((A, shape, strides, a_kmajor), (B, ...)) as TMA can read them, or None where it cannot.

    K-major: [rows, K] with unit stride along K; MN-major: [K, rows] with unit stride along rows.
    """
    a, (sab, sam, sak), batch, M, K = a_view
    b, (sbb, sbk, sbn), _, _, N = b_view
    if batch != 1 or a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    size = a.element_size()
    operands = []
    for t, rows, s_row, s_col in ((a, M, sam, sak), (b, N, sbn, sbk)):
        if t.data_ptr() % 16:  # checked first: TensorDescriptor asserts on a misaligned base
            return None
        if s_col == 1 and (s_row * size) % 16 == 0 and (K * size) % 16 == 0:
            operands.append((t, [rows, K], [s_row, 1], True))
        elif s_row == 1 and (s_col * size) % 16 == 0 and (rows * size) % 16 == 0:
            operands.append((t, [K, rows], [s_col, 1], False))
        else:
            return None
    return tuple(operands)


def _tma_descriptors(operands, round_tf32: bool = False):
    """(a_desc, b_desc, a_kmajor, b_kmajor) of the TMA kernel from ``_tma_operands``' answer.

    With ``round_tf32`` the descriptors round fp32 to tf32 if this Triton lets them (``_tma_rounding``).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    rounding = _tma_rounding() if round_tf32 else None
    if rounding is not None:
        TensorDescriptor = functools.partial(rounding, round_f32_to_tf32=True)  # noqa: N806
    (a, a_shape, a_strides, a_kmajor), (b, b_shape, b_strides, b_kmajor) = operands
    return (TensorDescriptor(a, a_shape, a_strides, [16, 16]), TensorDescriptor(b, b_shape, b_strides, [16, 16]),
            a_kmajor, b_kmajor)


def _gemm_ws():
    """The Gluon kernel's module, imported on first use (it imports this module's tile order)."""
    from ge2.kernels import gemm_ws
    return gemm_ws


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return runtime.get_matmul_precision()
    return "ieee"  # ignored by tl.dot for 16-bit operands; the only choice for fp64


def _operand_strides(t: torch.Tensor, trans: bool) -> tuple[int, int, int]:
    """(batch, row, col) strides of op(t) for a 2-D or 3-D t; transposing only swaps two strides."""
    sb = t.stride(0) if t.dim() == 3 else 0
    s0, s1 = t.stride(-2), t.stride(-1)
    return (sb, s1, s0) if trans else (sb, s0, s1)


def _k_major(view, role: str):
    """``view`` with its reduction dim made unit-stride by a copy (no-op when it already is).

    tf32 tensor-core instructions read both operands K-major only; Triton feeds an MN-major fp32
    tile by transposing it on chip, which ran the backward's dX/dW GEMMs at ~1/3 of the forward's
    speed on the H100. A copy costs one pass over the operand, far less than that.
    """
    t, (sb, sr, sc), batch, rows, cols = view
    if (sc if role == "a" else sr) == 1:
        return view
    logical = torch.as_strided(t, (batch, rows, cols), (sb, sr, sc))
    if role == "a":  # [B, M, K] with unit stride along K
        copy = torch.empty((batch, rows, cols), dtype=t.dtype, device=t.device).copy_(logical)
        return copy, (rows * cols, cols, 1), batch, rows, cols
    copy = torch.empty((batch, cols, rows), dtype=t.dtype, device=t.device)  # [B, N, K]
    copy.copy_(logical.transpose(1, 2))
    return copy, (rows * cols, 1, rows), batch, rows, cols


def _epilogue_operands(y, z, c, bias) -> tuple[tuple, tuple]:
    """((c, bias, y, z) pointers, (c rows/cols, y rows/cols, bias) strides) of a 2-D epilogue;
    absent operands point at y with zero strides (their constexpr flags keep them unread)."""
    ptrs = (c if c is not None else y, bias if bias is not None else y, y, z if z is not None else y)
    strides = (c.stride(-2) if c is not None else 0, c.stride(-1) if c is not None else 0, y.stride(-2), y.stride(-1),
               bias.stride(0) if bias is not None and bias.dim() == 1 else 0)
    return ptrs, strides


def _launch(a_view, b_view, y, *, z=None, c=None, bias=None, bias_kind=0, act=0, act_alpha=0.01,
            alpha=1.0, beta=0.0, reduce_batch=False, kmajor_copies=False) -> None:
    """Launch the kernel on op(A) = a_view ([B, M, K] strides) and op(B) = b_view ([B, K, N] strides).

    ``a_view``/``b_view`` are (tensor, (stride_b, stride_row, stride_col), batch, rows, cols);
    ``y`` (and ``z``) are [B, M, N] (or [M, N]) tensors of any strides.
    """
    a, (sab, sam, sak), batch, M, K = a_view
    b, (sbb, sbk, sbn), _, _, N = b_view
    if y.numel() == 0:
        return
    precision = _precision(a.dtype)
    round_tf32 = ROUND_TF32 and precision == "tf32" and not runtime.is_interpreter()
    if (kmajor_copies and precision != "ieee" and a.dtype == torch.float32 and not reduce_batch
            and M * N * K >= KMAJOR_COPY_MIN):
        a_view, b_view = _k_major(a_view, "a"), _k_major(b_view, "b")
        a, (sab, sam, sak) = a_view[0], a_view[1]
        b, (sbb, sbk, sbn) = b_view[0], b_view[1]
    splits, chunk = (1, K) if reduce_batch else _split_k(M, N, K, batch, a.device)
    if splits > 1:
        _launch_split_k(a_view, b_view, y, splits, chunk, z=z, c=c, bias=bias, bias_kind=bias_kind, act=act,
                        act_alpha=act_alpha, alpha=alpha, beta=beta, precision=precision, round_tf32=round_tf32)
        return
    fma = a.dtype == torch.float32 and precision == "ieee"  # CUDA-core tiles: TMA buys nothing there
    num_sms = (_tma_sms(a.device) if USE_TMA and not reduce_batch and not fma and not runtime.is_interpreter()
               and M * N * K >= SMALL_PROBLEM else 0)
    operands = _tma_operands(a_view, b_view) if num_sms else None
    if operands is not None and c is None and _gemm_ws().launch(operands, M, N, K, y, z=z, bias=bias,
                                                             bias_kind=bias_kind, act=act, act_alpha=act_alpha,
                                                             alpha=alpha, num_sms=num_sms):
        return
    if operands is not None:
        a_desc, b_desc, a_kmajor, b_kmajor = _tma_descriptors(operands, round_tf32)
        ptrs, strides = _epilogue_operands(y, z, c, bias)
        split_tail = _split_tail_on(M, N, K, num_sms)
        # One program per SM; fewer when there are fewer tiles, except with a split tail, whose
        # pieces of a few tiles are spread over every SM (the kernel decides per config).
        grid = lambda meta: (num_sms if split_tail else  # noqa: E731
                             min(num_sms, runtime.cdiv(M, meta["BLOCK_M"]) * runtime.cdiv(N, meta["BLOCK_N"])),)
        if split_tail:  # room for one partial tile per SM (of the largest config), arrival counts
            part = torch.empty(num_sms * TMA_MAX_TILE, dtype=torch.float32, device=y.device)
            arrivals = torch.zeros(num_sms, dtype=torch.int32, device=y.device)
        else:
            part = arrivals = y
        gemm_tma_kernel[grid](
            a_desc, b_desc, *ptrs, part, arrivals, M, N, K, *strides,
            float(alpha), float(beta), float(act_alpha),
            HAS_C=c is not None, BIAS_KIND=bias_kind, ACT=act, SAVE_Z=z is not None,
            A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, OPERAND_BYTES=a.element_size(),
            PRECISION=precision, ROUND_TF32=round_tf32 and not getattr(a_desc, "round_f32_to_tf32", False),
            NUM_SMS=num_sms, SPLIT_TAIL=split_tail,
        )
        return
    ys = (y.stride(0) if y.dim() == 3 else 0, y.stride(-2), y.stride(-1))
    cs = (c.stride(0) if c.dim() == 3 else 0, c.stride(-2), c.stride(-1)) if c is not None else (0, 0, 0)
    grid = lambda meta: (runtime.cdiv(M, meta["BLOCK_M"]) * runtime.cdiv(N, meta["BLOCK_N"]),
                         1 if reduce_batch else batch)
    gemm_epilogue_kernel[grid](
        a, b, c if c is not None else y, bias if bias is not None else y, y, z if z is not None else y,
        M, N, K, batch,
        sab, sam, sak, sbb, sbk, sbn, *cs, *ys,
        bias.stride(0) if bias is not None and bias.dim() == 1 else 0, K,
        float(alpha), float(beta), float(act_alpha),
        HAS_C=c is not None, BIAS_KIND=bias_kind, ACT=act, SAVE_Z=z is not None,
        REDUCE_BATCH=reduce_batch, SPLIT_K=False, PRECISION=precision,
        UPCAST=runtime.is_interpreter() and a.element_size() <= 2,
        ROUND_TF32=round_tf32,
        ACC_DTYPE=tl.float64 if a.dtype == torch.float64 else tl.float32,
    )


def _launch_split_k(a_view, b_view, y, splits: int, chunk: int, *, z, c, bias, bias_kind: int, act: int,
                    act_alpha: float, alpha: float, beta: float, precision: str, round_tf32: bool) -> None:
    """A 2-D GEMM as ``splits`` K-chunks of ``chunk`` into an fp32 (fp64) [splits, M, N] buffer, then
    one pass that adds them in order and applies the epilogue."""
    a, (_, sam, sak), _, M, K = a_view
    b, (_, sbk, sbn), _, _, N = b_view
    acc_dtype = torch.float64 if a.dtype == torch.float64 else torch.float32
    part = torch.empty((splits, M, N), dtype=acc_dtype, device=a.device)
    grid = lambda meta: (runtime.cdiv(M, meta["BLOCK_M"]) * runtime.cdiv(N, meta["BLOCK_N"]), splits)  # noqa: E731
    gemm_epilogue_kernel[grid](
        a, b, part, part, part, part,
        M, N, K, splits,
        0, sam, sak, 0, sbk, sbn, 0, 0, 0, M * N, N, 1,
        0, chunk,
        1.0, 0.0, 0.0,
        HAS_C=False, BIAS_KIND=0, ACT=0, SAVE_Z=False,
        REDUCE_BATCH=False, SPLIT_K=True, PRECISION=precision,
        UPCAST=runtime.is_interpreter() and a.element_size() <= 2,
        ROUND_TF32=round_tf32,
        ACC_DTYPE=tl.float64 if acc_dtype == torch.float64 else tl.float32,
    )
    bs, bm, bn = SPLIT_EPILOGUE_BLOCKS
    ptrs, strides = _epilogue_operands(y, z, c, bias)
    split_k_epilogue_kernel[(runtime.cdiv(M, bm), runtime.cdiv(N, bn))](
        part, *ptrs, M, N, splits, *strides,
        float(alpha), float(beta), float(act_alpha),
        HAS_C=c is not None, BIAS_KIND=bias_kind, ACT=act, SAVE_Z=z is not None,
        BLOCK_S=bs, BLOCK_M=bm, BLOCK_N=bn, num_warps=4,
    )


def _view(t: torch.Tensor, trans: bool):
    """(tensor, strides of op(t), batch, rows, cols) of op(t)."""
    rows, cols = (t.shape[-1], t.shape[-2]) if trans else (t.shape[-2], t.shape[-1])
    return t, _operand_strides(t, trans), (t.shape[0] if t.dim() == 3 else 1), rows, cols


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
         trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0,
         bias_kind: str = "none", act: str = "none", act_alpha: float = 0.01, save_z: bool = False,
         out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Y, Z) with Z = alpha*op(a)@op(b) + beta*c + bias, Y = act(Z): [M, N] or [B, M, N], contiguous.

    Z is returned (else None) only when ``save_z`` and backward of ``act`` needs Z (gelu, silu).
    Inputs are assumed validated by the op schema (``ge2.backend.gemm``).
    """
    code = activations.act_code("gemm", act, act_alpha)
    av, bv = _view(a, trans_a), _view(b, trans_b)
    M, N = av[3], bv[4]
    shape = (a.shape[0], M, N) if a.dim() == 3 else (M, N)
    dtype = out_dtype or a.dtype
    y = torch.empty(shape, dtype=dtype, device=a.device)
    z = torch.empty_like(y) if save_z and activations.needs_z(code) else None
    has_c = c is not None and beta != 0.0  # BLAS semantics: beta == 0 means C is not read
    bias = bias.reshape(-1) if bias is not None and bias_kind != "none" else None
    _launch(av, bv, y, z=z, c=c if has_c else None, bias=bias, bias_kind=BIAS_KINDS[bias_kind],
            act=code, act_alpha=act_alpha, alpha=alpha, beta=beta)
    return y, z


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------
# Tiles of the gZ pass. It is memory-bound (read gY and Z/Y, write gZ), so one config: 64x64
# tiles keep 16-byte loads and make the bias partials 1/64 of gZ's size.
BWD_BLOCK_M, BWD_BLOCK_N = 64, 64


@triton.jit
def bias_act_backward_kernel(
    gy_ptr, saved_ptr, gz_ptr, dc_ptr, partial_ptr,
    M, N,
    stride_gb, stride_gm, stride_gn,
    stride_sb, stride_sm, stride_sn,
    stride_ob, stride_om, stride_on,
    beta, act_alpha,
    ACT: tl.constexpr, FROM_Z: tl.constexpr, WRITE_GZ: tl.constexpr, WRITE_DC: tl.constexpr,
    BIAS_KIND: tl.constexpr, ACC_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """gZ = gY * act'(saved) for one tile; also dC = beta * gZ and this tile's bias-gradient partials.

    grid = (m tiles, n tiles, batch). Partials (fp32; fp64 for fp64): per_n -> row (batch, m tile) of a [*, N]
    buffer; per_m -> row (batch, n tile) of a [*, M] buffer; scalar -> one value per tile.
    """
    pid_m, pid_n, pid_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    batch = pid_b.to(tl.int64)
    g = tl.load(gy_ptr + batch * stride_gb + offs_m[:, None] * stride_gm + offs_n[None, :] * stride_gn,
                mask=mask, other=0.0).to(ACC_DTYPE)
    if ACT != 0:
        s = tl.load(saved_ptr + batch * stride_sb + offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn,
                    mask=mask, other=0.0).to(ACC_DTYPE)
        if FROM_Z:
            g = g * act_grad_from_z(s, ACT, act_alpha)
        else:
            g = g * act_grad_from_y(s, ACT, act_alpha)
    out_offs = batch * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    if WRITE_GZ:
        tl.store(gz_ptr + out_offs, g.to(gz_ptr.dtype.element_ty), mask=mask)
    if WRITE_DC:
        tl.store(dc_ptr + out_offs, (beta * g).to(dc_ptr.dtype.element_ty), mask=mask)
    if BIAS_KIND == 1:
        tile = (pid_b * tl.num_programs(1) + pid_n) * tl.num_programs(0) + pid_m
        tl.store(partial_ptr + tile, tl.sum(tl.sum(g, axis=1), axis=0))
    elif BIAS_KIND == 2:
        row = pid_b * tl.num_programs(1) + pid_n
        tl.store(partial_ptr + row.to(tl.int64) * M + offs_m, tl.sum(g, axis=1), mask=offs_m < M)
    elif BIAS_KIND == 3:
        row = pid_b * tl.num_programs(0) + pid_m
        tl.store(partial_ptr + row.to(tl.int64) * N + offs_n, tl.sum(g, axis=0), mask=offs_n < N)


@triton.jit
def sum_partials_kernel(partial_ptr, out_ptr, P, L, CHUNK, BLOCK_P: tl.constexpr, BLOCK_L: tl.constexpr):
    """out[c, l] = sum over the rows p of chunk c = program_id(1) (CHUNK rows each) of partial[p, l]
    ([P, L] contiguous), always in the same order."""
    offs_l = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    first = tl.program_id(1) * CHUNK
    last = tl.minimum(first + CHUNK, P)
    acc = tl.zeros((BLOCK_P, BLOCK_L), dtype=partial_ptr.dtype.element_ty)
    for p in range(first, last, BLOCK_P):
        offs_p = p + tl.arange(0, BLOCK_P)
        acc += tl.load(partial_ptr + offs_p[:, None].to(tl.int64) * L + offs_l[None, :],
                       mask=(offs_p[:, None] < last) & (offs_l[None, :] < L), other=0.0)
    out = out_ptr + tl.program_id(1).to(tl.int64) * L + offs_l
    tl.store(out, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=offs_l < L)


SUM_MAX_PARTIALS = 128  # partial rows one program of ``sum_partials`` loads at a time
SUM_MIN_PROGRAMS = 128  # fewer column blocks than this over many rows: sum in two levels


def _sum_chunks(partials: torch.Tensor, out: torch.Tensor, chunk: int) -> None:
    rows, length = partials.shape
    block_p = min(SUM_MAX_PARTIALS, triton.next_power_of_2(min(rows, chunk)))
    block_l = max(32, 4096 // block_p)
    sum_partials_kernel[(runtime.cdiv(length, block_l), runtime.cdiv(rows, chunk))](
        partials, out, rows, length, chunk, BLOCK_P=block_p, BLOCK_L=block_l)


def sum_partials(partials: torch.Tensor, out: torch.Tensor) -> None:
    """out[l] = sum over s of partials[s, l] ([S, L] contiguous fp32/fp64), in a fixed order.

    One [<=128, >=32] block per program and step (32-row blocks left the few programs of a short
    row looping over hundreds of partials, one memory latency each). Many rows of a short L
    (e.g. a conv bias gradient: 3136 tile rows of 64 channels) first add 128-row chunks in
    parallel, then the chunk sums."""
    rows, length = partials.shape
    if rows > 2 * SUM_MAX_PARTIALS and runtime.cdiv(length, 32) < SUM_MIN_PROGRAMS:
        chunks = torch.empty((runtime.cdiv(rows, SUM_MAX_PARTIALS), length), dtype=partials.dtype,
                             device=partials.device)
        _sum_chunks(partials, chunks, SUM_MAX_PARTIALS)
        partials, rows = chunks, chunks.shape[0]
    _sum_chunks(partials, out, rows)


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return (t.stride(0) if t.dim() == 3 else 0, t.stride(-2), t.stride(-1))


def _transposed(view):
    """The view of op(t)^T, given the view of op(t)."""
    t, (sb, sr, sc), batch, rows, cols = view
    return t, (sb, sc, sr), batch, cols, rows


def _is_broadcast(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.shape[0] > 1 and t.stride(0) == 0


def bias_act_backward(gy: torch.Tensor, saved: torch.Tensor | None, *, act: int, from_z: bool, act_alpha: float,
                      bias_kind: str, gz_dtype: torch.dtype | None, beta: float | None):
    """(gz | None, dbias | None, dc | None) from one pass over gy ([M, N] or [B, M, N])."""
    M, N = gy.shape[-2], gy.shape[-1]
    batch = gy.shape[0] if gy.dim() == 3 else 1
    gz = torch.empty(gy.shape, dtype=gz_dtype, device=gy.device) if gz_dtype is not None else None
    dc = torch.empty(gy.shape, dtype=gy.dtype, device=gy.device) if beta is not None else None
    kind = BIAS_KINDS[bias_kind]
    if gy.numel() == 0:
        return gz, (torch.zeros(1 if kind == 1 else M if kind == 2 else N, dtype=gy.dtype, device=gy.device)
                    if kind else None), dc
    grid = (runtime.cdiv(M, BWD_BLOCK_M), runtime.cdiv(N, BWD_BLOCK_N), batch)
    rows, length = {0: (0, 0), 1: (grid[0] * grid[1] * batch, 1), 2: (grid[1] * batch, M),
                    3: (grid[0] * batch, N)}[kind]
    acc_dtype = torch.float64 if gy.dtype == torch.float64 else torch.float32
    partial = torch.empty((rows, length), dtype=acc_dtype, device=gy.device) if kind else None
    out = gz if gz is not None else dc if dc is not None else gy  # gz and dc share gy's shape, contiguous
    saved = saved if saved is not None else gy
    bias_act_backward_kernel[grid](
        gy, saved, gz if gz is not None else gy, dc if dc is not None else gy, partial if partial is not None else gy,
        M, N, *_strides3(gy), *_strides3(saved), *_strides3(out),
        float(beta or 0.0), float(act_alpha),
        ACT=act, FROM_Z=from_z, WRITE_GZ=gz is not None, WRITE_DC=dc is not None, BIAS_KIND=kind,
        ACC_DTYPE=tl.float64 if acc_dtype == torch.float64 else tl.float32, BLOCK_M=BWD_BLOCK_M, BLOCK_N=BWD_BLOCK_N, num_warps=4,
    )
    dbias = None
    if kind:
        dbias = torch.empty(length, dtype=gy.dtype, device=gy.device)
        sum_partials(partial, dbias)
    return gz, dbias, dc


def gemm_backward(gy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, z: torch.Tensor | None = None,
                  y: torch.Tensor | None = None, *, trans_a: bool = False, trans_b: bool = False,
                  alpha: float = 1.0, beta: float = 0.0, bias_kind: str = "none", act: str = "none",
                  act_alpha: float = 0.01, has_c: bool = False, need_a: bool = True, need_b: bool = True,
                  db_dtype: torch.dtype | None = None):
    """(da, db, dbias, dc) of Y = act(alpha*op(a)@op(b) + beta*c + bias), given gY = dL/dY.

    Shapes as in ``ge2.backend.gemm``'s docstring: da like a, db like b (batch 1 for a broadcast
    operand), dbias [1] / [M] / [N], dc like gy. act' is read from z if given, else from y.
    ``db_dtype``: db's dtype (default b's), e.g. fp32 for the fp32 master weight of a bf16 operand.
    """
    code = activations.act_code("gemm_backward", act, act_alpha)
    from_z = z is not None
    saved = z if from_z else y
    if code == activations.NONE:
        saved = None
    need_gz = need_a or need_b
    # gZ is gY itself when there is no activation and the dtypes agree: no pass over it then.
    copy_gz = need_gz and (code != activations.NONE or gy.dtype != a.dtype)
    dbias = dc = None
    gz = gy
    if copy_gz or bias_kind != "none" or has_c:
        gz_new, dbias, dc = bias_act_backward(
            gy, saved, act=code, from_z=from_z, act_alpha=act_alpha, bias_kind=bias_kind,
            gz_dtype=a.dtype if copy_gz else None, beta=beta if has_c else None)
        if copy_gz:
            gz = gz_new
    av, bv, gv = _view(a, trans_a), _view(b, trans_b), _view(gz, False)
    da = db = None
    if need_a:
        # dA = alpha * gZ @ op(B)^T, or its transpose op(B) @ gZ^T when a is stored transposed.
        da = torch.empty((1, *a.shape[1:]) if _is_broadcast(a) else a.shape, dtype=a.dtype, device=a.device)
        lhs, rhs = (bv, _transposed(gv)) if trans_a else (gv, _transposed(bv))
        _launch(lhs, rhs, da, alpha=alpha, reduce_batch=_is_broadcast(a), kmajor_copies=True)
    if need_b:
        # dB = alpha * op(A)^T @ gZ, or its transpose gZ^T @ op(A) when b is stored transposed.
        db = torch.empty((1, *b.shape[1:]) if _is_broadcast(b) else b.shape, dtype=db_dtype or b.dtype,
                         device=b.device)
        lhs, rhs = (_transposed(gv), av) if trans_b else (_transposed(av), gv)
        _launch(lhs, rhs, db, alpha=alpha, reduce_batch=_is_broadcast(b), kmajor_copies=True)
    return da, db, dbias, dc
