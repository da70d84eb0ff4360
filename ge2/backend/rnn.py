"""Recurrence ops of RNN / LSTM / GRU layers (kernels in ``ge2.kernels.rnn``); one direction of one layer.

``rnn_forward(gx, w_hh, b_hh, h0, c0, lengths, *, mode, reverse, save, path=None) -> (y, hn, cn, hp, cp, sv)``
    gx [T, B, NG H] (x @ W_ih^T + b_ih), w_hh [NG H, H], b_hh [NG H] or None, h0 [B, H], c0 [B, H]
    (lstm only), lengths int64 [B] or None (row b runs steps 0..len_b-1). mode "rnn_tanh" |
    "rnn_relu" | "lstm" | "gru"; NG = 1, 1, 4, 3. y [T, B, H] (0 on padding), hn / cn [B, H];
    hp, cp, sv the tensors backward needs (None unless ``save``).
``rnn_backward(dy, dhn, dcn, w_hh, lengths, hp, cp, sv, *, mode, reverse, path=None) -> (dgx, dgh, dh0, dc0)``
    dgx / dgh [T, B, NG H]: gradients of the input projection / of W_hh h_prev + b_hh.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import rnn as K

RNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PATHS = (None, "persistent", "stepwise")


def _mode(op: str, mode) -> int:
    if mode not in K.MODES:
        raise ValueError(f"{op}: mode must be one of {tuple(K.MODES)}, got {mode!r}")
    return K.MODES[mode]


def _want(op: str, name: str, t, shape) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must be {shape_str(shape)}, got {shape_str(t.shape)}")


def _check_lengths(op: str, lengths, T: int, B: int) -> None:
    if lengths is None:
        return
    if lengths.dtype != torch.int64 or tuple(lengths.shape) != (B,):
        raise ValueError(f"{op}: lengths must be int64 [{B}], got {lengths.dtype} {shape_str(lengths.shape)}")


def _check_forward(op, gx, w_hh, b_hh=None, h0=None, c0=None, lengths=None, *, mode, reverse, save, path=None):
    m = _mode(op, mode)
    T, B, G = gx.shape
    H = w_hh.shape[1]
    _want(op, "w_hh", w_hh, (K.GATES[m] * H, H))
    _want(op, "gx", gx, (T, B, K.GATES[m] * H))
    _want(op, "b_hh", b_hh, (K.GATES[m] * H,))
    _want(op, "h0", h0, (B, H))
    if (c0 is None) != (m != 2):
        raise ValueError(f"{op}: c0 is needed by lstm and only by lstm (mode {mode!r})")
    _want(op, "c0", c0, (B, H))
    _check_lengths(op, lengths, T, B)
    if path not in PATHS:
        raise ValueError(f"{op}: path must be one of {PATHS}, got {path!r}")


def _check_backward(op, dy, dhn, dcn, w_hh, lengths, hp, cp, sv, *, mode, reverse, path=None):
    m = _mode(op, mode)
    T, B, H = dy.shape
    _want(op, "dhn", dhn, (B, H))
    _want(op, "dcn", dcn, (B, H))
    _want(op, "w_hh", w_hh, (K.GATES[m] * H, H))
    _want(op, "hp", hp, (T, B, H))
    _want(op, "sv", sv, (T, B, K.SAVED[m] * H))
    _check_lengths(op, lengths, T, B)
    if path not in PATHS:
        raise ValueError(f"{op}: path must be one of {PATHS}, got {path!r}")


defop("rnn_forward", Schema((TensorArg("gx", RNN_DTYPES, ndim=(3,)), TensorArg("w_hh", RNN_DTYPES, ndim=(2,)),
                             TensorArg("b_hh", RNN_DTYPES, ndim=(1,), optional=True),
                             TensorArg("h0", RNN_DTYPES, ndim=(2,)),
                             TensorArg("c0", RNN_DTYPES, ndim=(2,), optional=True),
                             TensorArg("lengths", (torch.int64,), ndim=(1,), optional=True)), _check_forward))


@register("rnn_forward", "triton", dtypes=RNN_DTYPES)
def _rnn_forward(gx, w_hh, b_hh, h0, c0=None, lengths=None, *, mode, reverse, save, path=None):
    return K.rnn_forward(gx, w_hh, b_hh, h0, c0, lengths, mode=K.MODES[mode], reverse=reverse, save=save,
                         path=path)


defop("rnn_backward", Schema((TensorArg("dy", RNN_DTYPES, ndim=(3,)), TensorArg("dhn", RNN_DTYPES, ndim=(2,)),
                              TensorArg("dcn", RNN_DTYPES, ndim=(2,), optional=True),
                              TensorArg("w_hh", RNN_DTYPES, ndim=(2,)),
                              TensorArg("lengths", (torch.int64,), ndim=(1,), optional=True),
                              TensorArg("hp", RNN_DTYPES, ndim=(3,)),
                              TensorArg("cp", (torch.float32,), ndim=(3,), optional=True),
                              TensorArg("sv", (torch.float32,), ndim=(3,))), _check_backward))


@register("rnn_backward", "triton", dtypes=RNN_DTYPES)
def _rnn_backward(dy, dhn, dcn, w_hh, lengths, hp, cp, sv, *, mode, reverse, path=None):
    return K.rnn_backward(dy, dhn, dcn, w_hh, lengths, hp, cp, sv, mode=K.MODES[mode], reverse=reverse, path=path)
