"""Time to the first training step with a cold tuning cache vs a warm one (GPU).

Each measurement is a fresh process (so Triton's in-memory tuning is gone) with its own
GE2_CACHE_DIR: the cold run tunes every kernel the step launches and writes the cache; the warm run
reads it and must benchmark nothing. Triton's compiled-kernel cache is shared by both runs, so the
difference is the autotuning alone. Writes bench/results/tuning_cache.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = r"""
import json, time
t0 = time.perf_counter()
import ge2, torch
from ge2 import tuning
ge2.manual_seed(0)
sizes = [784, 1024, 1024, 10]
params = []
for fi, fo in zip(sizes, sizes[1:]):
    params += [ge2.randn(fi, fo, requires_grad=True), ge2.zeros(fo, requires_grad=True)]
x = ge2.randn(512, 784)
onehot = ge2.zeros(512, 10)
onehot.data[:, 3] = 1.0
t_import = time.perf_counter()
h = x
for i in range(0, len(params) - 2, 2):
    h = (h @ params[i] + params[i + 1]).relu()
logits = h @ params[-2] + params[-1]
shifted = logits - logits.amax(1, keepdim=True).detach()
loss = -((shifted - shifted.exp().sum(1, keepdim=True).log()) * onehot).sum(1).mean()
loss.backward()
torch.cuda.synchronize()
t_step = time.perf_counter()
tuners = tuning.ALL_TUNERS
print(json.dumps({"import_s": t_import - t0, "first_step_s": t_step - t_import,
                  "shapes_tuned": sum(len(t.tuned_keys) for t in tuners),
                  "stored_hits": sum(t.stored_hits for t in tuners)}))
"""


def first_step(cache_dir: str) -> dict:
    env = {**os.environ, "GE2_CACHE_DIR": cache_dir, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sys.path.insert(0, ROOT)
    from bench.harness import environment

    with tempfile.TemporaryDirectory() as d:
        first_step(tempfile.mkdtemp())  # compile every kernel once so both runs below find them compiled
        cold = first_step(d)
        warm = first_step(d)
    rows = {"cold": cold, "warm": warm}
    print(f"{'cache':6} {'first step s':>13} {'shapes tuned':>13} {'stored hits':>12}")
    for name, r in rows.items():
        print(f"{name:6} {r['first_step_s']:13.3f} {r['shapes_tuned']:13d} {r['stored_hits']:12d}")
    print(f"speed-up of the first step: {cold['first_step_s'] / warm['first_step_s']:.1f}x")
    result = {"name": "tuning_cache", **environment(), "rows": rows}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "tuning_cache.json"), "w") as f:
        json.dump(result, f, indent=1)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "tuning_cache.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
