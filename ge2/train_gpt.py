"""``ge2 train --model gpt`` and ``ge2 generate``: a byte-level GPT on a text corpus, and sampling from it.

The loop is nanoGPT's: random windows of the corpus, AdamW (weight decay on the matrices), linear
warmup then cosine decay of the lr, gradient clipping, optional mixed precision (``ge2.autocast``;
fp16 adds a ``GradScaler``), val loss every ``--eval-interval`` steps. Every arithmetic operation
of a step is a ge2 kernel. The run directory (``--out``, default runs/gpt) gets:

- ``ckpt.ge2``: model, optimizer, scheduler, scaler, RNG states (torch's and every dropout
  layer's device [seed, offset]), the data position and the log, written at each evaluation when
  every loss since the last one was finite: ``--resume`` continues from it bit-exactly;
- ``model.safetensors``: the weights under torch's key names, the model config in the metadata;
- ``log.json`` and ``curves.png`` (train and val loss by step).

Host reads (the loss values for the bar and the NaN check) happen every ``--log-interval`` steps,
so a step between them launches work without waiting for the GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from typing import Any

import torch

import ge2
from ge2.autograd.tensor import Tensor
from ge2.data.text import VOCAB_SIZE, RandomWindows, TextCorpus, TextWindows, decode, encode
from ge2.models import GPT
from ge2.optim.lr_scheduler import LRScheduler

# nanoGPT's shakespeare-char "baby GPT" on a GPU; a model the Triton interpreter runs in seconds a step on a CPU.
DEFAULTS = {
    "cuda": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_steps=5000, lr=1e-3,
                 dropout=0.2, warmup_steps=100, eval_interval=250, eval_iters=50, log_interval=10),
    "cpu": dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, max_steps=30, lr=1e-3,
                dropout=0.0, warmup_steps=5, eval_interval=10, eval_iters=2, log_interval=5),
}

# Dense peak FLOP/s for MFU, by GPU name and compute dtype (fp32 runs on the tensor cores as tf32/tf32x3).
PEAK_FLOPS = {"H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
              "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
              "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}}

CKPT, SAFETENSORS = "ckpt.ge2", "model.safetensors"


class TrainingDiverged(RuntimeError):
    """A loss became NaN or inf: the run stopped, the last good checkpoint is kept."""


class WarmupCosineLR(LRScheduler):
    """nanoGPT's schedule: lr = base (s+1)/(warmup+1) for s < warmup, then cosine from base down to
    base * min_lr_ratio at ``decay_steps``, constant after."""

    def __init__(self, optimizer, warmup_steps: int, decay_steps: int, min_lr_ratio: float = 0.1,
                 last_epoch: int = -1):
        if warmup_steps < 0 or decay_steps < 1 or not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"WarmupCosineLR: need warmup_steps >= 0, decay_steps >= 1 and min_lr_ratio in [0, 1], "
                             f"got {warmup_steps}, {decay_steps}, {min_lr_ratio}")
        self.warmup_steps, self.decay_steps, self.min_lr_ratio = warmup_steps, decay_steps, min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, epoch: int) -> float:
        if epoch < self.warmup_steps:
            return base_lr * (epoch + 1) / (self.warmup_steps + 1)
        low = base_lr * self.min_lr_ratio
        if epoch >= self.decay_steps:
            return low
        ratio = (epoch - self.warmup_steps) / max(self.decay_steps - self.warmup_steps, 1)
        return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (base_lr - low)


def peak_flops(device: torch.device, amp: str) -> float | None:
    """The GPU's dense peak for the compute dtype, or None (CPU, or a GPU not in PEAK_FLOPS)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_FLOPS.items():
        if key in name:
            return peaks["fp32" if amp == "none" else amp]
    return None


def _resolve_config(args: argparse.Namespace, device: torch.device, saved: dict | None) -> dict[str, Any]:
    """Command-line values, else the saved run's (on --resume), else the device's defaults."""
    defaults = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    cfg = {}
    for key, default in defaults.items():
        given = getattr(args, key, None)
        cfg[key] = given if given is not None else (saved or {}).get(key, default)
    cfg["lr_decay_steps"] = args.lr_decay_steps or (saved or {}).get("lr_decay_steps") or cfg["max_steps"]
    for key in ("weight_decay", "grad_clip", "amp", "seed", "data", "max_bytes", "bias"):
        cfg[key] = (saved or {}).get(key, getattr(args, key)) if saved else getattr(args, key)
    if cfg["n_embd"] % cfg["n_head"]:
        raise ValueError(f"train: --n-embd {cfg['n_embd']} must be a multiple of --n-head {cfg['n_head']}")
    return cfg


def _autocast(cfg: dict, device: torch.device):
    if cfg["amp"] == "none":
        return contextlib.nullcontext()
    return ge2.autocast(device.type, dtype=torch.bfloat16 if cfg["amp"] == "bf16" else torch.float16)


def _rng_buffers(model: GPT) -> dict[str, Tensor]:
    """Every dropout layer's device [seed, offset] state, by name (not in the state dict, like torch's generator)."""
    return {name: b for name, b in model.named_buffers() if name.endswith("rng_state")}


def _plot(log: dict[str, Any], path: str) -> str | None:
    """Train and val loss by step as a PNG; returns a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install ge2[viz]): no curves.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if log["train"]:
        steps, losses = zip(*[(r["step"], r["loss"]) for r in log["train"]])
        ax.plot(steps, losses, lw=0.8, alpha=0.7, label="train (per logged step)")
    if log["val"]:
        steps, losses = zip(*[(r["step"], r["loss"]) for r in log["val"]])
        ax.plot(steps, losses, "s-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend()
    c = log["config"]
    fig.suptitle(f"ge2 GPT {c['n_layer']}L/{c['n_head']}H/{c['n_embd']}, block {c['block_size']}, "
                 f"batch {c['batch_size']}, amp {c['amp']}, {log['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _save(path_dir: str, model: GPT, opt, sched, scaler, loader: RandomWindows, step: int, cfg: dict,
          log: dict) -> None:
    if not ge2.distributed.is_main_process():  # ge2 train --nproc: rank 0 writes
        return
    state = {
        "config": {"model": model.config, "train": cfg}, "step": step, "model": model.state_dict(),
        "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": {"torch": torch.get_rng_state(), "modules": _rng_buffers(model)},
        "data": loader.state_dict(), "log": log,
    }
    ge2.save(state, os.path.join(path_dir, CKPT))
    ge2.save_safetensors(model, os.path.join(path_dir, SAFETENSORS),
                         metadata={"ge2_gpt_config": json.dumps(model.config)})


def _write_log(out: str, log: dict) -> str | None:
    if not ge2.distributed.is_main_process():  # ge2 train --nproc: rank 0 writes
        return None
    with open(os.path.join(out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    return _plot(log, os.path.join(out, "curves.png"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train a GPT as the parsed ``ge2 train --model gpt`` options say; returns the log."""
    from ge2.train import TrainSetupError

    try:
        device = ge2.runtime.resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        raise TrainSetupError(str(e)) from None
    out = args.out or "runs/gpt"
    ckpt = None
    if args.resume:
        path = os.path.join(out, CKPT) if args.resume == "auto" else args.resume
        if not os.path.isfile(path):
            raise TrainSetupError(f"--resume: no checkpoint at {path}")
        ckpt = ge2.load(path, map_location=device)
    cfg = _resolve_config(args, device, ckpt["config"]["train"] if ckpt else None)
    os.makedirs(out, exist_ok=True)
    ge2.manual_seed(cfg["seed"])
    corpus = TextCorpus(cfg["data"], max_bytes=cfg["max_bytes"])
    mcfg = dict(vocab_size=VOCAB_SIZE, block_size=cfg["block_size"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                n_embd=cfg["n_embd"], dropout=cfg["dropout"], bias=cfg["bias"])
    with ge2.use_backend(args.backend):
        model = GPT(**mcfg, device=device)
        opt = model.configure_optimizer(cfg["lr"], weight_decay=cfg["weight_decay"])
        sched = WarmupCosineLR(opt, cfg["warmup_steps"], cfg["lr_decay_steps"])
        scaler = ge2.amp.GradScaler(device) if cfg["amp"] == "fp16" else None
        loader = RandomWindows(TextWindows(corpus.train, cfg["block_size"]), cfg["batch_size"], seed=cfg["seed"],
                               device=device)
        val_loader = RandomWindows(TextWindows(corpus.val, cfg["block_size"]), cfg["batch_size"],
                                   seed=cfg["seed"] + 1, device=device)
        dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
        step = 0
        log: dict[str, Any] = {
            "config": cfg, "model": mcfg, "corpus": corpus.info, "device": dev_name, "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "params": model.num_params(), "train": [], "val": [],
        }
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["scheduler"])
            if scaler is not None and ckpt["scaler"]:
                scaler.load_state_dict(ckpt["scaler"])
            for name, buf in _rng_buffers(model).items():
                buf.data.copy_(ckpt["rng"]["modules"][name].data)
            rng = ckpt["rng"]["torch"]  # the checkpoint loader puts tensors on the device; torch wants a CPU byte tensor
            torch.set_rng_state((rng.data if hasattr(rng, "to_torch") else rng).cpu())
            loader.load_state_dict(ckpt["data"])
            step, log = ckpt["step"], ckpt["log"] | {"config": cfg}
        peak = peak_flops(device, cfg["amp"])
        flops_per_token = model.flops_per_token()

        net = ge2.distributed.wrap(model)  # ge2 train --nproc: DistributedDataParallel over the ranks

        def train_step(x: Tensor, y: Tensor) -> Tensor:
            with _autocast(cfg, device):
                _, loss = net(x, y)
            opt.zero_grad()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)  # clip the true gradients
            else:
                loss.backward()
            if cfg["grad_clip"] > 0:
                ge2.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            return loss

        def evaluate() -> float:
            model.eval()
            losses = []
            with ge2.no_grad(), _autocast(cfg, device):
                for k in range(cfg["eval_iters"]):  # the same val batches at every evaluation
                    x, y = val_loader.batch(k)
                    losses.append(model(x, y)[1].float().item())
            model.train()
            return sum(losses) / len(losses)

        step_fn = ge2.capture(train_step) if args.capture else train_step
        if args.capture and device.type != "cuda":
            print("note: --capture needs a GPU (CUDA graphs); on the CPU the steps run eagerly")
        print(f"ge2 train: GPT {cfg['n_layer']} layers, {cfg['n_head']} heads, width {cfg['n_embd']}, block "
              f"{cfg['block_size']} ({model.num_params() / 1e6:.2f}M parameters) on {corpus.info['source']} "
              f"({corpus.info['bytes'] / 1e6:.1f} MB), batch {cfg['batch_size']}, lr {cfg['lr']:g}, amp {cfg['amp']}, "
              f"{dev_name}" + (f", resumed at step {step}" if ckpt is not None else ""), flush=True)
        bar = None
        if args.progress:
            try:
                from tqdm import tqdm

                bar = tqdm(total=cfg["max_steps"], initial=step, desc="train", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass
        say = bar.write if bar is not None else print
        pending: list[tuple[int, float, Tensor]] = []
        t_mark, tokens = time.perf_counter(), 0
        last_good = os.path.join(out, CKPT) if os.path.isfile(os.path.join(out, CKPT)) else None
        try:
            while step < cfg["max_steps"]:
                x, y = next(loader)
                x, y = ge2.distributed.shard(x), ge2.distributed.shard(y)  # ge2 train --nproc: this rank's rows
                lr = opt.param_groups[0]["lr"]
                loss = step_fn(x, y)
                sched.step()  # outside the step: a captured graph reads the lr from the device
                pending.append((step + 1, lr, loss.detach().float().clone()))  # a replay reuses its output
                step += 1
                tokens += x.numel() * ge2.distributed.get_world_size()
                evaluate_now = step % cfg["eval_interval"] == 0 or step == cfg["max_steps"]
                if step % cfg["log_interval"] == 0 or evaluate_now:
                    values = [(s, r, float(v.item())) for s, r, v in pending]
                    pending.clear()
                    elapsed = time.perf_counter() - t_mark
                    tok_s = tokens / elapsed if elapsed > 0 else float("nan")
                    t_mark, tokens = time.perf_counter(), 0
                    for s, r, v in values:
                        log["train"].append({"step": s, "loss": v, "lr": r})
                    bad = next(((s, v) for s, _, v in values if not math.isfinite(v)), None)
                    if bad is not None:
                        raise TrainingDiverged(f"the training loss is {bad[1]} at step {bad[0]}")
                    mfu = tok_s * flops_per_token / peak if peak else None
                    log["train"][-1] |= {"tokens_per_s": tok_s, "mfu": mfu}
                    if bar is not None:
                        bar.update(len(values))
                        bar.set_postfix(loss=f"{values[-1][2]:.4f}", tok_s=f"{tok_s:,.0f}",
                                        mfu=f"{100 * mfu:.1f}%" if mfu is not None else "n/a")
                if evaluate_now:
                    val = evaluate()
                    if not math.isfinite(val):
                        raise TrainingDiverged(f"the val loss is {val} at step {step}")
                    log["val"].append({"step": step, "loss": val})
                    say(f"step {step:6d}  train loss {log['train'][-1]['loss']:.4f}  val loss {val:.4f}  "
                        f"lr {lr:.2e}")
                    _save(out, model, opt, sched, scaler, loader, step, cfg, log)
                    last_good = os.path.join(out, CKPT)
        except TrainingDiverged as e:
            note = _write_log(out, log)
            keep = f"the last good checkpoint is kept: {last_good}" if last_good else "no checkpoint was written"
            raise TrainingDiverged(f"{e}; training stopped ({keep}; log: {os.path.join(out, 'log.json')})"
                                   + (f"; note: {note}" if note else "")) from None
        finally:
            if bar is not None:
                bar.close()
    if isinstance(step_fn, ge2.CapturedStep):
        log["capture"] = {"graphs": len(step_fn.graphs), "captures": step_fn.captures, "replays": step_fn.replays}
    note = _write_log(out, log)
    if note:
        print(f"note: {note}")
    final = log["val"][-1]["loss"] if log["val"] else None
    print(f"done: step {step}" + (f", val loss {final:.4f}" if final is not None else "")
          + f"  (checkpoint {os.path.join(out, CKPT)}, weights {os.path.join(out, SAFETENSORS)}, "
          f"log {os.path.join(out, 'log.json')})")
    return log


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The GPT options of ``ge2 train`` (used with --model gpt)."""
    g = p.add_argument_group("--model gpt (defaults: nanoGPT's baby GPT on a GPU, a tiny one on the CPU)")
    g.add_argument("--data", default=None, help="a text file (default: the Python standard library's sources)")
    g.add_argument("--max-bytes", type=int, default=16 * 2**20, help="read at most this many bytes of the corpus")
    for name in ("n-layer", "n-head", "n-embd", "block-size", "max-steps", "warmup-steps", "lr-decay-steps",
                 "eval-interval", "eval-iters", "log-interval"):
        g.add_argument(f"--{name}", type=int, default=None)
    g.add_argument("--dropout", type=float, default=None)
    g.add_argument("--no-bias", dest="bias", action="store_false", help="no biases in the Linear and LayerNorm layers")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    g.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                   help="mixed precision with ge2.autocast (fp16 adds a GradScaler)")
    g.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="continue from OUT/ckpt.ge2 (or the checkpoint given)")


# ---------------------------------------------------------------------------------------------
# ge2 generate
# ---------------------------------------------------------------------------------------------
def load_model(path: str, device: torch.device) -> GPT:
    """A GPT from a ``ge2 train`` checkpoint (ckpt.ge2) or its model.safetensors (config in the metadata)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"generate: no such checkpoint: {path}")
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
        if "ge2_gpt_config" not in meta:
            raise ValueError(f"generate: {path} has no 'ge2_gpt_config' metadata (written by ge2 train); "
                             "build the GPT yourself and load_state_dict(ge2.load_safetensors(path))")
        config, state = json.loads(meta["ge2_gpt_config"]), ge2.load_safetensors(path, device)
    else:
        ckpt = ge2.load(path, map_location=device)
        if not isinstance(ckpt, dict) or "config" not in ckpt or "model" not in ckpt:
            raise ValueError(f"generate: {path} is not a checkpoint of ge2 train --model gpt")
        config, state = ckpt["config"]["model"], ckpt["model"]
    model = GPT(**config, device=device)
    model.load_state_dict(state)
    return model.eval()


def generate(args: argparse.Namespace) -> str:
    """Print the prompt and its sampled continuation; returns the text."""
    device = ge2.runtime.resolve_device(args.device)
    model = load_model(args.checkpoint, device)
    ids = encode(args.prompt if args.prompt else "\n")
    if ids.numel() > model.block_size:
        ids = ids[-model.block_size:]
    ge2.manual_seed(args.seed)
    idx = Tensor(ids.to(torch.int64).reshape(1, -1).to(device))
    out = model.generate(idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
    text = decode(out[0])
    print(text)
    return text


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="runs/gpt/ckpt.ge2 or runs/gpt/model.safetensors")
    p.add_argument("--prompt", default="", help="the text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
