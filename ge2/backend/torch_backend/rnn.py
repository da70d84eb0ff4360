"""Reference of the recurrence ops: the same steps written with torch, in float32 (or float64)."""
from __future__ import annotations

import torch

from ge2.backend.registry import register
from ge2.kernels.rnn import GATES, MODES


def _order(T: int, lengths, reverse: bool, B: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(active [T, B], tt [T, B]): per step s and row b, whether it runs and the time index it touches."""
    n = lengths.to(device) if lengths is not None else torch.full((B,), T, dtype=torch.int64, device=device)
    s = torch.arange(T, device=device)[:, None]
    active = s < n[None, :]
    tt = torch.where(active, n[None, :] - 1 - s, s) if reverse else s.expand(T, B)
    return active, tt


@register("rnn_forward", "torch", dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64))
def rnn_forward(gx, w_hh, b_hh, h0, c0=None, lengths=None, *, mode, reverse, save, path=None):
    m = MODES[mode]
    T, B, _ = gx.shape
    H = w_hh.shape[1]
    f = torch.float64 if gx.dtype == torch.float64 else torch.float32
    active, tt = _order(T, lengths, reverse, B, gx.device)
    rows = torch.arange(B, device=gx.device)
    h, c = h0.to(f), (c0.to(f) if c0 is not None else None)
    y = torch.zeros((T, B, H), dtype=f, device=gx.device)
    hp = torch.zeros_like(y)
    cp = torch.zeros_like(y)
    sv = torch.zeros((T, B, (4 if GATES[m] > 1 else 1) * H), dtype=f, device=gx.device)
    for s in range(T):
        a = gx[tt[s], rows].to(f)
        r = h @ w_hh.to(f).t() + (b_hh.to(f) if b_hh is not None else 0.0)
        act = active[s][:, None]
        if m == 0:
            hn, gates = torch.tanh(a + r), None
        elif m == 1:
            hn, gates = torch.relu(a + r), None
        elif m == 2:
            i, fg, g, o = (a + r).chunk(4, 1)
            i, fg, g, o = torch.sigmoid(i), torch.sigmoid(fg), torch.tanh(g), torch.sigmoid(o)
            cn = fg * c + i * g
            hn, gates = o * torch.tanh(cn), (i, fg, g, o)
            cp[tt[s], rows] = c
            c = torch.where(act, cn, c)
        else:
            ar, az, an = a.chunk(3, 1)
            rr, rz, rn = r.chunk(3, 1)
            rg, z = torch.sigmoid(ar + rr), torch.sigmoid(az + rz)
            n = torch.tanh(an + rg * rn)
            hn, gates = (1 - z) * n + z * h, (rg, z, n, rn)
        hp[tt[s], rows] = h
        sv[tt[s], rows] = torch.cat(gates, 1) if gates is not None else torch.where(act, hn, h)
        h = torch.where(act, hn, h)
        y[tt[s], rows] = torch.where(act, h, 0.0)
    cast = gx.dtype
    return (y.to(cast), h.to(cast), c.to(cast) if c is not None else None, hp.to(cast) if save else None,
            cp.float() if save and m == 2 else None, sv.float() if save else None)


@register("rnn_backward", "torch", dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64))
def rnn_backward(dy, dhn, dcn, w_hh, lengths, hp, cp, sv, *, mode, reverse, path=None):
    m = MODES[mode]
    T, B, H = dy.shape
    f = torch.float64 if dy.dtype == torch.float64 else torch.float32
    active, tt = _order(T, lengths, reverse, B, dy.device)
    rows = torch.arange(B, device=dy.device)
    w = w_hh.to(f)
    dgh = torch.zeros((T, B, GATES[m] * H), dtype=f, device=dy.device)
    dgx = torch.zeros_like(dgh)
    dh = dhn.to(f)
    dc = dcn.to(f) if dcn is not None else torch.zeros_like(dh)
    for s in reversed(range(T)):
        act = active[s][:, None]
        t = tt[s]
        d = dh + torch.where(act, dy[t, rows].to(f), 0.0)
        g = sv[t, rows].to(f)
        carry = torch.zeros_like(d)
        if m <= 1:
            dgate = d * (1 - g * g) if m == 0 else d * (g > 0)
            dx_ = dgate
        elif m == 2:
            i, fg, gg, o = g.chunk(4, 1)
            c_prev = cp[t, rows].to(f)
            tc = torch.tanh(fg * c_prev + i * gg)
            dcs = dc + d * o * (1 - tc * tc)
            dgate = torch.cat([dcs * gg * i * (1 - i), dcs * c_prev * fg * (1 - fg), dcs * i * (1 - gg * gg),
                               d * tc * o * (1 - o)], 1)
            dx_ = dgate
            dc = torch.where(act, dcs * fg, dc)
        else:
            r, z, n, hn = g.chunk(4, 1)
            h_prev = hp[t, rows].to(f)
            dan = d * (1 - z) * (1 - n * n)
            dr = dan * hn * r * (1 - r)
            dz = d * (h_prev - n) * z * (1 - z)
            dgate = torch.cat([dr, dz, dan * r], 1)
            dx_ = torch.cat([dr, dz, dan], 1)
            carry = d * z
        dgate = torch.where(act, dgate, 0.0)
        dgh[t, rows] = dgate
        dgx[t, rows] = torch.where(act, dx_, 0.0)
        dh = torch.where(act, carry + dgate @ w, d)
    cast = dy.dtype
    return (dgx.to(cast), dgh.to(cast), dh.to(cast), dc.to(cast) if m == 2 else None)
