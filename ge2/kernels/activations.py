"""Activations and their derivatives: one set of ``@triton.jit`` helpers shared by every kernel.

A kernel takes the activation as a constexpr code (``ACT``) and a runtime float ``alpha`` (the
leaky_relu slope), so each activation compiles to straight-line code with no branching.

Backward needs act'(z). For relu, leaky_relu (slope > 0), sigmoid and tanh it can be computed from
the output y alone, so kernels do not store the pre-activation z for them; gelu and silu need z.
"""
from __future__ import annotations

import triton
import triton.language as tl

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
def act_fwd(z, ACT: tl.constexpr, alpha):
    """y = act(z), elementwise, in z's (fp32/fp64) precision."""
    if ACT == 1:  # relu
        return tl.maximum(z, 0.0)
    elif ACT == 2:  # leaky_relu
        return tl.where(z > 0, z, z * alpha)
    elif ACT == 3:  # gelu (erf)
        return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
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
        return tl.where(z > 0, 1.0, 0.0)
    elif ACT == 2:
        return tl.where(z > 0, 1.0, alpha)
    elif ACT == 3:
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
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
        return tl.where(y > 0, 1.0, 0.0)
    elif ACT == 2:
        return tl.where(y > 0, 1.0, alpha)
    elif ACT == 5:
        return y * (1.0 - y)
    elif ACT == 6:
        return 1.0 - y * y
    else:
        return tl.full(y.shape, 1.0, y.dtype)
