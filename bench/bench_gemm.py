"""GEMM + bias + activation (the Linear layer's forward and backward): ge2 vs torch/cuBLAS.

Shapes are M x N x K in the Linear layout: x [M, K] row-major, W [N, K] (torch's weight layout,
so op(B) = W^T is K-major), bias [N]. Columns, each a median of triton's do_bench:

    forward   ge2       call("gemm", x, W, bias, trans_b=True, bias_kind="per_n", act=act)
              mm        torch.mm(x, W.t()) alone (no epilogue: the GEMM floor)
              eager     act(x @ W.t() + b), unfused torch eager
              lt        torch._addmm_activation (cuBLASLt's fused bias+relu/gelu epilogue)
              compile   torch.compile of the eager expression (--compile)
    fwd+bwd   ge2       gemm(save_z) + gemm_backward -> dx, dW, db
              torch     torch autograd of act(F.linear(x, W, b)), grads by autograd.grad

``--mode kernel`` times device buffers, as CUDA-graph replays (no host launch overhead: what a
captured training step sees); ``--mode end2end`` starts from host tensors and includes the copies
in and out, launched eagerly. Ratios are torch time / ge2 time (> 1: ge2 faster). Run on the GPU:

    PYTHONPATH=. python3 bench/bench_gemm.py [--mode kernel] [--shapes main|sweep|all|mlp|gpt] [--dtypes bf16,fp16,tf32,ieee,tf32x3]
        [--only 8192x4096x4096,...] [--bwd all|none|8192x1024x4096,...] [--precompile] [--extra-configs]

Kernel-mode forward rows also record each side's error against float64 (``ge2_error``, ``lt_error``:
max |error| / max |result|); ``--shapes mlp --dtypes tf32x3,ieee,tf32`` measures the fp32 modes on
the training benchmark's layers (torch runs full fp32 except in the tf32 rows).

``--precompile`` first compiles every TMA config of the selected rows in parallel processes, one
config each (into Triton's on-disk cache): Triton's autotuner compiles one config after the other,
which took most of a 10-minute run before; the tuning that follows then only times them.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import torch
import torch.nn.functional as F

import ge2
from bench import harness
from bench.harness import Bench
from ge2.backend import call
from ge2.kernels import gemm as gemm_kernels
import triton  # noqa: E402  (after ge2, which decides TRITON_INTERPRET)

MAIN_SHAPES = [  # (M, N, K, act)
    (4096, 4096, 4096, "relu"),
    (8192, 1024, 4096, "relu"),
    (8192, 4096, 4096, "gelu"),
    (512, 784, 1024, "relu"),
]
SWEEP_SHAPES = [(n, n, n, "relu") for n in (256, 512, 1024, 2048, 4096, 8192)]
# The training benchmark's fp32 layers (bench_train.py): MLP 784-1024-1024 at batch 64/512/4096 and
# the CNN's 3136->128 FC at batch 64 (few tiles, long K: split-K).
MLP_SHAPES = [(512, 1024, 784, "relu"), (512, 1024, 1024, "relu"), (4096, 1024, 1024, "relu"),
              (64, 1024, 784, "relu"), (64, 128, 3136, "relu")]
# The GPT step's Linear layers (issue 24's two models, tokens x out x in): shakespeare-char's
# c_attn, c_fc (gelu), mlp c_proj at 64 x 256 tokens, GPT-2 small's at 8 x 1024 tokens (and its
# attention c_proj, 768 -> 768).
GPT_SHAPES = [(16384, 1152, 384, "none"), (16384, 1536, 384, "gelu"), (16384, 384, 1536, "none"),
              (8192, 2304, 768, "none"), (8192, 768, 768, "none"), (8192, 3072, 768, "gelu"),
              (8192, 768, 3072, "none")]
# Tile shapes outside the tuned list, tried with --extra-configs (bf16/fp16): an M-wide tile as
# cuBLAS's cooperative 256x128, deeper pipelines, a wider group.
EXTRA_CONFIGS_16BIT = [
    gemm_kernels._tma_cfg(256, 128, 64, 8, 3),
    gemm_kernels._tma_cfg(256, 128, 64, 8, 4),
    gemm_kernels._tma_cfg(128, 256, 64, 8, 4, group_m=16),
    gemm_kernels._tma_cfg(128, 128, 64, 8, 5),
    gemm_kernels._tma_cfg(128, 256, 32, 8, 6),
    gemm_kernels._tma_cfg(128, 256, 64, 8, 3, epi_split=True),  # the epilogue in two 128-wide halves
    gemm_kernels._tma_cfg(128, 256, 64, 8, 4, epi_split=True),
]
DTYPES = {  # name -> (torch dtype, fp32 precision)
    "bf16": (torch.bfloat16, "ieee"),
    "fp16": (torch.float16, "ieee"),
    "tf32": (torch.float32, "tf32"),
    "tf32-trunc": (torch.float32, "tf32"),  # operands truncated by the tensor cores, not rounded
    "ieee": (torch.float32, "ieee"),
    "tf32x3": (torch.float32, "tf32x3"),  # ge2's default for fp32; torch side: full fp32
}
TORCH_ACT = {"relu": F.relu, "gelu": F.gelu, "none": lambda y: y}


def _best_config() -> str:
    """The config the last forward ran with (TMA kernel if it took that path)."""
    names = ("gemm_tma_kernel", "gemm_epilogue_kernel") if gemm_kernels.USE_TMA else ("gemm_epilogue_kernel",)
    for name in names:
        cfg = getattr(getattr(gemm_kernels, name), "best_config", None)
        if cfg is not None:
            return f"{name.split('_')[1]}: {cfg}".replace(", ", " ")
    return "-"


def _inputs(M: int, N: int, K: int, dtype_name: str):
    """Host and device x [M, K], W [N, K], b [N] in the row's dtype; sets the row's precision mode."""
    dtype, precision = DTYPES[dtype_name]
    gemm_kernels.ROUND_TF32 = dtype_name != "tf32-trunc"
    ge2.set_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    gen = torch.Generator(device="cpu").manual_seed(0)
    x_h = torch.randn(M, K, generator=gen).to(dtype)
    w_h = (torch.randn(N, K, generator=gen) / K ** 0.5).to(dtype)
    b_h = torch.randn(N, generator=gen).to(dtype)
    return (x_h, w_h, b_h), (x_h.to("cuda"), w_h.to("cuda"), b_h.to("cuda"))


def _ge2_fwd_bwd(x, w, b, act: str):
    """ge2's Linear+act forward and backward (dx, dW, db) for one gY."""
    gy = torch.randn(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)

    def fwd_bwd():
        y, z = call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act=act, save_z=True)
        return call("gemm_backward", gy, x, w, z, y, trans_b=True, bias_kind="per_n", act=act)

    return fwd_bwd, gy


def _tuning_times(tuner) -> dict[str, float]:
    """The autotuner's last measurements, config -> ms (how far the runners-up are behind)."""
    out = {}
    for cfg, t in (getattr(tuner, "configs_timings", None) or {}).items():
        k = cfg.kwargs
        name = f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} w{cfg.num_warps} s{cfg.num_stages}"
        name += " epi-split" if k.get("EPI_SPLIT") else ""  # else a split config overwrites its unsplit twin
        out[name] = round(float(t[0] if isinstance(t, (list, tuple)) else t), 4)
    return out


def bench_shape(bench: Bench, M: int, N: int, K: int, act: str, dtype_name: str, *, mode: str,
                compile_: bool, backward: bool, variants: bool = False, forward: bool = True) -> None:
    (x_h, w_h, b_h), (x, w, b) = _inputs(M, N, K, dtype_name)
    dev = "cuda"
    torch_act = TORCH_ACT[act]
    labels = {"shape": f"{M}x{N}x{K}", "act": act, "dtype": dtype_name, "mode": mode}

    def ge2_fwd(x=x, w=w, b=b):
        return call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act=act)[0]

    def eager(x=x, w=w, b=b):
        return torch_act(x @ w.t() + b)

    def lt(x=x, w=w, b=b):
        if act == "none":
            return torch.addmm(b, x, w.t())
        return torch._addmm_activation(b, x, w.t(), use_gelu=act == "gelu")

    def ge2_pointer_kernel():  # the non-TMA kernel, for comparison
        gemm_kernels.USE_TMA = False
        try:
            return ge2_fwd()
        finally:
            gemm_kernels.USE_TMA = True

    compiled = torch.compile(eager) if compile_ else None
    fns = {"ge2": ge2_fwd, "mm": lambda: torch.mm(x, w.t()), "eager": eager, "lt": lt}
    if mode == "kernel" and variants:
        ge2_pointer_kernel()
        fns["ge2_ptr"] = ge2_pointer_kernel
    if compiled is not None:
        fns["compile"] = compiled
    if mode == "end2end":  # host tensors in, host tensor out: the copies are part of the time
        def end2end(fn):
            return lambda: fn(x_h.to(dev, non_blocking=True), w_h.to(dev, non_blocking=True),
                              b_h.to(dev, non_blocking=True)).cpu()
        fns = {k: end2end(fn) for k, fn in fns.items() if k != "mm"}
    tuner = gemm_kernels.gemm_tma_kernel
    tuned_before = len(getattr(tuner, "tuned_keys", []))
    ge2_fwd()  # tune first (outside any graph capture), so that the config column names the one timed
    if compiled is not None:
        compiled()
    config = _best_config()
    if forward:
        row = bench.add({**labels, "pass": "fwd"}, flops=2.0 * M * N * K, **fns)
        row["config"] = config
        if mode == "kernel":  # max |error| / max |float64 result|, ge2 and cuBLASLt in this row's mode
            ref = torch_act(x.double() @ w.double().t() + b.double())
            for name, fn in (("ge2", ge2_fwd), ("lt", lt)):
                row[f"{name}_error"] = ((fn().double() - ref).abs().max() / ref.abs().max()).item()
        if len(getattr(tuner, "tuned_keys", [])) > tuned_before:  # this row tuned the TMA kernel: keep every time
            row["tuning_ms"] = _tuning_times(tuner)

    if backward and mode == "kernel":
        ge2_fwd_bwd, gy = _ge2_fwd_bwd(x, w, b, act)
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))

        def torch_fwd_bwd():
            y = torch_act(F.linear(xr, wr, br))
            return torch.autograd.grad(y, (xr, wr, br), gy)

        ge2_fwd_bwd()
        bench.add({**labels, "pass": "fwd+bwd"}, flops=6.0 * M * N * K, ge2=ge2_fwd_bwd, torch=torch_fwd_bwd)


def plot(json_path: str, png_path: str) -> None:
    """TFLOP/s vs size of the square sweep, ge2 and cuBLAS (mm, and cuBLASLt fused), one line per dtype."""
    import json

    data = json.load(open(json_path))
    rows = [r for r in data["rows"] if r["pass"] == "fwd" and len(set(r["shape"].split("x"))) == 1]
    names = {"ge2": "ge2 fused", "lt": "cuBLASLt fused", "mm": "cuBLAS mm"}
    series = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        sel = sorted((r for r in rows if r["dtype"] == dtype), key=lambda r: int(r["shape"].split("x")[0]))
        sizes = [int(r["shape"].split("x")[0]) for r in sel]
        for key, name in names.items():
            series[f"{dtype} {name}"] = (sizes, [r.get(f"{key}_tflops") or float("nan") for r in sel])
    harness.plot(png_path, series, title=f"GEMM + bias + relu, {data['device']}", xlabel="M = N = K",
                 ylabel="TFLOP/s", logx=True)


def _rows(args) -> list[tuple[int, int, int, str, str, bool, bool, bool]]:
    """(M, N, K, act, dtype, forward, backward, sweep) of every row the arguments select."""
    rows = []
    only = set(args.only.split(",")) if args.only else None
    bwd = set() if args.bwd in ("all", "none") else set(args.bwd.split(","))
    if args.shapes in ("main", "all"):
        for dtype_name in args.dtypes.split(","):
            for M, N, K, act in MAIN_SHAPES:
                if dtype_name == "ieee" and M * N * K > 4096 ** 3:
                    continue  # the FMA path: two shapes say enough, at a fraction of the time
                shape = f"{M}x{N}x{K}"
                forward = only is None or shape in only
                backward = dtype_name != "tf32-trunc" and ((args.bwd == "all" and forward) or shape in bwd)
                if forward or backward:
                    rows.append((M, N, K, act, dtype_name, forward, backward, False))
    if args.shapes in ("mlp", "gpt"):
        for dtype_name in args.dtypes.split(","):
            for M, N, K, act in (MLP_SHAPES if args.shapes == "mlp" else GPT_SHAPES):
                if only is not None and f"{M}x{N}x{K}" not in only:
                    continue
                backward = args.bwd == "all"
                rows.append((M, N, K, act, dtype_name, True, backward, False))
    if args.shapes in ("sweep", "all"):
        for dtype_name in args.sweep_dtypes.split(","):
            for M, N, K, act in SWEEP_SHAPES:
                rows.append((M, N, K, act, dtype_name, True, False, True))
    return rows


def precompile(args) -> None:
    """Compile each TMA config of the selected rows in its own process (Triton's on-disk cache)."""
    configs = gemm_kernels.TMA_CONFIGS_16BIT + gemm_kernels.TMA_CONFIGS_FP32
    argv = [a for a in sys.argv[1:] if a not in ("--precompile", "--compile-only")]
    procs = [subprocess.Popen([sys.executable, sys.argv[0], *argv, "--pin-config", str(i)]) for i in range(len(configs))]
    failed = sum(p.wait() != 0 for p in procs)
    print(f"precompile: {len(configs)} configs compiled in parallel ({failed} processes failed)", flush=True)


def _run_pinned(args) -> None:
    """Child of ``precompile``: run each selected row once with TMA config ``--pin-config`` alone."""
    configs = gemm_kernels.TMA_CONFIGS_16BIT + gemm_kernels.TMA_CONFIGS_FP32
    cfg = configs[args.pin_config]
    gemm_kernels.gemm_tma_kernel.configs = [cfg]  # one config: the autotuner compiles it and times nothing
    for M, N, K, act, dtype_name, forward, backward, _ in _rows(args):
        if (DTYPES[dtype_name][0] != torch.float32) != (cfg in gemm_kernels.TMA_CONFIGS_16BIT):
            continue
        _, (x, w, b) = _inputs(M, N, K, dtype_name)
        try:
            call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act=act)
            if backward:
                _ge2_fwd_bwd(x, w, b, act)[0]()
        except triton.runtime.errors.OutOfResources:
            pass  # the autotuner will skip this config too
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("kernel", "end2end"), default="kernel")
    parser.add_argument("--shapes", choices=("main", "sweep", "all", "mlp", "gpt"), default="main")
    parser.add_argument("--extra-configs", action="store_true", help="also tune EXTRA_CONFIGS_16BIT (tuning_ms says)")
    parser.add_argument("--dtypes", default="bf16,fp16,tf32,ieee")
    parser.add_argument("--sweep-dtypes", default="bf16,tf32")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile column (slow to build)")
    parser.add_argument("--variants", action="store_true", help="add a column for the non-TMA kernel")
    parser.add_argument("--name", default=None, help="JSON name under bench/results/ (default gemm_<mode>)")
    parser.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="only plot a saved sweep")
    parser.add_argument("--only", default=None, help="shapes to run, e.g. 4096x4096x4096,512x784x1024")
    parser.add_argument("--bwd", default="all",
                        help="fwd+bwd rows: all (of the --only shapes), none, or a list of main shapes")
    parser.add_argument("--precompile", action="store_true", help="compile the TMA configs in parallel first")
    parser.add_argument("--compile-only", action="store_true", help="with --precompile: stop after compiling")
    parser.add_argument("--pin-config", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plot:
        return plot(*args.plot)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm: needs a CUDA GPU (timings under the interpreter mean nothing)")
    if args.extra_configs:  # before --pin-config's indexing: parent and children see the same list
        gemm_kernels.TMA_CONFIGS_16BIT.extend(EXTRA_CONFIGS_16BIT)
        gemm_kernels.gemm_tma_kernel.configs.extend(EXTRA_CONFIGS_16BIT)
    if args.pin_config is not None:
        return _run_pinned(args)
    if args.precompile:
        precompile(args)
        if args.compile_only:
            return

    # Kernel mode times CUDA-graph replays: the host's launch overhead (tens of microseconds per
    # op in Python, for ge2 and torch alike) would otherwise swamp the small shapes.
    bench = Bench(args.name or f"gemm_{args.mode}", cuda_graph=args.mode == "kernel")
    for M, N, K, act, dtype_name, forward, backward, sweep in _rows(args):
        bench_shape(bench, M, N, K, act, dtype_name, mode=args.mode, compile_=args.compile and not sweep,
                    backward=backward, variants=args.variants and not sweep, forward=forward)
    bench.report(shapes="M x N x K; x [M,K] @ W[N,K]^T + b[N]", mode=args.mode)


if __name__ == "__main__":
    main()
