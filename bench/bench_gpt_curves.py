"""Loss curves of ``ge2 train --model gpt`` against the same model trained by torch, in one PNG.

    PYTHONPATH=. python3 bench/bench_gpt_curves.py --max-steps 2000      # on a GPU (about 2 minutes)
    PYTHONPATH=. python3 bench/bench_gpt_curves.py --smoke               # a few steps of a tiny model (CPU too)

ge2 runs the real command (``ge2 train --model gpt --amp bf16 --capture``, its defaults otherwise:
nanoGPT's shakespeare-char model with dropout 0.2 on the bundled corpus). torch trains nanoGPT's model
(``bench/torch_gpt.py``) from the same initial weights on the same batches with the same schedule,
AdamW groups, clipping and bf16 autocast (``AdamW(fused=True)``, SDPA), evaluated on the same val
batches. Dropout masks cannot match between the two, so torch runs twice with different dropout
seeds: the spread of those two runs is the noise the ge2 curve is judged against.
Writes ``bench/results/gpt_curves.json`` and ``gpt_curves.png``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ge2  # noqa: E402
from bench.harness import RESULTS_DIR, environment  # noqa: E402
from bench.torch_gpt import TorchGPT  # noqa: E402
from ge2 import cli  # noqa: E402
from ge2.data.text import RandomWindows, TextCorpus, TextWindows  # noqa: E402
from ge2.models import GPT  # noqa: E402
from ge2.train_gpt import WarmupCosineLR  # noqa: E402


def torch_run(log: dict, dropout_seed: int) -> dict:
    """nanoGPT in torch with ge2's run config (log["config"]): its train and val losses by step."""
    cfg, mcfg = log["config"], log["model"]
    device = ge2.device()
    ge2.manual_seed(cfg["seed"])  # ge2 train's first draws: the model's initial weights
    init = GPT(**mcfg, device=device).state_dict()
    model = TorchGPT(**mcfg).to(device)
    model.load_state_dict({k: v.data for k, v in init.items()})
    corpus = TextCorpus(cfg["data"], max_bytes=cfg["max_bytes"])
    loader = RandomWindows(TextWindows(corpus.train, cfg["block_size"]), cfg["batch_size"], seed=cfg["seed"],
                           device=device)
    val_loader = RandomWindows(TextWindows(corpus.val, cfg["block_size"]), cfg["batch_size"], seed=cfg["seed"] + 1,
                               device=device)
    cuda = device.type == "cuda"
    opt = model.configure_optimizer(cfg["lr"], weight_decay=cfg["weight_decay"], fused=cuda)
    schedule = types.SimpleNamespace(warmup_steps=cfg["warmup_steps"], decay_steps=cfg["lr_decay_steps"],
                                     min_lr_ratio=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["amp"] == "bf16")
    torch.manual_seed(dropout_seed)
    out = {"train": [], "val": []}
    for step in range(1, cfg["max_steps"] + 1):
        for g in opt.param_groups:
            g["lr"] = WarmupCosineLR.lr_at(schedule, cfg["lr"], step - 1)
        x, y = next(loader)
        with autocast:
            _, loss = model(x.data, y.data)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        if step % cfg["log_interval"] == 0:
            out["train"].append({"step": step, "loss": loss.item()})
        if step % cfg["eval_interval"] == 0 or step == cfg["max_steps"]:
            model.eval()
            with torch.no_grad(), autocast:
                vals = [model(*(t.data for t in val_loader.batch(k)))[1].item() for k in range(cfg["eval_iters"])]
            model.train()
            out["val"].append({"step": step, "loss": sum(vals) / len(vals)})
    return out


def plot(runs: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for (name, run), color in zip(runs.items(), ("C0", "C3", "C1")):
        if run["train"]:
            ax.plot(*zip(*[(r["step"], r["loss"]) for r in run["train"]]), color=color, lw=0.6, alpha=0.45)
        ax.plot(*zip(*[(r["step"], r["loss"]) for r in run["val"]]), "o-", color=color, ms=3, label=f"{name} val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte); thin: train")
    ax.set_ylim(top=min(ax.get_ylim()[1], 3.0))
    ax.legend()
    fig.suptitle(title, fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=2000)
    ap.add_argument("--smoke", action="store_true", help="a tiny model for a few steps (CPU too), nothing written")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", "--model", "gpt", "--out", tmp, "--no-progress"]
        if args.smoke:
            argv += ["--max-steps", "4", "--eval-interval", "2", "--log-interval", "1", "--max-bytes", "200000",
                     "--amp", "none"]
        else:
            argv += ["--amp", "bf16", "--capture", "--max-steps", str(args.max_steps), "--eval-interval", "250"]
        t0 = time.perf_counter()
        assert cli.main(argv) == 0
        ge2_s = time.perf_counter() - t0
        log = json.loads((Path(tmp) / "log.json").read_text())
    runs = {"ge2 (captured)": {"train": log["train"], "val": log["val"]}}
    t0 = time.perf_counter()
    runs["torch"] = torch_run(log, dropout_seed=0)
    torch_s = time.perf_counter() - t0
    runs["torch, other dropout seed"] = torch_run(log, dropout_seed=1)
    finals = {name: run["val"][-1]["loss"] for name, run in runs.items()}
    noise = abs(finals["torch"] - finals["torch, other dropout seed"])
    pairs = zip(runs["torch"]["val"], runs["torch, other dropout seed"]["val"], runs["ge2 (captured)"]["val"])
    spread_max, gap_max = (max(v) for v in zip(*[(abs(a["loss"] - b["loss"]), abs(g["loss"] - a["loss"]))
                                                  for a, b, g in pairs]))
    gap = finals["ge2 (captured)"] - finals["torch"]
    for name, v in finals.items():
        print(f"final val loss  {name:28s} {v:.4f}")
    print(f"ge2 - torch = {gap:+.4f}; torch vs torch (dropout seeds) = {noise:.4f}; "
          f"over every evaluation: torch vs torch <= {spread_max:.4f}, ge2 vs torch <= {gap_max:.4f}; wall: ge2 {ge2_s:.0f} s (its evals, checkpoints and compiles included), torch {torch_s:.0f} s")
    if args.smoke:
        return
    c = log["config"]
    result = {**environment(), "config": c,
              "model": log["model"], "corpus": log["corpus"], "final_val": finals, "ge2_minus_torch": gap,
              "torch_seed_spread": noise, "torch_seed_spread_max_over_evals": spread_max,
              "ge2_torch_gap_max_over_evals": gap_max, "runs": runs}
    (RESULTS_DIR / "gpt_curves.json").write_text(json.dumps(result, indent=1))
    plot(runs, RESULTS_DIR / "gpt_curves.png",
         f"GPT {c['n_layer']}L/{c['n_head']}H/{c['n_embd']}, block {c['block_size']}, batch {c['batch_size']}, "
         f"bf16, dropout {log['model']['dropout']}, on {log['corpus']['source']} ({log['device']})")
    print(f"wrote {RESULTS_DIR / 'gpt_curves.json'} and gpt_curves.png")


if __name__ == "__main__":
    main()
