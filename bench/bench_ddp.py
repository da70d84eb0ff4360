"""Data-parallel training steps: ge2's DistributedDataParallel beside torch's, at each world size asked.

``python -m bench.bench_ddp --nproc 1 2 4 8 [--models gpt2-small cnn] [--smoke]``: for each N (at most
the GPUs present; larger N are recorded as not run) the ranks are started by torch's launcher and
time, per model, with ``triton.testing.do_bench`` medians on rank 0:

- ``ge2 local``: the step without DDP (no communication); ``ge2 ddp`` eager and ``ge2 ddp captured``
  (``ge2.capture``, the NCCL all-reduces inside the graph);
- ``allreduce``: all of the step's gradient buckets all-reduced alone, back to back;
- ``hidden``: the fraction of that all-reduce time that the DDP step hides behind backward,
  1 - (ddp - local) / allreduce (clipped to [0, 1]);
- torch: the same model's eager step without and with ``torch.nn.parallel.DistributedDataParallel``;
- tokens/s (GPT) or samples/s (CNN) over all ranks, and the scaling efficiency (per-GPU throughput
  at N over the one at 1 GPU).

The GPT is GPT-2 small (124M, bf16 autocast, 8 x 1024 tokens per GPU), the CNN the digits CNN of
bench_train at 28 x 28 (batch 256 per GPU). JSON: bench/results/ddp.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

WORKER_ENV = "GE2_BENCH_DDP_WORKER"


def _bench(fn, smoke: bool) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=5 if smoke else 25, rep=20 if smoke else 200))


def _hidden(ddp_ms: float, local_ms: float, allreduce_ms: float) -> float:
    return min(1.0, max(0.0, 1.0 - (ddp_ms - local_ms) / allreduce_ms)) if allreduce_ms > 0 else 1.0


def _model_rows(name: str, smoke: bool) -> dict:
    import ge2
    import torch.distributed as dist
    from ge2.nn.parallel import DistributedDataParallel
    from bench.bench_train import GPT_CONFIGS, GPT_LR, GPT_SMOKE, cnn_pair, copy_weights, gpt_pair

    device = ge2.distributed.device()
    world = ge2.distributed.get_world_size()
    if name == "gpt2-small":
        cfg, batch = GPT_SMOKE if smoke else GPT_CONFIGS["gpt2-small"]
        ref, mine = gpt_pair(cfg)
        g = torch.Generator(device="cpu").manual_seed(1 + ge2.distributed.get_rank())
        x = torch.randint(0, cfg["vocab_size"], (batch, cfg["block_size"]), generator=g).to(device)
        y = torch.randint(0, cfg["vocab_size"], (batch, cfg["block_size"]), generator=g).to(device)
        items, unit = batch * cfg["block_size"], "tokens"
        ge2_opt, torch_opt = mine.configure_optimizer(GPT_LR), ref.configure_optimizer(GPT_LR, fused=True)

        def ge2_loss(net, a, b):
            with ge2.autocast("cuda", dtype=torch.bfloat16):
                return net(a, b)[1]

        def torch_loss(net, a, b):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return net(a, b)[1]
    else:
        ref, mine, shape = cnn_pair()
        ref, mine = ref.to(device), mine.to(device)
        copy_weights(ref, mine)
        batch = 8 if smoke else 256
        g = torch.Generator(device="cpu").manual_seed(1 + ge2.distributed.get_rank())
        x = torch.randn(batch, *shape, generator=g).to(device)
        y = torch.randint(0, 10, (batch,), generator=g).to(device)
        items, unit = batch, "samples"
        ge2_opt = ge2.optim.SGD(mine.parameters(), lr=0.01, momentum=0.9)
        torch_opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)

        def ge2_loss(net, a, b):
            return ge2.nn.functional.cross_entropy(net(a), b)

        def torch_loss(net, a, b):
            return torch.nn.functional.cross_entropy(net(a), b)

    gx, gy = ge2.from_torch(x), ge2.from_torch(y)

    def ge2_step(net):
        def step(a, b):
            loss = ge2_loss(net, a, b)
            ge2_opt.zero_grad()
            loss.backward()
            ge2_opt.step()
            return loss
        return step

    def torch_step(net):
        def step():
            loss = torch_loss(net, x, y)
            torch_opt.zero_grad(set_to_none=True)
            loss.backward()
            torch_opt.step()
        return step

    row: dict = {"model": name, "world_size": world, "batch_per_gpu": batch, "unit": unit}
    local = ge2_step(mine)
    row["ge2_local_ms"] = _bench(lambda: local(gx, gy), smoke)
    ddp = DistributedDataParallel(mine)
    eager = ge2_step(ddp)
    row["ge2_ddp_ms"] = _bench(lambda: eager(gx, gy), smoke)
    captured = ge2.capture(ge2_step(ddp))
    row["ge2_ddp_captured_ms"] = _bench(lambda: captured(gx, gy), smoke)
    row["ge2_captured"] = captured.captured
    op = dist.ReduceOp.AVG

    def allreduce_all():
        works = [dist.all_reduce(b.buffer, op=op, async_op=True) for b in ddp._buckets]
        for w in works:
            w.wait()

    row["allreduce_ms"] = _bench(allreduce_all, smoke)
    row["buckets"] = len(ddp._buckets)
    row["grad_bytes"] = sum(b.buffer.numel() * b.buffer.element_size() for b in ddp._buckets)
    row["ge2_hidden"] = _hidden(row["ge2_ddp_ms"], row["ge2_local_ms"], row["allreduce_ms"])
    row["torch_local_ms"] = _bench(torch_step(ref), smoke)
    tddp = torch.nn.parallel.DistributedDataParallel(ref, device_ids=[device.index], gradient_as_bucket_view=True)
    row["torch_ddp_ms"] = _bench(torch_step(tddp), smoke)
    row["torch_hidden"] = _hidden(row["torch_ddp_ms"], row["torch_local_ms"], row["allreduce_ms"])
    for key in ("ge2_ddp", "ge2_ddp_captured", "torch_ddp"):
        row[f"{key}_{unit}_per_s"] = world * items / (row[f"{key}_ms"] / 1e3)
    return row


def worker(models: list[str], smoke: bool, out: str) -> None:
    import ge2

    ge2.distributed.init_process_group("nccl")
    try:
        rows = [_model_rows(m, smoke) for m in models]
        if ge2.distributed.is_main_process():
            with open(out, "w") as f:
                json.dump(rows, f)
    finally:
        ge2.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4, 8], help="world sizes to run")
    p.add_argument("--models", nargs="+", default=["gpt2-small", "cnn"], choices=("gpt2-small", "cnn"))
    p.add_argument("--smoke", action="store_true", help="tiny models, few repetitions (checks the script)")
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_out:
        return worker(args.models, args.smoke, args.worker_out)
    if not torch.cuda.is_available():
        sys.exit("bench_ddp: needs CUDA GPUs (NCCL)")
    gpus = torch.cuda.device_count()
    import triton

    result = {"bench": "ddp", "device": torch.cuda.get_device_name(0), "gpus": gpus, "torch": torch.__version__,
              "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke,
              "rows": [], "not_run": []}
    for n in args.nproc:
        if n > gpus:
            result["not_run"].append(f"world size {n}: this machine has {gpus} GPU(s)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m",
                   "bench.bench_ddp", "--models", *args.models, "--worker-out", out] + (["--smoke"] if args.smoke else [])
            rc = subprocess.run(cmd).returncode
            if rc != 0 or not os.path.isfile(out):
                result["not_run"].append(f"world size {n}: the ranks failed (exit code {rc})")
                continue
            result["rows"] += json.load(open(out))
    for row in result["rows"]:
        one = next((r for r in result["rows"] if r["model"] == row["model"] and r["world_size"] == 1), None)
        for key in ("ge2_ddp", "ge2_ddp_captured", "torch_ddp"):
            rate = f"{key}_{row['unit']}_per_s"
            if one is not None:
                row[f"{key}_scaling"] = row[rate] / row["world_size"] / one[rate]
    print(f"{'model':<11} {'N':>2} {'local':>7} {'ddp':>7} {'ddp cap':>7} {'allred':>7} {'hidden':>6} "
          f"{'t local':>7} {'t ddp':>7} {'t hid':>6} {'per s (ge2 cap)':>16} {'scaling':>7}")
    for r in result["rows"]:
        print(f"{r['model']:<11} {r['world_size']:>2} {r['ge2_local_ms']:7.2f} {r['ge2_ddp_ms']:7.2f} "
              f"{r['ge2_ddp_captured_ms']:7.2f} {r['allreduce_ms']:7.2f} {r['ge2_hidden']:6.2f} "
              f"{r['torch_local_ms']:7.2f} {r['torch_ddp_ms']:7.2f} {r['torch_hidden']:6.2f} "
              f"{r['ge2_ddp_captured_' + r['unit'] + '_per_s']:16,.0f} {r.get('ge2_ddp_captured_scaling', float('nan')):7.2f}")
    for note in result["not_run"]:
        print(f"not run: {note}")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", "ddp.json" if not args.smoke else "ddp_smoke.json")
    if os.path.isfile(path):  # keep the rows of the models not run this time
        old = json.load(open(path))
        result["rows"] = [r for r in old.get("rows", []) if r["model"] not in args.models] + result["rows"]
    for target in [path] + ([os.path.join(os.environ["OUT"], os.path.basename(path))] if os.environ.get("OUT") else []):
        with open(target, "w") as f:
            json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
