"""Dropout ops: schemas and Triton implementations (kernels in ``ge2.kernels.dropout``).

``dropout(x, state, *, p) -> y``          y = x * keep / (1 - p); keep drawn from state = [seed, offset]
``dropout_backward(gy, state, *, p) -> gx``   the same mask, rebuilt from the same state
``philox_advance(state, *, n) -> state``   state[1] += n in place (so the next draw is fresh)

state: int64 [2] on x's device. x any shape and strides; y contiguous.
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.registry import FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import dropout as K

STATE = TensorArg("state", (torch.int64,), ndim=(1,))


def _check_p(op: str, p) -> None:
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: p must be a probability in [0, 1], got {p!r}")


def _check_state(op: str, state) -> None:
    if state.numel() != 2:
        raise ValueError(f"{op}: state must be int64 [2] (seed, offset), got {shape_str(state.shape)}")


def _check_dropout(op: str, x, state, *, p) -> None:
    _check_p(op, p)
    _check_state(op, state)


defop("dropout", Schema((TensorArg("x", FLOAT_DTYPES), STATE), _check_dropout))
register("dropout", "triton")(lambda x, state, *, p: K.dropout(x, state, p))

defop("dropout_backward", Schema((TensorArg("gy", FLOAT_DTYPES), STATE), _check_dropout))
register("dropout_backward", "triton")(lambda gy, state, *, p: K.dropout(gy, state, p))


def _check_advance(op: str, state, *, n) -> None:
    _check_state(op, state)
    if not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"{op}: n must be a non-negative int, got {n!r}")


defop("philox_advance", Schema((STATE,), _check_advance))
register("philox_advance", "triton", dtypes=(torch.int64,))(lambda state, *, n: K.philox_advance_(state, n))
