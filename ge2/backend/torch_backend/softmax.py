"""torch reference implementations of the softmax ops (with ge2's all -inf row rule)."""
from __future__ import annotations

import torch

from ge2.backend.registry import register


def _scaled(x, mask, scale):
    z = x * scale if scale != 1.0 else x
    return z + mask if mask is not None else z


def _dead_rows(z, dim):
    """Rows that are -inf everywhere: torch gives NaN there, ge2 defines 0 (softmax) / -inf (log)."""
    return (z == float("-inf")).all(dim, keepdim=True)


@register("softmax", "torch")
def softmax(x, mask=None, *, dim=-1, scale=1.0):
    z = _scaled(x, mask, scale)
    y = torch.softmax(z, dim).to(x.dtype)
    return torch.where(_dead_rows(z, dim), torch.zeros((), dtype=x.dtype, device=x.device), y).contiguous()


@register("log_softmax", "torch")
def log_softmax(x, mask=None, *, dim=-1, scale=1.0):
    z = _scaled(x, mask, scale)
    y = torch.log_softmax(z, dim).to(x.dtype)
    return torch.where(_dead_rows(z, dim), torch.full((), float("-inf"), dtype=x.dtype, device=x.device),
                       y).contiguous()


@register("softmax_backward", "torch")
def softmax_backward(gy, y, *, dim=-1, scale=1.0):
    return (scale * y * (gy - (gy * y).sum(dim, keepdim=True))).to(y.dtype).contiguous()


@register("log_softmax_backward", "torch")
def log_softmax_backward(gy, y, *, dim=-1, scale=1.0):
    return (scale * (gy - torch.exp(y) * gy.sum(dim, keepdim=True))).to(y.dtype).contiguous()
