"""Where bench_train's CNN b512 step spends its GPU time: ge2's captured step and torch's CUDA graph
side by side (issue 26).

    PYTHONPATH=. python3 bench/profile_cnn_step.py [--batch 512] [--precision fp32|tf32|both] [--rows 20] [--ab]

Per precision, both sides run the same computation from the same weights:
  fp32: fp32-accurate matmuls and convs. ge2 "tf32x3" (error-compensated tf32); torch with TF32 off
        for cuBLAS and cuDNN (cuDNN's fp32 kernels).
  tf32: one-pass TF32. ge2 "tf32"; torch with TF32 on for cuBLAS and cuDNN.
Checks first that both sides compute the same thing: two eager steps on the same batches from the
same weights, losses of step 1 (forward) and step 2 (after one SGD update) compared. Then captures
both steps (ge2.capture, torch's whole-network CUDA graph), prints the replays' medians (alternating
rounds, as bench_train) and, from torch.profiler over a few replays, each side's kernels by µs per
step (name, launches per step), largest first.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402
from bench.bench_train import (_ge2_runners, _torch_graph, cnn_pair, copy_weights, ge2_sgd_step,  # noqa: E402
                               torch_sgd_step)
from bench.profile_gpt import kernel_table  # noqa: E402

PRECISIONS = {"fp32": ("tf32x3", False), "tf32": ("tf32", True)}  # ours: (ge2 precision, torch allow_tf32)


def kernel_us(fn, steps: int) -> list[tuple[str, int, float]]:
    """[(kernel name, launches per step, µs per step)] of ``steps`` profiled calls of ``fn``, largest first."""
    torch.cuda.synchronize()
    return [(name, calls, ms * 1e3) for name, calls, ms in kernel_table(fn, steps)]


def replay_ms(fns: dict, rounds: int = 5) -> dict[str, float]:
    """Median over alternating rounds of do_bench's median ms per call, per function."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            samples[key].append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return {k: sorted(v)[len(v) // 2] for k, v in samples.items()}


def same_losses(batch: int, batches) -> tuple[float, float, float, float]:
    """(ge2 loss 1, torch loss 1, ge2 loss 2, torch loss 2): two eager steps from the same weights."""
    ref, mine, _ = cnn_pair()
    ref, mine = ref.to(ge2.device()), mine.to(ge2.device())
    copy_weights(ref, mine)
    t_step, _ = torch_sgd_step(ref)
    g_step = ge2_sgd_step(mine)
    out = []
    for x, y in batches[:2]:
        gl = g_step(ge2.from_torch(x), ge2.from_torch(y))
        tl = t_step(x, y)
        out += [float(gl.item()), float(tl.item())]
    return out[0], out[1], out[2], out[3]


@contextlib.contextmanager
def _old_paths():
    """The switches of session 21's changes set as before them (``--ab``), call plans forgotten on the
    way in and out (a plan replays the launches of its first call, whatever a switch says since)."""
    from bench.harness import switched
    from ge2.backend import call_plans
    from ge2.kernels import conv, conv_framed

    call_plans.clear()
    try:
        with switched(conv_framed, PLANAR_SPLIT=False), switched(conv, DW_DIRECT_NARROW=0):
            yield
    finally:
        call_plans.clear()


def run(precision: str, batch: int, steps: int, nrows: int, ab: bool = False) -> dict:
    ge2_prec, allow = PRECISIONS[precision]
    ge2.set_matmul_precision(ge2_prec)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow
    torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(batch)
    batches = [(torch.randn(batch, 1, 28, 28, generator=g).to(ge2.device()), torch.randint(0, 10, (batch,), generator=g).to(ge2.device()))
               for _ in range(4)]
    g1, t1, g2, t2 = same_losses(batch, batches)
    print(f"\n##### {precision}: ge2 {ge2_prec} vs torch allow_tf32={allow}, batch {batch}")
    print(f"losses: step 1 ge2 {g1:.6f} torch {t1:.6f} (rel {abs(g1 - t1) / abs(t1):.1e}); "
          f"step 2 ge2 {g2:.6f} torch {t2:.6f} (rel {abs(g2 - t2) / abs(t2):.1e})", flush=True)
    ref, mine, _ = cnn_pair()
    ref, mine = ref.to(ge2.device()), mine.to(ge2.device())
    copy_weights(ref, mine)
    _, g_replay, captured = _ge2_runners(ge2_sgd_step(mine), batches)
    t_replay = _torch_graph(torch_sgd_step(ref)[0], batches, [0])
    fns = {"ge2_graph": g_replay, "torch_graph": t_replay}
    if ab:  # the same step captured with the old paths (the switches are read while capturing)
        old_ref, old_mine, _ = cnn_pair()
        copy_weights(old_ref, old_mine.to(ge2.device()))
        with _old_paths():
            fns["ge2_graph_before"] = _ge2_runners(ge2_sgd_step(old_mine), batches)[1]
    ms = replay_ms(fns)
    if ab:
        print(f"A/B: ge2 captured before session 21's changes {ms['ge2_graph_before']:.3f} ms, "
              f"after {ms['ge2_graph']:.3f} ms", flush=True)
    assert captured.captures == 1, captured
    print(f"replays: ge2 captured {ms['ge2_graph']:.3f} ms, torch graph {ms['torch_graph']:.3f} ms, "
          f"torch / ge2 = {ms['torch_graph'] / ms['ge2_graph']:.2f}", flush=True)
    result = {"precision": precision, "ge2_precision": ge2_prec, "torch_allow_tf32": allow, "batch": batch,
              "loss_step1": [g1, t1], "loss_step2": [g2, t2], **{f"{k}_ms": v for k, v in ms.items()}}
    for side, fn in (("ge2", g_replay), ("torch", t_replay)):
        rows = kernel_us(fn, steps)
        total = sum(r[2] for r in rows)
        print(f"\n{side} ({precision}): {total:.1f} us of kernels per step, {sum(r[1] for r in rows)} launches")
        print(f"{'us':>8} {'share':>6} {'calls':>5}  kernel")
        for name, c, us in rows[:nrows]:
            print(f"{us:8.1f} {100 * us / total:5.1f}% {c:5d}  {name}")
        result[f"{side}_kernels"] = rows
        result[f"{side}_kernel_us"] = total
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--precision", choices=("fp32", "tf32", "both"), default="both")
    ap.add_argument("--steps", type=int, default=5, help="profiled replays per side")
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--out", default=None, help="JSON file for the tables")
    ap.add_argument("--ab", action="store_true", help="also time ge2's step captured with the old paths")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_cnn_step: needs a GPU")
    results = [run(p, args.batch, args.steps, args.rows, args.ab)
               for p in (("fp32", "tf32") if args.precision == "both" else (args.precision,))]
    if args.out:
        Path(args.out).write_text(json.dumps({"commit": os.environ.get("GE2_COMMIT", ""), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
