"""torch reference implementations of the loss ops."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ge2.backend.registry import register


def _grads(fn, x, *others, gy=None, wrt=(True,)):
    """Gradients of fn(x, *others) w.r.t. the inputs flagged in ``wrt`` (others[i] for wrt[i + 1])."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(w) if t is not None and w else t
                  for t, w in zip((x,) + others, wrt + (False,) * (len(others) + 1 - len(wrt)))]
        loss = fn(*leaves)
        need = [t for t, w in zip(leaves, wrt) if w and t is not None]
        grads = torch.autograd.grad(loss, need, torch.ones_like(loss) if gy is None else gy)
    return loss.detach(), grads


def _ce(logits, target, weight, ignore_index, reduction, label_smoothing):
    return F.cross_entropy(logits, target.long(), weight=weight.to(logits.dtype) if weight is not None else None,
                           ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)


@register("cross_entropy", "torch")
def cross_entropy(logits, target, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  check_targets=None):
    return _ce(logits, target, weight, ignore_index, reduction, label_smoothing)


@register("cross_entropy_fwd_bwd", "torch")
def cross_entropy_fwd_bwd(logits, target, weight=None, *, ignore_index=-100, reduction="mean",
                          label_smoothing=0.0, check_targets=None, inplace=False):
    loss, (g,) = _grads(lambda x: _ce(x, target, weight, ignore_index, reduction, label_smoothing), logits)
    if inplace:
        logits.copy_(g)
        g = logits
    return loss, g


@register("cross_entropy_backward", "torch")
def cross_entropy_backward(gy, dlogits):
    f = gy if gy.dim() == 0 or dlogits.dim() == 1 else gy.unsqueeze(1)
    dlogits.copy_(dlogits * f)
    return dlogits


def _nll(logp, target, weight, ignore_index, reduction):
    return F.nll_loss(logp, target.long(), weight=weight.to(logp.dtype) if weight is not None else None,
                      ignore_index=ignore_index, reduction=reduction)


@register("nll_loss", "torch")
def nll_loss(logp, target, weight=None, *, ignore_index=-100, reduction="mean", check_targets=None):
    return _nll(logp, target, weight, ignore_index, reduction)


@register("nll_loss_backward", "torch")
def nll_loss_backward(gy, logp, target, weight=None, *, ignore_index=-100, reduction="mean"):
    return _grads(lambda x: _nll(x, target, weight, ignore_index, reduction), logp, gy=gy)[1][0]


@register("mse_loss", "torch")
def mse_loss(x, target, *, reduction="mean"):
    return F.mse_loss(x, target, reduction=reduction)


@register("mse_loss_backward", "torch")
def mse_loss_backward(gy, x, target, *, reduction="mean", need_x=True, need_target=False):
    _, grads = _grads(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, target, gy=gy,
                      wrt=(need_x, need_target))
    grads = list(grads)
    return (grads.pop(0) if need_x else None), (grads.pop(0) if need_target else None)


def _bce(x, target, weight, pos_weight, reduction):
    return F.binary_cross_entropy_with_logits(x, target, weight=weight, pos_weight=pos_weight, reduction=reduction)


@register("binary_cross_entropy_with_logits", "torch")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, *, reduction="mean"):
    return _bce(x, target, weight, pos_weight, reduction)


@register("binary_cross_entropy_with_logits_backward", "torch")
def binary_cross_entropy_with_logits_backward(gy, x, target, weight=None, pos_weight=None, *, reduction="mean",
                                              need_x=True, need_target=False):
    _, grads = _grads(lambda a, b: _bce(a, b, weight, pos_weight, reduction), x, target, gy=gy,
                      wrt=(need_x, need_target))
    grads = list(grads)
    return (grads.pop(0) if need_x else None), (grads.pop(0) if need_target else None)


def _lce(x, weight, bias, target, class_weight, ignore_index, reduction, label_smoothing, transposed_weight):
    logits = x @ (weight if transposed_weight else weight.t())
    return _ce(logits + bias if bias is not None else logits, target, class_weight, ignore_index, reduction,
               label_smoothing)


@register("linear_cross_entropy", "torch", dtypes=(torch.float16, torch.bfloat16, torch.float32))
def linear_cross_entropy(x, weight, bias, target, class_weight=None, *, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, transposed_weight=False, chunk_rows=None, check_targets=None,
                         out_dtype=None, need_x=True, need_weight=True, need_bias=True):
    def f(x_, w_, b_):
        return _lce(x_, w_, b_, target, class_weight, ignore_index, reduction, label_smoothing, transposed_weight)

    if reduction == "none":
        need_x = need_weight = need_bias = False
    has_bias = bias is not None
    loss, grads = _grads(f, x, weight, bias, wrt=(need_x, need_weight, need_bias and has_bias))
    grads = list(grads)
    out = [grads.pop(0) if n else None for n in (need_x, need_weight, need_bias and has_bias)]
    return (loss.to(out_dtype or x.dtype), *out)


@register("linear_cross_entropy_rows_backward", "torch", dtypes=(torch.float16, torch.bfloat16, torch.float32))
def linear_cross_entropy_rows_backward(gy, x, weight, bias, target, class_weight=None, *, ignore_index=-100,
                                       label_smoothing=0.0, transposed_weight=False, chunk_rows=None,
                                       need_x=True, need_weight=True, need_bias=True, **_attrs):
    def f(x_, w_, b_):
        return _lce(x_, w_, b_, target, class_weight, ignore_index, "none", label_smoothing, transposed_weight)

    has_bias = bias is not None
    _, grads = _grads(f, x, weight, bias, gy=gy.to(x.dtype), wrt=(need_x, need_weight, need_bias and has_bias))
    grads = list(grads)
    return tuple(grads.pop(0) if n else None for n in (need_x, need_weight, need_bias and has_bias))


@register("linear_cross_entropy_backward", "torch")
def linear_cross_entropy_backward(gy, dx=None, dweight=None, dbias=None):
    return tuple(g.copy_(g * gy) if g is not None else None for g in (dx, dweight, dbias))
