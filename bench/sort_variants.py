"""Sort/topk design sweep on the GPU (issue 25): the radix select's settings against the capped
merges for topk (k = 50 to 1024), the sort at its defaults; each variant checked against torch and
timed by CUDA-graph replays in one process, torch beside it. Prints one line per variant;
--profile adds the select's kernel times (torch.profiler).

--radix times only the sort: the radix sort's settings (digit bits, tile, warps) against the merges
(RADIX_SORT off), on the bench's shapes and on rows of 2048/4096 (where the radix sort starts to pay).

--baseline FILE times an earlier ge2/kernels/sort.py (``git show REV:ge2/kernels/sort.py > FILE``)
in the same process, as "before": its sort and topk at its own defaults.

    PYTHONPATH=. python3 bench/sort_variants.py [--baseline build/sort_before.py] [--profile]
    PYTHONPATH=. python3 bench/sort_variants.py --radix
    PYTHONPATH=. python3 bench/sort_variants.py --small-k
"""
from __future__ import annotations

import argparse
import functools
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--registers" in sys.argv:  # compiled for the H100 here, not interpreted (no GPU needed)
    os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402

import ge2  # noqa: E402,F401
import triton  # noqa: E402
from bench.harness import load_module, profile_calls, time_ms  # noqa: E402
from ge2.kernels import sort as SO  # noqa: E402

SHAPES = ((256, 32768), (64, 131072))
TOPK_K = (50, 128, 256, 1024)
# (SELECT_PROGRAMS, SELECT_ATOMIC_PASSES, SELECT_BLOCK, SELECT_WARPS)
SELECT_VARIANTS = ((2048, True, 4096, 8), (2048, True, 4096, 4), (4096, True, 2048, 4), (4096, True, 2048, 8),
                   (2048, False, 4096, 8))
# (RADIX_BITS, RADIX_TILE, RADIX_WARPS, RADIX_SUB): ptxas (CPU) gives the scatter 48-80 registers a thread
RADIX_VARIANTS = ((5, 1024, 8, 1024), (5, 1024, 8, 256), (5, 2048, 8, 2048), (4, 1024, 8, 1024), (6, 2048, 8, 2048),
                  (8, 2048, 8, 2048), (8, 4096, 8, 4096))
SMALL_K = (1, 8, 50, 100)
# (BEST_TILE, BEST_WARPS, BEST_CHUNK)
BEST_VARIANTS = ((1024, 4, 8192), (2048, 4, 8192), (2048, 8, 8192), (4096, 8, 8192), (4096, 4, 8192),
                 (8192, 8, 8192), (8192, 16, 8192), (4096, 8, 2048))
RADIX_SHAPES = ((256, 32768), (64, 131072), (4096, 2048), (2048, 4096))


_time = functools.partial(time_ms, rep_ms=60, cuda_graph=True)  # ms, median of CUDA-graph replays


def _line(label: str, fn, t_torch: float, ok) -> None:
    try:
        ok_now = ok()
        ms = _time(fn)
    except Exception as e:  # a variant that does not compile is reported, the sweep goes on
        print(f"{label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        return
    print(f"{label}: {ms:.4f} ms, torch {t_torch:.4f} ratio {t_torch / ms:.2f} ok {ok_now}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="an earlier sort.py, timed as 'before'")
    ap.add_argument("--profile", action="store_true", help="kernel times of the select (torch.profiler)")
    ap.add_argument("--registers", action="store_true",
                    help="registers/spills of the select kernels compiled for sm_90a by ptxas (runs on a CPU)")
    ap.add_argument("--radix", action="store_true", help="only the sort: radix settings against the merges")
    ap.add_argument("--small-k", action="store_true", help="only topk of k < SELECT_MIN_K: best-of-tiles settings "
                    "against the capped merges, and both paths' kernel times")
    args = ap.parse_args()
    if args.small_k:
        _small_k()
        return
    if args.registers:
        _registers()
        return
    if args.radix:
        _radix()
        return
    base = load_module(args.baseline, "ge2.kernels._sort_baseline") if args.baseline else None
    settings = ("SELECT_MIN_K", "SELECT_PROGRAMS", "SELECT_ATOMIC_PASSES", "SELECT_BLOCK", "SELECT_WARPS")
    defaults = {name: getattr(SO, name) for name in settings}
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda")
        ref = torch.sort(x, -1)
        t_torch = _time(lambda: torch.sort(x, -1))

        def sort_ok(mod):
            values, indices = mod.sort(x, dim=-1)
            return torch.equal(values, ref.values) and torch.equal(indices, ref.indices)

        _line(f"sort {m}x{n} default", lambda: SO.sort(x, dim=-1), t_torch, lambda: sort_ok(SO))
        if base is not None:
            _line(f"sort {m}x{n} baseline", lambda: base.sort(x, dim=-1), t_torch, lambda: sort_ok(base))
        for k in TOPK_K:
            t_ref = torch.topk(x, k)
            t_torch = _time(lambda: torch.topk(x, k))

            def topk_ok(mod):
                values, indices = mod.topk(x, k)
                return torch.equal(values, t_ref.values) and torch.equal(torch.gather(x, 1, indices), values)

            if base is not None and k in (50, 1024):
                _line(f"topk {m}x{n} k={k} baseline", lambda: base.topk(x, k), t_torch, lambda: topk_ok(base))
            SO.SELECT_MIN_K = 10**9
            _line(f"topk {m}x{n} k={k} capped merges", lambda: SO.topk(x, k), t_torch, lambda: topk_ok(SO))
            SO.SELECT_MIN_K = 1
            for programs, atomic, block, warps in SELECT_VARIANTS:
                SO.SELECT_PROGRAMS, SO.SELECT_ATOMIC_PASSES, SO.SELECT_BLOCK, SO.SELECT_WARPS = \
                    programs, atomic, block, warps
                _line(f"topk {m}x{n} k={k} select programs {programs} atomic {atomic} block {block} warps {warps}",
                      lambda: SO.topk(x, k), t_torch, lambda: topk_ok(SO))
            for name in settings:
                setattr(SO, name, defaults[name])
    if args.profile:
        _profile()


def _radix() -> None:
    """The sort's radix settings against the merges, each checked against torch's stable sort."""
    settings = ("RADIX_SORT", "RADIX_BITS", "RADIX_TILE", "RADIX_WARPS", "RADIX_SUB")
    defaults = {name: getattr(SO, name) for name in settings}
    for m, n in RADIX_SHAPES:
        x = torch.randn(m, n, device="cuda")
        ref = torch.sort(x, dim=-1, stable=True)
        t_torch = _time(lambda: torch.sort(x, -1))

        def sort_ok():
            values, indices = SO.sort(x, dim=-1)
            return torch.equal(values, ref.values) and torch.equal(indices, ref.indices)

        SO.RADIX_SORT = False
        _line(f"sort {m}x{n} merges", lambda: SO.sort(x, dim=-1), t_torch, sort_ok)
        SO.RADIX_SORT = True
        for bits, tile, warps, sub in RADIX_VARIANTS:
            SO.RADIX_BITS, SO.RADIX_TILE, SO.RADIX_WARPS, SO.RADIX_SUB = bits, tile, warps, sub
            _line(f"sort {m}x{n} radix bits {bits} tile {tile} warps {warps} sub {sub}", lambda: SO.sort(x, dim=-1),
                  t_torch, sort_ok)
        for name in settings:
            setattr(SO, name, defaults[name])
    x = torch.randn(64, 131072, device="cuda")
    prof = profile_calls(lambda: SO.sort(x, dim=-1), 10)
    print("--- radix sort (defaults), 64x131072, 10 calls (us per call = total / 10)")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=40),
          flush=True)


def _small_k() -> None:
    """topk of small k: the best-of-tiles path's settings against the capped merges (BEST_OF_TILES off)."""
    settings = ("BEST_OF_TILES", "BEST_TILE", "BEST_WARPS", "BEST_CHUNK")
    defaults = {name: getattr(SO, name) for name in settings}
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda")
        for k in SMALL_K:
            t_ref = torch.topk(x, k)
            t_torch = _time(lambda: torch.topk(x, k))

            def topk_ok():
                values, indices = SO.topk(x, k)
                return torch.equal(values, t_ref.values) and torch.equal(torch.gather(x, 1, indices), values)

            SO.BEST_OF_TILES = False
            _line(f"topk {m}x{n} k={k} capped merges", lambda: SO.topk(x, k), t_torch, topk_ok)
            SO.BEST_OF_TILES = True
            for tile, warps, chunk in BEST_VARIANTS:
                SO.BEST_TILE, SO.BEST_WARPS, SO.BEST_CHUNK = tile, warps, chunk
                _line(f"topk {m}x{n} k={k} best of tiles {tile} warps {warps} chunk {chunk}", lambda: SO.topk(x, k),
                      t_torch, topk_ok)
            for name in settings:
                setattr(SO, name, defaults[name])
    x = torch.randn(256, 32768, device="cuda")
    for on in (False, True):
        SO.BEST_OF_TILES = on
        prof = profile_calls(lambda: SO.topk(x, 50), 20)
        print(f"--- topk k=50, 256x32768, best of tiles {on}, 20 calls (us per call = total / 20)")
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=40),
              flush=True)
    SO.BEST_OF_TILES = defaults["BEST_OF_TILES"]


def _profile() -> None:
    """Kernel times of the select (defaults) on 256 rows of 32k, k = 50 and 1024: where its time goes."""
    x = torch.randn(256, 32768, device="cuda")
    SO.SELECT_MIN_K = 1
    for k in (50, 1024):
        prof = profile_calls(lambda: SO.topk(x, k), 20)
        print(f"--- select k={k}, 256x32768, 20 calls (us per call = total / 20)")
        try:
            table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=40)
        except Exception:  # older torch names it after CUDA
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=40)
        print(table, flush=True)



def _registers() -> None:
    """ptxas -v of the select kernels at their bench settings (256 rows of 32k, fp32, largest):
    registers per thread bound how many programs an SM holds, and these programs are latency-bound."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = glob.glob(str(Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"))[0]
    types = dict(x_ptr="*fp32", hist_ptr="*i32", ticket_ptr="*i32", state_ptr="*i64", count_ptr="*i32",
                 order_ptr="*i64", M="i32", N="i32", k="i32", G="i32", span="i32", chunks="i32",
                 stride_xm="i32", stride_xn="i32")
    for fn, label, const in ((SO._select_pass_kernel, "pass 0", dict(PASS=0, ATOMIC=False)),
                             (SO._select_pass_kernel, "pass 1", dict(PASS=1, ATOMIC=True)),
                             (SO._select_take_kernel, "take", dict(PASSES=6))):
        for warps, block in ((SO.SELECT_WARPS, SO.SELECT_BLOCK), (8, 4096)):
            names = fn.arg_names
            consts = dict(DESCENDING=True, IB=16, BLOCK=block, **const)
            src = ASTSource(fn=fn, signature={n: types.get(n, "constexpr") for n in names},
                            constexprs={(names.index(n),): v for n, v in consts.items()})
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            with tempfile.TemporaryDirectory() as tmp:
                ptx = Path(tmp) / "k.ptx"
                ptx.write_text(kernel.asm["ptx"])
                out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(ptx.with_suffix(".o"))],
                                     capture_output=True, text=True)
            info = " ".join(line.split("info    : ")[-1].strip() for line in out.stderr.splitlines()
                            if "registers" in line or "spill" in line)
            print(f"{label} ({warps} warps, chunks of {block}): {info}", flush=True)


if __name__ == "__main__":
    main()
