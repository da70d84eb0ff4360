"""torch reference of the optimizer ops: torch.optim's single-tensor update rules, written out."""
from __future__ import annotations

import math

import torch

from ge2.backend.registry import register
from ge2.kernels.optim import BETA1, BETA1_POW, BETA2, BETA2_POW, EPS, LR, STEP, WEIGHT_DECAY


def _prepare(hyper: torch.Tensor) -> list[list[float]]:
    hyper[:, STEP] += 1
    hyper[:, BETA1_POW] *= hyper[:, BETA1]
    hyper[:, BETA2_POW] *= hyper[:, BETA2]
    return hyper.tolist()


@register("sgd_step", "torch", dtypes=(torch.float64,))
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
