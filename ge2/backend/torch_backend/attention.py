"""Reference of the attention ops: the L x S scores written out in fp32 torch, the dropout mask drawn
with the NumPy Philox of the dropout oracle (so it is the kernels' very mask), the gradients by the
same formulas the flash backward uses."""
from __future__ import annotations

import torch

from ge2.backend.attention import ATTENTION_DTYPES
from ge2.backend.registry import register
from ge2.backend.torch_backend.dropout import keep_mask  # element (b, h, i, j) at ((b*Hq + h)*L + i)*S + j


def _scores(q, k, mask, scale, is_causal):
    """fp32 [B, Hq, L, S] scaled scores with the mask and causal rule applied (-inf where excluded)."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    s = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return s


def _probabilities(s):
    """softmax rows and their log-sum-exp; an all -inf row gives p = 0 and lse = -inf."""
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return p.nan_to_num(0.0), lse


def _group_sum(t, hkv):
    """Sum the Hq // Hkv query heads of each kv head: [B, Hq, ...] -> [B, Hkv, ...]."""
    B, Hq = t.shape[:2]
    return t.reshape(B, hkv, Hq // hkv, *t.shape[2:]).sum(2)


@register("attention", "torch", dtypes=ATTENTION_DTYPES)
def attention(q, k, v, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0):
    p, lse = _probabilities(_scores(q, k, mask, scale, is_causal))
    if dropout_p > 0.0:
        p = p * keep_mask(rng_state, p.shape, dropout_p, p.device) / (1.0 - dropout_p)
    group = q.shape[1] // k.shape[1]
    o = torch.matmul(p, v.float().repeat_interleave(group, dim=1))
    return o.to(q.dtype), lse


@register("attention_backward", "torch", dtypes=ATTENTION_DTYPES)
def attention_backward(do, q, k, v, o, lse, mask=None, rng_state=None, *, scale, is_causal=False, dropout_p=0.0):
    p, _ = _probabilities(_scores(q, k, mask, scale, is_causal))
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    dof = do.float()
    dp = torch.matmul(dof, vf.transpose(-1, -2))
    pd = p
    if dropout_p > 0.0:
        keep = keep_mask(rng_state, p.shape, dropout_p, p.device) / (1.0 - dropout_p)
        pd, dp = p * keep, dp * keep
    delta = (dof * o.float()).sum(-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)
    ds = p * (dp - delta)
    dq = torch.matmul(ds, kf) * scale
    dk = _group_sum(torch.matmul(ds.transpose(-1, -2), q.float()) * scale, k.shape[1])
    dv = _group_sum(torch.matmul(pd.transpose(-1, -2), dof), k.shape[1])
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
