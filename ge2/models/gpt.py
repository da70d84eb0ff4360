"""``GPT``: the nanoGPT architecture (GPT-2 style decoder) on ge2's kernels, with nanoGPT's parameter names.

token + position embeddings -> dropout -> n_layer pre-LN blocks
(x + attn(ln_1(x)), x + mlp(ln_2(x))) -> ln_f -> lm_head tied to the token embedding.

- Attention: ``c_attn`` makes q, k, v in one GEMM; the heads are strided views of its output
  (``view`` + ``unbind`` + ``transpose``, no copy), read directly by the flash kernels through
  ``scaled_dot_product_attention(..., is_causal=True)``, which write [B, T, nh, hs] so merging the
  heads for ``c_proj`` is a view.
  Their gradients land as slices of one buffer laid out like c_attn's output, so c_attn's gradient
  is a view (no stack copy).
- MLP: ``c_fc`` with the exact (erf) gelu fused into the GEMM's epilogue (torch's ``nn.GELU()``).
- Residual stream: each residual add runs fused with the LayerNorm after it
  (``LayerNorm.add_forward``); under autocast the norm writes the bf16 copy the next GEMM reads.
- Loss: ``linear_cross_entropy`` over ``lm_head``'s (= ``wte``'s) weight in row chunks, so the
  [B*T, V] logits never exist while training.
- Weight tying: ``lm_head.weight`` *is* ``transformer.wte.weight`` (one Parameter, listed once by
  ``parameters()``; both keys in ``state_dict()`` as in torch). Its gradient is the sum of the
  embedding's scatter-add and the head's GEMM, accumulated by the autograd engine.
- ``generate``: a KV cache per layer; the prompt is one causal forward (prefill), then each new
  token is one position attending to the cache (L = 1: the decode kernel). Sampling (temperature,
  top-k, softmax, the multinomial draw) runs on the device.
"""
from __future__ import annotations

import math

import torch

from ge2 import runtime
from ge2.amp.autocast_mode import get_autocast_dtype
from ge2.autograd.attention import scaled_dot_product_attention
from ge2.autograd.grad_mode import no_grad
from ge2.autograd.math import unbind
from ge2.autograd.sampling import multinomial, top_k_mask
from ge2.autograd.softmax import linear_cross_entropy, softmax
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import dtype_name, shape_str
from ge2.nn import init
from ge2.nn.container import ModuleDict, ModuleList
from ge2.nn.dropout import Dropout
from ge2.nn.linear import Linear
from ge2.nn.module import Module
from ge2.nn.normalization import LayerNorm
from ge2.nn.sparse import Embedding

OP = "GPT"


class KVCache:
    """One layer's keys and values for ``generate``: k, v [B, nh, block_size, hs], filled up to ``length``."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, k: Tensor, v: Tensor, pos: int) -> tuple[Tensor, Tensor]:
        """Store k, v [B, nh, T, hs] at positions pos..pos+T; return the cache's k, v [B, nh, :pos+T, hs]."""
        B, nh, T, hs = k.shape
        if self.k is None:
            raise RuntimeError("KVCache: allocate() before the first write")
        self.k[:, :, pos:pos + T].copy_(k.data)
        self.v[:, :, pos:pos + T].copy_(v.data)
        return Tensor(self.k[:, :, :pos + T]), Tensor(self.v[:, :, :pos + T])

    def allocate(self, B: int, n_head: int, block_size: int, head_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (B, n_head, block_size, head_size)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)


class CausalSelfAttention(Module):
    """Multi-head causal self-attention: x [B, T, C] -> [B, T, C] (nanoGPT's c_attn / c_proj names)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, block_size: int):
        super().__init__()
        self.n_head, self.n_embd, self.dropout, self.block_size = n_head, n_embd, dropout, block_size
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = Dropout(dropout)  # its rng_state feeds the attention kernels' dropout
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None, pos: int = 0) -> Tensor:
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = (t.transpose(1, 2) for t in unbind(qkv, 2))  # [B, nh, T, hs], strided views
        p = self.dropout if self.training else 0.0
        if cache is not None:
            if cache.k is None:
                cache.allocate(B, self.n_head, self.block_size, C // self.n_head, k.dtype, k.device)
            k, v = cache.write(k, v, pos)
        # prefill (pos 0: L = S, causal) or one new token against everything cached (L = 1, no mask)
        y = scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=T > 1,
                                         rng_state=self.attn_dropout.rng_state.data)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(Module):
    """c_fc (gelu fused in its epilogue) -> c_proj -> dropout: [B, T, C] -> [B, T, C]."""

    def __init__(self, n_embd: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias, activation="gelu")
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.c_fc(x)))


class Block(Module):
    """Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, block_size: int):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, block_size)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: Tensor, cache: KVCache | None = None, pos: int = 0) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """nanoGPT's GPT: idx [B, T] int64 token ids (T <= block_size) -> (logits, loss); see ``forward``."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True, device=None):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                        ("n_head", n_head), ("n_embd", n_embd)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{OP}: {name} must be a positive int, got {v!r}")
        if n_embd % n_head:
            raise ValueError(f"{OP}: n_embd {n_embd} is not divisible by n_head {n_head}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{OP}: dropout must be in [0, 1), got {dropout!r}")
        self.config = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, dropout=dropout, bias=bias)
        self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd = (
            vocab_size, block_size, n_layer, n_head, n_embd)
        self.transformer = ModuleDict(dict(
            wte=Embedding(vocab_size, n_embd),
            wpe=Embedding(block_size, n_embd),
            drop=Dropout(dropout),
            h=ModuleList(Block(n_embd, n_head, dropout, bias, block_size) for _ in range(n_layer)),
            ln_f=LayerNorm(n_embd, bias=bias),
        ))
        self.lm_head = Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight  # tied: one Parameter, two uses
        self.reset_parameters()
        self.to(runtime.resolve_device(device))

    def reset_parameters(self) -> None:
        """nanoGPT's init: N(0, 0.02) weights and embeddings, zero biases, c_proj weights N(0, 0.02/sqrt(2 n_layer))."""
        for m in self.modules():
            if isinstance(m, (Linear, Embedding)) and m is not self.lm_head:  # lm_head's weight is wte's
                init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer))

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (the tied head counted once); without the position embedding by default, as nanoGPT."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer["wpe"].weight.numel() if non_embedding else n

    def flops_per_token(self, T: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), nanoGPT's (PaLM's) estimate 6 N + 12 L C T."""
        T = self.block_size if T is None else T
        return 6 * self.num_params() + 12 * self.n_layer * self.n_embd * T

    def _check_idx(self, idx: Tensor, name: str = "idx") -> None:
        if not isinstance(idx, Tensor):
            raise TypeError(f"{OP}: {name} must be a ge2 Tensor of token ids, got {type(idx).__name__}")
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise TypeError(f"{OP}: {name} must hold integer token ids, got {dtype_name(idx.dtype)}")
        if idx.ndim != 2 or idx.shape[1] == 0:
            raise ValueError(f"{OP}: {name} must be [B, T] with T >= 1, got {shape_str(idx.shape)}")

    def _hidden(self, idx: Tensor, caches: list[KVCache] | None = None, pos: int = 0) -> Tensor:
        """ln_f of the last block's output [B, T, C] for tokens at positions pos..pos+T (in the autocast dtype
        under autocast: what the head's GEMM reads).

        Each block is x + attn(ln_1(x)), then + mlp(ln_2(x)); every residual add runs fused with the norm
        after it (``LayerNorm.add_forward``), so the residual stream is read and written once per add and
        the norm writes the low-precision copy the next GEMM reads, with no cast between them.
        """
        T = idx.shape[1]
        tr = self.transformer
        # position embeddings as a slice of the table (a view; its gradient is summed over the batch)
        x = tr["drop"](tr["wte"](idx) + tr["wpe"].weight[pos:pos + T])
        low = get_autocast_dtype(x.device.type)  # None outside autocast
        blocks = list(tr["h"])
        next_norms = [b.ln_1 for b in blocks[1:]] + [tr["ln_f"]]
        x, h = blocks[0].ln_1.add_forward(x, None, low)
        for i, block in enumerate(blocks):
            x, h = block.ln_2.add_forward(x, block.attn(h, caches[i] if caches is not None else None, pos), low)
            x, h = next_norms[i].add_forward(x, block.mlp(h), low)
        return h

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """idx [B, T] -> (logits [B, T, V], None) without targets; (None, loss) with targets [B, T].

        With targets the loss (mean cross-entropy, targets of -1 ignored, as nanoGPT) goes through
        the fused linear + cross-entropy: the [B*T, V] logits never exist, so **logits is None**;
        call the model without targets for logits (of every position, unlike nanoGPT's last-only).
        """
        self._check_idx(idx)
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"{OP}: idx has {T} tokens per sequence but block_size is {self.block_size} "
                             f"(idx {shape_str(idx.shape)}); crop it to the last {self.block_size}")
        x = self._hidden(idx)
        if targets is None:
            return self.lm_head(x), None
        if not isinstance(targets, Tensor) or tuple(targets.shape) != (B, T):
            got = shape_str(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
            raise ValueError(f"{OP}: targets must be a ge2 Tensor shaped like idx {shape_str(idx.shape)}, got {got}")
        loss = linear_cross_entropy(x.reshape(B * T, self.n_embd), self.lm_head.weight,
                                    targets.reshape(B * T), ignore_index=-1)
        return None, loss

    def _last_logits(self, idx: Tensor, caches: list[KVCache] | None = None, pos: int = 0) -> Tensor:
        """Logits [B, V] of the last position only (the head on one row per sequence)."""
        return self.lm_head(self._hidden(idx, caches, pos)[:, -1])

    def sample_next(self, logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                    rng_state: torch.Tensor | None = None) -> Tensor:
        """One token per row of logits [B, V] -> int64 [B, 1]: softmax(logits / temperature) over the top k."""
        if temperature != 1.0:
            logits = logits / temperature
        if top_k is not None:
            logits = top_k_mask(logits, top_k)
        return multinomial(softmax(logits, -1), rng_state)

    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 rng_state: torch.Tensor | None = None) -> Tensor:
        """idx [B, T] -> [B, T + max_new_tokens]: the prompt followed by sampled tokens (eval mode, no grad).

        Up to block_size positions, a KV cache per layer: one causal forward over the prompt, then one
        position per token. Past block_size the absolute positions shift, so each token recomputes the
        last block_size tokens (nanoGPT's crop). ``rng_state``: ge2's [seed, offset] device state to draw
        from (advanced per token); default a fresh one from torch's generator (``ge2.manual_seed``
        repeats a generation).
        """
        self._check_idx(idx)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"{OP}.generate: max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if not isinstance(temperature, (int, float)) or not temperature > 0 or not math.isfinite(temperature):
            raise ValueError(f"{OP}.generate: temperature must be a finite number > 0, got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise ValueError(f"{OP}.generate: top_k must be None or a positive int, got {top_k!r}")
        if rng_state is None:
            from ge2.autograd.dropout import new_rng_state

            rng_state = new_rng_state(idx.device)
        B, T = idx.shape
        out = torch.empty((B, T + max_new_tokens), dtype=torch.int64, device=idx.device)
        out[:, :T].copy_(idx.data)
        was_training = self.training
        self.eval()
        caches: list[KVCache] | None = None
        try:
            for n in range(T, T + max_new_tokens):
                if n <= self.block_size:
                    if caches is None:  # prefill the prompt
                        caches = [KVCache() for _ in range(self.n_layer)]
                        logits = self._last_logits(Tensor(out[:, :n]), caches, 0)
                    else:  # the token sampled last, at position n - 1 (contiguous: the embedding
                        # kernel reads the ids as a flat array, and a [B, 1] column of out is strided)
                        logits = self._last_logits(Tensor(out[:, n - 1:n].contiguous()), caches, n - 1)
                else:
                    logits = self._last_logits(Tensor(out[:, n - self.block_size:n]))
                out[:, n:n + 1].copy_(self.sample_next(logits, temperature, top_k, rng_state).data)
        finally:
            self.train(was_training)
        return Tensor(out)

    def configure_optimizer(self, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95)):
        """nanoGPT's AdamW: weight decay on the matrices (dim >= 2: GEMM weights, embeddings), none on biases and norms."""
        from ge2.optim import AdamW

        decay = [p for p in self.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return AdamW(groups, lr=lr, betas=betas)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items())
