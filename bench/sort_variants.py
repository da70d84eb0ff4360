"""Sort/topk design sweep on the GPU (issue 25): the pass-1 tile and merge block of the packed-key
sort, and the radix select against the capped merges for topk; each variant checked against torch
and timed by CUDA-graph replays in one process. Prints one line per variant.

    PYTHONPATH=. python3 bench/sort_variants.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import ge2  # noqa: E402,F401
import triton  # noqa: E402
from ge2.kernels import sort as SO  # noqa: E402


def _time(fn) -> float:
    return float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))


def main() -> None:
    shapes = ((256, 32768), (64, 131072))
    defaults = (SO.TILE, SO.MERGE_BLOCK, SO.SELECT_MIN_K)
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        ref = torch.sort(x, -1)
        t_torch = _time(lambda: torch.sort(x, -1))
        for tile, block in ((1024, 1024), (2048, 1024), (2048, 2048), (4096, 2048)):
            SO.TILE, SO.MERGE_BLOCK = tile, block
            values, indices = SO.sort(x, dim=-1)
            ok = torch.equal(values, ref.values) and torch.equal(indices, ref.indices)
            ms = _time(lambda: SO.sort(x, dim=-1))
            print(f"sort {m}x{n} TILE {tile} MERGE_BLOCK {block}: {ms:.4f} ms, torch {t_torch:.4f} "
                  f"ratio {t_torch / ms:.2f} ok {ok}", flush=True)
        SO.TILE, SO.MERGE_BLOCK = defaults[:2]
        for k in (8, 50, 1024):
            t_ref = torch.topk(x, k)
            t_torch = _time(lambda: torch.topk(x, k))
            for label, min_k in (("select", 1), ("capped merges", 10**9)):
                SO.SELECT_MIN_K = min_k
                values, _ = SO.topk(x, k)
                ok = torch.equal(values, t_ref.values)
                ms = _time(lambda: SO.topk(x, k))
                print(f"topk {m}x{n} k={k} {label}: {ms:.4f} ms, torch {t_torch:.4f} ratio {t_torch / ms:.2f} ok {ok}",
                      flush=True)
            SO.SELECT_MIN_K = defaults[2]


if __name__ == "__main__":
    main()
