"""Elementwise kernels: unary math, binary arithmetic and comparisons, where, and their gradients.

Every launcher takes torch tensors of any strides (0-strides of ``expand``, transposed or stepped
views) that broadcast NumPy-style, or Python scalars where noted, and returns new tensors of the
broadcast shape laid out as torch's would be (``memory_order``: channels-last in, channels-last out).

BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmod", "remainder", "atan2")
LOGICAL_OPS, BITWISE_OPS = logical_and/or/xor (bool result), bitwise_and/or/xor (integers and bool)
UNARY_OPS = neg exp log sqrt abs sign floor ceil trunc round log1p expm1 log2 exp2 rsqrt reciprocal
            square sin cos erf isnan isinf isfinite nan_to_num logical_not bitwise_not
TERNARY_OPS = ("clamp", "lerp", "addcmul", "addcdiv")
binary(op, a, b, *, alpha=1, rounding_mode=None) -> out   # a/b tensor or scalar; dtype =
                                     # schema.result_dtype(a, b) (div, atan2 of ints -> float32)
compare(op, a, b) -> bool out        # op in eq ne lt le gt ge
binary_backward(gy, a, b, *, op_name, need_a=True, need_b=True) -> (ga | None, gb | None)
                                     # grads reduced to a's / b's shapes and dtypes; None for scalars
unary(op, x, *, decimals=0, nan=0.0, posinf=None, neginf=None) -> y
unary_backward(gy, x=None, y=None, *, op_name) -> gx    # x or y as UNARY_GRAD_SAVES says
activation(x, *, act, alpha=0.01, beta=0, gamma=0) -> y # activations.ACTIVATIONS / POINTWISE_ACTIVATIONS
activation_backward(gy, x=None, y=None, *, act, alpha=0.01, beta=0, gamma=0) -> gx  # from y if x is None
ternary(op, a, b, c, *, value=1) -> out                 # clamp bounds may be None or scalars
ternary_backward(gy, a, b, c, *, op_name, value=1, need_a/b/c=True) -> (ga, gb, gc)
glu(x, dim) -> y;  glu_backward(gy, x, dim) -> gx
where(cond, a, b) -> out             # a/b tensor or scalar

How the iteration works: the operands are broadcast to the output shape (0-strides), the dims are
put in the output's memory order, and adjacent dims that are contiguous in every operand are
merged, so most launches index with one multiply per operand (rank 1; channels-last operands of a
channels-last result too) and a transposed or broadcast operand costs one div/mod per extra dim.
The output is dense in that order, written at the linear index.

Numerics follow torch on the GPU: each tensor operand is first rounded to the promoted dtype, then
math runs in fp32 ("opmath"; fp64 for fp64 results, int64 for integer results) and the result is
rounded once to the output dtype. A Python scalar stays a kernel argument in the compute dtype, so
``bf16_x * 0.1`` is ``bf16(float(x) * 0.1f)``, not ``x * bf16(0.1)``. Division and sqrt are
correctly rounded (torch's CUDA kernel divides by a scalar through its reciprocal, up to 1.5 ulp
off; torch's CPU sqrt is not correctly rounded either), and pow is computed in fp64.
Transcendental math (sin, cos, log1p, expm1, log2, exp2, erf, atan2, fmod, rounding) is libdevice on
the GPU (``activations.lib_*``). Integer division and remainder by zero are unspecified, as in
torch's CUDA kernels (torch raises on the CPU; checking would cost a host sync).
"""
import builtins
import math
import struct

import torch
import triton
import triton.language as tl

from ge2.backend.schema import broadcast_shapes, result_dtype
from ge2.kernels import activations
from ge2.kernels.activations import (
    act_ex_fwd, act_ex_grad, act_fwd, act_grad_from_y, act_grad_from_z, lib_atan2, lib_cos, lib_erf, lib_exp2,
    lib_expm1, lib_fmod, lib_log1p, lib_log2, lib_rint, lib_sin, lib_trunc, sigmoid,
)
from ge2.runtime import autotune, cdiv

# Differentiable binary ops (binary_backward knows their gradients), comparisons, and the
# bool/integer-only ones.
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmod", "remainder", "atan2")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL_OPS = ("logical_and", "logical_or", "logical_xor")
BITWISE_OPS = ("bitwise_and", "bitwise_or", "bitwise_xor")

# Op codes of the binary kernel: arithmetic, comparisons, then the gradients of the unary ops as
# functions of (gy, saved tensor), then the pointwise math added later.
ADD, SUB, MUL, DIV, POW = (tl.constexpr(i) for i in range(5))
EQ, NE, LT, LE, GT, GE = (tl.constexpr(i) for i in range(5, 11))
EXP_GRAD, LOG_GRAD, SQRT_GRAD, ABS_GRAD, ACT_GRAD_FROM_Z, ACT_GRAD_FROM_Y = (tl.constexpr(i) for i in range(11, 17))
(MAXIMUM, MINIMUM, FMOD, REMAINDER, ATAN2, LOGICAL_AND, LOGICAL_OR, LOGICAL_XOR, BITWISE_AND, BITWISE_OR,
 BITWISE_XOR, DIV_TRUNC, DIV_FLOOR, ADD_SCALED, SUB_SCALED, GLU, UNARY_GRAD, ACT_EX_GRAD) = (
    tl.constexpr(i) for i in range(17, 35))
_BINARY_CODE = {name: i for i, name in enumerate(BINARY_OPS[:5] + COMPARE_OPS)}
_BINARY_CODE.update({name: MAXIMUM + i for i, name in enumerate(BINARY_OPS[5:] + LOGICAL_OPS + BITWISE_OPS)})
_BINARY_CODE["glu"] = GLU
_UNARY_GRAD_CODE = {"exp": EXP_GRAD, "log": LOG_GRAD, "sqrt": SQRT_GRAD, "abs": ABS_GRAD}

# Op codes of the unary kernel; ACTIVATION applies activations.act_fwd, ACTIVATION_EX act_ex_fwd.
(NEG, EXP, LOG, SQRT, ABS, ACTIVATION, SIGN, FLOOR, CEIL, TRUNC, ROUND, ROUND_DECIMALS, LOG1P, EXPM1, LOG2,
 EXP2, RSQRT, RECIPROCAL, SQUARE, SIN, COS, ERF, ISNAN, ISINF, ISFINITE, NAN_TO_NUM, LOGICAL_NOT, BITWISE_NOT,
 ACTIVATION_EX) = (tl.constexpr(i) for i in range(29))

# name -> (code, what the result dtype is): "same" keeps the input dtype, "float" gives the default
# float for integer and bool inputs (torch's rule for transcendental ops), "bool" a bool mask.
_UNARY = {
    "neg": (NEG, "same"), "exp": (EXP, "float"), "log": (LOG, "float"), "sqrt": (SQRT, "float"),
    "abs": (ABS, "same"), "sign": (SIGN, "same"), "floor": (FLOOR, "same"), "ceil": (CEIL, "same"),
    "trunc": (TRUNC, "same"), "round": (ROUND, "same"), "log1p": (LOG1P, "float"), "expm1": (EXPM1, "float"),
    "log2": (LOG2, "float"), "exp2": (EXP2, "float"), "rsqrt": (RSQRT, "float"),
    "reciprocal": (RECIPROCAL, "float"), "square": (SQUARE, "same"), "sin": (SIN, "float"),
    "cos": (COS, "float"), "erf": (ERF, "float"), "isnan": (ISNAN, "bool"), "isinf": (ISINF, "bool"),
    "isfinite": (ISFINITE, "bool"), "nan_to_num": (NAN_TO_NUM, "same"), "logical_not": (LOGICAL_NOT, "bool"),
    "bitwise_not": (BITWISE_NOT, "same"),
}
UNARY_OPS = tuple(_UNARY)
# What each differentiable unary op's gradient reads: its input x or its result y.
UNARY_GRAD_SAVES = {
    "exp": "y", "log": "x", "sqrt": "y", "abs": "x", "log1p": "x", "expm1": "y", "log2": "x", "exp2": "y",
    "rsqrt": "y", "reciprocal": "y", "square": "x", "sin": "x", "cos": "x", "erf": "x", "nan_to_num": "x",
}
# Piecewise-constant ops: torch gives them a zero gradient.
ZERO_GRAD_OPS = ("sign", "floor", "ceil", "trunc", "round")

# Ternary ops: clamp(x, min, max), lerp(start, end, weight), addcmul/addcdiv(x, t1, t2, value).
TERNARY_OPS = ("clamp", "lerp", "addcmul", "addcdiv")
CLAMP, LERP, ADDCMUL, ADDCDIV = (tl.constexpr(i) for i in range(4))
_TERNARY_CODE = {name: i for i, name in enumerate(TERNARY_OPS)}

# Iteration rank after merging contiguous dims; an operand layout needing more is copied first.
MAX_RANK = 6
_INT32_MAX = 2**31 - 1

_TL_DTYPE = {
    torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
    torch.float64: tl.float64, torch.int8: tl.int8, torch.uint8: tl.uint8, torch.int16: tl.int16,
    torch.int32: tl.int32, torch.int64: tl.int64, torch.bool: tl.int1,
}


# ---------------------------------------------------------------------------------------------
# Shared @triton.jit helpers (the reduction kernels use strided_offsets and div too)
# ---------------------------------------------------------------------------------------------
@triton.jit
def strided_offsets(i, sizes, strides, RANK: tl.constexpr):
    """Memory offsets of the elements at row-major linear indices ``i`` of a strided array."""
    offsets = tl.zeros_like(i)
    for d in tl.static_range(RANK - 1, 0, -1):
        offsets += (i % sizes[d]) * strides[d]
        i = i // sizes[d]
    return offsets + i * strides[0]


@triton.jit
def linear_indices(n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """This program's BLOCK linear indices (int64 when WIDE, i.e. when offsets may pass 2**31)."""
    start = tl.program_id(0)
    if WIDE:
        start = start.to(tl.int64)
    return start * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def div(a, b):
    # '/' on fp32 is an approximate (2 ulp) division on the GPU; torch divides correctly rounded.
    if a.dtype == tl.float32:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _sqrt(x):
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def _pow(a, b):
    """a ** b in fp64 with C's special cases (the GPU has no pow for the interpreter to share)."""
    a = a.to(tl.float64)
    b = b.to(tl.float64)
    magnitude = tl.exp(b * tl.log(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    negative = (a < 0) | (1.0 / a < 0)  # the second catches -0.0
    y = tl.where(negative & b_odd, -magnitude, magnitude)
    # A negative finite base to a non-integer power has no real value.
    y = tl.where((a < 0) & (a != -float("inf")) & ~b_int, float("nan"), y)
    one = (b == 0) | (a == 1) | ((tl.abs(a) == 1) & (tl.abs(b) == float("inf")))
    return tl.where(one, 1.0, y)


@triton.jit
def _float_arg(bits, COMPUTE: tl.constexpr):
    # Float scalars travel as the int64 bits of an fp64: exact for fp64 math (a plain float argument
    # is fp32, and the interpreter rounds even annotated ones to fp32).
    return bits.to(tl.int64).to(tl.float64, bitcast=True).to(COMPUTE)


@triton.jit
def _operand(ptr, offsets, mask, scalar, IS_SCALAR: tl.constexpr, CAST: tl.constexpr, COMPUTE: tl.constexpr):
    """An operand in the COMPUTE dtype: a tensor's elements, rounded to the promoted dtype CAST first
    (torch casts inputs to the common dtype before its opmath), or a scalar argument (fp64 bits
    for float math, exact int64 for integer math)."""
    if IS_SCALAR:
        if COMPUTE.is_floating():
            value = _float_arg(scalar, COMPUTE)
        else:
            value = scalar.to(COMPUTE)
        value, _ = tl.broadcast(value, offsets)  # a block like any operand (free: one register)
    else:
        value = tl.load(ptr + offsets, mask=mask).to(CAST).to(COMPUTE)
    return value


@triton.jit
def _is_nan(x):
    if x.dtype.is_floating():
        return x != x
    else:
        return tl.zeros_like(x) != 0


@triton.jit
def _remainder(a, b):
    """Python's a % b (the sign of b), from the C remainder, like torch.remainder."""
    if a.dtype.is_floating():
        mod = lib_fmod(a, b)
    else:
        mod = a % b  # C semantics (truncating) for integers, in Triton as in the interpreter
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@triton.jit
def _div_floor(a, b):
    """floor(a / b) with torch's rules: exact for integers; for floats from fmod, as torch does."""
    if a.dtype.is_floating():
        mod = lib_fmod(a, b)
        q = div(a - mod, b)
        q = tl.where((mod != 0) & ((b < 0) != (mod < 0)), q - 1.0, q)
        fq = tl.floor(q)
        fq = tl.where(q - fq > 0.5, fq + 1.0, fq)
        fq = tl.where(q == 0, tl.where(div(a, b) < 0, -0.0, 0.0), fq)
        return tl.where(b == 0, div(a, b), fq)
    else:
        q = a // b
        return tl.where(((a < 0) != (b < 0)) & (q * b != a), q - 1, q)


@triton.jit
def _binary_math(a, b, OP: tl.constexpr, ACT: tl.constexpr, alpha, beta, gamma):
    if OP == ADD:
        return a + b
    elif OP == SUB:
        return a - b
    elif OP == MUL:
        return a * b
    elif OP == DIV:
        return div(a, b)
    elif OP == POW:
        return _pow(a, b).to(a.dtype)
    elif OP == EQ:
        return a == b
    elif OP == NE:
        return a != b
    elif OP == LT:
        return a < b
    elif OP == LE:
        return a <= b
    elif OP == GT:
        return a > b
    elif OP == GE:
        return a >= b
    # Gradients of y = f(x): a = gy, b = the saved tensor.
    elif OP == EXP_GRAD:  # b = y
        return a * b
    elif OP == LOG_GRAD:  # b = x
        return div(a, b)
    elif OP == SQRT_GRAD:  # b = y
        return div(a, 2.0 * b)
    elif OP == ABS_GRAD:  # b = x; sign(NaN) = 0 like torch.sgn
        return tl.where(b > 0, a, tl.where(b < 0, -a, 0.0))
    elif OP == ACT_GRAD_FROM_Z:
        return a * act_grad_from_z(b, ACT, alpha)
    elif OP == ACT_GRAD_FROM_Y:
        return a * act_grad_from_y(b, ACT, alpha)
    elif OP == UNARY_GRAD:  # ACT = the unary op's code
        return _unary_grad(a, b, ACT)
    elif OP == ACT_EX_GRAD:
        return a * act_ex_grad(b, ACT, alpha, beta, gamma)
    # NaN-propagating max/min, like torch.maximum/minimum.
    elif OP == MAXIMUM:
        return tl.where(_is_nan(a) | (a > b), a, b)
    elif OP == MINIMUM:
        return tl.where(_is_nan(a) | (a < b), a, b)
    elif OP == FMOD:
        if a.dtype.is_floating():
            return lib_fmod(a, b)
        else:
            return a % b
    elif OP == REMAINDER:
        return _remainder(a, b)
    elif OP == ATAN2:
        return lib_atan2(a, b)
    elif OP == LOGICAL_AND:
        return (a != 0) & (b != 0)
    elif OP == LOGICAL_OR:
        return (a != 0) | (b != 0)
    elif OP == LOGICAL_XOR:
        return (a != 0) != (b != 0)
    elif OP == BITWISE_AND:
        return a & b
    elif OP == BITWISE_OR:
        return a | b
    elif OP == BITWISE_XOR:
        return a ^ b
    elif OP == DIV_TRUNC:
        if a.dtype.is_floating():
            return lib_trunc(div(a, b))
        else:
            return a // b  # truncating, as C (and torch) divide integers
    elif OP == DIV_FLOOR:
        return _div_floor(a, b)
    elif OP == ADD_SCALED:  # torch's add(alpha=): one rounding of a + alpha * b in opmath
        return a + alpha * b
    elif OP == SUB_SCALED:
        return a - alpha * b
    else:  # GLU: a * sigmoid(b)
        return a * sigmoid(b)


@triton.jit
def _unary_math(x, OP: tl.constexpr, ACT: tl.constexpr, alpha, beta, gamma):
    if OP == NEG:
        return -x
    elif OP == EXP:
        return tl.exp(x)
    elif OP == LOG:
        return tl.log(x)
    elif OP == SQRT:
        return _sqrt(x)
    elif OP == ABS:
        return tl.abs(x)
    elif OP == ACTIVATION:
        return act_fwd(x, ACT, alpha)
    elif OP == ACTIVATION_EX:
        return act_ex_fwd(x, ACT, alpha, beta, gamma)
    elif OP == SIGN:  # 0 for NaN, like torch
        return tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(x.dtype)
    elif OP == SQUARE:
        return x * x
    elif OP == LOG1P:
        return lib_log1p(x)
    elif OP == EXPM1:
        return lib_expm1(x)
    elif OP == LOG2:
        return lib_log2(x)
    elif OP == EXP2:
        return lib_exp2(x)
    elif OP == RSQRT:
        return div(tl.full(x.shape, 1.0, x.dtype), _sqrt(x))
    elif OP == RECIPROCAL:
        return div(tl.full(x.shape, 1.0, x.dtype), x)
    elif OP == SIN:
        return lib_sin(x)
    elif OP == COS:
        return lib_cos(x)
    elif OP == ERF:
        return lib_erf(x)
    elif OP == ISNAN:
        return _is_nan(x)
    elif OP == ISINF:
        if x.dtype.is_floating():
            return tl.abs(x) == float("inf")
        else:
            return tl.zeros_like(x) != 0
    elif OP == ISFINITE:
        if x.dtype.is_floating():
            return tl.abs(x) < float("inf")
        else:
            return tl.zeros_like(x) == 0
    elif OP == NAN_TO_NUM:  # alpha, beta, gamma: what NaN, +inf and -inf become
        if x.dtype.is_floating():
            y = tl.where(x == float("inf"), beta, tl.where(x == -float("inf"), gamma, x))
            return tl.where(x != x, alpha, y)
        else:
            return x
    elif OP == LOGICAL_NOT:
        return x == 0
    elif OP == BITWISE_NOT:
        return ~x
    # Rounding: integers are already integral.
    elif not x.dtype.is_floating():
        return x
    elif OP == FLOOR:
        return tl.floor(x)
    elif OP == CEIL:
        return tl.ceil(x)
    elif OP == TRUNC:
        return lib_trunc(x)
    elif OP == ROUND:
        return lib_rint(x)
    else:  # ROUND_DECIMALS: alpha = 10**|decimals|, beta = 1 for negative decimals (torch's form)
        return tl.where(beta != 0, lib_rint(div(x, alpha)) * alpha, div(lib_rint(x * alpha), alpha))


@triton.jit
def _unary_grad(gy, s, OP: tl.constexpr):
    """gy * f'(x) for the unary ops of UNARY_GRAD_SAVES added after abs; s is x or y as listed there."""
    if OP == LOG1P:  # s = x
        return div(gy, 1.0 + s)
    elif OP == EXPM1:  # s = y
        return gy * (s + 1.0)
    elif OP == LOG2:  # s = x
        return div(gy, s * 0.6931471805599453)
    elif OP == EXP2:  # s = y
        return gy * s * 0.6931471805599453
    elif OP == RSQRT:  # s = y
        return -0.5 * gy * (s * s * s)
    elif OP == RECIPROCAL:  # s = y
        return -gy * (s * s)
    elif OP == SQUARE:  # s = x
        return gy * 2.0 * s
    elif OP == SIN:
        return gy * lib_cos(s)
    elif OP == COS:
        return -gy * lib_sin(s)
    elif OP == ERF:  # 2 / sqrt(pi) exp(-x^2)
        return gy * 1.1283791670955126 * tl.exp(-s * s)
    else:  # NAN_TO_NUM: the gradient passes where x was finite
        return tl.where(tl.abs(s) < float("inf"), gy, 0.0)


@triton.jit
def _ternary_math(a, b, c, OP: tl.constexpr, value):
    if OP == CLAMP:  # min(max(a, b), c), NaN in any operand propagating (torch's clamp kernel)
        y = tl.where(a < b, b, a)
        y = tl.where(y > c, c, y)
        y = tl.where(_is_nan(c), c, y)
        y = tl.where(_is_nan(b), b, y)
        return tl.where(_is_nan(a), a, y)
    elif OP == LERP:  # torch's two-sided form: exact at both ends
        d = b - a
        return tl.where(tl.abs(c) < 0.5, a + c * d, b - d * (1.0 - c))
    elif OP == ADDCMUL:
        return a + value * b * c
    else:  # ADDCDIV
        return a + value * div(b, c)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
# Memory-bound: what matters is enough bytes in flight per SM. Tuned per (dtypes, rank, size);
# problems under 2**20 elements share one key (tune_size = 0) and take the first config untuned.
_CONFIGS = [
    triton.Config({"BLOCK": 1024}, num_warps=4),
    triton.Config({"BLOCK": 2048}, num_warps=4),
    triton.Config({"BLOCK": 2048}, num_warps=8),
    triton.Config({"BLOCK": 4096}, num_warps=8),
]


def _prune_small(configs, named_args, **kwargs):
    return configs if {**named_args, **kwargs}["tune_size"] > 0 else configs[:1]


def _quick_bench(fn, quantiles):
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


def _elementwise_autotune(fn):
    return autotune(_CONFIGS, key=["tune_size", "RANK"], default=0,
                    prune_configs_by={"early_config_prune": _prune_small}, do_bench=_quick_bench)(fn)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "alpha", "beta", "gamma"])
def _unary_kernel(
    x_ptr, y_ptr, n, tune_size, sizes, x_strides, alpha: "tl.int64", beta: "tl.int64", gamma: "tl.int64",
    OP: tl.constexpr, ACT: tl.constexpr, COMPUTE: tl.constexpr,
    RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    x = tl.load(x_ptr + strided_offsets(i, sizes, x_strides, RANK), mask=mask).to(COMPUTE)
    y = _unary_math(x, OP, ACT, _float_arg(alpha, COMPUTE), _float_arg(beta, COMPUTE), _float_arg(gamma, COMPUTE))
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar", "alpha", "beta", "gamma"])
def _binary_kernel(
    a_ptr, b_ptr, out_ptr, n, tune_size, sizes, a_strides, b_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64", alpha: "tl.int64", beta: "tl.int64", gamma: "tl.int64",
    OP: tl.constexpr, ACT: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr,
    CAST: tl.constexpr, COMPUTE: tl.constexpr, RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
    b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
    out = _binary_math(a, b, OP, ACT, _float_arg(alpha, COMPUTE), _float_arg(beta, COMPUTE), _float_arg(gamma, COMPUTE))
    tl.store(out_ptr + i, out.to(out_ptr.dtype.element_ty), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar"])
def _where_kernel(
    cond_ptr, a_ptr, b_ptr, out_ptr, n, tune_size, sizes, cond_strides, a_strides, b_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64",
    A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr, CAST: tl.constexpr, COMPUTE: tl.constexpr,
    RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    cond = tl.load(cond_ptr + strided_offsets(i, sizes, cond_strides, RANK), mask=mask)
    a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
    b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
    tl.store(out_ptr + i, tl.where(cond, a, b).to(CAST), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar"])
def _binary_backward_kernel(
    gy_ptr, a_ptr, b_ptr, ga_ptr, gb_ptr, n, tune_size, sizes, gy_strides, a_strides, b_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64",
    OP: tl.constexpr, NEED_A: tl.constexpr, NEED_B: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr,
    CAST: tl.constexpr, COMPUTE: tl.constexpr, RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """(ga, gb) = d(a op b)/da * gy, d(a op b)/db * gy over the broadcast shape, in one pass over gy."""
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    gy = tl.load(gy_ptr + strided_offsets(i, sizes, gy_strides, RANK), mask=mask).to(COMPUTE)
    if OP == ADD or OP == SUB:
        ga = gy
        if OP == SUB:
            gb = -gy
        else:
            gb = gy
    else:
        a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
        b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
        if OP == MUL:
            ga = gy * b
            gb = gy * a
        elif OP == DIV:
            ga = div(gy, b)
            gb = -gy * div(div(a, b), b)  # torch's form: (a / b) / b does not overflow where b * b would
        elif OP == POW:  # like torch: 0 where the exponent is 0, and where the base is 0 for b >= 0
            ga = gy * tl.where(b == 0, 0.0, b * _pow(a, b - 1.0).to(COMPUTE))
            gb = gy * tl.where((a == 0) & (b >= 0), 0.0, (_pow(a, b) * tl.log(a.to(tl.float64))).to(COMPUTE))
        elif OP == MAXIMUM or OP == MINIMUM:  # torch: ties share it, NaN sends it to both sides
            shared = tl.where(a == b, gy * 0.5, gy)
            if OP == MAXIMUM:
                ga = tl.where(a < b, 0.0, shared)
                gb = tl.where(a > b, 0.0, shared)
            else:
                ga = tl.where(a > b, 0.0, shared)
                gb = tl.where(a < b, 0.0, shared)
        elif OP == FMOD:  # a - b trunc(a / b)
            ga = gy
            gb = -gy * lib_trunc(div(a, b))
        elif OP == REMAINDER:  # a - b floor(a / b)
            ga = gy
            gb = -gy * _div_floor(a, b)
        elif OP == ATAN2:  # d atan2(a, b) = (b da - a db) / (a^2 + b^2)
            r = a * a + b * b
            ga = gy * div(b, r)
            gb = gy * div(-a, r)
        else:  # GLU: a * sigmoid(b)
            sb = sigmoid(b)
            ga = gy * sb
            gb = gy * a * sb * (1.0 - sb)
    if NEED_A:
        tl.store(ga_ptr + i, ga.to(ga_ptr.dtype.element_ty), mask=mask)
    if NEED_B:
        tl.store(gb_ptr + i, gb.to(gb_ptr.dtype.element_ty), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar", "c_scalar", "value"])
def _ternary_kernel(
    a_ptr, b_ptr, c_ptr, out_ptr, n, tune_size, sizes, a_strides, b_strides, c_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64", c_scalar: "tl.int64", value: "tl.int64",
    OP: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr, C_SCALAR: tl.constexpr,
    CAST: tl.constexpr, COMPUTE: tl.constexpr, RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
    b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
    c = _operand(c_ptr, strided_offsets(i, sizes, c_strides, RANK), mask, c_scalar, C_SCALAR, CAST, COMPUTE)
    if OP == CLAMP:  # scalar bounds in the result dtype, as torch's clamp takes them
        b = b.to(CAST).to(COMPUTE)
        c = c.to(CAST).to(COMPUTE)
    out = _ternary_math(a, b, c, OP, _float_arg(value, COMPUTE))
    tl.store(out_ptr + i, out.to(out_ptr.dtype.element_ty), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar", "c_scalar", "value"])
def _ternary_backward_kernel(
    gy_ptr, a_ptr, b_ptr, c_ptr, ga_ptr, gb_ptr, gc_ptr, n, tune_size, sizes,
    gy_strides, a_strides, b_strides, c_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64", c_scalar: "tl.int64", value: "tl.int64",
    OP: tl.constexpr, NEED_A: tl.constexpr, NEED_B: tl.constexpr, NEED_C: tl.constexpr,
    A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr, C_SCALAR: tl.constexpr,
    CAST: tl.constexpr, COMPUTE: tl.constexpr, RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """The gradients of a ternary op w.r.t. its three operands over the broadcast shape, one pass."""
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    gy = tl.load(gy_ptr + strided_offsets(i, sizes, gy_strides, RANK), mask=mask).to(COMPUTE)
    a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
    b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
    c = _operand(c_ptr, strided_offsets(i, sizes, c_strides, RANK), mask, c_scalar, C_SCALAR, CAST, COMPUTE)
    v = _float_arg(value, COMPUTE)
    if OP == CLAMP:  # torch's clamp_backward_min_max (an absent bound is -inf / +inf here)
        b = b.to(CAST).to(COMPUTE)
        c = c.to(CAST).to(COMPUTE)
        ga = tl.where((a >= b) & (a <= c), gy, 0.0)
        gb = tl.where((a < b) & (b < c), gy, 0.0)
        gc = tl.where((a > c) | (c < b), gy, 0.0)
    elif OP == LERP:
        ga = gy * (1.0 - c)
        gb = gy * c
        gc = gy * (b - a)
    elif OP == ADDCMUL:
        ga = gy
        gb = gy * v * c
        gc = gy * v * b
    else:  # ADDCDIV
        ga = gy
        gb = div(gy * v, c)
        gc = div(-gy * v * b, c * c)
    if NEED_A:
        tl.store(ga_ptr + i, ga.to(ga_ptr.dtype.element_ty), mask=mask)
    if NEED_B:
        tl.store(gb_ptr + i, gb.to(gb_ptr.dtype.element_ty), mask=mask)
    if NEED_C:
        tl.store(gc_ptr + i, gc.to(gc_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launch plumbing
# ---------------------------------------------------------------------------------------------
def collapse_dims(sizes, strides_per_operand):
    """Drop size-1 dims and merge adjacent dims contiguous in every operand.

    Returns (sizes, strides_per_operand) as tuples, at least rank 1.
    """
    merged: list[tuple[int, list[int]]] = []
    for d, size in enumerate(sizes):
        if size == 1:
            continue
        strides = [st[d] for st in strides_per_operand]
        if merged and all(outer == inner * size for outer, inner in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * size, strides)
        else:
            merged.append((size, strides))
    if not merged:
        return (1,), [(0,) for _ in strides_per_operand]
    return tuple(s for s, _ in merged), [tuple(st[k] for _, st in merged) for k in range(len(strides_per_operand))]


def _max_offset(sizes, strides) -> int:
    return math.fsum((s - 1) * abs(st) for s, st in zip(sizes, strides))


def memory_order(shape, strides_per_operand) -> list[int] | None:
    """The dims of an elementwise result over ``shape``, outermost first in memory, or None for
    row-major; ``strides_per_operand`` are the operands' strides expanded to ``shape``.

    torch's rule (TensorIterator's dim reordering), so that results are laid out as torch's are: an
    insertion sort of the dims from the innermost, where the first operand whose strides differ on
    two dims (broadcast dims, stride 0, abstain) decides their order; a channels-last input gives a
    channels-last result, a contiguous first operand a row-major one."""
    perm = list(range(len(shape)))[::-1]  # innermost first

    def should_swap(d0: int, d1: int) -> int:
        for strides in strides_per_operand:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    order = perm[::-1]
    return None if order == sorted(order) else order


class _Launch:
    """The shared iteration space of one elementwise launch over ``shape``.

    ``operands`` are tensors, Python scalars or None; each tensor gets strides over the collapsed
    dims (0 where it broadcasts), scalars and None get zeros and the output as a placeholder pointer.
    The dims run in the result's memory order (``memory_order``), so the kernels store at the
    linear index and read a channels-last operand of a channels-last result as one flat run.
    """

    def __init__(self, shape, operands, compute: torch.dtype):
        self.shape = tuple(shape)
        self.n = math.prod(self.shape)
        tensors = [x for x in operands if isinstance(x, torch.Tensor)]
        self.order = None
        if all(x.shape == self.shape and x.is_contiguous() for x in tensors):  # the common case, cheaply
            sizes, strides = (self.n,), [(1,)] * len(tensors)
        else:
            expanded = [x.expand(self.shape).stride() for x in tensors]
            self.order = memory_order(self.shape, expanded)
            sizes, strides = collapse_dims(*self._in_order(expanded))
        if len(sizes) > MAX_RANK:  # rare: copy the operands to the output's layout so that all dims merge
            operands = [self.empty(x.dtype, x.device).copy_(x.expand(self.shape)) if isinstance(x, torch.Tensor)
                        else x for x in operands]
            tensors = [x for x in operands if isinstance(x, torch.Tensor)]
            sizes, strides = collapse_dims(*self._in_order([x.stride() for x in tensors]))
        self.operands = operands
        self.sizes = sizes
        it = iter(strides)
        self.strides = [next(it) if isinstance(x, torch.Tensor) else (0,) * len(sizes) for x in operands]
        self.rank = len(sizes)
        self.wide = self.n > _INT32_MAX or any(_max_offset(sizes, st) > _INT32_MAX for st in self.strides)
        self.compute = compute
        # The autotune key (the kernels ignore it): the size, or 0 for small launches (not tuned).
        self.tune_size = self.n if self.n >= 2**20 else 0

    def _in_order(self, strides_per_operand):
        """(sizes, strides per operand) with the dims permuted into the result's memory order."""
        if self.order is None:
            return self.shape, strides_per_operand
        return [self.shape[d] for d in self.order], [[st[d] for d in self.order] for st in strides_per_operand]

    def empty(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised result [shape], dense in the launch's memory order."""
        if self.order is None:
            return torch.empty(self.shape, dtype=dtype, device=device)
        inverse = sorted(range(len(self.order)), key=self.order.__getitem__)
        return torch.empty([self.shape[d] for d in self.order], dtype=dtype, device=device).permute(inverse)

    def pointer(self, k: int, placeholder: torch.Tensor):
        x = self.operands[k]
        return x if isinstance(x, torch.Tensor) else placeholder

    def scalar(self, k: int) -> int:
        """Operand k as the kernel's int64 scalar argument (fp64 bits for float math); 0 for tensors."""
        x = self.operands[k]
        if isinstance(x, torch.Tensor) or x is None:
            return 0
        return _float_bits(x) if self.compute.is_floating_point else int(x)

    def is_scalar(self, k: int) -> bool:
        return not isinstance(self.operands[k], torch.Tensor)

    def grid(self, meta):
        return (cdiv(self.n, meta["BLOCK"]),)

    def run(self, kernel, *args, **kwargs) -> None:
        """Launch kernel over this iteration space. Small launches are never tuned, so they skip
        the autotuner's per-call bookkeeping (a third of the Python launch cost) and take the
        config the autotuner would pin."""
        if self.tune_size:
            kernel[self.grid](*args, **self.common(), **kwargs)
        else:
            kernel.fn[self.grid](*args, **self.common(), **kwargs, **_CONFIGS[0].all_kwargs())

    def common(self) -> dict:
        return dict(n=self.n, tune_size=self.tune_size, sizes=self.sizes, RANK=self.rank, WIDE=self.wide)


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype math runs in for results of dtype ``dt``: fp64, fp32 for other floats, int64."""
    if dt == torch.float64:
        return torch.float64
    return torch.float32 if dt.is_floating_point else torch.int64


def _shape(*operands) -> tuple[int, ...]:
    tensors = [x for x in operands if isinstance(x, torch.Tensor)]
    return broadcast_shapes("elementwise", [f"input {i}" for i in range(len(tensors))], [tuple(x.shape) for x in tensors])


def _device(*operands) -> torch.device:
    return next(x.device for x in operands if isinstance(x, torch.Tensor))


def _binary_launch(code, a, b, out_dtype, cast, act=activations.NONE, alpha=0.0, beta=0.0, gamma=0.0):
    launch = _Launch(_shape(a, b), [a, b], compute_dtype(cast))
    out = launch.empty(out_dtype, _device(a, b))
    if out.numel() == 0:
        return out
    launch.run(
        _binary_kernel, launch.pointer(0, out), launch.pointer(1, out), out,
        a_strides=launch.strides[0], b_strides=launch.strides[1],
        a_scalar=launch.scalar(0), b_scalar=launch.scalar(1),
        alpha=_float_bits(alpha), beta=_float_bits(beta), gamma=_float_bits(gamma),
        OP=code, ACT=act, A_SCALAR=launch.is_scalar(0), B_SCALAR=launch.is_scalar(1),
        CAST=_TL_DTYPE[cast], COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


def _unary_launch(code, x, out_dtype, act=activations.NONE, alpha=0.0, beta=0.0, gamma=0.0, compute=None):
    launch = _Launch(x.shape, [x], compute or compute_dtype(x.dtype))
    out = launch.empty(out_dtype, x.device)
    if out.numel() == 0:
        return out
    launch.run(
        _unary_kernel, x, out, x_strides=launch.strides[0],
        alpha=_float_bits(alpha), beta=_float_bits(beta), gamma=_float_bits(gamma),
        OP=code, ACT=act, COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


def _float_result(dt: torch.dtype) -> torch.dtype:
    """torch's result dtype for true division and transcendental math: integers give the default float."""
    return dt if dt.is_floating_point else torch.get_default_dtype()


# ---------------------------------------------------------------------------------------------
# Public launchers (the contract above)
# ---------------------------------------------------------------------------------------------
def binary(op: str, a, b, *, alpha=1, rounding_mode: str | None = None) -> torch.Tensor:
    """a (op) b for op in BINARY_OPS, LOGICAL_OPS, BITWISE_OPS, broadcast; a/b tensors or scalars
    -> [broadcast shape]. ``alpha`` scales b in add/sub; ``rounding_mode`` ("trunc", "floor") rounds div."""
    dt = result_dtype(a, b)
    code = _BINARY_CODE[op]
    if op in LOGICAL_OPS:
        return _binary_launch(code, a, b, torch.bool, dt)
    if op == "div":
        if rounding_mode is None:
            dt = _float_result(dt)  # true division, like torch
        else:
            code = DIV_TRUNC if rounding_mode == "trunc" else DIV_FLOOR
    elif op == "atan2":
        dt = _float_result(dt)
    elif op in ("add", "sub") and alpha != 1:
        code = ADD_SCALED if op == "add" else SUB_SCALED
        return _binary_launch(code, a, b, dt, dt, alpha=alpha)
    return _binary_launch(code, a, b, dt, dt)


def compare(op: str, a, b) -> torch.Tensor:
    """a (op) b for op in eq ne lt le gt ge, compared in the promoted dtype -> bool [broadcast shape]."""
    return _binary_launch(_BINARY_CODE[op], a, b, torch.bool, result_dtype(a, b))


def unary(op: str, x: torch.Tensor, *, decimals: int = 0, nan=0.0, posinf=None, neginf=None) -> torch.Tensor:
    """y = op(x) for op in UNARY_OPS -> [x.shape]; the dtype by torch's rule for the op (``_UNARY``).

    ``decimals``: round's; ``nan``, ``posinf``, ``neginf``: nan_to_num's replacements (None: the
    dtype's largest / lowest finite value)."""
    code, kind = _UNARY[op]
    if kind == "float":
        out = _float_result(x.dtype)
    elif kind == "bool":
        out = torch.bool
    else:
        out = torch.int64 if op == "square" and x.dtype == torch.bool else x.dtype
    compute = compute_dtype(x.dtype if kind == "bool" else out)
    params = (0.0, 0.0, 0.0)
    if op == "bitwise_not" and x.dtype == torch.bool:
        code = LOGICAL_NOT
    elif op == "round" and decimals != 0:
        code, params = ROUND_DECIMALS, (10.0 ** builtins.abs(decimals), float(decimals < 0), 0.0)
    elif op == "nan_to_num" and x.dtype.is_floating_point:
        info = torch.finfo(x.dtype)
        params = (nan, info.max if posinf is None else posinf, info.min if neginf is None else neginf)
    return _unary_launch(code, x, out, alpha=params[0], beta=params[1], gamma=params[2], compute=compute)


def unary_backward(gy: torch.Tensor, x=None, y=None, *, op_name: str) -> torch.Tensor:
    """gx = gy * op'(x), reading x or y = op(x) as ``UNARY_GRAD_SAVES`` says; zeros for the
    piecewise-constant ops -> [gy.shape]."""
    if op_name == "neg":
        return _unary_launch(NEG, gy, gy.dtype)
    if op_name in ZERO_GRAD_OPS:
        return torch.zeros_like(gy)
    saved = y if UNARY_GRAD_SAVES[op_name] == "y" else x
    dt = result_dtype(gy, saved)
    if op_name in _UNARY_GRAD_CODE:
        return _binary_launch(_UNARY_GRAD_CODE[op_name], gy, saved, dt, dt)
    return _binary_launch(UNARY_GRAD, gy, saved, dt, dt, act=_UNARY[op_name][0])


def activation(x: torch.Tensor, *, act: str, alpha: float = 0.01, beta: float = 0.0, gamma: float = 0.0) -> torch.Tensor:
    """y = act(x) for act in activations.ACTIVATIONS or POINTWISE_ACTIVATIONS (parameters alpha,
    beta, gamma as listed there) -> [x.shape], x.dtype."""
    if act in activations.POINTWISE_ACTIVATIONS:
        return _unary_launch(ACTIVATION_EX, x, x.dtype, act=activations.act_ex_code("activation", act),
                             alpha=alpha, beta=beta, gamma=gamma)
    code = activations.act_code("activation", act, alpha)
    return _unary_launch(ACTIVATION, x, x.dtype, act=code, alpha=alpha)


def activation_backward(gy: torch.Tensor, x=None, y=None, *, act: str, alpha: float = 0.01, beta: float = 0.0,
                        gamma: float = 0.0) -> torch.Tensor:
    """gx = gy * act'(x), with act' read from y = act(x) when x is None -> [gy.shape]."""
    if act in activations.POINTWISE_ACTIVATIONS:
        dt = result_dtype(gy, x)
        return _binary_launch(ACT_EX_GRAD, gy, x, dt, dt, act=activations.act_ex_code("activation_backward", act),
                              alpha=alpha, beta=beta, gamma=gamma)
    code = activations.act_code("activation_backward", act, alpha)
    saved, op = (x, ACT_GRAD_FROM_Z) if x is not None else (y, ACT_GRAD_FROM_Y)
    dt = result_dtype(gy, saved)
    return _binary_launch(op, gy, saved, dt, dt, act=code, alpha=alpha)


def _halves(x: torch.Tensor, dim: int):
    h = x.shape[dim] // 2
    return x.narrow(dim, 0, h), x.narrow(dim, h, h)


def glu(x: torch.Tensor, dim: int) -> torch.Tensor:
    """a * sigmoid(b) for the halves a, b of x along ``dim`` (even size) -> x.shape with dim halved."""
    a, b = _halves(x, dim)
    return _binary_launch(GLU, a, b, x.dtype, x.dtype)


def glu_backward(gy: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """gx [x.shape] of glu(x, dim) given gy: both halves' gradients from one kernel."""
    a, b = _halves(x, dim)
    ga, gb = binary_backward(gy, a, b, op_name="glu")
    gx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ha, hb = _halves(gx, dim)
    ha.copy_(ga)
    hb.copy_(gb)
    return gx


def _clamp_bounds(dt: torch.dtype, lo, hi):
    """An absent bound as the dtype's extreme (exact in it): clamp always runs as min(max(x, lo), hi)."""
    if dt.is_floating_point:
        low, high = -math.inf, math.inf
    else:
        info = torch.iinfo(dt)
        low, high = info.min, info.max
    return (low if lo is None else lo), (high if hi is None else hi)


def _ternary_dtype(op: str, a, b, c) -> torch.dtype:
    if op == "lerp":
        return a.dtype
    return result_dtype(*[x for x in (a, b, c) if x is not None])


def ternary(op: str, a, b, c, *, value=1) -> torch.Tensor:
    """op(a, b, c) for op in TERNARY_OPS, broadcast: clamp(x, min, max) (a bound None or a
    scalar), lerp(start, end, weight), addcmul / addcdiv(x, t1, t2) with ``value`` -> [broadcast shape]."""
    dt = _ternary_dtype(op, a, b, c)
    if op == "clamp":
        b, c = _clamp_bounds(dt, b, c)
    launch = _Launch(_shape(a, b, c), [a, b, c], compute_dtype(dt))
    out = launch.empty(dt, _device(a, b, c))
    if out.numel() == 0:
        return out
    launch.run(
        _ternary_kernel, launch.pointer(0, out), launch.pointer(1, out), launch.pointer(2, out), out,
        a_strides=launch.strides[0], b_strides=launch.strides[1], c_strides=launch.strides[2],
        a_scalar=launch.scalar(0), b_scalar=launch.scalar(1), c_scalar=launch.scalar(2),
        value=_float_bits(value),
        OP=_TERNARY_CODE[op], A_SCALAR=launch.is_scalar(0), B_SCALAR=launch.is_scalar(1),
        C_SCALAR=launch.is_scalar(2), CAST=_TL_DTYPE[dt], COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


def _grad_buffers(launch, gy, operands, needs, compute):
    """Per operand a buffer for its gradient over the broadcast shape (gy's layout), or None; a
    gradient to be summed (its operand was broadcast) stays in the compute dtype until then."""
    return [launch.empty(t.dtype if t.numel() == gy.numel() else compute, gy.device) if need else None
            for t, need in zip(operands, needs)]


def _to_operand(g, t, gy):
    """A gradient over the broadcast shape summed back to its operand's shape and dtype."""
    from ge2.kernels import reduction  # the reduction launchers reuse this module's helpers

    if g is None:
        return None
    if t.numel() == gy.numel():
        return g.reshape(t.shape)
    return reduction.sum_to(g, tuple(t.shape), dtype=t.dtype)


def ternary_backward(gy: torch.Tensor, a, b, c, *, op_name: str, value=1, need_a: bool = True,
                     need_b: bool = True, need_c: bool = True):
    """(ga, gb, gc) of y = op_name(a, b, c) given gy [broadcast shape]; each summed to its operand's
    shape and dtype, None for a scalar or absent operand or one not needed."""
    operands = [a, b, c]
    needs = [need and isinstance(t, torch.Tensor) for need, t in zip((need_a, need_b, need_c), operands)]
    if not any(needs):
        return None, None, None
    if op_name == "clamp":
        b, c = _clamp_bounds(gy.dtype, b, c)
    compute = compute_dtype(gy.dtype)
    launch = _Launch(tuple(gy.shape), [gy, a, b, c], compute)
    grads = _grad_buffers(launch, gy, operands, needs, compute)
    if gy.numel() > 0:
        placeholder = next(g for g in grads if g is not None)
        launch.run(
            _ternary_backward_kernel, gy, *(launch.pointer(k, placeholder) for k in (1, 2, 3)),
            *(g if g is not None else placeholder for g in grads),
            gy_strides=launch.strides[0], a_strides=launch.strides[1], b_strides=launch.strides[2],
            c_strides=launch.strides[3], a_scalar=launch.scalar(1), b_scalar=launch.scalar(2),
            c_scalar=launch.scalar(3), value=_float_bits(value),
            OP=_TERNARY_CODE[op_name], NEED_A=needs[0], NEED_B=needs[1], NEED_C=needs[2],
            A_SCALAR=launch.is_scalar(1), B_SCALAR=launch.is_scalar(2), C_SCALAR=launch.is_scalar(3),
            CAST=_TL_DTYPE[gy.dtype], COMPUTE=_TL_DTYPE[compute],
        )
    return tuple(_to_operand(g, t, gy) for g, t in zip(grads, operands))


def where(cond: torch.Tensor, a, b) -> torch.Tensor:
    """a where cond else b, broadcast; a/b tensors or scalars -> [broadcast shape], result_dtype(a, b)."""
    dt = result_dtype(a, b)
    launch = _Launch(_shape(cond, a, b), [cond, a, b], compute_dtype(dt))
    out = launch.empty(dt, cond.device)
    if out.numel() == 0:
        return out
    launch.run(
        _where_kernel, cond, launch.pointer(1, out), launch.pointer(2, out), out,
        cond_strides=launch.strides[0], a_strides=launch.strides[1], b_strides=launch.strides[2],
        a_scalar=launch.scalar(1), b_scalar=launch.scalar(2),
        A_SCALAR=launch.is_scalar(1), B_SCALAR=launch.is_scalar(2),
        CAST=_TL_DTYPE[dt], COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


def binary_backward(gy: torch.Tensor, a, b, *, op_name: str, need_a: bool = True, need_b: bool = True):
    """(ga, gb) of y = a (op_name) b given gy [broadcast shape]; each summed to its operand's shape
    and dtype, None for a scalar operand or one not needed."""
    want_a = need_a and isinstance(a, torch.Tensor)
    want_b = need_b and isinstance(b, torch.Tensor)
    if not (want_a or want_b):
        return None, None
    compute = compute_dtype(gy.dtype)
    launch = _Launch(tuple(gy.shape), [gy, a, b], compute)
    ga, gb = _grad_buffers(launch, gy, [a, b], [want_a, want_b], compute)
    if gy.numel() > 0:
        placeholder = ga if ga is not None else gb
        launch.run(
            _binary_backward_kernel, gy, launch.pointer(1, placeholder), launch.pointer(2, placeholder),
            ga if ga is not None else placeholder, gb if gb is not None else placeholder,
            gy_strides=launch.strides[0], a_strides=launch.strides[1], b_strides=launch.strides[2],
            a_scalar=launch.scalar(1), b_scalar=launch.scalar(2),
            OP=_BINARY_CODE[op_name], NEED_A=want_a, NEED_B=want_b,
            A_SCALAR=launch.is_scalar(1), B_SCALAR=launch.is_scalar(2),
            CAST=_TL_DTYPE[gy.dtype], COMPUTE=_TL_DTYPE[compute],
        )
    return _to_operand(ga, a, gy), _to_operand(gb, b, gy)
