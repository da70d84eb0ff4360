"""nanoGPT's model written in torch: the reference ``ge2.models.GPT`` is compared with (tests, benchmarks).

Same module tree and parameter names as ge2's GPT, so ``load_state_dict`` takes ge2's
``state_dict`` (or its safetensors file) directly. The loss is nanoGPT's: full logits, then
``F.cross_entropy`` with ``ignore_index=-1``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchBlock(torch.nn.Module):
    """Pre-LN block: x + c_proj(sdpa(c_attn(ln_1(x)))), then + c_proj(gelu(c_fc(ln_2(x))))."""

    def __init__(self, C: int, H: int, bias: bool, dropout: float):
        super().__init__()
        self.n_head, self.dropout = H, dropout
        self.ln_1 = torch.nn.LayerNorm(C, bias=bias)
        self.attn = torch.nn.Module()
        self.attn.c_attn = torch.nn.Linear(C, 3 * C, bias=bias)
        self.attn.c_proj = torch.nn.Linear(C, C, bias=bias)
        self.ln_2 = torch.nn.LayerNorm(C, bias=bias)
        self.mlp = torch.nn.Module()
        self.mlp.c_fc = torch.nn.Linear(C, 4 * C, bias=bias)
        self.mlp.c_proj = torch.nn.Linear(4 * C, C, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        p = self.dropout if self.training else 0.0
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + F.dropout(self.attn.c_proj(y), p, self.training)
        return x + F.dropout(self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)))), p, self.training)


class TorchGPT(torch.nn.Module):
    """idx [B, T] -> (logits [B, T, V], loss or None); the head is tied to the token embedding."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True, **_):
        super().__init__()
        self.dropout = dropout
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab_size, n_embd), wpe=torch.nn.Embedding(block_size, n_embd),
            h=torch.nn.ModuleList(TorchBlock(n_embd, n_head, bias, dropout) for _ in range(n_layer)),
            ln_f=torch.nn.LayerNorm(n_embd, bias=bias)))
        self.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1], device=idx.device))
        x = F.dropout(x, self.dropout, self.training)
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    def configure_optimizer(self, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95), **kw):
        """nanoGPT's AdamW groups: decay on dim >= 2 parameters, none on biases and norms."""
        params = list(self.parameters())
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, **kw)
