"""Activation layers (ReLU, GELU, ...) and the functional forms that ``ge2.autograd.math`` lacks."""
from __future__ import annotations

from ge2.autograd.math import activation, relu, sigmoid, tanh
from ge2.autograd.tensor import Tensor
from ge2.nn.module import Module


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x if x > 0 else negative_slope * x (slope > 0)."""
    return activation(x, "leaky_relu", negative_slope)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x) (erf form), or the tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return activation(x, "gelu" if approximate == "none" else "gelu_tanh")


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return activation(x, "silu")


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


class SiLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return silu(x)


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
