"""Normalisation layers: BatchNorm1d/2d, LayerNorm, RMSNorm (kernels in ``ge2.kernels.norm``)."""
from __future__ import annotations

import torch

from ge2 import runtime
from ge2.autograd.norm import add_layer_norm, batch_norm, layer_norm, rms_norm
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import shape_str
from ge2.nn.module import Module
from ge2.nn.parameter import Parameter


class _BatchNorm(Module):
    expected_ndim: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        if momentum is None:
            raise ValueError(f"{type(self).__name__}: momentum=None (cumulative average) is not supported; "
                             "pass a number in [0, 1]")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dev = runtime.resolve_device(device)
        dtype = dtype or torch.get_default_dtype()
        if affine:
            self.weight = Parameter(torch.ones(num_features, device=dev, dtype=dtype))
            self.bias = Parameter(torch.zeros(num_features, device=dev, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(torch.zeros(num_features, device=dev, dtype=dtype)))
            self.register_buffer("running_var", Tensor(torch.ones(num_features, device=dev, dtype=dtype)))
            self.register_buffer("num_batches_tracked", Tensor(torch.zeros((), dtype=torch.int64, device=dev)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, x: Tensor) -> Tensor:
        name = type(self).__name__
        if x.ndim not in self.expected_ndim:
            want = " or ".join(f"{n}-D" for n in self.expected_ndim)
            raise ValueError(f"{name}: expected {want} input, got shape {shape_str(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{name}: x {shape_str(x.shape)} has {x.shape[1]} channels but the layer has "
                             f"{self.num_features}")
        use_batch_stats = self.training or self.running_mean is None
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch_stats,
                          self.momentum, self.eps,
                          self.num_batches_tracked if self.training else None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over [N, C] or [N, C, L]."""

    expected_ndim = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over [N, C, H, W]."""

    expected_ndim = (4,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        dev = runtime.resolve_device(device)
        dtype = dtype or torch.get_default_dtype()
        if elementwise_affine:
            self.weight = Parameter(torch.ones(self.normalized_shape, device=dev, dtype=dtype))
            if bias:
                self.bias = Parameter(torch.zeros(self.normalized_shape, device=dev, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def add_forward(self, x: Tensor, residual: Tensor | None,
                    out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """(s, self(s)) with s = x + residual, from one kernel (``F.add_layer_norm``; out_dtype as there)."""
        return add_layer_norm(x, residual, self.normalized_shape, self.weight, self.bias, self.eps, out_dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(torch.ones(self.normalized_shape, device=runtime.resolve_device(device),
                                               dtype=dtype or torch.get_default_dtype()))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
