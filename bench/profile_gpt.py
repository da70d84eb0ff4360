"""Where a GPT training step's GPU time goes: ge2's kernels and torch's side by side (torch.profiler).

    PYTHONPATH=. python3 bench/profile_gpt.py [--model gpt-char|gpt2-small] [--steps 3] [--rows 25] [--host] [--compile]

Runs bench_train's GPT step (bf16 autocast, AdamW) eagerly on both sides, after warm-up, under
``torch.profiler`` and prints each side's kernels by total GPU time per step (kernel name, calls
per step, ms per step, share of the step). Eager steps launch the same kernels a captured step
replays, so the device time per kernel is the captured step's.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402
from bench.bench_train import GPT_CONFIGS, GPT_LR, gpt_pair  # noqa: E402


def kernel_table(step, steps: int) -> list[tuple[str, int, float]]:
    """[(kernel name, calls per step, ms per step)] of ``steps`` profiled calls of ``step``, largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total_us[e.name] += e.device_time
            calls[e.name] += 1
    rows = [(name[:90], calls[name] // steps, us / steps / 1e3) for name, us in total_us.items()]
    return sorted(rows, key=lambda r: -r[2])


def show(title: str, rows, n: int) -> None:
    total = sum(r[2] for r in rows)
    print(f"\n{title}: {total:.2f} ms of kernels per step, {sum(r[1] for r in rows)} launches")
    print(f"{'ms':>7} {'share':>6} {'calls':>5}  kernel")
    for name, c, ms in rows[:n]:
        print(f"{ms:7.3f} {100 * ms / total:5.1f}% {c:5d}  {name}")


def host_profile(step, steps: int, rows: int) -> None:
    """Host time per eager step (wall clock with the GPU kept busy) and cProfile's functions by own time."""
    import cProfile
    import pstats
    import time

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - t0) / steps
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    print(f"\nge2 eager step: host {1e3 * host:.2f} ms per step (to the last launch), wall {1e3 * wall:.2f} ms")
    from ge2.backend import call_plans
    from ge2.kernels import launch

    print(f"call plans {call_plans.STATS}, launch plans {launch.STATS}")
    for (op, why), n in sorted(call_plans.REFUSED.items(), key=lambda kv: -kv[1]):
        print(f"  refused {n}x {op}: {why}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    # the C side cProfile cannot see: allocations, launches, torch copies/fills made from ge2's C replays
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as ops:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"torch.profiler, CPU side, {steps} steps:")
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(GPT_CONFIGS), default="gpt2-small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--host", action="store_true", help="also ge2's host time per eager step and a cProfile table")
    ap.add_argument("--compile", action="store_true", help="also torch.compile's step (compiled outside the profile)")
    args = ap.parse_args()
    cfg, batch = GPT_CONFIGS[args.model]
    ref, mine = gpt_pair(cfg)
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, cfg["vocab_size"], (batch, cfg["block_size"]), generator=g).cuda() for _ in range(2))
    gx, gy = ge2.from_torch(x), ge2.from_torch(y)
    opt = mine.configure_optimizer(GPT_LR)
    ref_opt = ref.configure_optimizer(GPT_LR, fused=True)

    def ge2_step():
        with ge2.autocast("cuda", dtype=torch.bfloat16):
            _, loss = mine(gx, gy)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def torch_step_of(model, model_opt):
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = model(x, y)
            model_opt.zero_grad(set_to_none=True)
            loss.backward()
            model_opt.step()
        return step

    torch_step = torch_step_of(ref, ref_opt)
    for step in (ge2_step, torch_step):
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    show(f"ge2 {args.model}", kernel_table(ge2_step, args.steps), args.rows)
    show(f"torch {args.model}", kernel_table(torch_step, args.steps), args.rows)
    if args.compile:
        compiled_step = torch_step_of(torch.compile(ref), ref.configure_optimizer(GPT_LR, fused=True))
        for _ in range(3):
            compiled_step()
        torch.cuda.synchronize()
        show(f"torch.compile {args.model}", kernel_table(compiled_step, args.steps), args.rows)
    if args.host:
        host_profile(ge2_step, args.steps, 2 * args.rows)


if __name__ == "__main__":
    main()
