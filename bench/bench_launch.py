"""Host cost of one op: microseconds of Python per call on the repeated path, ge2 vs torch (issue 7).

Each case is called N times back to back without synchronising (the GPU queue absorbs the
kernels; the host loop is what is timed), after a warm-up that compiles and tunes everything; ge2
and torch take turns over 15 rounds and each reports its median (``harness.host_us_interleaved``).
Cases: a tiny elementwise add (through autograd, and as a bare registry call that replays its call
plan, through the compiled dispatch and through the registry's Python entry), the bare
compiled-kernel launch for scale, a
512x784x1024 GEMM with bias and relu (TMA on Hopper) against torch's addmm, a tiny Linear+relu forward, and its
forward+backward. Writes
bench/results/launch.json. On the interpreter the numbers include running the kernels and mean
nothing; run on a GPU.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ge2  # noqa: E402
import ge2.nn.functional as F  # noqa: E402
from bench.harness import RESULTS_DIR, add_kernel, environment, host_us_interleaved  # noqa: E402


def main() -> None:
    n = 400 if torch.cuda.is_available() else 3
    dev = ge2.device()
    xt = torch.randn(64, 128, device=dev)
    wt = torch.randn(64, 128, device=dev) * 0.1
    bt = torch.zeros(64, device=dev)
    x, w, b = ge2.from_torch(xt), ge2.from_torch(wt, requires_grad=True), ge2.from_torch(bt, requires_grad=True)
    wr, br = wt.clone().requires_grad_(), bt.clone().requires_grad_()

    def ge2_fwd_bwd():
        F.linear(x, w, b, activation="relu").sum().backward()

    def torch_fwd_bwd():
        torch.relu(torch.nn.functional.linear(xt, wr, br)).sum().backward()

    # a GEMM past gemm.SMALL_PROBLEM: on Hopper its plan launches TMA descriptors (tensor maps re-aimed per call)
    m, k, n_out = (512, 784, 1024) if torch.cuda.is_available() else (8, 16, 8)
    xa, wa, ba = (torch.randn(m, k, device=dev), torch.randn(n_out, k, device=dev) * 0.03,
                  torch.randn(n_out, device=dev))
    gemm_attrs = dict(trans_b=True, bias_kind="per_n", act="relu", act_alpha=0.01, save_z=False)
    yt = torch.randn(64, 128, device=dev)
    y = ge2.from_torch(yt)
    from ge2.backend import call_plans, registry
    from ge2.kernels import launch

    cases = {
        "add x + y 64x128": (lambda: x + y, lambda: xt + yt),
        # the same tensor twice: its own call-plan key, replayed like x + y (was refused: 111 us)
        "add x + x 64x128": (lambda: x + x, lambda: xt + xt),
        "registry add (call plan)": (lambda: registry.call("add", xt, yt), lambda: xt + yt),
        # the same replay through the registry's Python entry instead of ge2_native's dispatch
        "registry add, python_call": (lambda: registry.python_call("add", xt, yt), lambda: xt + yt),
        "registry gemm 512x784x1024 +b relu": (lambda: registry.call("gemm", xa, wa, None, ba, **gemm_attrs),
                                               lambda: torch.addmm(ba, xa, wa.t())),
        "compiled kernel launch, bare": (lambda: runner(xt, yt, out, 64 * 128, 1024), lambda: xt + yt),
        "linear+relu fwd 64x128->64": (lambda: F.linear(x, w, b, activation="relu"),
                                        lambda: torch.relu(torch.nn.functional.linear(xt, wt, bt))),
        "linear+relu fwd+bwd (+sum)": (ge2_fwd_bwd, torch_fwd_bwd),
    }
    out = torch.empty_like(xt)
    runner = add_kernel[(8,)](xt, yt, out, 64 * 128, BLOCK=1024)[(8, 1, 1)] if torch.cuda.is_available() else None
    if runner is None:
        del cases["compiled kernel launch, bare"]
    rows = []
    print(f"call plans: {'on' if call_plans.ENABLED else 'off'} (GE2_CALL_PLANS), "
          f"launch plans: {'on' if launch.ENABLED else 'off'} (GE2_LAUNCH_PLANS)")
    print(f"{'case':30} {'ge2 us':>9} {'torch us':>9} {'ge2/torch':>9}")
    for name, (g, t) in cases.items():
        with ge2.no_grad() if "bwd" not in name else ge2.enable_grad():
            gu, tu = host_us_interleaved([g, t], n if "bwd" not in name else max(1, n // 4), warmup=50)
        rows.append({"case": name, "ge2_us": gu, "torch_us": tu, "ratio": gu / tu})
        print(f"{name:30} {gu:9.1f} {tu:9.1f} {gu / tu:9.2f}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "launch.json").write_text(json.dumps({"name": "launch", **environment(), "rows": rows,
                                                         "call_plans": dict(call_plans.STATS)}, indent=1))


if __name__ == "__main__":
    main()
