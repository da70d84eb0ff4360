"""Parameter initialisers (in place, under no_grad), with torch's formulas and torch's RNG fills.

The bounds are computed in Python; the random fill is torch's ``uniform_``/``normal_`` on the
tensor's memory (an allowed RNG fill), so with the same seed ge2 and torch layers start from the
same numbers.
"""
from __future__ import annotations

import math

import torch

from ge2 import runtime
from ge2.autograd.tensor import Tensor

_GAINS = {"linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3,
          "relu": math.sqrt(2.0), "selu": 3.0 / 4}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain)."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in _GAINS:
        raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}; expected leaky_relu or one of "
                         f"{', '.join(_GAINS)}")
    return _GAINS[nonlinearity]


def _fans(t: Tensor) -> tuple[int, int]:
    if t.ndim < 2:
        raise ValueError(f"init: fan in and fan out need a tensor of at least 2 dims, got shape {list(t.shape)}")
    receptive = 1
    for s in t.shape[2:]:
        receptive *= s
    return t.shape[1] * receptive, t.shape[0] * receptive


def _fan(t: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(t)
    return fan_in if mode == "fan_in" else fan_out


def _fill(t: Tensor, fn) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"init: expected a ge2 Tensor, got {type(t).__name__}")
    fn(t.data)
    t._version_counter.value += 1
    return t


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with U(a, b)."""
    return _fill(t, lambda d: d.uniform_(a, b))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with N(mean, std^2)."""
    return _fill(t, lambda d: d.normal_(mean, std))


def constant_(t: Tensor, value: float) -> Tensor:
    return _fill(t, lambda d: d.fill_(value))


def zeros_(t: Tensor) -> Tensor:
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    return constant_(t, 1.0)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot)."""
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan) (He); torch's Linear default is a = sqrt(5)."""
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / _fan(t, mode))
    return uniform_(t, -bound, bound)


def kaiming_normal_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """N(0, std^2) with std = gain / sqrt(fan)."""
    return normal_(t, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(t, mode)))


def default_layer_init_(weight: Tensor, bias: Tensor | None) -> None:
    """torch's default for Linear and Conv layers: kaiming_uniform_(a=√5) weights, U(±1/√fan_in) bias."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = _fans(weight)[0]
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)


def add_layer_parameters(module, weight_shape: tuple[int, ...], out_features: int, bias: bool, device=None,
                         dtype: torch.dtype | None = None) -> None:
    """Register ``weight`` [weight_shape] and ``bias`` [out_features] (or None) on a Linear/Conv layer,
    on ``device`` in ``dtype`` (default: torch's default dtype), and give them torch's default init."""
    from ge2.nn.parameter import Parameter

    dev = runtime.resolve_device(device)
    dtype = dtype or torch.get_default_dtype()
    module.weight = Parameter(torch.empty(weight_shape, device=dev, dtype=dtype))
    if bias:
        module.bias = Parameter(torch.empty(out_features, device=dev, dtype=dtype))
    else:
        module.register_parameter("bias", None)
    module.reset_parameters()
