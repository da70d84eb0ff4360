"""Resampling: pad, interpolate (nearest, nearest-exact, linear, bilinear, bicubic, trilinear),
unfold / fold (im2col / col2im) and pixel (un)shuffle; forward and backward.

pad and pixel (un)shuffle are ``layout.remap`` over restrided views (pad's backward: one
``layout.pad_backward_1d`` per padded dim). Interpolation is separable: along each of up to three
spatial dims an output index o reads TAPS input indices i0 + k + OFF (clamped to the input) with
weights of the fraction t, where src = a*o + b, i0 = floor(src), t = src - i0 (torch's source index
rules, in fp32 as torch's CUDA kernels compute them):

    nearest        a = scale, b = 0                    TAPS 1
    nearest-exact  a = scale, b = scale / 2            TAPS 1
    linear         a = scale, b = scale/2 - 1/2 (0 with align_corners), src >= 0     TAPS 2
    cubic          the same a, b, no clamp; Keys' kernel with A = -0.75              TAPS 4

Backward is a gather, not a scatter of the output gradient: input i is read by the outputs o whose
i0 lies in [i - OFF - TAPS + 1, i - OFF] (every output, past the input's first or last index,
whose taps clamp onto it), a range found by inverting src with one index of slack on each side;
each lane walks that range in order, recomputes each candidate's taps exactly as the forward did
and adds the weights that land on it. Deterministic, no atomics; masked loads skip the
candidates whose weight is 0. unfold/fold work the same way (fold gathers the windows' taps).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels import layout

# constexpr: the kernels compare their MODE argument with these (Triton reads only constexpr globals)
NEAREST, NEAREST_EXACT, LINEAR, CUBIC = (tl.constexpr(i) for i in range(4))
TAPS = {NEAREST: 1, NEAREST_EXACT: 1, LINEAR: 2, CUBIC: 4}
CUBIC_A = tl.constexpr(-0.75)

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8))]
INTERPRETER_CONFIG = triton.Config({"BLOCK": 2048}, num_warps=4)
MAX_BLOCK_C = 256


# ---------------------------------------------------------------------------------------------
# pad and pixel shuffle: restrided views through layout.remap
# ---------------------------------------------------------------------------------------------
def pad(x: torch.Tensor, pads: tuple[int, ...], mode: int, value: float = 0.0) -> torch.Tensor:
    """x [..., S_k..] padded (or cropped, negative) on its last len(pads)//2 dims; pads in torch's
    order (last dim first, (before, after) pairs)."""
    k = len(pads) // 2
    shape = list(x.shape)
    shift = [0] * x.dim()
    for i in range(k):
        d = x.dim() - 1 - i
        lo, hi = pads[2 * i], pads[2 * i + 1]
        shape[d] = x.shape[d] + lo + hi
        # WRAP needs a non-negative o + shift (lo <= the dim's size, checked by the caller)
        shift[d] = x.shape[d] - lo if mode == layout.WRAP else -lo
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    fill = torch.full((1,), value, dtype=x.dtype, device=x.device) if mode == layout.CONSTANT else None
    return layout.remap(x, y, xs=x.stride(), shift=shift, size=x.shape, mode=mode, fill=fill)


def pad_backward(g: torch.Tensor, in_shape: tuple[int, ...], pads: tuple[int, ...], mode: int) -> torch.Tensor:
    """The gradient of ``pad`` for x of in_shape: a crop (constant), else one gather-sum per padded dim."""
    if mode == layout.CONSTANT:
        return pad(g, tuple(-p for p in pads), layout.CONSTANT, 0.0)
    nd = len(in_shape)
    for i in range(len(pads) // 2):
        d = nd - 1 - i
        outer, inner = math.prod(g.shape[:d]), math.prod(g.shape[d + 1:])
        g3 = g.reshape(outer, g.shape[d], inner)
        g = layout.pad_backward_1d(g3, in_shape[d], pads[2 * i], mode).reshape(*g.shape[:d], in_shape[d], *g.shape[d + 1:])
    return g


def pixel_shuffle(x: torch.Tensor, r: int) -> torch.Tensor:
    """x [*, C r^2, H, W] -> [*, C, H r, W r]: y[c, h r + i, w r + j] = x[c r^2 + i r + j, h, w]."""
    *lead, cr, H, W = x.shape
    C = cr // (r * r)
    y = torch.empty((*lead, C, H * r, W * r), dtype=x.dtype, device=x.device)
    *sl, sc, sh, sw = x.stride()
    layout.remap(x, y.view(*lead, C, H, r, W, r), xs=(*sl, sc * r * r, sh, sc * r, sw, sc))
    return y


def pixel_unshuffle(x: torch.Tensor, r: int) -> torch.Tensor:
    """x [*, C, H r, W r] -> [*, C r^2, H, W], the inverse of ``pixel_shuffle``."""
    *lead, C, hr, wr = x.shape
    H, W = hr // r, wr // r
    y = torch.empty((*lead, C * r * r, H, W), dtype=x.dtype, device=x.device)
    *sl, sc, sh, sw = x.stride()
    layout.remap(x, y.view(*lead, C, r, r, H, W), xs=(*sl, sc, sh, sw, sh * r, sw * r))
    return y


# ---------------------------------------------------------------------------------------------
# interpolate
# ---------------------------------------------------------------------------------------------
@triton.jit
def _source(o, a, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """(i0, t): the first tap's unclamped index and the fraction for output o (torch's order of operations)."""
    of = o.to(tl.float32)
    if MODE == NEAREST:
        s = of * a
    elif MODE == NEAREST_EXACT:
        s = (of + 0.5) * a
    elif ALIGN:
        s = a * of
    else:
        s = a * (of + 0.5) - 0.5
    if MODE == LINEAR:
        s = tl.maximum(s, 0.0)
    i0 = tl.floor(s)
    return i0.to(tl.int32), s - i0


@triton.jit
def _tap(t, k: tl.constexpr, TAPS: tl.constexpr):
    """Weight of tap k (of TAPS) at fraction t."""
    if TAPS == 1:
        w = tl.full(t.shape, 1.0, tl.float32)
    elif TAPS == 2:
        if k == 0:
            w = 1.0 - t
        else:
            w = t
    else:
        A: tl.constexpr = CUBIC_A
        if k == 0:
            u = t + 1.0
            w = ((A * u - 5.0 * A) * u + 8.0 * A) * u - 4.0 * A
        elif k == 1:
            w = ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0
        elif k == 2:
            u = 1.0 - t
            w = ((A + 2.0) * u - (A + 3.0)) * u * u + 1.0
        else:
            u = 2.0 - t
            w = ((A * u - 5.0 * A) * u + 8.0 * A) * u - 4.0 * A
    return w


@triton.jit
def _weight_on(o, i, S, a, MODE: tl.constexpr, ALIGN: tl.constexpr, TAPS: tl.constexpr):
    """The weight output o gives input i (sum over its taps that clamp onto i)."""
    i0, t = _source(o, a, MODE, ALIGN)
    OFF: tl.constexpr = -(TAPS // 4)  # cubic's taps start one before i0
    w = tl.zeros(t.shape, tl.float32)
    for k in tl.static_range(TAPS):
        idx = tl.minimum(tl.maximum(i0 + (k + OFF), 0), S - 1)
        w += tl.where(idx == i, _tap(t, k, TAPS), 0.0)
    return w


@triton.jit
def _readers(i, S, So, a, b, TAPS: tl.constexpr):
    """(first, count) of the outputs whose taps may read input i (one index of slack each side)."""
    OFF: tl.constexpr = -(TAPS // 4)  # cubic's taps start one before i0
    lo_i = i - (OFF + TAPS - 1)
    hi_i = i - OFF
    safe_a = tl.where(a > 0, a, 1.0)
    first = tl.ceil((lo_i.to(tl.float32) - b) / safe_a).to(tl.int32) - 1
    last = tl.floor((hi_i.to(tl.float32) + 1.0 - b) / safe_a).to(tl.int32) + 1
    first = tl.where((lo_i <= 0) | (a <= 0), 0, tl.maximum(first, 0))
    last = tl.where((hi_i >= S - 1) | (a <= 0), So - 1, tl.minimum(last, So - 1))
    return first, tl.maximum(last - first + 1, 0)


@runtime.autotune(CONFIGS, key=["rows", "OW", "MODE", "ALIGN", "TD", "TH", "TW", "BLOCK_C"], default=INTERPRETER_CONFIG,
                  do_bench=runtime.tuning_bench)
@triton.jit
def interpolate_fwd_kernel(
    x_ptr, y_ptr, rows, C, ID, IH, IW, OD, OH, OW, ad, bd, ah, bh, aw, bw,
    sxn, sxc, sxd, sxh, sxw,
    MODE: tl.constexpr, ALIGN: tl.constexpr, TD: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
    WIDE_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
):
    """y [N, C, OD, OH, OW] (contiguous) = the separable interpolation of x [N, C, ID, IH, IW]."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    col_tiles = tl.cdiv(OW, BLOCK_C)
    pid = tl.program_id(0)
    r = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ow = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    # int64 division is a long software sequence (per row a lane holds): decode in int32 when rows fit
    if WIDE_ROWS:
        rr = r
    else:
        rr = r.to(tl.int32)
    oh = (rr % OH).to(tl.int32)
    od = ((rr // OH) % OD).to(tl.int32)
    nc = rr // (OH * OD)
    base = (nc // C).to(tl.int64) * sxn + (nc % C).to(tl.int64) * sxc
    mask = (r < rows)[:, None] & (ow < OW)[None, :]
    d0, td = _source(od, ad, MODE, ALIGN)
    h0, th = _source(oh, ah, MODE, ALIGN)
    w0, tw = _source(ow, aw, MODE, ALIGN)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for kd in tl.static_range(TD):
        di = tl.minimum(tl.maximum(d0 + (kd - TD // 4), 0), ID - 1)
        wd = _tap(td, kd, TD)
        for kh in tl.static_range(TH):
            hi = tl.minimum(tl.maximum(h0 + (kh - TH // 4), 0), IH - 1)
            wdh = wd * _tap(th, kh, TH)
            row = base + di.to(tl.int64) * sxd + hi.to(tl.int64) * sxh
            for kw in tl.static_range(TW):
                wi = tl.minimum(tl.maximum(w0 + (kw - TW // 4), 0), IW - 1)
                v = tl.load(x_ptr + row[:, None] + wi.to(tl.int64)[None, :] * sxw, mask=mask, other=0.0)
                acc += (wdh[:, None] * _tap(tw, kw, TW)[None, :]) * v.to(tl.float32)
    tl.store(y_ptr + r[:, None] * OW + ow[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@runtime.autotune(CONFIGS, key=["rows", "IW", "MODE", "ALIGN", "TD", "TH", "TW", "BLOCK_C"], default=INTERPRETER_CONFIG,
                  do_bench=runtime.tuning_bench)
@triton.jit
def interpolate_bwd_kernel(
    g_ptr, gx_ptr, rows, C, ID, IH, IW, OD, OH, OW, ad, bd, ah, bh, aw, bw,
    sgn, sgc, sgd, sgh, sgw,
    MODE: tl.constexpr, ALIGN: tl.constexpr, TD: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
):
    """gx [N, C, ID, IH, IW] (contiguous) = sum over the outputs reading each input of weight * g."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    col_tiles = tl.cdiv(IW, BLOCK_C)
    pid = tl.program_id(0)
    r = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    iw = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok_r = r < rows
    ok_c = iw < IW
    ih = (r % IH).to(tl.int32)
    id_ = ((r // IH) % ID).to(tl.int32)
    nc = r // (IH * ID)
    base = (nc // C) * sgn + (nc % C) * sgc
    mask = ok_r[:, None] & ok_c[None, :]
    fd, nd = _readers(id_, ID, OD, ad, bd, TD)
    fh, nh = _readers(ih, IH, OH, ah, bh, TH)
    fw, nw = _readers(iw, IW, OW, aw, bw, TW)
    nd = tl.where(ok_r, nd, 0)
    nh = tl.where(ok_r, nh, 0)
    nw = tl.where(ok_c, nw, 0)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for cd in range(0, tl.max(nd, 0)):
        od = fd + cd
        wd = tl.where(cd < nd, _weight_on(od, id_, ID, ad, MODE, ALIGN, TD), 0.0)
        for ch in range(0, tl.max(nh, 0)):
            oh = fh + ch
            wdh = wd * tl.where(ch < nh, _weight_on(oh, ih, IH, ah, MODE, ALIGN, TH), 0.0)
            row = base + od.to(tl.int64) * sgd + oh.to(tl.int64) * sgh
            for cw in range(0, tl.max(nw, 0)):
                ow = fw + cw
                ww = tl.where(cw < nw, _weight_on(ow, iw, IW, aw, MODE, ALIGN, TW), 0.0)
                wt = wdh[:, None] * ww[None, :]
                g = tl.load(g_ptr + row[:, None] + ow.to(tl.int64)[None, :] * sgw, mask=mask & (wt != 0.0), other=0.0)
                acc += wt * g.to(tl.float32)
    tl.store(gx_ptr + r[:, None] * IW + iw[None, :], acc.to(gx_ptr.dtype.element_ty), mask=mask)


def _as5d(shape):
    """[N, C, *spatial] (1 to 3 spatial dims) -> [N, C, D, H, W] with size-1 dims in front."""
    n, c, *sp = shape
    return (n, c, *([1] * (3 - len(sp))), *sp)


def _maps(scales, align: bool, mode: int) -> list[tuple[float, float]]:
    """(a, b) of src = a*o + b per spatial dim (three, the missing ones the identity of a size-1 dim)."""
    out = [(1.0, 0.0)] * (3 - len(scales))
    for s in scales:
        if mode == NEAREST:
            out.append((s, 0.0))
        elif mode == NEAREST_EXACT:
            out.append((s, 0.5 * s))
        else:
            out.append((s, 0.0) if align else (s, 0.5 * s - 0.5))
    return out


def _launch_interp(kernel, t_rows, t_cols, *args, taps, mode, align, **flags):
    """kernel over [rows, cols] tiles of the tensor the lanes own."""
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(t_cols))
    col_tiles = runtime.cdiv(t_cols, block_c)
    grid = lambda meta: (runtime.cdiv(t_rows, meta["BLOCK"] // block_c) * col_tiles,)
    kernel[grid](*args, MODE=mode, ALIGN=align, TD=taps[0], TH=taps[1], TW=taps[2], BLOCK_C=block_c, **flags)


def interpolate(x: torch.Tensor, size: tuple[int, ...], scales: tuple[float, ...], mode: int, align: bool) -> torch.Tensor:
    """x [N, C, *in] -> y [N, C, *size] (contiguous); scales: the source step per spatial dim."""
    N, C, ID, IH, IW = _as5d(x.shape)
    OD, OH, OW = _as5d((N, C, *size))[2:]
    y = torch.empty((N, C, *size), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    sx = x.stride()
    sn, sc, sd, sh, sw = sx[0], sx[1], *((0,) * (3 - len(size))), *sx[2:]
    taps = [1] * (3 - len(size)) + [TAPS[mode]] * len(size)
    maps = [v for ab in _maps(scales, align, mode) for v in ab]
    rows = N * C * OD * OH
    _launch_interp(interpolate_fwd_kernel, rows, OW, x, y, rows, C, ID, IH, IW, OD, OH, OW, *maps,
                   sn, sc, sd, sh, sw, taps=taps, mode=mode, align=bool(align), WIDE_ROWS=rows >= 2**31)
    return y


def interpolate_backward(g: torch.Tensor, in_shape, scales, mode: int, align: bool) -> torch.Tensor:
    """The gradient of ``interpolate`` for x of in_shape: gx [in_shape] (contiguous)."""
    N, C, ID, IH, IW = _as5d(in_shape)
    OD, OH, OW = _as5d(g.shape)[2:]
    gx = torch.empty(tuple(in_shape), dtype=g.dtype, device=g.device)
    if gx.numel() == 0:
        return gx
    if g.numel() == 0:
        return gx.zero_()
    k = g.dim() - 2
    sg = g.stride()
    sn, sc, sd, sh, sw = sg[0], sg[1], *((0,) * (3 - k)), *sg[2:]
    taps = [1] * (3 - k) + [TAPS[mode]] * k
    maps = [v for ab in _maps(scales, align, mode) for v in ab]
    rows = N * C * ID * IH
    _launch_interp(interpolate_bwd_kernel, rows, IW, g, gx, rows, C, ID, IH, IW, OD, OH, OW, *maps,
                   sn, sc, sd, sh, sw, taps=taps, mode=mode, align=bool(align))
    return gx


# ---------------------------------------------------------------------------------------------
# unfold (im2col) and fold (col2im)
# ---------------------------------------------------------------------------------------------
@runtime.autotune(CONFIGS, key=["rows", "Q", "BLOCK_C"], default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def unfold_kernel(x_ptr, y_ptr, rows, C, H, W, KH, KW, P, Q, sh, sw, ph, pw, dh, dw, sxn, sxc, sxh, sxw,
                  BLOCK_C: tl.constexpr, BLOCK: tl.constexpr):
    """y [N, C, KH, KW, P, Q] (contiguous) = x[n, c, p sh - ph + ki dh, q sw - pw + kj dw], 0 outside."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    col_tiles = tl.cdiv(Q, BLOCK_C)
    pid = tl.program_id(0)
    r = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    q = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    p = (r % P).to(tl.int32)
    kj = ((r // P) % KW).to(tl.int32)
    ki = ((r // (P * KW)) % KH).to(tl.int32)
    nc = r // (P * KW * KH)
    h = p * sh - ph + ki * dh
    w = q[None, :] * sw - pw + (kj * dw)[:, None]
    mask = (r < rows)[:, None] & (q < Q)[None, :]
    ok = mask & ((h >= 0) & (h < H))[:, None] & (w >= 0) & (w < W)
    src = ((nc // C) * sxn + (nc % C) * sxc + h.to(tl.int64) * sxh)[:, None] + w.to(tl.int64) * sxw
    v = tl.load(x_ptr + src, mask=ok, other=0.0)
    tl.store(y_ptr + r[:, None] * Q + q[None, :], v, mask=mask)


@runtime.autotune(CONFIGS, key=["rows", "W", "BLOCK_C"], default=INTERPRETER_CONFIG, do_bench=runtime.tuning_bench)
@triton.jit
def fold_kernel(x_ptr, y_ptr, rows, C, H, W, KH, KW, P, Q, sh, sw, ph, pw, dh, dw, sxn, sxk, sxl,
                BLOCK_C: tl.constexpr, BLOCK: tl.constexpr):
    """y [N, C, H, W] (contiguous) = sum over the window taps (ki, kj) that land on (h, w) of
    x[n, (c KH + ki) KW + kj, p Q + q] (x: [N, C KH KW, P Q]), taps in order."""
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    col_tiles = tl.cdiv(W, BLOCK_C)
    pid = tl.program_id(0)
    r = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    w = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    h = (r % H).to(tl.int32)
    nc = r // H
    c = nc % C
    base = (nc // C) * sxn + c * KH * KW * sxk
    mask = (r < rows)[:, None] & (w < W)[None, :]
    ACC: tl.constexpr = tl.float64 if y_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros([BLOCK_R, BLOCK_C], ACC)
    for ki in range(0, KH):
        hp = h + ph - ki * dh
        p = hp // sh
        ok_h = (hp >= 0) & (hp % sh == 0) & (p < P)
        for kj in range(0, KW):
            wq = w + pw - kj * dw
            q = wq // sw
            ok = mask & ok_h[:, None] & ((wq >= 0) & (wq % sw == 0) & (q < Q))[None, :]
            src = (base + (ki * KW + kj) * sxk + p.to(tl.int64) * Q * sxl)[:, None] + q.to(tl.int64)[None, :] * sxl
            acc += tl.load(x_ptr + src, mask=ok, other=0.0).to(ACC)
    tl.store(y_ptr + r[:, None] * W + w[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_tiles(kernel, rows, cols, *args):
    block_c = min(MAX_BLOCK_C, triton.next_power_of_2(cols))
    col_tiles = runtime.cdiv(cols, block_c)
    grid = lambda meta: (runtime.cdiv(rows, meta["BLOCK"] // block_c) * col_tiles,)
    kernel[grid](*args, BLOCK_C=block_c)


def unfold(x: torch.Tensor, kernel, dilation, padding, stride, out_hw) -> torch.Tensor:
    """x [N, C, H, W] -> [N, C KH KW, P Q] (contiguous): every window's taps as a column."""
    N, C, H, W = x.shape
    (KH, KW), (P, Q) = kernel, out_hw
    y = torch.empty((N, C * KH * KW, P * Q), dtype=x.dtype, device=x.device)
    if y.numel():
        rows = N * C * KH * KW * P
        _launch_tiles(unfold_kernel, rows, Q, x, y, rows, C, H, W, KH, KW, P, Q, *stride, *padding, *dilation,
                      *x.stride())
    return y


def fold(x: torch.Tensor, output_size, kernel, dilation, padding, stride, blocks_hw) -> torch.Tensor:
    """x [N, C KH KW, L] -> [N, C, H, W] (contiguous): overlapping taps summed (the inverse map of unfold)."""
    N, CK, _ = x.shape
    (H, W), (KH, KW), (P, Q) = output_size, kernel, blocks_hw
    C = CK // (KH * KW)
    y = torch.empty((N, C, H, W), dtype=x.dtype, device=x.device)
    if y.numel():
        rows = N * C * H
        _launch_tiles(fold_kernel, rows, W, x, y, rows, C, H, W, KH, KW, P, Q, *stride, *padding, *dilation,
                      *x.stride())
    return y
