"""Persisted autotuning: the store round-trips across processes, and bad entries are ignored.

Tuning itself needs a GPU; here a fake timer (``do_bench``) decides which config wins, and the
kernel runs on whatever device ge2 uses, so the selection and persistence logic is exercised on CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ge2 import tuning
import triton  # noqa: E402  (after ge2, which decides TRITON_INTERPRET)
import triton.language as tl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process that builds a 3-config PersistentAutotuner directly (runtime.autotune pins one config
# under the interpreter), runs it on n elements and prints what happened as JSON.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, triton, triton.language as tl
    import ge2
    from ge2 import tuning

    @triton.jit
    def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)

    blocks = [int(b) for b in os.environ["BLOCKS"].split(",")]
    fastest = int(os.environ["FASTEST"])
    calls = []

    def fake_bench(kernel_call, quantiles):
        if os.environ.get("FORBID_TUNING"):
            raise AssertionError("benchmarked although the store had the config")
        kernel_call()
        block = tuner.nargs_block[-1]
        calls.append(block)
        t = 1.0 if block == fastest else 2.0 + block / 1000
        return [t, t, t]

    configs = [triton.Config({"BLOCK": b}, num_warps=1) for b in blocks]
    prune = {"early_config_prune": lambda cfgs, nargs, **kw: cfgs[:1]} if os.environ.get("PRUNE_TO_ONE") else None
    tuner = tuning.PersistentAutotuner(scale, scale.arg_names, configs, ["n"], None, None,
                                       do_bench=fake_bench, default_config=configs[0], prune_configs_by=prune,
                                       pre_hook=lambda kw, reset_only=False: tuner.nargs_block.append(kw.get("BLOCK")))
    tuner.nargs_block = []
    n = int(os.environ["N"])
    x = torch.randn(n, device=ge2.device())
    y = torch.empty_like(x)
    tuner[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    assert torch.equal(y, x * 2.0)
    print(json.dumps({"best": tuner.best_config.kwargs["BLOCK"], "tuned": len(tuner.tuned_keys),
                      "hits": tuner.stored_hits, "benched": calls}))
""")


def run(tmp_path, n=1000, blocks="16,32,64", fastest=32, **env):
    environ = {**os.environ, "GE2_CACHE_DIR": str(tmp_path), "N": str(n), "BLOCKS": blocks,
               "FASTEST": str(fastest), "PYTHONPATH": ROOT, **env}
    script = tmp_path / "tune_script.py"  # @triton.jit needs its source in a file on a GPU
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def cache_file(tmp_path):
    files = [f for f in os.listdir(tmp_path) if f.endswith(".json") and not f.startswith(".")]
    assert len(files) == 1, files
    return tmp_path / files[0]


def test_bucket_series():
    assert [tuning.bucket(n) for n in (1, 2, 3, 5, 7, 9, 100, 784, 1024, 1025, 4097)] == [
        1, 2, 3, 6, 8, 12, 128, 1024, 1024, 1536, 6144]


@triton.jit
def _coded_scale(x_ptr, n, CODE: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, 16), tl.load(x_ptr + tl.arange(0, 16)) * CODE)


def test_exact_keys_are_stored_unbucketed():
    # sizes share entries by bucket; codes must not: activation 5 is not activation 6
    configs = [triton.Config({}, num_warps=w) for w in (1, 2)]
    args = (_coded_scale, _coded_scale.arg_names, configs, ["n", "CODE"], None, None)
    coded = tuning.PersistentAutotuner(*args, exact_keys=("CODE",))
    plain = tuning.PersistentAutotuner(*args)
    key = (1000, 5, "torch.float32")
    assert coded.store_key(key).endswith("|1024,5,torch.float32")
    assert plain.store_key(key).endswith("|1024,6,torch.float32")


def test_round_trip_across_processes(tmp_path):
    first, _ = run(tmp_path, fastest=32)
    assert first == {"best": 32, "tuned": 1, "hits": 0, "benched": first["benched"]}
    assert sorted(first["benched"]) == [16, 32, 64]
    entry = next(iter(json.loads(cache_file(tmp_path).read_text())["entries"].values()))
    assert entry["config"]["kwargs"] == {"BLOCK": 32} and entry["time_ms"] == 1.0
    # A new process (any shape in the same bucket) takes the stored config without benchmarking.
    second, _ = run(tmp_path, n=1020, fastest=64, FORBID_TUNING="1")
    assert second == {"best": 32, "tuned": 0, "hits": 1, "benched": []}
    # Another bucket is tuned anew.
    third, _ = run(tmp_path, n=5000, fastest=64)
    assert third["best"] == 64 and third["tuned"] == 1
    assert len(json.loads(cache_file(tmp_path).read_text())["entries"]) == 2


def test_a_single_candidate_after_pruning_is_neither_timed_nor_stored(tmp_path):
    result, _ = run(tmp_path, fastest=32, PRUNE_TO_ONE="1", FORBID_TUNING="1")
    assert result == {"best": 16, "tuned": 0, "hits": 0, "benched": []}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".json") and not f.startswith(".")]


def test_other_triton_version_or_config_space_is_ignored(tmp_path):
    run(tmp_path, fastest=32)
    path = cache_file(tmp_path)
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["triton"] = "0.0.1"
    path.write_text(json.dumps(data))
    again, _ = run(tmp_path, fastest=16)
    assert again["tuned"] == 1 and again["best"] == 16
    changed_space, _ = run(tmp_path, blocks="16,32,128", fastest=128)
    assert changed_space["tuned"] == 1 and changed_space["best"] == 128


def test_corrupt_file_is_reported_and_replaced(tmp_path):
    run(tmp_path)
    path = cache_file(tmp_path)
    path.write_text('{"format": 1, "entries": {"trunc')
    result, stderr = run(tmp_path, fastest=64)
    assert "ignoring unreadable tuning cache" in stderr
    assert result["tuned"] == 1 and result["best"] == 64
    assert json.loads(path.read_text())["format"] == tuning.FORMAT_VERSION


def test_write_is_atomic(tmp_path, monkeypatch):
    store = tuning.TuningStore(str(tmp_path / "gpu.json"))
    store.record("k1", {"config": {}, "space": "s", "triton": "x"})
    before = (tmp_path / "gpu.json").read_text()

    def failing_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tuning.json, "dump", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        store.record("k2", {"config": {}, "space": "s", "triton": "x"})
    assert (tmp_path / "gpu.json").read_text() == before  # the old file is intact
    assert os.listdir(tmp_path) == ["gpu.json"]  # and no temp file is left behind


def test_autotune_command_arguments():
    from ge2 import autotune

    assert autotune.parse_shape("gemm", "512x784x1024") == (512, 784, 1024)
    with pytest.raises(ValueError, match="--shapes for gemm are 3 positive sizes"):
        autotune.parse_shape("gemm", "512x784")
    with pytest.raises(ValueError, match="softmax"):
        autotune.parse_shape("softmax", "0x5")


GPU_SECOND_PROCESS = textwrap.dedent("""
    import json, torch, ge2
    from ge2 import backend, tuning
    x, w, b = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), \\
        torch.randn(384, 512, device="cuda", dtype=torch.bfloat16), torch.randn(384, device="cuda", dtype=torch.bfloat16)
    backend.call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act="relu")
    print(json.dumps({"tuned": sum(len(t.tuned_keys) for t in tuning.ALL_TUNERS),
                      "hits": sum(t.stored_hits for t in tuning.ALL_TUNERS)}))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tuning needs a CUDA GPU")
def test_autotune_command_persists_for_the_next_process(tmp_path):
    env = {**os.environ, "GE2_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "ge2", "autotune", "--op", "gemm", "--dtype", "bf16",
                           "--shapes", "256x384x512", "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gemm" in proc.stdout and "x default" in proc.stdout
    assert len(json.loads(cache_file(tmp_path).read_text())["entries"]) >= 1
    second = subprocess.run([sys.executable, "-c", GPU_SECOND_PROCESS], env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    counts = json.loads(second.stdout.strip().splitlines()[-1])
    assert counts["tuned"] == 0 and counts["hits"] >= 1


@pytest.mark.parametrize("op,shape", [("gemm", (5, 7, 9)), ("softmax", (4, 33)), ("cross_entropy", (6, 11)),
                                      ("sum", (3, 70)), ("add", (4, 5)), ("conv2d", (2, 3, 6, 4, 3))])
def test_autotune_recipes_compute_what_their_torch_column_computes(op, shape):
    import ge2
    from ge2 import autotune

    ge2_fn, torch_fn = autotune.RECIPES[op][1](shape, torch.float32, ge2.device())
    out = ge2_fn()
    out = out[0] if isinstance(out, tuple) else out
    assert torch.allclose(out, torch_fn(), rtol=1e-4, atol=1e-5)
