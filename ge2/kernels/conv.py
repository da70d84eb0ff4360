"""2-D convolution as an implicit GEMM, with a fused bias + activation epilogue, and its backward.

Forward (``conv2d``)::

    Z[n, k, p, q] = sum_{c, r, s} X[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw] * W[k, c, r, s] + b[k]
    Y = act(Z)                                   (g = k // Kg: the group of output channel k)

is a GEMM per group with M = N*P*Q rows (output pixels), N = Kg columns (the group's output
channels) and a reduction over Cg*R*S. No im2col buffer exists: ``conv2d_fwd_kernel`` computes
each A tile's input addresses from the output pixel and the (r, s, c-block) step, and masks the
taps that fall in the padding. Every tensor is read and written through its strides, so NCHW
(torch's default) and NHWC (channels-last) inputs take the same kernel; the caller allocates the
output in the input's layout. The reduction walks (r, s) outermost and channels innermost, so
each A tile is a [pixels, channels] slab: contiguous along channels in NHWC.

Backward (``conv2d_backward``):

1. gZ = gY * act'(Z or Y) and db = column sums of gZ: the GEMM module's ``bias_act_backward``
   on gY viewed as [N, P*Q, K] (per-tile partials then ``sum_partials_kernel``: no atomics).
2. dX: an implicit GEMM over the transposed problem (``conv2d_dx_kernel``): M = N*H*W input
   pixels, N = Cg, reduction over Kg*R*S. Input pixel h gets tap r from output row
   p = (h + ph - r*dh) / sh when that division is exact and 0 <= p < P; other taps are masked.
3. dW: a GEMM with M = Kg, N = Cg*R*S and the long reduction over N*P*Q (``conv2d_dw_kernel``),
   split across programs when the tile grid alone would not fill the GPU; the fp32 split partials
   are added in a fixed order by ``sum_partials_kernel`` (deterministic).

Numerics as in ``ge2.kernels.gemm``: bf16/fp16 operands with fp32 accumulation, fp32 operands
with ``ge2.runtime.get_matmul_precision()`` ("ieee", "tf32", "tf32x3").
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels import activations
from ge2.kernels.activations import act_fwd
from ge2.kernels.gemm import (ROUND_TF32, _precision, _round_to_tf32, _tile_coords, bias_act_backward,
                              sum_partials_kernel, tile_config)


class ConvGeometry(NamedTuple):
    """Everything a conv kernel needs besides the tensors (padding is top/left; P, Q absorb bottom/right)."""

    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    out_hw: tuple[int, int]


# ---------------------------------------------------------------------------------------------
# Config space (Hopper): the GEMM's tiles. 16-bit operands take 64-deep K steps, fp32 32-deep
# ones (same bytes per smem stage). Narrow-N tiles for the common K = 64 layers and for
# depthwise/grouped convs whose per-group N is small.
# ---------------------------------------------------------------------------------------------


CONFIGS_16BIT = [
    tile_config(128, 128, 64, 8, 3),
    tile_config(128, 64, 64, 4, 4),
    tile_config(256, 64, 64, 8, 3),
    tile_config(64, 128, 64, 4, 4),
    tile_config(64, 64, 64, 4, 4),
    tile_config(128, 32, 32, 4, 4),
]
CONFIGS_FP32 = [
    tile_config(128, 128, 32, 8, 3),
    tile_config(128, 64, 32, 4, 4),
    tile_config(64, 128, 32, 4, 4),
    tile_config(64, 64, 32, 4, 4),
    tile_config(128, 32, 16, 4, 4),
]
# The interpreter runs one pinned config. Its cost is per program and per step, nearly independent
# of tile size, so M is 64 wide (an 8x8 MNIST-like batch of 64 takes 64 programs, not 128); K stays
# 16 deep so that the tests' 20-channel case still walks two channel blocks.
INTERPRETER_CONFIG = tile_config(64, 32, 16, 4, 1, group_m=4)


def _prune(configs, named_args, **_kwargs):
    """Keep the configs that suit the operand width."""
    operand = named_args["x_ptr"] if "x_ptr" in named_args else named_args["gz_ptr"]
    wide = operand.element_size() <= 2
    return [c for c in configs if (c in CONFIGS_16BIT) == wide] or configs[:1]


_CONV_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "Cg", "sxc", "PRECISION"]


@runtime.autotune(CONFIGS_16BIT + CONFIGS_FP32, key=_CONV_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune})
@triton.jit
def conv2d_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, z_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg,
    sxn, sxc, sxh, sxw, swk, swc, swr, sws, syn, syk, syp, syq, sbias,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, act_alpha,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M pixels, BLOCK_N channels] tile of Y for group program_id(1)."""
    g = tl.program_id(1)
    M = N * P * Q
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, Kg, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K)
    q = offs_m % Q
    p = (offs_m // Q) % P
    n = offs_m // (P * Q)
    mask_m = offs_m < M
    mask_n = offs_n < Kg
    k_abs = g * Kg + offs_n
    x_rows = x_ptr + n.to(tl.int64) * sxn + (g * Cg).to(tl.int64) * sxc  # [BLOCK_M]
    w_cols = w_ptr + k_abs.to(tl.int64) * swk  # [BLOCK_N]
    h0 = p * stride_h - pad_h
    w0 = q * stride_w - pad_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_blocks = tl.cdiv(Cg, BLOCK_K)
    for step in range(0, R * S * c_blocks):
        rs = step // c_blocks
        c = (step % c_blocks) * BLOCK_K + offs_c
        r = rs // S
        s = rs % S
        hi = h0 + r * dil_h
        wi = w0 + s * dil_w
        row_ok = mask_m & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        c_ok = c < Cg
        a = tl.load(x_rows[:, None] + (hi * sxh + wi * sxw)[:, None] + c[None, :].to(tl.int64) * sxc,
                    mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        b = tl.load(w_cols[None, :] + (c * swc)[:, None] + (r * swr + s * sws),
                    mask=c_ok[:, None] & mask_n[None, :], other=0.0)
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if ROUND_TF32:
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    z = acc
    if HAS_BIAS:
        z += tl.load(bias_ptr + k_abs * sbias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_offs = (n.to(tl.int64) * syn + p * syp + q * syq)[:, None] + k_abs[None, :].to(tl.int64) * syk
    mask = mask_m[:, None] & mask_n[None, :]
    if SAVE_Z:
        tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    y = act_fwd(z, ACT, act_alpha)
    tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(CONFIGS_16BIT + CONFIGS_FP32, key=_CONV_KEY, default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune})
@triton.jit
def conv2d_dx_kernel(
    gz_ptr, w_ptr, dx_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg,
    sgn, sgk, sgp, sgq, swk, swc, swr, sws, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M input pixels, BLOCK_N input channels] tile of dX = gZ (*)^T W, group program_id(1).

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
        if ROUND_TF32:
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    dx_offs = (n.to(tl.int64) * sxn + hi * sxh + wi * sxw)[:, None] + c_abs[None, :].to(tl.int64) * sxc
    tl.store(dx_ptr + dx_offs, acc.to(dx_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@runtime.autotune(CONFIGS_16BIT + CONFIGS_FP32, key=_CONV_KEY + ["SPLIT_LEN"], default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune})
@triton.jit
def conv2d_dw_kernel(
    gz_ptr, x_ptr, out_ptr,
    N, C, H, W, K, P, Q, R, S, Cg, Kg, SPLIT_LEN,
    sgn, sgk, sgp, sgq, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One [BLOCK_M out channels, BLOCK_N (c, r, s)] tile of dW over pixels
    [split*SPLIT_LEN, (split+1)*SPLIT_LEN) of N*P*Q, split = program_id(2), group program_id(1).

    Writes out[split, k, c, r, s] (contiguous): dW itself when there is one split, else fp32 partials.
    """
    g = tl.program_id(1)
    split = tl.program_id(2)
    CRS = Cg * R * S
    L = N * P * Q
    pid_m, pid_n = _tile_coords(tl.program_id(0), Kg, CRS, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, BLOCK_K)
    mask_m = offs_m < Kg
    mask_n = offs_n < CRS
    c = offs_n // (R * S)
    r = (offs_n // S) % R
    s = offs_n % S
    g_rows = gz_ptr + (g * Kg + offs_m).to(tl.int64) * sgk  # [BLOCK_M]
    x_cols = x_ptr + (g * Cg + c).to(tl.int64) * sxc  # [BLOCK_N]
    lo = split * SPLIT_LEN
    hi_j = tl.minimum(lo + SPLIT_LEN, L)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(lo, hi_j, BLOCK_K):
        j = j0 + offs_j
        j_ok = j < hi_j
        q = j % Q
        p = (j // Q) % P
        n = (j // (P * Q)).to(tl.int64)
        a = tl.load(g_rows[:, None] + (n * sgn + p * sgp + q * sgq)[None, :],
                    mask=mask_m[:, None] & j_ok[None, :], other=0.0)
        hx = (p * stride_h - pad_h)[:, None] + (r * dil_h)[None, :]
        wx = (q * stride_w - pad_w)[:, None] + (s * dil_w)[None, :]
        x_ok = j_ok[:, None] & mask_n[None, :] & (hx >= 0) & (hx < H) & (wx >= 0) & (wx < W)
        b = tl.load(x_cols[None, :] + (n * sxn)[:, None] + hx * sxh + wx * sxw, mask=x_ok, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if ROUND_TF32:
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)
    out_offs = (split.to(tl.int64) * K * CRS + ((g * Kg + offs_m) * CRS)[:, None].to(tl.int64)
                + offs_n[None, :])
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


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


def _numerics(dtype: torch.dtype) -> dict:
    precision = _precision(dtype)
    return dict(PRECISION=precision, UPCAST=runtime.is_interpreter() and dtype in (torch.float16, torch.bfloat16),
                ROUND_TF32=ROUND_TF32 and precision == "tf32" and not runtime.is_interpreter())


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
    Kg = K // geo.groups
    grid = lambda meta: (triton.cdiv(Nb * P * Q, meta["BLOCK_M"]) * triton.cdiv(Kg, meta["BLOCK_N"]), geo.groups)
    conv2d_fwd_kernel[grid](
        x, weight, bias if bias is not None else y, y, z if z is not None else y,
        Nb, C, H, W, K, P, Q, R, S, Cg, Kg,
        *x.stride(), *weight.stride(), *y.stride(), bias.stride(0) if bias is not None else 0,
        *geo.stride, *geo.pad, *geo.dilation, float(act_alpha),
        HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None, **_numerics(x.dtype),
    )
    return y, z


# Each dW split gets at least this many reduction elements (a multiple of every BLOCK_K).
DW_MIN_SPLIT = 1024
# Aim for this many dW programs: ~2 waves of an H100's 132 SMs.
DW_TARGET_PROGRAMS = 264


def _dw_splits(L: int, tiles: int) -> tuple[int, int]:
    """(number of splits, elements per split) of dW's N*P*Q reduction."""
    splits = max(1, min(triton.cdiv(DW_TARGET_PROGRAMS, tiles), L // DW_MIN_SPLIT))
    split_len = triton.cdiv(triton.cdiv(L, splits), 128) * 128
    return triton.cdiv(L, split_len), split_len


def _pixels_by_channels(gy: torch.Tensor) -> torch.Tensor:
    """gy [N, K, P, Q] as an [N, P*Q, K] view (copied to NHWC only if P, Q cannot merge)."""
    Nb, K, P, Q = gy.shape
    if P > 1 and Q > 1 and gy.stride(2) != Q * gy.stride(3):
        gy = gy.contiguous(memory_format=torch.channels_last)
    return gy.as_strided((Nb, P * Q, K), (gy.stride(0), gy.stride(3) if Q > 1 else gy.stride(2), gy.stride(1)))


def conv2d_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, saved: torch.Tensor | None,
                    geo: ConvGeometry, *, has_bias: bool, act: str = "none", act_alpha: float = 0.01,
                    from_z: bool = False, need_x: bool = True, need_w: bool = True):
    """(dx | None, dw | None, dbias | None) of Y = act(conv(x, weight) + bias), given gY = dL/dY.

    ``saved`` is Z (``from_z``) or Y, for act'; unused when act is "none". dx in x's layout,
    dw contiguous [K, C/groups, R, S], dbias [K] in gy's dtype.
    """
    code = activations.act_code("conv2d_backward", act, act_alpha)
    Nb, C, H, W = x.shape
    K, Cg, R, S = weight.shape
    P, Q = geo.out_hw
    Kg = K // geo.groups
    need_gz = need_x or need_w
    copy_gz = need_gz and (code != activations.NONE or gy.dtype != x.dtype)
    dbias = None
    gz = gy
    if copy_gz or has_bias:
        saved3 = _pixels_by_channels(saved) if saved is not None and code != activations.NONE else None
        gz3, dbias, _ = bias_act_backward(
            _pixels_by_channels(gy), saved3, act=code, from_z=from_z, act_alpha=act_alpha,
            bias_kind="per_n" if has_bias else "none", gz_dtype=x.dtype if copy_gz else None, beta=None)
        if copy_gz:  # [N, P*Q, K] contiguous: gZ in NHWC
            gz = gz3.as_strided((Nb, K, P, Q), (P * Q * K, 1, Q * K, K))
    numerics = _numerics(x.dtype)
    dx = dw = None
    if need_x:
        dx = empty_like_layout(tuple(x.shape), x)
        if dx.numel():
            if gy.numel() == 0:
                dx.fill_(0)
            else:
                grid = lambda meta: (triton.cdiv(Nb * H * W, meta["BLOCK_M"]) * triton.cdiv(Cg, meta["BLOCK_N"]),
                                     geo.groups)
                conv2d_dx_kernel[grid](
                    gz, weight, dx, Nb, C, H, W, K, P, Q, R, S, Cg, Kg,
                    *gz.stride(), *weight.stride(), *dx.stride(), *geo.stride, *geo.pad, *geo.dilation, **numerics)
    if need_w:
        dw = torch.empty(tuple(weight.shape), dtype=weight.dtype, device=weight.device)
        L = Nb * P * Q
        if dw.numel():
            if L == 0:
                dw.fill_(0)
            else:
                tiles = triton.cdiv(Kg, 64) * triton.cdiv(Cg * R * S, 64) * geo.groups
                splits, split_len = _dw_splits(L, tiles)
                out = dw if splits == 1 else torch.empty((splits, dw.numel()), dtype=torch.float32, device=dw.device)
                grid = lambda meta: (triton.cdiv(Kg, meta["BLOCK_M"]) * triton.cdiv(Cg * R * S, meta["BLOCK_N"]),
                                     geo.groups, splits)
                conv2d_dw_kernel[grid](
                    gz, x, out, Nb, C, H, W, K, P, Q, R, S, Cg, Kg, split_len,
                    *gz.stride(), *x.stride(), *geo.stride, *geo.pad, *geo.dilation, **numerics)
                if splits > 1:
                    sum_partials_kernel[(triton.cdiv(dw.numel(), 128),)](out, dw, splits, dw.numel(),
                                                                        BLOCK_P=32, BLOCK_L=128)
    return dx, dw, dbias
