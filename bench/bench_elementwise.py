"""Elementwise and reduction kernels: achieved memory bandwidth of ge2 vs torch (GB/s).

Every case is memory-bound, so the figure of merit is bytes moved (each input read once, each
output written once) over the median time; ratio_torch = torch time / ge2 time (> 1: ge2 faster).
Rows: add (same shape), add of a broadcast row [N], exp, sum over the last dim, sum over dim 0 and
sum of everything (the split-into-partials path), at 4096x4096 and 8192x8192 (and 64x64, where
only launch cost shows), fp32 and bf16. A
device-to-device copy of the same tensor is timed as the bandwidth ceiling. Inputs rotate among
three buffers so that the 4096x4096 cases (32-64 MiB, near the 50 MiB L2) are not served from cache.

Two modes per case: "eager" calls the op from Python each time (what a user's eager loop pays,
Python dispatch included: ge2's launch path is ~10x torch's), "graph" replays a CUDA graph of the
call (kernel time alone, the way a captured training step runs).

    PYTHONPATH=. python3 bench/bench_elementwise.py     ->  bench/results/elementwise.json
"""
from __future__ import annotations

import itertools

import torch

import ge2  # noqa: F401  (decides the device before triton is imported)
from bench.harness import Bench
from ge2.backend import call

# 64x64 measures launch cost (eager) against kernel time (graph); the others measure bandwidth.
SHAPES = [(64, 64), (4096, 4096), (8192, 8192)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rotating(fn, inputs):
    """fn applied to the next of several input sets on each call."""
    sets = itertools.cycle(inputs)
    return lambda: fn(*next(sets))


def graphed(fn, inputs):
    """Replays of one CUDA graph of fn per input set, rotating: kernel time without Python."""
    graphs = []
    try:
        for args in inputs:
            fn(*args)  # compiled and tuned before capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(*args)
            graphs.append((g,))
    except Exception as e:  # recorded as a missing timing, not fatal
        print(f"capture failed: {type(e).__name__}: {e}")
        return None
    return rotating(lambda g: g.replay(), graphs)


def main() -> None:
    bench = Bench("elementwise")
    ceilings = {}
    for (M, N), (dname, dtype) in itertools.product(SHAPES, DTYPES.items()):
        size = dtype.itemsize
        xs = [torch.randn(M, N, device="cuda", dtype=dtype) for _ in range(3)]
        ys = [torch.randn(M, N, device="cuda", dtype=dtype) for _ in range(3)]
        rows = [torch.randn(N, device="cuda", dtype=dtype) for _ in range(3)]
        cases = [  # name, ge2, torch, bytes moved
            ("add", lambda x, y, r: call("add", x, y), lambda x, y, r: x + y, 3 * M * N * size),
            ("add_row", lambda x, y, r: call("add", x, r), lambda x, y, r: x + r, (2 * M * N + N) * size),
            ("exp", lambda x, y, r: call("exp", x), lambda x, y, r: torch.exp(x), 2 * M * N * size),
            ("sum_last", lambda x, y, r: call("sum", x, dims=1), lambda x, y, r: x.sum(1), (M * N + M) * size),
            ("sum_dim0", lambda x, y, r: call("sum", x, dims=0), lambda x, y, r: x.sum(0), (M * N + N) * size),
            ("sum_all", lambda x, y, r: call("sum", x), lambda x, y, r: x.sum(), M * N * size),
        ]
        inputs = list(zip(xs, ys, rows))
        copy_ms = bench.add({"op": "copy (ceiling)", "shape": f"{M}x{N}", "dtype": dname, "mode": "eager"},
                            ge2=None, torch=rotating(lambda x, y, r: x.clone(), inputs))["torch_ms"]
        ceilings[f"{M}x{N} {dname}"] = 2 * M * N * size / copy_ms / 1e6
        for name, ge2_fn, torch_fn, nbytes in cases:
            out, ref = ge2_fn(*inputs[0]), torch_fn(*inputs[0])  # also tunes ge2 before timing
            err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
            for mode in ("eager", "graph"):
                timed = rotating if mode == "eager" else graphed
                row = bench.add({"op": name, "shape": f"{M}x{N}", "dtype": dname, "mode": mode},
                                ge2=timed(ge2_fn, inputs), torch=timed(torch_fn, inputs))
                for key in ("ge2", "torch"):
                    row[f"{key}_GBps"] = nbytes / row[f"{key}_ms"] / 1e6 if row[f"{key}_ms"] else None
                row["copy_GBps"] = ceilings[f"{M}x{N} {dname}"]
                row["rel_diff_vs_torch"] = err
        del xs, ys, rows, inputs
        torch.cuda.empty_cache()
    bench.report(copy_GBps=ceilings)


if __name__ == "__main__":
    main()
