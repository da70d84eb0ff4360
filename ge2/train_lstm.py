"""``ge2 train --model lstm``: a byte-level LSTM language model on the GPT's text corpus (docs/rnn.md).

Embedding(256, H) -> LSTM(H, H, n_layer, dropout) -> Linear(H, 256), cross-entropy on the next byte;
the data are ``ge2.data.text``'s corpus and random windows, as ``--model gpt`` uses them. The GPT's
options apply where they mean the same: --n-layer, --n-embd (the hidden size), --block-size (the
unrolled length), --max-steps, --eval-interval, --eval-iters, --log-interval, --dropout, --data,
--max-bytes, --grad-clip, plus ``ge2 train``'s --batch-size, --lr, --device, --out, --seed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

import torch

import ge2
import ge2.nn as nn
from ge2.autograd.tensor import Tensor
from ge2.data.text import VOCAB_SIZE, RandomWindows, TextCorpus, TextWindows
from ge2.nn.functional import cross_entropy

DEFAULTS = {
    "cuda": dict(n_layer=2, n_embd=512, block_size=128, batch_size=64, max_steps=2000, lr=2e-3, dropout=0.1,
                 eval_interval=250, eval_iters=20, log_interval=50),
    "cpu": dict(n_layer=1, n_embd=32, block_size=16, batch_size=8, max_steps=20, lr=3e-3, dropout=0.0,
                eval_interval=10, eval_iters=2, log_interval=5),
}


class CharLSTM(nn.Module):
    """Next-byte model: x [B, T] int64 -> logits [B, T, 256] (and the mean cross-entropy when y is given)."""

    def __init__(self, hidden: int, layers: int, dropout: float, device=None):
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, hidden, device=device)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0,
                            device=device)
        self.head = nn.Linear(hidden, VOCAB_SIZE, device=device)

    def forward(self, x: Tensor, y: Tensor | None = None):
        h, _ = self.lstm(self.embed(x))
        logits = self.head(h)
        loss = None if y is None else cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1))
        return logits, loss


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train the byte-level LSTM as ``ge2 train --model lstm`` says; prints and returns the log (val loss in nats)."""
    device = ge2.runtime.resolve_device(args.device)
    defaults = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    cfg = {k: (getattr(args, k, None) if getattr(args, k, None) is not None else v) for k, v in defaults.items()}
    cfg.update(grad_clip=args.grad_clip, seed=args.seed, data=args.data, max_bytes=args.max_bytes)
    out = args.out or "runs/lstm"
    os.makedirs(out, exist_ok=True)
    ge2.manual_seed(cfg["seed"])
    corpus = TextCorpus(cfg["data"], max_bytes=cfg["max_bytes"])
    model = CharLSTM(cfg["n_embd"], cfg["n_layer"], cfg["dropout"], device=device)
    opt = ge2.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    loader = RandomWindows(TextWindows(corpus.train, cfg["block_size"]), cfg["batch_size"], seed=cfg["seed"],
                           device=device)
    val_loader = RandomWindows(TextWindows(corpus.val, cfg["block_size"]), cfg["batch_size"], seed=cfg["seed"] + 1,
                               device=device)
    n_params = sum(p.numel() for p in model.parameters())
    log: dict[str, Any] = {"config": cfg, "corpus": corpus.info, "params": n_params, "train": [], "val": [],
                           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    print(f"ge2 train: LSTM {cfg['n_layer']} x {cfg['n_embd']} ({n_params / 1e6:.2f}M parameters), unrolled "
          f"{cfg['block_size']} bytes, batch {cfg['batch_size']}, on {corpus.info['source']}", flush=True)

    def evaluate() -> float:
        model.eval()
        with ge2.no_grad():
            losses = [model(*val_loader.batch(k))[1].item() for k in range(cfg["eval_iters"])]
        model.train()
        return sum(losses) / len(losses)

    t0 = time.time()
    for step in range(1, cfg["max_steps"] + 1):
        x, y = next(loader)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        if cfg["grad_clip"] > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        if step % cfg["log_interval"] == 0 or step == 1:
            value = loss.item()
            log["train"].append({"step": step, "loss": value, "time_s": time.time() - t0})
            print(f"step {step}: train loss {value:.4f}", flush=True)
        if step % cfg["eval_interval"] == 0 or step == cfg["max_steps"]:
            val = evaluate()
            log["val"].append({"step": step, "loss": val, "bits_per_byte": val / math.log(2)})
            print(f"step {step}: val loss {val:.4f} ({val / math.log(2):.3f} bits/byte)", flush=True)
    log["val_loss"] = log["val"][-1]["loss"]
    with open(os.path.join(out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    return log
