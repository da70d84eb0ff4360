"""Recurrences of RNN (tanh / relu), LSTM and GRU layers: one direction of one layer over all steps.

The input projection ``gx = x @ W_ih^T + b_ih`` of every step is one GEMM, done by the caller.
What is left is the sequential part, per step t (gates in torch's order):

    rnn:  h = act(gx + W_hh h_prev + b_hh)
    lstm: i, f, g, o = sig, sig, tanh, sig (gx + W_hh h_prev + b_hh);  c = f c_prev + i g;  h = o tanh(c)
    gru:  r, z = sig(gx_rz + W_hz,rz h_prev + b_hh_rz);  hn = W_hn h_prev + b_hn
          n = tanh(gx_n + r hn);  h = (1 - z) n + z h_prev

Two ways to run it, with the same per-step cell code (``_fwd_cell`` / ``_bwd_cell``):

* **persistent**: one launch for all steps. Program p owns hidden units [p BH, (p+1) BH) and keeps
  the W_hh rows of those units (all gates: a [4 BH, H] tile) in registers for the whole launch; per
  step it reads the full h_prev from a double-buffered global exchange buffer, does one dot, the
  fused cell, writes its units of h and meets the other programs at a grid-wide barrier (an atomic
  counter). The grid never exceeds the SM count, so every program is resident and the barrier
  cannot deadlock. Backward is the same with W_hh^T column tiles and dgates as the exchange.
* **stepwise** (fallback where the tile does not fit the register budget, and the Triton
  interpreter, which runs programs one after the other so a barrier among several would spin for
  ever): forward, one launch a step (``h_prev @ W_hh^T`` over K chunks, the cell in its epilogue);
  backward, one GEMM ``dgates @ W_hh`` and one fused-cell launch a step.

Variable lengths: with ``lengths`` a row b is active at step s while s < len_b; inactive steps
carry the state through, write 0 to y and receive no gradient. The reverse direction walks row b
from t = len_b - 1 down to 0, so step s of row b touches time ``tt = len_b - 1 - s`` (and the
padding steps map to tt = s, keeping the map a bijection). Saved tensors are indexed by tt.

Buffers (all contiguous): gx [T, B, NG H]; y [T, B, H]; hp / cp [T, B, H] (state before step tt);
sv [T, B, NS H] (activated gates: lstm i f g o, gru r z n hn, rnn h); hbuf [2, B, H] exchange;
cbuf [B, H] (fp32 cell state); dgh [T, B, NG H] the gradient of the recurrent pre-activations (gru:
its n slot is d(hn)) and dgx (gru only: the n slot is d(gx_n)); dgbuf [2, B, NG H] exchange.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ge2.kernels.activations import sigmoid, tanh
from ge2.kernels.gemm import _precision, _sm_count, gemm

MODES = {"rnn_tanh": 0, "rnn_relu": 1, "lstm": 2, "gru": 3}
GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # gate rows per hidden unit in W_ih / W_hh
SAVED = {0: 1, 1: 1, 2: 4, 3: 4}  # saved slots per unit (gru keeps hn = W_hn h + b_hn too)

# A persistent program holds its W_hh tile in registers; 32K 32-bit registers is half an SM's file,
# 64 per thread at 16 warps. Bigger tiles would spill to local memory every step: stepwise instead.
TILE_REGS = 32 * 1024


# ----------------------------------------------------------------------------------------------
# per-step cell code shared by both paths


@triton.jit
def _rows(s, b, T, B, len_ptr, HAS_LEN: tl.constexpr, REVERSE: tl.constexpr):
    """(active, tt) for batch rows b at step s."""
    if HAS_LEN:
        n = tl.load(len_ptr + b, mask=b < B, other=0)
    else:
        n = T + b * 0
    active = s < n
    if REVERSE:
        tt = tl.where(active, n - 1 - s, s)
    else:
        tt = s + b * 0
    return active, tt


@triton.jit
def _fwd_bias(bhh_ptr, u, H, MODE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """b_hh of units u, one tile per gate (zeros without bias); loop-invariant, so the persistent kernel loads it once."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    if HAS_BIAS:
        b0 = tl.load(bhh_ptr + u, mask=u < H, other=0.0).to(tl.float32)
    else:
        b0 = tl.zeros_like(u).to(tl.float32)
    b1 = b0
    b2 = b0
    b3 = b0
    if HAS_BIAS:
        if NG > 1:
            b1 = tl.load(bhh_ptr + H + u, mask=u < H, other=0.0).to(tl.float32)
            b2 = tl.load(bhh_ptr + 2 * H + u, mask=u < H, other=0.0).to(tl.float32)
        if NG == 4:
            b3 = tl.load(bhh_ptr + 3 * H + u, mask=u < H, other=0.0).to(tl.float32)
    return b0, b1, b2, b3


@triton.jit
def _fwd_loads(s, u, b, T, B, H, gx_ptr, hbuf_ptr, cbuf_ptr, len_ptr,
               MODE: tl.constexpr, HAS_LEN: tl.constexpr, REVERSE: tl.constexpr):
    """The step's inputs that do not depend on the other programs (gx, own h_prev, c_prev), issued before
    h_prev's exchange load so their latency overlaps it: (active, tt, x0..x3, h_prev, c_prev)."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    m = (u < H) & (b < B)
    active, tt = _rows(s, b, T, B, len_ptr, HAS_LEN, REVERSE)
    gx = gx_ptr + (tt.to(tl.int64) * B + b) * (NG * H) + u
    ub = b * H + u  # offset of (b, u) in a [B, H] buffer
    x0 = tl.load(gx, mask=m, other=0.0).to(tl.float32)
    x1 = x0
    x2 = x0
    x3 = x0
    if NG > 1:
        x1 = tl.load(gx + H, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(gx + 2 * H, mask=m, other=0.0).to(tl.float32)
    if NG == 4:
        x3 = tl.load(gx + 3 * H, mask=m, other=0.0).to(tl.float32)
    h_prev = tl.load(hbuf_ptr + (s % 2) * B * H + ub, mask=m, other=0.0).to(tl.float32)
    c_prev = h_prev
    if MODE == 2:
        c_prev = tl.load(cbuf_ptr + ub, mask=m, other=0.0)
    return active, tt, x0, x1, x2, x3, h_prev, c_prev


@triton.jit
def _fwd_cell(s, a0, a1, a2, a3, x0, x1, x2, x3, h_prev, c_prev, active, tt, u, b, T, B, H,
              hbuf_ptr, cbuf_ptr, y_ptr, hn_ptr, cn_ptr, hp_ptr, cp_ptr, sv_ptr,
              MODE: tl.constexpr, SAVE: tl.constexpr):
    """One step for units u x rows b (either orientation) from ``_fwd_loads``' inputs and the recurrent
    pre-activations a0..a3 = W_hh,g h_prev + b_hh,g."""
    NS: tl.constexpr = 4 if MODE >= 2 else 1
    m = (u < H) & (b < B)
    ub = b * H + u
    p0 = x0 + a0
    c = c_prev
    if MODE == 0:
        h = tanh(p0)
    elif MODE == 1:
        h = tl.maximum(p0, 0.0)
    else:
        p1 = x1 + a1
        if MODE == 2:
            g0 = sigmoid(p0)
            g1 = sigmoid(p1)
            g2 = tanh(x2 + a2)
            g3 = sigmoid(x3 + a3)
            c = g1 * c_prev + g0 * g2
            h = g3 * tanh(c)
            c = tl.where(active, c, c_prev)
            tl.store(cbuf_ptr + ub, c, mask=m)
        else:
            g0 = sigmoid(p0)  # r
            g1 = sigmoid(p1)  # z
            g3 = a2           # hn: W_hn h_prev + b_hn, kept for backward's dr
            g2 = tanh(x2 + g0 * g3)
            h = (1.0 - g1) * g2 + g1 * h_prev
    h = tl.where(active, h, h_prev)
    tl.store(hbuf_ptr + (1 - s % 2) * B * H + ub, h.to(hbuf_ptr.dtype.element_ty), mask=m)
    row = (tt.to(tl.int64) * B + b) * H + u
    tl.store(y_ptr + row, tl.where(active, h, 0.0).to(y_ptr.dtype.element_ty), mask=m)
    if SAVE:
        tl.store(hp_ptr + row, h_prev.to(hp_ptr.dtype.element_ty), mask=m)
        sv = sv_ptr + (tt.to(tl.int64) * B + b) * (NS * H) + u
        if MODE <= 1:
            tl.store(sv, h, mask=m)
        else:
            tl.store(sv, g0, mask=m)
            tl.store(sv + H, g1, mask=m)
            tl.store(sv + 2 * H, g2, mask=m)
            tl.store(sv + 3 * H, g3, mask=m)
            if MODE == 2:
                tl.store(cp_ptr + row, c_prev, mask=m)
    if s == T - 1:
        tl.store(hn_ptr + ub, h.to(hn_ptr.dtype.element_ty), mask=m)
        if MODE == 2:
            tl.store(cn_ptr + ub, c.to(cn_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd_loads(s, u, b, T, B, H, dy_ptr, len_ptr, hp_ptr, cp_ptr, sv_ptr,
               MODE: tl.constexpr, HAS_LEN: tl.constexpr, REVERSE: tl.constexpr):
    """The step's inputs that no other program writes (dy, the saved gates q0..q3, lstm c_prev / gru h_prev
    as prev), so the persistent kernel can issue them before the barrier: (active, tt, dy, q0..q3, prev)."""
    NS: tl.constexpr = 4 if MODE >= 2 else 1
    m = (u < H) & (b < B)
    active, tt = _rows(s, b, T, B, len_ptr, HAS_LEN, REVERSE)
    row = (tt.to(tl.int64) * B + b) * H + u
    dy = tl.load(dy_ptr + row, mask=m & active, other=0.0).to(tl.float32)
    sv = sv_ptr + (tt.to(tl.int64) * B + b) * (NS * H) + u
    q0 = tl.load(sv, mask=m, other=0.0)
    q1 = q0
    q2 = q0
    q3 = q0
    prev = q0
    if NS == 4:
        q1 = tl.load(sv + H, mask=m, other=0.0)
        q2 = tl.load(sv + 2 * H, mask=m, other=0.0)
        q3 = tl.load(sv + 3 * H, mask=m, other=0.0)
    if MODE == 2:
        prev = tl.load(cp_ptr + row, mask=m, other=0.0)
    elif MODE == 3:
        prev = tl.load(hp_ptr + row, mask=m, other=0.0).to(tl.float32)
    return active, tt, dy, q0, q1, q2, q3, prev


@triton.jit
def _bwd_cell(rec, dhc, dcc, active, tt, dy, q0, q1, q2, q3, prev, s, u, b, B, H, dgh_ptr, dgx_ptr, dgbuf_ptr,
              MODE: tl.constexpr):
    """Backward of one step from ``_bwd_loads``' inputs, rec (= dgates_{s+1} W_hh, own units) and the carried
    dhc (the part of dh that bypassed W_hh) and dcc (lstm: dc); writes dgates, returns the new (dhc, dcc)."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    m = (u < H) & (b < B)
    G = NG * H
    dh = dy + rec + dhc
    dg = dgh_ptr + (tt.to(tl.int64) * B + b) * G + u
    ex = dgbuf_ptr + (s % 2) * B * G + b * G + u
    carry = tl.zeros_like(dh)
    dc_out = dcc
    if MODE <= 1:
        if MODE == 0:
            d0 = dh * (1.0 - q0 * q0)
        else:
            d0 = tl.where(q0 > 0.0, dh, 0.0)
        d0 = tl.where(active, d0, 0.0)
        tl.store(dg, d0.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(ex, d0.to(dgbuf_ptr.dtype.element_ty), mask=m)
    elif MODE == 2:
        gi, gf, gg, go, c_prev = q0, q1, q2, q3, prev
        tc = tanh(gf * c_prev + gi * gg)
        dc = dcc + dh * go * (1.0 - tc * tc)
        d0 = tl.where(active, dc * gg * gi * (1.0 - gi), 0.0)
        d1 = tl.where(active, dc * c_prev * gf * (1.0 - gf), 0.0)
        d2 = tl.where(active, dc * gi * (1.0 - gg * gg), 0.0)
        d3 = tl.where(active, dh * tc * go * (1.0 - go), 0.0)
        dc_out = tl.where(active, dc * gf, dcc)
        tl.store(dg, d0.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(dg + H, d1.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(dg + 2 * H, d2.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(dg + 3 * H, d3.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(ex, d0.to(dgbuf_ptr.dtype.element_ty), mask=m)
        tl.store(ex + H, d1.to(dgbuf_ptr.dtype.element_ty), mask=m)
        tl.store(ex + 2 * H, d2.to(dgbuf_ptr.dtype.element_ty), mask=m)
        tl.store(ex + 3 * H, d3.to(dgbuf_ptr.dtype.element_ty), mask=m)
    else:
        r, z, n, hn, h_prev = q0, q1, q2, q3, prev
        dan = dh * (1.0 - z) * (1.0 - n * n)
        d0 = tl.where(active, dan * hn * r * (1.0 - r), 0.0)
        d1 = tl.where(active, dh * (h_prev - n) * z * (1.0 - z), 0.0)
        d2 = tl.where(active, dan * r, 0.0)
        carry = dh * z
        tl.store(dg, d0.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(dg + H, d1.to(dgh_ptr.dtype.element_ty), mask=m)
        tl.store(dg + 2 * H, d2.to(dgh_ptr.dtype.element_ty), mask=m)
        gxr = dgx_ptr + (tt.to(tl.int64) * B + b) * G + u
        tl.store(gxr, d0.to(dgx_ptr.dtype.element_ty), mask=m)
        tl.store(gxr + H, d1.to(dgx_ptr.dtype.element_ty), mask=m)
        tl.store(gxr + 2 * H, tl.where(active, dan, 0.0).to(dgx_ptr.dtype.element_ty), mask=m)
        tl.store(ex, d0.to(dgbuf_ptr.dtype.element_ty), mask=m)
        tl.store(ex + H, d1.to(dgbuf_ptr.dtype.element_ty), mask=m)
        tl.store(ex + 2 * H, d2.to(dgbuf_ptr.dtype.element_ty), mask=m)
    # the part of dh_prev that bypasses W_hh: all of dh through a padding step, z dh in a gru step
    return tl.where(active, carry, dh), dc_out


@triton.jit
def _bwd_state(u, b, B, H, dhc_ptr, dcc_ptr, MODE: tl.constexpr):
    """The carried (dhc, dcc) of units u x rows b from their [B, H] fp32 buffers (dcc zeros unless lstm)."""
    m = (u < H) & (b < B)
    dhc = tl.load(dhc_ptr + b * H + u, mask=m, other=0.0)
    dcc = tl.zeros_like(dhc)
    if MODE == 2:
        dcc = tl.load(dcc_ptr + b * H + u, mask=m, other=0.0)
    return dhc, dcc


@triton.jit
def _bwd_final(rec, dhc, dcc, u, b, B, H, dh0_ptr, dc0_ptr, MODE: tl.constexpr):
    m = (u < H) & (b < B)
    ub = b * H + u
    tl.store(dh0_ptr + ub, (rec + dhc).to(dh0_ptr.dtype.element_ty), mask=m)
    if MODE == 2:
        tl.store(dc0_ptr + ub, dcc.to(dc0_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gate(acc3, g: tl.constexpr, NGP: tl.constexpr):
    """Gate g's [BH, BB] slice of a [NGP, BH, BB] product (a masked sum: Triton cannot index a dim)."""
    sel = tl.arange(0, NGP)[:, None, None] == g
    return tl.sum(tl.where(sel, acc3, 0.0), axis=0)


@triton.jit
def _grid_arrive(sync_ptr):
    """The first half of ``_grid_sync``: count this program in (its stores of this step released)."""
    tl.debug_barrier()  # every thread's stores of this step are issued before the release below
    tl.atomic_add(sync_ptr, 1, sem="release")


@triton.jit
def _grid_wait(sync_ptr, target):
    """The second half of ``_grid_sync``: spin until all programs of this step came."""
    while tl.atomic_add(sync_ptr, 0, sem="acquire") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _grid_sync(sync_ptr, target):
    """Grid-wide barrier: count arrivals on a global counter and spin until all programs of this step came."""
    _grid_arrive(sync_ptr)
    _grid_wait(sync_ptr, target)


# ----------------------------------------------------------------------------------------------
# persistent kernels


@triton.jit
def rnn_fwd_persistent_kernel(gx_ptr, w_ptr, bhh_ptr, hbuf_ptr, cbuf_ptr, len_ptr, y_ptr, hn_ptr, cn_ptr,
                              hp_ptr, cp_ptr, sv_ptr, sync_ptr, T, B, H,
                              MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LEN: tl.constexpr,
                              REVERSE: tl.constexpr, SAVE: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                              BATCH_M: tl.constexpr, EARLY_LOADS: tl.constexpr):
    """All T steps; program p keeps rows (gate g, unit p BH + i) of W_hh on chip as one [NGP BH, K] tile.

    BATCH_M: the dot is h_prev [BB, K] x W_hh^T [K, NGP BH] (batch rows as M: at BB = 64 a Hopper wgmma
    reading W^T straight from shared memory) instead of W_hh [NGP BH, K] x h_prev^T (M = NGP BH < 64: an
    mma.sync whose W fragments every warp re-loads from shared memory each round).
    EARLY_LOADS: the step's gx / own h_prev / c_prev loads are issued before the h exchange instead of after
    the dot. The compiler converts each of them to the dot's layout right where it is loaded (through shared
    memory, waiting on that load), so issued early they are six serial L2 round trips ahead of the exchange."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    NGP: tl.constexpr = 4 if NG > 1 else 1
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    r = tl.arange(0, NGP * BLOCK_H)
    g = r // BLOCK_H
    wu = pid * BLOCK_H + r % BLOCK_H
    k = tl.arange(0, BLOCK_K)
    wrow = (g * H + wu)
    wm = (g < NG) & (wu < H)
    if BATCH_M:
        w = tl.load(w_ptr + wrow[None, :] * H + k[:, None], mask=wm[None, :] & (k < H)[:, None], other=0.0)
    else:
        w = tl.load(w_ptr + wrow[:, None] * H + k[None, :], mask=wm[:, None] & (k < H)[None, :], other=0.0)
    u = pid * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    c0, c1, c2, c3 = _fwd_bias(bhh_ptr, u, H, MODE, HAS_BIAS)
    for s in range(T):
        for b0 in range(0, B, BLOCK_B):
            b = b0 + tl.arange(0, BLOCK_B)[None, :]
            if EARLY_LOADS:
                active, tt, x0, x1, x2, x3, h_prev, c_prev = _fwd_loads(s, u, b, T, B, H, gx_ptr, hbuf_ptr, cbuf_ptr,
                                                                        len_ptr, MODE, HAS_LEN, REVERSE)
            # all of h_prev; .cg reads L2, where the other SMs' stores of the last step are
            hb = hbuf_ptr + (s % 2) * B * H
            if BATCH_M:
                bm = b0 + tl.arange(0, BLOCK_B)[:, None]
                h_t = tl.load(hb + bm * H + k[None, :], mask=(bm < B) & (k[None, :] < H), other=0.0,
                              cache_modifier=".cg")
                acc = tl.trans(tl.dot(h_t.to(w.dtype), w, input_precision=PRECISION))
            else:
                h_t = tl.load(hb + b * H + k[:, None], mask=(b < B) & (k[:, None] < H), other=0.0,
                              cache_modifier=".cg")
                acc = tl.dot(w, h_t.to(w.dtype), input_precision=PRECISION)
            if not EARLY_LOADS:
                active, tt, x0, x1, x2, x3, h_prev, c_prev = _fwd_loads(s, u, b, T, B, H, gx_ptr, hbuf_ptr, cbuf_ptr,
                                                                        len_ptr, MODE, HAS_LEN, REVERSE)
            if NGP == 1:
                a0 = acc + c0
                a1 = a0
                a2 = a0
                a3 = a0
            else:
                acc3 = tl.reshape(acc, (NGP, BLOCK_H, BLOCK_B))
                a0 = _gate(acc3, 0, NGP) + c0
                a1 = _gate(acc3, 1, NGP) + c1
                a2 = _gate(acc3, 2, NGP) + c2
                a3 = _gate(acc3, 3, NGP) + c3
            _fwd_cell(s, a0, a1, a2, a3, x0, x1, x2, x3, h_prev, c_prev, active, tt, u, b, T, B, H, hbuf_ptr,
                      cbuf_ptr, y_ptr, hn_ptr, cn_ptr, hp_ptr, cp_ptr, sv_ptr, MODE, SAVE)
        _grid_sync(sync_ptr, nprog * (s + 1))


@triton.jit
def _dgates_dot(w_ptr, ex_ptr, u, b, B, H, G, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """dgates_{s+1} W_hh for own units: [BH, BB] = sum over k < NG H of W_hh[k, u] dgates[b, k], the gates
    folded into K (W_hh's rows are gate-major already). W_hh is read again every step: it stays in L1/L2
    (a program's [NG H, BH] slice), where registers could not hold it (a dot operand is replicated per warp)."""
    acc = tl.zeros((BLOCK_H, BLOCK_B), dtype=tl.float32)
    for k0 in range(0, G, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        wt = tl.load(w_ptr + k[None, :] * H + u, mask=(u < H) & (k[None, :] < G), other=0.0)
        dg = tl.load(ex_ptr + b * G + k[:, None], mask=(b < B) & (k[:, None] < G), other=0.0, cache_modifier=".cg")
        acc = tl.dot(wt, dg.to(wt.dtype), acc, input_precision=PRECISION)
    return acc


@triton.jit
def rnn_bwd_persistent_kernel(w_ptr, len_ptr, dy_ptr, hp_ptr, cp_ptr, sv_ptr, dhc_ptr, dcc_ptr,
                              dgh_ptr, dgx_ptr, dgbuf_ptr, dh0_ptr, dc0_ptr, sync_ptr, T, B, H,
                              MODE: tl.constexpr, HAS_LEN: tl.constexpr, REVERSE: tl.constexpr,
                              BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                              PRECISION: tl.constexpr, EARLY_LOADS: tl.constexpr):
    """All T steps backwards; program (p, q) owns units p and batch rows q. Batch rows never mix, so only
    the programs of one row block meet at a barrier (a counter per row block). dhc / dcc stay in registers.

    EARLY_LOADS: step s-1's cell inputs (``_bwd_loads``) are issued at the end of step s, once this program has
    counted itself in at the barrier (so their latency neither delays its arrival nor follows the dot), and
    carried through the loop; the compiler converts them to the dot's layout where they are used, after
    the next dot, instead of right after each load (one L2 / HBM wait each, in series, after the dot)."""
    nprog = tl.num_programs(0)
    u = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)[None, :]
    sync = sync_ptr + tl.program_id(1) * 32  # one counter per row block, a 128-byte line each
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    G = NG * H
    dhc, dcc = _bwd_state(u, b, B, H, dhc_ptr, dcc_ptr, MODE)
    active, tt, dy, q0, q1, q2, q3, prev = _bwd_loads(T - 1, u, b, T, B, H, dy_ptr, len_ptr, hp_ptr, cp_ptr,
                                                      sv_ptr, MODE, HAS_LEN, REVERSE)
    for i in range(T):
        s = T - 1 - i
        rec = tl.zeros((BLOCK_H, BLOCK_B), dtype=tl.float32)
        if i > 0:
            rec = _dgates_dot(w_ptr, dgbuf_ptr + ((s + 1) % 2) * B * G, u, b, B, H, G, BLOCK_H, BLOCK_B, BLOCK_K,
                              PRECISION)
        if not EARLY_LOADS:
            active, tt, dy, q0, q1, q2, q3, prev = _bwd_loads(s, u, b, T, B, H, dy_ptr, len_ptr, hp_ptr, cp_ptr,
                                                              sv_ptr, MODE, HAS_LEN, REVERSE)
        dhc, dcc = _bwd_cell(rec, dhc, dcc, active, tt, dy, q0, q1, q2, q3, prev, s, u, b, B, H, dgh_ptr, dgx_ptr,
                             dgbuf_ptr, MODE)
        _grid_arrive(sync)
        if EARLY_LOADS:  # step s-1's (the last step reloads step 0's, unused), in flight while the others arrive
            active, tt, dy, q0, q1, q2, q3, prev = _bwd_loads(tl.maximum(s - 1, 0), u, b, T, B, H, dy_ptr, len_ptr,
                                                              hp_ptr, cp_ptr, sv_ptr, MODE, HAS_LEN, REVERSE)
        _grid_wait(sync, nprog * (i + 1))
    rec = _dgates_dot(w_ptr, dgbuf_ptr, u, b, B, H, G, BLOCK_H, BLOCK_B, BLOCK_K, PRECISION)
    _bwd_final(rec, dhc, dcc, u, b, B, H, dh0_ptr, dc0_ptr, MODE)


# ----------------------------------------------------------------------------------------------
# stepwise kernels (one launch per step, after a GEMM for the recurrent product)


@triton.jit
def rnn_fwd_step_kernel(s, rec_ptr, gx_ptr, bhh_ptr, hbuf_ptr, cbuf_ptr, len_ptr, y_ptr, hn_ptr, cn_ptr,
                        hp_ptr, cp_ptr, sv_ptr, T, B, H,
                        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LEN: tl.constexpr,
                        REVERSE: tl.constexpr, SAVE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr):
    """Step s given rec = h_prev @ W_hh^T [B, NG H]."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    u = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)[None, :]
    m = (u < H) & (b < B)
    rp = rec_ptr + b * (NG * H) + u
    c0, c1, c2, c3 = _fwd_bias(bhh_ptr, u, H, MODE, HAS_BIAS)
    active, tt, x0, x1, x2, x3, h_prev, c_prev = _fwd_loads(s, u, b, T, B, H, gx_ptr, hbuf_ptr, cbuf_ptr, len_ptr,
                                                            MODE, HAS_LEN, REVERSE)
    a0 = tl.load(rp, mask=m, other=0.0).to(tl.float32) + c0
    a1 = a0
    a2 = a0
    a3 = a0
    if NG > 1:
        a1 = tl.load(rp + H, mask=m, other=0.0).to(tl.float32) + c1
        a2 = tl.load(rp + 2 * H, mask=m, other=0.0).to(tl.float32) + c2
        if NG == 4:
            a3 = tl.load(rp + 3 * H, mask=m, other=0.0).to(tl.float32) + c3
    _fwd_cell(s, a0, a1, a2, a3, x0, x1, x2, x3, h_prev, c_prev, active, tt, u, b, T, B, H, hbuf_ptr, cbuf_ptr,
              y_ptr, hn_ptr, cn_ptr, hp_ptr, cp_ptr, sv_ptr, MODE, SAVE)


@triton.jit
def rnn_fwd_step_dot_kernel(s, gx_ptr, w_ptr, bhh_ptr, hbuf_ptr, cbuf_ptr, len_ptr, y_ptr, hn_ptr, cn_ptr,
                            hp_ptr, cp_ptr, sv_ptr, T, B, H,
                            MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LEN: tl.constexpr,
                            REVERSE: tl.constexpr, SAVE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr,
                            BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """Step s in one launch: program (j, q) computes h_prev[rows q] @ W_hh[units j, every gate]^T over K chunks
    (batch rows as M, one accumulator per gate) and runs the cell on its [BB, BH] block in the epilogue.

    Where W_hh does not fit on chip it is read from L2 every step; many small programs (BH units each) spread
    those reads over all SMs, where one [B, NG H] GEMM of 64-128 wide tiles would keep most of them idle."""
    NG: tl.constexpr = 4 if MODE == 2 else (3 if MODE == 3 else 1)
    u = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)[None, :]
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)[:, None]
    hb = hbuf_ptr + (s % 2) * B * H
    acc0 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        h_t = tl.load(hb + b * H + k[None, :], mask=(b < B) & (k[None, :] < H), other=0.0)
        h_t = h_t.to(w_ptr.dtype.element_ty)
        # W_hh^T's [BK, BH] chunk of gate g: element (k, u) is W_hh[g H + u, k], k contiguous (K-major)
        wp = w_ptr + u * H + k[:, None]
        wm = (u < H) & (k[:, None] < H)
        acc0 = tl.dot(h_t, tl.load(wp, mask=wm, other=0.0), acc0, input_precision=PRECISION)
        if NG > 1:
            acc1 = tl.dot(h_t, tl.load(wp + H * H, mask=wm, other=0.0), acc1, input_precision=PRECISION)
            acc2 = tl.dot(h_t, tl.load(wp + 2 * H * H, mask=wm, other=0.0), acc2, input_precision=PRECISION)
        if NG == 4:
            acc3 = tl.dot(h_t, tl.load(wp + 3 * H * H, mask=wm, other=0.0), acc3, input_precision=PRECISION)
    c0, c1, c2, c3 = _fwd_bias(bhh_ptr, u, H, MODE, HAS_BIAS)
    active, tt, x0, x1, x2, x3, h_prev, c_prev = _fwd_loads(s, u, b, T, B, H, gx_ptr, hbuf_ptr, cbuf_ptr, len_ptr,
                                                            MODE, HAS_LEN, REVERSE)
    a0 = acc0 + c0
    a1 = a0
    a2 = a0
    a3 = a0
    if NG > 1:
        a1 = acc1 + c1
        a2 = acc2 + c2
    if NG == 4:
        a3 = acc3 + c3
    _fwd_cell(s, a0, a1, a2, a3, x0, x1, x2, x3, h_prev, c_prev, active, tt, u, b, T, B, H, hbuf_ptr, cbuf_ptr,
              y_ptr, hn_ptr, cn_ptr, hp_ptr, cp_ptr, sv_ptr, MODE, SAVE)


@triton.jit
def rnn_bwd_step_kernel(s, rec_ptr, len_ptr, dy_ptr, hp_ptr, cp_ptr, sv_ptr, dhc_ptr, dcc_ptr,
                        dgh_ptr, dgx_ptr, dgbuf_ptr, dh0_ptr, dc0_ptr, T, B, H,
                        MODE: tl.constexpr, HAS_REC: tl.constexpr, FINAL: tl.constexpr, HAS_LEN: tl.constexpr,
                        REVERSE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr):
    """Backward step s given rec = dgates_{s+1} @ W_hh [B, H] (FINAL: write dh0 / dc0 instead)."""
    u = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)[None, :]
    rec = tl.zeros((BLOCK_H, BLOCK_B), dtype=tl.float32)
    if HAS_REC:
        rec = tl.load(rec_ptr + b * H + u, mask=(u < H) & (b < B), other=0.0).to(tl.float32)
    dhc, dcc = _bwd_state(u, b, B, H, dhc_ptr, dcc_ptr, MODE)
    if FINAL:
        _bwd_final(rec, dhc, dcc, u, b, B, H, dh0_ptr, dc0_ptr, MODE)
    else:
        active, tt, dy, q0, q1, q2, q3, prev = _bwd_loads(s, u, b, T, B, H, dy_ptr, len_ptr, hp_ptr, cp_ptr,
                                                          sv_ptr, MODE, HAS_LEN, REVERSE)
        dhc, dcc = _bwd_cell(rec, dhc, dcc, active, tt, dy, q0, q1, q2, q3, prev, s, u, b, B, H, dgh_ptr, dgx_ptr,
                             dgbuf_ptr, MODE)
        m = (u < H) & (b < B)
        tl.store(dhc_ptr + b * H + u, dhc, mask=m)
        if MODE == 2:
            tl.store(dcc_ptr + b * H + u, dcc, mask=m)


# ----------------------------------------------------------------------------------------------
# launchers


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _interpreted(device: torch.device) -> bool:
    return device.type != "cuda"


def persistent_plan(H: int, mode: int, dtype: torch.dtype, device: torch.device, backward: bool,
                    sms: int | None = None):
    """(grid, BLOCK_H, BLOCK_K, num_warps) of the persistent kernel, or None where it does not apply.

    Forward, the line: one program's W_hh tile [NGP BH, H] must fit ``TILE_REGS`` 32-bit registers,
    with BH the fewest units per program that keeps the grid within the SM count (and dot's 16-row
    minimum). Backward (W_hh streamed from L1/L2 every step, BLOCK_K a K chunk of NG H): BH = 16 units
    per program, as long as the unit blocks fit the SM count (the launcher adds row blocks within it).
    Under the interpreter only a single program (grid 1) qualifies: it has no one to wait for. ``sms``
    overrides the device's SM count (tests).
    """
    ng = GATES[mode]
    ngp = 4 if ng > 1 else 1
    if sms is None:
        sms = 1 if _interpreted(device) else _sm_count(device)
    if backward:
        bh = max(16, _pow2(-(-H // sms)))
        grid = -(-H // bh)
        return None if grid > sms else (grid, bh, min(BWD_BLOCK_K, max(16, _pow2(ng * H))), 4)
    bk = max(16, _pow2(H))
    bh = max(16 // ngp, _pow2(-(-H // sms)))
    grid = -(-H // bh)
    if grid > sms:
        return None
    regs = ngp * bh * bk * dtype.itemsize // 4
    if regs > TILE_REGS:
        return None
    warps = 4 if regs <= 4096 else (8 if regs <= 16384 else 16)
    return grid, bh, bk, warps


def _block_b(B: int, bk: int, rows: int = 1) -> int:
    """Batch rows per dot: the streamed h (or dgates) operand [rows K, BB] within 16K elements (64 a thread)."""
    bb = 16
    while bb < min(64, _pow2(B)) and rows * bk * bb * 2 <= 16384:
        bb *= 2
    return bb


# The backward's default path (None in rnn_backward): "auto" is the persistent kernel except where the
# H100 measured the stepwise one faster (docs/rnn.md: 16-bit layers with NG H > 2048, e.g. a bf16 LSTM at 1024).
BACKWARD_PATH = "auto"
# The persistent forward's dot: h_prev [64 rows, K] x W_hh^T where BLOCK_K >= FWD_BATCH_M_MIN_K and it fits shared
# memory, else W_hh x h_prev^T in rounds of _block_b rows. The H100 measured the first 1.8x faster at hidden 1024
# (bf16) and slower at 256 / 512 (docs/rnn.md). FWD_BATCH_M = False turns it off (tests, benchmarks).
FWD_BATCH_M = True
FWD_BATCH_M_MIN_K = 1024
# The persistent forward's step loads before the h exchange (EARLY_LOADS) or after the dot; "auto": early only
# where a step takes more than one round of rows (docs/rnn.md, session 19: at one round, early loads made hidden
# 256 slower). True / False force one form (tests, benchmarks).
FWD_EARLY_LOADS: bool | str = "auto"
# The stepwise forward: one fused launch a step (rnn_fwd_step_dot_kernel) or, with FWD_STEP_FUSED = False, a GEMM
# and a cell launch a step (benchmarks). FWD_STEP_CONFIG overrides fwd_step_config's pick (benchmarks).
FWD_STEP_FUSED = True
FWD_STEP_CONFIG: tuple[int, int, int, int, int] | None = None
# The persistent backward's cell inputs issued before the barrier of the step ahead (EARLY_LOADS) or after the
# dot. "auto": early (docs/rnn.md, session 19: after the dot the compiler converted each load to the dot's layout
# right where it was loaded, eight serial L2 / HBM waits a step). True / False force one form (tests, benchmarks).
BWD_EARLY_LOADS: bool | str = "auto"
BWD_BLOCK_K = 256  # K chunk of the persistent backward's per-step dot (W_hh read from L1/L2 chunk by chunk)
_BLOCK_B: dict[tuple, int] = {}  # (pass, H, mode, dtype, B, precision) -> BLOCK_B that compiled; 0: none did


def auto_backward_path(H: int, mode: int, dtype: torch.dtype) -> str:
    """The backward's path by default: persistent, except 16-bit layers with NG H > 2048, where the H100
    measured the stepwise one (a cuBLAS-rate GEMM per step) faster than the persistent dot's K loop."""
    return "persistent" if dtype.itemsize >= 4 or GATES[mode] * H <= 2048 else "stepwise"


def fwd_step_config(H: int, B: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(BLOCK_H, BLOCK_B, BLOCK_K, num_warps, num_stages) of the fused stepwise forward: 16 units a program
    (dot's minimum: the most programs to spread W_hh's L2 reads over), up to 64 batch rows (a wgmma's M, so
    each W slice is read once a step), K chunks of 128 bytes in 4 pipeline stages. The H100 measured it best
    of six configs at fp32 hidden 1024 (docs/rnn.md, session 19: a grid of 64 x 1 programs there)."""
    if FWD_STEP_CONFIG is not None:
        return FWD_STEP_CONFIG
    return 16, min(64, max(16, _pow2(B))), min(128 // dtype.itemsize, max(16, _pow2(H))), 4, 4


def bwd_row_blocks(grid: int, B: int, sms: int) -> list[int]:
    """BLOCK_B candidates of the persistent backward, best first: the fewest rows per program (the most
    programs, the least work a step each) whose grid (``grid`` unit blocks x row blocks) stays within
    ``sms`` (every program resident: the barrier cannot deadlock), then bigger row blocks (fewer programs)
    in case the compiler cannot fit one."""
    bb = 16
    while grid * -(-B // bb) > sms and bb < B:
        bb *= 2
    if grid * -(-B // bb) > sms:
        return []
    out = [bb]
    while bb < B:
        bb *= 2
        out.append(bb)
    return out


def _launch_persistent(kernel, key: tuple, bb: int, grid: int, *args, smallest: int = 16, **meta) -> bool:
    """Launch with the largest BLOCK_B in [smallest, bb] whose shared memory fits (halving on OutOfResources);
    False if none."""
    bb = _BLOCK_B.get(key, bb)
    while bb >= smallest:
        try:
            kernel[(grid,)](*args, **meta, BLOCK_B=bb)
            _BLOCK_B[key] = bb
            return True
        except OutOfResources:
            bb //= 2
    _BLOCK_B[key] = 0
    return False


def rnn_forward(gx: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor | None, h0: torch.Tensor,
                c0: torch.Tensor | None, lengths: torch.Tensor | None, *, mode: int, reverse: bool,
                save: bool, path: str | None = None):
    """One direction: gx [T, B, NG H], w_hh [NG H, H], h0/c0 [B, H] -> (y, hn, cn, hp, cp, sv).

    y [T, B, H]; hn, cn [B, H] (cn None unless lstm); hp, cp, sv the saved tensors (None unless
    save). ``path``: "persistent" | "stepwise" | None (the persistent one where it fits).
    """
    T, B, G = gx.shape
    H = w_hh.shape[1]
    dev, dt = gx.device, gx.dtype
    lstm = mode == 2
    key = ("fwd", H, mode, dt, B, _precision(dt))
    plan = None if path == "stepwise" or _BLOCK_B.get(key) == 0 else persistent_plan(H, mode, dt, dev, backward=False)
    if path == "persistent" and plan is None:
        raise ValueError(f"rnn: the persistent kernel does not fit hidden_size {H} on this device")
    gx, w_hh = gx.contiguous(), w_hh.contiguous()
    hbuf = torch.empty((2, B, H), dtype=dt, device=dev)
    hbuf[0].copy_(h0)
    cbuf = torch.empty((B, H), dtype=torch.float32, device=dev)
    if lstm:
        cbuf.copy_(c0)
    y = torch.empty((T, B, H), dtype=dt, device=dev)
    hn = torch.empty((B, H), dtype=dt, device=dev)
    cn = torch.empty((B, H), dtype=dt, device=dev) if lstm else None
    hp = torch.empty((T, B, H), dtype=dt, device=dev) if save else y
    cp = torch.empty((T, B, H), dtype=torch.float32, device=dev) if save and lstm else cbuf
    sv = torch.empty((T, B, SAVED[mode] * H), dtype=torch.float32, device=dev) if save else cbuf
    bias = b_hh if b_hh is not None else w_hh
    lens = lengths if lengths is not None else hbuf
    flags = dict(MODE=mode, HAS_BIAS=b_hh is not None, HAS_LEN=lengths is not None, REVERSE=bool(reverse),
                 SAVE=bool(save))
    if T == 0:
        hn.copy_(h0)
        if lstm:
            cn.copy_(c0)
    elif plan is not None:
        grid, bh, bk, warps = plan
        sync = torch.zeros(1, dtype=torch.int32, device=dev)
        args = (gx, w_hh, bias, hbuf, cbuf, lens, y, hn, cn if lstm else hn, hp, cp, sv, sync, T, B, H)
        meta = dict(**flags, BLOCK_H=bh, BLOCK_K=bk, PRECISION=_precision(dt))
        # batch rows as the dot's M (a wgmma at 64 rows, W^T read from shared memory) where h [64, K] and W^T
        # fit shared memory; one pipeline stage: the round loop has one trip at B <= 64, nothing to prefetch
        ok = FWD_BATCH_M and bk >= FWD_BATCH_M_MIN_K and _launch_persistent(
            rnn_fwd_persistent_kernel, key + ("batch_m",), 64, grid, *args, smallest=64, **meta, BATCH_M=True,
            EARLY_LOADS=FWD_EARLY_LOADS is not False, num_warps=8, num_stages=1)
        if not ok:
            bb = _block_b(B, bk)
            early = B > bb if FWD_EARLY_LOADS == "auto" else bool(FWD_EARLY_LOADS)
            ok = _launch_persistent(rnn_fwd_persistent_kernel, key + (early,), bb, grid, *args, **meta,
                                    BATCH_M=False, EARLY_LOADS=early, num_warps=warps)
        if not ok:  # the compiler could not fit even the smallest tiles: take the stepwise path
            _BLOCK_B[key] = 0
            if path == "persistent":
                raise ValueError(f"rnn: the persistent kernel does not fit hidden_size {H} ({dt}) in shared memory")
            return rnn_forward(gx, w_hh, b_hh, h0, c0, lengths, mode=mode, reverse=reverse, save=save,
                               path="stepwise")
    elif FWD_STEP_FUSED:
        bh, bb, bk, warps, stages = fwd_step_config(H, B, dt)
        grid = (-(-H // bh), -(-B // bb))
        for s in range(T):
            rnn_fwd_step_dot_kernel[grid](s, gx, w_hh, bias, hbuf, cbuf, lens, y, hn, cn if lstm else hn, hp, cp, sv,
                                          T, B, H, **flags, BLOCK_H=bh, BLOCK_B=bb, BLOCK_K=bk,
                                          PRECISION=_precision(dt), num_warps=warps, num_stages=stages)
    else:
        bh, bb = 32, 32
        grid = (-(-H // bh), -(-B // bb))
        for s in range(T):
            rec, _ = gemm(hbuf[s % 2], w_hh, trans_b=True)
            rnn_fwd_step_kernel[grid](s, rec, gx, bias, hbuf, cbuf, lens, y, hn, cn if lstm else hn, hp, cp, sv,
                                      T, B, H, **flags, BLOCK_H=bh, BLOCK_B=bb)
    return y, hn, cn, (hp if save else None), (cp if save and lstm else None), (sv if save else None)


def rnn_backward(dy: torch.Tensor, dhn: torch.Tensor, dcn: torch.Tensor | None, w_hh: torch.Tensor,
                 lengths: torch.Tensor | None, hp: torch.Tensor, cp: torch.Tensor | None, sv: torch.Tensor, *,
                 mode: int, reverse: bool, path: str | None = None):
    """Backward of ``rnn_forward`` through time -> (dgx [T, B, NG H], dgh [T, B, NG H], dh0, dc0).

    ``path``: "persistent" | "stepwise" | None (stepwise: see the measurement below).
    dgx is the gradient of the input projection, dgh that of the recurrent pre-activations
    (W_hh h_prev + b_hh; the same tensor except for gru); dc0 None unless lstm. dW_hh = dgh^T hp
    and db_hh = sum(dgh) are left to one GEMM over all steps (the caller's).
    """
    T, B, H = dy.shape
    dev, dt = dy.device, w_hh.dtype
    ng = GATES[mode]
    lstm, gru = mode == 2, mode == 3
    key = ("bwd", H, mode, dt, B, _precision(dt))
    asked, path = path, path or BACKWARD_PATH
    if path == "auto":
        path = auto_backward_path(H, mode, dt)
    plan = persistent_plan(H, mode, dt, dev, backward=True) if path == "persistent" and _BLOCK_B.get(key) != 0 \
        else None
    if asked == "persistent" and plan is None:
        raise ValueError(f"rnn: the persistent backward kernel does not fit hidden_size {H} on this device")
    dy, w_hh = dy.contiguous(), w_hh.contiguous()
    dhc = torch.empty((B, H), dtype=torch.float32, device=dev)
    dhc.copy_(dhn)
    dcc = torch.zeros((B, H), dtype=torch.float32, device=dev)
    if lstm:
        dcc.copy_(dcn)
    dgh = torch.empty((T, B, ng * H), dtype=dt, device=dev)
    dgx = torch.empty((T, B, ng * H), dtype=dt, device=dev) if gru else dgh
    dgbuf = torch.empty((2, B, ng * H), dtype=dt, device=dev)
    dh0 = torch.empty((B, H), dtype=dt, device=dev)
    dc0 = torch.empty((B, H), dtype=dt, device=dev) if lstm else None
    lens = lengths if lengths is not None else dhc
    cp_ = cp if cp is not None else dhc
    flags = dict(MODE=mode, HAS_LEN=lengths is not None, REVERSE=bool(reverse))
    if T == 0:
        dh0.copy_(dhn)
        if lstm:
            dc0.copy_(dcn)
    elif plan is not None:
        grid, bh, bk, warps = plan
        ok = False
        sms = 1 if _interpreted(dev) else _sm_count(dev)
        for bb in [_BLOCK_B[key]] if key in _BLOCK_B else bwd_row_blocks(grid, B, sms):
            sync = torch.zeros(-(-B // bb) * 32, dtype=torch.int32, device=dev)
            try:
                rnn_bwd_persistent_kernel[(grid, -(-B // bb))](
                    w_hh, lens, dy, hp, cp_, sv, dhc, dcc, dgh, dgx, dgbuf, dh0, dc0 if lstm else dh0, sync, T, B, H,
                    **flags, BLOCK_H=bh, BLOCK_B=bb, BLOCK_K=bk, PRECISION=_precision(dt),
                    EARLY_LOADS=BWD_EARLY_LOADS is not False, num_warps=warps)
            except OutOfResources:
                continue
            _BLOCK_B[key] = bb
            ok = True
            break
        if not ok:
            _BLOCK_B[key] = 0
            if asked == "persistent":
                raise ValueError(f"rnn: the persistent backward kernel does not fit hidden_size {H} ({dt}) in "
                                 "shared memory")
            return rnn_backward(dy, dhn, dcn, w_hh, lengths, hp, cp, sv, mode=mode, reverse=reverse,
                                path="stepwise")
    else:
        bh, bb = 32, 32
        grid = (-(-H // bh), -(-B // bb))
        rec = dhc
        for i in range(T + 1):
            s = T - 1 - i
            if i > 0:
                rec, _ = gemm(dgbuf[(s + 1) % 2], w_hh)
            rnn_bwd_step_kernel[grid](max(s, 0), rec, lens, dy, hp, cp_, sv, dhc, dcc, dgh, dgx, dgbuf, dh0,
                                      dc0 if lstm else dh0, T, B, H, **flags, HAS_REC=i > 0, FINAL=i == T,
                                      BLOCK_H=bh, BLOCK_B=bb)
    return dgx, dgh, dh0, dc0
