"""Training end to end: the no-torch-math rule on a whole step, backend parity, checkpoints, ``ge2 train``."""
from __future__ import annotations

import json
import os

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2 import cli
from ge2.serialization import CheckpointError
from ge2.testing import torch_op_guard
from numerics import DEVICE, randn


# ---------------------------------------------------------------------------------------------
# the project's rule: one whole training step issues no torch arithmetic
# ---------------------------------------------------------------------------------------------
def _mlp(seed=0):
    ge2.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16, activation="relu"), nn.Dropout(0.2), nn.LayerNorm(16),
                         nn.Linear(16, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 5))


def _step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


@pytest.mark.parametrize("make_opt", [lambda p: ge2.optim.AdamW(p, lr=1e-2),
                                      lambda p: ge2.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)],
                         ids=["adamw", "sgd"])
def test_whole_training_step_issues_only_memory_ops(make_opt):
    model = _mlp()
    opt = make_opt(model.parameters())
    x, y = ge2.from_torch(randn(9, 12)), ge2.tensor([0, 4, 1, 2, 3, 3, 0, 1, 4])
    before = {n: p.data.clone() for n, p in model.named_parameters()}
    with torch_op_guard() as ops:
        for _ in range(2):  # the first step allocates optimizer state and tables, the second reuses them
            _step(model, opt, x, y)
    assert sum(ops.values()) > 0
    # every parameter moved, except (with SGD) the bias before the batch norm, whose gradient is ~0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.data, before[n])}
    assert set(before) - changed <= {"3.bias"}


def test_the_guard_trips_on_the_torch_backend():
    model = _mlp()
    opt = ge2.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = ge2.from_torch(randn(9, 12)), ge2.tensor([0, 4, 1, 2, 3, 3, 0, 1, 4])
    with ge2.use_backend("torch"), pytest.raises(AssertionError, match="torch did arithmetic"):
        with torch_op_guard():
            _step(model, opt, x, y)


# ---------------------------------------------------------------------------------------------
# training parity: triton vs the torch oracle, same init and batches
# ---------------------------------------------------------------------------------------------
def _digits_losses(backend: str, steps: int) -> list[float]:
    pytest.importorskip("sklearn", reason="digits needs scikit-learn: pip install -e .[data]")
    train, _ = ge2.data.datasets.digits()
    ge2.manual_seed(0)
    with ge2.use_backend(backend):
        model = nn.Sequential(nn.Linear(64, 32, activation="relu"), nn.Linear(32, 10))
        opt = ge2.optim.AdamW(model.parameters(), lr=3e-2)
        losses = []
        for i, (x, y) in enumerate(ge2.data.DataLoader(train, batch_size=64, shuffle=True, seed=1)):
            if i == steps:
                break
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_training_parity_triton_vs_torch_backend():
    steps = 50 if torch.cuda.is_available() else 8
    tri, ref = _digits_losses("triton", steps), _digits_losses("torch", steps)
    assert tri[-1] < 0.8 * tri[0]  # it learns
    for i, (a, b) in enumerate(zip(tri, ref)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {i}: triton loss {a} vs torch {b}"


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    special = torch.tensor([float("nan"), float("inf"), -0.0, 1e-45, -3.5], device=DEVICE)
    obj = {
        "fp32": ge2.from_torch(randn(3, 5)), "special": special, "bf16": randn(4, dtype=torch.bfloat16),
        "fp16": ge2.from_torch(randn(2, 2, dtype=torch.float16)), "int": torch.arange(7, device=DEVICE) - 3,
        "bool": torch.tensor([True, False], device=DEVICE), "empty": torch.zeros(0, 3, device=DEVICE),
        "scalar": ge2.tensor(2.5), "strided": randn(4, 6, noncontig=True),
        "nested": {0: [1, 2.5, None, "s", True], 7: (ge2.float16, (ge2.zeros(2),))},
    }
    path = tmp_path / "ckpt.ge2"
    ge2.save(obj, path)
    back = ge2.load(path)
    assert os.listdir(tmp_path) == ["ckpt.ge2"]  # the temporary file was renamed, not left behind
    assert set(back) == set(obj)
    for key, v in obj.items():
        if key == "nested":
            continue
        w = back[key]
        assert type(w) is type(v), key  # ge2 Tensors come back as ge2 Tensors, torch tensors as torch tensors
        a, b = (v.data if isinstance(v, ge2.Tensor) else v), (w.data if isinstance(w, ge2.Tensor) else w)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert a.cpu().contiguous().reshape(-1).view(torch.uint8).tolist() == \
            b.cpu().reshape(-1).view(torch.uint8).tolist(), key  # the same bits, NaN payloads and -0 included
    assert back["nested"][0] == [1, 2.5, None, "s", True]
    assert back["nested"][7][0] == torch.float16 and isinstance(back["nested"][7][1][0], ge2.Tensor)


def test_checkpoint_rejects_truncated_corrupted_and_foreign_files(tmp_path):
    path = tmp_path / "ok.ge2"
    ge2.save({"w": ge2.from_torch(randn(8, 8))}, path)
    blob = path.read_bytes()
    for name, data, match in [
        ("truncated", blob[:-9], "truncated"),
        ("header_cut", blob[:20], "truncated"),
        ("flipped", blob[:-20] + bytes([blob[-20] ^ 1]) + blob[-19:], "checksum mismatch"),
        ("foreign", b"PK\x03\x04 this is a zip file", "is not a ge2 checkpoint"),
    ]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=match):
            ge2.load(tmp_path / name)
    with pytest.raises(TypeError, match="cannot store a set"):
        ge2.save({"bad": {1, 2}}, tmp_path / "bad.ge2")
    assert not (tmp_path / "bad.ge2").exists()
    assert ge2.load(path)["w"].shape == (8, 8)  # the good file is untouched


def test_resume_equals_uninterrupted_training(tmp_path):
    def batches():
        for k in range(6):
            yield ge2.from_torch(randn(9, 12, seed=k)), ge2.tensor([(k + i) % 5 for i in range(9)])

    model = _mlp(seed=5)
    opt = ge2.optim.AdamW(model.parameters(), lr=1e-2)
    sched = ge2.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    data = list(batches())
    for x, y in data:  # 2k steps straight through
        _step(model, opt, x, y)
        sched.step()

    model2 = _mlp(seed=5)
    opt2 = ge2.optim.AdamW(model2.parameters(), lr=1e-2)
    sched2 = ge2.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=6)
    for x, y in data[:3]:  # k steps, save
        _step(model2, opt2, x, y)
        sched2.step()
    ge2.save({"model": model2.state_dict(), "opt": opt2.state_dict(), "sched": sched2.state_dict(),
              "rng": model2[1].rng_state.data}, tmp_path / "mid.ge2")

    ckpt = ge2.load(tmp_path / "mid.ge2")  # a fresh process would start here
    model3 = _mlp(seed=123)
    model3.load_state_dict(ckpt["model"])
    model3[1].rng_state.data.copy_(ckpt["rng"])  # dropout's RNG is not in the state dict: carry it
    opt3 = ge2.optim.AdamW(model3.parameters(), lr=1e-2)
    opt3.load_state_dict(ckpt["opt"])
    sched3 = ge2.optim.lr_scheduler.CosineAnnealingLR(opt3, T_max=6)
    sched3.load_state_dict(ckpt["sched"])
    for x, y in data[3:]:  # k more steps
        _step(model3, opt3, x, y)
        sched3.step()

    for (name, a), b in zip(model.state_dict().items(), model3.state_dict().values()):
        assert torch.equal(a.data, b.data), name


# ---------------------------------------------------------------------------------------------
# ge2 train
# ---------------------------------------------------------------------------------------------
def test_ge2_train_beats_90_percent_on_digits(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="digits needs scikit-learn: pip install -e .[data]")
    out = tmp_path / "run"
    rc = cli.main(["train", "--model", "mlp", "--epochs", "2", "--hidden", "32", "--lr", "3e-2", "--batch-size", "64",
                   "--out", str(out), "--no-progress"])
    assert rc == 0
    log = json.loads((out / "log.json").read_text())
    assert len(log["epochs"]) == 2 and log["final_test_accuracy"] > 0.90
    assert log["epochs"][1]["train_loss"] < log["epochs"][0]["train_loss"]
    printed = capsys.readouterr().out
    assert "epoch   2/2" in printed and "final test accuracy" in printed
    try:
        import matplotlib  # noqa: F401
        assert (out / "curves.png").stat().st_size > 1000
    except ImportError:
        assert "no curves.png" in printed


def test_ge2_train_cnn_names_the_missing_layers(tmp_path, capsys):
    if hasattr(nn, "Conv2d") and hasattr(nn, "MaxPool2d"):
        pytest.skip("Conv2d and MaxPool2d exist: --model cnn is trained by the GPU accuracy run")
    rc = cli.main(["train", "--model", "cnn", "--out", str(tmp_path), "--no-progress"])
    assert rc == 2
    assert "needs ge2.nn.Conv2d and ge2.nn.MaxPool2d" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="--capture replays CUDA graphs: GPU only")
def test_ge2_train_capture_follows_the_eager_run(tmp_path):
    pytest.importorskip("sklearn", reason="digits needs scikit-learn: pip install -e .[data]")
    logs = []
    for flag in ([], ["--capture"]):
        out = tmp_path / ("captured" if flag else "eager")
        assert cli.main(["train", "--model", "mlp", "--epochs", "3", "--hidden", "64", "--out", str(out),
                         "--no-progress", *flag]) == 0
        logs.append(json.loads((out / "log.json").read_text()))
    eager, captured = (torch.tensor(log["step_losses"], dtype=torch.float64) for log in logs)
    assert eager.shape == captured.shape
    # same kernels, same batches, same init: the curves agree to fp32 rounding growing over ~70 steps
    assert ((eager - captured).abs() / eager.abs()).max().item() < 1e-3
    assert logs[1]["final_test_accuracy"] > 0.9
    # 23 steps an epoch, the last batch smaller: two graphs, each after two eager warm-up calls
    assert logs[1]["capture"]["captures"] == 2 and logs[1]["capture"]["replays"] == 69 - 4
