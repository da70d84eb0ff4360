"""Optimizer steps, norms, dropout, embedding and gradient clipping: ge2 vs torch in one process (issue 6).

    PYTHONPATH=. python3 bench/bench_nn.py            # on a GPU; writes bench/results/nn.json
    PYTHONPATH=. python3 bench/bench_nn.py --smoke    # tiny shapes, each function called once (CPU too)

* AdamW / SGD-momentum step over the parameters of a 12-block GPT-2-small-like stack (85M fp32
  parameters, 120 tensors): ge2's one fused multi-tensor launch vs torch.optim with foreach=True and
  fused=True. All are memory-bound: AdamW reads p, g, m, v and writes p, m, v (28 bytes a
  parameter), so the TB/s column is the figure of merit (H100: ~3 TB/s copy).
* clip_grad_norm_ over the same gradients (norm + scale: 12 bytes a parameter) vs torch (foreach).
* the same two steps over the char GPT's parameter list (6 blocks, d = 384: 10.7M parameters in 39
  tensors, nanoGPT's two weight-decay groups), timed as CUDA-graph replays (the GPT step is captured;
  eager, both sides would time their host code), torch with fused=True, capturable=True.
* layer_norm / rms_norm forward and layer_norm backward at [8192, 4096] fp32 and bf16, and the GPT's
  rows (bf16 [16384, 384] and [8192, 768], CUDA-graph replays). Byte floor of layer_norm backward:
  read x and gy, write gx (3 * M * N elements) plus 8 bytes a row of mean/rstd; [8192, 4096] bf16 is
  201 MB, 67 us at 3 TB/s.
* batch_norm (training) forward and backward at [64, 256, 28, 28] fp32 vs cuDNN: each channel's
  reduction is split over several programs (partial sums, then a pass that combines them and
  normalises). Byte floor of the forward: read x twice, write y (154 MB, 51 us at 3 TB/s); of the
  backward: read gy and x twice, write gx (257 MB, 86 us).
* dropout forward at [8192, 8192] (Philox in the kernel; torch draws a mask with its Philox too).
* embedding forward (gather) and backward (scatter-add) at V=50304, D=1024, 16384 indices.

    PYTHONPATH=. python3 bench/bench_nn.py --only optim norm        # some groups of rows
    PYTHONPATH=. python3 bench/bench_nn.py --bn [--baseline DIR]  # batch_norm only: launch settings, the
        # baseline's kernels (DIR/norm.py) and torch in one process (bench/results/nn_batch_norm.json)
    PYTHONPATH=. python3 bench/bench_nn.py --sweep [--baseline DIR]  # launch settings of the fused optimizers
        # and the norm tiles side by side (bench/results/nn_sweep.json); DIR holds another checkout's
        # norm.py and optim.py, timed in the same process as "before"
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as TF

import ge2
from ge2.backend import call

PREDICTION = ("memory-bound kernels: expect ge2 AdamW/SGD >= torch fused (chunked sweeps, 16-byte accesses, "
              "~2.8 TB/s), > foreach; layer_norm bwd near its byte floor (x, gy read once, dw/db summed in "
              "registers), >= torch; norms/dropout/embedding near torch; batch_norm fwd/bwd (split reduction, "
              "x read twice) near 2.8 TB/s on 3 / 5 passes over x: ~55 / ~92 us, >= cuDNN")


class Smoke:
    """Stands in for bench.harness.Bench: calls every function once, times nothing."""

    cuda_graph = False

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
        row = bench.add({"case": f"{name} step", "params": numel, "tensors": len(shapes), "timing": "eager"},
                        ge2=g_opt.step, torch_foreach=t_foreach.step,
                        torch_fused=t_fused.step if t_fused is not None else None)
        _tbps(row, numel * bytes_per)
        if t_fused is not None:  # kernel time, as a captured step sees it (eager, both sides time host code too)
            graphed = make_torch(tp, fused=True, **({"capturable": True} if name == "adamw" else {}))
            graph, bench.cuda_graph = bench.cuda_graph, True
            row = bench.add({"case": f"{name} step", "params": numel, "tensors": len(shapes), "timing": "cuda graph"},
                            ge2=g_opt.step, torch_fused=graphed.step)
            bench.cuda_graph = graph
            _tbps(row, numel * bytes_per)
    gp = [ge2.nn.Parameter(torch.zeros(s, device=device)) for s in shapes]
    tp = [p.data.clone().requires_grad_() for p in gp]
    for g, t in zip(gp, tp):
        g.grad = ge2.from_torch(torch.randn(g.shape, device=device) * 1e-3)
        t.grad = g.grad.data.clone()
    row = bench.add({"case": "clip_grad_norm_", "params": numel, "tensors": len(shapes), "timing": "eager"},
                    ge2=lambda: ge2.nn.utils.clip_grad_norm_(gp, 1.0),
                    torch_foreach=lambda: torch.nn.utils.clip_grad_norm_(tp, 1.0, foreach=True))
    _tbps(row, numel * 12)


def _gpt_optimizer_cases(bench, device, small: bool) -> None:
    """AdamW (nanoGPT's decay groups) and SGD-momentum over the char GPT's parameters, as CUDA-graph replays."""
    from ge2.models.gpt import GPT

    d, layers = (16, 2) if small else (384, 6)
    model = GPT(vocab_size=65, block_size=256, n_layer=layers, n_head=2, n_embd=d, dropout=0.0, bias=False,
                device=device)
    gp = list(model.parameters())
    numel = sum(p.numel() for p in gp)
    tp = [p.data.clone().requires_grad_() for p in gp]
    for g, t in zip(gp, tp):
        g.grad = ge2.from_torch(torch.randn(g.shape, device=device))
        t.grad = g.grad.data.clone()
    t_groups = [{"params": [t for t in tp if t.ndim >= 2], "weight_decay": 0.1},
                {"params": [t for t in tp if t.ndim < 2], "weight_decay": 0.0}]
    extra = dict(fused=True, capturable=True) if device.type == "cuda" else {}
    graph, bench.cuda_graph = bench.cuda_graph, device.type == "cuda"
    for name, g_opt, t_opt, bytes_per in (
        ("adamw", model.configure_optimizer(6e-4), torch.optim.AdamW(t_groups, lr=6e-4, betas=(0.9, 0.95), **extra),
         28),
        ("sgd_momentum", ge2.optim.SGD(gp, lr=1e-2, momentum=0.9), torch.optim.SGD(tp, lr=1e-2, momentum=0.9, **(
            dict(fused=True) if device.type == "cuda" else {})), 20),
    ):
        row = bench.add({"case": f"{name} step, char GPT params", "params": numel, "tensors": len(gp),
                         "timing": "cuda graph" if bench.cuda_graph else "eager"},
                        ge2=g_opt.step, torch_fused=t_opt.step)
        _tbps(row, numel * bytes_per)
    bench.cuda_graph = graph


def _tbps(row, nbytes: int) -> None:
    if not isinstance(row, dict):
        return
    for key in list(row):
        if key.endswith("_ms") and row[key]:
            row[key[:-3] + "_tbps"] = nbytes / row[key] / 1e9


def norm_cases(bench, M: int, N: int, device, dtypes=(torch.float32, torch.bfloat16), rms: bool = True) -> None:
    for dtype in dtypes:
        # drawn on the host: the CUDA generator refused draws after the captured torch backward of an
        # earlier row ("Offset increment outside graph capture")
        x, gy = (torch.randn(M, N).to(device=device, dtype=dtype) for _ in range(2))
        w, b = (torch.randn(N).to(device=device, dtype=dtype) for _ in range(2))
        _, mean, rstd = call("layer_norm", x, w, b, normalized_shape=(N,), eps=1e-5)
        tx, tw, tb = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        ty = TF.layer_norm(tx, (N,), tw, tb)
        label = {"shape": f"{M}x{N}", "dtype": str(dtype).replace("torch.", ""),
                 "timing": "cuda graph" if getattr(bench, "cuda_graph", False) else "eager"}
        row = bench.add({"case": "layer_norm fwd", **label},
                        ge2=lambda: call("layer_norm", x, w, b, normalized_shape=(N,), eps=1e-5),
                        torch=lambda: TF.layer_norm(x, (N,), w, b))
        _tbps(row, 2 * x.numel() * x.element_size())
        row = bench.add({"case": "layer_norm bwd", **label},
                        ge2=lambda: call("layer_norm_backward", gy, x, w, mean, rstd, normalized_shape=(N,)),
                        torch=lambda: torch.autograd.grad(ty, (tx, tw, tb), gy, retain_graph=True))
        _tbps(row, 3 * x.numel() * x.element_size())
        if not rms:
            continue
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
    _batch_norm_bwd_row(bench, {"case": "batch_norm train bwd", "shape": "x".join(map(str, shape))}, x, w, b, rm, rv,
                        ge2_bwd=None)
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


def _batch_norm_bwd_row(bench, labels, x, w, b, rm, rv, ge2_bwd):
    """batch_norm backward (training) vs torch autograd; ge2_bwd: a kernels module's batch_norm_bwd (default: call)."""
    gy = torch.randn(x.shape).to(x.device)
    _, mean, rstd = call("batch_norm", x, w, b, rm.clone(), rv.clone(), None, training=True, momentum=0.1, eps=1e-5)
    tx, tw, tb = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    ty = TF.batch_norm(tx, rm.clone(), rv.clone(), tw, tb, training=True)
    if ge2_bwd is None:
        fn = lambda: call("batch_norm_backward", gy, x, w, mean, rstd, training=True)  # noqa: E731
    else:
        fn = lambda: ge2_bwd(gy, x, w, mean, rstd, training=True, need_x=True)  # noqa: E731
    row = bench.add(labels, ge2=fn, torch=lambda: torch.autograd.grad(ty, (tx, tw, tb), gy, retain_graph=True))
    _tbps(row, 3 * x.numel() * x.element_size())


def batch_norm_sweep(device, baseline: str | None, small: bool) -> None:
    """batch_norm fwd/bwd at [64, 256, 28, 28]: the baseline's kernels, each launch setting, torch (one process)."""
    from bench.harness import Bench, load_module
    from ge2.kernels import norm as KN

    bench = Smoke() if small else Bench("nn_batch_norm")
    old = load_module(os.path.join(baseline, "norm.py"), "norm_before") if baseline else None
    default = KN.BN_TILE, KN.BN_PROGRAMS_PER_SM, KN.BN_WARPS
    f32, b16 = torch.float32, torch.bfloat16
    for shape, dtype, layout in ((((8, 16, 6, 6), f32, "nchw"),) if small else
                                 (((64, 256, 28, 28), f32, "nchw"), ((64, 256, 28, 28), b16, "nchw"),
                                  ((64, 256, 28, 28), f32, "nhwc"), ((256, 64, 56, 56), f32, "nchw"),
                                  ((64, 512, 7, 7), f32, "nchw"), ((8192, 1024), f32, "nchw"))):
        x = torch.randn(shape).to(device=device, dtype=dtype)
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
        C = shape[1]
        w, b = torch.randn(C, device=device), torch.randn(C, device=device)
        rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
        if dtype != torch.float32:
            w, b, rm, rv = (t.to(dtype) for t in (w, b, rm, rv))
        label = {"shape": "x".join(map(str, shape)), "dtype": str(dtype).replace("torch.", ""), "layout": layout}
        nbytes = 3 * x.numel() * x.element_size()
        fwd = {"case": "batch_norm train fwd", **label}
        bwd = {"case": "batch_norm train bwd", **label}
        if old is not None:
            _tbps(bench.add({**fwd, "variant": "before"}, ge2=lambda: old.batch_norm_fwd(
                x, w, b, rm, rv, None, training=True, momentum=0.1, eps=1e-5)), nbytes)
            _batch_norm_bwd_row(bench, {**bwd, "variant": "before"}, x, w, b, rm, rv, ge2_bwd=old.batch_norm_bwd)
        # the full sweep (tiles 2048-8192, 4-16 programs per SM, 4 or 8 warps) chose the default; the
        # earlier default (4096, 8, 8) and the runner-up stay as references
        settings = [default] if small or shape != (64, 256, 28, 28) or dtype != torch.float32 or layout != "nchw" else [
            default, (2048, 16, 4), (4096, 8, 8)]
        for tile, per_sm, warps in settings:
            KN.BN_TILE, KN.BN_PROGRAMS_PER_SM, KN.BN_WARPS = tile, per_sm, warps
            variant = {"variant": f"tile {tile} per_sm {per_sm} warps {warps}"}
            _tbps(bench.add({**fwd, **variant}, ge2=lambda: KN.batch_norm_fwd(
                x, w, b, rm, rv, None, training=True, momentum=0.1, eps=1e-5),
                torch=lambda: TF.batch_norm(x, rm, rv, w, b, training=True)), nbytes)
            _batch_norm_bwd_row(bench, {**bwd, **variant}, x, w, b, rm, rv, ge2_bwd=KN.batch_norm_bwd)
        KN.BN_TILE, KN.BN_PROGRAMS_PER_SM, KN.BN_WARPS = default
        if not small:  # kernel time alone (CUDA-graph replays: no host launch cost)
            bench.cuda_graph = True
            _tbps(bench.add({**fwd, "variant": "default, graph"}, ge2=lambda: KN.batch_norm_fwd(
                x, w, b, rm, rv, None, training=True, momentum=0.1, eps=1e-5),
                torch=lambda: TF.batch_norm(x, rm, rv, w, b, training=True)), nbytes)
            bench.cuda_graph = False
    _profile_batch_norm(device)
    bench.report()


def _kernel_table(title: str, fn, rows: int) -> None:
    """Print the CUDA-time table of 10 calls of fn (after 3 warm-up calls) under ``title``."""
    from bench.harness import profile_calls

    prof = profile_calls(fn, 10, warmup=3)
    print(f"--- {title}, 10 calls")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows))


def _profile_batch_norm(device) -> None:
    """Kernel table (CUDA time) of ge2's and torch's batch_norm forward at two shapes."""
    if device.type != "cuda":
        return
    for shape in ((64, 256, 28, 28), (64, 512, 7, 7)):
        x = torch.randn(shape, device=device)
        C = shape[1]
        w, rm, rv = torch.randn(C, device=device), torch.zeros(C, device=device), torch.ones(C, device=device)
        for name, fn in (("ge2", lambda: call("batch_norm", x, w, w, rm, rv, None, training=True)),
                         ("torch", lambda: TF.batch_norm(x, rm, rv, w, w, training=True))):
            _kernel_table(f"{name} batch_norm fwd {shape}", fn, 6)


def sweep(device, baseline: str | None, small: bool) -> None:
    """Time the fused optimizers and layer_norm backward under each launch setting (and the baseline's kernels)."""
    from bench.harness import Bench, load_module
    from ge2.kernels import norm as KN
    from ge2.kernels import optim as KO

    bench = Smoke() if small else Bench("nn_sweep", rep_ms=50)
    old_o = load_module(os.path.join(baseline, "optim.py"), "optim_before") if baseline else None
    old_n = load_module(os.path.join(baseline, "norm.py"), "norm_before") if baseline else None
    for label, shapes in ((("tiny", _gpt2_shapes(1, 32)),) if small else
                          (("85M", _gpt2_shapes(12, 768)), ("char GPT", _gpt2_shapes(6, 384)))):
        params = [torch.randn(s, device=device) for s in shapes]
        grads = [torch.randn(s, device=device) for s in shapes]
        ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        numel = sum(p.numel() for p in params)
        hyper = ge2.optim.AdamW([ge2.nn.Parameter(params[0])], lr=1e-3)._sync_hyper()
        groups = [0] * len(params)

        def adam(mod):
            return lambda: mod.adam_step(hyper, params, grads, ms, vs, groups, decoupled=True)

        def sgd(mod):
            return lambda: mod.sgd_step(hyper, params, grads, ms, groups, has_momentum=True, nesterov=False)

        for case, fn, nbytes in (("adamw", adam, 28), ("sgd_momentum", sgd, 20)):
            if old_o is not None:
                _tbps(bench.add({"case": f"{case} {label}", "variant": "before"}, ge2=fn(old_o)), numel * nbytes)
            for block, warps in ((1024, 4),) if small else ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
                for chunk in (16384, 65536):
                    for per_sm in (4, 8, 16):
                        KO.BLOCK, KO.NUM_WARPS, KO.MAX_CHUNK, KO.PROGRAMS_PER_SM = block, warps, chunk, per_sm
                        _tbps(bench.add({"case": f"{case} {label}", "variant": f"block {block} warps {warps} chunk "
                                         f"{chunk} per_sm {per_sm}"}, ge2=fn(KO)), numel * nbytes)
        KO.BLOCK, KO.NUM_WARPS, KO.MAX_CHUNK, KO.PROGRAMS_PER_SM = 1024, 4, 65536, 8
    for M, N in ((20, 40),) if small else ((8192, 4096), (16384, 384), (8192, 768)):
        x, gy = (torch.randn(M, N).to(device=device, dtype=torch.bfloat16) for _ in range(2))
        w = torch.randn(N).to(device=device, dtype=torch.bfloat16)
        _, mean, rstd = call("layer_norm", x, w, w, normalized_shape=(N,), eps=1e-5)
        case = {"case": f"layer_norm bwd {M}x{N} bf16"}
        nbytes = 3 * x.numel() * 2
        bench.cuda_graph = True
        if old_n is not None:
            _tbps(bench.add({**case, "variant": "before"}, ge2=lambda: old_n.row_norm_bwd(
                gy, x, N, w, mean, rstd, rms=False, need_x=True, need_weight=True, need_bias=True)), nbytes)
        for tile in (4096,) if small else (2048, 4096, 8192):
            for per_sm in (1, 2, 4):
                KN.TILE, KN.BWD_PROGRAMS_PER_SM = tile, per_sm
                _tbps(bench.add({**case, "variant": f"tile {tile} per_sm {per_sm}"}, ge2=lambda: KN.row_norm_bwd(
                    gy, x, N, w, mean, rstd, rms=False, need_x=True, need_weight=True, need_bias=True)), nbytes)
        KN.TILE, KN.BWD_PROGRAMS_PER_SM = 4096, 2
        # the parts: the tile kernel alone, sum_partials alone (its partials as the default launch makes them)
        KN.row_norm_bwd(gy, x, N, w, mean, rstd, rms=False, need_x=True, need_weight=True, need_bias=True)
        programs = max(1, min(triton_cdiv(M, KN._tile_m(M, KN._block_n(N))), 2 * KN._sm_count(x.device)))
        part = torch.empty(programs, 2 * N, device=device)
        out = torch.empty(2 * N, device=device, dtype=torch.bfloat16)
        _tbps(bench.add({**case, "variant": f"sum_partials alone [{programs}, {2 * N}]"},
                        ge2=lambda: KN.sum_partials(part, out)), part.numel() * 4)
        for kind, fwd in (("ge2 fwd", lambda: call("layer_norm", x, w, w, normalized_shape=(N,), eps=1e-5)),
                          ("torch fwd", lambda: TF.layer_norm(x, (N,), w, w))):
            _tbps(bench.add({"case": f"layer_norm fwd {M}x{N} bf16", "variant": kind}, ge2=fwd), 2 * x.numel() * 2)
        bench.cuda_graph = False
    _profile(device)
    bench.report()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _profile(device) -> None:
    """Kernel table (CUDA time) of torch's and ge2's layer_norm backward at 8192x4096 bf16."""
    if device.type != "cuda":
        return
    M, N = 8192, 4096
    x, gy = (torch.randn(M, N).to(device=device, dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(N).to(device=device, dtype=torch.bfloat16)
    tx, tw, tb = x.clone().requires_grad_(), w.clone().requires_grad_(), w.clone().requires_grad_()
    ty = TF.layer_norm(tx, (N,), tw, tb)
    _, mean, rstd = call("layer_norm", x, w, w, normalized_shape=(N,), eps=1e-5)
    for name, fn in (("torch", lambda: torch.autograd.grad(ty, (tx, tw, tb), gy, retain_graph=True)),
                     ("ge2", lambda: call("layer_norm_backward", gy, x, w, mean, rstd, normalized_shape=(N,)))):
        _kernel_table(f"{name} layer_norm backward {M}x{N} bf16", fn, 8)


GROUPS = ("optim", "gpt_optim", "norm", "gpt_norm", "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, each function once, no timing")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS), help="groups of rows to run")
    parser.add_argument("--sweep", action="store_true", help="launch settings side by side (nn_sweep.json)")
    parser.add_argument("--baseline", help="with --sweep: a folder with another checkout's norm.py and optim.py")
    parser.add_argument("--bn", action="store_true", help="batch_norm only (nn_batch_norm.json; --baseline: norm.py)")
    args = parser.parse_args()
    device = ge2.device()
    if args.bn:
        batch_norm_sweep(device, args.baseline, small=args.smoke)
        return
    if args.sweep:
        sweep(device, args.baseline, small=args.smoke)
        return
    if args.smoke:
        bench = Smoke()
    else:
        from bench.harness import Bench

        bench = Bench("nn")
    print("prediction:", PREDICTION)
    if "norm" in args.only:
        norm_cases(bench, *((16, 40) if args.smoke else (8192, 4096)), device=device)
    if "other" in args.only:
        other_cases(bench, device, small=args.smoke)
    # the rows with CUDA-graph timings last (see norm_cases)
    if "optim" in args.only:
        optimizer_cases(bench, blocks=1 if args.smoke else 12, d=32 if args.smoke else 768, device=device)
    if "gpt_optim" in args.only:
        _gpt_optimizer_cases(bench, device, small=args.smoke)
    if "gpt_norm" in args.only:
        graph, bench.cuda_graph = bench.cuda_graph, device.type == "cuda"
        for M, N in ((16384, 384), (8192, 768)) if not args.smoke else ((20, 24),):
            norm_cases(bench, M, N, device, dtypes=(torch.bfloat16,), rms=False)
        bench.cuda_graph = graph
    bench.report(prediction=PREDICTION)


if __name__ == "__main__":
    main()
