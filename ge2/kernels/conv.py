"""2-D convolution as an implicit GEMM, with a fused bias + activation epilogue, and its backward.

Forward (``conv2d``)::

    Z[n, k, p, q] = sum_{c, r, s} X[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw] * W[k, c, r, s] + b[k]
    Y = act(Z)                                   (g = k // Kg: the group of output channel k)

is a GEMM per group with M = N*P*Q rows (output pixels), N = Kg columns (the group's output
channels) and a reduction over Cg*R*S. No im2col buffer exists: ``conv2d_fwd_kernel`` computes
each A tile's input addresses from the output pixel and the reduction step, and masks the taps
that fall in the padding. It walks the reduction in one of two orders (constexpr ``FLAT``):

* tap-major (Cg >= ``TAP_MIN_CHANNELS``): step = (r, s, channel block). The launcher hands it X
  in NHWC (an NCHW input is copied once) and W as [K, R, S, Cg] (channels innermost), so both
  operand tiles are contiguous along the reduction ("K-major"): 16-byte cp.async loads into the
  software pipeline and wgmma straight from shared memory, for bf16/fp16 and for tf32 (whose
  wgmma takes K-major operands only).
* flat (few channels per group, e.g. an RGB stem): the reduction index walks (r, s, c) jointly,
  so Cg*R*S = 27 is one 32-deep step instead of nine 16-deep steps that are 13/16 padding. The
  tile is a plain gather, in any layout.

1x1 convolutions with stride 1, no padding and one group are plain GEMMs and take the GEMM
module's kernels instead (``gemm_1x1_layout``; NHWC a 2-D GEMM, NCHW one batched over images).
Other stride-1 convs with one group and >= 16 channels take ``ge2.kernels.conv_framed`` where TMA
exists (Hopper, the interpreter): forward, dX and dW as TMA GEMMs over a zero-gapped copy of the
input; the kernels here serve the rest (strided, grouped, few channels, pre-Hopper GPUs).

The output is written through its strides in the input's layout. Pure depthwise convolutions
(one input and one output channel per group) skip the GEMM: ``conv2d_depthwise_kernel`` is a
direct stencil over BP output rows a program, each input row tile loaded once for all the rows
that read it, coalesced along whichever of (q, c) is contiguous.

Backward (``conv2d_backward``):

1. gZ = gY * act'(Z or Y) and db = column sums of gZ: the GEMM module's ``bias_act_backward``
   on gY viewed as [N, P*Q, K] (per-tile partials then ``sum_partials_kernel``: no atomics).
2. dX, stride 1: the forward kernel itself, on gZ with the flipped, transposed weight
   (Wt[c, k, r, s] = W[k, c, R-1-r, S-1-s], passed as a base offset and negative strides, no
   flip pass) and padding d*(R-1) - p. Stride > 1: ``conv2d_dx_kernel``, an implicit GEMM over
   the transposed problem (M = N*H*W input pixels, N = Cg, reduction over Kg*R*S) where input
   pixel h gets tap r from output row p = (h + ph - r*dh) / sh when that division is exact.
3. dW, Cg >= ``TAP_MIN_CHANNELS``: one GEMM per tap (``conv2d_dw_tap_kernel``): dW[:, :, r, s] =
   gZ^T [Kg, N*P*Q] @ X shifted by the tap [N*P*Q, Cg], both read in NHWC; small Cg:
   ``conv2d_dw_kernel`` with N = Cg*R*S flattened. Either way the long N*P*Q reduction is split
   across programs when the tile grid alone would not fill the GPU; the fp32 split partials are
   added in a fixed order by ``sum_partials_kernel`` (deterministic). Depthwise: a direct
   reduction (``conv2d_depthwise_dw_kernel``).

Numerics as in ``ge2.kernels.gemm``: bf16/fp16 operands with fp32 accumulation, fp32 operands
with ``ge2.runtime.get_matmul_precision()`` ("ieee", "tf32", "tf32x3"). Unlike the GEMM, tf32
operands are not rounded to nearest before the dot (that would route every tile through
registers and serialize the wgmma pipeline): the tensor cores truncate the fp32 bits.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels import activations, conv_1x1, conv_framed
from ge2.kernels.activations import act_fwd, act_grad_from_y, act_grad_from_z
from ge2.kernels.gemm import _launch, _precision, _tile_coords, bias_act_backward, gemm, sum_partials, tile_config


class ConvGeometry(NamedTuple):
    """Everything a conv kernel needs besides the tensors (padding is top/left; P, Q absorb bottom/right)."""

    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    out_hw: tuple[int, int]


# Channels per group from which the tap-major order (and its NHWC copy of an NCHW input) pays.
TAP_MIN_CHANNELS = 16
# Problems under this many multiply-adds are launch-bound: one config, no tuning.
SMALL_PROBLEM = 1 << 24
# fp32 flat convs with at most this many reduction elements (Cg*R*S) run as direct FMA loops
# (``DIRECT``), per matmul precision; "ieee" takes them at any length (Triton's fp32 FMA dot is
# slower than the plain rank-1 loop). tf32 keeps only the tiny ones (an MNIST stem's 9 taps, 9/32
# of a tensor-core step): an RGB stem's 27 take one tf32 step (H100, 128x3x32^2 -> 64 NHWC: 26 us
# against the direct loop's 34; bench/results/conv.json).
DIRECT_MAX_REDUCTION = {"ieee": 1 << 30, "tf32x3": 32, "tf32": 16}

# ---------------------------------------------------------------------------------------------
# Config space (Hopper). Tap-major tiles: 16-bit operands take 64-deep K steps, fp32 ones 32-deep
# (same bytes per smem stage); BLOCK_N follows the layer's output channels (64 for the common
# K = 64 layers, up to 256), so the launcher's pruning drops tiles wider than 2x the channels.
# Flat tiles: one gather per step, no cp.async pipeline, so fewer stages.
# ---------------------------------------------------------------------------------------------

CONFIGS_TAP_16 = [
    tile_config(128, 64, 64, 4, 4),
    tile_config(128, 128, 64, 8, 3),
    tile_config(256, 64, 64, 8, 3),
    tile_config(128, 256, 64, 8, 3),
    tile_config(64, 64, 64, 4, 5),
]
CONFIGS_TAP_32 = [
    tile_config(128, 64, 32, 4, 4),
    tile_config(128, 128, 32, 8, 3),
    tile_config(256, 64, 32, 8, 3),
    tile_config(128, 256, 32, 8, 3),
    tile_config(64, 64, 32, 4, 5),
]
CONFIGS_FLAT = [
    tile_config(128, 64, 32, 4, 2),
    tile_config(128, 64, 32, 4, 1),  # one-step reductions (a stem's 27): 26 vs 43 us fp32 at two stages
    tile_config(256, 64, 32, 8, 2),
    tile_config(64, 64, 32, 4, 2),
    tile_config(128, 128, 32, 8, 2),
]
# Direct (CUDA-core FMA) tiles for fp32 with a short reduction (see ``DIRECT_MAX_REDUCTION``):
# BLOCK_K is unused; BLOCK_N follows the layer's output channels (32 for an MNIST stem).
CONFIGS_DIRECT = [
    tile_config(128, 32, 16, 4, 1),
    tile_config(128, 64, 16, 4, 1),
    tile_config(64, 64, 16, 4, 1),
    tile_config(256, 32, 16, 8, 1),
]
# dW tiles are [out channels, columns]: the 32-wide ones fit the small layers (Cg = 32 per tap,
# or an MNIST stem's 9 columns) whose 64-wide tiles were half padding.
CONFIGS_DW_16 = CONFIGS_TAP_16 + [tile_config(64, 32, 64, 4, 4)]
CONFIGS_DW_32 = CONFIGS_TAP_32 + [tile_config(64, 32, 32, 4, 4)]
# Direct (CUDA-core FMA) dW tiles [out channels, columns] for fp32 (``_dw_direct``); BLOCK_K is
# unused. The accumulator is [BLOCK_M, BLOCK_N, QB] (the pixel axis is summed once, at the end),
# so the launcher keeps the configs whose accumulator is at most DW_DIRECT_ACC_REGS per thread.
CONFIGS_DW_DIRECT = [
    tile_config(32, 16, 16, 8, 1),
    tile_config(16, 16, 16, 4, 1),
    tile_config(32, 32, 16, 8, 1),
    tile_config(16, 32, 16, 4, 1),
    tile_config(64, 16, 16, 8, 1),
]
DW_DIRECT_ACC_REGS = 64
# The interpreter runs one pinned config. Its cost is per program and per step, nearly independent
# of tile size, so M is 64 wide (an 8x8 MNIST-like batch of 64 takes 64 programs, not 128); K stays
# 16 deep so that the tests' 20-channel case still walks two channel blocks.
INTERPRETER_CONFIG = tile_config(64, 32, 16, 4, 1, group_m=4)


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _prune_gemm(configs, *, wide: bool, flat: bool, n: int, macs: int):
    """The configs of the operand width / reduction order, at most 2x wider than N; one if small."""
    if flat:
        space = CONFIGS_FLAT
    else:
        space = CONFIGS_TAP_16 if wide else CONFIGS_TAP_32
    keep = [c for c in configs if c in space and c.kwargs["BLOCK_N"] <= max(64, 2 * _next_pow2(n))] or space[:1]
    if macs < SMALL_PROBLEM:
        return [min(keep, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return keep


def _prune_fwd(configs, named_args, **kwargs):
    a = named_args
    macs = a["N"] * a["P"] * a["Q"] * a["K"] * a["Cg"] * a["R"] * a["S"]
    if kwargs.get("DIRECT"):
        keep = [c for c in configs if c in CONFIGS_DIRECT and c.kwargs["BLOCK_N"] <= max(32, _next_pow2(a["Kg"]))]
        if macs < SMALL_PROBLEM:
            return [max(keep, key=lambda c: (c.kwargs["BLOCK_N"], -c.kwargs["BLOCK_M"]))]
        return keep
    return _prune_gemm(configs, wide=a["x_ptr"].element_size() <= 2, flat=bool(kwargs.get("FLAT")), n=a["Kg"],
                       macs=macs)


def _prune_dx(configs, named_args, **kwargs):
    a = named_args
    macs = a["N"] * a["H"] * a["W"] * a["K"] * a["Cg"] * a["R"] * a["S"]
    return _prune_gemm(configs, wide=a["gz_ptr"].element_size() <= 2, flat=False, n=a["Cg"], macs=macs)


def _prune_dw(configs, named_args, **kwargs):
    """dW tiles no more than one power of two wider than the layer (rows: Kg, columns: Cg or Cg*R*S)."""
    a = named_args
    macs = a["N"] * a["P"] * a["Q"] * a["K"] * a["Cg"] * a["R"] * a["S"]
    n = a["Cg"] if kwargs.get("PER_TAP") else a["Cg"] * a["R"] * a["S"]
    if kwargs.get("DIRECT"):
        keep = [c for c in configs if c in CONFIGS_DW_DIRECT and c.kwargs["BLOCK_M"] <= max(16, _next_pow2(a["Kg"]))
                and c.kwargs["BLOCK_N"] <= max(16, _next_pow2(n))
                and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * kwargs["QB"] <= DW_DIRECT_ACC_REGS * 32 * c.num_warps]
        keep = keep or CONFIGS_DW_DIRECT[:1]
        return keep[:1] if macs < SMALL_PROBLEM // 4 else keep
    space = CONFIGS_DW_16 if a["x_ptr"].element_size() <= 2 else CONFIGS_DW_32
    keep = [c for c in configs if c in space and c.kwargs["BLOCK_M"] <= max(64, _next_pow2(a["Kg"]))
            and c.kwargs["BLOCK_N"] <= max(32, _next_pow2(n))] or space[-1:]
    if macs < SMALL_PROBLEM:
        return [min(keep, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return keep


_ALL_GEMM_CONFIGS = CONFIGS_TAP_16 + CONFIGS_TAP_32 + CONFIGS_FLAT + CONFIGS_DIRECT
_CONV_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "Cg", "Kg", "sxc", "PRECISION"]
# Sizes enter only index arithmetic and masks: not specialising them on divisibility lets a
# batch-8 test shape reuse the batch-64 benchmark's compiled kernels.
_SIZES = ["N", "C", "H", "W", "K", "P", "Q"]
# The depthwise kernels' channel masks (offs_c < C) need C's divisibility for 16-byte NHWC loads.
_DW_SIZES = ["N", "H", "W", "P", "Q"]


@runtime.autotune(_ALL_GEMM_CONFIGS, key=_CONV_KEY + ["FLAT", "DIRECT"], default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune_fwd}, do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def conv2d_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, z_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg,
    sxn, sxc, sxh, sxw, swk, swc, swr, sws, swg, w_base, syn, syk, syp, syq, sbias,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, FLAT: tl.constexpr, DIRECT: tl.constexpr, PIX_VEC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M pixels, BLOCK_N channels] tile of Y for group program_id(1).

    W[k, c, r, s] sits at w_ptr + w_base + g*swg + k*swk + c*swc + r*swr + s*sws (k absolute,
    c within the group): the forward passes swg = w_base = 0, dX passes a flipped, transposed view.
    """
    g = tl.program_id(1)
    M = N * P * Q
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, Kg, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    q = offs_m % Q
    p = (offs_m // Q) % P
    n = offs_m // (P * Q)
    mask_m = offs_m < M
    mask_n = offs_n < Kg
    k_abs = g * Kg + offs_n
    x_rows = x_ptr + n.to(tl.int64) * sxn + (g * Cg).to(tl.int64) * sxc  # [BLOCK_M]
    w_cols = w_ptr + w_base + g * swg + k_abs.to(tl.int64) * swk  # [BLOCK_N]
    h0 = p * stride_h - pad_h
    w0 = q * stride_w - pad_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if DIRECT:
        # fp32, short reduction: one rank-1 update per (c, r, s) on the CUDA cores, exact fp32 in
        # every precision mode (a tensor-core step would be mostly padding: 9 of 32 for an MNIST stem).
        for kk in range(0, Cg * R * S):
            c = kk % Cg
            r = (kk // Cg) // S
            s = (kk // Cg) % S
            hi = h0 + r * dil_h
            wi = w0 + s * dil_w
            ok = mask_m & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            a = tl.load(x_rows + (hi * sxh + wi * sxw) + c * sxc, mask=ok, other=0.0).to(tl.float32)
            b = tl.load(w_cols + (c * swc + r * swr + s * sws), mask=mask_n, other=0.0).to(tl.float32)
            acc += a[:, None] * b[None, :]
    elif FLAT:
        CRS = Cg * R * S
        for k0 in range(0, CRS, BLOCK_K):
            kk = k0 + offs_k
            c = kk % Cg
            r = (kk // Cg) // S
            s = (kk // Cg) % S
            k_ok = kk < CRS
            hi = h0[:, None] + (r * dil_h)[None, :]
            wi = w0[:, None] + (s * dil_w)[None, :]
            ok = mask_m[:, None] & k_ok[None, :] & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            a = tl.load(x_rows[:, None] + (hi * sxh + wi * sxw) + (c * sxc)[None, :], mask=ok, other=0.0)
            b = tl.load(w_cols[None, :] + (c * swc + r * swr + s * sws)[:, None],
                        mask=k_ok[:, None] & mask_n[None, :], other=0.0)
            if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    else:
        # One flat loop over (tap, channel block): a nested loop would leave the pipeliner an
        # inner loop of one iteration when Cg == BLOCK_K.
        c_blocks = tl.cdiv(Cg, BLOCK_K)
        for step in range(0, R * S * c_blocks):
            rs = step // c_blocks
            c = (step % c_blocks) * BLOCK_K + offs_k
            r = rs // S
            s = rs % S
            hi = h0 + r * dil_h
            wi = w0 + s * dil_w
            row_ok = mask_m & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            c_ok = c < Cg
            a = tl.load(x_rows[:, None] + (hi * sxh + wi * sxw)[:, None] + c[None, :] * sxc,
                        mask=row_ok[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w_cols[None, :] + (c * swc)[:, None] + (r * swr + s * sws),
                        mask=c_ok[:, None] & mask_n[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    z = acc
    if HAS_BIAS:
        z += tl.load(bias_ptr + k_abs * sbias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if PIX_VEC > 1:
        # Dense NCHW output: a tile's pixels are contiguous within an image, and P*Q % PIX_VEC == 0
        # keeps every aligned PIX_VEC-run inside one image. Said so, the compiler stores 16-byte
        # vectors along the pixels (after a layout change through shared memory) instead of
        # scattering single elements from the MMA layout (measured: NCHW forward 2x the NHWC time).
        pix = n.to(tl.int64) * syn + offs_m % (P * Q)
        pix = tl.max_contiguous(tl.multiple_of(pix, PIX_VEC), PIX_VEC)
        y_offs = pix[:, None] + k_abs[None, :].to(tl.int64) * syk
        mask_m = (offs_m // PIX_VEC) < (M // PIX_VEC)  # == offs_m < M (M % PIX_VEC == 0), constant per run
    else:
        y_offs = (n.to(tl.int64) * syn + p * syp + q * syq)[:, None] + k_abs[None, :].to(tl.int64) * syk
    mask = mask_m[:, None] & mask_n[None, :]
    if SAVE_Z:
        tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    y = act_fwd(z, ACT, act_alpha)
    tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(CONFIGS_TAP_16 + CONFIGS_TAP_32, key=_CONV_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune_dx}, do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def conv2d_dx_kernel(
    gz_ptr, w_ptr, dx_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg,
    sgn, sgk, sgp, sgq, swk, swc, swr, sws, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M input pixels, BLOCK_N input channels] tile of dX = gZ (*)^T W, group program_id(1),
    for any stride (the stride-1 case goes through ``conv2d_fwd_kernel`` instead).

    ``sx*`` are dX's strides; ``C``/``sxc`` name them like the forward's so the tuning key matches.
    """
    g = tl.program_id(1)
    M = N * H * W
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, Cg, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    wi = offs_m % W
    hi = (offs_m // W) % H
    n = offs_m // (H * W)
    mask_m = offs_m < M
    mask_n = offs_n < Cg
    c_abs = g * Cg + offs_n
    g_rows = gz_ptr + n.to(tl.int64) * sgn + (g * Kg).to(tl.int64) * sgk  # [BLOCK_M]
    w_cols = w_ptr + offs_n.to(tl.int64) * swc + (g * Kg).to(tl.int64) * swk  # [BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(Kg, BLOCK_K)
    for step in range(0, R * S * k_blocks):
        rs = step // k_blocks
        k = (step % k_blocks) * BLOCK_K + offs_k
        r = rs // S
        s = rs % S
        # Output pixel (p, q) reads input (hi, wi) through tap (r, s) iff p*sh = hi + ph - r*dh.
        p_num = hi + pad_h - r * dil_h
        q_num = wi + pad_w - s * dil_w
        p_num = tl.where(p_num >= 0, p_num, -stride_h)  # keeps // and % away from negatives
        q_num = tl.where(q_num >= 0, q_num, -stride_w)
        p = p_num // stride_h
        q = q_num // stride_w
        row_ok = (mask_m & (p_num >= 0) & (q_num >= 0) & (p * stride_h == p_num) & (q * stride_w == q_num)
                  & (p < P) & (q < Q))
        k_ok = k < Kg
        a = tl.load(g_rows[:, None] + (p * sgp + q * sgq)[:, None] + k[None, :].to(tl.int64) * sgk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_cols[None, :] + k[:, None].to(tl.int64) * swk + (r * swr + s * sws),
                    mask=k_ok[:, None] & mask_n[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    dx_offs = (n.to(tl.int64) * sxn + hi * sxh + wi * sxw)[:, None] + c_abs[None, :].to(tl.int64) * sxc
    tl.store(dx_ptr + dx_offs, acc.to(dx_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _dw_gz_tile(gy_ptr, saved_ptr, offs_k, k_ok, n, p, q, q_ok, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, act_alpha,
                ACT: tl.constexpr, FROM_Z: tl.constexpr):
    """gZ[k, q] = gY * act'(saved) of output row (n, p) (scalars), output channels offs_k (absolute)
    and columns q; fp32 when an activation is applied, else gY's dtype."""
    mask = k_ok[:, None] & q_ok[None, :]
    k64 = offs_k.to(tl.int64)[:, None]
    n64 = n.to(tl.int64)
    g = tl.load(gy_ptr + (n64 * sgn + p * sgp) + k64 * sgk + (q * sgq)[None, :], mask=mask, other=0.0)
    if ACT != 0:
        sv = tl.load(saved_ptr + (n64 * ssn + p * ssp) + k64 * ssk + (q * ssq)[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        if FROM_Z:
            g = g.to(tl.float32) * act_grad_from_z(sv, ACT, act_alpha)
        else:
            g = g.to(tl.float32) * act_grad_from_y(sv, ACT, act_alpha)
    return g


@runtime.autotune(CONFIGS_DW_16 + CONFIGS_DW_32 + CONFIGS_DW_DIRECT,
                  key=_CONV_KEY + ["SPLIT_LEN", "PER_TAP", "ACT", "HAS_DB", "QB", "DIRECT"],
                  default=INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES + ["SPLIT_LEN", "ROW"])
def conv2d_dw_kernel(
    gy_ptr, saved_ptr, x_ptr, out_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg, SPLIT_LEN, ROW,
    sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
    ACT: tl.constexpr, FROM_Z: tl.constexpr, HAS_DB: tl.constexpr, QB: tl.constexpr, ROWS: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, PER_TAP: tl.constexpr, DIRECT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """A [BLOCK_M out channels, BLOCK_N] tile of dW over reduction steps [split*SPLIT_LEN,
    (split+1)*SPLIT_LEN), split = program_id(2), with gZ = gY * act'(saved) formed as it is loaded.

    The reduction over the N*P*Q output pixels walks row segments: step t is output row
    (n, p) = divmod(t // ceil(Q/QB), P) and columns q in a QB-wide block of it, so per step only
    scalars are decoded and the pixel offsets are a vector add (decoding every element's
    (n, p, q) by integer division in the loop made the step several times slower than its
    loads). The config's BLOCK_K is unused: the reduction step is QB pixels, or ROWS such segments
    (tensor-core loop only: rows narrower than 64 pixels, e.g. 14 wide, would otherwise make
    16-deep MMA steps; the rows of a step are decoded as a vector, once per step). DIRECT (fp32): CUDA-core
    FMAs instead of tl.dot (``_dw_tile``), exact fp32 in every precision mode.

    PER_TAP: program_id(1) = g*R*S + tap and the N columns are the group's Cg input channels;
    else program_id(1) = g and the columns are (c, r, s) flattened. With HAS_DB, program_id(1) =
    groups*taps + g are the bias-gradient programs: row sums of the split's gZ (one per k tile).
    Writes row ``split`` of out [splits, ROW] (contiguous): dW [K, Cg, R, S] in its first K*Cg*R*S
    entries, db [K] after them; dW and db themselves when there is one split, else fp32 partials.
    """
    split = tl.program_id(2)
    CRS = Cg * R * S
    QBLKS = tl.cdiv(Q, QB)
    T = N * P * QBLKS
    if PER_TAP:
        taps = R * S
        NCOLS = Cg
    else:
        taps = 1
        NCOLS = CRS
    slot = tl.program_id(1)
    main_slots = (K // Kg) * taps
    is_db = slot >= main_slots
    g = tl.where(is_db, slot - main_slots, slot // taps)
    rs = slot % taps
    pid_m, pid_n = _tile_coords(tl.program_id(0), Kg, NCOLS, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_q = tl.arange(0, QB)
    mask_m = offs_m < Kg
    mask_n = offs_n < NCOLS
    k_abs = g * Kg + offs_m
    lo = split * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, T)
    out_row = out_ptr + split.to(tl.int64) * ROW
    if HAS_DB:
        if is_db:
            # One program per k tile (the pid_n == 0 column) sums gZ over the split's pixels.
            # Steps of DB_PIXELS pixels (several row segments): these few programs walk the split
            # alone, one memory latency per step, so a step must be wide (16-pixel steps made
            # them the long pole: 640 of 700 us at 64x256x14^2).
            hi_db = tl.where(pid_n == 0, hi, lo)
            db = tl.zeros((BLOCK_M,), dtype=tl.float32)
            offs_db = tl.arange(0, DB_PIXELS)
            for t in range(lo, hi_db, DB_PIXELS // QB):
                n, p, q, ok = _dw_segments(t, offs_db, hi_db, QBLKS, P, Q, QB)
                a = _dw_gz_tile(gy_ptr, saved_ptr, k_abs, mask_m, n, p, q, ok,
                                sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, act_alpha, ACT, FROM_Z)
                db += tl.sum(a.to(tl.float32), axis=1)
            tl.store(out_row + K * CRS + k_abs, db.to(out_ptr.dtype.element_ty), mask=mask_m & (pid_n == 0))
        else:
            _dw_tile(gy_ptr, saved_ptr, x_ptr, out_row, H, W, P, Q, R, S, Cg, CRS, QBLKS, g, rs, k_abs, mask_m,
                     offs_n, mask_n, offs_q, lo, hi, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxc, sxh, sxw,
                     stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
                     ACT, FROM_Z, PRECISION, UPCAST, PER_TAP, DIRECT, QB, ROWS, BLOCK_M, BLOCK_N)
    else:
        _dw_tile(gy_ptr, saved_ptr, x_ptr, out_row, H, W, P, Q, R, S, Cg, CRS, QBLKS, g, rs, k_abs, mask_m,
                 offs_n, mask_n, offs_q, lo, hi, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxc, sxh, sxw,
                 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
                 ACT, FROM_Z, PRECISION, UPCAST, PER_TAP, DIRECT, QB, ROWS, BLOCK_M, BLOCK_N)


@triton.jit
def _dw_tile(gy_ptr, saved_ptr, x_ptr, out_row, H, W, P, Q, R, S, Cg, CRS, QBLKS, g, rs, k_abs, mask_m, offs_n,
             mask_n, offs_q, lo, hi, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxc, sxh, sxw,
             stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
             ACT: tl.constexpr, FROM_Z: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
             PER_TAP: tl.constexpr, DIRECT: tl.constexpr, QB: tl.constexpr, ROWS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """conv2d_dw_kernel's GEMM: one [BLOCK_M, BLOCK_N] tile of dW over steps [lo, hi), stored in out_row.

    DIRECT: acc3[k, col, q] += gZ[k, q] * X[col, q] on the CUDA cores (no tensor-core step, no
    shared memory; the q axis is summed once after the loop), with the next step's loads issued
    before this step's FMAs (a step's work is far shorter than a load's latency). For fp32 with
    small outputs or short reductions: a tf32x3 dot is three tensor-core passes routed through
    registers every step, and an MNIST stem's [32, 9] dW wastes most of a 32-wide MMA tile.
    """
    if PER_TAP:
        c = offs_n
        r = rs // S + offs_n * 0
        s = rs % S + offs_n * 0
    else:
        c = offs_n // (R * S)
        r = (offs_n // S) % R
        s = offs_n % S
    x_cols = x_ptr + (g * Cg + c).to(tl.int64) * sxc  # [BLOCK_N]
    col_h = r * dil_h - pad_h  # input row of column (c, r, s) is p*sh + col_h
    col_w = s * dil_w - pad_w
    if DIRECT:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, QB), dtype=tl.float32)
        g, sv, b = _dw_direct_loads(gy_ptr, saved_ptr, x_cols, lo, lo < hi, QBLKS, H, W, P, Q, k_abs, mask_m,
                                    mask_n, offs_q, col_h, col_w, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq,
                                    sxn, sxh, sxw, stride_h, stride_w, ACT, QB)
        for t in range(lo, hi):
            g1, sv1, b1 = _dw_direct_loads(gy_ptr, saved_ptr, x_cols, t + 1, t + 1 < hi, QBLKS, H, W, P, Q, k_abs,
                                           mask_m, mask_n, offs_q, col_h, col_w, sgn, sgk, sgp, sgq,
                                           ssn, ssk, ssp, ssq, sxn, sxh, sxw, stride_h, stride_w, ACT, QB)
            a = _gz_combine(g, sv, act_alpha, ACT, FROM_Z).to(tl.float32)
            acc3 += a[:, None, :] * b.to(tl.float32)[None, :, :]
            g, sv, b = g1, sv1, b1
        acc = tl.sum(acc3, axis=2)
    else:
        acc = _dw_dot_loop(gy_ptr, saved_ptr, x_cols, H, W, P, Q, QBLKS, k_abs, mask_m, mask_n, offs_q, col_h,
                           col_w, lo, hi, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxh, sxw,
                           stride_h, stride_w, act_alpha, ACT, FROM_Z, PRECISION, UPCAST, QB, ROWS, BLOCK_M, BLOCK_N)
    col = c * (R * S) + r * S + s  # (c, r, s) within [Cg, R, S]
    tl.store(out_row + (k_abs * CRS)[:, None].to(tl.int64) + col[None, :], acc.to(out_row.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gz_combine(g, sv, act_alpha, ACT: tl.constexpr, FROM_Z: tl.constexpr):
    """gZ = gY * act'(saved) of loaded tiles (gY itself when ACT is none)."""
    if ACT != 0:
        if FROM_Z:
            g = g.to(tl.float32) * act_grad_from_z(sv.to(tl.float32), ACT, act_alpha)
        else:
            g = g.to(tl.float32) * act_grad_from_y(sv.to(tl.float32), ACT, act_alpha)
    return g


@triton.jit
def _dw_direct_loads(gy_ptr, saved_ptr, x_cols, t, ok, QBLKS, H, W, P, Q, k_abs, mask_m, mask_n, offs_q, col_h,
                     col_w, sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxh, sxw, stride_h, stride_w,
                     ACT: tl.constexpr, QB: tl.constexpr):
    """Step t's raw tiles for the direct dW: gY and saved [BLOCK_M, QB] (saved is gY when ACT is
    none) and X [BLOCK_N, QB] (columns shifted by their taps); all zero when not ``ok``."""
    row = t // QBLKS
    n64 = (row // P).to(tl.int64)
    p = row % P
    q = (t % QBLKS) * QB + offs_q
    q_ok = (q < Q) & ok
    mask = mask_m[:, None] & q_ok[None, :]
    k64 = k_abs.to(tl.int64)[:, None]
    g = tl.load(gy_ptr + (n64 * sgn + p * sgp) + k64 * sgk + (q * sgq)[None, :], mask=mask, other=0.0)
    if ACT != 0:
        sv = tl.load(saved_ptr + (n64 * ssn + p * ssp) + k64 * ssk + (q * ssq)[None, :], mask=mask, other=0.0)
    else:
        sv = g
    hx = p * stride_h + col_h  # [BLOCK_N]
    wx = col_w[:, None] + (q * stride_w)[None, :]  # [BLOCK_N, QB]
    x_ok = (mask_n & (hx >= 0) & (hx < H))[:, None] & q_ok[None, :] & (wx >= 0) & (wx < W)
    b = tl.load(x_cols[:, None] + n64 * sxn + (hx * sxh)[:, None] + wx * sxw, mask=x_ok, other=0.0)
    return g, sv, b


@triton.jit
def _dw_segments(t, offs_j, hi, QBLKS, P, Q, QB: tl.constexpr):
    """(n, p, q, ok) per pixel of dW steps t, t+1, ... (QB-wide output-row segments, len(offs_j) / QB
    of them) as vectors: one decode per pixel per step, none per output channel."""
    u = t + offs_j // QB
    row = u // QBLKS
    q = (u % QBLKS) * QB + offs_j % QB
    return row // P, row % P, q, (u < hi) & (q < Q)


@triton.jit
def _dw_dot_loop(gy_ptr, saved_ptr, x_cols, H, W, P, Q, QBLKS, k_abs, mask_m, mask_n, offs_q, col_h, col_w, lo, hi,
                 sgn, sgk, sgp, sgq, ssn, ssk, ssp, ssq, sxn, sxh, sxw, stride_h, stride_w, act_alpha,
                 ACT: tl.constexpr, FROM_Z: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 QB: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tensor-core dW loop: acc [BLOCK_M, BLOCK_N] = sum over steps [lo, hi) of gZ [BLOCK_M, QB] @ X [QB, BLOCK_N];
    with ROWS > 1, ROWS consecutive steps at a time (one ROWS*QB-deep dot; the rows decoded as vectors)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ROWS == 1:
        for t in range(lo, hi):
            row = t // QBLKS
            n = row // P
            p = row % P
            q = (t % QBLKS) * QB + offs_q
            q_ok = q < Q
            a = _dw_gz_tile(gy_ptr, saved_ptr, k_abs, mask_m, n, p, q, q_ok, sgn, sgk, sgp, sgq,
                            ssn, ssk, ssp, ssq, act_alpha, ACT, FROM_Z).to(x_cols.dtype.element_ty)
            hx = p * stride_h + col_h  # [BLOCK_N]
            wx = (q * stride_w)[:, None] + col_w[None, :]  # [QB, BLOCK_N]
            x_ok = q_ok[:, None] & (mask_n & (hx >= 0) & (hx < H))[None, :] & (wx >= 0) & (wx < W)
            b = tl.load(x_cols[None, :] + n.to(tl.int64) * sxn + (hx * sxh)[None, :] + wx * sxw, mask=x_ok,
                        other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    else:
        offs_j = tl.arange(0, ROWS * QB)
        for t in range(lo, hi, ROWS):
            n, p, q, q_ok = _dw_segments(t, offs_j, hi, QBLKS, P, Q, QB)
            a = _dw_gz_tile(gy_ptr, saved_ptr, k_abs, mask_m, n, p, q, q_ok, sgn, sgk, sgp, sgq,
                            ssn, ssk, ssp, ssq, act_alpha, ACT, FROM_Z).to(x_cols.dtype.element_ty)
            hx = (p * stride_h)[:, None] + col_h[None, :]  # [ROWS*QB, BLOCK_N]
            wx = (q * stride_w)[:, None] + col_w[None, :]
            x_ok = (q_ok[:, None] & mask_n[None, :]) & (hx >= 0) & (hx < H) & (wx >= 0) & (wx < W)
            b = tl.load(x_cols[None, :] + (n.to(tl.int64) * sxn)[:, None] + hx * sxh + wx * sxw, mask=x_ok,
                        other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    return acc


# ---------------------------------------------------------------------------------------------
# Depthwise (one input and one output channel per group): direct stencils on the CUDA cores.
# Both are bound by instructions, not bytes (a per-tap load, its address and mask cost more than
# the tap's FMA), so each input row tile is loaded once per column shift s and feeds every output
# row (forward) or every tap (dW) that reads it: a program owns BP output rows of one image, its
# accumulators are a tuple unrolled at compile time (rows, or taps for dW), and the row offsets
# j*SH + r*DH that coincide are resolved at compile time too (SH, DH: constexpr row stride and
# dilation). Loads are coalesced along whichever of (q, c) is contiguous.
# ---------------------------------------------------------------------------------------------

def _depthwise_cfg(bp: int, bq: int, bc: int, warps: int) -> triton.Config:
    return triton.Config({"BP": bp, "BLOCK_Q": bq, "BLOCK_C": bc}, num_warps=warps)


# (BP output rows, BLOCK_Q columns, BLOCK_C channels, warps): NHWC tiles run along channels,
# NCHW tiles along the row (the contiguous axis). BP = 7 divides the usual 7 * 2^k feature maps.
DEPTHWISE_CONFIGS_NHWC = [_depthwise_cfg(*t) for t in ((7, 4, 64, 2), (7, 4, 128, 4), (7, 8, 64, 4), (4, 4, 64, 2))]
DEPTHWISE_CONFIGS_NCHW = [_depthwise_cfg(*t) for t in ((7, 32, 16, 4), (7, 32, 32, 4), (4, 32, 16, 4), (2, 32, 32, 4))]
# dW: the R*S accumulators are the tile; NHWC tiles run along channels, NCHW along the row.
DEPTHWISE_DW_CONFIGS_NHWC = [_depthwise_cfg(*t) for t in ((4, 16, 32, 4), (2, 16, 32, 4), (4, 8, 64, 4),
                                                          (2, 32, 32, 4))]
DEPTHWISE_DW_CONFIGS_NCHW = [_depthwise_cfg(*t) for t in ((2, 32, 16, 4), (2, 32, 32, 8), (4, 32, 16, 4),
                                                          (2, 16, 32, 4))]
# Large kernels (7x7: 49 accumulators) need small tiles; this one always fits.
DEPTHWISE_SMALL_CONFIG = _depthwise_cfg(1, 8, 16, 4)
DEPTHWISE_INTERPRETER_CONFIG = _depthwise_cfg(2, 8, 16, 4)
# Accumulator floats per thread a depthwise config may hold (more spills to local memory).
DEPTHWISE_ACC_REGS = 96
# Weight taps per program that the forward keeps in registers (more are loaded at each use).
DEPTHWISE_HOISTED_TAPS = tl.constexpr(16)


def _fitting_depthwise(a: dict, nhwc_space: list, nchw_space: list, accs) -> list:
    """The layout's tiles whose ``accs(config)`` accumulators fit in registers; one for small problems."""
    space = nhwc_space if a["sxc"] == 1 and a["C"] > 1 else nchw_space
    keep = [c for c in space if accs(c) * c.kwargs["BLOCK_Q"] * c.kwargs["BLOCK_C"]
            <= DEPTHWISE_ACC_REGS * 32 * c.num_warps] or [DEPTHWISE_SMALL_CONFIG]
    if a["N"] * a["P"] * a["Q"] * a["C"] < (1 << 20):
        return keep[:1]
    return keep


def _prune_depthwise(configs, named_args, **kwargs):
    """Forward: BP row accumulators a program."""
    return _fitting_depthwise(named_args, DEPTHWISE_CONFIGS_NHWC, DEPTHWISE_CONFIGS_NCHW, lambda c: c.kwargs["BP"])


def _prune_depthwise_dw(configs, named_args, **kwargs):
    """dW: R*S tap accumulators a program."""
    a = named_args
    return _fitting_depthwise(a, DEPTHWISE_DW_CONFIGS_NHWC, DEPTHWISE_DW_CONFIGS_NCHW, lambda c: a["R"] * a["S"])


@triton.constexpr_function
def _row_offset_used(o, BP, R, SH, DH):
    """Whether input row offset o (from the first output row's top tap) is some j*SH + r*DH."""
    return any(j * SH + r * DH == o for j in range(BP) for r in range(R))


@triton.jit
def _depthwise_x_tile(x_base, hi, offs_q, mask_q, mask_c, s, H, W, sxh, sxw, stride_w, pad_w, dil_w):
    """X at input row hi, columns q*sw - pw + s*dw, [BLOCK_Q, BLOCK_C] in fp32 (zeros in the padding)."""
    wi = offs_q * stride_w - pad_w + s * dil_w
    ok = ((hi >= 0) & (hi < H) & mask_q & (wi >= 0) & (wi < W))[:, None] & mask_c[None, :]
    return tl.load(x_base + hi * sxh + (wi * sxw)[:, None], mask=ok, other=0.0).to(tl.float32)


_DEPTHWISE_ALL = DEPTHWISE_CONFIGS_NHWC + DEPTHWISE_CONFIGS_NCHW + [DEPTHWISE_SMALL_CONFIG]
_DEPTHWISE_DW_ALL = DEPTHWISE_DW_CONFIGS_NHWC + DEPTHWISE_DW_CONFIGS_NCHW + [DEPTHWISE_SMALL_CONFIG]


@runtime.autotune(_DEPTHWISE_ALL, key=["N", "C", "H", "W", "P", "Q", "R", "S", "SH", "DH", "sxc", "syk"],
                  default=DEPTHWISE_INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_depthwise},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_DW_SIZES)
def conv2d_depthwise_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, z_ptr,
    N, C, H, W, P, Q, R: tl.constexpr, S: tl.constexpr,
    sxn, sxc, sxh, sxw, swk, swr, sws, w_base, syn, syk, syp, syq, sbias,
    SH: tl.constexpr, stride_w, pad_h, pad_w, DH: tl.constexpr, dil_w, act_alpha,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    BP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Y[n, c, p, q] = act(sum_{r,s} X[n, c, p*SH - ph + r*DH, q*sw - pw + s*dw] * W[c, r, s] + b[c])
    for rows p0 .. p0+BP-1 of image n; W[c, r, s] at w_ptr + w_base + c*swk + r*swr + s*sws."""
    pid = tl.program_id(0)
    p_blocks = tl.cdiv(P, BP)
    n = pid // p_blocks
    p0 = (pid % p_blocks) * BP
    offs_q = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_q = offs_q < Q
    mask_c = offs_c < C
    x_base = x_ptr + n.to(tl.int64) * sxn + offs_c[None, :].to(tl.int64) * sxc  # [1, BLOCK_C]
    w_cols = w_ptr + w_base + offs_c * swk
    HOIST: tl.constexpr = R * S <= DEPTHWISE_HOISTED_TAPS
    taps = ()
    if HOIST:
        for t in tl.static_range(R * S):
            taps = taps + (tl.load(w_cols + (t // S) * swr + (t % S) * sws, mask=mask_c, other=0.0).to(tl.float32),)
    accs = ()
    for j in tl.static_range(BP):
        accs = accs + (tl.zeros((BLOCK_Q, BLOCK_C), dtype=tl.float32),)
    h0 = p0 * SH - pad_h
    for o in tl.static_range((BP - 1) * SH + (R - 1) * DH + 1):
        if _row_offset_used(o, BP, R, SH, DH):
            for s in tl.static_range(S):
                xv = _depthwise_x_tile(x_base, h0 + o, offs_q, mask_q, mask_c, s, H, W, sxh, sxw, stride_w, pad_w,
                                       dil_w)
                for j in tl.static_range(BP):
                    for r in tl.static_range(R):
                        if j * SH + r * DH == o:
                            if HOIST:
                                wv = taps[r * S + s]
                            else:
                                wv = tl.load(w_cols + r * swr + s * sws, mask=mask_c, other=0.0).to(tl.float32)
                            accs = accs[:j] + (accs[j] + xv * wv[None, :],) + accs[j + 1:]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_c * sbias, mask=mask_c, other=0.0).to(tl.float32)
    for j in tl.static_range(BP):
        p = p0 + j
        z = accs[j]
        if HAS_BIAS:
            z += bias[None, :]
        y_offs = n.to(tl.int64) * syn + p * syp + (offs_q * syq)[:, None] + offs_c[None, :].to(tl.int64) * syk
        mask = (mask_q & (p < P))[:, None] & mask_c[None, :]
        if SAVE_Z:
            tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
        y = act_fwd(z, ACT, act_alpha)
        tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(_DEPTHWISE_DW_ALL, key=["N", "C", "H", "W", "P", "Q", "R", "S", "SH", "DH", "sxc", "sgk"],
                  default=DEPTHWISE_INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_depthwise_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_DW_SIZES)
def conv2d_depthwise_dw_kernel(
    gz_ptr, x_ptr, out_ptr,
    N, C, H, W, P, Q, R: tl.constexpr, S: tl.constexpr,
    sgn, sgk, sgp, sgq, sxn, sxc, sxh, sxw,
    SH: tl.constexpr, stride_w, pad_h, pad_w, DH: tl.constexpr, dil_w,
    BP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """out[split, c, r*S + s] = sum over split's (image, BP-row block)s and all q of
    gZ[n, c, p, q] * X[n, c, p*SH - ph + r*DH, q*sw - pw + s*dw]; split = program_id(1) of num_programs(1)."""
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(1)
    mask_c = offs_c < C
    p_blocks = tl.cdiv(P, BP)
    blocks = tl.cdiv(N * p_blocks, tl.num_programs(1))
    accs = ()
    for t in tl.static_range(R * S):
        accs = accs + (tl.zeros((BLOCK_Q, BLOCK_C), dtype=tl.float32),)
    for blk in range(split * blocks, tl.minimum(split * blocks + blocks, N * p_blocks)):
        n = blk // p_blocks
        p0 = (blk % p_blocks) * BP
        h0 = p0 * SH - pad_h
        g_base = gz_ptr + n.to(tl.int64) * sgn + offs_c[None, :].to(tl.int64) * sgk
        x_base = x_ptr + n.to(tl.int64) * sxn + offs_c[None, :].to(tl.int64) * sxc
        for q0 in range(0, Q, BLOCK_Q):
            offs_q = q0 + tl.arange(0, BLOCK_Q)
            mask_q = offs_q < Q
            gz_rows = ()
            for j in tl.static_range(BP):
                ok = (mask_q & (p0 + j < P))[:, None] & mask_c[None, :]
                gz_rows = gz_rows + (tl.load(g_base + (p0 + j) * sgp + (offs_q * sgq)[:, None], mask=ok,
                                             other=0.0).to(tl.float32),)
            for o in tl.static_range((BP - 1) * SH + (R - 1) * DH + 1):
                if _row_offset_used(o, BP, R, SH, DH):
                    for s in tl.static_range(S):
                        xv = _depthwise_x_tile(x_base, h0 + o, offs_q, mask_q, mask_c, s, H, W, sxh, sxw, stride_w,
                                               pad_w, dil_w)
                        for j in tl.static_range(BP):
                            for r in tl.static_range(R):
                                if j * SH + r * DH == o:
                                    accs = (accs[:r * S + s] + (accs[r * S + s] + gz_rows[j] * xv,)
                                            + accs[r * S + s + 1:])
    for t in tl.static_range(R * S):
        tl.store(out_ptr + (split.to(tl.int64) * C + offs_c) * (R * S) + t, tl.sum(accs[t], axis=0), mask=mask_c)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether a 4-D tensor is laid out NHWC (channels innermost) rather than NCHW, by its strides.

    Dense tensors follow torch's contiguity checks (NCHW wins ties, e.g. C == 1); strided views
    are NHWC when the channel stride is the smallest of the four.
    """
    if x.is_contiguous():
        return False
    if x.is_contiguous(memory_format=torch.channels_last):
        return True
    return x.shape[1] > 1 and x.stride(1) < min(x.stride(2), x.stride(3))


def empty_like_layout(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new [N, C, H, W] tensor in ``like``'s layout (NHWC or NCHW)."""
    fmt = torch.channels_last if is_channels_last(like) else torch.contiguous_format
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device, memory_format=fmt)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """t itself when its channels are already contiguous, else a channels-last copy."""
    return t if t.stride(1) == 1 or t.shape[1] == 1 else t.contiguous(memory_format=torch.channels_last)


def _numerics(dtype: torch.dtype) -> dict:
    return dict(PRECISION=_precision(dtype),
                UPCAST=runtime.is_interpreter() and dtype in (torch.float16, torch.bfloat16))


class _WeightView(NamedTuple):
    """How a kernel addresses W[k, c, r, s]: base + base_off + g*sg + k*sk + c*sc + r*sr + s*ss."""

    tensor: torch.Tensor
    sk: int
    sc: int
    sr: int
    ss: int
    sg: int
    base_off: int


def _weight_view(w: torch.Tensor) -> _WeightView:
    """W [K, Cg, R, S] as the forward reads it."""
    return _WeightView(w, *w.stride(), 0, 0)


def _flipped_weight_view(w: torch.Tensor, groups: int) -> _WeightView:
    """W of the stride-1 dX conv: Wt[c, k, r, s] = W[k, c, R-1-r, S-1-s] (c absolute, k within the group).

    Wt[c, k] of group g is W[g*Kg + k, c - g*Cg]: the group offset g*(Kg*s0 - Cg*s1) goes in sg.
    """
    K, Cg, R, S = w.shape
    s0, s1, s2, s3 = w.stride()
    return _WeightView(w, s1, s0, -s2, -s3, (K // groups) * s0 - Cg * s1, (R - 1) * s2 + (S - 1) * s3)


def _launch_fwd(x: torch.Tensor, wv: _WeightView, bias: torch.Tensor | None, y: torch.Tensor, z: torch.Tensor | None,
                R: int, S: int, Cg: int, Kg: int, geo: ConvGeometry, code: int, act_alpha: float) -> None:
    """Y [N, groups*Kg, P, Q] = act(conv(x [N, groups*Cg, H, W], W) + bias) through ``conv2d_fwd_kernel``."""
    Nb, C, H, W = x.shape
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    flat = Cg < TAP_MIN_CHANNELS
    numerics = _numerics(x.dtype)
    direct = flat and x.dtype == torch.float32 and Cg * R * S <= DIRECT_MAX_REDUCTION[numerics["PRECISION"]]
    grid = lambda meta: (runtime.cdiv(Nb * P * Q, meta["BLOCK_M"]) * runtime.cdiv(Kg, meta["BLOCK_N"]), geo.groups)
    conv2d_fwd_kernel[grid](
        x, wv.tensor, bias if bias is not None else y, y, z if z is not None else y,
        Nb, C, H, W, K, P, Q, R, S, Cg, Kg,
        *x.stride(), wv.sk, wv.sc, wv.sr, wv.ss, wv.sg, wv.base_off, *y.stride(),
        bias.stride(0) if bias is not None else 0,
        *geo.stride, *geo.pad, *geo.dilation, float(act_alpha),
        HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None, FLAT=flat, DIRECT=direct,
        PIX_VEC=_pixel_vector(y), **numerics,
    )


def _pixel_vector(y: torch.Tensor) -> int:
    """Elements per 16-byte store along the pixels of a dense NCHW output (1: not dense NCHW)."""
    Nb, K, P, Q = y.shape
    if runtime.is_interpreter() or K == 1 or not y.is_contiguous():
        return 1
    vec = 16 // y.element_size()
    while vec > 1 and (P * Q) % vec:
        vec //= 2
    return vec


def _launch_depthwise(x: torch.Tensor, wv: _WeightView, bias: torch.Tensor | None, y: torch.Tensor,
                      z: torch.Tensor | None, R: int, S: int, geo: ConvGeometry, code: int, act_alpha: float) -> None:
    """Y = act(depthwise conv(x, W) + bias), one input and one output channel per group."""
    Nb, C, H, W = x.shape
    P, Q = y.shape[2], y.shape[3]
    grid = lambda meta: (Nb * runtime.cdiv(P, meta["BP"]), runtime.cdiv(Q, meta["BLOCK_Q"]),
                         runtime.cdiv(C, meta["BLOCK_C"]))
    conv2d_depthwise_kernel[grid](
        x, wv.tensor, bias if bias is not None else y, y, z if z is not None else y,
        Nb, C, H, W, P, Q, R, S,
        *x.stride(), wv.sk, wv.sr, wv.ss, wv.base_off, *y.stride(), bias.stride(0) if bias is not None else 0,
        *geo.stride, *geo.pad, *geo.dilation, float(act_alpha),
        HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None,
    )


def _is_depthwise(weight: torch.Tensor, groups: int) -> bool:
    return weight.shape[1] == 1 and weight.shape[0] == groups


# ---------------------------------------------------------------------------------------------
# 1x1 convolutions as GEMMs
# ---------------------------------------------------------------------------------------------
# A 1x1 conv with stride 1, no padding and one group is a plain GEMM over x's own strides. The
# implicit-GEMM kernel walked its short reduction (C = 128 channels: 2 K-steps a tile) in tiles
# whose software pipeline never filled (0.39x cuDNN bf16 NHWC); the GEMM module's kernels take it
# instead (``gemm_1x1_layout`` decides, ``_conv1x1``/``_conv1x1_backward`` launch):
#
# * NHWC (pixels merge into one stride): Y [N*H*W, K] = X [N*H*W, C] @ W^T, bias per column; the
#   persistent TMA kernel when the strides allow. dX = gZ @ W, dW = gZ^T @ X (a 2-D GEMM whose
#   N*H*W-long reduction the GEMM splits over programs), db from the gZ pass.
# * NCHW (h, w merge): Y[n] [K, H*W] = W [K, C] @ X[n] [C, H*W], a batched GEMM whose A has batch
#   stride 0, bias per row. dX[n] = W^T @ gZ[n]; dW = sum_n gZ[n] @ X[n]^T as per-image fp32
#   partials (both operands unit-stride along H*W: the K-major order tf32 wgmma wants) added in a
#   fixed order by ``sum_partials_kernel``. The GEMM's reduce_batch mode would do the sum in one
#   launch, but with one program per output tile (1 to 4 for a 128x128 dW): serial.
# The weight is copied K-major for fp32 where it is the operand that needs it (a few KB). Strided
# or padded 1x1 convs stay on the implicit-GEMM path (a strided X does not merge its pixels).
#
# NCHW dW partials beyond this many bytes (or the bytes of gZ and X, if more) go to the
# implicit-GEMM dW kernel instead (the partials would cost more traffic than the GEMM itself).
GEMM_1X1_PARTIAL_BYTES = 4 << 20


def _merged_stride(dims, default: int) -> int | None:
    """The one stride that walks ``dims`` ((size, stride) pairs, outer to inner) as a single flat
    index, or None; size-1 dims do not count (``default`` when all are size 1)."""
    dims = [(n, s) for n, s in dims if n != 1]
    for (_, outer), (n, inner) in zip(dims, dims[1:]):
        if outer != n * inner:
            return None
    return dims[-1][1] if dims else default


def _pixel_stride(t: torch.Tensor, nhwc: bool) -> int | None:
    """The stride of t's flat pixel index (n, h, w) for NHWC, (h, w) for NCHW, or None."""
    dims = ((t.shape[0], t.stride(0)),) if nhwc else ()
    return _merged_stride(dims + ((t.shape[2], t.stride(2)), (t.shape[3], t.stride(3))), t.stride(3))


def _aligned(*tensors: torch.Tensor | None) -> bool:
    # The GEMM's TMA path asserts a 16-byte aligned base in TensorDescriptor before it would
    # fall back: a misaligned operand (x[:, 1:]) stays on the implicit-GEMM path.
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def gemm_1x1_layout(x: torch.Tensor, weight: torch.Tensor, geo: ConvGeometry) -> str | None:
    """"nhwc" or "nchw" when conv(x, weight) is a plain GEMM over x's strides (1x1, stride 1, no
    padding, one group, pixels mergeable), else None (the implicit-GEMM path)."""
    K, _, R, S = weight.shape
    if ((R, S) != (1, 1) or geo.stride != (1, 1) or geo.pad != (0, 0) or geo.groups != 1 or x.numel() == 0
            or K == 0 or not _aligned(x, weight)):
        return None
    nhwc = is_channels_last(x)
    if _pixel_stride(x, nhwc) is None:
        return None
    return "nhwc" if nhwc else "nchw"


def _rows(t: torch.Tensor, nhwc: bool) -> torch.Tensor:
    """t [N, Ch, H, W] as the GEMM sees it: [N*H*W, Ch] (NHWC) or [N, Ch, H*W] (NCHW), a view
    (a copy into that layout only when the pixels do not merge, e.g. an NCHW gradient of an NHWC conv)."""
    N, Ch, H, W = t.shape
    sp = _pixel_stride(t, nhwc)
    if sp is None or not _aligned(t):
        t = t.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        sp = _pixel_stride(t, nhwc)
    if nhwc:
        return t.as_strided((N * H * W, Ch), (sp, t.stride(1)))
    return t.as_strided((N, Ch, H * W), (t.stride(0), t.stride(1), sp))


def _gemm_view(t: torch.Tensor, rows: int, cols: int, s_row: int, s_col: int, batch: int = 1, s_batch: int = 0):
    """The GEMM launcher's operand view: (tensor, (batch, row, col strides), batch, rows, cols)."""
    return t, (s_batch, s_row, s_col), batch, rows, cols


def _conv1x1(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, nhwc: bool, act: str,
             act_alpha: float, save_z: bool):
    """(Y, Z) of a 1x1 conv through ``gemm``: Y in x's layout."""
    N, C, H, W = x.shape
    K = weight.shape[0]
    w2 = weight[:, :, 0, 0]  # [K, C]
    kinds = dict(bias=bias, act=act, act_alpha=act_alpha, save_z=save_z)
    if nhwc:  # [N*H*W, K] contiguous is the channels-last output itself
        y, z = gemm(_rows(x, True), w2, trans_b=True, bias_kind="per_n" if bias is not None else "none", **kinds)
        shape, strides = (N, K, H, W), (H * W * K, 1, W * K, K)
    elif conv_1x1.supports(_rows(x, False), K):  # X's boxes by TMA, read once (conv_1x1)
        code = activations.act_code("conv2d", act, act_alpha)
        y = torch.empty((N, K, H, W), dtype=x.dtype, device=x.device)
        z = torch.empty_like(y) if save_z and activations.needs_z(code) else None
        conv_1x1.conv1x1_nchw(_rows(x, False), conv_framed._weight_rows(weight), y.view(N, K, H * W),
                              z.view(N, K, H * W) if z is not None else None, bias, code, act_alpha)
        return y, z
    else:
        x3 = _rows(x, False)
        a, b = (w2, x3[0]) if N == 1 else (w2.expand(N, K, C), x3)  # one image: a 2-D GEMM (TMA-eligible)
        y, z = gemm(a, b, bias_kind="per_m" if bias is not None else "none", **kinds)
        shape, strides = (N, K, H, W), (K * H * W, H * W, W, 1)
    return y.as_strided(shape, strides), (z.as_strided(shape, strides) if z is not None else None)


def _conv1x1_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, saved: torch.Tensor | None,
                      geo: ConvGeometry, nhwc: bool, *, has_bias: bool, code: int, act_alpha: float, from_z: bool,
                      need_x: bool, need_w: bool):
    """(dx | None, dw | None, dbias | None) of a 1x1 conv through the GEMM module's kernels."""
    N, C, H, W = x.shape
    K = weight.shape[0]
    HW, M = H * W, N * H * W
    copy_gz = (need_x or need_w) and (code != activations.NONE or gy.dtype != x.dtype)
    gz = _rows(gy, nhwc)
    dbias = None
    if copy_gz or has_bias:
        # One pass: gZ = gY * act'(saved) (written in the GEMM view's order: NHWC [M, K] or NCHW
        # [N, K, H*W], the order in which dW reads it along the pixels) and db's partial sums.
        sv = _rows(saved, nhwc) if saved is not None and code != activations.NONE else None
        gz_new, dbias, _ = bias_act_backward(
            gz, sv, act=code, from_z=from_z, act_alpha=act_alpha,
            bias_kind=("per_n" if nhwc else "per_m") if has_bias else "none",
            gz_dtype=x.dtype if copy_gz else None, beta=None)
        if copy_gz:
            gz = gz_new
    w2 = weight[:, :, 0, 0]  # [K, C]
    if x.dtype == torch.float32 and _precision(x.dtype) != "ieee":
        # tf32 wgmma reads both operands K-major: for dX the reduction runs over W's rows (K).
        w2 = w2.t().contiguous().t()
    dx = dw = None
    if need_x:
        dx = empty_like_layout(tuple(x.shape), x)
        if nhwc:  # dX [M, C] = gZ [M, K] @ W [K, C]
            _launch(_gemm_view(gz, M, K, gz.stride(0), gz.stride(1)), _gemm_view(w2, K, C, w2.stride(0), w2.stride(1)),
                    dx.as_strided((M, C), (C, 1)))
        elif conv_1x1.supports(gz, C):  # the forward's kernel on gZ with W^T's rows
            conv_1x1.conv1x1_nchw(gz, conv_framed._weight_rows(weight, transposed=True), dx.view(N, C, HW))
        else:  # dX[n] [C, HW] = W^T [C, K] @ gZ[n] [K, HW]
            _launch(_gemm_view(w2, C, K, w2.stride(1), w2.stride(0), N, 0),
                    _gemm_view(gz, K, HW, gz.stride(1), gz.stride(2), N, gz.stride(0)),
                    dx.as_strided((N, C, HW), (C * HW, HW, 1)))
    if need_w:
        x2 = _rows(x, nhwc)
        dw2 = torch.empty((K, C), dtype=weight.dtype, device=weight.device)
        dw = dw2.view(K, C, 1, 1)
        if nhwc:  # dW [K, C] = gZ^T [K, M] @ X [M, C]: the GEMM splits the M-long reduction
            _launch(_gemm_view(gz, K, M, gz.stride(1), gz.stride(0)), _gemm_view(x2, M, C, x2.stride(0), x2.stride(1)),
                    dw2)
        elif conv_1x1.dw_supports(gz, x2):  # chunks of N*H*W pixels by TMA over about one program per SM
            conv_1x1.conv1x1_nchw_dw(gz, x2, dw2)
        elif N * K * C * 4 <= max(GEMM_1X1_PARTIAL_BYTES, (gz.numel() * gz.element_size()
                                                             + x.numel() * x.element_size())):
            # dW = sum_n gZ[n] [K, HW] @ X[n]^T [HW, C]: per-image fp32 partials, then a fixed-order sum.
            part = dw2.view(1, K, C) if N == 1 else torch.empty((N, K, C), dtype=torch.float32, device=x.device)
            _launch(_gemm_view(gz, K, HW, gz.stride(1), gz.stride(2), N, gz.stride(0)),
                    _gemm_view(x2, HW, C, x2.stride(2), x2.stride(1), N, x2.stride(0)), part)
            if N > 1:
                sum_partials(part.view(N, K * C), dw2.view(-1))
        else:
            dw, _ = _dw(gz.view(N, K, H, W) if copy_gz else gy, None, x, weight, geo)
    return dx, dw, dbias


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geo: ConvGeometry, *,
           act: str = "none", act_alpha: float = 0.01, save_z: bool = False):
    """(Y, Z): Y = act(conv(x [N, C, H, W], weight [K, C/groups, R, S]) + bias [K]), [N, K, P, Q]
    in x's layout; Z (the pre-activation) only when ``save_z`` and act's backward needs it."""
    code = activations.act_code("conv2d", act, act_alpha)
    Nb, C, H, W = x.shape
    K, Cg, R, S = weight.shape
    P, Q = geo.out_hw
    y = empty_like_layout((Nb, K, P, Q), x)
    z = torch.empty_like(y) if save_z and activations.needs_z(code) else None
    if y.numel() == 0:
        return y, z
    layout = gemm_1x1_layout(x, weight, geo)
    if layout is not None:
        return _conv1x1(x, weight, bias, layout == "nhwc", act, act_alpha, save_z)
    if _is_depthwise(weight, geo.groups):
        w = weight[:, 0]  # [K, R, S]
        _launch_depthwise(x, _WeightView(w, w.stride(0), 0, w.stride(1), w.stride(2), 0, 0), bias, y, z, R, S, geo,
                          code, act_alpha)
        return y, z
    if conv_framed.supports(x, weight, geo.stride, geo.groups):
        conv_framed.forward(x, weight, bias, y, z, geo.pad, geo.dilation, code, act_alpha)
        return y, z
    if Cg >= TAP_MIN_CHANNELS:  # K-major operands for the tap-major loop
        x = _nhwc(x)
        weight = _nhwc(weight)
    _launch_fwd(x, _weight_view(weight), bias, y, z, R, S, Cg, K // geo.groups, geo, code, act_alpha)
    return y, z


# dW's reduction (N*P*Q pixels, walked in steps of one row segment) is split across programs when
# the tile grid alone would not fill the GPU; the fp32 partials of the splits are then added in a
# fixed order (deterministic, no atomics). Each split gets at least DW_MIN_SPLIT steps; splits aim
# at DW_TARGET_PROGRAMS programs (~4 small programs per H100 SM: a program's steps are
# latency-bound, so short loops over many programs beat long ones); at most DW_MAX_SPLITS of them,
# so that one [splits, 32] load per program adds them up; and their partials stay under
# DW_PARTIAL_FLOATS (or 1/4 of gY's elements).
DW_MIN_SPLIT = 4
# (The interpreter's cost is per program: there one split, unless a test asks for more.)
DW_TARGET_PROGRAMS = 1 if runtime.is_interpreter() else 528
DW_MAX_SPLITS = 128
DW_PARTIAL_FLOATS = 1 << 20
# fp32 dW runs on the CUDA cores (``DIRECT`` in ``conv2d_dw_kernel``: exact fp32) up to this many
# multiply-adds, per matmul precision; above it the tensor-core loop. tf32x3's dot is three
# register-routed tensor-core passes per step, so the FMA loop wins far longer there.
DW_DIRECT_MACS = {"ieee": 1 << 28, "tf32x3": 1 << 28, "tf32": 1 << 25}
# A dW of at most this many columns (C*R*S: a 1-channel stem) fills at most half of a 32-wide MMA
# tile: it runs direct up to the largest cap above whatever the precision. bench_train's CNN b512
# conv1 (32x1x3x3 over 512x28x28 pixels, 116 M MACs) took 319 us through the tf32 dot, 130 direct.
DW_DIRECT_NARROW = 16
# Pixels per tensor-core dW step: output rows narrower than this are taken several at a time
# (a 14-wide row alone is a 16-deep step: one bf16 MMA per loop trip, mostly loop overhead).
DW_STEP_PIXELS = 64
DB_PIXELS = tl.constexpr(256)  # pixels per step of dW's bias-gradient programs (conv2d_dw_kernel)
# The depthwise dW splits its N*P rows (4+ per split) into about this many programs at 32 channels
# a program (more for narrower tiles); each split's taps are fp32 partials added in a fixed order.
DEPTHWISE_DW_TARGET_PROGRAMS = 4 if runtime.is_interpreter() else 528  # interpreter: a few, to test the sum


def _direct_dw(dtype: torch.dtype, macs: int, cols: int) -> bool:
    """Whether a dW of ``macs`` multiply-adds and ``cols`` = C/groups*R*S columns runs on the CUDA
    cores (fp32 up to DW_DIRECT_MACS; narrow ones up to its largest cap)."""
    if dtype != torch.float32:
        return False
    cap = DW_DIRECT_MACS.get(_precision(dtype), 0)
    if cols <= DW_DIRECT_NARROW:
        cap = max(DW_DIRECT_MACS.values(), default=0)
    return macs <= cap


def _dw_splits(steps: int, tiles: int, row: int = 1, gz_numel: int = 0) -> tuple[int, int]:
    """(number of splits, steps per split) of dW's reduction of ``steps`` steps, for a grid of
    ``tiles`` programs per split whose partials are ``row`` floats per split."""
    cap = max(DW_PARTIAL_FLOATS, gz_numel // 4) // max(row, 1)
    splits = max(1, min(runtime.cdiv(DW_TARGET_PROGRAMS, tiles), steps // DW_MIN_SPLIT, cap, DW_MAX_SPLITS))
    split_len = runtime.cdiv(steps, splits)
    return runtime.cdiv(steps, split_len), split_len


def _pixels_by_channels(gy: torch.Tensor) -> torch.Tensor:
    """gy [N, K, P, Q] as an [N, P*Q, K] view (copied to NHWC only if P, Q cannot merge)."""
    Nb, K, P, Q = gy.shape
    if P > 1 and Q > 1 and gy.stride(2) != Q * gy.stride(3):
        gy = gy.contiguous(memory_format=torch.channels_last)
    return gy.as_strided((Nb, P * Q, K), (gy.stride(0), gy.stride(3) if Q > 1 else gy.stride(2), gy.stride(1)))


def _dx(gz: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, geo: ConvGeometry) -> torch.Tensor:
    """dX [N, C, H, W] in x's layout from gZ [N, K, P, Q]."""
    Nb, C, H, W = x.shape
    K, Cg, R, S = weight.shape
    P, Q = geo.out_hw
    Kg = K // geo.groups
    dx = empty_like_layout(tuple(x.shape), x)
    if dx.numel() == 0:
        return dx
    if gz.numel() == 0:
        return dx.fill_(0)
    if geo.stride == (1, 1):
        # dX = conv(gZ, flipped W^T) with padding d*(R-1) - p: the forward kernel, gZ as its input.
        (dh, dw_), (ph, pw) = geo.dilation, geo.pad
        tgeo = ConvGeometry((1, 1), (dh * (R - 1) - ph, dw_ * (S - 1) - pw), geo.dilation, geo.groups, (H, W))
        if _is_depthwise(weight, geo.groups):
            w = weight[:, 0]  # [K, R, S], flipped through a base offset and negative strides
            wv = _WeightView(w, w.stride(0), 0, -w.stride(1), -w.stride(2), 0,
                             (R - 1) * w.stride(1) + (S - 1) * w.stride(2))
            _launch_depthwise(gz, wv, None, dx, None, R, S, tgeo, activations.NONE, 0.0)
            return dx
        if Kg >= TAP_MIN_CHANNELS:  # K-major: gZ channels and W's output channels innermost
            gz = _nhwc(gz)
            weight = weight.permute(1, 2, 3, 0).contiguous().permute(3, 0, 1, 2)
        _launch_fwd(gz, _flipped_weight_view(weight, geo.groups), None, dx, None, R, S, Kg, Cg, tgeo,
                    activations.NONE, 0.0)
        return dx
    gz = _nhwc(gz)
    wt = weight.permute(1, 2, 3, 0).contiguous().permute(3, 0, 1, 2)  # output channels innermost: K-major B
    grid = lambda meta: (runtime.cdiv(Nb * H * W, meta["BLOCK_M"]) * runtime.cdiv(Cg, meta["BLOCK_N"]), geo.groups)
    conv2d_dx_kernel[grid](
        gz, wt, dx, Nb, C, H, W, K, P, Q, R, S, Cg, Kg,
        *gz.stride(), *wt.stride(), *dx.stride(), *geo.stride, *geo.pad, *geo.dilation, **_numerics(x.dtype))
    return dx


def _dw(gy: torch.Tensor, saved: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, geo: ConvGeometry, *,
        code: int = activations.NONE, act_alpha: float = 0.0, from_z: bool = False, with_db: bool = False):
    """(dW [K, C/groups, R, S] contiguous, db [K] | None) from gY [N, K, P, Q] and x, with
    gZ = gY * act'(saved) formed on the fly (``code``: the activation; NONE: gZ = gY)."""
    Nb, C, H, W = x.shape
    K, Cg, R, S = weight.shape
    P, Q = geo.out_hw
    Kg = K // geo.groups
    L = Nb * P * Q
    CRS = Cg * R * S
    row = K * CRS + (K if with_db else 0)
    flat = torch.empty(row, dtype=weight.dtype, device=weight.device)  # dW, then db: one sum pass
    dw = flat[:K * CRS].view(K, Cg, R, S)
    db = flat[K * CRS:] if with_db else None
    if flat.numel() == 0:
        return dw, db
    if L == 0:
        flat.fill_(0)
        return dw, db
    if _is_depthwise(weight, geo.groups):
        assert code == activations.NONE and not with_db, "depthwise dW takes a formed gZ, db apart"
        splits = max(1, min(runtime.cdiv(DEPTHWISE_DW_TARGET_PROGRAMS, runtime.cdiv(C, 32)), runtime.cdiv(Nb * P, 4)))
        out = dw if splits == 1 and dw.dtype == torch.float32 else torch.empty(
            (splits, dw.numel()), dtype=torch.float32, device=dw.device)
        grid = lambda meta: (runtime.cdiv(C, meta["BLOCK_C"]), splits)
        conv2d_depthwise_dw_kernel[grid](
            gy, x, out, Nb, C, H, W, P, Q, R, S, *gy.stride(), *x.stride(),
            *geo.stride, *geo.pad, *geo.dilation)
        if out is not dw:
            sum_partials(out, flat)
        return dw, db
    per_tap = Cg >= TAP_MIN_CHANNELS
    if per_tap and x.element_size() <= 2:
        # 16-bit: both operands read along channels (NHWC), 16-byte loads. fp32 keeps the layout
        # it was given: for NCHW that makes both operands contiguous along the pixel reduction,
        # the K-major order that tf32 wgmma needs.
        gy, x = _nhwc(gy), _nhwc(x)
        saved = _nhwc(saved) if saved is not None else None
    taps = R * S if per_tap else 1
    ncols = Cg if per_tap else CRS
    tiles = runtime.cdiv(Kg, 64) * runtime.cdiv(ncols, 32) * geo.groups * taps
    numerics = _numerics(x.dtype)
    direct = _direct_dw(x.dtype, L * K * CRS, CRS)
    if per_tap and x.dtype == torch.float32 and numerics["PRECISION"] != "ieee" and not direct and is_channels_last(x):
        # tf32 wgmma takes K-major operands only, and NHWC's run along channels, not along the pixel
        # reduction: NCHW copies of gY and X cost less than the strided dW (docs/conv.md, dW).
        gy, x = gy.contiguous(), x.contiguous()
        saved = saved.contiguous() if saved is not None else None
    # The reduction step: a QB-wide segment of one output row (direct: at most 32, the
    # accumulator holds QB partial sums per dW element).
    qb = min(max(_next_pow2(Q), 16), 32 if direct else 64)
    rows = 1 if direct else DW_STEP_PIXELS // qb  # tensor-core steps of DW_STEP_PIXELS pixels: several rows
    steps = Nb * P * runtime.cdiv(Q, qb)
    splits, split_len = _dw_splits(steps, tiles, row, gy.numel())
    out = flat if splits == 1 else torch.empty((splits, row), dtype=torch.float32, device=flat.device)
    slots = geo.groups * taps + (geo.groups if with_db else 0)
    grid = lambda meta: (runtime.cdiv(Kg, meta["BLOCK_M"]) * runtime.cdiv(ncols, meta["BLOCK_N"]), slots, splits)
    sv = saved if saved is not None and code != activations.NONE else gy
    conv2d_dw_kernel[grid](
        gy, sv, x, out, Nb, C, H, W, K, P, Q, R, S, Cg, Kg, split_len, row,
        *gy.stride(), *sv.stride(), *x.stride(), *geo.stride, *geo.pad, *geo.dilation, float(act_alpha),
        ACT=code, FROM_Z=from_z, HAS_DB=with_db, QB=qb, ROWS=rows, PER_TAP=per_tap, DIRECT=direct, **numerics)
    if splits > 1:
        sum_partials(out, flat)
    return dw, db


def conv2d_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, saved: torch.Tensor | None,
                    geo: ConvGeometry, *, has_bias: bool, act: str = "none", act_alpha: float = 0.01,
                    from_z: bool = False, need_x: bool = True, need_w: bool = True):
    """(dx | None, dw | None, dbias | None) of Y = act(conv(x, weight) + bias), given gY = dL/dY.

    ``saved`` is Z (``from_z``) or Y, for act'; unused when act is "none". dx in x's layout,
    dw contiguous [K, C/groups, R, S], dbias [K] in gy's dtype.

    dW forms gZ = gY * act' as it loads gY and adds up db in the same launch (the bias gradient's
    row sums are a few extra programs of the dW grid), so a layer whose input needs no gradient
    (a network's first conv) runs one dW kernel and one fixed-order sum of its split partials.
    gZ is materialised (NHWC) only for dX, for depthwise dW, and for the 16-bit per-tap dW.
    """
    code = activations.act_code("conv2d_backward", act, act_alpha)
    layout = gemm_1x1_layout(x, weight, geo)
    if layout is not None:
        return _conv1x1_backward(gy, x, weight, saved, geo, layout == "nhwc", has_bias=has_bias, code=code,
                                 act_alpha=act_alpha, from_z=from_z, need_x=need_x, need_w=need_w)
    K, Cg, R, S = weight.shape
    depthwise = _is_depthwise(weight, geo.groups)
    framed = conv_framed.supports(x, weight, geo.stride, geo.groups) and gy.numel() > 0
    # fp32 dW: framed (tensor cores) unless the CUDA-core loop takes it
    framed_dw = framed and need_w and not _direct_dw(x.dtype, gy.numel() * Cg * R * S, Cg * R * S)
    fused_dw = need_w and not depthwise and not framed_dw and not (Cg >= TAP_MIN_CHANNELS and x.element_size() <= 2)
    need_gz = need_x or (need_w and not fused_dw)
    copy_gz = need_gz and (code != activations.NONE or gy.dtype != x.dtype)
    db_apart = has_bias and not (need_w and not depthwise and not framed_dw)
    dbias = None
    gz = gy
    if copy_gz or db_apart:
        Nb, _, P, Q = gy.shape
        saved3 = _pixels_by_channels(saved) if saved is not None and code != activations.NONE else None
        gz3, dbias, _ = bias_act_backward(
            _pixels_by_channels(gy), saved3, act=code, from_z=from_z, act_alpha=act_alpha,
            bias_kind="per_n" if db_apart else "none", gz_dtype=x.dtype if copy_gz else None, beta=None)
        if copy_gz:  # [N, P*Q, K] contiguous: gZ in NHWC
            gz = gz3.as_strided((Nb, K, P, Q), (P * Q * K, 1, Q * K, K))
    if framed and (need_x or framed_dw):
        dx = empty_like_layout(tuple(x.shape), x) if need_x else None
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if framed_dw else None
        conv_framed.backward(gz, x, weight, geo.pad, geo.dilation, dx, dw)
        if framed_dw or not need_w:
            return dx, dw, dbias
    else:
        dx = _dx(gz, x, weight, geo) if need_x else None
    dw = None
    if need_w:
        if fused_dw:
            dw, db = _dw(gy, saved, x, weight, geo, code=code, act_alpha=act_alpha, from_z=from_z, with_db=has_bias)
        else:
            dw, db = _dw(gz, None, x, weight, geo, with_db=has_bias and not depthwise)
        if db is not None:
            dbias = db if db.dtype == gy.dtype else db.to(gy.dtype)
    return dx, dw, dbias
