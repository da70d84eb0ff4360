"""Where the GPU time of a conv layer's forward+backward goes: kernel µs per step, ge2 vs cuDNN (issue 5).

    PYTHONPATH=. python3 bench/profile_conv.py [--shape N,C,H,K,r]

One eager forward+backward (conv with a bias, gradient of x, w and b) per step, through ge2's
autograd and through torch's; torch.profiler sums each kernel's device time over 10 steps after
5 warm-up steps (which compile and tune). bf16 and fp32 (tf32 on both sides), NHWC and NCHW.
Prints the total and the eight most expensive kernels of each side: the bench (bench_conv.py)
says how far from cuDNN a shape is, this says which kernel is the difference.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402
import ge2.nn.functional as F  # noqa: E402
from bench.harness import profile_calls  # noqa: E402


def kernel_us(fn, steps: int = 10) -> dict[str, float]:
    """Device µs per call of ``fn`` by kernel name (first 70 characters)."""
    prof = profile_calls(fn, steps, warmup=5)
    per_kernel: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:70]] += event.device_time_total / steps
    return per_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,256,14,256,3", help="N,C,H,K,r (stride 1, 'same' padding)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_conv: needs a GPU")
    N, C, H, K, r = (int(v) for v in args.shape.split(","))
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    ge2.set_matmul_precision("tf32")
    for dtype in (torch.bfloat16, torch.float32):
        for layout in ("nhwc", "nchw"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            x = torch.randn(N, C, H, H, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            w = (torch.randn(K, C, r, r, device="cuda", dtype=dtype) * 0.02).contiguous(memory_format=fmt)
            b = torch.randn(K, device="cuda", dtype=dtype)
            gy = torch.randn(N, K, H, H, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            gx, gw, gb = (ge2.from_torch(t, requires_grad=True) for t in (x, w, b))
            ggy = ge2.from_torch(gy)
            xt, wt, bt = (t.clone().requires_grad_() for t in (x, w, b))
            sides = {"ge2": lambda: F.conv2d(gx, gw, gb, padding=r // 2).backward(ggy),
                     "torch": lambda: torch.nn.functional.conv2d(xt, wt, bt, padding=r // 2).backward(gy)}
            for name, fn in sides.items():
                per_kernel = kernel_us(fn)
                print(f"== {name} {str(dtype).replace('torch.', '')} {layout}: {sum(per_kernel.values()):.1f} us")
                for kernel, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]:
                    print(f"   {us:8.1f}  {kernel}")


if __name__ == "__main__":
    main()
