"""Optimizer steps, norms, dropout, embedding and gradient clipping: ge2 vs torch in one process (issue 6).

    PYTHONPATH=. python3 bench/bench_nn.py            # on a GPU; writes bench/results/nn.json
    PYTHONPATH=. python3 bench/bench_nn.py --smoke    # tiny shapes, each function called once (CPU too)

* AdamW / SGD-momentum step over the parameters of a 12-block GPT-2-small-like stack (85M fp32
  parameters, 120 tensors): ge2's one fused multi-tensor launch vs torch.optim with foreach=True and
  fused=True. All are memory-bound: AdamW reads p, g, m, v and writes p, m, v (28 bytes a
  parameter), so the TB/s column is the figure of merit (H100: ~3 TB/s copy).
* clip_grad_norm_ over the same gradients (norm + scale: 12 bytes a parameter) vs torch (foreach).
* layer_norm / rms_norm forward and layer_norm backward at [8192, 4096] fp32 and bf16.
* batch_norm (training) forward at [64, 256, 28, 28] fp32 vs cuDNN: ge2 reduces each channel in one
  program, so 256 programs for 132 SMs (expected well below torch; see docs/nn.md).
* dropout forward at [8192, 8192] (Philox in the kernel; torch draws a mask with its Philox too).
* embedding forward (gather) and backward (scatter-add) at V=50304, D=1024, 16384 indices.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as TF

import ge2
from ge2.backend import call

PREDICTION = ("memory-bound kernels: expect ge2 AdamW ~= torch fused (one pass, fp32 state), > foreach; "
              "norms/dropout/embedding near torch; batch_norm below cuDNN (one program per channel)")


class Smoke:
    """Stands in for bench.harness.Bench: calls every function once, times nothing."""

    def add(self, labels, *, flops=None, **fns):
        for name, fn in fns.items():
            if fn is not None:
                fn()
        print("ok", labels, flush=True)

    def report(self, **extra):
        print("smoke run: every case executed once")


def _gpt2_shapes(blocks: int, d: int) -> list[tuple[int, ...]]:
    shapes = []
    for _ in range(blocks):
        shapes += [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
        shapes += [(d,), (d,)]  # a layer norm's weight and bias
    return shapes


def optimizer_cases(bench, blocks: int, d: int, device) -> None:
    shapes = _gpt2_shapes(blocks, d)
    numel = sum(torch.Size(s).numel() for s in shapes)
    for name, make_ge2, make_torch, bytes_per in (
        ("adamw", lambda p: ge2.optim.AdamW(p, lr=1e-3), lambda p, **k: torch.optim.AdamW(p, lr=1e-3, **k), 28),
        ("sgd_momentum", lambda p: ge2.optim.SGD(p, lr=1e-2, momentum=0.9),
         lambda p, **k: torch.optim.SGD(p, lr=1e-2, momentum=0.9, **k), 20),
    ):
        gp = [ge2.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
        tp = [p.data.clone().requires_grad_() for p in gp]
        for g, t in zip(gp, tp):
            g.grad = ge2.from_torch(torch.randn(g.shape, device=device))
            t.grad = g.grad.data.clone()
        g_opt = make_ge2(gp)
        t_foreach = make_torch(tp, foreach=True)
        try:
            t_fused = make_torch(tp, fused=True) if device.type == "cuda" else None
        except (RuntimeError, TypeError, ValueError) as e:  # a torch without this fused optimizer
            print(f"  torch fused {name}: {e}")
            t_fused = None
        row = bench.add({"case": f"{name} step", "params": numel, "tensors": len(shapes)},
                        ge2=g_opt.step, torch_foreach=t_foreach.step,
                        torch_fused=t_fused.step if t_fused is not None else None)
        _tbps(row, numel * bytes_per)
    gp = [ge2.nn.Parameter(torch.zeros(s, device=device)) for s in shapes]
    tp = [p.data.clone().requires_grad_() for p in gp]
    for g, t in zip(gp, tp):
        g.grad = ge2.from_torch(torch.randn(g.shape, device=device) * 1e-3)
        t.grad = g.grad.data.clone()
    row = bench.add({"case": "clip_grad_norm_", "params": numel, "tensors": len(shapes)},
                    ge2=lambda: ge2.nn.utils.clip_grad_norm_(gp, 1.0),
                    torch_foreach=lambda: torch.nn.utils.clip_grad_norm_(tp, 1.0, foreach=True))
    _tbps(row, numel * 12)


def _tbps(row, nbytes: int) -> None:
    if not isinstance(row, dict):
        return
    for key in list(row):
        if key.endswith("_ms") and row[key]:
            row[key[:-3] + "_tbps"] = nbytes / row[key] / 1e9


def norm_cases(bench, M: int, N: int, device) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(M, N, device=device, dtype=dtype)
        w, b = torch.randn(N, device=device, dtype=dtype), torch.randn(N, device=device, dtype=dtype)
        gy = torch.randn_like(x)
        _, mean, rstd = call("layer_norm", x, w, b, normalized_shape=(N,), eps=1e-5)
        tx = x.clone().requires_grad_()
        ty = TF.layer_norm(tx, (N,), w, b)
        label = {"shape": f"{M}x{N}", "dtype": str(dtype).replace("torch.", "")}
        row = bench.add({"case": "layer_norm fwd", **label},
                        ge2=lambda: call("layer_norm", x, w, b, normalized_shape=(N,), eps=1e-5),
                        torch=lambda: TF.layer_norm(x, (N,), w, b))
        _tbps(row, 2 * x.numel() * x.element_size())
        row = bench.add({"case": "layer_norm bwd", **label},
                        ge2=lambda: call("layer_norm_backward", gy, x, w, mean, rstd, normalized_shape=(N,)),
                        torch=lambda: torch.autograd.grad(ty, (tx,), gy, retain_graph=True))
        _tbps(row, 3 * x.numel() * x.element_size())
        row = bench.add({"case": "rms_norm fwd", **label},
                        ge2=lambda: call("rms_norm", x, w, normalized_shape=(N,), eps=1e-6),
                        torch=lambda: TF.rms_norm(x, (N,), w, 1e-6))
        _tbps(row, 2 * x.numel() * x.element_size())


def other_cases(bench, device, small: bool) -> None:
    shape = (8, 16, 6, 6) if small else (64, 256, 28, 28)
    x = torch.randn(shape, device=device)
    C = shape[1]
    w, b = torch.randn(C, device=device), torch.randn(C, device=device)
    rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
    row = bench.add({"case": "batch_norm train fwd", "shape": "x".join(map(str, shape))},
                    ge2=lambda: call("batch_norm", x, w, b, rm, rv, None, training=True, momentum=0.1, eps=1e-5),
                    torch=lambda: TF.batch_norm(x, rm, rv, w, b, training=True))
    _tbps(row, 3 * x.numel() * 4)
    n = 64 if small else 8192
    d = torch.randn(n, n, device=device)
    state = torch.tensor([1234, 0], dtype=torch.int64, device=device)
    row = bench.add({"case": "dropout fwd p=0.1", "shape": f"{n}x{n}"},
                    ge2=lambda: call("dropout", d, state, p=0.1), torch=lambda: TF.dropout(d, 0.1))
    _tbps(row, 2 * d.numel() * 4)
    V, D, n_idx = (500, 64, 300) if small else (50304, 1024, 16384)
    table = torch.randn(V, D, device=device)
    idx = torch.randint(0, V, (n_idx,), device=device)
    gy = torch.randn(n_idx, D, device=device)
    row = bench.add({"case": "embedding fwd", "shape": f"V={V} D={D} n={n_idx}"},
                    ge2=lambda: call("embedding", idx, table, check=False), torch=lambda: TF.embedding(idx, table))
    _tbps(row, 2 * n_idx * D * 4)
    tt = table.clone().requires_grad_()
    ty = TF.embedding(idx, tt)
    bench.add({"case": "embedding bwd", "shape": f"V={V} D={D} n={n_idx}"},
              ge2=lambda: call("embedding_backward", gy, idx, num_embeddings=V, dtype=torch.float32),
              torch=lambda: torch.autograd.grad(ty, (tt,), gy, retain_graph=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, each function once, no timing")
    args = parser.parse_args()
    device = ge2.device()
    if args.smoke:
        bench = Smoke()
    else:
        from bench.harness import Bench

        bench = Bench("nn")
    print("prediction:", PREDICTION)
    optimizer_cases(bench, blocks=1 if args.smoke else 12, d=32 if args.smoke else 768, device=device)
    norm_cases(bench, *((16, 40) if args.smoke else (8192, 4096)), device=device)
    other_cases(bench, device, small=args.smoke)
    bench.report(prediction=PREDICTION)


if __name__ == "__main__":
    main()
