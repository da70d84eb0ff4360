"""Where the random scatter_add's time goes: ge2's scatter kernel against its earlier forms and torch.

The row of ``bench_tensor_ops.py`` (4096x8192 fp32, random positions along dim 1: one fp32 atomic
per element on scattered addresses) is timed, CUDA-graph replays in one process, as

- ``ge2``: the kernel as it is (relaxed atomics, 32-bit row split, the launcher's tile);
- ``acq_rel``: the same kernel with Triton's default atomic semantics (a fence and an L1
  invalidation around every atomic: ``MEMBAR.ALL.GPU`` + ``CCTL.IVALL`` in the SASS);
- ``div64``: relaxed atomics but the row split p, b = divmod(r, B) in int64 (a subroutine call);
- ``tile_R``: the kernel with R rows per program instead of the launcher's choice;
- ``torch``: ``torch.scatter_add`` (per-element ``atomicAdd``, i.e. ``RED.ADD.F32``).

The variants are built from ge2/kernels/scatter.py's own text (one substitution each) loaded as
separate modules, so nothing in the product path changes.

    PYTHONPATH=. python3 bench/profile_scatter.py     -> bench/results/profile_scatter.json (and $OUT)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import ge2  # noqa: E402,F401  (decides the device before triton is imported)
from bench.harness import Bench, load_module  # noqa: E402
from ge2.kernels import scatter as S  # noqa: E402


def _variant(name: str, old: str, new: str):
    """ge2.kernels.scatter with ``old`` replaced by ``new`` in its source, as a module of its own."""
    text = Path(S.__file__).read_text()
    assert old in text, f"{name}: {old!r} not in scatter.py"
    path = Path(tempfile.mkdtemp()) / f"scatter_{name}.py"
    path.write_text(text.replace(old, new))
    return load_module(path, f"scatter_{name}")


def _call(module, base, idx, src):
    """scatter_add(base, 1, idx, src) through ``module``'s launchers."""
    return lambda: module.scatter(base, 1, idx, src, reduce="add", check=False)


def main() -> None:
    device = torch.device("cuda")
    M, N = 4096, 8192
    base = torch.zeros(M, N, device=device)
    src = torch.randn(M, N, device=device)
    idx = torch.randint(0, N, (M, N), device=device)
    ref = torch.scatter_add(base, 1, idx, src)
    fns = {"ge2": _call(S, base, idx, src),
           "acq_rel": _call(_variant("acq_rel", 'sem="relaxed")\n', 'sem="acq_rel")\n'), base, idx, src),
           "div64": _call(_variant("div64", "return cdiv(R, block_r) * block_r < 2 ** 31", "return False"),
                          base, idx, src)}
    for rows in (512, 1024, 4096):
        tiled = _variant(f"tile{rows}", "br = _block(R, max(1, 2048 // bq))", f"br = _block(R, max(1, {rows} // bq))")
        fns[f"tile_{rows}"] = _call(tiled, base, idx, src)
    fns["torch"] = lambda: torch.scatter_add(base, 1, idx, src)
    errors = {}
    for key, fn in fns.items():
        out = fn()
        errors[key] = float((out - ref).abs().max())  # atomics add in any order: rounding-level differences only
    bench = Bench("profile_scatter", cuda_graph=True)
    row = bench.add({"op": "scatter_add (random)", "shape": f"{M}x{N} dim 1", "dtype": "float32"}, **fns)
    nbytes = M * N * (3 * 4 + 8)
    row.update({f"{key}_max_abs_err": e for key, e in errors.items()})
    row.update({f"{key}_GBps": nbytes / row[f"{key}_ms"] / 1e6 for key in fns if row.get(f"{key}_ms")})
    bench.report()


if __name__ == "__main__":
    main()
