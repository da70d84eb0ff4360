"""LSTM / GRU layers: ge2 (one GEMM for the input projection + persistent Triton recurrence) vs torch's
nn.LSTM / nn.GRU (cuDNN) in one process (issue 27).

    PYTHONPATH=. python3 bench/bench_rnn.py            # on a GPU; writes bench/results/rnn.json
    PYTHONPATH=. python3 bench/bench_rnn.py --smoke    # tiny shapes, each function called once (CPU too)

seq 128, batch 64, input = hidden in {256, 512, 1024}; forward (no_grad) and forward + backward
(grads of the input, the initial state and every weight). fp32 rows run ge2 with matmul precision
"tf32" and cuDNN with torch.backends.cudnn.allow_tf32 = True (its default), so both use tf32 tensor
cores; bf16 rows run both in bf16. ``path`` says which recurrence ge2 took (persistent / stepwise).
"""
from __future__ import annotations

import argparse

import torch

import ge2
import ge2.nn as nn
from ge2.kernels import rnn as K

PREDICTION = ("backward (session 19, A2): the persistent backward's cell inputs (dy, saved gates, c_prev) issued "
              "before the barrier and dh / dc carried in registers, instead of eight loads after the dot each converted "
              "to the dot's layout where loaded (serial L2 / HBM waits): bf16 LSTM 512 recurrence backward 1.13 -> "
              "~0.75 ms, fwd+bwd ratio 0.99 -> ~1.15; "
              "forward (session 19): the step's loads after the dot where a step has one round of rows (early, each is "
              "converted to the dot's layout at once: six serial L2 waits) puts hidden 256 back at the s17 kernel's time; "
              "stepwise fp32 1024 as one fused launch a step reading W_hh from L2 over 64-128 programs: ~8-10 us a step "
              "against 25 (GEMM + cell); "
              "forward (session 18): the dot as h_prev [64, K] x W_hh^T, a wgmma reading W^T from shared memory once "
              "a step instead of 8-16 warps re-loading W fragments every round (bf16 1024: ~384 KB of shared-memory "
              "reads a round, 4 rounds; ~1.7 us a round), one round for all 64 rows, gx / c loads issued before the "
              "h exchange: bf16 1024 17 -> ~7 us a step (recurrence 2.2 -> ~0.9 ms), 512 5.7 -> ~4 us; "
              "forward (session 16): per step the persistent kernel reads all of h_prev (B H bytes from L2, every program) and "
              "meets a grid barrier (~1-2 us) while W_hh stays in registers: ~3-5 us a step; backward (session 17): "
              "one dot per step over all gates per (16 units, 16-32 rows) program, W_hh streamed from L1/L2: ~5-6 us "
              "a step, 0.7 ms at hidden 256 and ~0.9 ms at 512, against the stepwise 1.3-1.8 ms")


BASELINE = None  # --baseline: an earlier kernels/rnn.py, its rnn_forward timed beside this one's
FORMS = True  # --no-forms: time only the default path (rec_fwd_ms), not each form of the forward
STEP_CONFIGS: list[tuple[int, ...]] = []  # --step-configs: fused stepwise forward configs timed beside the default
BWD_FORMS = False  # --bwd-forms: time the persistent backward with each load order (kernels.rnn.BWD_EARLY_LOADS)


def _modules(cls: str, hidden: int, dtype: torch.dtype, device):
    ref = getattr(torch.nn, cls)(hidden, hidden).to(device, dtype)
    ref.flatten_parameters()  # one contiguous weight buffer, as cuDNN wants (else it compacts on every call)
    mod = getattr(nn, cls)(hidden, hidden, device=device, dtype=dtype)
    mod.load_state_dict({k: ge2.from_torch(v.detach()) for k, v in ref.state_dict().items()})
    return mod, ref


def _graph_and_parts(name, g_fn, t_fn, mod, x, mode, dtype) -> dict:
    """CUDA-graph replay times (no host launch cost) of both sides, and of ge2's recurrence kernels alone."""
    from bench.harness import switched, time_ms
    from ge2.backend import call

    out = {}
    for key, fn in (("ge2_graph_ms", g_fn), ("cudnn_graph_ms", t_fn)):
        try:
            out[key] = time_ms(fn, 10, 50, cuda_graph=True)
        except Exception as e:  # noqa: BLE001 (recorded, not fatal)
            out[key] = f"{type(e).__name__}: {e}"[:120]
    T, B, H = x.shape
    ng = K.GATES[mode]
    gx = torch.randn(T, B, ng * H, device=x.device, dtype=dtype)
    w = mod.weight_hh_l0.data
    h0 = torch.zeros(B, H, device=x.device, dtype=dtype)
    c0 = h0 if mode == 2 else None
    kname = [k for k, v in K.MODES.items() if v == mode][0]
    save = name != "forward"
    res = call("rnn_forward", gx, w, None, h0, c0, None, mode=kname, reverse=False, save=save)

    def rec_fwd():
        call("rnn_forward", gx, w, None, h0, c0, None, mode=kname, reverse=False, save=save)

    out["rec_fwd_ms"] = time_ms(rec_fwd, 10, 50, cuda_graph=True)
    prec = "ieee" if dtype != torch.float32 else ge2.get_matmul_precision()
    fwd_key = ("fwd", H, mode, dtype, B, prec)
    # "64m": the batch-rows-as-M dot (kernels.rnn.FWD_BATCH_M); "32e" / "64l": BLOCK_B of W_hh x h_prev^T with the
    # step's loads early / late (kernels.rnn.FWD_EARLY_LOADS); 0: neither fitted, the stepwise forward ran
    plan = K.persistent_plan(H, mode, dtype, x.device, backward=False)
    if plan is None or K._BLOCK_B.get(fwd_key) == 0:
        fwd_bb = "0"
    elif K.FWD_BATCH_M and plan[2] >= K.FWD_BATCH_M_MIN_K and K._BLOCK_B.get(fwd_key + ("batch_m",)):
        fwd_bb = f"{K._BLOCK_B[fwd_key + ('batch_m',)]}m"
    else:
        early = B > K._block_b(B, plan[2]) if K.FWD_EARLY_LOADS == "auto" else bool(K.FWD_EARLY_LOADS)
        fwd_bb = f"{K._BLOCK_B.get(fwd_key + (early,), '-')}{'e' if early else 'l'}"
    # each form of the forward (the persistent dot's two orientations, its loads early / late, the stepwise forward
    # fused or as GEMM + cell, --step-configs), and --baseline's kernels, in this process: the launchers are called
    # directly (backend.call would replay its recorded plan, whatever kernels.rnn's switches say now)
    variants = [] if not FORMS else [
        ("batch_m", K, dict(FWD_BATCH_M=True, FWD_BATCH_M_MIN_K=0), None),
        ("early_loads", K, dict(FWD_BATCH_M=False, FWD_EARLY_LOADS=True), None),
        ("late_loads", K, dict(FWD_BATCH_M=False, FWD_EARLY_LOADS=False), None),
        ("step_fused", K, {}, "stepwise"), ("step_gemm", K, dict(FWD_STEP_FUSED=False), "stepwise")]
    variants += [("step_" + "_".join(map(str, cfg)), K, dict(FWD_STEP_CONFIG=cfg), "stepwise") for cfg in STEP_CONFIGS]
    if BASELINE is not None:
        variants.append(("baseline", BASELINE, {}, None))
    for tag, mod_, switches, path in variants:
        try:
            with switched(mod_, **switches):
                out[f"rec_fwd_{tag}_ms"] = time_ms(lambda: mod_.rnn_forward(gx, w, None, h0, c0, None, mode=mode,
                                                                           reverse=False, save=save, path=path),
                                                   10, 50, cuda_graph=True)
        except Exception as e:  # noqa: BLE001 (recorded, not fatal)
            out[f"rec_fwd_{tag}_ms"] = f"{type(e).__name__}: {e}"[:120]
    if save:
        dy = torch.randn(T, B, H, device=x.device, dtype=dtype)
        out["rec_bwd_ms"] = time_ms(lambda: call("rnn_backward", dy, h0, c0, w, None, *res[3:], mode=kname,
                                                 reverse=False), 10, 50, cuda_graph=True)
        # --bwd-forms: the persistent backward's cell inputs issued before the barrier (early) or after the dot (late)
        for tag, early in (("early", True), ("late", False)) if BWD_FORMS else ():
            try:
                with switched(K, BWD_EARLY_LOADS=early):
                    out[f"rec_bwd_{tag}_ms"] = time_ms(lambda: K.rnn_backward(dy, h0, c0, w, None, *res[3:],
                                                                              mode=mode, reverse=False,
                                                                              path="persistent"), 10, 50,
                                                       cuda_graph=True)
            except Exception as e:  # noqa: BLE001 (recorded, not fatal)
                out[f"rec_bwd_{tag}_ms"] = f"{type(e).__name__}: {e}"[:120]
    out["block_b"] = fwd_bb + "/" + str(K._BLOCK_B.get(("bwd", H, mode, dtype, B, prec), "-"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--layers", default="LSTM,GRU", help="comma-separated: LSTM,GRU")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32,bfloat16")
    ap.add_argument("--hidden", default="256,512,1024", help="comma-separated hidden sizes")
    ap.add_argument("--passes", default="forward,fwd+bwd", help="comma-separated: forward,fwd+bwd")
    ap.add_argument("--out", default="rnn", help="result name (bench/results/<out>.json)")
    ap.add_argument("--bwd", choices=("auto", "persistent", "stepwise"), default=None,
                    help="the backward path when a layer does not force one (default: kernels.rnn.BACKWARD_PATH)")
    ap.add_argument("--baseline", default=None, help="an earlier ge2/kernels/rnn.py (e.g. from git show): its "
                    "recurrence forward is timed beside this one's (rec_fwd_baseline_ms)")
    ap.add_argument("--no-forms", action="store_true", help="time the recurrence's default path only, not each form "
                    "of the forward (the persistent dot's orientations and load orders, the stepwise forms)")
    ap.add_argument("--bwd-forms", action="store_true", help="time the persistent backward with its cell inputs issued "
                    "before the barrier and after the dot (rec_bwd_early_ms / rec_bwd_late_ms)")
    ap.add_argument("--step-configs", default="", help="';'-separated BLOCK_H,BLOCK_B,BLOCK_K,warps,stages of the "
                    "fused stepwise forward, each timed (rec_fwd_step_<config>_ms)")
    args = ap.parse_args()
    global FORMS, STEP_CONFIGS, BWD_FORMS
    FORMS = not args.no_forms
    BWD_FORMS = args.bwd_forms
    STEP_CONFIGS = [tuple(int(v) for v in c.split(",")) for c in args.step_configs.split(";") if c]
    if args.baseline:
        from bench.harness import load_module
        global BASELINE
        BASELINE = load_module(args.baseline, "ge2.kernels._rnn_baseline")
    if args.bwd:
        K.BACKWARD_PATH = args.bwd
    if args.smoke:
        from bench.bench_nn import Smoke
        bench, sizes, T, B = Smoke(), (16,), 3, 2
    else:
        from bench.harness import Bench
        bench, sizes, T, B = Bench(args.out, rep_ms=60), tuple(int(h) for h in args.hidden.split(",")), 128, 64
    dev = ge2.device()
    ge2.set_matmul_precision("tf32")
    for cls in args.layers.split(","):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for hidden in sizes:
                mod, ref = _modules(cls, hidden, dtype, dev)
                x = torch.randn(T, B, hidden, device=dev, dtype=dtype)
                mode = K.MODES[cls.lower()]
                # the forward's default path / the backward's (kernels.rnn.BACKWARD_PATH); block_b 0 = the
                # persistent kernel did not fit shared memory and ran stepwise
                paths = ("persistent" if K.persistent_plan(hidden, mode, dtype, dev, backward=False) else "stepwise") \
                    + "/" + (K.auto_backward_path(hidden, mode, dtype) if K.BACKWARD_PATH == "auto" else K.BACKWARD_PATH)
                xg = ge2.from_torch(x)

                def ge2_fwd():
                    with ge2.no_grad():
                        mod(xg)

                def torch_fwd():
                    with torch.no_grad():
                        ref(x)

                xg_r = ge2.from_torch(x.clone()).requires_grad_()
                x_r = x.clone().requires_grad_()

                def ge2_train():
                    out, _ = mod(xg_r)
                    out.sum().backward()

                def torch_train():
                    out, _ = ref(x_r)
                    out.sum().backward()

                labels = dict(layer=cls, dtype=str(dtype).split(".")[-1], hidden=hidden, T=T, B=B, path=paths)
                for name, g_fn, t_fn in (("forward", ge2_fwd, torch_fwd), ("fwd+bwd", ge2_train, torch_train)):
                    if name not in args.passes.split(","):
                        continue
                    try:
                        extra = {} if args.smoke else _graph_and_parts(name, g_fn, t_fn, mod, x, mode, dtype)
                    except Exception as e:  # noqa: BLE001 (the eager row still counts)
                        extra = {"parts_error": f"{type(e).__name__}: {e}"[:160]}
                    bench.add({**labels, "pass": name, **extra}, ge2=g_fn, cudnn=t_fn)
    bench.report(prediction=PREDICTION, ge2_fp32_precision="tf32",
                 cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32), targets=">= 1.0x cuDNN at hidden <= 512, "
                 ">= 0.8x at 1024 (ratio_cudnn = cuDNN ms / ge2 ms)")


if __name__ == "__main__":
    main()
