"""Activation layers (ReLU, GELU, ...) and the functional forms that ``ge2.autograd.math`` lacks.

The ``inplace=True`` forms write the result into x (through ``autograd.math.inplace``: refused on a
leaf that requires grad, recorded on a non-leaf), as torch's do.
"""
from __future__ import annotations

from ge2.autograd.math import activation, activation_ex, glu, inplace, inplace_source, relu, sigmoid, tanh
from ge2.autograd.tensor import Tensor
from ge2.nn.module import Module

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _maybe_inplace(x: Tensor, fn, inplace_: bool, name: str) -> Tensor:
    """fn(x), written into x when ``inplace_``."""
    if not inplace_:
        return fn(x)
    src = inplace_source(x)
    return inplace(x, lambda: fn(src), f"{name}_")


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x if x > 0 else negative_slope * x (slope > 0)."""
    return activation(x, "leaky_relu", negative_slope)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x) (erf form), or the tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return activation(x, "gelu" if approximate == "none" else "gelu_tanh")


def silu(x: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x)."""
    return _maybe_inplace(x, lambda t: activation(t, "silu"), inplace, "silu")


def mish(x: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    return _maybe_inplace(x, lambda t: activation_ex(t, "mish"), inplace, "mish")


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold."""
    return activation_ex(x, "softplus", beta, threshold)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return _maybe_inplace(x, lambda t: activation_ex(t, "elu", alpha, 1.0, 1.0), inplace, "elu")


def selu(x: Tensor, inplace: bool = False) -> Tensor:
    """scale * elu(x, alpha) with the self-normalising constants."""
    return _maybe_inplace(x, lambda t: activation_ex(t, "elu", _SELU_ALPHA, _SELU_SCALE, 1.0), inplace, "selu")


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6."""
    return _maybe_inplace(x, lambda t: activation_ex(t, "hardswish"), inplace, "hardswish")


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """x clamped to [min_val, max_val]; the gradient is zero at and beyond the bounds."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _maybe_inplace(x, lambda t: activation_ex(t, "hardtanh", min_val, max_val), inplace, "hardtanh")


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6)."""
    return hardtanh(x, 0.0, 6.0, inplace)


def logsigmoid(x: Tensor) -> Tensor:
    """log(sigmoid(x)), without overflow."""
    return activation_ex(x, "logsigmoid")


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return tanh(x)


class _InplaceActivation(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class SiLU(_InplaceActivation):
    def forward(self, x: Tensor) -> Tensor:
        return silu(x, self.inplace)


class Mish(_InplaceActivation):
    def forward(self, x: Tensor) -> Tensor:
        return mish(x, self.inplace)


class SELU(_InplaceActivation):
    def forward(self, x: Tensor) -> Tensor:
        return selu(x, self.inplace)


class Hardswish(_InplaceActivation):
    def forward(self, x: Tensor) -> Tensor:
        return hardswish(x, self.inplace)


class ELU(_InplaceActivation):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return elu(x, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Hardtanh(_InplaceActivation):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor:
        return hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return logsigmoid(x)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        from ge2.nn import functional as F

        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, x: Tensor) -> Tensor:
        from ge2.nn import functional as F

        return F.log_softmax(x, self.dim)
