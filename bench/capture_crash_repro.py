"""The bench_train --only repeat crash (docs/capture.md), reproduced piece by piece on a GPU.

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python3 bench/capture_crash_repro.py MODE [tg] [dobench] [nosingle]

The repeat rows' ge2 sequence: two MLP copies, a repeat=16 graph captured, then the one-step graph's
warm-ups and capture (``nosingle``: a forced cache emptying instead), then repeat replays. ``tg``
first captures torch's graph of the torch twin, as the bench did; ``dobench`` times the repeat graph
with do_bench. MODE: ``bench`` (as is), ``noempty`` / ``nohostempty`` (torch's cache emptying before a
capture disabled), ``keepall`` (the graph keeps every tensor its launches were given), ``diag`` (where
every address the repeat graph's launches and optimizer tables point to lies after the second capture).
"""
import gc
import sys
import torch
sys.path.insert(0, ".")
import ge2
from ge2 import graphs
from bench import bench_train as bt

mode = sys.argv[1]
flags = set(sys.argv[2:])  # tg: a torch graph captured first, as the bench does; dobench: time as the bench does
n, batch = 16, 64
if mode == "noempty":
    torch.cuda.empty_cache = lambda: None
if mode == "nohostempty":
    torch._C._host_emptyCache = lambda: None


def after_each_capture(after) -> None:
    """Wrap graphs.CapturedStep._capture: after(step, graph, recorders) sees what each capture launched."""
    capture = graphs.CapturedStep._capture

    def wrapped(self, items, warm):
        made = []
        init0 = graphs._Launches.__init__

        def init(rec):
            init0(rec)
            made.append(rec)

        graphs._Launches.__init__ = init
        try:
            graph, fingerprint = capture(self, items, warm)
        finally:
            graphs._Launches.__init__ = init0
        after(self, graph, made)
        return graph, fingerprint

    graphs.CapturedStep._capture = wrapped


def keep_all(step, graph, made) -> None:
    """Candidate fix: the graph keeps every tensor its launches were given."""
    graph.keep.extend(values for rec in made for _, _, values in rec.launches)


records = []


def addresses(step, graph, made) -> None:
    """Every address the repeat graph's launches (and optimizer tables) point to, for ``diag``."""
    torch.cuda.synchronize()
    if step.repeat == 1:
        return
    for rec in made:
        for k, plan, values in rec.launches:
            if k is None:
                continue
            name = graphs._kernel_name(k).split(".")[-1]
            addrs = []
            for j, v in enumerate(values):
                if isinstance(v, torch.Tensor):
                    addrs.append((j, v.data_ptr()))
                elif type(v) is int and v > (1 << 32):
                    addrs.append((j, v))
                elif hasattr(v, "base") and hasattr(v.base, "data_ptr"):
                    addrs.append((j, v.base.data_ptr()))
            if "optim" in graphs._kernel_name(k) or "sgd" in name:
                t = values[0]
                if isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.dim() == 2:
                    for row in t.cpu().tolist():
                        addrs += [("table", c) for c in row[:4] if c]
            records.append((name, addrs))


if mode == "keepall":
    after_each_capture(keep_all)
if mode == "diag":
    after_each_capture(addresses)

(ref, mine, shape), (_, mine2, _) = bt.mlp_pair(), bt.mlp_pair()
dev = ge2.device()
ref, mine, mine2 = ref.to(dev), mine.to(dev), mine2.to(dev)
bt.copy_weights(ref, mine); bt.copy_weights(ref, mine2)
g = torch.Generator().manual_seed(batch)
xs = torch.randn(n, batch, *shape, generator=g).to(dev)
ys = torch.randint(0, 10, (n, batch), generator=g).to(dev)
single, repeated = ge2.capture(bt.ge2_sgd_step(mine)), ge2.capture(bt.ge2_sgd_step(mine2), repeat=n)
gx, gy = ge2.from_torch(xs), ge2.from_torch(ys)
singles = [(ge2.from_torch(x), ge2.from_torch(y)) for x, y in zip(xs, ys)]
if "tg" in flags:
    t_replay = bt._torch_graph(bt.torch_sgd_step(ref)[0], list(zip(xs, ys)), [0])
    torch.cuda.synchronize()
    print(mode, "torch graph captured", flush=True)
for _ in range(3):
    repeated(gx, gy)
torch.cuda.synchronize()
print(mode, "repeat captured", repeated, flush=True)


def classify(addr):
    for seg in torch.cuda.memory_snapshot():
        base, size = seg["address"], seg["total_size"]
        if base <= addr < base + size:
            off = base
            for b in seg["blocks"]:
                if off <= addr < off + b["size"]:
                    return f"{b['state']} pool={seg.get('segment_pool_id')}"
                off += b["size"]
            return "in segment, no block?"
    return "UNMAPPED"


if "nosingle" in flags:
    torch.cuda.synchronize(); gc.collect(); torch.cuda.empty_cache(); torch._C._host_emptyCache()
else:
    for _ in range(3):
        for x, y in singles:
            single(x, y)
    torch.cuda.synchronize()
    print(mode, "single captured", single, flush=True)
if mode == "diag":
    gc.collect()
    bad = {}
    for name, addrs in records:
        for j, a in addrs:
            c = classify(a)
            if not (c.startswith("active_allocated") or c.startswith("inactive pool=(1, 0)")):
                bad.setdefault((name, j, c), 0)
                bad[(name, j, c)] += 1
            bad.setdefault(("ALL", c), 0)
            bad[("ALL", c)] += 1
    print("launches recorded:", len(records), "pools:", sorted({str(s.get('segment_pool_id')) for s in torch.cuda.memory_snapshot()}))
    for k, v in sorted(bad.items(), key=str):
        print("  NOT LIVE:", k, "x", v)
    print("diag done", flush=True)
if "dobench" in flags:
    from bench.harness import time_ms
    print(mode, "do_bench repeat ms", time_ms(lambda: repeated(gx, gy), 50, 100), flush=True)
for i in range(3):
    repeated(gx, gy)
    torch.cuda.synchronize()
    print(mode, "repeat replay", i, "ok", flush=True)
if "tg" in flags:
    t_replay()
    torch.cuda.synchronize()
    print(mode, "torch replay ok", flush=True)
diff = max(((p.data - q.data).abs().max() / q.data.abs().max()).item() for p, q in zip(mine2.parameters(), mine.parameters()))
print(mode, "RESULT OK", diff, flush=True)
