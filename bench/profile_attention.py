"""ge2's flash-attention kernels against torch's SDPA (cuDNN and flash backends): TFLOP/s, bf16.

    PYTHONPATH=. python3 bench/profile_attention.py [--shapes 4,16,2048,128 8,12,1024,64] [--quick]

Calls the kernel launchers directly (ge2.kernels.attention), so the numbers are the kernels'
own; forward+backward is one forward and one backward. FLOPs: 4*B*H*L*S*E forward (half when
causal), 2.5x that for the backward. triton.testing.do_bench medians, all in one process. Before
timing, a correctness check at each shape: ge2's and torch's bf16 outputs and gradients against
an fp32 reference on a slice of the batch. Prints the chosen configs and the compiled kernels'
registers, spills and shared memory (the lead's bench/bench_attention.py is the full benchmark).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402,F401  (sets up the runtime before the kernels import triton)
from ge2.kernels import attention as A  # noqa: E402

SHAPES = ["4,16,2048,128", "8,12,1024,64", "1,16,8192,128", "32,6,256,64"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def ge2_fwd(q, k, v, causal):
    return A.attention_forward(q, k, v, None, scale=q.shape[-1] ** -0.5, is_causal=causal, dropout_p=0.0,
                               rng_state=None, precision="ieee")


def ge2_bwd(do, q, k, v, o, lse, causal):
    return A.attention_backward(do, q, k, v, o, lse, None, scale=q.shape[-1] ** -0.5, is_causal=causal,
                                dropout_p=0.0, rng_state=None, precision="ieee")


def torch_sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def check(q, k, v, do, causal) -> str:
    """rel. errors vs fp32 on two heads of one batch: ge2 o/dq/dk/dv, then cuDNN's."""
    from torch.nn.attention import SDPBackend

    q, k, v, do = (t[:1, :2].contiguous() for t in (q, k, v, do))
    ref = [t.float().requires_grad_() for t in (q, k, v)]
    o_ref = torch_sdpa(SDPBackend.MATH, *ref, causal)
    o_ref.backward(do.float())
    o, lse = ge2_fwd(q, k, v, causal)
    grads = ge2_bwd(do, q, k, v, o, lse, causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o_t = torch_sdpa(SDPBackend.CUDNN_ATTENTION, *leaves, causal)
    o_t.backward(do)
    ours = [rel(o, o_ref)] + [rel(g, r.grad) for g, r in zip(grads, ref)]
    theirs = [rel(o_t, o_ref)] + [rel(t.grad, r.grad) for t, r in zip(leaves, ref)]
    bad = any(not (e <= 2 * t + 1e-3) for e, t in zip(ours, theirs))
    return ("FAIL " if bad else "ok ") + " ".join(f"{e:.1e}/{t:.1e}" for e, t in zip(ours, theirs))


def kernel_report() -> None:
    """Warps, stages, registers, spills, shared memory and wgmma count of every compiled attention kernel."""
    for kern in (A.attention_fwd_kernel, A.attention_bwd_dkdv_kernel, A.attention_bwd_dq_kernel):
        for caches in getattr(kern.fn, "device_caches", {}).values():
            for compiled in caches[0].values():
                md = compiled.metadata
                wgmma = compiled.asm.get("ttgir", "").count("warp_group_dot ")
                print(f"  {md.name:30s} warps={md.num_warps} stages={md.num_stages} regs={compiled.n_regs} "
                      f"spills={compiled.n_spills} smem={md.shared} wgmma={wgmma}")


def timings(kern) -> str:
    """The autotuner's last timings, best first."""
    t = getattr(kern, "configs_timings", None) or {}
    items = sorted(((v[0] if isinstance(v, (list, tuple)) else v, c) for c, v in t.items()), key=lambda x: x[0])
    return "; ".join(f"{ms:.3f} {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} s{c.num_stages} w{c.num_warps}"
                     for ms, c in items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=SHAPES, help="B,H,S,E (L = S)")
    parser.add_argument("--quick", action="store_true", help="forward only")
    parser.add_argument("--pointer", action="store_true", help="also time ge2 without TMA at the first shape")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_attention: needs a GPU")
    from torch.nn.attention import SDPBackend

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    rows = []
    for shape in args.shapes:
        B, H, S, E = (int(x) for x in shape.split(","))
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, S, E, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for causal in (False, True):
            status = check(q, k, v, do, causal)
            flops = 4 * B * H * S * S * E * (0.5 if causal else 1.0)
            row = {"shape": shape, "causal": causal, "check": status}
            o, lse = ge2_fwd(q, k, v, causal)
            row["ge2 fwd"] = triton.testing.do_bench(lambda: ge2_fwd(q, k, v, causal), return_mode="median")
            if not args.quick:
                ge2_bwd(do, q, k, v, o, lse, causal)
                row["ge2 bwd"] = triton.testing.do_bench(lambda: ge2_bwd(do, q, k, v, o, lse, causal),
                                                         return_mode="median")
                row["ge2 f+b"] = row["ge2 fwd"] + row["ge2 bwd"]
            for name, backend in backends.items():
                row[f"{name} fwd"] = triton.testing.do_bench(lambda: torch_sdpa(backend, q, k, v, causal),
                                                             return_mode="median")
                if not args.quick:
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

                    def step():
                        torch_sdpa(backend, *leaves, causal).backward(do)

                    row[f"{name} f+b"] = triton.testing.do_bench(step, return_mode="median", grad_to_none=leaves)
            for key in [c for c in row if c.endswith("fwd") or c.endswith("f+b") or c.endswith("bwd")]:
                mult = 1.0 if key.endswith("fwd") else (2.5 if key.endswith("bwd") else 3.5)
                row[key] = (row[key], flops * mult / row[key] * 1e-9)
            rows.append(row)
            print(shape, "causal" if causal else "full", status, flush=True)
            for kern in (A.attention_fwd_kernel, A.attention_bwd_dkdv_kernel, A.attention_bwd_dq_kernel):
                print(f"   {kern.fn.__name__}: {timings(kern)}", flush=True)
            if shape == args.shapes[0] and args.pointer:
                A.TMA = False
                o, lse = ge2_fwd(q, k, v, causal)
                ms_f = triton.testing.do_bench(lambda: ge2_fwd(q, k, v, causal), return_mode="median")
                ge2_bwd(do, q, k, v, o, lse, causal)
                ms_b = triton.testing.do_bench(lambda: ge2_bwd(do, q, k, v, o, lse, causal), return_mode="median")
                A.TMA = True
                print(f"  pointer loads: fwd {flops / ms_f * 1e-9:.0f} TFLOP/s, f+b {3.5 * flops / (ms_f + ms_b) * 1e-9:.0f}"
                      f" (TMA: {row['ge2 fwd'][1]:.0f}, {row['ge2 f+b'][1] if 'ge2 f+b' in row else 0:.0f})", flush=True)
                for kern in (A.attention_fwd_kernel, A.attention_bwd_dkdv_kernel, A.attention_bwd_dq_kernel):
                    print(f"   {kern.fn.__name__}: {timings(kern)}", flush=True)

    kernel_report()
    cols = ["ge2 fwd", "cudnn fwd", "flash fwd"] + ([] if args.quick else ["ge2 bwd", "ge2 f+b", "cudnn f+b", "flash f+b"])
    print(f"\n{torch.cuda.get_device_name()}  triton {triton.__version__}  torch {torch.__version__}  (TFLOP/s, ms)")
    print(f"{'B,H,S,E':16s} {'mask':6s} " + " ".join(f"{c:>16s}" for c in cols) + "   ge2/cudnn fwd, f+b; ge2/flash")
    for r in rows:
        cells = " ".join(f"{r[c][1]:7.1f} {r[c][0]:7.3f}ms" if c in r else f"{'':>16s}" for c in cols)
        ratio = f"{r['ge2 fwd'][1] / r['cudnn fwd'][1]:.2f}"
        if not args.quick:
            ratio += f", {r['ge2 f+b'][1] / r['cudnn f+b'][1]:.2f}; {r['ge2 fwd'][1] / r['flash fwd'][1]:.2f}" \
                     f", {r['ge2 f+b'][1] / r['flash f+b'][1]:.2f}"
        print(f"{r['shape']:16s} {'causal' if r['causal'] else 'full':6s} {cells}   {ratio}")


if __name__ == "__main__":
    main()
