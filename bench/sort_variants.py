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
    defaults = (SO.TILE, SO.MERGE_BLOCK, SO.MERGE, SO.SELECT_MIN_K, SO.SELECT_ATOMIC_PASSES)
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        ref = torch.sort(x, -1)
        t_torch = _time(lambda: torch.sort(x, -1))
        for tile, block, merge, warps in ((1024, 1024, "lanes", 0), (1024, 1024, "bitonic", 0),
                                          (1024, 1024, "search", 0), (1024, 1024, "lanes", 4),
                                          (1024, 1024, "lanes", 2), (512, 1024, "lanes", 4), (256, 1024, "lanes", 0),
                                          (1024, 2048, "lanes", 0)):
            SO.TILE, SO.MERGE_BLOCK, SO.MERGE, SO.TILE_WARPS = tile, block, merge, warps
            try:
                values, indices = SO.sort(x, dim=-1)
                ok = torch.equal(values, ref.values) and torch.equal(indices, ref.indices)
                ms = _time(lambda: SO.sort(x, dim=-1))
            except Exception as e:  # a variant that does not compile is reported, the sweep goes on
                print(f"sort {m}x{n} TILE {tile} merge {merge}: FAILED {type(e).__name__}: {str(e)[:200]}")
                continue
            print(f"sort {m}x{n} TILE {tile} warps {warps or 'auto'} MERGE_BLOCK {block} merge {merge}: {ms:.4f} ms, "
                  f"torch {t_torch:.4f} ratio {t_torch / ms:.2f} ok {ok}", flush=True)
        SO.TILE, SO.MERGE_BLOCK, SO.MERGE, SO.TILE_WARPS = *defaults[:3], 0
        tiles = x.view(-1, SO.TILE)  # the same elements as rows of one tile: the tile pass and the gather alone
        ms = _time(lambda: SO.sort(tiles, dim=-1))
        print(f"sort {m}x{n} as rows of {SO.TILE} (no merge pass): {ms:.4f} ms", flush=True)
        for k in (50, 1024):
            t_ref = torch.topk(x, k)
            t_torch = _time(lambda: torch.topk(x, k))
            for label, min_k, atomic in (("select", 1, True), ("capped merges", 10**9, True)):
                SO.SELECT_MIN_K, SO.SELECT_ATOMIC_PASSES = min_k, atomic
                values, _ = SO.topk(x, k)
                ok = torch.equal(values, t_ref.values)
                ms = _time(lambda: SO.topk(x, k))
                print(f"topk {m}x{n} k={k} {label}: {ms:.4f} ms, torch {t_torch:.4f} ratio {t_torch / ms:.2f} ok {ok}",
                      flush=True)
            SO.SELECT_MIN_K, SO.SELECT_ATOMIC_PASSES = defaults[3:]


if __name__ == "__main__":
    main()
