"""Sampling from a model's next-token distribution on the device: top-k masking and a multinomial draw.

Both kernels give one program to each row of a [M, V] tensor and sweep the row in chunks of
``BLOCK``, so any vocabulary size works with the same code.

**top-k** (``topk_mask_kernel``): y = x where x >= (the k-th largest value of the row), else -inf.
The threshold is found by a radix select on the floats' bit patterns: each fp32 maps to an
integer key in [0, 2**32) that orders like the floats (flip the low 31 bits of negatives, then
shift by 2**31), and the threshold key is built from its top bit down, keeping a bit whenever at
least k keys of the row lie at or above the candidate. 32 counting sweeps, no sort and no
workspace. Ties at the threshold are all kept (what ``logits[logits < topk(logits, k)[0][:, -1:]]
= -inf`` keeps).

**multinomial** (``multinomial_kernel``): one index per row drawn with probability
p_i / sum(p) by inverting the CDF: u = rand(seed, offset + row) (ge2's Philox state, the scheme
of ``dropout``), then the first i with p_i > 0 whose running sum exceeds u * sum(p). The running
sum is fp32 (a chunk's inclusive scan plus the carry of the chunks before it). A row without a
positive entry draws -1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def order_key(x):
    """fp32 -> int64 key in [0, 2**32) with key(a) < key(b) exactly when a < b (-0 sorts below +0)."""
    bits = x.to(tl.int32, bitcast=True)
    # arithmetic shift: all ones for a negative float, so its magnitude bits flip (larger |x|, smaller key)
    signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return signed.to(tl.int64) + 2147483648


@triton.jit
def topk_mask_kernel(x_ptr, y_ptr, V, k, stride_xm, stride_xv, BLOCK: tl.constexpr):
    """y[row] = x[row] where x >= its k-th largest value, -inf elsewhere (y contiguous [M, V])."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    thresh = row * 0  # int64 scalar: the key bits fixed so far
    bit = thresh + 2147483648
    for _ in range(32):
        cand = thresh + bit
        count = 0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            live = offs < V
            x = tl.load(x_row + offs * stride_xv, mask=live, other=0.0).to(tl.float32)
            count += tl.sum(((order_key(x) >= cand) & live).to(tl.int32), axis=0)
        thresh = tl.where(count >= k, cand, thresh)
        bit = bit // 2
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        live = offs < V
        x = tl.load(x_row + offs * stride_xv, mask=live, other=0.0).to(tl.float32)
        y = tl.where(order_key(x) >= thresh, x, float("-inf"))
        tl.store(y_ptr + row * V + offs, y.to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def multinomial_kernel(p_ptr, out_ptr, state_ptr, V, stride_pm, stride_pv, BLOCK: tl.constexpr):
    """out[row] = one index drawn from p[row] / sum(p[row]) with u = rand(seed, offset + row)."""
    row = tl.program_id(0).to(tl.int64)
    p_row = p_ptr + row * stride_pm
    total = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        p = tl.load(p_row + offs * stride_pv, mask=offs < V, other=0.0).to(tl.float32)
        total += tl.sum(p, axis=0)
    seed = tl.load(state_ptr)
    base = tl.load(state_ptr + 1)
    target = tl.rand(seed, base + row) * total
    carry = 0.0
    pick = V
    last = -1
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        live = offs < V
        p = tl.load(p_row + offs * stride_pv, mask=live, other=0.0).to(tl.float32)
        positive = live & (p > 0.0)
        running = carry + tl.cumsum(p, axis=0)
        pick = tl.minimum(pick, tl.min(tl.where(positive & (running > target), offs, V), axis=0))
        last = tl.maximum(last, tl.max(tl.where(positive, offs, -1), axis=0))
        carry += tl.sum(p, axis=0)
    # u * sum can round to the total itself: then the last positive entry is the draw
    pick = tl.where(pick == V, last, pick)
    tl.store(out_ptr + row, pick.to(tl.int64))


def topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [M, V] (any strides) -> y [M, V] contiguous: the k largest of each row kept (ties too), the rest -inf."""
    M, V = x.shape
    y = torch.empty((M, V), dtype=x.dtype, device=x.device)
    if M and V:
        topk_mask_kernel[(M,)](x, y, V, k, x.stride(0), x.stride(1), BLOCK=min(BLOCK, triton.next_power_of_2(V)))
    return y


def multinomial(p: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """p [M, V] non-negative weights (any strides) -> int64 [M]: one draw per row from state = [seed, offset]
    (read, not advanced)."""
    M, V = p.shape
    out = torch.empty((M,), dtype=torch.int64, device=p.device)
    if M:
        multinomial_kernel[(M,)](p, out, state, V, p.stride(0), p.stride(1),
                                 BLOCK=min(BLOCK, triton.next_power_of_2(max(V, 1))))
    return out
