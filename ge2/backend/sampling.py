"""Sampling ops: schemas and Triton implementations (kernels in ``ge2.kernels.sampling``).

``topk_mask(x, *, k) -> y``           y = x where x >= the row's k-th largest value, else -inf
``multinomial(p, state) -> idx``      one index per row, P(i) = p_i / sum(p); u from state = [seed, offset]

x, p: [M, V] floats, any strides; y contiguous, x's dtype; idx int64 [M]. ``multinomial`` reads the
state and does not advance it (``philox_advance(state, n=M)`` does, as for dropout).
"""
from __future__ import annotations

import numbers

import torch

from ge2.backend.dropout import STATE, _check_state
from ge2.backend.registry import FLOAT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg
from ge2.kernels import sampling as K


def _check_topk(op: str, x, *, k) -> None:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or not 1 <= k <= x.shape[1]:
        raise ValueError(f"{op}: k must be an int in [1, {x.shape[1]}] (the row length of x {list(x.shape)}), "
                         f"got {k!r}")


defop("topk_mask", Schema((TensorArg("x", FLOAT_DTYPES, ndim=(2,)),), _check_topk))
register("topk_mask", "triton")(lambda x, *, k: K.topk_mask(x, int(k)))


def _check_multinomial(op: str, p, state) -> None:
    _check_state(op, state)


defop("multinomial", Schema((TensorArg("p", FLOAT_DTYPES, ndim=(2,)), STATE), _check_multinomial))
register("multinomial", "triton")(K.multinomial)
