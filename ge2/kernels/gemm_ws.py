"""The Hopper GEMM with a warp-specialised schedule, written in Gluon: a TMA producer warpgroup and two
consumer partitions that take turns (ping-pong), so that one's epilogue runs under the other's MMAs.

Same contract as ``gemm.gemm_tma_kernel`` (Y = act(alpha * op(A) @ op(B) + bias), Z kept when
asked) for 16-bit operands on sm_90; ``gemm._launch`` chooses it. Why: a persistent Triton kernel
issues the next tile's wgmma only after its epilogue, so a gelu epilogue (15-32 instructions an
element) leaves the tensor cores idle (docs/gemm.md). Triton 3.6 does not warp-specialise on sm_90;
Gluon states the schedule explicitly:

* the loader (one warpgroup, one thread issuing) walks this program's tiles and their K-steps in order and fills a ring of
  STAGES shared-memory slots by TMA, each slot with a `ready` barrier (TMA bytes arrived) and an
  `empty` one (its MMAs finished);
* consumer c (4 or 8 warps each, c = 0, 1) takes the program's tiles c, c + 2, ...: for each, wgmma
  over the K-steps (one in flight, the slot of the one before released), then the epilogue in
  registers and a TMA store through its own output buffer. The loader fills tiles in order, so
  consumer 1's first MMAs wait behind consumer 0's last loads: the two fall into turns by
  themselves, one in its epilogue while the other multiplies. libdevice's erf-gelu epilogue (~32
  instructions an element in the sm_90 SASS) took ~3.7x a 768-deep tile's MMAs on 4 warps (clock64
  stamps, H100), so configs with 8-warp consumers (64 accumulator rows a warpgroup) halve each
  thread's share, and the fp32 gelu now goes through ``activations.normal_cdf`` (15 instructions).

Gluon runs only on the GPU (no interpreter), so the Triton kernels stay the reference path and the
CPU tests' path; tests/test_gemm_ws.py compares this kernel with torch on the GPU.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ge2 import runtime
from ge2.kernels.activations import act_fwd
from ge2.kernels.gemm import _tile_coords as tile_coords

# On by default on sm_90 (GE2_GEMM_WS=0 turns it off). H100, GPT-2 small's GEMMs in graph replays
# (docs/gemm.md "Warp-specialised"): with both operands K-major it is 0.99-1.16x the Triton kernel
# (the erf-gelu + Z forward 1.16x); with an MN-major operand 0.85-0.99x, so those stay with Triton.
USE_WS = os.environ.get("GE2_GEMM_WS", "1") == "1"
KMAJOR_ONLY = True  # tests turn it off to run the kernel's MN-major operand paths
WS_MIN_PROBLEM = 1 << 27  # M*N*K below this: too few tiles for two consumers per SM to pay
_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


@functools.lru_cache(maxsize=None)
def _smem_layout(shape: tuple[int, ...], dtype: torch.dtype):
    """The swizzled shared-memory layout of a TMA box (cached: building one costs ~20 us of Python)."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), _GL_DTYPES[dtype])


def _block_shapes(nargs) -> None:
    """Give the descriptors this config's block shapes and their shared-memory layouts."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    shapes = {"a_desc": [bm, bk] if nargs["A_KMAJOR"] else [bk, bm], "b_desc": [bn, bk] if nargs["B_KMAJOR"] else [bk, bn],
              "y_desc": [bm, bn], "z_desc": [bm, bn]}
    for name, shape in shapes.items():
        desc = nargs[name]
        desc.block_shape = shape
        desc.layout = _smem_layout(tuple(shape), desc.base.dtype)


def _ws_cfg(bm: int, bn: int, bk: int, stages: int, group_m: int = 8, warps: int = 4) -> triton.Config:
    """One consumer's tile (bm x bn, bk deep), the ring depth and the warps of each consumer (4 or 8)."""
    # registers a thread: the 128-thread loader keeps few, the consumers share the rest of the 64K
    regs = {4: (232, 40), 8: (120, 24)}[warps]
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "GROUP_M": group_m,
                          "CONSUMER_WARPS": warps, "CONSUMER_REGS": regs[0], "LOADER_REGS": regs[1]},
                         num_warps=warps, num_stages=1, pre_hook=_block_shapes)


# 128x128x64 bf16: a ring slot is 32 KB and each consumer's output buffer 32 KB (64 KB for fp32 Y).
SMEM_BYTES = 232448  # an H100 block's most dynamic shared memory (227 KB)
WS_CONFIGS = [
    _ws_cfg(128, 128, 64, 4),
    _ws_cfg(128, 128, 64, 3),
    _ws_cfg(128, 128, 64, 5),
    _ws_cfg(128, 128, 64, 4, group_m=16),
    _ws_cfg(64, 256, 64, 3),
    _ws_cfg(128, 128, 64, 4, warps=8),
    _ws_cfg(128, 128, 64, 3, warps=8),
]


@gluon.jit
def _ws_loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
               A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr):
    """Producer: every K-step of this program's tiles, in order, into the ring of slots."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    k_tiles = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, NUM_SMS):
        pid_m, pid_n = tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        for ki in range(k_tiles):
            s = it % STAGES
            # a fresh barrier counts as having completed the phase before 0: the first lap waits on nothing
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            k0 = ki * BLOCK_K
            if A_KMAJOR:
                tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(a_desc, [k0, m0], bar, a_bufs.index(s))
            if B_KMAJOR:
                tma.async_copy_global_to_shared(b_desc, [n0, k0], bar, b_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(b_desc, [k0, n0], bar, b_bufs.index(s))
            it += 1


@gluon.jit
def _scaled_biased(acc, alpha, bias_ptr, stride_bias, m0, n0, M, N, BIAS_KIND: gl.constexpr):
    """alpha * acc + bias for the [rows, cols] block of the output at (m0, n0)."""
    z = acc * alpha
    if BIAS_KIND == 1:
        z += gl.load(bias_ptr).to(gl.float32)
    elif BIAS_KIND == 2:
        offs_m = m0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc.type.layout))
        z += gl.load(bias_ptr + offs_m * stride_bias, mask=offs_m < M, other=0.0).to(gl.float32)[:, None]
    elif BIAS_KIND == 3:
        offs_n = n0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
        z += gl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(gl.float32)[None, :]
    return z


@gluon.jit
def _ws_consumer(a_bufs, b_bufs, ready, empty, turns, out_bufs, y_desc, z_desc, bias_ptr, M, N, K, stride_bias,
                 alpha, act_alpha, CONSUMER: gl.constexpr, BIAS_KIND: gl.constexpr, ACT: gl.constexpr,
                 SAVE_Z: gl.constexpr, A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr,
                 CONSUMER_WARPS: gl.constexpr):
    """Consumer CONSUMER: MMAs and epilogue of this program's tiles CONSUMER, CONSUMER + 2, ..."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    out = out_bufs.index(CONSUMER)
    k_tiles = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    it = CONSUMER * k_tiles  # the ring position of this consumer's first K-step
    t = 0
    for tile in range(gl.program_id(0) + CONSUMER * NUM_SMS, num_tiles, 2 * NUM_SMS):
        pid_m, pid_n = tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        # The consumers' main loops take turns in tile order. Without that, consumer 1 waited on a
        # slot's `ready` barrier a whole lap early, when a parity wait cannot tell the lap it wants
        # from the one before, and multiplied stale operands (H100: relative error 0.98).
        # Consumer 0's first wait passes at once (a fresh barrier's "previous" phase).
        mbarrier.wait(turns.index(CONSUMER), (t + 1 - CONSUMER) & 1)
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            a = a_bufs.index(s)
            if not A_KMAJOR:
                a = a.permute((1, 0))
            b = b_bufs.index(s)
            if B_KMAJOR:
                b = b.permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            # one MMA stays in flight; the one before it is done, so its slot goes back to the loader
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=ki > 0)
            it += 1
        mbarrier.arrive(turns.index(1 - CONSUMER))  # every slot of this tile claimed: the other's turn
        t += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k_tiles > 0)
        it += k_tiles  # skip the other consumer's tile

        # The epilogue a column half at a time, the bias loaded per half: fewer values live at once
        # (sm_90 build, erf-gelu + Z: a 4-warp consumer's ~200 spill stores a tile on the whole tile
        # fell to 3; an 8-warp one, at 104-120 registers, spills 24 bytes with a per-column bias, 144
        # with the bias added to the whole tile).
        z0, z1 = acc.reshape([BLOCK_M, 2, BLOCK_N // 2]).permute(0, 2, 1).split()
        z0 = _scaled_biased(z0, alpha, bias_ptr, stride_bias, m0, n0, M, N, BIAS_KIND)
        z1 = _scaled_biased(z1, alpha, bias_ptr, stride_bias, m0, n0 + BLOCK_N // 2, M, N, BIAS_KIND)
        left = out.slice(0, BLOCK_N // 2, dim=1)
        right = out.slice(BLOCK_N // 2, BLOCK_N // 2, dim=1)
        tma.store_wait(0)  # the previous tile's store has left the output buffer
        if SAVE_Z:
            left.store(z0.to(z_desc.dtype))
            right.store(z1.to(z_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(z_desc, [m0, n0], out)
            tma.store_wait(0)
        left.store(act_fwd(z0, ACT, act_alpha).to(y_desc.dtype))
        right.store(act_fwd(z1, ACT, act_alpha).to(y_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [m0, n0], out)
    tma.store_wait(0)


def _prune(configs, named_args, **kwargs):
    """Configs whose ring and two output buffers fit in an SM's shared memory."""
    args = {**named_args, **kwargs}
    return [c for c in configs if _smem_bytes(c.kwargs, args["OUT_BYTES"]) <= SMEM_BYTES]


def _smem_bytes(cfg: dict, out_bytes: int) -> int:
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    return cfg["STAGES"] * (bm + bn) * bk * 2 + 2 * bm * bn * out_bytes + 1024  # + barriers, bias scratch


@runtime.autotune(
    WS_CONFIGS,
    key=["M", "N", "K", "A_KMAJOR", "B_KMAJOR", "ACT", "SAVE_Z", "OUT_BYTES"],
    exact_keys=("ACT",),
    default=0,
    prune_configs_by={"early_config_prune": _prune},
)
@gluon.jit
def gemm_ws_kernel(a_desc, b_desc, y_desc, z_desc, bias_ptr, M, N, K, stride_bias, alpha, act_alpha,
                   BIAS_KIND: gl.constexpr, ACT: gl.constexpr, SAVE_Z: gl.constexpr, OUT_BYTES: gl.constexpr,
                   A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, NUM_SMS: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, CONSUMER_WARPS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   LOADER_REGS: gl.constexpr):
    """Y [M, N] = act(alpha * op(A) @ op(B) + bias) (and Z), 16-bit operands; grid = (programs <= SMs,)."""
    gl.static_assert(y_desc.dtype.primitive_bitwidth == 8 * OUT_BYTES)  # OUT_BYTES keys the tuning and pruning
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    out_bufs = gl.allocate_shared_memory(y_desc.dtype, [2] + y_desc.block_type.shape, y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    gl.warp_specialize([
        (_ws_consumer, (a_bufs, b_bufs, ready, empty, turns, out_bufs, y_desc, z_desc, bias_ptr, M, N, K, stride_bias, alpha,
                        act_alpha, 0, BIAS_KIND, ACT, SAVE_Z, A_KMAJOR, B_KMAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                        NUM_SMS, CONSUMER_WARPS)),
        (_ws_consumer, (a_bufs, b_bufs, ready, empty, turns, out_bufs, y_desc, z_desc, bias_ptr, M, N, K, stride_bias, alpha,
                        act_alpha, 1, BIAS_KIND, ACT, SAVE_Z, A_KMAJOR, B_KMAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                        NUM_SMS, CONSUMER_WARPS)),
        (_ws_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, A_KMAJOR, B_KMAJOR, BLOCK_M, BLOCK_N,
                      BLOCK_K, GROUP_M, NUM_SMS)),
    ], [CONSUMER_WARPS, 4], [CONSUMER_REGS, LOADER_REGS])  # the loader gets a whole warpgroup: with 1 warp, Triton 3.6 ran it on two (H100,
    # compute-sanitizer: two arrive.expect_tx per slot, a launch failure); registers are given per warpgroup anyway


def launch(operands, M: int, N: int, K: int, y: torch.Tensor, *, z: torch.Tensor | None,
           bias: torch.Tensor | None, bias_kind: int, act: int, act_alpha: float, alpha: float, num_sms: int) -> bool:
    """Run Y (and Z) [M, N] = act(alpha * op(A) @ op(B) + bias) here if this kernel applies; False if not.

    ``operands``: ``gemm._tma_operands`` of op(A), op(B) (the caller has them: TMA can read both). It
    applies on sm_90 to 16-bit K-major operands (``KMAJOR_ONLY``), outputs whose rows TMA can write,
    and problems with at least two 128x128 tiles per SM (fewer leave the second consumer idle: the
    Triton kernel, with its split tail, does better).
    """
    (a, a_shape, a_strides, a_kmajor), (b, b_shape, b_strides, b_kmajor) = operands
    if not USE_WS or a.dtype not in (torch.bfloat16, torch.float16) or M * N * K < WS_MIN_PROBLEM:
        return False
    if KMAJOR_ONLY and not (a_kmajor and b_kmajor):
        return False
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] != 9:
        return False
    if runtime.cdiv(M, 128) * runtime.cdiv(N, 128) < 2 * num_sms:
        return False
    outputs = [y] + ([z] if z is not None else [])
    if any(t.dim() != 2 or t.dtype not in _GL_DTYPES or t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16
           or t.data_ptr() % 16 for t in outputs):
        return False
    descs = [_descriptor(t, shape, strides) for t, shape, strides in
             ((a, a_shape, a_strides), (b, b_shape, b_strides), (y, [M, N], [y.stride(0), 1]))]
    descs.append(_descriptor(z, [M, N], [z.stride(0), 1]) if z is not None else descs[2])
    grid = lambda meta: (min(num_sms, runtime.cdiv(M, meta["BLOCK_M"]) * runtime.cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
    gemm_ws_kernel[grid](
        *descs, bias if bias is not None else y, M, N, K,
        bias.stride(0) if bias is not None and bias.dim() == 1 else 0, float(alpha), float(act_alpha),
        BIAS_KIND=bias_kind, ACT=act, SAVE_Z=z is not None, OUT_BYTES=y.element_size(),
        A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, NUM_SMS=num_sms,
    )
    return True


def _descriptor(t: torch.Tensor, shape: list[int], strides: list[int]):
    """A Gluon TMA descriptor of t; its block shape and layout are set per config (``_block_shapes``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [16, 16]
    return TensorDescriptor(t, shape, strides, block, _smem_layout(tuple(block), t.dtype))
