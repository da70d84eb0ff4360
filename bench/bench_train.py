"""ms per training step, ge2 eager and captured vs torch eager, torch CUDA graph and torch.compile.

    PYTHONPATH=. python3 bench/bench_train.py              # on a GPU; writes bench/results/train_step.json
    PYTHONPATH=. python3 bench/bench_train.py --only gpt   # the GPT rows; writes bench/results/train_step_gpt.json
    PYTHONPATH=. python3 bench/bench_train.py --only repeat  # MLP b64, ge2.capture(repeat=16) per-step rows
    PYTHONPATH=. python3 bench/bench_train.py --only cnn [--tf32] --no-compile  # CNN rows: train_step_cnn[_tf32].json
    PYTHONPATH=. python3 bench/bench_train.py --smoke      # tiny shapes, each variant run once (CPU too)

GPT rows: one nanoGPT training step (forward, loss, backward, AdamW with nanoGPT's decay groups) in
bf16 autocast on both sides from the same fp32 weights: ge2's GPT (flash attention, gelu fused into
c_fc's GEMM, fused linear + cross-entropy loss, its multi-tensor AdamW) against the same model in
torch (``bench/torch_gpt.py``: SDPA, full logits + cross-entropy, ``AdamW(fused=True)``; the CUDA
graph variant ``capturable=True`` and autocast without its weight cache, as torch requires inside a
graph). Two sizes: nanoGPT's shakespeare-char (6 layers, 6 heads, width 384, block 256, batch 64,
vocab 65) and GPT-2 small (12/12/768, block 1024, batch 8, vocab 50304). Rows give ms, tokens/s
and MFU (model FLOPs 6N + 12 L C T per token over the GPU's dense bf16 peak).

One step = forward, cross-entropy loss, backward, SGD momentum (0.9) step, on synthetic batches
(four random batches cycled, the same for every variant). Models: MLP 784-1024-1024-10 (ReLU) at
batch 64, 512, 4096; CNN conv3x3 1->32, relu, maxpool, conv3x3 32->64, relu, maxpool, fc 3136->128,
relu, fc 128->10 on 1x28x28 at batch 64 and 512. ge2 fuses bias+ReLU into its GEMM and conv
epilogues (its layers' ``activation="relu"``), torch runs its usual modules.

fp32 everywhere with fp32-accurate matmuls and convolutions on both sides: ge2's default "tf32x3"
(error-compensated tf32, at least as accurate as cuBLAS SGEMM: docs/gemm.md) against torch's
default with TF32 off for cuBLAS and cuDNN. ``--ieee`` runs ge2's CUDA-core fp32 path instead,
``--tf32`` switches both sides to one-pass TF32. Variants: torch eager; torch CUDA graph of the whole step (static batch, warm-up on a side
stream, as in torch's documentation); torch.compile of the forward+loss (backward and optimizer
eager; compiling takes ~a minute per shape, so only the target shapes unless ``--compile-all``);
ge2 eager; ge2.capture. Medians of ``triton.testing.do_bench``: for host-bound steps the events
measure the host's launch time, which is the point. The variants of a row take turns over five
rounds and report the median round: the device host's speed drifts by tens of percent within a
minute, and a drift then reaches every variant alike.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ge2  # noqa: E402
import ge2.nn as gnn  # noqa: E402
import ge2.nn.functional as gF  # noqa: E402
from bench.harness import Bench  # noqa: E402
from bench.torch_gpt import TorchGPT  # noqa: E402
from ge2.models import GPT  # noqa: E402
from ge2.train_gpt import peak_flops  # noqa: E402

PREDICTION = ("eager steps are host-bound: a replayed ge2 op costs ~10 us of host time (call plan: C key, "
              "allocation, ge2_native launch) vs torch's ~8-10, but ge2 runs fewer ops per step (fused bias/act epilogues, fused CE); "
              "captured MLP b512: tf32x3 GEMMs measured ~23-37 us each (~165 us for the step's 7 large ones) + ~40 us "
              "of fused CE / bias-grad / SGD kernels = ~0.21 ms vs torch graph 0.32 ms (cuBLAS SGEMM ~30-40 us "
              "each); b4096: ~0.8 ms vs 1.09 ms; CNN b64 is decided by the conv kernels (issue 5)")

GPT_PREDICTION = ("GPT steps, captured. shakespeare-char: 1.16 TFLOP per step (6N + 12LCT per token, 16k tokens), "
                  "K = 384 GEMMs at ~350 TFLOP/s -> ~3.3 ms, plus ~1.5 GB of LayerNorm/residual/embedding/AdamW "
                  "traffic at ~2.5 TB/s -> ~0.6 ms: ~4-5 ms vs torch graph 8.2 (MFU ~14%). GPT-2 small: 7.0 TFLOP "
                  "(the 50304-wide head is 1.9 of it) at ~500 TFLOP/s -> 14 ms + ~2 ms of memory passes: ~16 ms vs "
                  "torch.compile 22.5")
LR, MOMENTUM = 0.01, 0.9


def mlp_pair():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    mine = gnn.Sequential(gnn.Linear(784, 1024, activation="relu"), gnn.Linear(1024, 1024, activation="relu"),
                          gnn.Linear(1024, 10))
    return ref, mine, (784,)


class _Image(gnn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], 1, 28, 28)


def cnn_pair():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(3136, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    mine = gnn.Sequential(
        gnn.Conv2d(1, 32, 3, padding=1, activation="relu"), gnn.MaxPool2d(2),
        gnn.Conv2d(32, 64, 3, padding=1, activation="relu"), gnn.MaxPool2d(2),
        gnn.Flatten(), gnn.Linear(3136, 128, activation="relu"), gnn.Linear(128, 10))
    return ref, mine, (1, 28, 28)


def copy_weights(ref: torch.nn.Module, mine: gnn.Module) -> None:
    """Same initial weights on both sides (ge2 parameters hold torch memory)."""
    ref_params = [p for p in ref.parameters()]
    mine_params = list(mine.parameters())
    assert len(ref_params) == len(mine_params)
    for r, m in zip(ref_params, mine_params):
        m.data.copy_(r.data.reshape(m.shape))


GPT_CONFIGS = {
    "gpt-char": (dict(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384), 64),
    "gpt2-small": (dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768), 8),
}
GPT_SMOKE = (dict(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=16), 2)
GPT_LR = 6e-4


def gpt_pair(cfg: dict):
    """ge2's GPT and torch's twin holding the same fp32 weights (nanoGPT's init, no dropout, no biases as
    nanoGPT's train.py)."""
    ge2.manual_seed(0)
    mine = GPT(**cfg, dropout=0.0, bias=False)
    ref = TorchGPT(**cfg, dropout=0.0, bias=False).to(mine.lm_head.weight.device)
    ref.load_state_dict({k: v.data for k, v in mine.state_dict().items()})
    return ref, mine


def _cycle(step, batches, it):
    """A zero-argument call of step on the next batch in turn (it: the position, shared by a row's variants)."""
    def run():
        it[0] += 1
        return step(*batches[it[0] % len(batches)])
    return run


def torch_gpt_variants(model: TorchGPT, batches, compile_it: bool):
    """torch eager, whole-step CUDA graph and torch.compile steps of a bf16-autocast GPT."""
    it = [0]

    def make_step(forward, opt, cache: bool):
        def step(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache):
                _, loss = forward(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss
        return step

    eager_step = make_step(model, model.configure_optimizer(GPT_LR, fused=True), True)
    graph_step = make_step(model, model.configure_optimizer(GPT_LR, fused=True, capturable=True), False)

    eager = _cycle(eager_step, batches, it)
    replay = _torch_graph(graph_step, batches, it)
    compiled = None
    if compile_it:
        compiled = _cycle(make_step(torch.compile(model), model.configure_optimizer(GPT_LR, fused=True), True),
                          batches, it)
        compiled()  # compile outside the timing
    return eager, replay, compiled


def ge2_gpt_variants(model: GPT, batches):
    """ge2 eager and captured steps of a bf16-autocast GPT."""
    opt = model.configure_optimizer(GPT_LR)

    def step(x, y):
        with ge2.autocast(x.device.type, dtype=torch.bfloat16):
            _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return _ge2_runners(step, batches)


def _torch_graph(step, batches, it):
    """The whole step as one CUDA graph, as in torch's "whole network capture" recipe; returns replay()."""
    sx, sy = batches[0][0].clone(), batches[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(sx, sy)

    def replay():
        it[0] += 1
        x, y = batches[it[0] % len(batches)]
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()
        return static_loss

    return replay


def _ge2_runners(step, batches):
    """(eager, replay, captured) over ge2 copies of the batches; the capture is made before timing."""
    gbatches = [(ge2.from_torch(x), ge2.from_torch(y)) for x, y in batches]
    it = [0]
    captured = ge2.capture(step)

    eager, replay = _cycle(step, gbatches, it), _cycle(captured, gbatches, it)
    for _ in range(3):
        replay()  # two warm-up steps and the capture
    return eager, replay, captured


def torch_sgd_step(model: torch.nn.Module):
    """torch's training step of ``model`` (as ge2_sgd_step): (step(x, y) -> loss, its optimizer)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, opt


def torch_variants(model: torch.nn.Module, batches, compile_it: bool):
    step, opt = torch_sgd_step(model)
    it = [0]
    eager = _cycle(step, batches, it)
    replay = _torch_graph(step, batches, it)
    compiled = None
    if compile_it:
        fwd = torch.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y))

        def compiled_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = fwd(x, y)
            loss.backward()
            opt.step()
            return loss

        compiled = _cycle(compiled_step, batches, it)
        compiled()  # compile outside the timing
    return eager, replay, compiled


def ge2_sgd_step(model: gnn.Module):
    """One ge2 training step (forward, cross-entropy, backward, SGD momentum) of ``model``: step(x, y) -> loss."""
    opt = ge2.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step(x, y):
        opt.zero_grad()
        loss = gF.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def ge2_variants(model: gnn.Module, batches):
    return _ge2_runners(ge2_sgd_step(model), batches)


def repeat_rows(n: int = 16, batch: int = 64) -> None:
    """MLP b64, ms per step: ge2.capture(repeat=n) (n steps from one graph launch, batches from a device
    stack) vs n single ge2 replays vs n replays of torch's CUDA graph of the step; bench/results/train_step_repeat.json."""
    bench = Bench("train_step_repeat", warmup_ms=50, rep_ms=100, rounds=5)
    (ref, mine, shape), (_, mine2, _) = mlp_pair(), mlp_pair()
    device = ge2.device()
    ref, mine, mine2 = ref.to(device), mine.to(device), mine2.to(device)
    copy_weights(ref, mine)
    copy_weights(ref, mine2)
    g = torch.Generator().manual_seed(batch)
    xs = torch.randn(n, batch, *shape, generator=g).to(device)
    ys = torch.randint(0, 10, (n, batch), generator=g).to(device)
    single, repeated = ge2.capture(ge2_sgd_step(mine)), ge2.capture(ge2_sgd_step(mine2), repeat=n)
    gx, gy = ge2.from_torch(xs), ge2.from_torch(ys)
    singles = [(ge2.from_torch(x), ge2.from_torch(y)) for x, y in zip(xs, ys)]

    def ge2_repeat():
        return repeated(gx, gy)

    def ge2_single():
        for x, y in singles:
            single(x, y)

    for name, fn in (("ge2_repeat", ge2_repeat), ("ge2_single", ge2_single)):
        for _ in range(3):
            fn()  # two warm-up calls and the capture
        torch.cuda.synchronize()
        print(f"  {name}: warmed up and captured", flush=True)
    t_replay = _torch_graph(torch_sgd_step(ref)[0], list(zip(xs, ys)), [0])

    def torch_graph():
        for _ in range(n):
            t_replay()
    # the same 48 steps on the same batches from the same weights: equal up to fp32 rounding
    diff = max(((p.data - q.data).abs().max() / q.data.abs().max()).item()
               for p, q in zip(mine2.parameters(), mine.parameters()))
    row = bench.add({"model": "mlp", "batch": batch, "steps_per_call": n}, ge2_repeat=ge2_repeat,
                    ge2_single=ge2_single, torch_graph=torch_graph)
    row["params_rel_diff_repeat_vs_single"] = diff
    assert single.captures == 1 and repeated.captures == 1, (single, repeated)
    for key in ("ge2_repeat", "ge2_single", "torch_graph"):
        if row[f"{key}_ms"] is None:
            print(f"  {key} failed: {row.get(key + '_error')}", flush=True)
            continue
        row[f"{key}_ms_per_step"] = row[f"{key}_ms"] / n
    if row.get("ge2_repeat_ms") and row.get("torch_graph_ms") and row.get("ge2_single_ms"):
        row["ge2_repeat_over_torch_graph"] = row["ge2_repeat_ms"] / row["torch_graph_ms"]
        row["ge2_repeat_over_ge2_single"] = row["ge2_repeat_ms"] / row["ge2_single_ms"]
        print(f"  per step: ge2 repeat={n} {row['ge2_repeat_ms_per_step']:.4f} ms, ge2 single replays "
              f"{row['ge2_single_ms_per_step']:.4f} ms, torch graph {row['torch_graph_ms_per_step']:.4f} ms "
              f"(params after 48 steps: rel diff {diff:.2e})", flush=True)
    bench.report(note="*_ms: n steps (one call of repeat=n, n single replays, n torch graph replays); *_ms_per_step: / n")


def _ratios(row: dict) -> None:
    if row.get("ge2_graph_ms") and row.get("torch_graph_ms"):
        row["ge2_graph_over_torch_graph"] = row["ge2_graph_ms"] / row["torch_graph_ms"]
    if row.get("ge2_ms") and row.get("torch_ms"):
        row["ge2_eager_over_torch_eager"] = row["ge2_ms"] / row["torch_ms"]
    print(f"  ge2 captured / torch graph = {row.get('ge2_graph_over_torch_graph', float('nan')):.2f}   "
          f"ge2 eager / torch eager = {row.get('ge2_eager_over_torch_eager', float('nan')):.2f}", flush=True)


def gpt_rows(bench: Bench | None, smoke: bool, compile_it: bool) -> None:
    """The GPT rows: ms per step, tokens/s and MFU of every variant."""
    device = ge2.device()
    for name, (cfg, batch) in ({"gpt-smoke": GPT_SMOKE} if smoke else GPT_CONFIGS).items():
        ref, mine = gpt_pair(cfg)
        T = cfg["block_size"]
        g = torch.Generator().manual_seed(T)
        batches = [tuple(torch.randint(0, cfg["vocab_size"], (batch, T), generator=g).to(device) for _ in range(2))
                   for _ in range(4)]
        g_eager, g_replay, captured = ge2_gpt_variants(mine, batches)
        if bench is None:  # smoke: run everything once
            g_eager(), g_replay()
            print("ok", name, batch, flush=True)
            continue
        t_eager, t_replay, t_compiled = torch_gpt_variants(ref, batches, compile_it)
        row = bench.add({"model": name, "batch": batch, "block": T}, ge2=g_eager, ge2_graph=g_replay,
                        torch=t_eager, torch_graph=t_replay, torch_compile=t_compiled)
        assert captured.captures == 1, captured  # every timed replay reused the one graph
        tokens, flops = batch * T, mine.flops_per_token(T) * batch * T
        peak = peak_flops(device, "bf16")
        for key in ("ge2", "ge2_graph", "torch", "torch_graph", "torch_compile"):
            if row.get(f"{key}_ms"):
                row[f"{key}_tokens_per_s"] = tokens / (row[f"{key}_ms"] * 1e-3)
                row[f"{key}_tflops"] = flops / (row[f"{key}_ms"] * 1e-3) / 1e12
                if peak:
                    row[f"{key}_mfu"] = flops / (row[f"{key}_ms"] * 1e-3) / peak
        best = min(row[f"{k}_ms"] for k in ("torch", "torch_graph", "torch_compile") if row.get(f"{k}_ms"))
        row["ge2_graph_over_torch_best"] = row["ge2_graph_ms"] / best
        print(f"  {name}: ge2 captured {row['ge2_graph_ms']:.2f} ms = {row['ge2_graph_over_torch_best']:.2f}x torch's "
              f"best ({best:.2f} ms), MFU {100 * row.get('ge2_graph_mfu', float('nan')):.1f}%", flush=True)
        _ratios(row)
        del ref, mine, batches, g_eager, g_replay, captured, t_eager, t_replay, t_compiled
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny batches, each variant once (CPU too)")
    ap.add_argument("--only", choices=("mlp-cnn", "cnn", "gpt", "repeat"), default=None, help="only these rows")
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls/convs on both sides (MLP/CNN rows)")
    ap.add_argument("--ieee", action="store_true", help="ge2's CUDA-core fp32 matmuls (torch: fp32 as usual)")
    ap.add_argument("--compile-all", action="store_true", help="torch.compile every shape, not only the targets")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    cases = [("mlp", 64), ("mlp", 512), ("mlp", 4096), ("cnn", 64), ("cnn", 512)]
    targets = {("mlp", 512), ("cnn", 64)}
    if args.smoke:
        cases = [("mlp", 4), ("cnn", 2)]
    if args.only in ("gpt", "repeat"):
        cases = []
    if args.only == "cnn":
        cases = [case for case in cases if case[0] == "cnn"]
    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("bench_train: needs a GPU (use --smoke on the CPU)")
    cuda = torch.cuda.is_available()
    device = ge2.device()
    precision = "tf32" if args.tf32 else "ieee" if args.ieee else ge2.get_matmul_precision()
    ge2.set_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    if args.only != "gpt" and cases:
        bench = Bench("train_step" + ("_cnn" if args.only == "cnn" else "")
                      + ("" if precision == "tf32x3" else "_" + precision), warmup_ms=50, rep_ms=100, rounds=5)
        print(PREDICTION)
        for model_name, batch in cases:
            ref, mine, shape = (mlp_pair if model_name == "mlp" else cnn_pair)()
            ref, mine = ref.to(device), mine.to(device)
            copy_weights(ref, mine)
            g = torch.Generator().manual_seed(batch)
            batches = [(torch.randn(batch, *shape, generator=g).to(device),
                        torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(4)]
            g_eager, g_replay, captured = ge2_variants(mine, batches)
            if not cuda:  # smoke: run everything once
                g_eager(), g_replay()
                print("ok", model_name, batch, flush=True)
                continue
            t_eager, t_replay, t_compiled = torch_variants(
                ref, batches, compile_it=not args.no_compile and (args.compile_all or (model_name, batch) in targets))
            row = bench.add({"model": model_name, "batch": batch}, ge2=g_eager, ge2_graph=g_replay, torch=t_eager,
                            torch_graph=t_replay, torch_compile=t_compiled)
            assert captured.captures == 1, captured  # every timed replay reused the one graph
            _ratios(row)
        if cuda:
            bench.report(prediction=PREDICTION, precision=precision)
    if args.only in (None, "repeat") and cuda:
        repeat_rows()
    if args.only in (None, "gpt"):
        ge2.set_matmul_precision("tf32x3")  # fp32 leftovers outside autocast keep fp32 accuracy
        print(GPT_PREDICTION)
        bench = Bench("train_step_gpt", warmup_ms=50, rep_ms=200, rounds=5) if cuda else None
        gpt_rows(bench, args.smoke, compile_it=not args.no_compile)
        if bench is not None:
            bench.report(prediction=GPT_PREDICTION, precision="bf16 autocast")


if __name__ == "__main__":
    main()
