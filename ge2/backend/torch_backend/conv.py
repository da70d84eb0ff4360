"""torch reference implementations of the conv2d ops (the oracle the tests compare with)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ge2.backend.conv import CONV_DTYPES
from ge2.backend.registry import register
from ge2.backend.torch_backend.elementwise import _ACT
from ge2.backend.torch_backend.gemm import _act_grad
from ge2.kernels import activations
from ge2.kernels.conv import empty_like_layout


def _torch_padding(padding):
    return padding if isinstance(padding, str) else tuple(padding) if isinstance(padding, (tuple, list)) else padding


def _in_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return empty_like_layout(tuple(t.shape), like, t.dtype).copy_(t)


@register("conv2d", "torch", dtypes=CONV_DTYPES)
def conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, act="none", act_alpha=0.01,
           save_z=False):
    # fp32 accumulation and epilogue, like the kernel.
    z = F.conv2d(x.float(), weight.float(), bias.float() if bias is not None else None, stride,
                 _torch_padding(padding), dilation, groups)
    y = _ACT[act](z, act_alpha)
    keep_z = save_z and activations.needs_z(activations.act_code("conv2d", act, act_alpha))
    return _in_layout(y.to(x.dtype), x), (_in_layout(z.to(x.dtype), x) if keep_z else None)


@register("conv2d_backward", "torch", dtypes=CONV_DTYPES)
def conv2d_backward(gy, x, weight, saved=None, *, stride=1, padding=0, dilation=1, groups=1, has_bias=False,
                    act="none", act_alpha=0.01, from_z=False, need_x=True, need_w=True):
    saved32 = saved.float() if saved is not None else None
    gz = gy.float() * _act_grad(saved32 if from_z else None, None if from_z else saved32, act, act_alpha) \
        if act != "none" else gy.float()
    gz_op = gz.to(x.dtype).float()  # the kernel's dX/dW GEMMs read gZ rounded to the operands' dtype
    dx = dw = None
    if need_x or need_w:
        with torch.enable_grad():
            xr = x.detach().float().requires_grad_(need_x)
            wr = weight.detach().float().requires_grad_(need_w)
            out = F.conv2d(xr, wr, None, stride, _torch_padding(padding), dilation, groups)
            wanted = [t for t, need in ((xr, need_x), (wr, need_w)) if need]
            grads = list(torch.autograd.grad(out, wanted, gz_op))
        if need_x:
            dx = _in_layout(grads.pop(0).to(x.dtype), x)
        if need_w:
            dw = grads.pop(0).to(weight.dtype).contiguous()
    dbias = gz.sum((0, 2, 3)).to(gy.dtype) if has_bias else None
    return dx, dw, dbias
