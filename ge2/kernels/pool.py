"""2-D pooling: max (with int64 argmax indices), average and adaptive average; forward and backward.

Every kernel gives one output element per lane: a program takes a [rows, BLOCK_I] tile of the
tensor it writes, columns along its innermost dim (c for NHWC, w for NCHW; whole h x w planes
for NCHW rows narrower than 32) so that neighbouring lanes touch neighbouring addresses, rows over
the other dims (decoded once per row), and loops over the window. Tensors are read and written
through their strides.

Backward is a gather over the input, not a scatter of the output gradient: input pixel h is in
window p through tap r exactly when p*stride = h + pad - r*dilation, so each input lane visits
its candidate windows (ceil(((R-1)*dilation + 1) / stride) per dim: one when the windows tile the
input, two for 3x3/2) in a fixed order and sums their gradients. Overlapping windows are
therefore correct and deterministic without atomics. max_pool2d's backward adds gY[p, q] where
the saved argmax of window (p, q) equals the lane's own flat index h*W + w (torch's convention).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels.conv import empty_like_layout, is_channels_last

# Memory-bound: 256-2048 lanes per program, 4-8 warps (Hopper). The interpreter's cost is per
# program, so it takes 1024 lanes.
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 8))]
INTERPRETER_CONFIG = triton.Config({"BLOCK": 1024}, num_warps=4)
_KEY = ["total", "R", "S", "CHANNELS_LAST", "FLAT", "BLOCK_I"]


@triton.jit
def _tile(total, C, P, Q, CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr, WIDE: tl.constexpr,
          BLOCK: tl.constexpr, BLOCK_I: tl.constexpr):
    """(n, c, p, q, mask) of this program's [BLOCK // BLOCK_I, BLOCK_I] tile of an [N, C, P, Q]
    tensor (``total`` elements) stored NHWC or NCHW.

    Columns run over the innermost dim (c for NHWC, q for NCHW), rows over the other three, and
    the coordinates come back as [rows, 1] / [1, cols] tensors that broadcast: the integer
    divisions that decode a row run once per row, not once per element (per element, the
    decode and the window arithmetic made the pooling backward compute-bound). Offsets are int32
    unless WIDE (64-bit division is emulated). FLAT (NCHW with narrow rows, e.g. 7x7 planes):
    columns run over whole (p, q) planes instead, rows over (n, c), so that a tile is not mostly
    masked lanes and each row of lanes writes one contiguous run.
    """
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_I
    pid_r = tl.program_id(0)
    if WIDE:
        pid_r = pid_r.to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)[None, :]
    if CHANNELS_LAST:
        inner = C
        c = cols
        q = rows % Q
        p = (rows // Q) % P
        n = rows // (Q * P)
    elif FLAT:
        inner = P * Q
        q = cols % Q
        p = cols // Q
        c = rows % C
        n = rows // C
    else:
        inner = Q
        q = cols
        p = rows % P
        c = (rows // P) % C
        n = rows // (P * C)
    mask = (rows < total // inner) & (cols < inner)
    return n, c, p, q, mask


@triton.jit
def _first_window(h, pad, R, dil, stride):
    """The first window p whose taps can reach row h: ceil((h + pad - (R-1)*dil) / stride), at least 0.
    Windows p0 .. p0 + ceil(((R-1)*dil + 1) / stride) - 1 are the only candidates."""
    num = tl.maximum(h + pad - (R - 1) * dil, 0)
    return (num + stride - 1) // stride


@triton.jit
def _window_hits(h, p, pad, dil, stride, P):
    """Whether window p reads row h through one of its taps: 0 <= p < P and h + pad - p*stride = r*dil."""
    off = h + pad - p * stride
    return (p < P) & (off >= 0) & (off % dil == 0)


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def max_pool2d_fwd_kernel(
    x_ptr, y_ptr, idx_ptr, total, C, H, W, P, Q, R, S,
    sxn, sxc, sxh, sxw, syn, syc, syp, syq,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    """Y[n, c, p, q] = max over the window, and its flat index h*W + w (int64)."""
    n, c, p, q, mask = _tile(total, C, P, Q, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    base = x_ptr + n * sxn + c * sxc
    best = tl.full(mask.shape, float("-inf"), tl.float32)
    best_idx = tl.full(mask.shape, -1, tl.int64)
    for r in range(0, R):
        h = p * stride_h - pad_h + r * dil_h
        h_ok = mask & (h >= 0) & (h < H)
        for s in range(0, S):
            w = q * stride_w - pad_w + s * dil_w
            ok = h_ok & (w >= 0) & (w < W)
            v = tl.load(base + h * sxh + w * sxw, mask=ok, other=float("-inf")).to(tl.float32)
            # torch's rule: a larger value or a NaN takes over; the first in-bounds tap starts it.
            take = ok & ((v > best) | (v != v) | (best_idx < 0))
            best = tl.where(take, v, best)
            best_idx = tl.where(take, h * W + w, best_idx)
    out = n * syn + c * syc + p * syp + q * syq
    tl.store(y_ptr + out, best.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(idx_ptr + out, best_idx, mask=mask)


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def max_pool2d_bwd_kernel(
    gy_ptr, idx_ptr, dx_ptr, total, C, H, W, P, Q, R, S,
    sgn, sgc, sgp, sgq, sin, sic, sip, siq, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    WR: tl.constexpr, WS: tl.constexpr, CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr, WIDE: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_I: tl.constexpr,
):
    """dX[n, c, h, w] = sum of gY over the windows whose argmax is (h, w), gathered in tap order."""
    n, c, h, w, mask = _tile(total, C, H, W, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    me = h * W + w
    gy_base = gy_ptr + n * sgn + c * sgc
    idx_base = idx_ptr + n * sin + c * sic
    # Only the windows that can hold (h, w) are visited: ceil(((R-1)*dil + 1) / stride) per dim
    # (WR x WS: 1 x 1 when the windows tile the input, 2 x 2 for 3x3/2), not all R x S taps.
    p0 = _first_window(h, pad_h, R, dil_h, stride_h)
    q0 = _first_window(w, pad_w, S, dil_w, stride_w)
    acc = tl.zeros(mask.shape, tl.float32)
    for i in tl.static_range(WR):
        p = p0 + i
        p_ok = mask & _window_hits(h, p, pad_h, dil_h, stride_h, P)
        for j in tl.static_range(WS):
            q = q0 + j
            ok = p_ok & _window_hits(w, q, pad_w, dil_w, stride_w, Q)
            idx = tl.load(idx_base + p * sip + q * siq, mask=ok, other=-1)
            g = tl.load(gy_base + p * sgp + q * sgq, mask=ok & (idx == me), other=0.0)
            acc += g.to(tl.float32)
    tl.store(dx_ptr + n * sxn + c * sxc + h * sxh + w * sxw, acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _avg_window(p, stride, pad, R, H):
    """(first row, end row, padded size) of avg-pool window p, as torch computes them."""
    start = p * stride - pad
    end = tl.minimum(start + R, H + pad)
    size = end - start
    return tl.maximum(start, 0), tl.minimum(end, H), size


@triton.jit
def _avg_divisor(p, q, stride_h, stride_w, pad_h, pad_w, R, S, H, W,
                 DIVISOR: tl.constexpr, COUNT_INCLUDE_PAD: tl.constexpr):
    """The divisor of avg-pool window (p, q): divisor_override, the padded size, or the in-bounds count."""
    hs, he, size_h = _avg_window(p, stride_h, pad_h, R, H)
    ws, we, size_w = _avg_window(q, stride_w, pad_w, S, W)
    if COUNT_INCLUDE_PAD:
        count = size_h * size_w
    else:
        count = (he - hs) * (we - ws)
    if DIVISOR > 0:  # divisor_override (a constexpr: it is rare and one value per model)
        count = tl.full(count.shape, DIVISOR, count.dtype)
    return tl.maximum(count, 1).to(tl.float32), hs, he, ws, we


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def avg_pool2d_fwd_kernel(
    x_ptr, y_ptr, total, C, H, W, P, Q, R, S,
    sxn, sxc, sxh, sxw, syn, syc, syp, syq,
    stride_h, stride_w, pad_h, pad_w,
    DIVISOR: tl.constexpr, COUNT_INCLUDE_PAD: tl.constexpr, CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_I: tl.constexpr,
):
    """Y[n, c, p, q] = sum over the in-bounds window / divisor (0 for a window wholly in the padding)."""
    n, c, p, q, mask = _tile(total, C, P, Q, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    divisor, hs, he, ws, we = _avg_divisor(p, q, stride_h, stride_w, pad_h, pad_w, R, S, H, W,
                                           DIVISOR, COUNT_INCLUDE_PAD)
    base = x_ptr + n * sxn + c * sxc
    acc = tl.zeros(mask.shape, tl.float32)
    for r in range(0, R):
        h = p * stride_h - pad_h + r
        h_ok = mask & (h >= hs) & (h < he)
        for s in range(0, S):
            w = q * stride_w - pad_w + s
            ok = h_ok & (w >= ws) & (w < we)
            acc += tl.load(base + h * sxh + w * sxw, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + n * syn + c * syc + p * syp + q * syq, (acc / divisor).to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def avg_pool2d_bwd_kernel(
    gy_ptr, dx_ptr, total, C, H, W, P, Q, R, S,
    sgn, sgc, sgp, sgq, sxn, sxc, sxh, sxw,
    stride_h, stride_w, pad_h, pad_w,
    DIVISOR: tl.constexpr, COUNT_INCLUDE_PAD: tl.constexpr, WR: tl.constexpr, WS: tl.constexpr,
    CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_I: tl.constexpr,
):
    """dX[n, c, h, w] = sum over the windows holding (h, w) of gY / divisor, gathered in tap order."""
    n, c, h, w, mask = _tile(total, C, H, W, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    gy_base = gy_ptr + n * sgn + c * sgc
    p0 = _first_window(h, pad_h, R, 1, stride_h)  # candidate windows only, as in max_pool2d_bwd_kernel
    q0 = _first_window(w, pad_w, S, 1, stride_w)
    acc = tl.zeros(mask.shape, tl.float32)
    for i in tl.static_range(WR):
        p = p0 + i
        p_ok = mask & _window_hits(h, p, pad_h, 1, stride_h, P)
        for j in tl.static_range(WS):
            q = q0 + j
            ok = p_ok & _window_hits(w, q, pad_w, 1, stride_w, Q)
            divisor, _hs, _he, _ws, _we = _avg_divisor(p, q, stride_h, stride_w, pad_h, pad_w, R, S, H, W,
                                                       DIVISOR, COUNT_INCLUDE_PAD)
            g = tl.load(gy_base + p * sgp + q * sgq, mask=ok, other=0.0).to(tl.float32)
            acc += g / divisor
    tl.store(dx_ptr + n * sxn + c * sxc + h * sxh + w * sxw, acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adaptive_window(p, P, H):
    """[start, end) of adaptive window p of P over H rows: floor(p*H/P) .. ceil((p+1)*H/P)."""
    return (p * H) // P, ((p + 1) * H + P - 1) // P


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def adaptive_avg_pool2d_fwd_kernel(
    x_ptr, y_ptr, total, C, H, W, P, Q, R, S,
    sxn, sxc, sxh, sxw, syn, syc, syp, syq,
    CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    """Y[n, c, p, q] = mean of X over adaptive window (p, q); R x S is the largest window."""
    n, c, p, q, mask = _tile(total, C, P, Q, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    hs, he = _adaptive_window(p, P, H)
    ws, we = _adaptive_window(q, Q, W)
    base = x_ptr + n * sxn + c * sxc
    acc = tl.zeros(mask.shape, tl.float32)
    for r in range(0, R):
        h = hs + r
        h_ok = mask & (h < he)
        for s in range(0, S):
            w = ws + s
            acc += tl.load(base + h * sxh + w * sxw, mask=h_ok & (w < we), other=0.0).to(tl.float32)
    count = ((he - hs) * (we - ws)).to(tl.float32)
    tl.store(y_ptr + n * syn + c * syc + p * syp + q * syq, (acc / count).to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(CONFIGS, key=_KEY, default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def adaptive_avg_pool2d_bwd_kernel(
    gy_ptr, dx_ptr, total, C, H, W, P, Q, R, S,
    sgn, sgc, sgp, sgq, sxn, sxc, sxh, sxw,
    CHANNELS_LAST: tl.constexpr, FLAT: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_I: tl.constexpr, GLOBAL: tl.constexpr,
):
    """dX[n, c, h, w] = sum over the adaptive windows holding (h, w) of gY / window size.

    Row h lies in windows floor(h*P/H) .. floor(h*P/H) + R - 1 at most (R: the most windows on one row).
    GLOBAL (P = Q = 1): one window, the whole plane; gY is read once per (n, c), not once per pixel.
    """
    n, c, h, w, mask = _tile(total, C, H, W, CHANNELS_LAST, FLAT, WIDE, BLOCK, BLOCK_I)
    if GLOBAL:
        nc_ok = n * C + c < total // (H * W)  # [rows, 1] unless NHWC: a load per (n, c), not per pixel
        g = tl.load(gy_ptr + n * sgn + c * sgc, mask=nc_ok, other=0.0).to(tl.float32)
        acc = tl.zeros(mask.shape, tl.float32) + g / (H * W * 1.0)  # * 1.0, not .to(): H = W = 1 arrive as ints
    else:
        p0 = (h * P) // H
        q0 = (w * Q) // W
        acc = tl.zeros(mask.shape, tl.float32)
        for i in range(0, R):
            p = p0 + i
            hs, he = _adaptive_window(p, P, H)
            p_ok = mask & (p < P) & (hs <= h) & (h < he)
            for j in range(0, S):
                q = q0 + j
                ws, we = _adaptive_window(q, Q, W)
                ok = p_ok & (q < Q) & (ws <= w) & (w < we)
                g = tl.load(gy_ptr + n * sgn + c * sgc + p * sgp + q * sgq, mask=ok, other=0.0).to(tl.float32)
                acc += g / ((he - hs) * (we - ws)).to(tl.float32)
    tl.store(dx_ptr + n * sxn + c * sxc + h * sxh + w * sxw, acc.to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launchers. Geometry (kernel, stride, padding, dilation as (h, w) pairs, output size) comes
# normalised and checked from ``ge2.backend.pool``.
# ---------------------------------------------------------------------------------------------


def _empty(shape, channels_last: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=dtype, device=device, memory_format=fmt)


def _adaptive_bounds(size: int, out: int) -> tuple[int, int]:
    """(largest adaptive window, most windows holding one row) for ``out`` windows over ``size`` rows."""
    starts = [(p * size) // out for p in range(out)]
    ends = [-(-(p + 1) * size // out) for p in range(out)]
    cover = [0] * size
    for a, b in zip(starts, ends):
        for h in range(a, b):
            cover[h] += 1
    return max(b - a for a, b in zip(starts, ends)), max(cover)


def _wide(*tensors: torch.Tensor) -> bool:
    """Whether an element offset of any of the tensors (or the lane count) may pass int32."""
    return any(t.numel() >= 2**31 or sum((d - 1) * abs(st) for d, st in zip(t.shape, t.stride())) >= 2**31 - 1
               for t in tensors)


def _windows(kernel, stride, dilation) -> dict:
    """WR, WS: the most windows that hold one input row / column, ceil(((k-1)*dil + 1) / stride)."""
    return {f"W{a}": -(-((k - 1) * d + 1) // st) for a, k, st, d in zip("RS", kernel, stride, dilation)}


def _launch(kernel, t: torch.Tensor, *args, **kwargs) -> None:
    """kernel over the tiles of t [N, C, P, Q] (the tensor whose elements the lanes own): columns
    along its innermost dim, as many as that dim needs up to 128 (kernel's _tile)."""
    channels_last = is_channels_last(t)
    # NCHW rows narrower than a warp leave most lanes of a row tile idle: tile whole planes then
    flat = not channels_last and t.shape[3] < 32 and t.stride(2) == t.shape[3] * t.stride(3)
    inner = t.shape[1] if channels_last else t.shape[2] * t.shape[3] if flat else t.shape[3]
    block_i = min(128, triton.next_power_of_2(inner))
    rows = t.numel() // inner
    grid = lambda meta: (runtime.cdiv(rows, meta["BLOCK"] // block_i), runtime.cdiv(inner, block_i))
    kernel[grid](*args, CHANNELS_LAST=channels_last, FLAT=flat, BLOCK_I=block_i, **kwargs)


def max_pool2d(x: torch.Tensor, kernel, stride, padding, dilation, out_hw) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y [N, C, P, Q] in x's layout, int64 argmax indices h*W + w of the same shape and layout)."""
    Nb, C, H, W = x.shape
    y = empty_like_layout((Nb, C, *out_hw), x)
    idx = empty_like_layout((Nb, C, *out_hw), x, torch.int64)
    if y.numel():
        _launch(max_pool2d_fwd_kernel, y, x, y, idx, y.numel(), C, H, W, *out_hw, *kernel, *x.stride(), *y.stride(),
                *stride, *padding, *dilation, WIDE=_wide(x, y, idx))
    return y, idx


def max_pool2d_backward(gy: torch.Tensor, idx: torch.Tensor, x_shape, kernel, stride, padding, dilation,
                        channels_last: bool) -> torch.Tensor:
    """dX [N, C, H, W] in NHWC if ``channels_last`` else NCHW from gY and the forward's argmax indices."""
    Nb, C, H, W = x_shape
    dx = _empty(x_shape, channels_last, gy.dtype, gy.device)
    if dx.numel():
        _launch(max_pool2d_bwd_kernel, dx, gy, idx, dx, dx.numel(), C, H, W, gy.shape[2], gy.shape[3], *kernel,
                *gy.stride(), *idx.stride(), *dx.stride(), *stride, *padding, *dilation,
                **_windows(kernel, stride, dilation), WIDE=_wide(gy, idx, dx))
    return dx


def avg_pool2d(x: torch.Tensor, kernel, stride, padding, out_hw, count_include_pad: bool,
               divisor_override: int | None) -> torch.Tensor:
    """Y [N, C, P, Q] in x's layout."""
    Nb, C, H, W = x.shape
    y = empty_like_layout((Nb, C, *out_hw), x)
    if y.numel():
        _launch(avg_pool2d_fwd_kernel, y, x, y, y.numel(), C, H, W, *out_hw, *kernel, *x.stride(), *y.stride(),
                *stride, *padding, DIVISOR=int(divisor_override or 0), COUNT_INCLUDE_PAD=bool(count_include_pad),
                WIDE=_wide(x, y))
    return y


def avg_pool2d_backward(gy: torch.Tensor, x_shape, kernel, stride, padding, count_include_pad: bool,
                        divisor_override: int | None, channels_last: bool) -> torch.Tensor:
    """dX [N, C, H, W] in NHWC if ``channels_last`` else NCHW."""
    Nb, C, H, W = x_shape
    dx = _empty(x_shape, channels_last, gy.dtype, gy.device)
    if dx.numel():
        _launch(avg_pool2d_bwd_kernel, dx, gy, dx, dx.numel(), C, H, W, gy.shape[2], gy.shape[3], *kernel,
                *gy.stride(), *dx.stride(), *stride, *padding, DIVISOR=int(divisor_override or 0),
                COUNT_INCLUDE_PAD=bool(count_include_pad), **_windows(kernel, stride, (1, 1)),
                WIDE=_wide(gy, dx))
    return dx


def adaptive_avg_pool2d(x: torch.Tensor, out_hw) -> torch.Tensor:
    """Y [N, C, P, Q] in x's layout: the mean of each adaptive window."""
    Nb, C, H, W = x.shape
    P, Q = out_hw
    y = empty_like_layout((Nb, C, P, Q), x)
    if y.numel():
        window = (_adaptive_bounds(H, P)[0], _adaptive_bounds(W, Q)[0])
        _launch(adaptive_avg_pool2d_fwd_kernel, y, x, y, y.numel(), C, H, W, P, Q, *window, *x.stride(),
                *y.stride(), WIDE=_wide(x, y))
    return y


def adaptive_avg_pool2d_backward(gy: torch.Tensor, x_shape, channels_last: bool) -> torch.Tensor:
    """dX [N, C, H, W] in NHWC if ``channels_last`` else NCHW."""
    Nb, C, H, W = x_shape
    P, Q = gy.shape[2], gy.shape[3]
    dx = _empty(x_shape, channels_last, gy.dtype, gy.device)
    if dx.numel():
        cover = (_adaptive_bounds(H, P)[1], _adaptive_bounds(W, Q)[1])
        _launch(adaptive_avg_pool2d_bwd_kernel, dx, gy, dx, dx.numel(), C, H, W, P, Q, *cover, *gy.stride(),
                *dx.stride(), WIDE=_wide(gy, dx), GLOBAL=P == 1 and Q == 1)
    return dx
