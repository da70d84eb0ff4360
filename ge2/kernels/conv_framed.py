"""Stride-1 convolutions as TMA GEMMs over a framed copy of the input.

A *frame* holds an [N, C, H, W] tensor as rows of C channels (a 16-byte aligned row stride):
image n's pixel (h, w) is row ``n*Hf*Wf + h*Wf + w``, and the ``Hf - H`` rows after each image
and ``Wf - W`` columns after each image row are zeros (``frame_dims``). Put output pixel
(n, p, q) at row ``j = n*Hf*Wf + p*Wf + q`` of the same frame; then the input pixel that tap
(r, s) of it reads is row ``j + (r*dh - ph)*Wf + (s*dw - pw)``, and a read that falls in the
padding lands in a zero gap (or before row 0 / past the end, which the copy engine fills with
zeros). So the A tile of one tap for BLOCK_M consecutive output rows is BLOCK_M consecutive
frame rows at a constant shift: a plain 2-D TMA load, no address arithmetic, no masks.

* forward (``conv2d_framed_kernel``): a GEMM over the frame's rows, the reduction walking
  (tap, channel block), W as [K, R*S*C] (channels innermost: both operands K-major, which tf32
  wgmma requires); the epilogue drops the rows that fall in a gap (a 3x3 conv with padding 1
  computes Hf*Wf / (P*Q) = 1.15x the useful work at 14x14, 1.04x at 56x56) and stores the rest
  through the output's strides with bias + activation.
* dX: the same kernel on the framed gZ with the weight's taps reversed (``FLIP``) and the
  padding ``d*(R-1) - p``.
* dW (``conv2d_framed_dw_kernel``, 16-bit): dW[:, :, r, s] = Gᵀ @ F shifted by tap (r, s), G the
  framed gZ (zero in the gaps), F the framed input: one GEMM per tap, the frame rows split
  across programs, fp32 partials added in a fixed order.

* in place (``conv2d_nhwc_kernel``, ``conv2d_nhwc_dw_kernel``): a channels-last input with 16-byte
  aligned pixel rows needs no frame. A 4-D descriptor reads it as [N, H, W, C]; a tile is BI images
  x BH x BW output pixels, tap (r, s) loads the box at the tap-shifted corner, and the copy engine
  zero-fills what falls outside the image (the padding); persistent configs loop over tiles. dX
  likewise from channels-last gZ; 16-bit dW from channels-last gZ and x (up to ``NHWC_DW_MAX_KC``).

Gaps of ``max(pad, d*(R-1) - pad)`` rows/columns serve all three passes, so dX and dW share one
framed gZ. The tap-major kernel of ``ge2.kernels.conv`` read X through per-pixel masked loads
(cp.async) instead; this path needs Hopper's TMA (or the interpreter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels.activations import act_fwd
from ge2.kernels.gemm import _precision, _sm_count, _tile_coords, _tma_rounding, _tma_sms, tile_config

ENABLED = True  # off: stride-1 convs take the tap-major kernels (A/B comparisons)
NHWC_DIRECT = True  # off: channels-last inputs are framed too (A/B comparisons)
# 16-bit dW reads channels-last gZ and x in place up to K*C of this: two frame passes saved outweigh
# its slower steps at 64x64 channels (fwd+bwd 200 -> 166 us at 64x64x56^2), not at 256x256 (109 -> 121
# us at 64x256x14^2, where the frames are cheap against the GEMM work).
NHWC_DW_MAX_KC = 128 * 128
MIN_CHANNELS = 16  # channels on both sides of the GEMM (fewer: a 16-deep MMA step is mostly padding)


def _block_shapes(nargs) -> None:
    """The descriptors' tile shapes follow the config (set before each launch)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    if "x_desc" not in nargs:  # planar dW: gZ's [channels, rows] tiles (x is read by pointers)
        nargs["g_desc"].block_shape = [bm, bk]
        nargs["g_lo_desc"].block_shape = [bm, bk]
    elif "g_desc" in nargs:  # dW from row frames: [rows, channels] tiles
        nargs["g_desc"].block_shape = [bk, bm]
        nargs["x_desc"].block_shape = [bk, bn]
    else:
        nargs["x_desc"].block_shape = [bm, bk]
        nargs["w_desc"].block_shape = [bn, bk] if nargs["W_KMAJOR"] else [bk, bn]


def _cfg(bm, bn, bk, warps, stages) -> triton.Config:
    return tile_config(bm, bn, bk, warps, stages, pre_hook=_block_shapes)


# (BLOCK_M, BLOCK_N, warps, stages); 16-bit operands take 64-deep K steps, fp32 ones 32-deep
# (the same bytes per shared-memory stage).
_TILES = [(128, 128, 8, 4), (128, 256, 8, 3), (256, 128, 8, 3), (128, 64, 4, 4), (256, 64, 8, 4), (64, 64, 4, 5)]
CONFIGS_16 = [_cfg(bm, bn, 64, warps, stages) for bm, bn, warps, stages in _TILES]
CONFIGS_32 = [_cfg(bm, bn, 32, warps, stages) for bm, bn, warps, stages in _TILES]
INTERPRETER_CONFIG = _cfg(32, 32, 16, 4, 1)


def _prune(configs, named_args, **kwargs):
    """The configs of the operand width, at most one power of two wider than the output channels."""
    a = {**named_args, **kwargs}
    space = CONFIGS_16 if a["OPERAND_BYTES"] <= 2 else CONFIGS_32
    k = triton.next_power_of_2(a["K"])
    return [c for c in configs if c in space and c.kwargs["BLOCK_N"] <= max(64, k)] or space[-1:]


def _prune_dw(configs, named_args, **kwargs):
    """dW configs whose [K, C] tile is at most one power of two wider than K and than C."""
    a = {**named_args, **kwargs}
    k, c = triton.next_power_of_2(a["K"]), triton.next_power_of_2(a["C"])
    keep = [cf for cf in configs if cf.kwargs["BLOCK_M"] <= max(64, k) and cf.kwargs["BLOCK_N"] <= max(64, c)]
    return keep or configs[-1:]


_SIZES = ["M", "Nb", "P", "Q", "Wf", "HfWf", "shift0", "tap_dh"]


@runtime.autotune(CONFIGS_16 + CONFIGS_32,
                  key=["M", "K", "C", "taps", "OPERAND_BYTES", "PRECISION", "FLIP", "W_KMAJOR"],
                  default=INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=_SIZES)
def conv2d_framed_kernel(
    x_desc, w_desc, bias_ptr, y_ptr, z_ptr,
    M, K, C, Cs, Nb, P, Q, Wf, HfWf, shift0, tap_dh, tap_dw, S, taps,
    syn, syk, syp, syq, sbias, act_alpha,
    FLIP: tl.constexpr, W_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    OPERAND_BYTES: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M frame rows, BLOCK_N out channels] tile of Y = act(conv(X) + bias).

    x_desc: the framed input [rows, C]; w_desc: W as [K, taps*Cs], tap t's channels at t*Cs
    (W_KMAJOR), or the transposed problem's [C, taps*Ks] read as [reduction, output] tiles.
    Tap t = (r, s) reads frame row j + shift0 + r*tap_dh + s*tap_dw for output row j.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, K, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    c_blocks = tl.cdiv(C, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # One flat loop over (tap, channel block), so that the pipeliner always has R*S*c_blocks steps.
    for step in range(0, taps * c_blocks):
        tap = step // c_blocks
        c0 = (step - tap * c_blocks) * BLOCK_K
        r = tap // S
        a = x_desc.load([m0 + shift0 + r * tap_dh + (tap - r * S) * tap_dw, c0])
        w_tap = taps - 1 - tap if FLIP else tap
        if W_KMAJOR:  # W [K, taps*Cs]: reduction channels innermost (tf32 wgmma needs this)
            # Channels past C: A's are zero-filled by the copy engine, so B's (the next tap's) add nothing.
            b = w_desc.load([n0, w_tap * Cs + c0]).T
        else:  # dX from the forward's W: rows are the reduction, output channels innermost
            b = w_desc.load([c0, w_tap * Cs + n0])
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    # Frame row j -> output pixel (n, p, q); rows in a gap are computed and dropped.
    offs_m = m0 + tl.arange(0, BLOCK_M)
    n = offs_m // HfWf
    within = offs_m - n * HfWf
    p = within // Wf
    q = within - p * Wf
    mask_m = (offs_m < M) & (p < P) & (q < Q)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < K
    z = acc
    if HAS_BIAS:
        z += tl.load(bias_ptr + offs_n * sbias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_offs = (n.to(tl.int64) * syn + p * syp + q * syq)[:, None] + offs_n[None, :].to(tl.int64) * syk
    mask = mask_m[:, None] & mask_n[None, :]
    if SAVE_Z:
        tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + y_offs, act_fwd(z, ACT, act_alpha).to(y_ptr.dtype.element_ty), mask=mask)


# Channels-last inputs skip the frame: a 4-D TMA descriptor over [N, H, W, C] loads a
# [BI, BH, BW, BLOCK_K] box per tap at the tap's shifted corner, and the copy engine zero-fills what
# falls outside the image (the padding). BI*BH*BW pixels a tile (wgmma's N: the input tile is the
# second operand, which keeps it in shared memory); several images a tile let a tile fit the image
# (8x8 pixels of 56x56, 2x16 of 14x14) and still give the MMA 128 or 256 pixels.
# (BI, BH, BW, BLOCK_N, warps, stages, TMA_STORE, PERSISTENT); the measured winners on an H100:
_NHWC_TILES = [
    # one image a tile (any image size): a TMA store won at 64x64x56^2 (55 vs 58 us), masked stores
    # at 64x256x14^2 (28 vs 33)
    *[(1, bh, bw, bn, w, st, tma, 0) for bh, bw, bn, w, st in
      [(8, 16, 64, 4, 4), (4, 32, 64, 4, 4), (16, 8, 64, 4, 4), (8, 8, 64, 4, 5), (8, 8, 128, 4, 4),
       (16, 16, 128, 8, 3), (16, 8, 256, 8, 3), (8, 16, 256, 8, 3)] for tma in (1, 0)],
    # 64x64x56^2 forward, bf16 and tf32: 40 and 79 us persistent, 51 and 91 one tile a program
    (4, 8, 8, 64, 4, 4, 1, 1), (4, 8, 8, 64, 4, 4, 0, 1),
    # its dX
    (2, 8, 8, 64, 4, 4, 0, 2), (2, 8, 8, 64, 4, 4, 1, 2), (2, 8, 8, 64, 4, 3, 1, 2), (2, 8, 8, 64, 4, 3, 1, 0),
    (2, 8, 8, 128, 8, 3, 1, 1), (2, 8, 8, 128, 8, 3, 0, 0),
    # 64x256x14^2, bf16 27.5 us, tf32 51.5 (dX: persistent)
    (8, 2, 16, 128, 8, 3, 1, 0), (8, 2, 16, 128, 8, 3, 0, 0), (8, 2, 16, 128, 8, 3, 0, 2),
    (4, 2, 16, 256, 8, 3, 1, 0), (4, 2, 16, 256, 8, 3, 0, 0), (8, 2, 16, 64, 4, 3, 1, 1), (4, 2, 16, 128, 4, 4, 1, 1),
]


def _nhwc_block_shapes(nargs) -> None:
    """The descriptors' box shapes follow the config (set before each launch)."""
    bi, bh, bw, bn, bk = nargs["BI"], nargs["BH"], nargs["BW"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [bi, bh, bw, bk]
    nargs["w_desc"].block_shape = [bn, bk] if nargs["W_KMAJOR"] else [bk, bn]
    if nargs["y_desc"] is not None:
        nargs["y_desc"].block_shape = [bi, bh, bw, bn]


def _nhwc_cfg(bi, bh, bw, bn, bk, warps, stages, tma_store, persistent) -> triton.Config:
    return triton.Config({"BI": bi, "BH": bh, "BW": bw, "BLOCK_N": bn, "BLOCK_K": bk, "TMA_STORE": tma_store,
                          "PERSISTENT": persistent},
                         num_warps=warps, num_stages=stages, pre_hook=_nhwc_block_shapes)


NHWC_CONFIGS_16 = [_nhwc_cfg(*tile[:4], 64, *tile[4:]) for tile in _NHWC_TILES]
NHWC_CONFIGS_32 = [_nhwc_cfg(*tile[:4], 32, *tile[4:]) for tile in _NHWC_TILES]
NHWC_INTERPRETER_CONFIG = _nhwc_cfg(2, 4, 4, 16, 16, 4, 1, 0, 1)


def _nhwc_programs(tiles: int, persistent: int, device: torch.device) -> int:
    """Programs of a conv2d_nhwc_kernel launch: one a tile, or ``persistent`` an SM looping over tiles."""
    return min(tiles, persistent * _sm_count(device)) if persistent else tiles


def _pixel_fill(c: triton.Config, nb: int, p: int, q: int) -> float:
    """The fraction of a config's tile pixels that are output pixels."""
    bi, bh, bw = c.kwargs["BI"], c.kwargs["BH"], c.kwargs["BW"]
    return nb * p * q / (triton.cdiv(nb, bi) * bi * triton.cdiv(p, bh) * bh * triton.cdiv(q, bw) * bw)


def _prune_nhwc(configs, named_args, **kwargs):
    """The configs of the operand width, at most one power of two wider than the output channels,
    TMA stores only where the outputs take them, tiles that waste at most 10% more pixels than the
    best fitting one (a dropped pixel costs as much as a kept one)."""
    a = {**named_args, **kwargs}
    space = NHWC_CONFIGS_16 if a["OPERAND_BYTES"] <= 2 else NHWC_CONFIGS_32
    k = triton.next_power_of_2(a["K"])
    keep = [c for c in configs if c in space and c.kwargs["BLOCK_N"] <= max(64, k)
            and (a["TMA_OUT"] or not c.kwargs["TMA_STORE"])] or space[-1:]
    fill = {id(c): _pixel_fill(c, a["Nb"], a["P"], a["Q"]) for c in keep}
    best = max(fill.values())
    return [c for c in keep if fill[id(c)] >= 0.9 * best]


@runtime.autotune(NHWC_CONFIGS_16 + NHWC_CONFIGS_32,
                  key=["Nb", "P", "Q", "K", "C", "taps", "OPERAND_BYTES", "PRECISION", "TMA_OUT", "FLIP", "W_KMAJOR"],
                  default=NHWC_INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_nhwc},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["Nb", "P", "Q", "pad_h", "pad_w"])
def conv2d_nhwc_kernel(
    x_desc, w_desc, y_desc, bias_ptr, y_ptr, z_ptr,
    Nb, P, Q, K, C, Cs, pad_h, pad_w, dil_h, dil_w, S, taps,
    syn, syk, syp, syq, sbias, act_alpha,
    FLIP: tl.constexpr, W_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    TMA_OUT: tl.constexpr, OPERAND_BYTES: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TMA_STORE: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """[BI images x BH x BW output pixels, BLOCK_N out channels] tiles of Y = act(conv(X) + bias):
    one a program, or (PERSISTENT) every num_programs-th, the tile and step loops flattened so that
    the next tile's loads stream in during this one's epilogue.

    x_desc: X [N, H, W, C] (channels innermost); w_desc as conv2d_framed_kernel's. Tap t = (r, s)
    of output pixel (p, q) reads input pixel (p + r*dil_h - pad_h, q + s*dil_w - pad_w).
    """
    if PERSISTENT:
        num_tiles = tl.cdiv(Nb, BI) * tl.cdiv(P, BH) * tl.cdiv(Q, BW) * tl.cdiv(K, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
            _nhwc_tile(tile, x_desc, w_desc, y_desc, bias_ptr, y_ptr, z_ptr, Nb, P, Q, K, C, Cs, pad_h, pad_w,
                       dil_h, dil_w, S, taps, syn, syk, syp, syq, sbias, act_alpha, FLIP, W_KMAJOR, HAS_BIAS, ACT,
                       SAVE_Z, PRECISION, UPCAST, BI, BH, BW, BLOCK_N, BLOCK_K, TMA_STORE)
    else:  # no tile loop: Y's TMA tile reuses the pipeline's shared memory (the loop's stays live)
        _nhwc_tile(tl.program_id(0), x_desc, w_desc, y_desc, bias_ptr, y_ptr, z_ptr, Nb, P, Q, K, C, Cs, pad_h,
                   pad_w, dil_h, dil_w, S, taps, syn, syk, syp, syq, sbias, act_alpha, FLIP, W_KMAJOR, HAS_BIAS, ACT,
                   SAVE_Z, PRECISION, UPCAST, BI, BH, BW, BLOCK_N, BLOCK_K, TMA_STORE)


@triton.jit
def _nhwc_tile(
    tile, x_desc, w_desc, y_desc, bias_ptr, y_ptr, z_ptr,
    Nb, P, Q, K, C, Cs, pad_h, pad_w, dil_h, dil_w, S, taps,
    syn, syk, syp, syq, sbias, act_alpha,
    FLIP: tl.constexpr, W_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, BI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA_STORE: tl.constexpr,
):
    """Tile ``tile`` of conv2d_nhwc_kernel."""
    BM: tl.constexpr = BI * BH * BW
    n_tiles = tl.cdiv(K, BLOCK_N)
    tiles_q = tl.cdiv(Q, BW)
    tiles_p = tl.cdiv(P, BH)
    c_blocks = tl.cdiv(C, BLOCK_K)
    # Output-channel tiles fastest: the programs that share an input tile run side by side.
    pid_n = tile % n_tiles
    pix = tile // n_tiles
    tq = pix % tiles_q
    rest = pix // tiles_q
    tp = rest % tiles_p
    i0 = (rest // tiles_p) * BI
    p0 = tp * BH
    q0 = tq * BW
    n0 = pid_n * BLOCK_N
    # Y^T += W_tile @ X_tile^T: as wgmma's second operand the reshaped box is read where TMA put it
    # (as the first, Triton 3.6 moves it through registers).
    acc = tl.zeros((BLOCK_N, BM), dtype=tl.float32)
    for step in range(0, taps * c_blocks):
        tap = step // c_blocks
        c0 = (step - tap * c_blocks) * BLOCK_K
        r = tap // S
        a = x_desc.load([i0, p0 + r * dil_h - pad_h, q0 + (tap - r * S) * dil_w - pad_w, c0]).reshape(BM, BLOCK_K)
        w_tap = taps - 1 - tap if FLIP else tap
        if W_KMAJOR:  # channels past C: A's are zero-filled, so B's (the next tap's) add nothing
            b = w_desc.load([n0, w_tap * Cs + c0])
        else:  # dX from the forward's W: [reduction, output] tiles
            b = w_desc.load([c0, w_tap * Cs + n0]).T
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(b, a.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
    z = acc.T
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < K
    if HAS_BIAS:
        z += tl.load(bias_ptr + offs_n * sbias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = act_fwd(z, ACT, act_alpha).to(y_ptr.dtype.element_ty)
    if TMA_STORE:  # the copy engine drops what falls past N, P, Q or K
        y_desc.store([i0, p0, q0, n0], y.reshape(BI, BH, BW, BLOCK_N))
    else:  # Z (laid out as Y) only comes this way: see _nhwc_conv
        m = tl.arange(0, BM)
        i = i0 + m // (BH * BW)
        p = p0 + (m // BW) % BH
        q = q0 + m % BW
        y_offs = (i.to(tl.int64) * syn + p * syp + q * syq)[:, None] + offs_n[None, :].to(tl.int64) * syk
        mask = ((i < Nb) & (p < P) & (q < Q))[:, None] & mask_n[None, :]
        if SAVE_Z:
            tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
        tl.store(y_ptr + y_offs, y, mask=mask)


@runtime.autotune(CONFIGS_16, key=["M", "K", "C", "S", "SPLIT_STEPS"],
                  default=INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["M", "shift0", "tap_dh", "SPLIT_STEPS"])
def conv2d_framed_dw_kernel(
    g_desc, x_desc, M, K, C, shift0, tap_dh, tap_dw, S, SPLIT_STEPS, out_ptr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Split program_id(2)'s partial of 16-bit dW's tap program_id(1) = (r, s), tile program_id(0)
    of [K, C], from the row frames of gZ and x (the MMA reads both tiles MN-major):
    out[split, r*S + s, k, c] = sum over its frame rows j of G[j, k] * F[j + shift(r, s), c]."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), K, C, BLOCK_M, BLOCK_N, GROUP_M)
    tap = tl.program_id(1)
    r = tap // S
    split = tl.program_id(2)
    shift = shift0 + r * tap_dh + (tap - r * S) * tap_dw
    k0 = pid_m * BLOCK_M
    c0 = pid_n * BLOCK_N
    first = split * SPLIT_STEPS
    last = tl.minimum(first + SPLIT_STEPS, tl.cdiv(M, BLOCK_K))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first, last):
        j = step * BLOCK_K
        g = g_desc.load([j, k0])  # [rows, out channels]
        x = x_desc.load([j + shift, c0])  # [rows, in channels]
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            g = g.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(g.T, x, acc, out_dtype=tl.float32)
    _store_dw_partial(out_ptr, acc, split * tl.num_programs(1) + tap, k0, c0, K, C, BLOCK_M, BLOCK_N)


@triton.jit
def _store_dw_partial(out_ptr, acc, row, k0, c0, K, C, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[row] ([K, C] row-major) = acc, a [BLOCK_M, BLOCK_N] tile at (k0, c0)."""
    offs_k = k0 + tl.arange(0, BLOCK_M)
    offs_c = c0 + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + row.to(tl.int64) * K * C + offs_k[:, None] * C + offs_c[None, :], acc,
             mask=(offs_k[:, None] < K) & (offs_c[None, :] < C))


# fp32 dW from planar frames (BLOCK_K = 32: one 128-byte row of fp32 pixels a step). 64x64 tiles
# for 64 channels (more programs for the latency of the pointer loads), 128-row ones for wider layers.
PLANAR_DW_CONFIGS = [_cfg(bm, bn, 32, warps, stages) for bm, bn, warps, stages in
                     [(64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 4, 3), (64, 128, 4, 4), (128, 128, 8, 3)]]
# tf32x3 dW from frames split into tf32 high and low planes (``frame(split=True)``): three plain tf32
# dots a step on operands that stay in shared memory. Triton's own tf32x3 dot splits the operands in
# registers every step: bench_train's CNN b512 conv2 dW (64x32x3x3 over 512x16x16 frame rows) took
# 1018 us that way against 75 us for one tf32 dot (bench/profile_cnn_step.py). Off: Triton's tf32x3.
PLANAR_SPLIT = True


@runtime.autotune(PLANAR_DW_CONFIGS, key=["M", "K", "C", "S", "SPLIT_STEPS", "PRECISION", "SPLIT"],
                  default=INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["M", "x_cols", "x_plane", "shift0", "tap_dh", "SPLIT_STEPS"])
def conv2d_planar_dw_kernel(
    g_desc, g_lo_desc, x_ptr, M, K, C, x_cols, x_stride, x_plane, shift0, tap_dh, tap_dw, S, SPLIT_STEPS, out_ptr,
    PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Split program_id(2)'s partial of fp32 dW's tap program_id(1) = (r, s), tile program_id(0) of
    [K, C], from planar frames ([channels, rows]: the rows, i.e. the reduction, innermost, the
    K-major order tf32 wgmma needs): out[split, r*S + s, k, c] = sum over its frame rows j of
    G[k, j] * X[c, j + shift(r, s)].

    G comes by TMA at j (a multiple of BLOCK_K). X, x_cols columns of x_stride apart, comes by
    pointer loads: a tap's shift is any column, and TMA faults on an innermost start that is not
    16-byte aligned (one shifted copy of x per residue mod 4 cost three frame passes instead of
    one); Triton streams them into shared memory with cp.async all the same.
    SPLIT (tf32x3): G and X are tf32 high parts, g_lo_desc and X + x_plane the low parts (x - high);
    G X^T ~ G_hi X_hi^T + G_hi X_lo^T + G_lo X_hi^T in tf32 (PRECISION), small terms first."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), K, C, BLOCK_M, BLOCK_N, GROUP_M)
    tap = tl.program_id(1)
    r = tap // S
    split = tl.program_id(2)
    k0 = pid_m * BLOCK_M
    c0 = pid_n * BLOCK_N
    offs_c = c0 + tl.arange(0, BLOCK_N)
    x_rows = x_ptr + offs_c[:, None].to(tl.int64) * x_stride
    cols = shift0 + r * tap_dh + (tap - r * S) * tap_dw + tl.arange(0, BLOCK_K)
    first = split * SPLIT_STEPS
    last = tl.minimum(first + SPLIT_STEPS, tl.cdiv(M, BLOCK_K))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first, last):
        j = step * BLOCK_K
        g = g_desc.load([k0, j])  # [out channels, rows]; rows past M are zero-filled
        x_mask = (offs_c < C)[:, None] & (j + cols < x_cols)[None, :]
        x = tl.load(x_rows + (j + cols)[None, :], mask=x_mask, other=0.0)  # [in channels, rows]
        if SPLIT:
            g_lo = g_lo_desc.load([k0, j])
            x_lo = tl.load(x_rows + x_plane + (j + cols)[None, :], mask=x_mask, other=0.0)
            acc = tl.dot(g_lo, x.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
            acc = tl.dot(g, x_lo.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
        acc = tl.dot(g, x.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
    _store_dw_partial(out_ptr, acc, split * tl.num_programs(1) + tap, k0, c0, K, C, BLOCK_M, BLOCK_N)


def _nhwc_dw_block_shapes(nargs) -> None:
    """dW's boxes: STEP_H x STEP_W pixels of gZ's and x's channels (BLOCK_K pixels a step)."""
    bm, bn, bk, step_w = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"], nargs["STEP_W"]
    nargs["g_desc"].block_shape = [1, bk // step_w, step_w, bm]
    nargs["x_desc"].block_shape = [1, bk // step_w, step_w, bn]


NHWC_DW_CONFIGS = [tile_config(bm, bn, 64, warps, stages, pre_hook=_nhwc_dw_block_shapes)
                   for bm, bn, warps, stages in _TILES]
NHWC_DW_INTERPRETER_CONFIG = tile_config(32, 32, 16, 4, 1, pre_hook=_nhwc_dw_block_shapes)


@runtime.autotune(NHWC_DW_CONFIGS, key=["Nb", "P", "Q", "K", "C", "S", "SPLIT_STEPS", "STEP_W"],
                  default=NHWC_DW_INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["Nb", "P", "Q", "pad_h", "pad_w", "SPLIT_STEPS"])
def conv2d_nhwc_dw_kernel(
    g_desc, x_desc, Nb, P, Q, K, C, pad_h, pad_w, dil_h, dil_w, S, SPLIT_STEPS, out_ptr,
    UPCAST: tl.constexpr, STEP_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Split program_id(2)'s partial of dW's tap program_id(1) = (r, s), tile program_id(0) of [K, C]
    (16-bit operands, channels-last gZ and x read in place):
    out[split, r*S + s, k, c] = sum over its pixels (n, p, q) of gZ[n, p, q, k] * x[n, p + r*dil_h - pad_h,
    q + s*dil_w - pad_w, c], a step being a [BLOCK_K // STEP_W, STEP_W] box of pixels. Pixels past
    P, Q (gZ) or outside the image (x) are zero-filled: they add nothing."""
    STEP_H: tl.constexpr = BLOCK_K // STEP_W
    pid_m, pid_n = _tile_coords(tl.program_id(0), K, C, BLOCK_M, BLOCK_N, GROUP_M)
    tap = tl.program_id(1)
    r = tap // S
    s = tap - r * S
    split = tl.program_id(2)
    k0 = pid_m * BLOCK_M
    c0 = pid_n * BLOCK_N
    tiles_q = tl.cdiv(Q, STEP_W)
    tiles_p = tl.cdiv(P, STEP_H)
    first = split * SPLIT_STEPS
    last = tl.minimum(first + SPLIT_STEPS, Nb * tiles_p * tiles_q)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first, last):
        tq = step % tiles_q
        rest = step // tiles_q
        tp = rest % tiles_p
        n = rest // tiles_p
        p0 = tp * STEP_H
        q0 = tq * STEP_W
        g = g_desc.load([n, p0, q0, k0]).reshape(BLOCK_K, BLOCK_M)
        x = x_desc.load([n, p0 + r * dil_h - pad_h, q0 + s * dil_w - pad_w, c0]).reshape(BLOCK_K, BLOCK_N)
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            g = g.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(g.T, x, acc, out_dtype=tl.float32)
    _store_dw_partial(out_ptr, acc, split * tl.num_programs(1) + tap, k0, c0, K, C, BLOCK_M, BLOCK_N)


@triton.jit
def conv2d_framed_dw_sum_kernel(partial_ptr, dw_ptr, SPLITS, KC, TAPS: tl.constexpr, BLOCK_S: tl.constexpr,
                                BLOCK_T: tl.constexpr, BLOCK_KC: tl.constexpr):
    """dw[kc, tap] ([K, C, R, S] contiguous) = sum over s of partial[s, tap, kc], s in order: the
    splits' sum and the (tap, k, c) -> (k, c, tap) transpose in one pass. BLOCK_S splits per load
    (one split per step made a 30-split sum a chain of 30 memory latencies)."""
    kc = tl.program_id(0) * BLOCK_KC + tl.arange(0, BLOCK_KC)
    tap = tl.arange(0, BLOCK_T)
    offs = (tap[:, None].to(tl.int64) * KC + kc[None, :])[None, :, :]
    mask = ((tap[:, None] < TAPS) & (kc[None, :] < KC))[None, :, :]
    acc = tl.zeros((BLOCK_T, BLOCK_KC), dtype=tl.float32)
    for s0 in range(0, SPLITS, BLOCK_S):
        split = s0 + tl.arange(0, BLOCK_S)[:, None, None]
        part = tl.load(partial_ptr + split.to(tl.int64) * TAPS * KC + offs, mask=mask & (split < SPLITS), other=0.0)
        acc += tl.sum(part, axis=0)
    tl.store(dw_ptr + kc[None, :].to(tl.int64) * TAPS + tap[:, None], acc.to(dw_ptr.dtype.element_ty),
             mask=(tap[:, None] < TAPS) & (kc[None, :] < KC))


FRAME_TILE = 4096


@triton.jit
def conv2d_frame_kernel(src_ptr, dst_ptr, C, H, W, Hf, Wf, ssn, ssc, ssh, ssw, dst_stride, dst_plane,
                        PLANAR: tl.constexpr, SPLIT: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Frame row (n, v) = program_id(0), columns and channels by blocks: frame pixel
    j = (n*Hf + v)*Wf + u gets src[n, c, v, u] inside the image, 0 in the gaps; stored at
    dst[j, c] (row frame) or dst[c, j] (PLANAR). Loads run along whichever of (u, c) is
    contiguous in src; where the store runs along the other, the compiler transposes the tile
    through shared memory. SPLIT (fp32): the value's tf32 rounding (to nearest, ties away, as
    cvt.rna.tf32) at dst, what it leaves (exact in fp32) at dst + dst_plane."""
    row = tl.program_id(0)
    n = row // Hf
    v = row - n * Hf
    u = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    inside = (u < W) & (v < H)
    vals = tl.load(src_ptr + n.to(tl.int64) * ssn + v * ssh + (u * ssw)[:, None] + (c * ssc)[None, :],
                   mask=inside[:, None] & c_ok[None, :], other=0.0)
    j = row.to(tl.int64) * Wf + u
    if PLANAR:
        dst = dst_ptr + j[:, None] + c[None, :].to(tl.int64) * dst_stride
    else:
        dst = dst_ptr + j[:, None] * dst_stride + c[None, :]
    store_mask = (u < Wf)[:, None] & c_ok[None, :]
    if SPLIT:
        hi = ((vals.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        tl.store(dst + dst_plane, vals - hi, mask=store_mask)
        vals = hi
    tl.store(dst, vals, mask=store_mask)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def supports(x: torch.Tensor, weight: torch.Tensor, stride, groups: int) -> bool:
    """Whether a conv of x by weight [K, C, R, S] runs framed: stride 1, one group, >= 16 channels
    in and out, and TMA (a Hopper GPU, or the interpreter)."""
    if not ENABLED or tuple(stride) != (1, 1) or groups != 1:
        return False
    if min(weight.shape[0], weight.shape[1]) < MIN_CHANNELS or weight.shape[2] * weight.shape[3] == 1:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.numel() == 0:
        return False
    return runtime.is_interpreter() or (x.is_cuda and _tma_sms(x.device) > 0)


def frame_dims(H: int, W: int, P: int, Q: int, R: int, S: int, pad, dilation) -> tuple[int, int]:
    """(Hf, Wf) of the frames of a stride-1 conv's input [.., H, W] and output [.., P, Q].

    The gaps must hold the forward's padding (top ph, bottom P + dh*(R-1) - H - ph) and dX's
    (d*(R-1) minus those), and a frame must hold both images."""
    (ph, pw), (dh, dw) = pad, dilation
    eh, ew = dh * (R - 1), dw * (S - 1)
    pb, pr = P + eh - H - ph, Q + ew - W - pw
    Hf = max(H + max(ph, pb, 0), P + max(eh - ph, eh - pb, 0))
    Wf = max(W + max(pw, pr, 0), Q + max(ew - pw, ew - pr, 0))
    return Hf, Wf


def _row_stride(channels: int, dtype: torch.dtype) -> int:
    """Elements per frame row: channels rounded up to 16 bytes (TMA's row alignment)."""
    per = 16 // dtype.itemsize
    return runtime.cdiv(channels, per) * per


def frame(t: torch.Tensor, Hf: int, Wf: int, planar: bool = False, origin: int = 0,
          split: bool = False) -> torch.Tensor:
    """t [N, C, H, W] (any strides) as a frame [N*Hf*Wf, C], or planar [C, origin + N*Hf*Wf] with
    ``origin`` zero columns first; outer stride 16-byte aligned. ``split`` (planar fp32):
    [2, C, origin + N*Hf*Wf], t's tf32 high parts in [0], the low parts (t - high) in [1]."""
    Nb, C, H, W = t.shape
    rows = Nb * Hf * Wf
    if planar:
        cols = _row_stride(origin + rows, t.dtype)
        buf = torch.empty((2, C, cols) if split else (C, cols), dtype=t.dtype, device=t.device)
        if origin:
            buf[..., :origin].fill_(0)
        dst = buf[..., origin:]
    else:
        buf = dst = torch.empty((rows, _row_stride(C, t.dtype)), dtype=t.dtype, device=t.device)
    block_w = min(triton.next_power_of_2(Wf), 64)
    # ~FRAME_TILE elements a program (a 16-wide row of 14 pixels times 64 channels moved 2 KB: too little)
    block_c = 16 if runtime.is_interpreter() else min(triton.next_power_of_2(C), max(16, FRAME_TILE // block_w))
    grid = (Nb * Hf, runtime.cdiv(Wf, block_w), runtime.cdiv(C, block_c))
    conv2d_frame_kernel[grid](t, dst, C, H, W, Hf, Wf, *t.stride(), buf.stride(-2), buf.stride(0) if split else 0,
                              PLANAR=planar, SPLIT=split, BLOCK_W=block_w, BLOCK_C=block_c)
    return buf[..., :origin + rows] if planar else buf[:, :C]


def _descriptor(t: torch.Tensor, round_tf32: bool, shape: list[int] | None = None,
                strides: list[int] | None = None):
    """A TMA descriptor over t (unit innermost stride), or over ``shape``/``strides`` from t's first
    element; box shape set per config."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = shape or list(t.shape), strides or list(t.stride())
    box = [1] * (len(shape) - 2) + [16, 16]
    cls = _tma_rounding() if round_tf32 else None
    if cls is not None:
        return cls(t, shape, strides, box, round_f32_to_tf32=True)
    return TensorDescriptor(t, shape, strides, box)


def nhwc_dims(t: torch.Tensor) -> tuple[list[int], list[int]] | None:
    """(shape, strides) of t [N, C, H, W] read as [N, H, W, C] by a 4-D TMA descriptor, or None when
    TMA cannot read it so: channels innermost, base and other strides 16-byte aligned. A size-1
    dim's stride is never stepped: it gets an aligned one."""
    if not NHWC_DIRECT or t.stride(1) != 1 or t.data_ptr() % 16:
        return None
    shape = [t.shape[0], t.shape[2], t.shape[3], t.shape[1]]
    strides = tma_outer_strides(shape, [t.stride(0), t.stride(2), t.stride(3), 1], t.element_size())
    return None if strides is None else (shape, strides)


def tma_outer_strides(shape: list[int], strides: list[int], element_size: int) -> list[int] | None:
    """strides (innermost last, unit) with every outer one 16-byte aligned as a TMA descriptor needs, or
    None when one is not; a size-1 dim's stride is never stepped, so it gets an aligned one."""
    per = 16 // element_size  # elements per 16 bytes
    strides = list(strides)
    span = shape[-1]
    for d in range(len(shape) - 2, -1, -1):
        if shape[d] == 1:
            strides[d] = runtime.cdiv(span, per) * per
        if strides[d] % per or strides[d] == 0:
            return None
        span = strides[d] * shape[d]
    return strides


def _weight_rows(weight: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """W [K, C, R, S] as [K, R*S*Cs] (tap-major, channels innermost, Cs 16-byte aligned), or
    ``transposed`` as [C, R*S*Ks] (output channels innermost). A channels-last W whose rows are
    16-byte aligned is already the former: a view, no copy."""
    K, C, R, S = weight.shape
    rows, inner = (C, K) if transposed else (K, C)
    cs = _row_stride(inner, weight.dtype)
    if not transposed and cs == C and weight.permute(0, 2, 3, 1).is_contiguous() and weight.data_ptr() % 16 == 0:
        return weight.permute(0, 2, 3, 1).reshape(K, R * S * C)
    make = torch.zeros if cs != inner else torch.empty  # padding channels must be finite zeros
    buf = make((rows, R, S, cs), dtype=weight.dtype, device=weight.device)
    buf[..., :inner].copy_(weight.permute(1, 2, 3, 0) if transposed else weight.permute(0, 2, 3, 1))
    return buf.view(rows, R * S * cs)


def _gemm(framed: torch.Tensor, Hf: int, Wf: int, w_rows: torch.Tensor, R: int, S: int, out: torch.Tensor,
          z: torch.Tensor | None, bias: torch.Tensor | None, pad, dilation, flip: bool, code: int,
          act_alpha: float, w_kmajor: bool = True) -> None:
    """out [N, K, P, Q] (and z) = act(conv(framed input [rows, C], w_rows) + bias): output pixel
    (p, q) reads framed pixel (p + r*dh - pad_h, q + s*dw - pad_w) with tap (r, s); w_rows as
    ``_weight_rows`` makes it (``w_kmajor``: [out, taps*Cs]; else [in, taps*Ks], read transposed)."""
    Nb, K, P, Q = out.shape
    C = framed.shape[1]
    precision = _precision(framed.dtype)
    round_tf32 = precision == "tf32" and not runtime.is_interpreter()
    x_desc, w_desc = _descriptor(framed, round_tf32), _descriptor(w_rows, round_tf32)
    M = (Nb - 1) * Hf * Wf + (P - 1) * Wf + Q
    grid = lambda meta: (runtime.cdiv(M, meta["BLOCK_M"]) * runtime.cdiv(K, meta["BLOCK_N"]),)
    conv2d_framed_kernel[grid](
        x_desc, w_desc, bias if bias is not None else out, out, z if z is not None else out,
        M, K, C, w_rows.shape[1] // (R * S), Nb, P, Q, Wf, Hf * Wf, -pad[0] * Wf - pad[1], dilation[0] * Wf,
        dilation[1], S, R * S, *out.stride(), bias.stride(0) if bias is not None else 0, float(act_alpha),
        FLIP=flip, W_KMAJOR=w_kmajor, HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None,
        OPERAND_BYTES=framed.element_size(), PRECISION=precision,
        UPCAST=runtime.is_interpreter() and framed.element_size() == 2,
    )


def _nhwc_conv(src: torch.Tensor, dims: tuple[list[int], list[int]], w_rows: torch.Tensor, R: int, S: int,
               out: torch.Tensor, z: torch.Tensor | None, bias: torch.Tensor | None, pad, dilation, flip: bool,
               code: int, act_alpha: float, w_kmajor: bool = True) -> None:
    """out [N, K, P, Q] (and z) = act(conv(src [N, C, H, W], w_rows) + bias) as ``_gemm``, src read in
    place through ``nhwc_dims``'s 4-D descriptor (no frame); out stored by TMA where it can be."""
    Nb, K, P, Q = out.shape
    C = dims[0][3]
    precision = _precision(src.dtype)
    round_tf32 = precision == "tf32" and not runtime.is_interpreter()
    x_desc, w_desc = _descriptor(src, round_tf32, *dims), _descriptor(w_rows, round_tf32)
    y_dims = nhwc_dims(out)
    # Y by TMA needs a tile of shared memory beside the pipeline's: none for Z's (z-saving convs
    # store by pointers) nor in fp32-ieee, whose CUDA-core dot stages its operands there too (the
    # wide tiles overflowed). TMA_OUT is in the tuning key: the three kinds tune apart.
    tma_out = y_dims is not None and z is None and not (src.element_size() == 4 and precision == "ieee")
    y_desc = _descriptor(out, False, *y_dims) if tma_out else None
    grid = lambda meta: (_nhwc_programs(runtime.cdiv(Nb, meta["BI"]) * runtime.cdiv(P, meta["BH"])
                                        * runtime.cdiv(Q, meta["BW"]) * runtime.cdiv(K, meta["BLOCK_N"]),
                                        meta["PERSISTENT"], src.device),)
    conv2d_nhwc_kernel[grid](
        x_desc, w_desc, y_desc, bias if bias is not None else out, out, z if z is not None else out,
        Nb, P, Q, K, C, w_rows.shape[1] // (R * S), pad[0], pad[1], dilation[0], dilation[1], S, R * S,
        *out.stride(), bias.stride(0) if bias is not None else 0, float(act_alpha),
        FLIP=flip, W_KMAJOR=w_kmajor, HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None, TMA_OUT=tma_out,
        OPERAND_BYTES=src.element_size(), PRECISION=precision,
        UPCAST=runtime.is_interpreter() and src.element_size() == 2,
    )


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
            z: torch.Tensor | None, pad, dilation, code: int, act_alpha: float) -> None:
    """y [N, K, P, Q] (and z) = act(conv(x [N, C, H, W], weight [K, C, R, S]) + bias), stride 1."""
    H, W = x.shape[2], x.shape[3]
    R, S = weight.shape[2], weight.shape[3]
    if y.stride(1) == 1 and (dims := nhwc_dims(x)) is not None:
        _nhwc_conv(x, dims, _weight_rows(weight), R, S, y, z, bias, pad, dilation, False, code, act_alpha)
        return
    Hf, Wf = frame_dims(H, W, y.shape[2], y.shape[3], R, S, pad, dilation)
    _gemm(frame(x, Hf, Wf), Hf, Wf, _weight_rows(weight, transposed=False), R, S, y, z, bias, pad, dilation,
          False, code, act_alpha)


def backward(gz: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, pad, dilation, dx: torch.Tensor | None,
             dw: torch.Tensor | None) -> None:
    """dx [N, C, H, W] and/or dw [K, C, R, S] (each if given) of a stride-1 conv, from gZ [N, K, P, Q].

    dX is the forward on gZ with the taps reversed and padding d*(R-1) - pad; dW (16-bit operands)
    a GEMM per tap over the frames of gZ and x. Both read one frame of gZ."""
    Nb, C, H, W = x.shape
    R, S = weight.shape[2], weight.shape[3]
    Hf, Wf = frame_dims(H, W, gz.shape[2], gz.shape[3], R, S, pad, dilation)
    rows_dw = dw is not None and x.element_size() <= 2  # 16-bit dW reads the row frame of gZ too
    # Channels-last gZ and x are read in place: by dX when dX is channels-last too (an NCHW dX keeps
    # the framed kernel's epilogue), by 16-bit dW when x is.
    nhwc_dx = dx is not None and dx.stride(1) == 1
    g_dims = nhwc_dims(gz) if nhwc_dx or rows_dw else None
    in_place_dx = nhwc_dx and g_dims is not None
    dw_candidate = rows_dw and g_dims is not None and weight.shape[0] * weight.shape[1] <= NHWC_DW_MAX_KC
    x_dims = nhwc_dims(x) if dw_candidate else None
    g = frame(gz, Hf, Wf) if (dx is not None and not in_place_dx) or (rows_dw and x_dims is None) else None
    if dx is not None:
        (ph, pw), (dh, dw_) = pad, dilation
        kmajor = x.element_size() > 2  # 16-bit wgmma reads the forward's W as it is (MN-major)
        w_rows, dx_pad = _weight_rows(weight, transposed=kmajor), (dh * (R - 1) - ph, dw_ * (S - 1) - pw)
        if in_place_dx:
            _nhwc_conv(gz, g_dims, w_rows, R, S, dx, None, None, dx_pad, dilation, True, 0, 0.0, w_kmajor=kmajor)
        else:
            _gemm(g, Hf, Wf, w_rows, R, S, dx, None, None, dx_pad, dilation, True, 0, 0.0, w_kmajor=kmajor)
    if x_dims is not None:
        _dw_nhwc(gz, g_dims, x, x_dims, dw, pad, dilation)
    elif rows_dw:
        _dw_rows(g, frame(x, Hf, Wf), dw, Nb * Hf * Wf, pad, Wf, dilation)
    elif dw is not None:
        _dw_planar(gz, x, dw, Hf, Wf, pad, dilation)


# dW's frame rows are split so that the [K, C] tiles of all taps make about DW_TARGET_PROGRAMS
# programs, each at least DW_MIN_STEPS steps long; the fp32 partials ([splits, taps, K, C]) are
# added in a fixed order (deterministic, no atomics).
DW_TARGET_PROGRAMS = 1 if runtime.is_interpreter() else 264
DW_MIN_STEPS = 8
DW_SUM_SPLITS = 32  # split partials one program of the sum loads at a time


def dw_splits(steps: int, tiles: int) -> tuple[int, int]:
    """(splits, steps per split) of dW's reduction of ``steps`` steps for ``tiles`` output tiles."""
    splits = max(1, min(runtime.cdiv(DW_TARGET_PROGRAMS, tiles), steps // DW_MIN_STEPS))
    per = runtime.cdiv(steps, splits)
    return runtime.cdiv(steps, per), per


def _frame_steps(rows: int, configs: list[triton.Config]) -> int:
    """Steps of dW's reduction over ``rows`` frame rows: whole BLOCK_K rows (all GPU configs of
    one dW kernel share it)."""
    return runtime.cdiv(rows, (INTERPRETER_CONFIG if runtime.is_interpreter() else configs[0]).kwargs["BLOCK_K"])


def _dw_partials(dw: torch.Tensor, steps: int) -> tuple[torch.Tensor, int]:
    """(partials [splits, R*S*K*C] fp32, steps per split) for dW's reduction of ``steps`` steps."""
    K, C, R, S = dw.shape
    splits, per = dw_splits(steps, runtime.cdiv(K, 128) * runtime.cdiv(C, 128) * R * S)
    return torch.empty((splits, R * S * K * C), dtype=torch.float32, device=dw.device), per


def _dw_grid(dw: torch.Tensor, partials: torch.Tensor):
    """The dW kernels' grid: ([K, C] tiles, taps, splits)."""
    K, C, R, S = dw.shape
    return lambda meta: (runtime.cdiv(K, meta["BLOCK_M"]) * runtime.cdiv(C, meta["BLOCK_N"]), R * S, partials.shape[0])


def _dw_finish(partials: torch.Tensor, dw: torch.Tensor) -> None:
    """dw [K, C, R, S] = the fixed-order sum of the [splits, (r, s, k, c)] partials."""
    K, C, R, S = dw.shape
    splits = partials.shape[0]
    block_t = triton.next_power_of_2(R * S)
    # Few splits: one per load over wide tiles (measured 6.9 us at 64x256x14^2, 8 splits; 8 at a time
    # in [8, 16, 64] tiles took 24); many: several per load (30 splits at 64x64x56^2: 14.5 -> 4.1 us).
    block_s = 1 if splits <= DW_SUM_SPLITS // 4 else min(triton.next_power_of_2(splits), DW_SUM_SPLITS)
    block_kc = max(16, (4096 if block_s == 1 else 8192) // (block_s * block_t))
    conv2d_framed_dw_sum_kernel[(runtime.cdiv(K * C, block_kc),)](
        partials, dw, splits, K * C, TAPS=R * S, BLOCK_S=block_s, BLOCK_T=block_t, BLOCK_KC=block_kc,
        num_warps=4 if block_s == 1 else 8)


def _dw_rows(g: torch.Tensor, f: torch.Tensor, dw: torch.Tensor, rows: int, pad, Wf: int, dilation) -> None:
    """16-bit dw [K, C, R, S] from the row frames of gZ (g) and x (f): one launch for all taps."""
    K, C, R, S = dw.shape
    partials, per = _dw_partials(dw, _frame_steps(rows, CONFIGS_16))
    conv2d_framed_dw_kernel[_dw_grid(dw, partials)](
        _descriptor(g, False), _descriptor(f, False), rows, K, C, -pad[0] * Wf - pad[1], dilation[0] * Wf,
        dilation[1], S, per, partials, UPCAST=runtime.is_interpreter())
    _dw_finish(partials, dw)


def _dw_nhwc(gz: torch.Tensor, g_dims, x: torch.Tensor, x_dims, dw: torch.Tensor, pad, dilation) -> None:
    """16-bit dw [K, C, R, S] from channels-last gZ and x read in place (``nhwc_dims``): one launch for
    all taps, each step a box of pixels whose width wastes the least past Q (and height past P)."""
    Nb, K, P, Q = gz.shape
    C, R, S = x.shape[1], dw.shape[2], dw.shape[3]
    pixels = (NHWC_DW_INTERPRETER_CONFIG if runtime.is_interpreter() else NHWC_DW_CONFIGS[0]).kwargs["BLOCK_K"]
    widths = [w for w in (64, 32, 16, 8, 4, 2, 1) if w <= pixels]
    step_w = min(widths, key=lambda w: runtime.cdiv(Q, w) * w * runtime.cdiv(P, pixels // w) * (pixels // w))
    partials, per = _dw_partials(dw, Nb * runtime.cdiv(P, pixels // step_w) * runtime.cdiv(Q, step_w))
    conv2d_nhwc_dw_kernel[_dw_grid(dw, partials)](
        _descriptor(gz, False, *g_dims), _descriptor(x, False, *x_dims), Nb, P, Q, K, C, pad[0], pad[1],
        dilation[0], dilation[1], S, per, partials,
        UPCAST=runtime.is_interpreter(), STEP_W=step_w)
    _dw_finish(partials, dw)


def _dw_planar(gz: torch.Tensor, x: torch.Tensor, dw: torch.Tensor, Hf: int, Wf: int, pad, dilation) -> None:
    """fp32 dw [K, C, R, S] from planar frames ([channels, rows]) of gZ and x: one launch for all
    taps. Tap (r, s) reads x's frame at row j + (r*dh - ph)*Wf + s*dw - pw; x's frame starts with
    enough zero columns that this is >= 0."""
    Nb = x.shape[0]
    K, C, R, S = dw.shape
    rows = Nb * Hf * Wf
    precision = _precision(x.dtype)
    split = PLANAR_SPLIT and precision == "tf32x3"
    round_tf32 = precision == "tf32" and not runtime.is_interpreter()
    g = frame(gz, Hf, Wf, planar=True, split=split)
    g_desc = _descriptor(g[0] if split else g, round_tf32)
    (ph, pw), (dh, dw_) = pad, dilation
    origin = max(ph * Wf + pw, 0)
    f = frame(x, Hf, Wf, planar=True, origin=origin, split=split)
    partials, per = _dw_partials(dw, _frame_steps(rows, PLANAR_DW_CONFIGS))
    conv2d_planar_dw_kernel[_dw_grid(dw, partials)](
        g_desc, _descriptor(g[1], False) if split else g_desc, f, rows, K, C, f.shape[-1], f.stride(-2),
        f.stride(0) if split else 0, origin - ph * Wf - pw, dh * Wf, dw_, S, per, partials,
        PRECISION="tf32" if split else precision, SPLIT=split)
    _dw_finish(partials, dw)
