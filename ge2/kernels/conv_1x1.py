"""1x1 convolutions of NCHW tensors through TMA: Y[n] [K, H*W] = W [K, C] @ X[n] [C, H*W] (issue 26).

A 1x1 NCHW conv is a GEMM per image whose X operand has the pixels innermost: MN-major. The GEMM
module runs it batched through its pointer kernel (no TMA for batched problems), where tf32 meets
MN-major tiles that its wgmma cannot read from shared memory (tf32 takes K-major operands only):
36.6 us at 64x128x28^2 -> 128 against cuDNN's 24.7, for a problem that moves 51 MB (~17 us at
3 TB/s). ``conv1x1_nchw_kernel`` reads X by a 3-D TMA descriptor over [N, C, H*W] (one box a
(image, channel block, pixel block) step, zero-filled past C and H*W: no masks, tf32 rounding by
the copy engine) and writes Y by another over [N, K, H*W]:

* fp32 (tf32 / tf32x3): Y^T tile [pixels, out channels] += X^T [pixels, C] @ W^T [C, out]. X^T is
  wgmma's *first* operand, which may come from registers in any layout (the MN-major box is read
  out of shared memory into them); W [K, C] is K-major as it is, so the second operand stays in
  shared memory. No transposed copy of X, no on-chip transposing store.
* 16-bit: Y tile [out channels, pixels] += W [out, C] @ X [C, pixels]: 16-bit wgmma reads the
  MN-major X box from shared memory directly.

dX of the same conv is the same kernel on gZ [N, K, H*W] with W^T as the weight (``_weight_rows``'s
transposed rows: the reduction, K, innermost). Persistent configs loop over the tiles so that the
next tile's boxes stream in during this one's epilogue (the problem is memory-bound: every tile is
2 (16-bit) or 4 (fp32) short reduction steps at C = 128).

Measured (H100, CUDA-graph replays, 64x128x28^2 -> 128, A/B in one process): tf32 forward 36.9 ->
25.8 us (cuDNN 24.7), bf16 11.5 -> 8.9 (cuDNN 9.5). Triton 3.6 does not keep X^T in registers: it
copies each X box into a K-major shared-memory buffer (local_load, local_alloc) and waits for the
wgmma before the next step; the deeper pipelines (64x128 tiles, 6 stages: 25.7 us, against 35.6 for
128x128 with 3) hide that best. The floor is ~17 us (51 MB at 3 TB/s).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels.activations import act_fwd
from ge2.kernels.conv_framed import _descriptor, _weight_rows, tma_outer_strides
from ge2.kernels.gemm import _precision, _sm_count, _tma_sms

# off (GE2_CONV_1X1_TMA=0): NCHW 1x1 convs take the GEMM module's batched kernel (A/B comparisons)
ENABLED = os.environ.get("GE2_CONV_1X1_TMA", "1") != "0"


def _block_shapes(nargs) -> None:
    """The descriptors' box shapes follow the config (set before each launch)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [1, bk, bm]
    nargs["w_desc"].block_shape = [bn, bk]
    nargs["y_desc"].block_shape = [1, bn, bm]
    if nargs["z_desc"] is not None:
        nargs["z_desc"].block_shape = [1, bn, bm]


def _cfg(bm, bn, bk, warps, stages, persistent) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "PERSISTENT": persistent},
                         num_warps=warps, num_stages=stages, pre_hook=_block_shapes)


# (BLOCK_M pixels, BLOCK_N out channels, warps, stages, PERSISTENT programs per SM); 16-bit operands
# take 64-deep reduction steps, fp32 ones 32-deep (the same bytes a stage).
_TILES = [(128, 128, 4, 3, 1), (128, 128, 4, 4, 1), (128, 128, 8, 4, 1), (128, 128, 8, 3, 0), (64, 128, 4, 4, 2),
          (64, 128, 4, 6, 1), (128, 64, 4, 4, 2), (256, 128, 8, 2, 1), (64, 256, 8, 3, 1)]
CONFIGS_16 = [_cfg(bm, bn, 64, w, st, p) for bm, bn, w, st, p in _TILES]
CONFIGS_32 = [_cfg(bm, bn, 32, w, st, p) for bm, bn, w, st, p in _TILES]
INTERPRETER_CONFIG = _cfg(16, 16, 16, 4, 1, 1)


def _prune(configs, named_args, **kwargs):
    """The configs of the operand width, at most one power of two wider than the output channels."""
    a = {**named_args, **kwargs}
    space = CONFIGS_16 if a["OPERAND_BYTES"] <= 2 else CONFIGS_32
    k = triton.next_power_of_2(a["K"])
    return [c for c in configs if c in space and c.kwargs["BLOCK_N"] <= max(64, k)] or space[-1:]


@runtime.autotune(CONFIGS_16 + CONFIGS_32,
                  key=["Nb", "HW", "K", "C", "OPERAND_BYTES", "PRECISION", "ACT", "SAVE_Z"],
                  exact_keys=("ACT",), default=INTERPRETER_CONFIG,
                  prune_configs_by={"early_config_prune": _prune}, do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["Nb"])
def conv1x1_nchw_kernel(
    x_desc, w_desc, y_desc, z_desc, bias_ptr,
    Nb, HW, K, C, sbias, act_alpha,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    OPERAND_BYTES: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """[BLOCK_N out channels, BLOCK_M pixels] tiles of one image of Y = act(W @ X + bias): one a
    program, or (PERSISTENT) every num_programs-th, tile and step loops flattened.

    x_desc: X [N, C, H*W]; w_desc: W [K, C] (reduction innermost); y_desc, z_desc: [N, K, H*W].
    """
    if PERSISTENT:
        num_tiles = Nb * tl.cdiv(HW, BLOCK_M) * tl.cdiv(K, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
            _tile(tile, x_desc, w_desc, y_desc, z_desc, bias_ptr, HW, K, C, sbias, act_alpha, HAS_BIAS, ACT,
                  SAVE_Z, OPERAND_BYTES, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _tile(tl.program_id(0), x_desc, w_desc, y_desc, z_desc, bias_ptr, HW, K, C, sbias, act_alpha, HAS_BIAS,
              ACT, SAVE_Z, OPERAND_BYTES, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _tile(
    tile, x_desc, w_desc, y_desc, z_desc, bias_ptr, HW, K, C, sbias, act_alpha,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    OPERAND_BYTES: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Tile ``tile`` of conv1x1_nchw_kernel."""
    n_tiles = tl.cdiv(K, BLOCK_N)
    m_tiles = tl.cdiv(HW, BLOCK_M)
    # Output-channel tiles fastest: the programs that read one X box run side by side.
    n0 = (tile % n_tiles) * BLOCK_N
    rest = tile // n_tiles
    m0 = (rest % m_tiles) * BLOCK_M
    img = rest // m_tiles
    if OPERAND_BYTES == 4:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_K):
        # Channels past C: X's box is zero-filled there, and so is W's.
        x = x_desc.load([img, c0, m0]).reshape(BLOCK_K, BLOCK_M)
        w = w_desc.load([n0, c0])
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if OPERAND_BYTES == 4:  # tf32: the MN-major X^T as the register operand, W^T K-major in shared memory
            acc = tl.dot(x.T, w.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
        else:  # 16-bit wgmma reads the MN-major X box where TMA put it
            acc = tl.dot(w, x, acc, input_precision=PRECISION, out_dtype=tl.float32)
    if OPERAND_BYTES == 4:
        z = acc.T
    else:
        z = acc
    if HAS_BIAS:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        z += tl.load(bias_ptr + offs_n * sbias, mask=offs_n < K, other=0.0).to(tl.float32)[:, None]
    if SAVE_Z:
        z_desc.store([img, n0, m0], z.to(z_desc.dtype).reshape(1, BLOCK_N, BLOCK_M))
    # The copy engine drops what falls past K or H*W.
    y_desc.store([img, n0, m0], act_fwd(z, ACT, act_alpha).to(y_desc.dtype).reshape(1, BLOCK_N, BLOCK_M))


def _dims(t: torch.Tensor) -> tuple[list[int], list[int]] | None:
    """(shape, strides) of t [N, Ch, L] (pixels innermost) for a 3-D TMA descriptor, or None when TMA
    cannot read it so: unit pixel stride, base and outer strides 16-byte aligned. A size-1 dim's
    stride is never stepped: it gets an aligned one."""
    N, Ch, L = t.shape
    if t.data_ptr() % 16 or (L > 1 and t.stride(2) != 1):
        return None
    strides = tma_outer_strides([N, Ch, L], [t.stride(0), t.stride(1), 1], t.element_size())
    return None if strides is None else ([N, Ch, L], strides)


def supports(x: torch.Tensor, out_channels: int) -> bool:
    """Whether ``conv1x1_nchw`` takes the 1x1 conv of x [N, C, H*W] (NCHW, pixels merged: the GEMM
    view of ``conv.gemm_1x1_layout``) to ``out_channels``: TMA (Hopper, or the interpreter), 16-bit
    or tensor-core fp32, x readable by a 3-D descriptor, the output's rows 16-byte aligned."""
    if not ENABLED or x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.numel() == 0:
        return False
    if x.dtype == torch.float32 and _precision(x.dtype) == "ieee":  # CUDA-core dots: the GEMM's FMA tiles
        return False
    if (x.shape[2] * x.element_size()) % 16 or _dims(x) is None or out_channels == 0:
        return False
    return runtime.is_interpreter() or (x.is_cuda and _tma_sms(x.device) > 0)


def conv1x1_nchw(x: torch.Tensor, w_rows: torch.Tensor, out: torch.Tensor, z: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, code: int = 0, act_alpha: float = 0.01) -> None:
    """out [N, K, L] (unit pixel stride; and z) = act(W @ x[n] + bias) for x [N, C, L] as ``supports``
    allows and w_rows [K, Cs] with the reduction innermost (``conv_framed._weight_rows``)."""
    Nb, C, HW = x.shape
    K = out.shape[1]
    precision = _precision(x.dtype)
    round_tf32 = precision == "tf32" and not runtime.is_interpreter()
    x_desc, w_desc = _descriptor(x, round_tf32, *_dims(x)), _descriptor(w_rows, round_tf32)
    y_desc = _descriptor(out, False, *_dims(out))
    z_desc = _descriptor(z, False, *_dims(z)) if z is not None else None
    tiles = lambda meta: Nb * runtime.cdiv(HW, meta["BLOCK_M"]) * runtime.cdiv(K, meta["BLOCK_N"])  # noqa: E731
    grid = lambda meta: (min(tiles(meta), meta["PERSISTENT"] * _sm_count(x.device)) if meta["PERSISTENT"]  # noqa: E731
                         else tiles(meta),)
    conv1x1_nchw_kernel[grid](
        x_desc, w_desc, y_desc, z_desc, bias if bias is not None else out,
        Nb, HW, K, C, bias.stride(0) if bias is not None else 0, float(act_alpha),
        HAS_BIAS=bias is not None, ACT=code, SAVE_Z=z is not None,
        OPERAND_BYTES=x.element_size(), PRECISION=precision,
        UPCAST=runtime.is_interpreter() and x.element_size() == 2,
    )


# dW = sum_n gZ[n] [K, H*W] @ X[n]^T [H*W, C]: the reduction runs along the pixels, which both NCHW
# operands have innermost (K-major for tf32 too). The GEMM module's batched route wrote one fp32
# partial per image and ran one [K, C] tile an image (64 programs at batch 64); here the N*H*W
# pixels are cut into chunks of DW_CHUNK, spread over about one program per SM (``dw_splits``), and
# each split's [K, C] partial is added in a fixed order by ``gemm.sum_partials`` (deterministic).
# gZ and X are read as 2-D [N*Ch, H*W] rows (their images and channels merge): a box past an image's
# last channel reads the next image's rows, which only feed output rows/columns that are dropped.
DW_ENABLED = os.environ.get("GE2_CONV_1X1_DW", "1") != "0"  # off: the per-image partials
DW_CHUNK = tl.constexpr(128)  # pixels of one image a unit of work (a multiple of every config's BLOCK_K)


def _dw_cfg(bm, bn, bk, warps, stages) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages,
                         pre_hook=_dw_block_shapes)


def _dw_block_shapes(nargs) -> None:
    nargs["g_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["x_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


DW_CONFIGS_16 = [_dw_cfg(128, 128, 64, 8, 4), _dw_cfg(128, 128, 64, 4, 4), _dw_cfg(64, 128, 64, 4, 4)]
DW_CONFIGS_32 = [_dw_cfg(128, 128, 32, 8, 4), _dw_cfg(128, 128, 32, 4, 4), _dw_cfg(64, 128, 32, 4, 4)]
DW_INTERPRETER_CONFIG = _dw_cfg(16, 16, 16, 4, 1)


def _prune_dw(configs, named_args, **kwargs):
    a = {**named_args, **kwargs}
    return [c for c in configs if c in (DW_CONFIGS_16 if a["OPERAND_BYTES"] <= 2 else DW_CONFIGS_32)]


@runtime.autotune(DW_CONFIGS_16 + DW_CONFIGS_32, key=["Nb", "HW", "K", "C", "OPERAND_BYTES", "PRECISION", "UNITS"],
                  default=DW_INTERPRETER_CONFIG, prune_configs_by={"early_config_prune": _prune_dw},
                  do_bench=runtime.tuning_bench)
@triton.jit(do_not_specialize=["Nb"])
def conv1x1_nchw_dw_kernel(
    g_desc, x_desc, part_ptr, Nb, HW, K, C, UNITS,
    OPERAND_BYTES: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Split program_id(1)'s fp32 partial [K, C] tile program_id(0) of dW: the sum over its UNITS
    chunks of DW_CHUNK pixels of G[n*K + k, p] * X[n*C + c, p] (g_desc [N*K, H*W], x_desc [N*C, H*W])."""
    tiles_n = tl.cdiv(C, BLOCK_N)
    k0 = (tl.program_id(0) // tiles_n) * BLOCK_M
    c0 = (tl.program_id(0) % tiles_n) * BLOCK_N
    per_image = tl.cdiv(HW, DW_CHUNK)
    sub: tl.constexpr = DW_CHUNK // BLOCK_K
    u0 = tl.program_id(1) * UNITS
    steps = (tl.minimum(Nb * per_image, u0 + UNITS) - u0) * sub
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, steps):
        j = step // sub
        u = u0 + j
        img = u // per_image
        p0 = (u - img * per_image) * DW_CHUNK + (step - j * sub) * BLOCK_K
        g = g_desc.load([img * K + k0, p0])
        x = x_desc.load([img * C + c0, p0])
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            g = g.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(g, x.T, acc, input_precision=PRECISION, out_dtype=tl.float32)
    offs_k = k0 + tl.arange(0, BLOCK_M)
    offs_c = c0 + tl.arange(0, BLOCK_N)
    ptrs = part_ptr + tl.program_id(1).to(tl.int64) * K * C + offs_k[:, None] * C + offs_c[None, :]
    tl.store(ptrs, acc, mask=(offs_k[:, None] < K) & (offs_c[None, :] < C))


def _rows2d(t: torch.Tensor) -> torch.Tensor | None:
    """t [N, Ch, L] as [N*Ch, L] rows for a 2-D TMA descriptor (a view), or None when they do not merge."""
    N, Ch, L = t.shape
    if _dims(t) is None or (N > 1 and t.stride(0) != Ch * t.stride(1)):
        return None
    return t.as_strided((N * Ch, L), (t.stride(1) if Ch > 1 else t.stride(0), 1))


def dw_supports(gz: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``conv1x1_nchw_dw`` takes dW of gZ [N, K, L] and x [N, C, L] (as ``supports``, rows merged)."""
    return DW_ENABLED and supports(x, 1) and supports(gz, 1) and _rows2d(gz) is not None \
        and _rows2d(x) is not None


def dw_splits(units: int, device: torch.device) -> tuple[int, int]:
    """(splits, units a split): about one split per SM, none empty."""
    per = runtime.cdiv(units, max(1, min(units, _sm_count(device))))
    return runtime.cdiv(units, per), per


def conv1x1_nchw_dw(gz: torch.Tensor, x: torch.Tensor, dw: torch.Tensor) -> None:
    """dw [K, C] (contiguous) = sum over n and pixels of gz [N, K, L] x [N, C, L]^T, as ``dw_supports`` allows."""
    from ge2.kernels.gemm import sum_partials

    Nb, K, HW = gz.shape
    C = x.shape[1]
    precision = _precision(x.dtype)
    round_tf32 = precision == "tf32" and not runtime.is_interpreter()
    g_desc, x_desc = _descriptor(_rows2d(gz), round_tf32), _descriptor(_rows2d(x), round_tf32)
    splits, per = dw_splits(Nb * runtime.cdiv(HW, DW_CHUNK.value), x.device)
    part = dw if splits == 1 and dw.dtype == torch.float32 else \
        torch.empty((splits, K, C), dtype=torch.float32, device=x.device)
    grid = lambda meta: (runtime.cdiv(K, meta["BLOCK_M"]) * runtime.cdiv(C, meta["BLOCK_N"]), splits)  # noqa: E731
    conv1x1_nchw_dw_kernel[grid](
        g_desc, x_desc, part, Nb, HW, K, C, per,
        OPERAND_BYTES=x.element_size(), PRECISION=precision,
        UPCAST=runtime.is_interpreter() and x.element_size() == 2,
    )
    if part is not dw:
        sum_partials(part.view(splits, K * C), dw.view(-1))
