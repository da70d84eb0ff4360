"""Elementwise kernels: unary math, binary arithmetic and comparisons, where, and their gradients.

Every launcher takes torch tensors of any strides (0-strides of ``expand``, transposed or stepped
views) that broadcast NumPy-style, or Python scalars where noted, and returns new tensors of the
broadcast shape laid out as torch's would be (``memory_order``: channels-last in, channels-last out).

BINARY_OPS = ("add", "sub", "mul", "div", "pow")
UNARY_OPS = ("neg", "exp", "log", "sqrt", "abs")
binary(op, a, b) -> out              # a/b tensor or scalar; dtype = schema.result_dtype(a, b)
                                     # (div of ints -> float32, like torch)
compare(op, a, b) -> bool out        # op in eq ne lt le gt ge
binary_backward(gy, a, b, *, op_name, need_a=True, need_b=True) -> (ga | None, gb | None)
                                     # grads reduced to a's / b's shapes and dtypes; None for scalars
unary(op, x) -> y
unary_backward(gy, x=None, y=None, *, op_name) -> gx    # exp/sqrt use y; log/abs use x; neg neither
activation(x, *, act, alpha=0.01) -> y                  # act names from activations.ACTIVATIONS
activation_backward(gy, x=None, y=None, *, act, alpha=0.01) -> gx   # from y if x is None
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
"""
import math
import struct

import torch
import triton
import triton.language as tl

from ge2.backend.schema import broadcast_shapes, result_dtype
from ge2.kernels import activations
from ge2.kernels.activations import act_fwd, act_grad_from_y, act_grad_from_z
from ge2.runtime import autotune, cdiv

BINARY_OPS = ("add", "sub", "mul", "div", "pow")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
UNARY_OPS = ("neg", "exp", "log", "sqrt", "abs")

# Op codes of the binary kernel: arithmetic, comparisons, then the gradients of the unary ops as
# functions of (gy, saved tensor).
ADD, SUB, MUL, DIV, POW = (tl.constexpr(i) for i in range(5))
EQ, NE, LT, LE, GT, GE = (tl.constexpr(i) for i in range(5, 11))
EXP_GRAD, LOG_GRAD, SQRT_GRAD, ABS_GRAD, ACT_GRAD_FROM_Z, ACT_GRAD_FROM_Y = (tl.constexpr(i) for i in range(11, 17))
_BINARY_CODE = {name: i for i, name in enumerate(BINARY_OPS + COMPARE_OPS)}
_UNARY_GRAD_CODE = {"exp": EXP_GRAD, "log": LOG_GRAD, "sqrt": SQRT_GRAD, "abs": ABS_GRAD}

# Op codes of the unary kernel; ACTIVATION applies activations.act_fwd.
NEG, EXP, LOG, SQRT, ABS, ACTIVATION = (tl.constexpr(i) for i in range(6))
_UNARY_CODE = {name: i for i, name in enumerate(UNARY_OPS)}

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
def _binary_math(a, b, OP: tl.constexpr, ACT: tl.constexpr, alpha):
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
    else:  # ACT_GRAD_FROM_Y
        return a * act_grad_from_y(b, ACT, alpha)


@triton.jit
def _unary_math(x, OP: tl.constexpr, ACT: tl.constexpr, alpha):
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
    else:
        return act_fwd(x, ACT, alpha)


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
@triton.jit(do_not_specialize=["tune_size", "alpha"])
def _unary_kernel(
    x_ptr, y_ptr, n, tune_size, sizes, x_strides, alpha: "tl.int64",
    OP: tl.constexpr, ACT: tl.constexpr, COMPUTE: tl.constexpr,
    RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    x = tl.load(x_ptr + strided_offsets(i, sizes, x_strides, RANK), mask=mask).to(COMPUTE)
    y = _unary_math(x, OP, ACT, _float_arg(alpha, COMPUTE))
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=mask)


@_elementwise_autotune
@triton.jit(do_not_specialize=["tune_size", "a_scalar", "b_scalar", "alpha"])
def _binary_kernel(
    a_ptr, b_ptr, out_ptr, n, tune_size, sizes, a_strides, b_strides,
    a_scalar: "tl.int64", b_scalar: "tl.int64", alpha: "tl.int64",
    OP: tl.constexpr, ACT: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr,
    CAST: tl.constexpr, COMPUTE: tl.constexpr, RANK: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    i = linear_indices(n, BLOCK, WIDE)
    mask = i < n
    a = _operand(a_ptr, strided_offsets(i, sizes, a_strides, RANK), mask, a_scalar, A_SCALAR, CAST, COMPUTE)
    b = _operand(b_ptr, strided_offsets(i, sizes, b_strides, RANK), mask, b_scalar, B_SCALAR, CAST, COMPUTE)
    out = _binary_math(a, b, OP, ACT, _float_arg(alpha, COMPUTE))
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
        else:  # POW, like torch: 0 where the exponent is 0, and where the base is 0 for b >= 0
            ga = gy * tl.where(b == 0, 0.0, b * _pow(a, b - 1.0).to(COMPUTE))
            gb = gy * tl.where((a == 0) & (b >= 0), 0.0, (_pow(a, b) * tl.log(a.to(tl.float64))).to(COMPUTE))
    if NEED_A:
        tl.store(ga_ptr + i, ga.to(ga_ptr.dtype.element_ty), mask=mask)
    if NEED_B:
        tl.store(gb_ptr + i, gb.to(gb_ptr.dtype.element_ty), mask=mask)


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


def _binary_launch(code, a, b, out_dtype, cast, act=activations.NONE, alpha=0.0):
    launch = _Launch(_shape(a, b), [a, b], compute_dtype(cast))
    out = launch.empty(out_dtype, _device(a, b))
    if out.numel() == 0:
        return out
    launch.run(
        _binary_kernel, launch.pointer(0, out), launch.pointer(1, out), out,
        a_strides=launch.strides[0], b_strides=launch.strides[1],
        a_scalar=launch.scalar(0), b_scalar=launch.scalar(1), alpha=_float_bits(alpha),
        OP=code, ACT=act, A_SCALAR=launch.is_scalar(0), B_SCALAR=launch.is_scalar(1),
        CAST=_TL_DTYPE[cast], COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


def _unary_launch(code, x, out_dtype, act=activations.NONE, alpha=0.0):
    launch = _Launch(x.shape, [x], compute_dtype(x.dtype))
    out = launch.empty(out_dtype, x.device)
    if out.numel() == 0:
        return out
    launch.run(
        _unary_kernel, x, out, x_strides=launch.strides[0], alpha=_float_bits(alpha),
        OP=code, ACT=act, COMPUTE=_TL_DTYPE[launch.compute],
    )
    return out


# ---------------------------------------------------------------------------------------------
# Public launchers (the contract above)
# ---------------------------------------------------------------------------------------------
def binary(op: str, a, b) -> torch.Tensor:
    """a (op) b for op in BINARY_OPS, broadcast; a/b tensors or scalars -> [broadcast shape]."""
    dt = result_dtype(a, b)
    if op == "div" and not dt.is_floating_point:
        dt = torch.get_default_dtype()  # true division, like torch
    return _binary_launch(_BINARY_CODE[op], a, b, dt, dt)


def compare(op: str, a, b) -> torch.Tensor:
    """a (op) b for op in eq ne lt le gt ge, compared in the promoted dtype -> bool [broadcast shape]."""
    return _binary_launch(_BINARY_CODE[op], a, b, torch.bool, result_dtype(a, b))


def unary(op: str, x: torch.Tensor) -> torch.Tensor:
    """y = op(x) for op in UNARY_OPS -> [x.shape], x.dtype."""
    return _unary_launch(_UNARY_CODE[op], x, x.dtype)


def unary_backward(gy: torch.Tensor, x=None, y=None, *, op_name: str) -> torch.Tensor:
    """gx = gy * op'(x): exp and sqrt read y = op(x), log and abs read x -> [gy.shape]."""
    if op_name == "neg":
        return _unary_launch(NEG, gy, gy.dtype)
    saved = y if op_name in ("exp", "sqrt") else x
    dt = result_dtype(gy, saved)
    return _binary_launch(_UNARY_GRAD_CODE[op_name], gy, saved, dt, dt)


def activation(x: torch.Tensor, *, act: str, alpha: float = 0.01) -> torch.Tensor:
    """y = act(x) for act in activations.ACTIVATIONS -> [x.shape], x.dtype."""
    code = activations.act_code("activation", act, alpha)
    return _unary_launch(ACTIVATION, x, x.dtype, act=code, alpha=alpha)


def activation_backward(gy: torch.Tensor, x=None, y=None, *, act: str, alpha: float = 0.01) -> torch.Tensor:
    """gx = gy * act'(x), with act' read from y = act(x) when x is None -> [gy.shape]."""
    code = activations.act_code("activation_backward", act, alpha)
    saved, op = (x, ACT_GRAD_FROM_Z) if x is not None else (y, ACT_GRAD_FROM_Y)
    dt = result_dtype(gy, saved)
    return _binary_launch(op, gy, saved, dt, dt, act=code, alpha=alpha)


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
    from ge2.kernels import reduction  # the reduction launchers reuse this module's helpers

    want_a = need_a and isinstance(a, torch.Tensor)
    want_b = need_b and isinstance(b, torch.Tensor)
    if not (want_a or want_b):
        return None, None
    shape = tuple(gy.shape)
    compute = compute_dtype(gy.dtype)

    launch = _Launch(shape, [gy, a, b], compute)

    # A grad whose operand was broadcast is kept in the compute dtype until it is summed; both in
    # gy's layout.
    def buffer(t, wanted):
        if not wanted:
            return None
        return launch.empty(t.dtype if t.numel() == gy.numel() else compute, gy.device)

    ga, gb = buffer(a, want_a), buffer(b, want_b)
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

    def to_operand(g, t):
        if g is None:
            return None
        if t.numel() == gy.numel():
            return g.reshape(t.shape)
        return reduction.sum_to(g, tuple(t.shape), dtype=t.dtype)

    return to_operand(ga, a), to_operand(gb, b)

