"""Softmax, fused cross-entropy and linear_cross_entropy: ge2 vs torch in one process (issue 4).

    PYTHONPATH=. python3 bench/bench_softmax_ce.py [--quick] [--only-ce] [--skip-lce]

* softmax forward / backward, effective TB/s (bytes read + written) at 4096x4096 and 8192x32768,
  fp32 and bf16; torch.softmax and its autograd backward beside it.
* cross-entropy forward + backward (ms) and peak extra memory (x the logits' bytes) at 8192x32768
  and 4096x128256, fp32 and bf16: ge2's fused op (gradient for gy = 1, then the gy scaling op,
  which costs no pass when gy == 1) vs ``F.cross_entropy(x, t).backward()``; columns for the
  default deferred target check (no host sync), the synchronous one and none. Before them, a sweep
  (``ce_split_sweep`` rows, each with its gradient's error vs torch) of the split path's and the
  two-pass kernel's (BLOCK_C, num_warps) at 4096x128256 and of one-row-per-program vs the persistent
  kernel at 8192x32768 picks the defaults they use (``ce_chosen_defaults`` in the JSON;
  ge2/kernels/cross_entropy.py carries the same values), beside a device-to-device copy of the
  logits (``copy_reference``: one read + one write, the fused pass's floor).
* linear_cross_entropy at N=8192, H=4096, V=128256 bf16 (time and peak memory) vs
  ``F.cross_entropy(x @ W.T + b, t).backward()``.

Times are do_bench medians (``bench.harness``); ``*_graph_ms`` columns replay the same call in a
CUDA graph (``do_bench_cudagraph``), which removes Python launch overhead from small shapes.
Writes bench/results/softmax_ce.json.
"""
from __future__ import annotations

import argparse
import gc
import json

import torch
import torch.nn.functional as TF
import triton

import ge2
import ge2.nn.functional as F
from bench.harness import RESULTS_DIR, Bench
from ge2.backend import call

TARGET_TBPS = 2.7


def _graph_ms(fn) -> float | None:
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception as e:  # noqa: BLE001  (a call that cannot be captured is reported, not fatal)
        print(f"  (graph timing failed: {type(e).__name__}: {e})")
        return None


def _peak_extra_bytes(fn) -> int:
    """Peak device memory fn() allocates beyond what was allocated before it (after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def bench_softmax(bench: Bench, shapes, dtypes) -> None:
    for (M, N), dtype in ((s, d) for s in shapes for d in dtypes):
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        gy = torch.randn(M, N, device="cuda", dtype=dtype)
        y = call("softmax", x, dim=-1)
        y_ref = torch.softmax(x, -1)
        err = ((y.double() - y_ref.double()).norm() / y_ref.double().norm()).item()
        xt = x.clone().requires_grad_()
        yt = torch.softmax(xt, -1)
        nbytes = M * N * x.element_size()
        for direction, ge2_fn, torch_fn, moved in (
            ("fwd", lambda: call("softmax", x, dim=-1), lambda: torch.softmax(x, -1), 2 * nbytes),
            ("bwd", lambda: call("softmax_backward", gy, y, dim=-1),
             lambda: torch.autograd.grad(yt, xt, gy, retain_graph=True), 3 * nbytes),
        ):
            row = bench.add({"case": f"softmax_{direction}", "shape": f"{M}x{N}", "dtype": str(dtype)[6:]},
                            ge2=ge2_fn, torch=torch_fn)
            row["ge2_graph_ms"] = _graph_ms(ge2_fn)
            # (torch's autograd backward cannot be captured by itself; its forward can)
            row["torch_graph_ms"] = _graph_ms(torch_fn) if direction == "fwd" else None
            for k in ("ge2", "torch", "ge2_graph", "torch_graph"):
                ms = row.get(f"{k}_ms")
                row[f"{k}_tbps"] = moved / ms / 1e9 if ms else None
            if direction == "fwd":
                row["rel_err_vs_torch"] = err
                row["meets_2.7TBps"] = bool(row["ge2_graph_tbps"] and row["ge2_graph_tbps"] >= TARGET_TBPS)
            print(f"  -> ge2 {row['ge2_tbps'] or 0:.2f} TB/s (graph {row['ge2_graph_tbps'] or 0:.2f}), "
                  f"torch {row['torch_tbps'] or 0:.2f} TB/s", flush=True)
        del x, gy, y, y_ref, xt, yt
        torch.cuda.empty_cache()


def bench_cross_entropy(bench: Bench, shapes, dtypes) -> None:
    from ge2.kernels import cross_entropy as K

    for (N, C), dtype in ((s, d) for s in shapes for d in dtypes):
        x = torch.randn(N, C, device="cuda", dtype=dtype)
        t = torch.randint(0, C, (N,), device="cuda")
        t[::17] = -100
        one = torch.ones((), device="cuda", dtype=dtype)
        logits_bytes = N * C * x.element_size()

        def ge2_fused(check=None):
            loss, g = call("cross_entropy_fwd_bwd", x, t, check_targets=check)
            return call("cross_entropy_backward", one, g)

        scratch = x.clone()

        def ge2_inplace():
            # dlogits overwrite the buffer (later iterations run on gradients: same work, same bytes)
            loss, g = call("cross_entropy_fwd_bwd", scratch, t, inplace=True)
            return call("cross_entropy_backward", one, g)

        xt = x.clone().requires_grad_()

        def torch_fwd_bwd():
            xt.grad = None
            TF.cross_entropy(xt, t).backward()

        loss_ge2, g_ge2 = call("cross_entropy_fwd_bwd", x, t)
        xt.grad = None
        ref = TF.cross_entropy(xt, t)
        ref.backward()
        grad_err = ((g_ge2.double() - xt.grad.double()).norm() / xt.grad.double().norm()).item()
        del g_ge2
        xt.grad = None
        es = x.element_size()
        if C > K.MAX_FUSED_C[es] and K.TWO_PASS_CONFIG[es]:
            path = _cfg_name(("two_pass", *K.TWO_PASS_CONFIG[es]))
        elif C > K.MAX_FUSED_C[es]:
            path = f"split {_cfg_name(K.SPLIT_CONFIG[es])}"
        else:
            path = _cfg_name((K.ROW_CONFIG[es] or 0) if C > K.ROW_PERSISTENT_MIN_C else 0)
        row = bench.add({"case": "cross_entropy_fwd_bwd", "shape": f"{N}x{C}", "dtype": str(dtype)[6:],
                         "path": path},
                        ge2=ge2_fused, ge2_sync_check=lambda: ge2_fused(True), ge2_nocheck=lambda: ge2_fused(False),
                        ge2_inplace=ge2_inplace, torch=torch_fwd_bwd)
        K.check_pending_targets()
        row["ge2_graph_ms"] = _graph_ms(lambda: ge2_fused(False))
        # bytes: ignored rows (1 in 17) are not read; every row's gradient is written
        moved = logits_bytes * (2 - len(range(0, N, 17)) / N)
        row["ge2_graph_tbps"] = moved / row["ge2_graph_ms"] / 1e9 if row["ge2_graph_ms"] else None
        row["loss_abs_diff"] = abs(loss_ge2.item() - ref.item())
        row["grad_rel_err_vs_torch"] = grad_err
        scratch.copy_(x)
        mem_ge2 = _peak_extra_bytes(ge2_inplace)
        xt.grad = None
        mem_torch = _peak_extra_bytes(torch_fwd_bwd)
        xt.grad = None
        row["ge2_peak_extra_x_logits"] = mem_ge2 / logits_bytes
        row["torch_peak_extra_x_logits"] = mem_torch / logits_bytes
        print(f"  -> graph {row['ge2_graph_ms'] or 0:.3f} ms ({row['ge2_graph_tbps'] or 0:.2f} TB/s); "
              f"peak extra memory: ge2 {row['ge2_peak_extra_x_logits']:.4f}x logits, "
              f"torch {row['torch_peak_extra_x_logits']:.2f}x; grad err {grad_err:.2e}", flush=True)
        del x, t, scratch, xt, ref, loss_ge2
        gc.collect()
        torch.cuda.empty_cache()


# Swept: the split path's and the two-pass kernel's (BLOCK_C, num_warps) at the long rows (SPLIT_CONFIG,
# TWO_PASS_CONFIG), and, for rows of 8192x32768 (ROW_CONFIG), one row per program (0) or the persistent
# kernel with that many warps.
SPLIT_SWEEP = [(4096, 4), (8192, 4), (4096, 2), (2048, 2), (4096, 8)]
TWO_PASS_SWEEP = [(16384, 32), (16384, 16)]
ROW_SWEEP = [0, 32, 16]


def _cfg_name(cfg) -> str:
    if isinstance(cfg, int):
        return f"persistent, {cfg} warps" if cfg else "in registers, one row per program"
    if cfg[0] == "two_pass":
        return f"two-pass BLOCK_C={cfg[1]} warps={cfg[2]}"
    return f"BLOCK_C={cfg[0]} warps={cfg[1]}"


def _cfg_kwargs(cfg) -> dict:
    if isinstance(cfg, int):
        return dict(persistent_warps=cfg)
    if cfg[0] == "two_pass":
        return dict(two_pass_config=cfg[1:])
    return dict(split_config=cfg)


def sweep_split(bench: Bench, long_shape, short_shape, dtypes, long_configs=SPLIT_SWEEP,
                short_configs=ROW_SWEEP) -> dict:
    """Kernel-level fwd+bwd (targets, fused pass, loss sum) per config; sets the winners as defaults.

    For each dtype: SPLIT_CONFIG or TWO_PASS_CONFIG = the fastest of ``long_configs`` (split
    (BLOCK_C, warps) or ("two_pass", BLOCK_C, warps)) at ``long_shape``; ROW_CONFIG =
    the fastest of ``short_configs`` (None: the in-register kernel) at ``short_shape``. Beside
    them, a device-to-device copy of the logits (one read + one write: the floor of the fused pass).
    """
    from ge2.kernels import cross_entropy as K

    bench.warmup_ms, bench.rep_ms = 10, 40
    chosen = {}
    for dtype in dtypes:
        es = torch.tensor([], dtype=dtype).element_size()
        best = {}
        for (N, C), configs in ((long_shape, long_configs), (short_shape, short_configs)):
            x = torch.randn(N, C, device="cuda", dtype=dtype)
            y = torch.empty_like(x)
            t = torch.randint(0, C, (N,), device="cuda")
            t[::17] = -100
            bench.add({"case": "copy_reference", "shape": f"{N}x{C}", "dtype": str(dtype)[6:]},
                      torch=lambda: y.copy_(x))
            xt = x.clone().requires_grad_()
            TF.cross_entropy(xt, t).backward()
            g_ref = xt.grad.double()
            del xt
            for cfg in configs:
                kw = _cfg_kwargs(cfg)
                fn = lambda kw=kw: K.cross_entropy_fwd_bwd(x, t, check_targets=False, **kw)  # noqa: E731
                try:
                    g = fn()[1]
                    err = ((g.double() - g_ref).norm() / g_ref.norm()).item()
                    del g
                    row = bench.add({"case": "ce_split_sweep", "shape": f"{N}x{C}", "dtype": str(dtype)[6:],
                                     "config": _cfg_name(cfg)}, ge2=fn)
                except Exception as e:  # noqa: BLE001  (a config that fails to compile is reported, not fatal)
                    print(f"  {_cfg_name(cfg)}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                row["grad_rel_err_vs_torch"] = err
                best[(C, cfg)] = (row["ge2_ms"] or float("inf")) if err < 2e-2 else float("inf")
            del x, y, t, g_ref
            torch.cuda.empty_cache()
        long_c, short_c = long_shape[1], short_shape[1]
        fastest = min((c for c in long_configs if (long_c, c) in best), key=lambda c: best[(long_c, c)])
        if fastest[0] == "two_pass":
            K.TWO_PASS_CONFIG[es] = fastest[1:]
        else:
            K.SPLIT_CONFIG[es], K.TWO_PASS_CONFIG[es] = fastest, None
        K.ROW_CONFIG[es] = min((c for c in short_configs if (short_c, c) in best),
                               key=lambda c: best[(short_c, c)]) or None
        chosen[str(dtype)[6:]] = {"SPLIT_CONFIG": list(K.SPLIT_CONFIG[es]), "ROW_CONFIG": K.ROW_CONFIG[es],
                                  "TWO_PASS_CONFIG": K.TWO_PASS_CONFIG[es] and list(K.TWO_PASS_CONFIG[es]),
                                  "MAX_FUSED_C": K.MAX_FUSED_C[es]}
        print(f"  -> {dtype}: SPLIT_CONFIG {K.SPLIT_CONFIG[es]}, TWO_PASS_CONFIG {K.TWO_PASS_CONFIG[es]}, "
              f"ROW_CONFIG {K.ROW_CONFIG[es]}", flush=True)
    bench.warmup_ms, bench.rep_ms = 25, 100
    return chosen


def bench_linear_cross_entropy(bench: Bench, N: int, H: int, V: int, dtype) -> None:
    x0 = torch.randn(N, H, device="cuda", dtype=dtype)
    W0 = torch.randn(V, H, device="cuda", dtype=dtype) * H ** -0.5
    b0 = torch.randn(V, device="cuda", dtype=dtype) * 0.1
    t = torch.randint(0, V, (N,), device="cuda")
    x, W, b = (ge2.from_torch(v, requires_grad=True) for v in (x0, W0, b0))
    tt = ge2.from_torch(t)

    def ge2_fn():
        x.grad = W.grad = b.grad = None
        F.linear_cross_entropy(x, W, tt, linear_bias=b).backward()

    xt, Wt, bt = (v.clone().requires_grad_() for v in (x0, W0, b0))

    def torch_fn():
        xt.grad = Wt.grad = bt.grad = None
        TF.cross_entropy(xt @ Wt.T + bt, t).backward()

    ge2_fn()
    torch_fn()
    errs = {name: ((a.grad.data.double() - r.grad.double()).norm() / r.grad.double().norm()).item()
            for name, a, r in (("dx", x, xt), ("dW", W, Wt), ("db", b, bt))}
    row = bench.add({"case": "linear_cross_entropy", "shape": f"N{N}_H{H}_V{V}", "dtype": str(dtype)[6:]},
                    ge2=ge2_fn, torch=torch_fn, flops=3 * 2 * N * H * V)
    mem_ge2 = _peak_extra_bytes(ge2_fn)
    mem_torch = _peak_extra_bytes(torch_fn)
    row["ge2_peak_extra_gb"] = mem_ge2 / 1e9
    row["torch_peak_extra_gb"] = mem_torch / 1e9
    row["peak_ratio_ge2_over_torch"] = mem_ge2 / mem_torch
    row["time_ratio_ge2_over_torch"] = row["ge2_ms"] / row["torch_ms"]
    row.update({f"{k}_rel_diff_vs_torch": v for k, v in errs.items()})
    print(f"  -> peak extra: ge2 {mem_ge2 / 1e9:.2f} GB, torch {mem_torch / 1e9:.2f} GB "
          f"({mem_ge2 / mem_torch:.2f}x); time {row['time_ratio_ge2_over_torch']:.2f}x torch; grads {errs}",
          flush=True)


def earlier_rows(skip_cases: set[str]) -> list[dict]:
    """The rows of cases this run does not measure, from the existing JSON (read before the first row
    overwrites it), each marked with its run's date and commit."""
    path = RESULTS_DIR / "softmax_ce.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    return [{**row, "measured": row.get("measured", f"{old.get('date')} ({old.get('commit')})")}
            for row in old.get("rows", []) if row.get("case") not in skip_cases]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    ap.add_argument("--skip-lce", action="store_true")
    ap.add_argument("--only-ce", action="store_true",
                    help="cross-entropy rows and the split sweep only; the other rows are kept from the JSON")
    ap.add_argument("--sweep", default=",".join(f"{b}x{w}" for b, w in SPLIT_SWEEP),
                    help="split configs BLOCK_CxWARPS to sweep for the long rows, comma-separated")
    ap.add_argument("--two-pass-sweep", default=",".join(f"{b}x{w}" for b, w in TWO_PASS_SWEEP),
                    help="two-pass configs BLOCK_CxWARPS to sweep for the long rows, comma-separated")
    ap.add_argument("--row-sweep", default=",".join(map(str, ROW_SWEEP)),
                    help="for rows of 32768: warps of the persistent kernel, 0 = one row per program")
    ap.add_argument("--no-ce-table", action="store_true", help="the sweep only (no cross_entropy_fwd_bwd rows)")
    args = ap.parse_args()
    sweep = [tuple(int(v) for v in c.split("x")) for c in args.sweep.split(",")]
    sweep += [("two_pass", *(int(v) for v in c.split("x"))) for c in args.two_pass_sweep.split(",") if c]
    row_sweep = [int(v) for v in args.row_sweep.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("bench_softmax_ce: needs a CUDA GPU (timings under the interpreter mean nothing)")
    torch.manual_seed(0)
    # (ce_recompute_exp / ce_online_sweep: rows of earlier kernels, not carried over)
    kept = earlier_rows({"cross_entropy_fwd_bwd", "ce_split_sweep", "ce_recompute_exp", "ce_online_sweep",
                         "experiment_ce_split_sweep", "experiment_cross_entropy_fwd_bwd", "copy_reference"}
                        ) if args.only_ce else []
    bench = Bench("softmax_ce")
    dtypes = (torch.float32, torch.bfloat16)
    quick = args.quick
    if not args.only_ce:
        bench_softmax(bench, [(1024, 1024)] if quick else [(4096, 4096), (8192, 32768)], dtypes)
    shapes = [(1024, 4096), (256, 40000)] if quick else [(8192, 32768), (4096, 128256)]
    chosen = sweep_split(bench, shapes[1], shapes[0], dtypes, sweep, row_sweep)
    if not args.no_ce_table:
        bench_cross_entropy(bench, shapes, dtypes)
    if not args.skip_lce and not args.only_ce:
        bench_linear_cross_entropy(bench, *((512, 256, 8192) if quick else (8192, 4096, 128256)), torch.bfloat16)
    bench.rows.extend(kept)
    bench.report(ce_chosen_defaults=chosen, targets={
        "softmax_fwd_tbps": TARGET_TBPS,
        "ce_fwd_bwd_ms": {"8192x32768": {"float32": 0.8, "bfloat16": 0.45},
                          "4096x128256": {"float32": 1.5, "bfloat16": 0.8}},
        "ce_peak_extra_x_logits": 0.1,
        "lce": {"peak_ratio": 0.25, "time_ratio": 1.1},
    })


if __name__ == "__main__":
    main()
