"""Activations and their derivatives: one set of ``@triton.jit`` helpers shared by every kernel.

A kernel takes the activation as a constexpr code (``ACT``) and a runtime float ``alpha`` (the
leaky_relu slope), so each activation compiles to straight-line code with no branching.

Backward needs act'(z). For relu, leaky_relu (slope > 0), sigmoid and tanh it can be computed from
the output y alone, so kernels do not store the pre-activation z for them; gelu and silu need z.
relu passes the gradient at NaN inputs, like torch's threshold_backward (zero only where z <= 0).

The pointwise-only activations (``POINTWISE_ACTIVATIONS``: mish, softplus, elu/selu, hardswish,
hardtanh, logsigmoid) take up to three runtime parameters (``act_ex_fwd``/``act_ex_grad``); they
are not GEMM epilogues, so ``act_code`` refuses them there.

The ``lib_*`` helpers are accurate math for the pointwise kernels: libdevice on the GPU (Triton's
fp32 sin/cos/exp2 are hardware approximations), NumPy-backed ``tl`` builtins or plain arithmetic
under the interpreter, which cannot call libdevice.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ge2 import runtime

# The branch taken at compile time: libdevice exists only in compiled kernels.
_GPU = tl.constexpr(not runtime.is_interpreter())

NONE, RELU, LEAKY_RELU, GELU, GELU_TANH, SIGMOID, TANH, SILU = range(8)

ACTIVATIONS: dict[str, int] = {
    "none": NONE,
    "relu": RELU,
    "leaky_relu": LEAKY_RELU,
    "gelu": GELU,
    "gelu_tanh": GELU_TANH,
    "sigmoid": SIGMOID,
    "tanh": TANH,
    "silu": SILU,
}

# act'(z) recoverable from y = act(z): backward saves y (usually needed anyway) instead of z.
GRAD_FROM_Y = frozenset({NONE, RELU, LEAKY_RELU, SIGMOID, TANH})


def act_code(op: str, act: str, alpha: float = 0.01) -> int:
    """The constexpr code of activation ``act``; a clear error for unknown names or bad slopes."""
    code = ACTIVATIONS.get(act)
    if code is None:
        raise ValueError(f"{op}: unknown activation {act!r}; expected one of {', '.join(ACTIVATIONS)}")
    if code == LEAKY_RELU and not alpha > 0:
        # With slope <= 0 the sign of y no longer tells the sign of z, so act' is not recoverable.
        raise ValueError(f"{op}: leaky_relu slope must be > 0, got {alpha}")
    return code


def needs_z(code: int) -> bool:
    """Whether backward of this activation needs the pre-activation z (not only y)."""
    return code not in GRAD_FROM_Y


@triton.jit
def expm1(x):
    # Kahan's trick: (u - 1) * x / log(u) cancels the rounding error of u = exp(x), giving expm1
    # to a few ulps with only exp and log (libdevice's expm1 is unavailable in the interpreter).
    u = tl.exp(x)
    d = u - 1.0
    # The special cases (u == 1, 0, inf) are replaced below; feeding log a harmless 2 there
    # keeps 0/0 and log(0) out of the arithmetic.
    special = (d == 0.0) | (d == -1.0) | (u == float("inf"))
    r = d * x / tl.log(tl.where(special, 2.0, u))
    r = tl.where(d == 0.0, x, r)
    r = tl.where(d == -1.0, -1.0, r)
    return tl.where(u == float("inf"), float("inf"), r)


@triton.jit
def tanh(x):
    # tanh(|x|) = -e / (2 + e) with e = expm1(-2|x|): no overflow and no cancellation near 0.
    e = expm1(-2.0 * tl.abs(x))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def sigmoid(x):
    # Two branches so that exp never overflows: tiny outputs stay accurate for very negative x.
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def normal_cdf(z):
    """Phi(z), the standard normal CDF, for fp32 z: one exp2 and nine FMAs instead of erf's ~30 instructions.

    Phi(-t) = 2^(P(t) - t^2 / (2 ln 2)) for t = |z|, P of degree 8 fitted to log2 Phi(-t) + t^2 / (2 ln 2)
    on [0, 5] by least squares weighted by Phi(-t), the weight of P's error in Phi. Error in Phi <= 1e-7
    in fp32 arithmetic (+ ex2.approx's 2 ulps); gelu's error equals the erf form's (norm 1.2e-8 vs 1.3e-8
    against float64 on 680k points) and has no cancellation for z < 0. Past t = 5 (Phi(-5) = 2.9e-7)
    only the quadratic term grows. Why: in a GEMM's gelu epilogue the erf form's instructions, not the
    tensor cores, set the time (docs/gemm.md).
    """
    t = tl.minimum(tl.abs(z), 5.0)  # NaN z: min gives 5, the NaN comes back through z * z
    p = -2.77206027021748e-06 * t + 3.86208230338525e-05
    p = p * t - 1.825477520469576e-04
    p = p * t - 1.4587014447897673e-04
    p = p * t + 7.075472269207239e-03
    p = p * t - 5.250502750277519e-02
    p = p * t + 2.621425986289978e-01
    p = p * t - 1.1511057615280151
    p = p * t - 1.0
    q = fast_exp2((z * -0.7213475204444817) * z + p)  # Phi(-|z|)
    return tl.where(z >= 0, 1.0 - q, q)


@triton.jit
def fast_exp2(x):
    """2^x by the hardware's approximation on the GPU (2 ulps, denormal results flushed to 0): one MUFU, for
    hot epilogues; ``lib_exp2`` is the accurate one for the pointwise kernels."""
    if _GPU:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def act_fwd(z, ACT: tl.constexpr, alpha):
    """y = act(z), elementwise, in z's (fp32/fp64) precision."""
    if ACT == 1:  # relu; NaN stays NaN as in torch (maximum would drop it on the GPU)
        return tl.where(z <= 0, 0.0, z)
    elif ACT == 2:  # leaky_relu
        return tl.where(z > 0, z, z * alpha)
    elif ACT == 3:  # gelu (erf)
        if z.dtype == tl.float64:
            return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
        return z * normal_cdf(z)
    elif ACT == 4:  # gelu, tanh approximation
        return 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
    elif ACT == 5:  # sigmoid
        return sigmoid(z)
    elif ACT == 6:  # tanh
        return tanh(z)
    elif ACT == 7:  # silu
        return z * sigmoid(z)
    else:
        return z


@triton.jit
def act_grad_from_z(z, ACT: tl.constexpr, alpha):
    """act'(z) for every activation."""
    if ACT == 1:
        return tl.where(z <= 0, 0.0, 1.0)
    elif ACT == 2:
        return tl.where(z > 0, 1.0, alpha)
    elif ACT == 3:
        if z.dtype == tl.float64:
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        else:
            cdf = normal_cdf(z)
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
        return cdf + z * pdf
    elif ACT == 4:
        # 0.5 * (1 + tanh(u)) = sigmoid(2u) and 1 - tanh(u)^2 = 4 s (1 - s): no cancellation
        # where tanh(u) -> -1 (z < -1), which made the textbook form ~3x less accurate than torch.
        k: tl.constexpr = 0.7978845608028654  # constexpr: a plain local would be an fp32 scalar, inexact for fp64
        u2 = 2.0 * k * (z + 0.044715 * z * z * z)
        s = sigmoid(u2)
        return s + 2.0 * z * s * sigmoid(-u2) * k * (1.0 + 0.134145 * z * z)
    elif ACT == 5:
        s = sigmoid(z)
        return s * (1.0 - s)
    elif ACT == 6:
        t = tanh(z)
        return 1.0 - t * t
    elif ACT == 7:
        s = sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    else:
        return tl.full(z.shape, 1.0, z.dtype)


@triton.jit
def act_grad_from_y(y, ACT: tl.constexpr, alpha):
    """act'(z) from y = act(z); valid for the activations in GRAD_FROM_Y."""
    if ACT == 1:
        return tl.where(y <= 0, 0.0, 1.0)
    elif ACT == 2:
        return tl.where(y > 0, 1.0, alpha)
    elif ACT == 5:
        return y * (1.0 - y)
    elif ACT == 6:
        return 1.0 - y * y
    else:
        return tl.full(y.shape, 1.0, y.dtype)


# ---------------------------------------------------------------------------------------------
# Accurate math (libdevice on the GPU; NumPy-backed builtins or arithmetic in the interpreter)
# ---------------------------------------------------------------------------------------------
@triton.jit
def lib_sin(x):
    if _GPU:
        return libdevice.sin(x)
    else:
        return tl.sin(x)


@triton.jit
def lib_cos(x):
    if _GPU:
        return libdevice.cos(x)
    else:
        return tl.cos(x)


@triton.jit
def lib_exp2(x):
    if _GPU:
        return libdevice.exp2(x)
    else:
        return tl.exp2(x)


@triton.jit
def lib_log2(x):
    if _GPU:
        return libdevice.log2(x)
    else:
        return tl.log2(x)


@triton.jit
def lib_erf(x):
    if _GPU:
        return libdevice.erf(x)
    else:
        return tl.erf(x)


@triton.jit
def lib_expm1(x):
    if _GPU:
        return libdevice.expm1(x)
    else:
        return expm1(x)


@triton.jit
def lib_log1p(x):
    if _GPU:
        return libdevice.log1p(x)
    else:
        # log(u) * x / (u - 1) cancels the rounding of u = 1 + x (Goldberg's trick).
        u = 1.0 + x
        d = u - 1.0
        special = (d == 0.0) | (u == float("inf")) | (u <= 0.0)
        r = tl.log(tl.where(special, 2.0, u)) * x / tl.where(special, 1.0, d)
        r = tl.where(u == float("inf"), x, r)
        r = tl.where(u <= 0.0, tl.log(u), r)
        return tl.where(d == 0.0, x, r)


@triton.jit
def lib_trunc(x):
    if _GPU:
        return libdevice.trunc(x)
    else:
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def lib_rint(x):
    """x rounded to the nearest integer, ties to even (torch.round)."""
    if _GPU:
        return libdevice.rint(x)
    else:
        f = tl.floor(x)
        d = x - f  # exact
        odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
        r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
        return tl.where(r == 0.0, x * 0.0, r)  # keeps the sign of a zero result


@triton.jit
def lib_fmod(a, b):
    if _GPU:
        return libdevice.fmod(a, b)
    else:
        return a % b  # frem: NumPy's fmod in the interpreter


@triton.jit
def _atan_unit(t):
    # Two half-angle steps, atan(t) = 2 atan(t / (1 + sqrt(1 + t^2))), bring |t| <= 1 under
    # tan(pi/16) ~ 0.2, where 12 terms of the Taylor series reach fp64 accuracy.
    t = t / (1.0 + tl.sqrt(1.0 + t * t))
    t = t / (1.0 + tl.sqrt(1.0 + t * t))
    t2 = t * t
    p = t2 * (1.0 / 25.0) - 1.0 / 23.0
    p = p * t2 + 1.0 / 21.0
    p = p * t2 - 1.0 / 19.0
    p = p * t2 + 1.0 / 17.0
    p = p * t2 - 1.0 / 15.0
    p = p * t2 + 1.0 / 13.0
    p = p * t2 - 1.0 / 11.0
    p = p * t2 + 1.0 / 9.0
    p = p * t2 - 1.0 / 7.0
    p = p * t2 + 1.0 / 5.0
    p = p * t2 - 1.0 / 3.0
    return 4.0 * (t + t * t2 * p)


@triton.jit
def lib_atan2(y, x):
    if _GPU:
        return libdevice.atan2(y, x)
    else:
        ax = tl.abs(x)
        ay = tl.abs(y)
        big = tl.maximum(ax, ay)
        small = tl.minimum(ax, ay)
        both_inf = (ax == float("inf")) & (ay == float("inf"))
        t = tl.where(both_inf, 1.0, small / tl.where(big == 0.0, 1.0, big))
        a = _atan_unit(t)
        a = tl.where(ay > ax, 1.5707963267948966 - a, a)
        x_negative = (x < 0) | ((x == 0) & (1.0 / x < 0))
        a = tl.where(x_negative, 3.141592653589793 - a, a)
        y_negative = (y < 0) | ((y == 0) & (1.0 / y < 0))
        a = tl.where(y_negative, a * -1.0, a)  # not -a: Triton negates as 0 - a, losing -0.0
        return tl.where((x != x) | (y != y), x + y, a)


# ---------------------------------------------------------------------------------------------
# Pointwise-only activations with up to three parameters (p0, p1, p2)
# ---------------------------------------------------------------------------------------------
MISH, SOFTPLUS, ELU, HARDSWISH, HARDTANH, LOGSIGMOID = range(16, 22)

# name -> code; elu's parameters are (alpha, scale, input_scale) as in torch's elu kernel, so selu
# is elu with fixed ones; softplus's (beta, threshold); hardtanh's (min_val, max_val).
POINTWISE_ACTIVATIONS: dict[str, int] = {
    "mish": MISH, "softplus": SOFTPLUS, "elu": ELU, "hardswish": HARDSWISH, "hardtanh": HARDTANH,
    "logsigmoid": LOGSIGMOID,
}


@triton.jit
def _softplus(z, beta, threshold):
    # torch: linear above the threshold (of beta * z), else log1p(exp(beta z)) / beta.
    bz = z * beta
    return tl.where(bz > threshold, z, lib_log1p(tl.exp(bz)) / beta)


@triton.jit
def act_ex_fwd(z, ACT: tl.constexpr, p0, p1, p2):
    """y = act(z) for the POINTWISE_ACTIVATIONS, in z's (fp32/fp64) precision."""
    if ACT == 16:  # mish: z tanh(softplus(z))
        return z * tanh(lib_log1p(tl.exp(z)))
    elif ACT == 17:  # softplus(beta=p0, threshold=p1)
        return _softplus(z, p0, p1)
    elif ACT == 18:  # elu(alpha=p0, scale=p1, input_scale=p2)
        return tl.where(z <= 0, lib_expm1(z * p2) * (p0 * p1), z * p1)
    elif ACT == 19:  # hardswish
        return tl.where(z <= -3.0, 0.0, tl.where(z >= 3.0, z, z * (z + 3.0) / 6.0))
    elif ACT == 20:  # hardtanh(min_val=p0, max_val=p1); NaN stays NaN
        return tl.where(z < p0, p0, tl.where(z > p1, p1, z))
    else:  # logsigmoid: min(z, 0) - log1p(exp(-|z|))
        return tl.minimum(z, 0.0) - lib_log1p(tl.exp(-tl.abs(z)))


@triton.jit
def act_ex_grad(z, ACT: tl.constexpr, p0, p1, p2):
    """act'(z) for the POINTWISE_ACTIVATIONS, with torch's choices at the kinks."""
    if ACT == 16:
        s = sigmoid(z)
        t = tanh(lib_log1p(tl.exp(z)))
        return t + z * s * (1.0 - t * t)
    elif ACT == 17:
        bz = z * p0
        return tl.where(bz > p1, 1.0, sigmoid(bz))
    elif ACT == 18:
        return tl.where(z <= 0, tl.exp(z * p2) * (p0 * p1 * p2), p1)
    elif ACT == 19:
        return tl.where(z <= -3.0, 0.0, tl.where(z < 3.0, z / 3.0 + 0.5, 1.0))  # torch's CUDA kink values
    elif ACT == 20:  # zero at the bounds, like torch's hardtanh_backward
        return tl.where((z <= p0) | (z >= p1), 0.0, 1.0)
    else:
        e = tl.exp(-tl.abs(z))
        return tl.where(z < 0, 1.0 - e / (1.0 + e), e / (1.0 + e))


def act_ex_code(op: str, act: str) -> int:
    """The constexpr code of a pointwise-only activation; a clear error for unknown names."""
    code = POINTWISE_ACTIVATIONS.get(act)
    if code is None:
        names = ", ".join([*ACTIVATIONS, *POINTWISE_ACTIVATIONS])
        raise ValueError(f"{op}: unknown activation {act!r}; expected one of {names}")
    return code
