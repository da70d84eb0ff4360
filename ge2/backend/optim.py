"""Optimizer ops: fused multi-tensor updates (kernels in ``ge2.kernels.optim``). All update in place.

``sgd_step(hyper, *, params, grads, momentum_buffers, group_ids, has_momentum, nesterov)``
``adam_step(hyper, *, params, grads, exp_avgs, exp_avg_sqs, group_ids, decoupled)``
    hyper: float64 [groups, HYPER_SLOTS] on the params' device (lr, betas/momentum, eps, weight decay,
    step and the derived bias corrections; slots in ``ge2.kernels.optim``); the op advances the step.
    params/grads/states: equal-length lists of contiguous tensors, grads[i] and states[i] shaped like
    params[i]; states fp32; group_ids[i] the row of hyper for params[i].
``rmsprop_step(hyper, *, params, grads, square_avgs, momentum_buffers, group_ids, has_momentum)``
``adagrad_step(hyper, *, params, grads, state_sums, group_ids)``
``lion_step(hyper, *, params, grads, exp_avgs, group_ids)``
    Every step op also takes ``scale=None, found_inf=None`` (fp32 [1] each, from ``ge2.amp.GradScaler``):
    grads divided by ``scale`` as they are read; the whole step (the step count too) skipped on the
    device when ``found_inf`` is nonzero.
``amp_unscale_(scale, *, grads, found_inf, found_total, write)``
    found_inf and found_total (fp32 [1]) set to 1 if any grad holds inf/NaN; ``write``: grads /= scale.
``amp_update_scale_(scale, *, growth_tracker, found_total, growth_factor, backoff_factor, growth_interval)``
    torch's dynamic loss scale (scale fp32 [1], growth_tracker int32 [1]) updated in place; found_total cleared.
``clip_grad_norm_(norm_out, *, grads, max_norm, norm_type=2.0) -> norm_out``
    norm_out: fp32 [1], receives the total norm of all grads; grads scaled in place by
    min(max_norm / (norm + 1e-6), 1). norm_type 2 or inf.
"""
from __future__ import annotations

import math
import numbers
import operator

import torch

from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, dtype_name, shape_str
from ge2.kernels import optim as K

HYPER = TensorArg("hyper", (torch.float64,), ndim=(2,))
_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")


def _lists_ok(hyper, params, grads, states: dict, group_ids) -> bool:
    """Every check of ``_check_lists`` at once, as C-level maps over the lists (this runs on every
    optimizer step's host path); False sends the caller to the loop that names the culprit."""
    shapes = list(map(_SHAPE, params))
    if shapes != list(map(_SHAPE, grads)) or list(map(_DTYPE, params)) != list(map(_DTYPE, grads)):
        return False
    tensors = [*params, *grads]
    for seq in states.values():
        if seq is None:
            continue
        if any(s is None for s in seq) or list(map(_SHAPE, seq)) != shapes or set(map(_DTYPE, seq)) != {torch.float32}:
            return False
        tensors += seq
    return (all(map(torch.Tensor.is_contiguous, tensors))
            and set(map(torch.Tensor.get_device, tensors)) == {hyper.get_device()}
            and (not group_ids or (min(group_ids) >= 0 and max(group_ids) < hyper.shape[0])))


def _check_lists(op: str, hyper, params, grads, states: dict, group_ids) -> None:
    n = len(params)
    if hyper.shape[1] != K.HYPER_SLOTS:
        raise ValueError(f"{op}: hyper must be [groups, {K.HYPER_SLOTS}], got {shape_str(hyper.shape)}")
    lists = {"grads": grads, "group_ids": group_ids, **states}
    for name, seq in lists.items():
        if seq is not None and len(seq) != n:
            raise ValueError(f"{op}: {name} has {len(seq)} entries but params has {n}")
    if _lists_ok(hyper, params, grads, states, group_ids):
        return
    for i, (p, g) in enumerate(zip(params, grads)):
        if tuple(g.shape) != tuple(p.shape) or g.dtype != p.dtype:
            raise ValueError(f"{op}: grads[{i}] is {shape_str(g.shape)} {dtype_name(g.dtype)} but params[{i}] is "
                             f"{shape_str(p.shape)} {dtype_name(p.dtype)}")
        for name, t in (("params", p), ("grads", g)):
            if not t.is_contiguous():
                raise ValueError(f"{op}: {name}[{i}] must be contiguous (shape {shape_str(t.shape)}, strides "
                                 f"{list(t.stride())})")
            if t.device != hyper.device:
                raise ValueError(f"{op}: {name}[{i}] is on {t.device} but hyper is on {hyper.device}")
        for name, seq in states.items():
            if seq is None:
                continue
            s = seq[i]
            if s is None or tuple(s.shape) != tuple(p.shape) or s.dtype != torch.float32 or not s.is_contiguous():
                got = "None" if s is None else f"{shape_str(s.shape)} {dtype_name(s.dtype)}"
                raise ValueError(f"{op}: {name}[{i}] must be a contiguous float32 {shape_str(p.shape)}, got {got}")
    for i, gid in enumerate(group_ids):
        if not 0 <= gid < hyper.shape[0]:
            raise ValueError(f"{op}: group_ids[{i}] = {gid} is outside 0..{hyper.shape[0] - 1}")


def _check_amp(op: str, device: torch.device, scale, found_inf) -> None:
    for name, t in (("scale", scale), ("found_inf", found_inf)):
        if t is not None and (t.numel() != 1 or t.dtype != torch.float32 or t.device != device):
            raise ValueError(f"{op}: {name} must be one float32 element on {device}, got {shape_str(t.shape)} "
                             f"{dtype_name(t.dtype)} on {t.device}")


def _check_sgd(op, hyper, *, params, grads, momentum_buffers, group_ids, has_momentum, nesterov, scale=None,
               found_inf=None) -> None:
    _check_amp(op, hyper.device, scale, found_inf)
    _check_lists(op, hyper, params, grads, {"momentum_buffers": momentum_buffers if has_momentum else None},
                 group_ids)


defop("sgd_step", Schema((HYPER,), _check_sgd))
register("sgd_step", "triton", dtypes=(torch.float64,))(
    lambda hyper, *, params, grads, momentum_buffers, group_ids, has_momentum, nesterov, scale=None, found_inf=None:
    K.sgd_step(hyper, params, grads, momentum_buffers, group_ids, has_momentum=has_momentum, nesterov=nesterov,
               scale=scale, found_inf=found_inf))


def _check_adam(op, hyper, *, params, grads, exp_avgs, exp_avg_sqs, group_ids, decoupled, scale=None,
                found_inf=None) -> None:
    _check_amp(op, hyper.device, scale, found_inf)
    _check_lists(op, hyper, params, grads, {"exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}, group_ids)


defop("adam_step", Schema((HYPER,), _check_adam))
register("adam_step", "triton", dtypes=(torch.float64,))(
    lambda hyper, *, params, grads, exp_avgs, exp_avg_sqs, group_ids, decoupled, scale=None, found_inf=None:
    K.adam_step(hyper, params, grads, exp_avgs, exp_avg_sqs, group_ids, decoupled=decoupled, scale=scale,
                found_inf=found_inf))


def _check_rmsprop(op, hyper, *, params, grads, square_avgs, momentum_buffers, group_ids, has_momentum, scale=None,
                   found_inf=None) -> None:
    _check_amp(op, hyper.device, scale, found_inf)
    _check_lists(op, hyper, params, grads, {"square_avgs": square_avgs,
                                            "momentum_buffers": momentum_buffers if has_momentum else None}, group_ids)


defop("rmsprop_step", Schema((HYPER,), _check_rmsprop))
register("rmsprop_step", "triton", dtypes=(torch.float64,))(
    lambda hyper, *, params, grads, square_avgs, momentum_buffers, group_ids, has_momentum, scale=None, found_inf=None:
    K.rmsprop_step(hyper, params, grads, square_avgs, momentum_buffers, group_ids, has_momentum=has_momentum,
                   scale=scale, found_inf=found_inf))


def _check_adagrad(op, hyper, *, params, grads, state_sums, group_ids, scale=None, found_inf=None) -> None:
    _check_amp(op, hyper.device, scale, found_inf)
    _check_lists(op, hyper, params, grads, {"state_sums": state_sums}, group_ids)


defop("adagrad_step", Schema((HYPER,), _check_adagrad))
register("adagrad_step", "triton", dtypes=(torch.float64,))(
    lambda hyper, *, params, grads, state_sums, group_ids, scale=None, found_inf=None:
    K.adagrad_step(hyper, params, grads, state_sums, group_ids, scale=scale, found_inf=found_inf))


def _check_lion(op, hyper, *, params, grads, exp_avgs, group_ids, scale=None, found_inf=None) -> None:
    _check_amp(op, hyper.device, scale, found_inf)
    _check_lists(op, hyper, params, grads, {"exp_avgs": exp_avgs}, group_ids)


defop("lion_step", Schema((HYPER,), _check_lion))
register("lion_step", "triton", dtypes=(torch.float64,))(
    lambda hyper, *, params, grads, exp_avgs, group_ids, scale=None, found_inf=None:
    K.lion_step(hyper, params, grads, exp_avgs, group_ids, scale=scale, found_inf=found_inf))


def _check_unscale(op, scale, *, grads, found_inf, found_total, write) -> None:
    _check_amp(op, scale.device, scale, found_inf)
    _check_amp(op, scale.device, None, found_total)
    for i, g in enumerate(grads):
        if not g.is_contiguous() or g.device != scale.device or g.dtype not in K._TL_DTYPES:
            raise ValueError(f"{op}: grads[{i}] must be a contiguous floating tensor on {scale.device}, got strides "
                             f"{list(g.stride())} {dtype_name(g.dtype)} on {g.device}")


defop("amp_unscale_", Schema((TensorArg("scale", (torch.float32,)),), _check_unscale))
register("amp_unscale_", "triton", dtypes=(torch.float32,))(
    lambda scale, *, grads, found_inf, found_total, write:
    K.amp_unscale_(scale, grads, found_inf, found_total, write=write))


def _check_update_scale(op, scale, *, growth_tracker, found_total, growth_factor, backoff_factor,
                        growth_interval) -> None:
    _check_amp(op, scale.device, scale, found_total)
    if growth_tracker.numel() != 1 or growth_tracker.dtype != torch.int32 or growth_tracker.device != scale.device:
        raise ValueError(f"{op}: growth_tracker must be one int32 element on {scale.device}, got "
                         f"{shape_str(growth_tracker.shape)} {dtype_name(growth_tracker.dtype)}")


defop("amp_update_scale_", Schema((TensorArg("scale", (torch.float32,)),), _check_update_scale))
register("amp_update_scale_", "triton", dtypes=(torch.float32,))(
    lambda scale, *, growth_tracker, found_total, growth_factor, backoff_factor, growth_interval:
    K.amp_update_scale_(scale, growth_tracker, found_total, growth_factor=growth_factor,
                        backoff_factor=backoff_factor, growth_interval=growth_interval))


def _check_clip(op, norm_out, *, grads, max_norm, norm_type=2.0) -> None:
    if norm_out.numel() != 1:
        raise ValueError(f"{op}: norm_out must have one element, got {shape_str(norm_out.shape)}")
    if not isinstance(max_norm, numbers.Real) or not max_norm >= 0:
        raise ValueError(f"{op}: max_norm must be a non-negative number, got {max_norm!r}")
    if norm_type not in (2, 2.0, math.inf):
        raise ValueError(f"{op}: norm_type must be 2 or inf, got {norm_type!r}")
    for i, g in enumerate(grads):
        if not g.is_contiguous():
            raise ValueError(f"{op}: grads[{i}] must be contiguous, got strides {list(g.stride())}")
        if g.device != norm_out.device:
            raise ValueError(f"{op}: grads[{i}] is on {g.device} but norm_out is on {norm_out.device}")


defop("clip_grad_norm_", Schema((TensorArg("norm_out", (torch.float32,)),), _check_clip))
register("clip_grad_norm_", "triton", dtypes=(torch.float32,))(
    lambda norm_out, *, grads, max_norm, norm_type=2.0:
    K.clip_grad_norm_(norm_out, grads, max_norm, norm_type == math.inf))
