"""``ge2 autotune``: tune kernels for given shapes (or for one training step of a model) and persist.

Each op has a recipe that builds inputs of a shape and dtype and returns the ge2 call and its
torch equivalent. Running the ge2 call with ``tuning.FORCE_RETUNE`` set benchmarks every config of
every kernel it launches and writes the winners to the tuning store; the report lists, per kernel
and shape, the best config, its time, the speed-up over the kernel's designated default config,
and the time of the whole op against torch.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

import torch

import ge2
from ge2 import backend, tuning

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
Recipe = Callable[[tuple[int, ...], torch.dtype, torch.device], tuple[Callable[[], Any], Callable[[], Any]]]


def _gemm(shape, dtype, dev):
    m, n, k = shape  # Y[M, N] = relu(X[M, K] @ W[N, K]^T + b): the Linear layout
    x, w, b = (torch.randn(s, device=dev, dtype=dtype) for s in ((m, k), (n, k), (n,)))
    return (lambda: backend.call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act="relu"),
            lambda: torch.relu(torch.addmm(b, x, w.t())))


def _softmax(shape, dtype, dev):
    x = torch.randn(shape, device=dev, dtype=dtype)
    return lambda: backend.call("softmax", x, dim=-1), lambda: torch.softmax(x, -1)


def _cross_entropy(shape, dtype, dev):
    n, c = shape
    logits = torch.randn(n, c, device=dev, dtype=dtype)
    target = torch.randint(0, c, (n,), device=dev)
    return (lambda: backend.call("cross_entropy", logits, target),
            lambda: torch.nn.functional.cross_entropy(logits, target))


def _sum(shape, dtype, dev):
    x = torch.randn(shape, device=dev, dtype=dtype)
    return lambda: backend.call("sum", x, dims=-1), lambda: x.sum(-1)


def _add(shape, dtype, dev):
    a, b = torch.randn(shape, device=dev, dtype=dtype), torch.randn(shape, device=dev, dtype=dtype)
    return lambda: backend.call("add", a, b), lambda: a + b


def _conv2d(shape, dtype, dev):
    n, c, h, k, r = shape  # the (N, C, H=W, K, R=S) of the conv bench; NCHW, "same" padding, bias + relu
    x, w, b = (torch.randn(s, device=dev, dtype=dtype) for s in ((n, c, h, h), (k, c, r, r), (k,)))
    out = lambda: backend.call("conv2d", x, w, b, padding=r // 2, act="relu")  # noqa: E731
    return out, lambda: torch.relu(torch.nn.functional.conv2d(x, w, b, padding=r // 2))


RECIPES: dict[str, tuple[int, Recipe]] = {  # op -> (dims a shape has, recipe)
    "gemm": (3, _gemm), "softmax": (2, _softmax), "cross_entropy": (2, _cross_entropy),
    "sum": (2, _sum), "add": (2, _add), "conv2d": (5, _conv2d),
}


def parse_shape(op: str, text: str) -> tuple[int, ...]:
    """"4096x4096x4096" -> (4096, 4096, 4096), checked against the op's number of dims."""
    dims, _ = RECIPES[op]
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != dims or min(shape) < 1:
        raise ValueError(f"autotune: --shapes for {op} are {dims} positive sizes like "
                         f"{'x'.join(['512'] * dims)}, got {text!r}")
    return shape


def _tuned_since(marks: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for tuner in tuning.ALL_TUNERS:
        for key in tuner.tuned_keys[marks.get(id(tuner), 0):]:
            best = tuner.cache[key]
            best_ms = tuner.configs_timings[best][0]
            default = tuner.configs_timings.get(tuner.default_config)
            cfg = tuning.config_to_dict(best)
            rows.append({
                "kernel": tuner.base_fn.__name__,
                "key": ",".join(str(v).replace("torch.", "") for v in key),
                "best": " ".join(f"{k}={v}" for k, v in cfg["kwargs"].items())
                        + f" w{cfg['num_warps']} s{cfg['num_stages']}",
                "ms": best_ms,
                "vs_default": (default[0] / best_ms) if default and best_ms else None,
            })
    return rows


def _marks() -> dict[int, int]:
    return {id(t): len(t.tuned_keys) for t in tuning.ALL_TUNERS}


def _time(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def tune_op(op: str, dtype: torch.dtype, shapes: list[tuple[int, ...]], progress: bool = True) -> list[dict]:
    """Tune ``op`` at each shape; returns one report row per (kernel, tuned key)."""
    if progress:
        from tqdm import tqdm

        shapes = tqdm(shapes, desc=f"autotune {op}")
    rows = []
    for shape in shapes:
        ge2_fn, torch_fn = RECIPES[op][1](shape, dtype, ge2.device())
        marks = _marks()
        ge2_fn()
        torch.cuda.synchronize()
        op_ms, torch_ms = _time(ge2_fn), _time(torch_fn)
        for row in _tuned_since(marks) or [{"kernel": "-", "key": "-", "best": "(no autotuned kernel)", "ms": None,
                                            "vs_default": None}]:
            rows.append({"op": op, "shape": "x".join(map(str, shape)), **row, "op_ms": op_ms,
                         "torch_ms": torch_ms, "vs_torch": torch_ms / op_ms})
    return rows


def tune_model(model_name: str, batch_size: int, progress: bool = True) -> list[dict]:
    """Tune every kernel that one training step of a ``ge2 train`` model launches."""
    from ge2 import nn, train

    model = train.build_model(model_name).to(ge2.device())
    opt = train.build_optimizer("adamw", model.parameters(), 1e-3)
    x = ge2.randn(batch_size, 64)
    y = ge2.from_torch(torch.randint(0, 10, (batch_size,), device=ge2.device()))
    marks = _marks()
    loss = nn.CrossEntropyLoss()(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return [{"op": f"{model_name} step", "shape": f"batch {batch_size}", **r, "op_ms": None, "torch_ms": None,
             "vs_torch": None} for r in _tuned_since(marks)]


def print_table(rows: list[dict]) -> None:
    def fmt(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "-"

    print(f"{'op':16} {'shape':16} {'kernel':22} {'tuned key':28} {'best config':44} {'ms':>8} {'x default':>9} "
          f"{'op ms':>8} {'torch ms':>8} {'x torch':>7}")
    for r in rows:
        print(f"{r['op']:16} {r['shape']:16} {r['kernel'][:22]:22} {r['key'][:28]:28} {r['best'][:44]:44} "
              f"{fmt(r['ms'], '8.4f')} "
              f"{fmt(r['vs_default'], '9.2f')} {fmt(r['op_ms'], '8.4f')} {fmt(r['torch_ms'], '8.4f')} "
              f"{fmt(r['vs_torch'], '7.2f')}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", choices=sorted(RECIPES), help="the op to tune (with --dtype and --shapes)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--shapes", nargs="+", default=[],
                   help="sizes joined by x: MxNxK for gemm, MxN for softmax/cross_entropy/sum/add, NxCxHxKxR for conv2d")
    p.add_argument("--from-model", choices=("mlp", "cnn"), help="tune what one training step of this model runs")
    p.add_argument("--batch-size", type=int, default=64, help="batch size of the --from-model step")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def run(args: argparse.Namespace) -> list[dict]:
    """Entry point of ``ge2 autotune``."""
    if ge2.is_interpreter() or not torch.cuda.is_available():
        raise SystemExit("ge2 autotune: tuning needs a CUDA GPU (under the Triton interpreter one designated "
                         "config runs and nothing is persisted)")
    if not args.op and not args.from_model:
        raise SystemExit("ge2 autotune: give --op with --shapes, or --from-model")
    tuning.FORCE_RETUNE = True
    try:
        rows = []
        if args.op:
            if not args.shapes:
                raise SystemExit(f"ge2 autotune: --op {args.op} needs --shapes")
            shapes = [parse_shape(args.op, s) for s in args.shapes]
            rows += tune_op(args.op, DTYPES[args.dtype], shapes, args.progress)
        if args.from_model:
            rows += tune_model(args.from_model, args.batch_size, args.progress)
    finally:
        tuning.FORCE_RETUNE = False
    print_table(rows)
    print(f"tuned configs written to {tuning.store().path}")
    return rows
