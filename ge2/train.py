"""``ge2 train``: train a small classifier on a bundled dataset and report the curves.

The loop is the textbook one (forward, loss, backward, optimizer step, schedule step); every
arithmetic operation in it is a ge2 Triton kernel (or, with ``--backend torch``, the torch oracle).
The evaluation's arg-max over the test logits is read on the host with NumPy: it is a metric,
outside the training step.
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

import numpy as np
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2.data import DataLoader, datasets
from ge2.optim.lr_scheduler import CosineAnnealingLR

DEFAULT_LR = {"adamw": 1e-2, "sgd": 0.1}


class TrainSetupError(RuntimeError):
    """The run cannot start as configured (a missing layer, device or package): ``ge2 train`` prints it."""


class _Image(nn.Module):
    """[N, H*W] rows -> [N, 1, H, W] images (a view)."""

    def __init__(self, h: int, w: int):
        super().__init__()
        self.h, self.w = h, w

    def forward(self, x):
        return x.reshape(x.shape[0], 1, self.h, self.w)

    def extra_repr(self) -> str:
        return f"1, {self.h}, {self.w}"


def build_model(name: str, in_features: int = 64, classes: int = 10, hidden: int = 128) -> nn.Module:
    """The ``--model`` choices: "mlp" (a fused Linear+ReLU hidden layer and a classifier) or "cnn"."""
    if name == "mlp":
        return nn.Sequential(nn.Linear(in_features, hidden, activation="relu"), nn.Linear(hidden, classes))
    if name == "cnn":
        missing = [layer for layer in ("Conv2d", "MaxPool2d") if not hasattr(nn, layer)]
        if missing:
            raise TrainSetupError(
                f"--model cnn needs ge2.nn.{' and ge2.nn.'.join(missing)} (the conv2d and pooling kernels "
                "of issue 5), which are not built yet; use --model mlp")
        side = int(math.isqrt(in_features))
        return nn.Sequential(
            _Image(side, side),
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * (side // 4) ** 2, hidden, activation="relu"), nn.Linear(hidden, classes),
        )
    raise ValueError(f"train: --model must be 'mlp' or 'cnn', got {name!r}")


def build_optimizer(name: str, params, lr: float) -> ge2.optim.Optimizer:
    if name == "adamw":
        return ge2.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    if name == "sgd":
        return ge2.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)
    raise ValueError(f"train: --optimizer must be 'sgd' or 'adamw', got {name!r}")


def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over ``loader``."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    with ge2.no_grad():
        for x, y in loader:
            logits = model(x)
            total_loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.numpy().argmax(1) == y.numpy()).sum())
            count += y.shape[0]
    model.train()
    return total_loss / count, correct / count


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return None, iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return None, iterable
    bar = tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stderr)
    return bar, bar


def _plot(log: dict[str, Any], path: str) -> str | None:
    """Loss and accuracy curves as a PNG; returns a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install ge2[viz]): no curves.png"
    epochs = [e["epoch"] for e in log["epochs"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    steps = np.arange(1, len(log["step_losses"]) + 1) / max(log["steps_per_epoch"], 1)
    smooth = log["config"].get("label_smoothing", 0.0)
    note = f", label smoothing {smooth:g}" if smooth else ""
    ax1.plot(steps, log["step_losses"], lw=0.8, alpha=0.6, label=f"train, per step{note}")
    ax1.plot(epochs, [e["train_loss"] for e in log["epochs"]], "o-", label=f"train, epoch mean{note}")
    ax1.plot(epochs, [e["test_loss"] for e in log["epochs"]], "s-", label="test (plain cross-entropy)")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.set_yscale("log")
    ax1.legend()
    ax2.plot(epochs, [100 * e["test_accuracy"] for e in log["epochs"]], "s-")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    cfg = log["config"]
    fig.suptitle(f"ge2 train: {cfg['model']} on {cfg['dataset']}, {cfg['optimizer']}, {log['device']} "
                 f"({cfg['backend']} backend)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train as configured by the parsed ``ge2 train`` options; writes DIR/log.json and DIR/curves.png.

    Started by torchrun (or ``ge2 train --nproc N``, which calls it), each rank joins the process group,
    trains its rows of every global batch through DistributedDataParallel, and only rank 0 prints and
    writes files."""
    if not ge2.distributed.launched_by_torchrun() or ge2.distributed.is_initialized():
        return _run(args)
    ge2.distributed.init_process_group()
    try:
        if ge2.distributed.is_main_process():
            return _run(args)
        args.progress = False
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            return _run(args)
    finally:
        ge2.distributed.destroy_process_group()


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.model == "gpt":
        from ge2 import train_gpt

        return train_gpt.run(args)
    if args.model == "lstm":
        from ge2 import train_lstm

        return train_lstm.run(args)
    args.batch_size = args.batch_size or 64
    args.out = args.out or "runs/train"
    try:
        device = ge2.runtime.resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        raise TrainSetupError(str(e)) from None
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
    if args.dataset != "digits":
        raise ValueError(f"train: --dataset must be 'digits', got {args.dataset!r}")
    os.makedirs(args.out, exist_ok=True)
    ge2.manual_seed(args.seed)
    try:
        train_set, test_set = datasets.digits(seed=args.seed)
    except ImportError as e:
        raise TrainSetupError(str(e)) from None
    with ge2.use_backend(args.backend):
        model = build_model(args.model, hidden=args.hidden).to(device)
        opt = build_optimizer(args.optimizer, model.parameters(), lr)
        train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed, device=device,
                                  drop_last=ge2.distributed.get_world_size() > 1)  # rows split evenly over ranks
        test_loader = DataLoader(test_set, batch_size=512, device=device)
        sched = CosineAnnealingLR(opt, T_max=max(args.epochs * len(train_loader), 1))
        criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
        dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
        log: dict[str, Any] = {
            "config": {k: v for k, v in vars(args).items() if k != "func"} | {"lr": lr},
            "device": dev_name, "torch": torch.__version__, "triton": __import__("triton").__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "steps_per_epoch": len(train_loader), "epochs": [], "step_losses": [],
        }

        net = ge2.distributed.wrap(model)  # several ranks: DistributedDataParallel

        def train_step(x: ge2.Tensor, y: ge2.Tensor) -> ge2.Tensor:
            loss = criterion(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        step = train_step
        if args.capture:
            step = ge2.capture(train_step)
            if device.type != "cuda":
                print("note: --capture needs a GPU (CUDA graphs); on the CPU the steps run eagerly")
        print(f"ge2 train: {args.model} on {args.dataset} ({len(train_set)} train / {len(test_set)} test), "
              f"{args.optimizer} lr={lr:g}, batch {args.batch_size}, {args.epochs} epochs, {dev_name}, "
              f"{args.backend} backend")
        for epoch in range(1, args.epochs + 1):
            t0 = time.perf_counter()
            bar, batches = _progress(train_loader, len(train_loader), f"epoch {epoch}/{args.epochs}",
                                     args.progress)
            losses, seen = [], 0
            for i, (x, y) in enumerate(batches):
                seen += y.shape[0]
                x, y = ge2.distributed.shard(x), ge2.distributed.shard(y)  # this rank's rows of the global batch
                loss = step(x, y)
                sched.step()  # outside the step: a captured graph reads the lr from the device
                losses.append(loss.detach().clone())  # a replay overwrites its output buffer
                if bar is not None and (i % 10 == 0 or i == len(train_loader) - 1):
                    bar.set_postfix(loss=f"{losses[-1].item():.4f}",
                                    samples_s=f"{seen / (time.perf_counter() - t0):.0f}")
            step_losses = [float(v.item()) for v in losses]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            if bar is not None:
                bar.close()
            test_loss, test_acc = evaluate(model, test_loader)
            record = {"epoch": epoch, "train_loss": float(np.mean(step_losses)), "test_loss": test_loss,
                      "test_accuracy": test_acc, "seconds": seconds, "samples_per_s": seen / seconds,
                      "lr": opt.param_groups[0]["lr"]}
            log["epochs"].append(record)
            log["step_losses"].extend(step_losses)
            print(f"epoch {epoch:3d}/{args.epochs}  train loss {record['train_loss']:.4f}  test loss {test_loss:.4f}  "
                  f"test acc {100 * test_acc:6.2f}%  {record['samples_per_s']:8.0f} samples/s", flush=True)
    log["final_test_accuracy"] = log["epochs"][-1]["test_accuracy"] if log["epochs"] else None
    if isinstance(step, ge2.CapturedStep):
        log["capture"] = {"graphs": len(step.graphs), "captures": step.captures, "replays": step.replays}
        print(f"captured steps: {step.replays} replays of {step.captures} CUDA graph(s) "
              f"(one per batch shape; the first calls of each ran eagerly)" if step.captured
              else "captured steps: none (no GPU: every step ran eagerly)")
    if not ge2.distributed.is_main_process():
        return log
    with open(os.path.join(args.out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    note = _plot(log, os.path.join(args.out, "curves.png")) if log["epochs"] else "no epochs: no curves.png"
    if note:
        print(f"note: {note}")
    if log["final_test_accuracy"] is not None:
        print(f"final test accuracy {100 * log['final_test_accuracy']:.2f}%  (log: {os.path.join(args.out, 'log.json')})")
    return log


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ge2 train`` options."""
    p.add_argument("--model", choices=("mlp", "cnn", "gpt", "lstm"), default="mlp",
                   help="gpt: a byte-level GPT on a text corpus (docs/gpt.md)")
    p.add_argument("--dataset", choices=("digits",), default="digits")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=None, help="default: 64 (gpt: see below)")
    p.add_argument("--lr", type=float, default=None, help="default: 1e-2 for adamw, 0.1 for sgd (gpt: 1e-3)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if present, else cpu")
    p.add_argument("--backend", choices=("triton", "torch"), default="triton")
    p.add_argument("--out", default=None, help="directory for log.json and curves.png (default: runs/train, "
                   "runs/gpt for gpt)")
    p.add_argument("--hidden", type=int, default=128, help="MLP hidden width (512 for the best test accuracy)")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capture", action="store_true",
                   help="replay each training step from a CUDA graph (ge2.capture): one launch per step")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm progress bar")
    p.add_argument("--nproc", type=int, default=None,
                   help="data-parallel over N ranks (one per GPU; gloo on CPUs): the same as torchrun "
                        "--nproc-per-node N -m ge2 train ...; --batch-size stays the global batch")
    from ge2 import train_gpt

    train_gpt.add_arguments(p)
