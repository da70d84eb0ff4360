"""conv2d and pooling: ge2 vs torch/cuDNN in one process (issue 5).

    PYTHONPATH=. python3 bench/bench_conv.py            # on a GPU; writes bench/results/conv.json
    PYTHONPATH=. python3 bench/bench_conv.py --smoke    # tiny shapes, each function called once (CPU too)
    PYTHONPATH=. python3 bench/bench_conv.py --precompile 3/8   # compile (no timing) the 4th of 8 shards

* Timings are CUDA-graph replays (kernel time; ge2's eager host path is issue 7's subject);
  ``--eager`` times eager launches instead.
* ``--precompile i/n`` compiles every autotune candidate of shard i of the cases into Triton's
  cache without launching anything: n such processes in parallel, then one timing process, turn a
  sequential compile of ~150 kernel variants into a parallel one (the GPU machine has 16 cores).

* conv2d forward and forward+backward (dX, dW) at the issue's (N, C, H, K, r) shapes, NCHW and NHWC,
  fp32 and bf16, TFLOP/s (2*N*K*P*Q*C/groups*R*S a pass; fwd+bwd counts 3 passes) and the ratio
  torch_ms / ge2_ms (> 1: ge2 faster). ``torch.backends.cudnn.benchmark = True``.
  fp32 rows are "tf32" (torch's default for cuDNN convs, ``cudnn.allow_tf32 = True``, vs
  ``ge2.set_matmul_precision("tf32")``); ``--ieee`` adds exact-fp32 rows for both.
  ``--precisions -,tf32,tf32x3`` picks the rows ("-" = bf16): "tf32x3" (ge2's fp32 default,
  fp32-accurate) and "ieee" are timed against cuDNN fp32 without tf32.
* ``--shapes 3 --no-pool --name conv_1x1`` times the 1x1 shape alone into bench/results/conv_1x1.json.
* pooling: max_pool2d 3x3/2 (ResNet stem), avg_pool2d 2x2 and the global adaptive_avg_pool2d,
  forward and backward, GB/s of the bytes each must move at least (read x once, write y once).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as TF

import ge2
from ge2.backend import call

PREDICTION_1X1 = ("1x1 (N64 C128 H28 K128) through the GEMM kernels: 1.64 GFLOP a pass, x + y = 25.7 MB bf16 / "
                  "51 MB fp32, i.e. memory-bound (8.6 / 17 us at 3 TB/s vs 2.5 us of bf16 tensor-core time): "
                  "bf16 NHWC fwd ~10 us (0.75x cuDNN's 7.3), NCHW (batched GEMM, no TMA) ~12 us (0.8x of 9.3); "
                  "tf32 NHWC ~20 us (1.1x of 23), NCHW (MN-major X tiles) ~25 us (1.0x); fwd+bwd ~1.0x "
                  "bf16 and 1.1-1.3x tf32; tf32x3 vs cuDNN fp32 >= 1x")
PREDICTION = ("stride-1 3x3 (one group, >= 16 channels) as TMA GEMMs (conv_framed); NCHW over a framed copy "
              "of x (the transpose cuDNN's NCHW kernels make too): >= 1x cuDNN. Channels-last x read in place "
              "through 4-D descriptors, tiles of several images that fit the image (8x8 of 56^2: no dropped "
              "columns; 256-pixel tiles read W half as often) run by persistent programs that hide the 9-step "
              "loop's fill and drain (scratch: 40 / 79 us bf16 / tf32 at 64x64x56^2 against cuDNN's 45 / 87): "
              "NHWC fwd ~1.1x at 56^2, ~1x at 14^2 (bf16; tf32 ~0.93x); bf16 fwd+bwd >= 0.75x once dX and "
              "(64-channel) dW read gZ "
              "and x in place too; tf32 fwd+bwd: dW over planar frames of gZ and x (x by pointer loads: one frame, "
              "one launch; scratch: frames + dW 252 us vs 400 at 64x64x56^2, 149 vs 188 at 64x256x14^2) "
              "~0.65-0.75x NHWC, ~1x NCHW; "
              "128x3x32^2 (flat reduction) >= 1x; depthwise (direct, each input row tile loaded once per "
              "column shift for all the rows / taps that read it; scratch: bf16 NHWC fwd 24 us vs cuDNN 28, "
              "dW 32 vs 54) ~1.2x fwd and ~1.25x fwd+bwd bf16 NHWC, ~1.0x fp32 NHWC, >= 2.5x NCHW; "
              "pooling near torch's bandwidth")

# (N, C, H, K, r, groups, stride): the shapes, and one strided ResNet downsampling layer.
CONV_SHAPES = [
    (64, 64, 56, 64, 3, 1, 1),
    (64, 256, 14, 256, 3, 1, 1),
    (128, 3, 32, 64, 3, 1, 1),
    (64, 128, 28, 128, 1, 1, 1),
    (64, 256, 28, 256, 3, 256, 1),
]
STRIDED_SHAPES = [(64, 64, 56, 128, 3, 1, 2)]  # --all: a ResNet downsampling layer (dX by masked taps)
SMOKE_SHAPES = [(2, 4, 6, 5, 3, 1, 1), (2, 4, 6, 4, 3, 4, 1), (1, 3, 7, 4, 1, 1, 2), (2, 5, 6, 3, 1, 1, 1)]


class Smoke:
    """Stands in for bench.harness.Bench: calls every function once, times nothing."""

    def add(self, labels, *, flops=None, **fns):
        for fn in fns.values():
            if fn is not None:
                fn()
        print("ok", labels, flush=True)
        return {}

    def report(self, **extra):
        print("smoke run: every case executed once")


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t.contiguous()


def conv_cases(bench, shapes, device, precisions=("-", "tf32"), bias: bool = False) -> None:
    for N, C, H, K, r, groups, stride in shapes:
        pad = r // 2
        P = (H + 2 * pad - r) // stride + 1
        flops = 2 * N * K * P * P * (C // groups) * r * r
        for dtype, precision in ((torch.bfloat16 if p == "-" else torch.float32, p) for p in precisions):
            ge2.set_matmul_precision("ieee" if precision == "-" else precision)
            torch.backends.cudnn.allow_tf32 = precision == "tf32"  # tf32x3 and ieee: vs cuDNN's fp32
            for layout in ("nchw", "nhwc"):
                x = _layout(torch.randn(N, C, H, H, device=device, dtype=dtype), layout)
                w = _layout(torch.randn(K, C // groups, r, r, device=device, dtype=dtype), layout)
                gy = _layout(torch.randn(N, K, P, P, device=device, dtype=dtype), layout)
                b = torch.randn(K, device=device, dtype=dtype) if bias else None
                geo = dict(stride=stride, padding=pad, groups=groups)
                labels = {"case": "conv2d" + (" +bias" if bias else ""),
                          "shape": f"N{N} C{C} H{H} K{K} r{r} g{groups} s{stride}",
                          "dtype": str(dtype).replace("torch.", ""), "precision": precision, "layout": layout}
                bench.add({**labels, "pass": "fwd"}, flops=flops,
                          ge2=lambda: call("conv2d", x, w, b, **geo),
                          torch=lambda: TF.conv2d(x, w, b, stride, pad, 1, groups))
                xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
                bt = b.clone().requires_grad_() if bias else None
                bench.add({**labels, "pass": "fwd+bwd"}, flops=3 * flops,
                          ge2=lambda: (call("conv2d", x, w, b, **geo),
                                       call("conv2d_backward", gy, x, w, has_bias=bias, **geo)),
                          torch=lambda: torch.autograd.grad(TF.conv2d(xt, wt, bt, stride, pad, 1, groups),
                                                            (xt, wt, bt) if bias else (xt, wt), gy))
    ge2.set_matmul_precision("ieee")
    torch.backends.cudnn.allow_tf32 = True


def _gbps(row, nbytes: int) -> None:
    for key in ("ge2", "torch"):
        if row.get(f"{key}_ms"):
            row[f"{key}_GBps"] = nbytes / row[f"{key}_ms"] / 1e6


def pool_cases(bench, small: bool, device) -> None:
    cases = [("max_pool2d 3x3/2", (2, 3, 9, 9) if small else (64, 64, 112, 112)),
             ("avg_pool2d 2x2", (2, 3, 8, 8) if small else (64, 256, 56, 56)),
             ("adaptive_avg_pool2d 1x1", (2, 3, 5, 5) if small else (64, 2048, 7, 7))]
    for dtype in (torch.float32, torch.bfloat16):
        for layout in ("nchw", "nhwc"):
            for name, shape in cases:
                # Drawn on the CPU: a CUDA-graph capture of a ge2 call that fell back to eager
                # timing left torch's CUDA generator unusable ("offset increment outside graph capture").
                x = _layout(torch.randn(shape, dtype=dtype).to(device), layout)
                if name.startswith("max"):
                    fwd_g = lambda: call("max_pool2d", x, kernel_size=3, stride=2, padding=1)
                    fwd_t = lambda: TF.max_pool2d(x, 3, 2, 1, return_indices=True)
                    y, idx = fwd_g()
                    bwd_g = lambda: call("max_pool2d_backward", y, idx, input_size=tuple(x.shape), kernel_size=3,
                                         stride=2, padding=1, channels_last=layout == "nhwc")
                    torch_fn = lambda t: TF.max_pool2d(t, 3, 2, 1)
                elif name.startswith("avg"):
                    fwd_g = lambda: call("avg_pool2d", x, kernel_size=2)
                    fwd_t = lambda: TF.avg_pool2d(x, 2)
                    y = fwd_g()
                    bwd_g = lambda: call("avg_pool2d_backward", y, input_size=tuple(x.shape), kernel_size=2,
                                         channels_last=layout == "nhwc")
                    torch_fn = lambda t: TF.avg_pool2d(t, 2)
                else:
                    fwd_g = lambda: call("adaptive_avg_pool2d", x, output_size=1)
                    fwd_t = lambda: TF.adaptive_avg_pool2d(x, 1)
                    y = fwd_g()
                    bwd_g = lambda: call("adaptive_avg_pool2d_backward", y, input_size=tuple(x.shape),
                                         channels_last=layout == "nhwc")
                    torch_fn = lambda t: TF.adaptive_avg_pool2d(t, 1)
                nbytes = (x.numel() + y.numel()) * x.element_size()
                labels = {"case": name, "shape": "x".join(map(str, shape)), "dtype": str(dtype).replace("torch.", ""),
                          "layout": layout}
                _gbps(bench.add({**labels, "pass": "fwd"}, ge2=fwd_g, torch=fwd_t), nbytes)
                xt = x.clone().requires_grad_()
                yt = torch_fn(xt)
                gy = torch.randn(yt.shape, dtype=yt.dtype).to(device)
                _gbps(bench.add({**labels, "pass": "bwd"}, ge2=bwd_g,
                                torch=lambda: torch.autograd.grad(yt, (xt,), gy, retain_graph=True)), nbytes)


class Precompile(Smoke):
    """Calls ge2's functions of every i-th of n cases once with kernel launches replaced by
    compilation of each autotune candidate (``JITFunction.run(warmup=True)``); times nothing."""

    def __init__(self, shard: str):
        import triton
        from triton.runtime.jit import JITFunction

        from ge2.tuning import PersistentAutotuner

        self.i, self.n = (int(v) for v in shard.split("/"))
        self.count = 0
        self.compiled = 0
        run = JITFunction.run
        outer = self

        def jit_run(fn, *args, grid, warmup, **kwargs):
            return run(fn, *args, grid=grid, warmup=True, **kwargs)

        def tuner_run(tuner, *args, **kwargs):
            kwargs.pop("grid", None)
            kwargs.pop("warmup", None)
            tuner.nargs = dict(zip(tuner.arg_names, args))
            for cfg in tuner.prune_configs(kwargs):
                if cfg.pre_hook is not None:  # e.g. the GEMM's TMA block shapes: part of the compiled signature
                    cfg.pre_hook({**tuner.nargs, **kwargs, **cfg.all_kwargs()})
                # tuner.fn.run: a @triton.heuristics layer (the GEMM's EVEN_K) fills its values first
                tuner.fn.run(*args, grid=(1,), warmup=True, **kwargs, **cfg.all_kwargs())
                outer.compiled += 1
            tuner.nargs = None

        JITFunction.run = jit_run
        PersistentAutotuner.run = tuner_run
        triton.Config  # noqa: B018 (triton imported for its side effects above)

    def add(self, labels, *, flops=None, **fns):
        self.count += 1
        if (self.count - 1) % self.n == self.i and fns.get("ge2") is not None:
            fns["ge2"]()
        return {}

    def report(self, **extra):
        print(f"precompile shard {self.i}/{self.n}: {self.compiled} kernel variants", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, each function once, no timing")
    parser.add_argument("--precompile", metavar="I/N", help="compile shard I of N of the cases, time nothing")
    parser.add_argument("--eager", action="store_true", help="time eager launches instead of CUDA-graph replays")
    parser.add_argument("--ieee", action="store_true", help="add exact-fp32 rows")
    parser.add_argument("--all", action="store_true", help="add the strided (downsampling) shape")
    parser.add_argument("--no-pool", action="store_true", help="conv rows only")
    parser.add_argument("--bias", action="store_true", help="convs with a bias (and its gradient)")
    parser.add_argument("--shapes", help="comma-separated indices into CONV_SHAPES (default: all)")
    parser.add_argument("--precisions", help="comma-separated row kinds: - (bf16), tf32, tf32x3, ieee "
                        "(default: -,tf32, plus ieee with --ieee)")
    parser.add_argument("--name", default="conv", help="results file bench/results/NAME.json (default conv)")
    args = parser.parse_args()
    device = ge2.device()
    torch.backends.cudnn.benchmark = True
    if args.smoke:
        bench = Smoke()
    elif args.precompile:
        bench = Precompile(args.precompile)
    else:
        from bench.harness import Bench

        bench = Bench(args.name, cuda_graph=not args.eager, rep_ms=50)
    prediction = PREDICTION_1X1 if args.shapes == "3" else PREDICTION
    print("prediction:", prediction)
    shapes = SMOKE_SHAPES if args.smoke else CONV_SHAPES + (STRIDED_SHAPES if args.all else [])
    if args.shapes is not None:
        shapes = [shapes[int(i)] for i in args.shapes.split(",") if i]
    precisions = ("-", "tf32", "ieee") if args.ieee else ("-", "tf32")
    if args.precisions:
        precisions = tuple(args.precisions.split(","))
        unknown = set(precisions) - {"-", "tf32", "tf32x3", "ieee"}
        if unknown:
            parser.error(f"--precisions: unknown {sorted(unknown)}; choose from -, tf32, tf32x3, ieee")
    conv_cases(bench, shapes, device, precisions, bias=args.bias)
    if not args.no_pool:
        pool_cases(bench, args.smoke, device)
    bench.report(prediction=prediction)


if __name__ == "__main__":
    main()
