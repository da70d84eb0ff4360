"""Where topk (k >= SELECT_MIN_K) and the bf16 row gather spend their time (issue 25, sessions 20-21):
the multi-program radix select (and, with --baseline, an earlier sort.py's select; with --row, the
one-program-a-row select's settings), each checked against torch's stable sort and timed by
CUDA-graph replays beside torch in one process; the select's kernels one by one in launch order
(torch.profiler, the mean of 20 calls); the row gather / index_select, its kernel with and without
the index counter, the counter's fill.

    PYTHONPATH=. python3 bench/profile_tensor_ops.py [--skip-profile] [--baseline OLD_SORT_PY] [--row]
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import ge2  # noqa: E402,F401
from bench.harness import load_module, profile_calls, switched, time_ms  # noqa: E402
from ge2.kernels import scatter as SC  # noqa: E402
from ge2.kernels import sort as SO  # noqa: E402

SHAPES = ((256, 32768), (64, 131072), (16, 131072), (16, 32768))
# (SELECT_ROW_WARPS, SELECT_ROW_BLOCK)
ROW_VARIANTS = ((16, 4096), (8, 2048), (32, 8192), (4, 1024), (8, 4096))


_time = functools.partial(time_ms, rep_ms=60, cuda_graph=True)  # ms, median of CUDA-graph replays


def _topk_ok(x: torch.Tensor, k: int) -> bool:
    values, indices = SO.topk(x, k)
    ref = torch.sort(x, dim=-1, descending=True, stable=True)
    return torch.equal(values, ref.values[:, :k]) and torch.equal(indices, ref.indices[:, :k])


def _line(label: str, ms: float, t_torch: float, ok) -> None:
    print(f"{label:58s} {ms * 1e3:8.1f} us   torch {t_torch * 1e3:8.1f} us   ratio {t_torch / ms:5.2f}   ok={ok}",
          flush=True)


def _select(shapes, ks, old=None, row=False) -> None:
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        for k in ks:
            t_torch = _time(lambda: torch.topk(x, k))
            with switched(SO, SELECT_MIN_K=min(k, SO.SELECT_MIN_K), SELECT_ROW=False):
                ok = _topk_ok(x, k)
                _line(f"{m}x{n} k={k} multi-program select", _time(lambda: SO.topk(x, k)), t_torch, ok)
            if old is not None:
                with switched(old, SELECT_MIN_K=min(k, old.SELECT_MIN_K), SELECT_ROW=False):
                    values, indices = old.topk(x, k)
                    ref = torch.sort(x, dim=-1, descending=True, stable=True)
                    ok = torch.equal(values, ref.values[:, :k]) and torch.equal(indices, ref.indices[:, :k])
                    _line(f"{m}x{n} k={k} baseline select", _time(lambda: old.topk(x, k)), t_torch, ok)
            if not row:
                continue
            if k < SO.SELECT_MIN_K:
                ok = _topk_ok(x, k)
                _line(f"{m}x{n} k={k} best of tiles", _time(lambda: SO.topk(x, k)), t_torch, ok)
            for warps, block in ROW_VARIANTS if k == 1024 and m >= 64 else ROW_VARIANTS[:2]:
                with switched(SO, SELECT_MIN_K=1, SELECT_ROW=True, SELECT_ROW_MIN_M=1, SELECT_ROW_WARPS=warps,
                              SELECT_ROW_BLOCK=block):
                    try:
                        ok = _topk_ok(x, k)
                        _line(f"{m}x{n} k={k} row select {warps} warps, chunks of {block}",
                              _time(lambda: SO.topk(x, k)), t_torch, ok)
                    except Exception as e:  # noqa: BLE001  (a setting that fails is reported, the rest go on)
                        print(f"{m}x{n} k={k} row select {warps}/{block} FAILED {type(e).__name__}: {str(e)[:200]}")
    x = (4 * torch.randn(64, 32768 + 7, device="cuda")).round()  # ties at the k-th place
    with switched(SO, SELECT_ROW_MIN_M=1):
        values, indices = SO.topk(x, 1024)
    ref = torch.sort(x, dim=-1, descending=True, stable=True)
    print("ties (64 x 32k+7, 4 x randn rounded), select:", torch.equal(values, ref.values[:, :1024]) and torch.equal(indices, ref.indices[:, :1024]))


def _profile() -> None:
    """The select's kernels in launch order, each the mean over 20 calls (the passes share one name)."""
    for m, n in SHAPES[:2]:
        for label, x in (("randn", torch.randn(m, n, device="cuda")),
                         ("ties (4x randn rounded)", (4 * torch.randn(m, n, device="cuda")).round())):
            prof = profile_calls(lambda: SO.topk(x, 1024), 20)
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            per = len(kernels) // 20
            print(f"--- topk k=1024, {m}x{n} {label}: {per} kernels a call, us (mean of 20 calls)")
            total = 0.0
            for j in range(per):
                us = sum(kernels[i * per + j].time_range.elapsed_us() for i in range(20)) / 20
                total += us
                print(f"  {j:2d} {kernels[j].name[:60]:60s} {us:7.1f}")
            print(f"  kernels in all {total:7.1f} us", flush=True)


# The select's settings timed against the shipped ones at k = 1024 (each checked against torch).
SWEEP = (dict(), dict(SELECT_PROGRAMS=2048, SELECT_BLOCK=4096, SELECT_WARPS=8),
         dict(SELECT_PROGRAMS=8192, SELECT_BLOCK=1024), dict(SELECT_PROGRAMS=8192, SELECT_BLOCK=1024, SELECT_WARPS=2),
         dict(SELECT_PROGRAMS=16384, SELECT_BLOCK=512), dict(SELECT_WARPS=8))


def _sweep() -> None:
    for m, n in SHAPES[:2]:
        x = torch.randn(m, n, device="cuda")
        t_torch = _time(lambda: torch.topk(x, 1024))
        for setting in SWEEP:
            with switched(SO, **setting):
                try:
                    ok = _topk_ok(x, 1024)
                    _line(f"{m}x{n} k=1024 {setting or 'shipped'}", _time(lambda: SO.topk(x, 1024)), t_torch, ok)
                except Exception as e:  # noqa: BLE001  (a setting that fails is reported, the rest go on)
                    print(f"{m}x{n} {setting} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


def _gather() -> None:
    V, N, D = 32768, 16384, 1024
    copy = torch.empty(64 * 2 ** 20, device="cuda")
    t_copy = _time(copy.clone)
    print(f"copy 256 MiB: {2 * copy.numel() * 4 / t_copy / 1e6:.0f} GB/s")
    del copy
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(V, D, device="cuda").to(dtype)
        ids = torch.randint(0, V, (N,), device="cuda")
        gx, gi, ge = ge2.from_torch(x), ge2.from_torch(ids), ge2.from_torch(ids[:, None].expand(N, D))
        nbytes = 2 * N * D * x.element_size() + N * 8
        t_sel = _time(lambda: torch.index_select(x, 0, ids))
        t_gat = _time(lambda: torch.gather(x, 0, ids[:, None].expand(N, D)))
        with ge2.no_grad():
            ok = torch.equal(ge2.index_select(gx, 0, gi).data, x[ids]) and torch.equal(ge2.gather(gx, 0, ge).data, x[ids])
            t1 = _time(lambda: ge2.index_select(gx, 0, gi))
            t2 = _time(lambda: ge2.gather(gx, 0, ge))
        out = torch.empty(N, D, dtype=dtype, device="cuda")
        walk = ((), ()), ((D,), (1,)), V, D
        t_bare = _time(lambda: SC.gather_walk(x, *walk, ids, (0, 1, 0), N, out, None, wrap=False))
        bad = SC.new_counter(x.device)
        t_count = _time(lambda: SC.gather_walk(x, *walk, ids, (0, 1, 0), N, out, bad, wrap=False))
        t_fill = _time(lambda: SC.new_counter(x.device))
        print(f"{str(dtype):15s} index_select {t1 * 1e3:6.1f} us (torch {t_sel * 1e3:6.1f}, {t_sel / t1:4.2f}, "
              f"{nbytes / t1 / 1e6:5.0f} GB/s)  gather {t2 * 1e3:6.1f} us (torch {t_gat * 1e3:6.1f}, {t_gat / t2:4.2f})"
              f"  ok={ok}; kernel alone: unchecked {t_bare * 1e3:6.1f} us, counting {t_count * 1e3:6.1f} us; "
              f"the counter's zero fill alone {t_fill * 1e3:5.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--baseline", default=None, help="an earlier ge2/kernels/sort.py, timed beside the present one")
    ap.add_argument("--row", action="store_true", help="also the one-program-a-row select's settings")
    ap.add_argument("--sweep", action="store_true", help="also the select's settings (SWEEP) at k = 1024")
    args = ap.parse_args()
    old = load_module(args.baseline, "sort_before") if args.baseline else None
    if not args.skip_profile:  # first: the kernel times are what the next change is chosen by
        _profile()
    _select(SHAPES[:2], (1024, 128, 4096), old, args.row)
    _select(SHAPES[2:], (1024,), old, args.row)
    if args.sweep:
        _sweep()
    _gather()


if __name__ == "__main__":
    main()
