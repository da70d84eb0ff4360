"""torch references of the sorting ops; multinomial_sample redraws the kernel's Philox uniforms."""
from __future__ import annotations

import numpy as np
import torch

from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, register
from ge2.backend.torch_backend.dropout import philox_uniform

SORTABLE = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES


@register("sort", "torch", dtypes=SORTABLE)
def sort(x, *, dim=-1, descending=False):
    v, i = torch.sort(x, dim=dim, descending=descending, stable=True)
    return v, i


@register("topk", "torch", dtypes=SORTABLE)
def topk(x, *, k, dim=-1, largest=True):
    # torch leaves the order of ties open: take the stable sort's first k (lowest index first, as ge2).
    v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
    return v.narrow(dim if x.dim() else 0, 0, k) if x.dim() else v, i.narrow(dim, 0, k) if x.dim() else i


@register("kthvalue", "torch", dtypes=SORTABLE)
def kthvalue(x, *, k, dim=-1, keepdim=False):
    v, i = torch.kthvalue(x, k, dim=dim, keepdim=keepdim)
    return v, i


@register("median", "torch", dtypes=SORTABLE)
def median(x, *, dim=None, keepdim=False):
    if dim is None:
        return torch.median(x)
    v, i = torch.median(x, dim=dim, keepdim=keepdim)
    return v, i


@register("unique", "torch", dtypes=SORTABLE)
def unique(x, *, return_inverse=False, return_counts=False, dim=None):
    values, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=dim)
    return values, inverse if return_inverse else None, counts if return_counts else None


@register("place_along_dim", "torch")
def place_along_dim(g, index, *, dim, n):
    shape = list(g.shape)
    if g.dim() == 0:
        return g.clone()
    shape[dim] = n
    return torch.zeros(shape, dtype=g.dtype, device=g.device).scatter_(dim, index, g)


@register("multinomial_sample", "torch")
def multinomial_sample(p, state, *, num_samples, replacement):
    seed, offset = (int(v) for v in state.tolist())
    M, N = p.shape
    w = p.detach().double().cpu()
    if replacement:
        u = philox_uniform(seed, offset + np.arange(M * num_samples, dtype=np.int64)).astype(np.float64)
        cdf = p.detach().cpu().to(torch.float64 if p.dtype == torch.float64 else torch.float32).cumsum(1).double()
        target = torch.from_numpy(u).reshape(M, num_samples) * cdf[:, -1:]
        first = torch.searchsorted(cdf, target, right=True)
        last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False).clamp(max=N - 1)
        return torch.where(first >= N, last, first).to(p.device)
    u = torch.from_numpy(philox_uniform(seed, offset + np.arange(M * N, dtype=np.int64))).reshape(M, N)
    keys = torch.where(w > 0, -torch.log1p(-u.double()) / w, torch.inf)
    return torch.sort(keys, dim=1, stable=True).indices[:, :num_samples].to(p.device)
