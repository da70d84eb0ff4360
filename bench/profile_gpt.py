"""Where a GPT training step's GPU time goes: ge2's kernels and torch's side by side (torch.profiler).

    PYTHONPATH=. python3 bench/profile_gpt.py [--model gpt-char|gpt2-small] [--steps 3] [--rows 25] [--host] [--compile]
        [--gemms]

Runs bench_train's GPT step (bf16 autocast, AdamW) eagerly on both sides, after warm-up, under
``torch.profiler`` and prints each side's kernels by total GPU time per step (kernel name, calls
per step, ms per step, share of the step). Eager steps launch the same kernels a captured step
replays, so the device time per kernel is the captured step's.

``--gemms`` records every GEMM launch of one ge2 step (call plans off, so each goes through
``gemm._launch``) and times each distinct one alone, as CUDA-graph replays, against cuBLAS's
``torch.mm`` of the same operand views (the GEMM floor: no epilogue on cuBLAS's side), largest
loss per step first; ``bench/results/gemm_gpt_step_<model>.json``.
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
    from bench.harness import profile_calls

    prof = profile_calls(step, steps, warmup=0)
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


def _gemm_signature(a_view, b_view, y, kw) -> tuple:
    """What picks a GEMM's kernel and config: sizes, operand majorness, dtypes, epilogue."""
    (a, (_, _, sak), batch, M, K), (_, (_, sbk, _), _, _, N) = a_view, b_view
    epilogue = tuple(sorted((k, v if isinstance(v, (int, float, str, bool)) else v is not None)
                            for k, v in kw.items() if v is not None))
    return (M, N, K, batch, sak == 1, sbk == 1, str(a.dtype).split(".")[1], str(y.dtype).split(".")[1], epilogue)


def _switched(module, name: str, value, launch, a_view, b_view, y, kw):
    """A call of ``launch`` with ``module.name`` set to ``value`` meanwhile; run once here (tuned
    outside any graph capture)."""
    from bench.harness import switched

    def run():
        with switched(module, **{name: value}):
            return launch(a_view, b_view, y, **kw)
    run()
    return run


def gemm_breakdown(step, model: str) -> None:
    """Each distinct GEMM launch of one ge2 step timed alone against cuBLAS's mm of the same operands."""
    from bench.harness import Bench
    from ge2.backend import call_plans
    from ge2.kernels import gemm as G

    seen: dict[tuple, list] = {}  # signature -> [launches per step, (a_view, b_view, y, kwargs)]
    launch = G._launch

    def recording(a_view, b_view, y, **kw):
        entry = seen.setdefault(_gemm_signature(a_view, b_view, y, kw), [0, (a_view, b_view, y, kw)])
        entry[0] += 1
        return launch(a_view, b_view, y, **kw)

    G._launch, call_plans.ENABLED = recording, False
    try:
        step()
        torch.cuda.synchronize()
    finally:
        G._launch, call_plans.ENABLED = launch, True
    bench = Bench(f"gemm_gpt_step_{model}", cuda_graph=True)
    for sig, (count, (a_view, b_view, y, kw)) in seen.items():
        (a, (_, sam, sak), batch, M, K), (b, (_, sbk, sbn), _, _, N) = a_view, b_view
        labels = dict(zip(("M", "N", "K", "batch", "a_kmajor", "b_kmajor", "dtype", "out"), sig[:8]))
        labels["epilogue"] = ",".join(f"{k}={v}" for k, v in sig[8]) or "-"
        labels["strides"] = f"a{(sam, sak)} b{(sbk, sbn)} y{tuple(y.stride())}"
        labels["per_step"] = count
        mm = None
        if batch == 1 and not kw.get("reduce_batch"):
            lhs, rhs = torch.as_strided(a, (M, K), (sam, sak)), torch.as_strided(b, (K, N), (sbk, sbn))
            mm = lambda lhs=lhs, rhs=rhs: torch.mm(lhs, rhs)  # noqa: E731
        tuners = (G._gemm_ws().gemm_ws_kernel, G.gemm_tma_kernel, G.gemm_epilogue_kernel)
        for tuner in tuners:  # off the repeated-call path, so that best_config names this call's pick
            tuner._fast.clear()
            tuner.best_config = None
        launch(a_view, b_view, y, **kw)
        config = next((f"{t.fn.__name__}: {t.best_config}" for t in tuners if t.best_config is not None), "-")
        whole = triton_only = None
        if batch == 1 and G._split_tail_on(M, N, K, G._tma_sms(a.device)) and "c" not in kw:
            whole = _switched(G, "SPLIT_TAIL", False, launch, a_view, b_view, y, kw)  # split tail off
        if config.startswith("gemm_ws_kernel"):
            triton_only = _switched(G._gemm_ws(), "USE_WS", False, launch, a_view, b_view, y, kw)  # Gluon off
        row = bench.add(labels, flops=2.0 * M * N * K * batch,
                        ge2=lambda args=(a_view, b_view, y), kw=kw: launch(*args, **kw), mm=mm, ge2_whole=whole,
                        ge2_triton=triton_only)
        row["config"] = config
        if row.get("mm_ms"):
            row["lost_ms_per_step"] = count * (row["ge2_ms"] - row["mm_ms"])
    bench.rows.sort(key=lambda r: -r.get("lost_ms_per_step", 0.0))
    total = {k: sum(r["per_step"] * r[f"{k}_ms"] for r in bench.rows if r.get("mm_ms")) for k in ("ge2", "mm")}
    bench.report(gemm_ms_per_step=total)
    print(f"GEMMs per step: ge2 {total['ge2']:.2f} ms, cuBLAS mm {total['mm']:.2f} ms (rows with an mm twin)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(GPT_CONFIGS), default="gpt2-small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--host", action="store_true", help="also ge2's host time per eager step and a cProfile table")
    ap.add_argument("--compile", action="store_true", help="also torch.compile's step (compiled outside the profile)")
    ap.add_argument("--gemms", action="store_true", help="only: time each GEMM of the ge2 step against cuBLAS's mm")
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
    if args.gemms:
        gemm_breakdown(ge2_step, args.model)
        return
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
