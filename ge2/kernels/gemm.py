"""GEMM with a fused epilogue, and the fused first half of its backward.

Forward (``gemm``)::

    Z = alpha * op(A) @ op(B) + beta * C + bias        op = identity or transpose
    Y = act(Z)                                          Z is also written when asked

One Triton kernel, ``gemm_epilogue_kernel``, does it: a tiled GEMM (grouped tile order so that
neighbouring programs share A/B tiles in L2) whose accumulator never leaves registers before the
epilogue (alpha, beta*C, bias, activation, cast) is applied and Y (and Z) are stored. Operands are
addressed through their strides, so transposed views, expanded (stride-0) batches and sliced
inputs need no copy; ``trans_a``/``trans_b`` only swap the two strides of an operand.

Backward (``gemm_backward``) is two steps:

1. ``bias_act_backward_kernel``: one pass over gY that computes gZ = gY * act'(Z or Y), writes gZ
   (and dC = beta * gZ), and reduces gZ per tile into a partial-sum buffer for the bias gradient;
   ``sum_partials_kernel`` then adds the partials in a fixed order. No atomics: the bias gradient
   is bitwise reproducible run to run.
2. dA = alpha * gZ @ op(B)^T and dB = alpha * op(A)^T @ gZ with the same GEMM kernel, written
   straight into dA's / dB's own layout (for trans_a, dA^T = op(B) @ gZ^T is computed instead, so
   the output is contiguous without a transpose pass). An operand whose batch stride is 0 (an
   expanded broadcast) gets its gradient summed over the batch inside the GEMM's reduction loop.

Numerics: bf16/fp16 operands go to the tensor cores with fp32 accumulation; the epilogue runs in
fp32 (fp64 for fp64 inputs). fp32 operands use ``ge2.runtime.get_matmul_precision()``: "ieee"
(exact fp32 FMA), "tf32" or "tf32x3" (Triton's 3-pass error-compensated tf32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ge2 import runtime
from ge2.kernels import activations
from ge2.kernels.activations import act_fwd, act_grad_from_y, act_grad_from_z

BIAS_KINDS: dict[str, int] = {"none": 0, "scalar": 1, "per_m": 2, "per_n": 3}

# ---------------------------------------------------------------------------------------------
# Config space (Hopper). 16-bit operands: wgmma tiles 128x128..128x256 with a 64-deep K step and
# 3-4 smem stages (a 128x256x64 bf16 stage is 48 KB; 3 fit in the 228 KB of an H100 SM). fp32
# (tf32) operands halve the K step to keep the same bytes per stage. Small problems get the
# 64-wide tiles so that 512x784-class outputs still fill the 132 SMs.
# ---------------------------------------------------------------------------------------------


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
                         num_warps=warps, num_stages=stages)


CONFIGS_16BIT = [
    _cfg(128, 256, 64, 8, 3),
    _cfg(128, 128, 64, 8, 4),
    _cfg(128, 128, 64, 4, 4),
    _cfg(256, 128, 64, 8, 3),
    _cfg(64, 128, 64, 4, 4),
    _cfg(64, 64, 64, 4, 4),
]
CONFIGS_FP32 = [
    _cfg(128, 256, 32, 8, 3),
    _cfg(128, 128, 32, 8, 4),
    _cfg(128, 128, 32, 4, 4),
    _cfg(64, 128, 32, 4, 4),
    _cfg(64, 64, 32, 4, 4),
]
# Problems under this many multiply-adds are launch-bound: one small config, no tuning.
SMALL_PROBLEM = 1 << 24
SMALL_CONFIG = _cfg(64, 64, 32, 4, 3)
# The interpreter runs one pinned config: small enough to be quick on tiny test shapes.
INTERPRETER_CONFIG = _cfg(32, 32, 32, 4, 1, group_m=4)


def _prune(configs, named_args, **_kwargs):
    """Keep the configs that suit the operand dtype and the problem size."""
    M, N, K, B = named_args["M"], named_args["N"], named_args["K"], named_args["B"]
    if M * N * K * B < SMALL_PROBLEM:
        return [SMALL_CONFIG]
    wide = named_args["a_ptr"].element_size() <= 2
    return [c for c in configs if (c in CONFIGS_16BIT) == wide] or [SMALL_CONFIG]


def _even_k(args) -> bool:
    return args["K"] % args["BLOCK_K"] == 0


@triton.jit
def _tile_dot(acc, a_ptrs, b_ptrs, K, stride_ak, stride_bk,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc += A[BLOCK_M, K] @ B[K, BLOCK_N], walking K in BLOCK_K steps."""
    offs_k = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:  # the interpreter cannot do 16-bit arithmetic; exact products either way
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@runtime.autotune(
    CONFIGS_16BIT + CONFIGS_FP32,
    key=["M", "N", "K", "B", "REDUCE_BATCH"],
    default=INTERPRETER_CONFIG,
    prune_configs_by={"early_config_prune": _prune},
)
@triton.heuristics({"EVEN_K": _even_k})
@triton.jit
def gemm_epilogue_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr,
    M, N, K, B,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_yb, stride_ym, stride_yn,
    stride_bias,
    alpha, beta, act_alpha,
    HAS_C: tl.constexpr, BIAS_KIND: tl.constexpr, ACT: tl.constexpr, SAVE_Z: tl.constexpr,
    REDUCE_BATCH: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """Y[b] = act(alpha * A[b] @ B[b] + beta * C[b] + bias) for one BLOCK_M x BLOCK_N tile.

    grid = (tiles, batch); with REDUCE_BATCH, grid = (tiles, 1) and the batch is summed inside
    the reduction loop (Y = sum_b A[b] @ B[b]), which is how a broadcast operand's gradient is made.
    """
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)  # batch offsets can pass 2**31 elements
    # Grouped order: GROUP_M row-tiles share each column-tile of B while it is hot in L2.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_in_group = GROUP_M * num_pid_n
    first_m = (pid // pids_in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % pids_in_group) % group_rows)
    pid_n = (pid % pids_in_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge wrap around (their results are masked at the store), so the
    # main loop's loads need no M/N masks.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    a_tile = offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_tile = offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    if REDUCE_BATCH:
        for bb in range(0, B):
            acc = _tile_dot(acc, a_ptr + bb.to(tl.int64) * stride_ab + a_tile,
                            b_ptr + bb.to(tl.int64) * stride_bb + b_tile, K, stride_ak, stride_bk,
                            BLOCK_K, EVEN_K, PRECISION, UPCAST)
    else:
        acc = _tile_dot(acc, a_ptr + pid_b * stride_ab + a_tile, b_ptr + pid_b * stride_bb + b_tile,
                        K, stride_ak, stride_bk, BLOCK_K, EVEN_K, PRECISION, UPCAST)

    # Epilogue, in the accumulator's precision.
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z = acc * alpha
    if HAS_C:
        c = tl.load(c_ptr + pid_b * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
        z += beta * c.to(acc.dtype)
    if BIAS_KIND == 1:
        z += tl.load(bias_ptr).to(acc.dtype)
    elif BIAS_KIND == 2:
        z += tl.load(bias_ptr + offs_m * stride_bias, mask=offs_m < M, other=0.0).to(acc.dtype)[:, None]
    elif BIAS_KIND == 3:
        z += tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(acc.dtype)[None, :]
    y_offs = pid_b * stride_yb + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    if SAVE_Z:
        tl.store(z_ptr + y_offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    y = act_fwd(z, ACT, act_alpha)
    tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return runtime.get_matmul_precision()
    return "ieee"  # ignored by tl.dot for 16-bit operands; the only choice for fp64


def _operand_strides(t: torch.Tensor, trans: bool) -> tuple[int, int, int]:
    """(batch, row, col) strides of op(t) for a 2-D or 3-D t; transposing only swaps two strides."""
    sb = t.stride(0) if t.dim() == 3 else 0
    s0, s1 = t.stride(-2), t.stride(-1)
    return (sb, s1, s0) if trans else (sb, s0, s1)


def _launch(a_view, b_view, y, *, z=None, c=None, bias=None, bias_kind=0, act=0, act_alpha=0.01,
            alpha=1.0, beta=0.0, reduce_batch=False) -> None:
    """Launch the kernel on op(A) = a_view ([B, M, K] strides) and op(B) = b_view ([B, K, N] strides).

    ``a_view``/``b_view`` are (tensor, (stride_b, stride_row, stride_col), batch, rows, cols);
    ``y`` (and ``z``) are [B, M, N] (or [M, N]) tensors of any strides.
    """
    a, (sab, sam, sak), batch, M, K = a_view
    b, (sbb, sbk, sbn), _, _, N = b_view
    ys = (y.stride(0) if y.dim() == 3 else 0, y.stride(-2), y.stride(-1))
    cs = (c.stride(0) if c.dim() == 3 else 0, c.stride(-2), c.stride(-1)) if c is not None else (0, 0, 0)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),
                         1 if reduce_batch else batch)
    gemm_epilogue_kernel[grid](
        a, b, c if c is not None else y, bias if bias is not None else y, y, z if z is not None else y,
        M, N, K, batch,
        sab, sam, sak, sbb, sbk, sbn, *cs, *ys,
        bias.stride(0) if bias is not None and bias.dim() == 1 else 0,
        float(alpha), float(beta), float(act_alpha),
        HAS_C=c is not None, BIAS_KIND=bias_kind, ACT=act, SAVE_Z=z is not None,
        REDUCE_BATCH=reduce_batch, PRECISION=_precision(a.dtype),
        UPCAST=runtime.is_interpreter() and a.element_size() <= 2,
        ACC_DTYPE=tl.float64 if a.dtype == torch.float64 else tl.float32,
    )


def _view(t: torch.Tensor, trans: bool):
    """(tensor, strides of op(t), batch, rows, cols) of op(t)."""
    rows, cols = (t.shape[-1], t.shape[-2]) if trans else (t.shape[-2], t.shape[-1])
    return t, _operand_strides(t, trans), (t.shape[0] if t.dim() == 3 else 1), rows, cols


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
         trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0,
         bias_kind: str = "none", act: str = "none", act_alpha: float = 0.01, save_z: bool = False,
         out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Y, Z) with Z = alpha*op(a)@op(b) + beta*c + bias, Y = act(Z): [M, N] or [B, M, N], contiguous.

    Z is returned (else None) only when ``save_z`` and backward of ``act`` needs Z (gelu, silu).
    Inputs are assumed validated by the op schema (``ge2.backend.gemm``).
    """
    code = activations.act_code("gemm", act, act_alpha)
    av, bv = _view(a, trans_a), _view(b, trans_b)
    M, N = av[3], bv[4]
    shape = (a.shape[0], M, N) if a.dim() == 3 else (M, N)
    dtype = out_dtype or a.dtype
    y = torch.empty(shape, dtype=dtype, device=a.device)
    z = torch.empty_like(y) if save_z and activations.needs_z(code) else None
    has_c = c is not None and beta != 0.0  # BLAS semantics: beta == 0 means C is not read
    bias = bias.reshape(-1) if bias is not None and bias_kind != "none" else None
    _launch(av, bv, y, z=z, c=c if has_c else None, bias=bias, bias_kind=BIAS_KINDS[bias_kind],
            act=code, act_alpha=act_alpha, alpha=alpha, beta=beta)
    return y, z
