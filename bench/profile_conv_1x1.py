"""NCHW 1x1 conv (64x128x28^2 -> 128): conv_1x1's TMA kernels on/off vs cuDNN in one process (issue 26).

    PYTHONPATH=. python3 bench/profile_conv_1x1.py      # on a GPU; writes $OUT (or .)/c20_1x1.json

tf32, bf16, tf32x3: torch.profiler kernel table of one fwd+bwd (ge2 off / on, cuDNN), CUDA-graph
times of fwd and fwd+bwd, and (tf32) each forward config of conv1x1_nchw_kernel alone.
"""
import json
import os

import torch
import ge2
from ge2.backend import call
from ge2.backend import call_plans
from ge2.kernels import conv_1x1
import torch.nn.functional as TF
from bench.harness import time_ms
from bench.profile_conv import kernel_us

torch.backends.cudnn.benchmark = True
N, C, H, K = 64, 128, 28, 128
out = {}

def cases(dtype, prec):
    ge2.set_matmul_precision(prec)
    torch.backends.cudnn.allow_tf32 = prec == "tf32" or dtype != torch.float32
    x = torch.randn(N, C, H, H, device="cuda", dtype=dtype)
    w = torch.randn(K, C, 1, 1, device="cuda", dtype=dtype)
    gy = torch.randn(N, K, H, H, device="cuda", dtype=dtype)
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    return dict(
        fwd=(lambda: call("conv2d", x, w, None), lambda: TF.conv2d(x, w)),
        bwd=(lambda: call("conv2d_backward", gy, x, w, has_bias=False),
             lambda: torch.autograd.grad(TF.conv2d(xt, wt), (xt, wt), gy)),
        fwdbwd=(lambda: (call("conv2d", x, w, None), call("conv2d_backward", gy, x, w, has_bias=False)),
                lambda: torch.autograd.grad(TF.conv2d(xt, wt), (xt, wt), gy)))

for dtype, prec in ((torch.float32, "tf32"), (torch.bfloat16, "ieee"), (torch.float32, "tf32x3")):
    tag = f"{str(dtype)[6:]}-{prec}"
    for on in (False, True):
        conv_1x1.ENABLED = conv_1x1.DW_ENABLED = on
        call_plans.clear()  # recorded calls replay the route of their first call
        c = cases(dtype, prec)
        for side, idx in (("ge2", 0), ("torch", 1)):
            if side == "torch" and on:
                continue
            per = kernel_us(c["fwdbwd"][idx])
            print(f"== {tag} {side} conv_1x1={on}: {sum(per.values()):.1f} us", flush=True)
            for k, us in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
                print(f"   {us:8.1f}  {k}", flush=True)
        for p in ("fwd", "fwdbwd"):
            g = time_ms(c[p][0], cuda_graph=True, rep_ms=50) * 1e3
            t = time_ms(c[p][1], cuda_graph=True, rep_ms=50) * 1e3
            out[f"{tag} {p} on={on}"] = (g, t, t / g)
            print(f"{tag} {p} conv_1x1={on}: ge2 {g:.1f} us cuDNN {t:.1f} us ratio {t / g:.2f}", flush=True)
    # every config alone (forward)
    if prec != "tf32":
        continue
    conv_1x1.ENABLED = True
    call_plans.clear()
    kern = conv_1x1.conv1x1_nchw_kernel
    c = cases(dtype, prec)
    configs = list(kern.configs)
    for cfg in configs:
        if cfg not in (conv_1x1.CONFIGS_32 if dtype == torch.float32 else conv_1x1.CONFIGS_16):
            continue
        kern.configs, kern.cache, kern._fast = [cfg], {}, {}
        call_plans.clear()
        try:
            g = time_ms(c["fwd"][0], cuda_graph=True, rep_ms=30) * 1e3
        except Exception as e:  # noqa: BLE001
            g = float("nan"); print("config failed", cfg, repr(e)[:200])
        print(f"{tag} fwd config {cfg.kwargs} warps {cfg.num_warps} stages {cfg.num_stages}: {g:.1f} us", flush=True)
        out[f"{tag} cfg {cfg}"] = g
    kern.configs, kern.cache, kern._fast = configs, {}, {}
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "c20_1x1.json"), "w"), indent=1)
