"""torch reference of the optimizer ops: torch.optim's single-tensor update rules, written out."""
from __future__ import annotations

import math

import torch

from ge2.backend.registry import register
from ge2.kernels.optim import ALPHA, BETA1, BETA1_POW, BETA2, BETA2_POW, EPS, LR, LR_DECAY, MOMENTUM, STEP, WEIGHT_DECAY


def _prepare(hyper: torch.Tensor) -> list[list[float]]:
    hyper[:, STEP] += 1
    hyper[:, BETA1_POW] *= hyper[:, BETA1]
    hyper[:, BETA2_POW] *= hyper[:, BETA2]
    return hyper.tolist()


def _loss_scaled(update):
    """The update with GradScaler's arguments: skipped when found_inf is set, grads divided by scale."""
    def run(hyper, *, grads, scale=None, found_inf=None, **kwargs):
        if found_inf is not None and found_inf.item() != 0:
            return None
        if scale is not None:
            inv = scale.double().reciprocal().float()
            grads = [(g.float() * inv).to(g.dtype) for g in grads]
        return update(hyper, grads=grads, **kwargs)
    return run


@register("sgd_step", "torch", dtypes=(torch.float64,))
@_loss_scaled
def sgd_step(hyper, *, params, grads, momentum_buffers, group_ids, has_momentum, nesterov):
    rows = _prepare(hyper)
    for i, (p, g, gid) in enumerate(zip(params, grads, group_ids)):
        h = rows[gid]
        d = g.float() + h[WEIGHT_DECAY] * p.float() if h[WEIGHT_DECAY] != 0 else g.float()
        if has_momentum:
            buf = momentum_buffers[i]
            if h[STEP] == 1:
                buf.copy_(d)
            else:
                buf.mul_(h[BETA1]).add_(d, alpha=1 - h[BETA2])
            d = d + h[BETA1] * buf if nesterov else buf
        p.copy_((p.float() - h[LR] * d).to(p.dtype))


@register("adam_step", "torch", dtypes=(torch.float64,))
@_loss_scaled
def adam_step(hyper, *, params, grads, exp_avgs, exp_avg_sqs, group_ids, decoupled):
    rows = _prepare(hyper)
    for p, g, m, v, gid in zip(params, grads, exp_avgs, exp_avg_sqs, group_ids):
        h = rows[gid]
        p32, g32 = p.float(), g.float()
        if decoupled:
            p32 = p32 * (1 - h[LR] * h[WEIGHT_DECAY])
        elif h[WEIGHT_DECAY] != 0:
            g32 = g32 + h[WEIGHT_DECAY] * p32
        m.lerp_(g32, 1 - h[BETA1])
        v.mul_(h[BETA2]).addcmul_(g32, g32, value=1 - h[BETA2])
        step_size = h[LR] / (1 - h[BETA1_POW])
        denom = v.sqrt() / math.sqrt(1 - h[BETA2_POW]) + h[EPS]
        p.copy_((p32 - step_size * (m / denom)).to(p.dtype))


@register("rmsprop_step", "torch", dtypes=(torch.float64,))
@_loss_scaled
def rmsprop_step(hyper, *, params, grads, square_avgs, momentum_buffers, group_ids, has_momentum):
    rows = _prepare(hyper)
    for i, (p, g, v, gid) in enumerate(zip(params, grads, square_avgs, group_ids)):
        h = rows[gid]
        g32 = g.float() + h[WEIGHT_DECAY] * p.float() if h[WEIGHT_DECAY] != 0 else g.float()
        v.mul_(h[ALPHA]).addcmul_(g32, g32, value=1 - h[ALPHA])
        avg = v.sqrt().add_(h[EPS])
        if has_momentum:
            buf = momentum_buffers[i]
            buf.mul_(h[MOMENTUM]).addcdiv_(g32, avg)
            p.copy_((p.float() - h[LR] * buf).to(p.dtype))
        else:
            p.copy_(p.float().addcdiv(g32, avg, value=-h[LR]).to(p.dtype))


@register("adagrad_step", "torch", dtypes=(torch.float64,))
@_loss_scaled
def adagrad_step(hyper, *, params, grads, state_sums, group_ids):
    rows = _prepare(hyper)
    for p, g, acc, gid in zip(params, grads, state_sums, group_ids):
        h = rows[gid]
        g32 = g.float() + h[WEIGHT_DECAY] * p.float() if h[WEIGHT_DECAY] != 0 else g.float()
        clr = h[LR] / (1 + (h[STEP] - 1) * h[LR_DECAY])
        acc.addcmul_(g32, g32, value=1)
        p.copy_(p.float().addcdiv(g32, acc.sqrt().add_(h[EPS]), value=-clr).to(p.dtype))


@register("lion_step", "torch", dtypes=(torch.float64,))
@_loss_scaled
def lion_step(hyper, *, params, grads, exp_avgs, group_ids):
    rows = _prepare(hyper)
    for p, g, m, gid in zip(params, grads, exp_avgs, group_ids):
        h = rows[gid]
        p32 = p.float() * (1 - h[LR] * h[WEIGHT_DECAY])
        update = m.lerp(g.float(), 1 - h[BETA1]).sign_()
        p.copy_((p32 - h[LR] * update).to(p.dtype))
        m.lerp_(g.float(), 1 - h[BETA2])


@register("amp_unscale_", "torch", dtypes=(torch.float32,))
def amp_unscale_(scale, *, grads, found_inf, found_total, write):
    targets = grads if write else [g.clone() for g in grads]
    inv = scale.double().reciprocal().float()
    for dtype in {g.dtype for g in targets}:
        torch._amp_foreach_non_finite_check_and_unscale_([g for g in targets if g.dtype == dtype], found_inf, inv)
    found_total.copy_(torch.maximum(found_total, found_inf))


@register("amp_update_scale_", "torch", dtypes=(torch.float32,))
def amp_update_scale_(scale, *, growth_tracker, found_total, growth_factor, backoff_factor, growth_interval):
    torch._amp_update_scale_(scale, growth_tracker, found_total, growth_factor, backoff_factor, growth_interval)
    found_total.zero_()


@register("clip_grad_norm_", "torch", dtypes=(torch.float32,))
def clip_grad_norm_(norm_out, *, grads, max_norm, norm_type=2.0):
    if grads:
        norms = torch.stack([torch.linalg.vector_norm(g.float(), norm_type) for g in grads])
        total = torch.linalg.vector_norm(norms, norm_type)
    else:
        total = torch.zeros((), device=norm_out.device)
    norm_out.copy_(total.reshape(norm_out.shape))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return norm_out
