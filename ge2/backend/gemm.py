"""GEMM ops: schemas and Triton implementations (kernels in ``ge2.kernels.gemm``).

``gemm(a, b, c=None, bias=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
bias_kind="none", act="none", act_alpha=0.01, save_z=False, out_dtype=None) -> (y, z)``

    z = alpha * op(a) @ op(b) + beta * c + bias;  y = act(z)
    a: [M, K] ([K, M] if trans_a) or [B, M, K];  b: [K, N] ([N, K] if trans_b) or [B, K, N]
    (both 2-D or both 3-D, same B, same dtype; any strides, batch stride 0 included).
    c: y's shape (read only when beta != 0). bias_kind "none" | "scalar" (1 element) | "per_m"
    ([M]) | "per_n" ([N]). y: new contiguous [M, N] / [B, M, N] of out_dtype (default a's dtype).
    z: the pre-activation, same shape/dtype, only when save_z and ``activations.needs_z(act)``
    (gelu, gelu_tanh, silu); otherwise None, and backward recovers act' from y.

``gemm_backward(gy, a, b, z=None, y=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
bias_kind="none", act="none", act_alpha=0.01, has_c=False, need_a=True, need_b=True, db_dtype=None)
-> (da, db, dbias, dc)``

    gz = gy * act'(z) (act' from y for relu/leaky_relu/sigmoid/tanh/none: pass z for gelu,
    gelu_tanh, silu); da = alpha * gz @ op(b)^T laid out like a; db = alpha * op(a)^T @ gz laid
    out like b; dbias = sum of gz over everything but bias's axis ([1] scalar, [M] per_m, [N]
    per_n), None when bias_kind == "none"; dc = beta * gz (y's shape), None unless has_c.
    da/db are None when not needed. An operand with batch stride 0 (a broadcast expanded with
    ``expand``) gets its gradient summed over the batch, shape [1, ...]: reshape it back.
    New contiguous outputs; da/db/dc in the operands' dtype (db in ``db_dtype`` when given: an
    autocast weight's fp32 gradient straight from the accumulator), dbias in gy's dtype.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, dtype_name, shape_str
from ge2.kernels import activations, gemm as K

GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _op_shape(t: torch.Tensor, trans: bool) -> tuple[int, int]:
    return (t.shape[-1], t.shape[-2]) if trans else (t.shape[-2], t.shape[-1])


def _check_operands(op: str, a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool) -> tuple[int, ...]:
    """The shape of op(a) @ op(b); clear errors for rank, dtype, inner-dim and batch mismatches."""
    if a.dim() != b.dim():
        raise ValueError(f"{op}: a and b must both be 2-D or both 3-D, got a {shape_str(a.shape)} "
                         f"and b {shape_str(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: a and b must have the same dtype, got a {dtype_name(a.dtype)} "
                        f"and b {dtype_name(b.dtype)}")
    (M, Ka), (Kb, N) = _op_shape(a, trans_a), _op_shape(b, trans_b)
    if Ka != Kb:
        raise ValueError(f"{op}: inner dimensions differ: op(a) is {shape_str(_op_shape(a, trans_a))} "
                         f"(a {shape_str(a.shape)}, trans_a={trans_a}) but op(b) is "
                         f"{shape_str(_op_shape(b, trans_b))} (b {shape_str(b.shape)}, trans_b={trans_b})")
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"{op}: batch sizes differ: a {shape_str(a.shape)} and b {shape_str(b.shape)} "
                         "(expand a broadcast batch explicitly)")
    return (a.shape[0], M, N) if a.dim() == 3 else (M, N)


def _check_bias(op: str, bias: torch.Tensor | None, bias_kind: str, y_shape: tuple[int, ...]) -> None:
    if bias_kind not in K.BIAS_KINDS:
        raise ValueError(f"{op}: bias_kind must be one of {tuple(K.BIAS_KINDS)}, got {bias_kind!r}")
    if bias_kind == "none":
        if bias is not None:
            raise ValueError(f"{op}: bias {shape_str(bias.shape)} given but bias_kind is 'none' "
                             "(say 'scalar', 'per_m' or 'per_n')")
        return
    if bias is None:
        raise ValueError(f"{op}: bias_kind is {bias_kind!r} but bias is None")
    want = {"scalar": 1, "per_m": y_shape[-2], "per_n": y_shape[-1]}[bias_kind]
    if bias.numel() != want or (bias_kind != "scalar" and bias.dim() != 1):
        what = {"scalar": "1 element", "per_m": f"[{want}] (one per row, M={want})",
                "per_n": f"[{want}] (one per column, N={want})"}[bias_kind]
        raise ValueError(f"{op}: bias_kind {bias_kind!r} needs a bias of {what}, got bias "
                         f"{shape_str(bias.shape)} for y {shape_str(y_shape)}")


def _check_gemm(op: str, a, b, c=None, bias=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                bias_kind="none", act="none", act_alpha=0.01, save_z=False, out_dtype=None) -> None:
    y_shape = _check_operands(op, a, b, trans_a, trans_b)
    if c is not None and tuple(c.shape) != y_shape:
        raise ValueError(f"{op}: c has shape {shape_str(c.shape)} but op(a) @ op(b) is {shape_str(y_shape)}")
    _check_bias(op, bias, bias_kind, y_shape)
    activations.act_code(op, act, act_alpha)
    if out_dtype is not None and out_dtype not in GEMM_DTYPES:
        raise TypeError(f"{op}: out_dtype must be one of {', '.join(dtype_name(d) for d in GEMM_DTYPES)}, "
                        f"got {out_dtype}")


defop("gemm", Schema((
    TensorArg("a", GEMM_DTYPES, ndim=(2, 3)),
    TensorArg("b", GEMM_DTYPES, ndim=(2, 3)),
    TensorArg("c", GEMM_DTYPES, ndim=(2, 3), optional=True),
    TensorArg("bias", GEMM_DTYPES, ndim=(0, 1), optional=True),
), _check_gemm))
register("gemm", "triton", dtypes=GEMM_DTYPES)(K.gemm)


def _check_gemm_backward(op: str, gy, a, b, z=None, y=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                         bias_kind="none", act="none", act_alpha=0.01, has_c=False, need_a=True, need_b=True,
                         db_dtype=None) -> None:
    y_shape = _check_operands(op, a, b, trans_a, trans_b)
    for name, t in (("gy", gy), ("z", z), ("y", y)):
        if t is not None and tuple(t.shape) != y_shape:
            raise ValueError(f"{op}: {name} has shape {shape_str(t.shape)} but op(a) @ op(b) is {shape_str(y_shape)}")
    if bias_kind not in K.BIAS_KINDS:
        raise ValueError(f"{op}: bias_kind must be one of {tuple(K.BIAS_KINDS)}, got {bias_kind!r}")
    code = activations.act_code(op, act, act_alpha)
    if activations.needs_z(code) and z is None:
        raise ValueError(f"{op}: the {act} gradient needs z (the pre-activation; gemm(..., save_z=True)), got None")
    if code != activations.NONE and z is None and y is None:
        raise ValueError(f"{op}: the {act} gradient needs z or y, got neither")
    if db_dtype is not None and db_dtype not in GEMM_DTYPES:
        raise TypeError(f"{op}: db_dtype must be one of {', '.join(dtype_name(d) for d in GEMM_DTYPES)}, "
                        f"got {db_dtype}")


defop("gemm_backward", Schema((
    TensorArg("gy", GEMM_DTYPES, ndim=(2, 3)),
    TensorArg("a", GEMM_DTYPES, ndim=(2, 3)),
    TensorArg("b", GEMM_DTYPES, ndim=(2, 3)),
    TensorArg("z", GEMM_DTYPES, ndim=(2, 3), optional=True),
    TensorArg("y", GEMM_DTYPES, ndim=(2, 3), optional=True),
), _check_gemm_backward))
register("gemm_backward", "triton", dtypes=GEMM_DTYPES)(K.gemm_backward)
