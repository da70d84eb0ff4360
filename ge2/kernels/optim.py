"""Fused multi-tensor optimizer updates (SGD, Adam/AdamW, RMSprop, Adagrad, Lion) and gradient-norm clipping.

One launch updates every parameter of one dtype: a device table holds, per parameter, the
addresses of the parameter, its gradient and its optimizer state, its element count and its
parameter group; a chunk table maps each program to (parameter, first element, end). A program
loads its rows, casts the addresses to pointers and sweeps its chunk (up to ``MAX_CHUNK``
elements) ``BLOCK`` elements at a time: full blocks unmasked, with 16-byte vector accesses when
every address is 16-byte aligned, then the masked tail. The tables are rebuilt only when an
address changes (a cache keyed by the addresses), so a steady training loop uploads nothing.
Parameters may be fp32, bf16 or fp16 (the gradient's dtype): the state is fp32 whatever they are.

Hyper-parameters and step counts live on the device in ``hyper``, float64 [groups, HYPER_SLOTS]
(layout below). ``optim_prepare_kernel`` (one program per group) advances the step and the
running powers beta1^t, beta2^t and derives the bias corrections before the update reads them.
Changing lr is a write into ``hyper``: no recompilation, and a captured CUDA graph that replays
the step reads the new value. Math is fp32 (the state is fp32 whatever the parameter dtype);
derived scalars are formed in fp64 as torch.optim does in Python, then rounded once.

Loss scaling (``ge2.amp.GradScaler``) rides on the same launches: ``amp_unscale_kernel`` checks
the gradients for inf/NaN (and unscales them in place when asked) into a device flag, and every
update kernel can read the loss scale and that flag, multiply the gradient by 1/scale as it loads
it and mask its stores when the flag is set, so a skipped step is decided on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import graphs
from ge2.kernels.gemm import _sm_count


# hyper slots: what the user sets, then what optim_prepare_kernel maintains.
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, STEP, BETA1_POW, BETA2_POW, STEP_SIZE, BC2_SQRT = range(10)
MOMENTUM, DAMPENING = BETA1, BETA2  # SGD reuses the beta slots
ALPHA = BETA2  # RMSprop's smoothing constant (its momentum sits in MOMENTUM)
LR_DECAY = 10  # Adagrad
HYPER_SLOTS = 16

TABLE_COLS = 6  # param, grad, state1, state2 addresses, numel, group
BLOCK = 4096  # elements a program updates per loop step
MAX_CHUNK = 16384  # elements per program (one chunk-table row) at most
PROGRAMS_PER_SM = 16  # chunks shrink (to BLOCK at least) until a launch has about this many programs per SM

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
              torch.float64: tl.float64}


# One fixed config, no autotuning: the updates write in place, and tuning re-runs a kernel to time
# it (every re-run would apply the update again). They are memory-bound streams; 8 warps on 4096
# elements give each thread 16 contiguous elements (four 16-byte accesses per fp32 tensor in
# flight). A program sweeps a chunk of up to MAX_CHUNK elements, so its two dependent table loads
# (chunk row, then tensor row) are paid once per chunk. Chosen by ``bench_nn.py --sweep`` on the
# H100 (bench/results/nn_sweep.json): block 1024..4096, 4 or 8 warps, chunks of 16K or 64K, 4..16
# programs per SM; this one was within 1% of the best for AdamW and SGD at 85M and 10.7M parameters.
NUM_WARPS = 8


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _live(found_ptr, SKIP: tl.constexpr):
    """False when the loss scaler found inf/NaN in this step's gradients (then nothing is stored)."""
    if SKIP:
        return tl.load(found_ptr) == 0.0
    return True


@triton.jit
def _unscaled(g, scale_ptr, UNSCALE: tl.constexpr):
    """g / loss scale, as torch's unscale does it: g * fp32(1 / fp64(scale))."""
    if UNSCALE:
        return g * (1.0 / tl.load(scale_ptr).to(tl.float64)).to(tl.float32)
    return g


@triton.jit
def optim_prepare_kernel(hyper_ptr, found_ptr, HYPER_SLOTS: tl.constexpr, SKIP: tl.constexpr):
    """step += 1, beta^t *= beta, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t): one group.

    SKIP: nothing advances when the loss scaler's found-inf flag is set (the step is skipped).
    """
    h = hyper_ptr + tl.program_id(0) * HYPER_SLOTS
    live = _live(found_ptr, SKIP)
    step = tl.load(h + 5) + 1.0
    b1_pow = tl.load(h + 6) * tl.load(h + 1)
    b2_pow = tl.load(h + 7) * tl.load(h + 2)
    tl.store(h + 5, step, mask=live)
    tl.store(h + 6, b1_pow, mask=live)
    tl.store(h + 7, b2_pow, mask=live)
    tl.store(h + 8, tl.load(h + 0) / (1.0 - b1_pow), mask=live)
    tl.store(h + 9, tl.sqrt(1.0 - b2_pow), mask=live)


@triton.jit
def _address(row, col, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    ptr = tl.load(row + col).to(tl.pointer_type(DTYPE))
    if ALIGNED:  # the host checked every address of the launch: 16-byte vector loads are legal
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _chunk(table_ptr, chunks_ptr, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """(param ptr, grad ptr, state1 ptr, state2 ptr, start, end, group) of this program's chunk [start, end)."""
    c = chunks_ptr + 3 * tl.program_id(0)
    row = table_ptr + tl.load(c) * 6  # TABLE_COLS
    start = tl.load(c + 1)
    if ALIGNED:
        start = tl.multiple_of(start, 16)
    return (_address(row, 0, DTYPE, ALIGNED), _address(row, 1, DTYPE, ALIGNED),
            _address(row, 2, tl.float32, ALIGNED), _address(row, 3, tl.float32, ALIGNED),
            start, tl.load(c + 2), tl.load(row + 5))


@triton.jit
def _ld(ptrs, mask):
    """fp32 values at ptrs: unmasked (vectorisable) for a full block, masked for a chunk's tail."""
    if mask is None:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x.to(tl.float32)


# Each update kernel sweeps its chunk [start, end) in BLOCK-element blocks: every full block without
# a mask (a mask of unknown alignment would force scalar accesses), then the tail with one. A step
# skipped by the loss scaler sets end = start, so nothing is read or stored.
@triton.jit
def _sgd_block(p_ptr, g_ptr, buf_ptr, offs, mask, scale_ptr, lr, wd, momentum, keep, first, UNSCALE: tl.constexpr,
               HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, DTYPE: tl.constexpr):
    p = _ld(p_ptr + offs, mask)
    d = _unscaled(_ld(g_ptr + offs, mask), scale_ptr, UNSCALE)
    d = d + wd * p
    if HAS_MOMENTUM:
        # torch starts the buffer at the first gradient itself (no dampening on step 1)
        buf = tl.where(first, d, _ld(buf_ptr + offs, mask) * momentum + keep * d)
        tl.store(buf_ptr + offs, buf, mask=mask)
        if NESTEROV:
            d = d + momentum * buf
        else:
            d = buf
    tl.store(p_ptr + offs, (p + (-lr) * d).to(DTYPE), mask=mask)


@triton.jit
def sgd_kernel(table_ptr, chunks_ptr, hyper_ptr, scale_ptr, found_ptr, HYPER_SLOTS: tl.constexpr,
               DTYPE: tl.constexpr, UNSCALE: tl.constexpr, SKIP: tl.constexpr, ALIGNED: tl.constexpr,
               HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, BLOCK: tl.constexpr):
    """p -= lr * d, d = g + wd p, or its momentum buffer (torch.optim.SGD's rule)."""
    p_ptr, g_ptr, buf_ptr, _s2, start, end, group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    end = tl.where(_live(found_ptr, SKIP), end, start)
    h = hyper_ptr + group * HYPER_SLOTS
    lr = tl.load(h + 0).to(tl.float32)
    wd = tl.load(h + 4).to(tl.float32)
    momentum = tl.load(h + 1).to(tl.float32)
    keep = (1.0 - tl.load(h + 2)).to(tl.float32)  # 1 - dampening
    first = tl.load(h + 5) == 1.0
    full = (end - start) // BLOCK
    for i in range(0, full):
        _sgd_block(p_ptr, g_ptr, buf_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, lr, wd, momentum,
                   keep, first, UNSCALE, HAS_MOMENTUM, NESTEROV, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _sgd_block(p_ptr, g_ptr, buf_ptr, offs, offs < end, scale_ptr, lr, wd, momentum, keep, first, UNSCALE,
               HAS_MOMENTUM, NESTEROV, DTYPE)


@triton.jit
def _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offs, mask, scale_ptr, decay, wd, beta1c, beta2, beta2c, eps, step_size,
                bc2_sqrt, UNSCALE: tl.constexpr, DECOUPLED: tl.constexpr, DTYPE: tl.constexpr):
    p = _ld(p_ptr + offs, mask)
    g = _unscaled(_ld(g_ptr + offs, mask), scale_ptr, UNSCALE)
    if DECOUPLED:
        p = p * decay
    else:
        g = g + wd * p
    m = _ld(m_ptr + offs, mask)
    v = _ld(v_ptr + offs, mask)
    m = m + beta1c * (g - m)  # torch's lerp_ for weights < 0.5
    v = v * beta2 + beta2c * (g * g)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    denom = tl.sqrt(v) / bc2_sqrt + eps
    tl.store(p_ptr + offs, (p + (-step_size) * (m / denom)).to(DTYPE), mask=mask)


@triton.jit
def adam_kernel(table_ptr, chunks_ptr, hyper_ptr, scale_ptr, found_ptr, HYPER_SLOTS: tl.constexpr,
                DTYPE: tl.constexpr, UNSCALE: tl.constexpr, SKIP: tl.constexpr, ALIGNED: tl.constexpr,
                DECOUPLED: tl.constexpr, BLOCK: tl.constexpr):
    """Adam (L2 weight decay into g) or AdamW (decoupled: p *= 1 - lr wd), torch.optim's order of operations."""
    p_ptr, g_ptr, m_ptr, v_ptr, start, end, group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    end = tl.where(_live(found_ptr, SKIP), end, start)
    h = hyper_ptr + group * HYPER_SLOTS
    lr = tl.load(h + 0)
    beta1 = tl.load(h + 1)
    beta2 = tl.load(h + 2)
    wd = tl.load(h + 4)
    decay = (1.0 - lr * wd).to(tl.float32)
    wd = wd.to(tl.float32)
    beta1c = (1.0 - beta1).to(tl.float32)
    beta2c = (1.0 - beta2).to(tl.float32)
    beta2 = beta2.to(tl.float32)
    eps = tl.load(h + 3).to(tl.float32)
    step_size = tl.load(h + 8).to(tl.float32)
    bc2_sqrt = tl.load(h + 9).to(tl.float32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, decay, wd,
                    beta1c, beta2, beta2c, eps, step_size, bc2_sqrt, UNSCALE, DECOUPLED, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, offs, offs < end, scale_ptr, decay, wd, beta1c, beta2, beta2c, eps,
                step_size, bc2_sqrt, UNSCALE, DECOUPLED, DTYPE)


@triton.jit
def _rmsprop_block(p_ptr, g_ptr, v_ptr, buf_ptr, offs, mask, scale_ptr, lr, wd, alpha, alphac, eps, momentum,
                   UNSCALE: tl.constexpr, HAS_MOMENTUM: tl.constexpr, DTYPE: tl.constexpr):
    p = _ld(p_ptr + offs, mask)
    g = _unscaled(_ld(g_ptr + offs, mask), scale_ptr, UNSCALE)
    g = g + wd * p
    v = _ld(v_ptr + offs, mask)
    v = v * alpha + alphac * (g * g)
    tl.store(v_ptr + offs, v, mask=mask)
    avg = tl.sqrt(v) + eps
    if HAS_MOMENTUM:
        buf = _ld(buf_ptr + offs, mask) * momentum + g / avg
        tl.store(buf_ptr + offs, buf, mask=mask)
        p = p + (-lr) * buf
    else:
        p = p + (-lr) * (g / avg)
    tl.store(p_ptr + offs, p.to(DTYPE), mask=mask)


@triton.jit
def rmsprop_kernel(table_ptr, chunks_ptr, hyper_ptr, scale_ptr, found_ptr, HYPER_SLOTS: tl.constexpr,
                   DTYPE: tl.constexpr, UNSCALE: tl.constexpr, SKIP: tl.constexpr, ALIGNED: tl.constexpr,
                   HAS_MOMENTUM: tl.constexpr, BLOCK: tl.constexpr):
    """torch.optim.RMSprop (not centered): v = alpha v + (1 - alpha) g^2; p -= lr g / (sqrt(v) + eps), or via momentum."""
    p_ptr, g_ptr, v_ptr, buf_ptr, start, end, group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    end = tl.where(_live(found_ptr, SKIP), end, start)
    h = hyper_ptr + group * HYPER_SLOTS
    alpha = tl.load(h + 2)
    lr = tl.load(h + 0).to(tl.float32)
    wd = tl.load(h + 4).to(tl.float32)
    alphac = (1.0 - alpha).to(tl.float32)
    alpha = alpha.to(tl.float32)
    eps = tl.load(h + 3).to(tl.float32)
    momentum = tl.load(h + 1).to(tl.float32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        _rmsprop_block(p_ptr, g_ptr, v_ptr, buf_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, lr, wd,
                       alpha, alphac, eps, momentum, UNSCALE, HAS_MOMENTUM, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _rmsprop_block(p_ptr, g_ptr, v_ptr, buf_ptr, offs, offs < end, scale_ptr, lr, wd, alpha, alphac, eps, momentum,
                   UNSCALE, HAS_MOMENTUM, DTYPE)


@triton.jit
def _adagrad_block(p_ptr, g_ptr, s_ptr, offs, mask, scale_ptr, clr, wd, eps, UNSCALE: tl.constexpr,
                   DTYPE: tl.constexpr):
    p = _ld(p_ptr + offs, mask)
    g = _unscaled(_ld(g_ptr + offs, mask), scale_ptr, UNSCALE)
    g = g + wd * p
    acc = _ld(s_ptr + offs, mask) + g * g
    tl.store(s_ptr + offs, acc, mask=mask)
    tl.store(p_ptr + offs, (p + (-clr) * (g / (tl.sqrt(acc) + eps))).to(DTYPE), mask=mask)


@triton.jit
def adagrad_kernel(table_ptr, chunks_ptr, hyper_ptr, scale_ptr, found_ptr, HYPER_SLOTS: tl.constexpr,
                   DTYPE: tl.constexpr, UNSCALE: tl.constexpr, SKIP: tl.constexpr, ALIGNED: tl.constexpr,
                   BLOCK: tl.constexpr):
    """torch.optim.Adagrad: s += g^2; p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)."""
    p_ptr, g_ptr, s_ptr, _s2, start, end, group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    end = tl.where(_live(found_ptr, SKIP), end, start)
    h = hyper_ptr + group * HYPER_SLOTS
    clr = (tl.load(h + 0) / (1.0 + (tl.load(h + 5) - 1.0) * tl.load(h + 10))).to(tl.float32)
    wd = tl.load(h + 4).to(tl.float32)
    eps = tl.load(h + 3).to(tl.float32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        _adagrad_block(p_ptr, g_ptr, s_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, clr, wd, eps,
                       UNSCALE, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _adagrad_block(p_ptr, g_ptr, s_ptr, offs, offs < end, scale_ptr, clr, wd, eps, UNSCALE, DTYPE)


@triton.jit
def _lion_block(p_ptr, g_ptr, m_ptr, offs, mask, scale_ptr, decay, lr, beta1c, beta2c, UNSCALE: tl.constexpr,
                DTYPE: tl.constexpr):
    p = _ld(p_ptr + offs, mask) * decay
    g = _unscaled(_ld(g_ptr + offs, mask), scale_ptr, UNSCALE)
    m = _ld(m_ptr + offs, mask)
    u = m + beta1c * (g - m)
    direction = tl.where(u > 0, 1.0, tl.where(u < 0, -1.0, 0.0))
    tl.store(p_ptr + offs, (p - lr * direction).to(DTYPE), mask=mask)
    tl.store(m_ptr + offs, m + beta2c * (g - m), mask=mask)


@triton.jit
def lion_kernel(table_ptr, chunks_ptr, hyper_ptr, scale_ptr, found_ptr, HYPER_SLOTS: tl.constexpr,
                DTYPE: tl.constexpr, UNSCALE: tl.constexpr, SKIP: tl.constexpr, ALIGNED: tl.constexpr,
                BLOCK: tl.constexpr):
    """Lion (Chen et al. 2023): p = p (1 - lr wd) - lr sign(lerp(m, g, 1 - beta1)); m = lerp(m, g, 1 - beta2)."""
    p_ptr, g_ptr, m_ptr, _s2, start, end, group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    end = tl.where(_live(found_ptr, SKIP), end, start)
    h = hyper_ptr + group * HYPER_SLOTS
    lr = tl.load(h + 0)
    decay = (1.0 - lr * tl.load(h + 4)).to(tl.float32)
    beta1c = (1.0 - tl.load(h + 1)).to(tl.float32)
    beta2c = (1.0 - tl.load(h + 2)).to(tl.float32)
    lr = lr.to(tl.float32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        _lion_block(p_ptr, g_ptr, m_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, decay, lr, beta1c,
                    beta2c, UNSCALE, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _lion_block(p_ptr, g_ptr, m_ptr, offs, offs < end, scale_ptr, decay, lr, beta1c, beta2c, UNSCALE, DTYPE)


@triton.jit
def _unscale_block(g_ptr, offs, mask, scale_ptr, bad, WRITE: tl.constexpr, DTYPE: tl.constexpr):
    g = _ld(g_ptr + offs, mask)
    # the check reads the scaled gradient, as torch's does; NaN fails the comparison too
    bad = tl.maximum(bad, (~(tl.abs(g) <= 3.4028234663852886e38)).to(tl.int32))
    if WRITE:
        tl.store(g_ptr + offs, _unscaled(g, scale_ptr, True).to(DTYPE), mask=mask)
    return bad


@triton.jit
def amp_unscale_kernel(table_ptr, chunks_ptr, scale_ptr, found_ptr, total_ptr, DTYPE: tl.constexpr,
                       WRITE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """found = total = 1 if this chunk of gradients holds an inf or NaN; WRITE: g /= loss scale in place."""
    _p, g_ptr, _s1, _s2, start, end, _group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    bad = tl.zeros([BLOCK], tl.int32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        bad = _unscale_block(g_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, scale_ptr, bad, WRITE, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    bad = _unscale_block(g_ptr, offs, offs < end, scale_ptr, bad, WRITE, DTYPE)
    bad = tl.max(bad, axis=0) > 0
    # every program that finds one stores the same 1.0: racing plain stores agree, no atomics needed
    tl.store(found_ptr, 1.0, mask=bad)
    tl.store(total_ptr, 1.0, mask=bad)


@triton.jit
def amp_update_scale_kernel(scale_ptr, tracker_ptr, found_ptr, growth_factor, backoff_factor, growth_interval):
    """torch's dynamic loss scale: back off on inf/NaN, grow after growth_interval clean steps; clears found."""
    scale = tl.load(scale_ptr)
    tracker = tl.load(tracker_ptr)
    found = tl.load(found_ptr) != 0.0
    clean = tracker + 1
    grow = clean == growth_interval
    grown = (scale.to(tl.float64) * growth_factor).to(tl.float32)
    grown = tl.where(tl.abs(grown) <= 3.4028234663852886e38, grown, scale)  # an overflowing growth is refused
    backed = (scale.to(tl.float64) * backoff_factor).to(tl.float32)
    tl.store(scale_ptr, tl.where(found, backed, tl.where(grow, grown, scale)))
    tl.store(tracker_ptr, tl.where(found | grow, 0, clean))
    tl.store(found_ptr, 0.0)


@triton.jit
def _norm_block(acc, g, INF_NORM: tl.constexpr):
    if INF_NORM:
        return tl.maximum(acc, tl.abs(g))
    return acc + g * g


@triton.jit
def grad_norm_partial_kernel(table_ptr, chunks_ptr, partial_ptr, DTYPE: tl.constexpr, INF_NORM: tl.constexpr,
                             ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """partial[chunk] = sum of g^2 (or max |g|) over this program's chunk."""
    _p, g_ptr, _s1, _s2, start, end, _group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    acc = tl.zeros([BLOCK], tl.float32)
    full = (end - start) // BLOCK
    for i in range(0, full):
        acc = _norm_block(acc, _ld(g_ptr + start + i * BLOCK + tl.arange(0, BLOCK), None), INF_NORM)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    acc = _norm_block(acc, _ld(g_ptr + offs, offs < end), INF_NORM)
    if INF_NORM:
        tl.store(partial_ptr + tl.program_id(0), tl.max(acc, axis=0))
    else:
        tl.store(partial_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def grad_norm_finish_kernel(partial_ptr, n_partials, norm_ptr, coef_ptr, max_norm, eps,
                            INF_NORM: tl.constexpr, BLOCK: tl.constexpr):
    """norm = sqrt(sum partials) (or their max); coef = min(max_norm / (norm + eps), 1). One program."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_partials, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(partial_ptr + offs, mask=offs < n_partials, other=0.0)
        if INF_NORM:
            acc = tl.maximum(acc, x)
        else:
            acc += x
    if INF_NORM:
        norm = tl.max(acc, axis=0)
    else:
        norm = tl.sqrt(tl.sum(acc, axis=0))
    tl.store(norm_ptr, norm)
    tl.store(coef_ptr, tl.minimum(max_norm / (norm + eps), 1.0))


@triton.jit
def _scale_block(g_ptr, offs, mask, coef, DTYPE: tl.constexpr):
    tl.store(g_ptr + offs, (_ld(g_ptr + offs, mask) * coef).to(DTYPE), mask=mask)


@triton.jit
def scale_grads_kernel(table_ptr, chunks_ptr, coef_ptr, DTYPE: tl.constexpr, ALIGNED: tl.constexpr,
                       BLOCK: tl.constexpr):
    """g *= coef (read on the device: no host sync between the norm and the scaling)."""
    _p, g_ptr, _s1, _s2, start, end, _group = _chunk(table_ptr, chunks_ptr, DTYPE, ALIGNED)
    coef = tl.load(coef_ptr)
    full = (end - start) // BLOCK
    for i in range(0, full):
        _scale_block(g_ptr, start + i * BLOCK + tl.arange(0, BLOCK), None, coef, DTYPE)
    offs = start + full * BLOCK + tl.arange(0, BLOCK)
    _scale_block(g_ptr, offs, offs < end, coef, DTYPE)


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
_TABLE_CACHE: dict[tuple, tuple[torch.Tensor, bool]] = {}
_CHUNK_CACHE: dict[tuple, tuple[torch.Tensor, int]] = {}
_CACHE_SIZE = 64


def _addrs(ts) -> tuple[int, ...]:
    return tuple([t.data_ptr() if t is not None else 0 for t in ts])


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a small host table to the device; inside a CUDA-graph capture, from pinned memory that
    the graph keeps (a pageable copy would synchronise, which capture forbids)."""
    if device.type == "cuda" and graphs.is_capturing():
        host = host.pin_memory()
        graphs.keep_alive(host)
        return host.to(device, non_blocking=True)
    return host.to(device)


def _cached(cache: dict, key: tuple, build):
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[key] = hit = build()
    return hit


def _chunk_size(total: int, device: torch.device) -> int:
    """Elements per program: MAX_CHUNK, halved (down to BLOCK) while a launch would have fewer than
    PROGRAMS_PER_SM programs per SM (a small model's few big chunks would leave SMs idle)."""
    chunk = MAX_CHUNK
    while chunk > BLOCK and total < chunk * PROGRAMS_PER_SM * _sm_count(device):
        chunk //= 2
    return chunk


def tensor_table(params, grads, states1, states2, groups) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """(table int64 [T, 6], chunks int64 [n, 3] of (tensor, start, end), n, aligned) on the params' device.

    Two caches: the chunk list depends only on the sizes, so it is built once; the address table
    (T rows) changes whenever a gradient lands at a new address, which in eager training is most
    steps. ``aligned``: every address is a multiple of 16 bytes (torch's allocations are; a view at
    an odd offset, e.g. a gradient inside a flat bucket, is not), so the kernels may use 16-byte
    vector accesses. The key is a few flat tuples, hashed in C: this runs on every step's host path.
    """
    columns = (_addrs(params), _addrs(grads), _addrs(states1), _addrs(states2))
    sizes = tuple([g.numel() for g in grads])
    device = grads[0].device

    def build():
        rows = [list(r) for r in zip(*columns, sizes, groups)]
        everything = 0
        for column in columns:
            for a in column:
                everything |= a
        return _to_device(torch.tensor(rows, dtype=torch.int64), device), everything % 16 == 0

    table, aligned = _cached(_TABLE_CACHE, (device, *columns, tuple(groups)), build)

    def chunks():
        step = _chunk_size(sum(sizes), device)
        triples = [(i, start, min(start + step, n)) for i, n in enumerate(sizes) for start in range(0, n, step)]
        return _to_device(torch.tensor(triples or [(0, 0, 0)], dtype=torch.int64), device), len(triples)

    chunk_t, n = _cached(_CHUNK_CACHE, (device, sizes, BLOCK, MAX_CHUNK, PROGRAMS_PER_SM), chunks)
    graphs.keep_alive(table)  # while capturing: the graph reads them even after the caches drop them
    graphs.keep_alive(chunk_t)
    return table, chunk_t, n, aligned


def _by_dtype(grads) -> dict[torch.dtype, list[int] | None]:
    """Indices of the grads of each dtype; None for "all of them" (the usual single dtype: no picking)."""
    dtypes = {g.dtype for g in grads}
    if len(dtypes) == 1:
        return {dtypes.pop(): None}
    out: dict[torch.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        out.setdefault(g.dtype, []).append(i)
    return out


def _pick(seq, idx):
    return seq if idx is None else [seq[i] for i in idx]


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def prepare(hyper: torch.Tensor, found_inf: torch.Tensor | None = None) -> None:
    """Advance every group's step and derived scalars (one launch); not when found_inf[0] != 0."""
    optim_prepare_kernel[(hyper.shape[0],)](hyper, hyper if found_inf is None else found_inf,
                                            HYPER_SLOTS=HYPER_SLOTS, SKIP=found_inf is not None)


def _amp_args(hyper: torch.Tensor, scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> dict:
    """The loss-scaling arguments of an update kernel (hyper stands in for an absent pointer)."""
    return dict(scale_ptr=hyper if scale is None else scale, found_ptr=hyper if found_inf is None else found_inf,
                UNSCALE=scale is not None, SKIP=found_inf is not None)


def _launch_update(kernel, hyper: torch.Tensor, scale, found_inf, params, grads, states1, states2, group_ids,
                   **flags) -> None:
    """prepare(), then one launch of an update kernel per gradient dtype over its (param, grad, state1, state2) rows."""
    prepare(hyper, found_inf)
    amp = _amp_args(hyper, scale, found_inf)
    absent = [None] * len(grads)
    for dtype, idx in _by_dtype(grads).items():
        table, chunks, n, aligned = tensor_table(_pick(params, idx), _pick(grads, idx), _pick(states1 or absent, idx),
                                                 _pick(states2 or absent, idx), _pick(group_ids, idx))
        if n:
            kernel[(n,)](table, chunks, hyper, **amp, HYPER_SLOTS=HYPER_SLOTS, DTYPE=_TL_DTYPES[dtype], ALIGNED=aligned,
                         BLOCK=BLOCK, num_warps=NUM_WARPS, **flags)


def sgd_step(hyper: torch.Tensor, params, grads, momentum_buffers, group_ids, *, has_momentum: bool,
             nesterov: bool, scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """In-place SGD update of ``params`` (contiguous) from ``grads``; buffers fp32 like params (or None)."""
    _launch_update(sgd_kernel, hyper, scale, found_inf, params, grads, momentum_buffers if has_momentum else None,
                   None, group_ids, HAS_MOMENTUM=has_momentum, NESTEROV=nesterov)


def adam_step(hyper: torch.Tensor, params, grads, exp_avgs, exp_avg_sqs, group_ids, *, decoupled: bool,
              scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """In-place Adam (decoupled=False) or AdamW update; exp_avgs/exp_avg_sqs fp32, params fp32/bf16/fp16."""
    _launch_update(adam_kernel, hyper, scale, found_inf, params, grads, exp_avgs, exp_avg_sqs, group_ids,
                   DECOUPLED=decoupled)


def rmsprop_step(hyper: torch.Tensor, params, grads, square_avgs, momentum_buffers, group_ids, *,
                 has_momentum: bool, scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """In-place RMSprop update (not centered); square_avgs (and momentum_buffers) fp32."""
    _launch_update(rmsprop_kernel, hyper, scale, found_inf, params, grads, square_avgs,
                   momentum_buffers if has_momentum else None, group_ids, HAS_MOMENTUM=has_momentum)


def adagrad_step(hyper: torch.Tensor, params, grads, state_sums, group_ids, *, scale: torch.Tensor | None = None,
                 found_inf: torch.Tensor | None = None) -> None:
    """In-place Adagrad update; state_sums fp32."""
    _launch_update(adagrad_kernel, hyper, scale, found_inf, params, grads, state_sums, None, group_ids)


def lion_step(hyper: torch.Tensor, params, grads, exp_avgs, group_ids, *, scale: torch.Tensor | None = None,
              found_inf: torch.Tensor | None = None) -> None:
    """In-place Lion update; exp_avgs fp32."""
    _launch_update(lion_kernel, hyper, scale, found_inf, params, grads, exp_avgs, None, group_ids)


def _grad_tables(grads) -> dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, int, bool]]:
    """tensor_table of the gradients alone, per dtype."""
    tables = {}
    for dt, idx in _by_dtype(grads).items():
        picked = _pick(grads, idx)
        absent = [None] * len(picked)
        tables[dt] = tensor_table(absent, picked, absent, absent, [0] * len(picked))
    return tables


def amp_unscale_(scale: torch.Tensor, grads, found_inf: torch.Tensor, found_total: torch.Tensor, *,
                 write: bool) -> None:
    """Set found_inf and found_total (fp32 [1]) to 1 if any grad holds inf/NaN; write: grads /= scale in place.

    The flags are only ever raised here (the caller zeroes found_inf first; found_total collects
    every optimizer's check until ``amp_update_scale_`` reads and clears it).
    """
    for dt, (table, chunks, n, aligned) in _grad_tables(grads).items():
        if n:
            amp_unscale_kernel[(n,)](table, chunks, scale, found_inf, found_total, DTYPE=_TL_DTYPES[dt], WRITE=write,
                                     ALIGNED=aligned, BLOCK=BLOCK, num_warps=NUM_WARPS)


def amp_update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_total: torch.Tensor, *,
                      growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    """torch's dynamic loss-scale update, on the device (one program); found_total is cleared."""
    amp_update_scale_kernel[(1,)](scale, growth_tracker, found_total, float(growth_factor), float(backoff_factor),
                                  int(growth_interval))


def clip_grad_norm_(norm_out: torch.Tensor, grads, max_norm: float, inf_norm: bool, eps: float = 1e-6) -> torch.Tensor:
    """Total norm of ``grads`` into norm_out (fp32, 1 element); grads scaled in place by min(max_norm/(norm+eps), 1)."""
    tables = _grad_tables(grads)
    total = sum(n for _, _, n, _ in tables.values())
    partial = torch.empty(max(total, 1), dtype=torch.float32, device=norm_out.device)
    if total == 0:
        partial.fill_(0.0)
    start = 0
    for dt, (table, chunks, n, aligned) in tables.items():
        if n:
            grad_norm_partial_kernel[(n,)](table, chunks, partial[start:], DTYPE=_TL_DTYPES[dt], INF_NORM=inf_norm,
                                           ALIGNED=aligned, BLOCK=BLOCK, num_warps=NUM_WARPS)
        start += n
    coef = torch.empty(1, dtype=torch.float32, device=norm_out.device)
    grad_norm_finish_kernel[(1,)](partial, max(total, 1), norm_out, coef, float(max_norm), float(eps),
                                  INF_NORM=inf_norm, BLOCK=1024)
    for dt, (table, chunks, n, aligned) in tables.items():
        if n:
            scale_grads_kernel[(n,)](table, chunks, coef, DTYPE=_TL_DTYPES[dt], ALIGNED=aligned, BLOCK=BLOCK,
                                     num_warps=NUM_WARPS)
    return norm_out
