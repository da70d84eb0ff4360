"""The shared benchmark harness: time ge2 and torch side by side, print a table, save JSON.

Every ``bench/bench_*.py`` script uses it the same way::

    from bench.harness import Bench
    bench = Bench("gemm")                                   # -> bench/results/gemm.json
    for case in cases:
        bench.add({"shape": "4096x4096x4096", "dtype": "bf16"},   # what identifies the row
                  ge2=lambda: ..., torch=lambda: ...,             # functions timed, ms (median)
                  flops=2 * M * N * K)                            # optional: adds TFLOP/s columns
    bench.report()                                          # console table + JSON
    plot("x.png", {"ge2": (sizes, tflops)}, title=..., xlabel=..., ylabel=...)  # optional PNG

Timings are medians of ``triton.testing.do_bench`` (CUDA events, warm-up first), or of CUDA-graph
replays with ``Bench(..., cuda_graph=True)`` (kernel time without host launch overhead); each row's
``ratio`` columns are torch_time / ge2_time for every timed function beside ge2 (> 1: ge2 faster).
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import triton
import triton.language as tl

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@triton.jit
def add_kernel(a, b, o, n, BLOCK: tl.constexpr):
    """o = a + b over n elements: the bare Triton launch the host-cost benchmarks compare against."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(a + i, mask=m) + tl.load(b + i, mask=m), mask=m)


def time_ms(fn: Callable[[], Any], warmup_ms: int = 25, rep_ms: int = 100, cuda_graph: bool = False) -> float:
    """Median time of ``fn()`` in milliseconds (CUDA events; includes a warm-up).

    ``cuda_graph``: time replays of a CUDA graph of ``fn`` (``do_bench_cudagraph``), which removes
    the host's launch overhead: kernel time, as a captured training step sees it.
    """
    if cuda_graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def load_module(path: str | os.PathLike, name: str) -> Any:
    """The Python file at ``path`` as a module of its own named ``name``: an earlier (or edited) kernel
    module whose kernels compile and run beside the present ones (``--baseline`` comparisons)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def profile_calls(fn: Callable[[], Any], calls: int, warmup: int = 1) -> torch.profiler.profile:
    """torch.profiler's record of the CUDA kernels of ``calls`` calls of ``fn``, after ``warmup``
    unrecorded calls (compiles, tuning), the device synchronised before and at the end."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


@contextlib.contextmanager
def switched(module: Any, **values: Any) -> Iterator[None]:
    """Set a kernel module's switches (``SPLIT_TAIL=False``, ...) for the ``with`` block, then restore them."""
    old = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(module, name, value)


def host_us(fn: Callable[[], Any], n: int, warmup: int = 3) -> float:
    """Median host time per call (µs) of ``fn`` over rounds of ``n`` back-to-back calls (``host_us_interleaved``)."""
    return host_us_interleaved([fn], n, warmup=warmup)[0]


def host_us_interleaved(fns: list[Callable[[], Any]], n: int, warmup: int = 3, rounds: int = 15) -> list[float]:
    """Per function, the median over ``rounds`` of the host time per call (µs) of ``n`` back-to-back calls.

    Nothing synchronises inside a round (the GPU queue absorbs the kernels): the host's launch path
    is what is timed, after ``warmup`` calls that compile and tune everything. The functions take
    turns round by round, so a drift of the host's speed (it moves by tens of percent within a
    minute on the device machine) reaches each of them alike and their ratio stays fair.
    """
    for fn in fns:
        for _ in range(warmup):
            fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, own in zip(fns, times):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            own.append((time.perf_counter() - t0) / n * 1e6)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    return [sorted(own)[len(own) // 2] for own in times]


def environment() -> dict[str, str]:
    """Device name, library versions, git commit and date: what a result needs to be compared."""
    commit = os.environ.get("GE2_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


class Bench:
    """Rows of side-by-side timings, printed as a table and written to bench/results/<name>.json."""

    def __init__(self, name: str, *, warmup_ms: int = 25, rep_ms: int = 100, cuda_graph: bool = False,
                 rounds: int = 1):
        """``rounds`` > 1: the functions of a row take turns, each timed ``rounds`` times (``rep_ms`` each),
        and report the median: host-bound timings then meet the host's speed drift alike."""
        self.name, self.warmup_ms, self.rep_ms, self.cuda_graph = name, warmup_ms, rep_ms, cuda_graph
        self.rounds = rounds
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {"timing": "cuda graph replay" if cuda_graph else "eager launches"}
        if rounds > 1:
            self.extra["rounds"] = f"{rounds} alternating rounds per row, median"

    def add(self, labels: dict[str, Any], *, flops: float | None = None, **fns: Callable[[], Any] | None) -> dict:
        """Time each function in ``fns`` (ms); None entries are recorded as missing. Returns the row."""
        row: dict[str, Any] = dict(labels)
        samples: dict[str, list[float] | None] = {key: [] for key in fns}
        for _ in range(self.rounds):
            for key, fn in fns.items():
                if fn is None or samples[key] is None:
                    samples[key] = None
                    continue
                try:
                    samples[key].append(time_ms(fn, self.warmup_ms, self.rep_ms, self.cuda_graph))
                except Exception as e:  # a baseline that does not apply (e.g. no fused cuBLASLt op) is recorded, not fatal
                    samples[key] = None
                    row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:200]
                    if self.cuda_graph:  # not capturable: time it launched eagerly, and say so
                        try:
                            samples[key] = [time_ms(fn, self.warmup_ms, self.rep_ms)]
                            row[f"{key}_error"] += " (timed eagerly instead)"
                        except Exception:
                            pass
        times = {key: sorted(v)[len(v) // 2] if v else None for key, v in samples.items()}
        for key, ms in times.items():
            row[f"{key}_ms"] = ms
            if flops and ms:
                row[f"{key}_tflops"] = flops / ms / 1e9
        base = times.get("ge2")
        for key, ms in times.items():
            if key != "ge2" and base and ms:
                row[f"ratio_{key}"] = ms / base
        self.rows.append(row)
        print(self._format_row(row), flush=True)
        self.save()  # after every row: a run cut short by its time limit still leaves its numbers
        return row

    @staticmethod
    def _format_row(row: dict[str, Any]) -> str:
        parts = []
        for key, value in row.items():
            if key.endswith("_error"):
                continue
            parts.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
        return "  ".join(parts)

    def table(self) -> str:
        """The rows as an aligned text table (labels, TFLOP/s or ms, ratios)."""
        if not self.rows:
            return "(no rows)"
        columns: list[str] = []
        for row in self.rows:
            for key in row:
                if key not in columns and not key.endswith("_error") and not (
                        key.endswith("_ms") and f"{key[:-3]}_tflops" in row):
                    columns.append(key)
        cells = [[self._cell(row.get(c)) for c in columns] for row in self.rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
        return "\n".join(lines)

    @staticmethod
    def _cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    def save(self, **extra: Any) -> Path:
        """Write bench/results/<name>.json (environment + ``extra`` + rows); also to $OUT if set."""
        self.extra.update(extra)
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.name}.json"
        path.write_text(json.dumps({"name": self.name, **environment(), **self.extra, "rows": self.rows}, indent=1))
        out = os.environ.get("OUT")  # on the device machine, hand the file back too
        if out:
            Path(out, path.name).write_text(path.read_text())
        return path

    def report(self, **extra: Any) -> Path:
        """Print the table and write the JSON; returns its path."""
        print(self.table(), flush=True)
        path = self.save(**extra)
        print(f"wrote {path}")
        return path


def plot(path: str | Path, series: dict[str, tuple[list, list]], *, title: str, xlabel: str, ylabel: str,
         logx: bool = False) -> Path | None:
    """A PNG line plot, one line per ``label -> (xs, ys)``; None (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install ge2[viz])")
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, "-o", markersize=3, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return Path(path)
