"""``Linear`` (with an optional fused activation), ``Identity`` and ``Flatten``."""
from __future__ import annotations

import torch

from ge2.autograd.linear import linear
from ge2.autograd.math import flatten
from ge2.autograd.tensor import Tensor
from ge2.kernels import activations
from ge2.nn import init
from ge2.nn.module import Module


class Linear(Module):
    """y = act(x W^T + b): W [out, in], b [out]; ``activation`` fuses the activation into the GEMM's epilogue.

    Initialised like torch.nn.Linear (kaiming-uniform W with a = sqrt(5), uniform b in +-1/sqrt(in)),
    with torch's RNG, so the same seed gives the same weights as torch.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 negative_slope: float = 0.01, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        if activation is not None:
            activations.act_code("Linear", activation, negative_slope)
        self.in_features, self.out_features = in_features, out_features
        self.activation, self.negative_slope = activation, negative_slope
        init.add_layer_parameters(self, (out_features, in_features), out_features, bias, device, dtype)

    def reset_parameters(self) -> None:
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.activation, self.negative_slope)

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        if self.activation is not None:
            s += f", activation={self.activation!r}"
        return s


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Flatten(Module):
    """Merge dims start_dim..end_dim (default: all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
