"""Tensor ops of issue 25 (indexing, gather/scatter, scans, sort/topk, pad, resample): GB/s vs torch.

Every row is memory-bound, so the figure of merit is bytes moved (each input read once, each
output written once, index tensors included) over the median time of CUDA-graph replays
(``Bench(cuda_graph=True)``: kernel time, as a captured step sees it; a call that cannot be
captured, e.g. one with a host sync, is timed eagerly and says so in ``*_error``). ``ratio_torch``
= torch time / ge2 time (> 1: ge2 faster); ``copy_GBps`` is a device-to-device copy of 256 MiB,
the bandwidth ceiling (target: >= 80% of it on the memory-bound rows, >= 1.0x torch on each).

Adding rows: append a ``Row(op, shape, dtype, build)`` to ``ROWS`` where ``build(device, smoke)``
returns ``(ge2_fn, torch_fn, nbytes)``; ``smoke`` asks for tiny sizes (CPU, interpreter).

    PYTHONPATH=. python3 bench/bench_tensor_ops.py            ->  bench/results/tensor_ops.json
    PYTHONPATH=. python3 bench/bench_tensor_ops.py --only gather
    PYTHONPATH=. python3 bench/bench_tensor_ops.py --only sort,topk   (rows matching any part)
    PYTHONPATH=. python3 bench/bench_tensor_ops.py --only sort --name tensor_ops_sort   (-> its own file)
    python bench/bench_tensor_ops.py --smoke                  (CPU: each row once, checked, not timed)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/bench_tensor_ops.py` works too

import torch  # noqa: E402

import ge2  # noqa: E402,F401  (decides the device before triton is imported)
from bench.harness import Bench  # noqa: E402

Fns = tuple[Callable[[], Any], Callable[[], Any], int]


@dataclass
class Row:
    op: str
    shape: str
    dtype: torch.dtype
    build: Callable[[torch.device, bool], Fns]


def _size(smoke: bool, full: int, tiny: int) -> int:
    return tiny if smoke else full


def _rand(*shape: int, dtype=torch.float32, device=None) -> torch.Tensor:
    return torch.randn(shape, device=device).to(dtype)


# ---------------------------------------------------------------------------------------------
# indexing and gather/scatter rows (helper C)
# ---------------------------------------------------------------------------------------------
def _gather_embedding(dtype):
    """gather of whole rows along dim 0 (index [N, D] = ids expanded): an embedding lookup."""
    def build(device, smoke) -> Fns:
        V, N, D = _size(smoke, 32768, 50), _size(smoke, 16384, 7), _size(smoke, 1024, 12)
        x = _rand(V, D, dtype=dtype, device=device)
        ids = torch.randint(0, V, (N, 1), device=device).expand(N, D)
        gx, gi = ge2.from_torch(x), ge2.from_torch(ids)
        return (lambda: ge2.gather(gx, 0, gi), lambda: torch.gather(x, 0, ids),
                2 * N * D * x.element_size() + N * 8)
    return build


def _gather_random(dtype):
    """gather along the last dim with random positions: every element its own index."""
    def build(device, smoke) -> Fns:
        M, N = _size(smoke, 4096, 5), _size(smoke, 8192, 33)
        x = _rand(M, N, dtype=dtype, device=device)
        idx = torch.randint(0, N, (M, N), device=device)
        gx, gi = ge2.from_torch(x), ge2.from_torch(idx)
        return (lambda: ge2.gather(gx, 1, gi), lambda: torch.gather(x, 1, idx),
                M * N * (2 * x.element_size() + 8))
    return build


def _scatter_add_embedding(dtype):
    """scatter_add of rows into a table (an embedding's backward): duplicates accumulate."""
    def build(device, smoke) -> Fns:
        V, N, D = _size(smoke, 32768, 50), _size(smoke, 16384, 7), _size(smoke, 1024, 12)
        base = torch.zeros(V, D, device=device, dtype=dtype)
        src = _rand(N, D, dtype=dtype, device=device)
        ids = torch.randint(0, V, (N, 1), device=device).expand(N, D)
        gb, gs, gi = ge2.from_torch(base), ge2.from_torch(src), ge2.from_torch(ids)
        return (lambda: ge2.scatter_add(gb, 0, gi, gs), lambda: torch.scatter_add(base, 0, ids, src),
                2 * V * D * base.element_size() + N * D * src.element_size() + N * 8)
    return build


def _scatter_add_random(dtype):
    """scatter_add along the last dim with random positions (many collisions per row)."""
    def build(device, smoke) -> Fns:
        M, N = _size(smoke, 4096, 5), _size(smoke, 8192, 33)
        base = torch.zeros(M, N, device=device, dtype=dtype)
        src = _rand(M, N, dtype=dtype, device=device)
        idx = torch.randint(0, N, (M, N), device=device)
        gb, gs, gi = ge2.from_torch(base), ge2.from_torch(src), ge2.from_torch(idx)
        return (lambda: ge2.scatter_add(gb, 1, gi, gs), lambda: torch.scatter_add(base, 1, idx, src),
                M * N * (3 * base.element_size() + 8))
    return build


def _index_select(dtype):
    def build(device, smoke) -> Fns:
        V, N, D = _size(smoke, 32768, 50), _size(smoke, 16384, 7), _size(smoke, 1024, 12)
        x = _rand(V, D, dtype=dtype, device=device)
        ids = torch.randint(0, V, (N,), device=device)
        gx, gi = ge2.from_torch(x), ge2.from_torch(ids)
        return (lambda: ge2.index_select(gx, 0, gi), lambda: torch.index_select(x, 0, ids),
                2 * N * D * x.element_size() + N * 8)
    return build


def _adv_read(dtype):
    """x[:, idx]: an index tensor in the middle dim, slices around it."""
    def build(device, smoke) -> Fns:
        B, V, D, N = _size(smoke, 16, 3), _size(smoke, 8192, 40), _size(smoke, 256, 9), _size(smoke, 4096, 6)
        x = _rand(B, V, D, dtype=dtype, device=device)
        idx = torch.randint(-V, V, (N,), device=device)
        gx, gi = ge2.from_torch(x), ge2.from_torch(idx)
        return (lambda: gx[:, gi], lambda: x[:, idx], 2 * B * N * D * x.element_size() + N * 8)
    return build


def _adv_write(dtype):
    """x[idx] = v (no grad): whole rows written in place (distinct rows, so the result is defined)."""
    def build(device, smoke) -> Fns:
        V, N, D = _size(smoke, 32768, 50), _size(smoke, 16384, 7), _size(smoke, 1024, 12)
        x = _rand(V, D, dtype=dtype, device=device)
        v = _rand(N, D, dtype=dtype, device=device)
        idx = torch.randperm(V, device=device)[:N]
        gx, gv, gi = ge2.from_torch(x.clone()), ge2.from_torch(v), ge2.from_torch(idx)

        def ge2_write():
            gx[gi] = gv

        def torch_write():
            x[idx] = v

        return ge2_write, torch_write, 2 * N * D * x.element_size() + N * 8
    return build


# ---------------------------------------------------------------------------------------------
# scan and sort rows (helper B)
# ---------------------------------------------------------------------------------------------
def _cumsum(rows: int, n: int):
    """cumsum along rows of n (few long rows take the segmented three-pass scan)."""
    def build(device, smoke) -> Fns:
        M, N = _size(smoke, rows, 3), _size(smoke, n, 37)
        x = _rand(M, N, device=device)
        gx = ge2.from_torch(x)
        return lambda: ge2.cumsum(gx, 1), lambda: torch.cumsum(x, 1), 2 * M * N * x.element_size()
    return build


def _sort(rows: int, n: int):
    """sort along rows of n: values and int64 indices written."""
    def build(device, smoke) -> Fns:
        M, N = _size(smoke, rows, 3), _size(smoke, n, 37)
        x = _rand(M, N, device=device)
        gx = ge2.from_torch(x)
        return (lambda: ge2.sort(gx, -1).values, lambda: torch.sort(x, -1).values,
                M * N * (2 * x.element_size() + 8))
    return build


def _topk(rows: int, n: int, k: int):
    """topk(k) along rows of n: the row read, k values and int64 indices written."""
    def build(device, smoke) -> Fns:
        M, N, K = _size(smoke, rows, 3), _size(smoke, n, 37), _size(smoke, k, min(k, 5))
        x = _rand(M, N, device=device)
        gx = ge2.from_torch(x)
        return (lambda: ge2.topk(gx, K).values, lambda: torch.topk(x, K).values,
                M * N * x.element_size() + M * K * (x.element_size() + 8))
    return build


# ---------------------------------------------------------------------------------------------
# pad and resample rows (helper D)
# ---------------------------------------------------------------------------------------------
def _pad_reflect(dtype):
    """F.pad(x, (1, 1, 1, 1), "reflect") of 64x64x56x56 images (a U-Net's border)."""
    def build(device, smoke) -> Fns:
        N, C, H = _size(smoke, 64, 2), _size(smoke, 64, 3), _size(smoke, 56, 5)
        x = _rand(N, C, H, H, dtype=dtype, device=device)
        gx = ge2.from_torch(x)
        pads = (1, 1, 1, 1)
        return (lambda: ge2.nn.functional.pad(gx, pads, "reflect"),
                lambda: torch.nn.functional.pad(x, pads, mode="reflect"),
                N * C * (H * H + (H + 2) ** 2) * x.element_size())
    return build


def _upsample_bilinear(dtype):
    """F.interpolate(x, scale_factor=2, mode="bilinear") of 64x64x56x56 images -> 112x112."""
    def build(device, smoke) -> Fns:
        N, C, H = _size(smoke, 64, 2), _size(smoke, 64, 3), _size(smoke, 56, 5)
        x = _rand(N, C, H, H, dtype=dtype, device=device)
        gx = ge2.from_torch(x)
        return (lambda: ge2.nn.functional.interpolate(gx, scale_factor=2, mode="bilinear"),
                lambda: torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear"),
                N * C * (H * H + 4 * H * H) * x.element_size())
    return build


ROWS: list[Row] = [
    Row("gather (embedding-like)", "32768x1024 <- 16384 rows", torch.float32, _gather_embedding(torch.float32)),
    Row("gather (embedding-like)", "32768x1024 <- 16384 rows", torch.bfloat16, _gather_embedding(torch.bfloat16)),
    Row("gather (random)", "4096x8192 dim 1", torch.float32, _gather_random(torch.float32)),
    Row("scatter_add (embedding-like)", "16384 rows -> 32768x1024", torch.float32,
        _scatter_add_embedding(torch.float32)),
    Row("scatter_add (random)", "4096x8192 dim 1", torch.float32, _scatter_add_random(torch.float32)),
    Row("index_select", "32768x1024 <- 16384", torch.float32, _index_select(torch.float32)),
    Row("index_select", "32768x1024 <- 16384", torch.bfloat16, _index_select(torch.bfloat16)),
    Row("adv-index read x[:, idx]", "16x8192x256 <- 4096", torch.float32, _adv_read(torch.float32)),
    Row("adv-index write x[idx] = v", "32768x1024 <- 16384", torch.float32, _adv_write(torch.float32)),
    Row("cumsum", "4096 rows of 8192", torch.float32, _cumsum(4096, 8192)),
    Row("cumsum", "8 rows of 1M", torch.float32, _cumsum(8, 1 << 20)),
    Row("sort", "256 rows of 32k", torch.float32, _sort(256, 32768)),
    Row("sort", "64 rows of 128k", torch.float32, _sort(64, 131072)),
    *[Row(f"topk k={k}", f"{m} rows of {n // 1024}k", torch.float32, _topk(m, n, k))
      for m, n in ((256, 32768), (64, 131072)) for k in (1, 50, 1024)],
    Row("pad (reflect)", "64x64x56x56 +1 each side", torch.float32, _pad_reflect(torch.float32)),
    Row("pad (reflect)", "64x64x56x56 +1 each side", torch.bfloat16, _pad_reflect(torch.bfloat16)),
    Row("upsample bilinear x2", "64x64x56x56 -> 112x112", torch.float32, _upsample_bilinear(torch.float32)),
    Row("upsample bilinear x2", "64x64x56x56 -> 112x112", torch.bfloat16, _upsample_bilinear(torch.bfloat16)),
]


def _smoke(rows: list[Row]) -> None:
    """Each row once on the CPU (interpreter): the ge2 result must equal torch's where both return one."""
    device = ge2.device()
    for row in rows:
        g, t, nbytes = row.build(device, True)
        out, ref = g(), t()
        if out is not None and ref is not None:
            out_t = out.data if isinstance(out, ge2.Tensor) else out
            ok = torch.allclose(out_t.double(), ref.double(), rtol=1e-2, atol=1e-2)
            if not ok:
                raise AssertionError(f"{row.op} {row.shape}: ge2 differs from torch")
        print(f"smoke ok: {row.op} [{row.shape}] {str(row.dtype).replace('torch.', '')} ({nbytes} bytes)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, each row run once and checked")
    ap.add_argument("--only", default=None, help="run only rows whose op contains this text (comma-separated: any)")
    ap.add_argument("--name", default="tensor_ops", help="results file: bench/results/<name>.json")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if args.only is None or any(part in r.op for part in args.only.split(","))]
    if args.smoke or not torch.cuda.is_available():
        _smoke(rows)
        return
    device = torch.device("cuda")
    bench = Bench(args.name, cuda_graph=True)
    ceiling = torch.empty(64 * 2 ** 20, device=device)
    copy_ms = bench.add({"op": "copy (ceiling)", "shape": "256 MiB", "dtype": "float32"},
                        ge2=None, torch=ceiling.clone)["torch_ms"]
    copy_gbps = 2 * ceiling.numel() * 4 / copy_ms / 1e6
    ceiling = None
    with ge2.no_grad():
        for row in rows:
            g, t, nbytes = row.build(device, False)
            try:
                g(), t()  # compile and tune before timing
            except Exception as e:  # a row that fails is recorded and the run goes on
                bench.rows.append({"op": row.op, "shape": row.shape, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"op={row.op} shape={row.shape} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            result = bench.add({"op": row.op, "shape": row.shape, "dtype": str(row.dtype).replace("torch.", "")},
                               ge2=g, torch=t)
            for key in ("ge2", "torch"):
                ms = result.get(f"{key}_ms")
                result[f"{key}_GBps"] = nbytes / ms / 1e6 if ms else None
            if result["ge2_GBps"]:
                result["of_copy"] = result["ge2_GBps"] / copy_gbps
            torch.cuda.empty_cache()
    bench.report(copy_GBps=copy_gbps)


if __name__ == "__main__":
    main()
