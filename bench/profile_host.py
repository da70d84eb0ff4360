"""Where the host time of one eager ge2 op goes: µs per call, then a cProfile breakdown (GPU; issue 7).

    PYTHONPATH=. python3 bench/profile_host.py

Times the repeated path of a bare Triton launch (through the JIT function and through the compiled
kernel's runner), torch.empty and a torch add as anchors, then ge2's add, Linear+ReLU forward and
its forward+backward (64x128 -> 64, tiny: the GPU is idle, the host is measured), and prints the 25
functions with the most own time for each ge2 case. Run it with GE2_LAUNCH_PLANS=1 and =0 to see
what the launch plans (ge2/kernels/launch.py) save.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402
import ge2.nn.functional as F  # noqa: E402
from bench.harness import add_kernel, host_us  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("profile_host: needs a GPU (under the interpreter the kernels' run time swamps the host path)")
    xt = torch.randn(64, 128, device="cuda")
    wt = torch.randn(64, 128, device="cuda") * 0.1
    bt = torch.zeros(64, device="cuda")
    x, w, b = ge2.from_torch(xt), ge2.from_torch(wt, requires_grad=True), ge2.from_torch(bt, requires_grad=True)
    out, n = torch.empty_like(xt), xt.numel()
    runner = add_kernel[(8,)](xt, xt, out, n, BLOCK=1024)[(8, 1, 1)]
    stream = torch.cuda.current_stream().cuda_stream

    def ge2_add():
        with ge2.no_grad():
            x + x

    def ge2_linear():
        with ge2.no_grad():
            F.linear(x, w, b, activation="relu")

    def ge2_linear_fwd_bwd():
        F.linear(x, w, b, activation="relu").sum().backward()

    cases = {
        "triton jit launch": lambda: add_kernel[(8,)](xt, xt, out, n, BLOCK=1024),
        "compiled kernel runner": lambda: runner(xt, xt, out, n, 1024),
        "compiled runner, stream given": lambda: runner(xt, xt, out, n, 1024, stream=stream),
        "torch.empty": lambda: torch.empty(64, 128, device="cuda"),
        "torch add": lambda: xt + xt,
        "ge2 add": ge2_add,
        "ge2 linear fwd": ge2_linear,
        "ge2 linear fwd+bwd": ge2_linear_fwd_bwd,
    }
    from ge2.kernels import launch

    print(f"launch plans: {'on' if launch.ENABLED else 'off'} (GE2_LAUNCH_PLANS)")
    for name, fn in cases.items():
        print(f"{name:32} {host_us(fn, 2000, warmup=50):8.2f} us", flush=True)
    for name in ("ge2 add", "ge2 linear fwd", "ge2 linear fwd+bwd"):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(2000):
            cases[name]()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        print("=" * 30, name)
        print(text.getvalue())


if __name__ == "__main__":
    main()
