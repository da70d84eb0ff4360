"""The recurrence of one direction of one RNN / LSTM / GRU layer, with its backward through time.

The input projection ``gx = x W_ih^T + b_ih`` is an ordinary ``linear`` (one GEMM over all steps,
its own backward); ``recurrence`` runs the sequential part (``rnn_forward``) and its backward
(``rnn_backward``), then dW_hh = dgates^T h_prev and db_hh = sum(dgates) as one GEMM over all steps.
"""
from __future__ import annotations

import torch

from ge2 import backend
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor

call = backend.call


class Recurrence(Function):
    @staticmethod
    def forward(ctx, gx, w_hh, b_hh, h0, c0, lengths, mode, reverse, path):
        save = True in ctx.needs_input_grad
        y, hn, cn, hp, cp, sv = call("rnn_forward", gx, w_hh, b_hh, h0, c0, lengths, mode=mode, reverse=reverse,
                                     save=save, path=path)
        if save:
            ctx.save_for_backward(w_hh, hp, cp, sv)
            ctx.lengths, ctx.mode, ctx.reverse, ctx.path, ctx.has_bias = lengths, mode, reverse, path, b_hh is not None
        return (y, hn, cn) if mode == "lstm" else (y, hn)

    @staticmethod
    def backward(ctx, dy, dhn, dcn=None):
        w_hh, hp, cp, sv = ctx.saved_tensors
        T, B, H = hp.shape
        zeros = None
        if dy is None or dhn is None or (ctx.mode == "lstm" and dcn is None):
            zeros = torch.zeros((B, H), dtype=hp.dtype, device=hp.device)
        dy = dy if dy is not None else torch.zeros((T, B, H), dtype=hp.dtype, device=hp.device)
        dhn = dhn if dhn is not None else zeros
        if ctx.mode == "lstm" and dcn is None:
            dcn = zeros
        dgx, dgh, dh0, dc0 = call("rnn_backward", dy, dhn, dcn, w_hh, ctx.lengths, hp, cp, sv, mode=ctx.mode,
                                  reverse=ctx.reverse, path=ctx.path)
        need_w, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dw = db = None
        if need_w or need_b:
            # dW_hh = sum_t dgates_t^T h_{t-1}: one GEMM with K = T B, the bias gradient from its epilogue
            _, dw, db, _ = call("gemm_backward", dgh.reshape(T * B, -1), hp.reshape(T * B, H), w_hh, None, None,
                                trans_b=True, bias_kind="per_n" if ctx.has_bias else "none", need_a=False)
        return (dgx, dw if need_w else None, db if need_b else None, dh0, dc0, None, None, None, None)


def recurrence(gx: Tensor, w_hh: Tensor, b_hh: Tensor | None, h0: Tensor, c0: Tensor | None,
               lengths: torch.Tensor | None, mode: str, reverse: bool = False, path: str | None = None):
    """gx [T, B, NG H] -> (y [T, B, H], h_n [B, H]) or, for lstm, (y, h_n, c_n); padding steps carry the state."""
    return Recurrence.apply(gx, w_hh, b_hh, h0, c0, lengths, mode, reverse, path)
