"""ge2.autocast and ge2.amp.GradScaler against torch's autocast and GradScaler."""
from __future__ import annotations

import collections
import threading

import pytest
import torch
import torch.nn.functional as TF

import ge2
import ge2.nn.functional as F
from ge2 import graphs
from ge2.amp import autocast_mode
from ge2.testing import MEMORY_OPS, record_torch_ops, torch_op_guard
from numerics import DEVICE, assert_matches, randn

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
ON_CUDA = DEVICE.type == "cuda"
TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def _g(t: torch.Tensor, requires_grad: bool = False) -> ge2.Tensor:
    return ge2.Tensor(t.clone(), requires_grad=requires_grad)


# ---------------------------------------------------------------------------------------------
# op-by-op dtypes
# ---------------------------------------------------------------------------------------------
def _op_inputs():
    xf = randn(3, 5, seed=1)
    return dict(
        xf=xf, xb=randn(3, 5, seed=2).to(BF16), w=randn(4, 5, seed=3), b=randn(4, seed=4),
        w5=randn(5, seed=5), b5=randn(5, seed=6), img=randn(2, 3, 5, 6, seed=7), k=randn(4, 3, 3, 3, seed=8),
        imgb=randn(2, 4, 5, 6, seed=9).to(BF16), c4=randn(4, seed=10).abs() + 0.5,
        t=torch.tensor([1, 0, 4], device=DEVICE), idx=torch.tensor([[0, 3], [2, 2]], device=DEVICE),
        x64=randn(3, 5, seed=11).double(), w64=randn(4, 5, seed=12).double(),
        pos=randn(3, 5, seed=13).abs().to(BF16), prob=randn(3, 5, seed=14).sigmoid(),
    )


# (name, ge2 op, torch op, dtype under CUDA autocast(bf16), CPU autocast gives the same): the CUDA
# list (torch's autocast_mode.cpp, "KERNEL_CUDA") is the rule; where torch's CPU list differs, the
# CUDA dtype is written out here and checked against torch itself on a GPU.
OPS = [
    ("linear", lambda g, i: F.linear(g(i["xf"]), g(i["w"]), g(i["b"])),
     lambda i: TF.linear(i["xf"], i["w"], i["b"]), BF16, True),
    ("linear_fp64", lambda g, i: F.linear(g(i["x64"]), g(i["w64"])),
     lambda i: TF.linear(i["x64"], i["w64"]), FP64, True),
    ("matmul", lambda g, i: g(i["xf"]) @ g(i["w"]).T, lambda i: i["xf"] @ i["w"].T, BF16, True),
    ("matmul_mixed", lambda g, i: g(i["xb"]) @ g(i["w"]).T, lambda i: i["xb"] @ i["w"].T, BF16, True),
    ("conv2d", lambda g, i: F.conv2d(g(i["img"]), g(i["k"]), padding=1),
     lambda i: TF.conv2d(i["img"], i["k"], padding=1), BF16, True),
    ("softmax_fp32", lambda g, i: F.softmax(g(i["xf"]), -1), lambda i: TF.softmax(i["xf"], -1), FP32, True),
    ("softmax", lambda g, i: F.softmax(g(i["xb"]), -1), lambda i: TF.softmax(i["xb"], -1), FP32, False),
    ("log_softmax", lambda g, i: F.log_softmax(g(i["xb"]), -1),
     lambda i: TF.log_softmax(i["xb"], -1), FP32, False),
    ("layer_norm", lambda g, i: F.layer_norm(g(i["xb"]), 5, g(i["w5"]), g(i["b5"])),
     lambda i: TF.layer_norm(i["xb"], (5,), i["w5"], i["b5"]), FP32, False),
    ("rms_norm", lambda g, i: F.rms_norm(g(i["xb"]), 5, g(i["w5"])),
     lambda i: TF.rms_norm(i["xb"], (5,), i["w5"]), FP32, False),
    ("batch_norm",
     lambda g, i: F.batch_norm(g(i["imgb"]), g(i["c4"] * 0), g(i["c4"]), g(i["c4"]), g(i["c4"]), training=True),
     lambda i: TF.batch_norm(i["imgb"], i["c4"] * 0, i["c4"].clone(), i["c4"], i["c4"], training=True), BF16, True),
    ("sum", lambda g, i: g(i["xb"]).sum(), lambda i: i["xb"].sum(), FP32, False),
    ("mean", lambda g, i: g(i["xb"]).mean(), lambda i: i["xb"].mean(), BF16, True),
    ("exp", lambda g, i: ge2.exp(g(i["xb"])), lambda i: i["xb"].exp(), FP32, False),
    ("log", lambda g, i: ge2.log(g(i["pos"])), lambda i: i["pos"].log(), FP32, False),
    ("pow", lambda g, i: g(i["xb"]) ** 2, lambda i: i["xb"] ** 2, FP32, False),
    ("sqrt", lambda g, i: ge2.sqrt(g(i["pos"])), lambda i: i["pos"].sqrt(), BF16, True),
    ("mse_loss", lambda g, i: F.mse_loss(g(i["xb"]), g(i["xf"])), lambda i: TF.mse_loss(i["xb"], i["xf"]), FP32, True),
    ("cross_entropy", lambda g, i: F.cross_entropy(g(i["xb"]), ge2.Tensor(i["t"])),
     lambda i: TF.cross_entropy(i["xb"], i["t"]), FP32, True),
    ("nll_loss", lambda g, i: F.nll_loss(g(i["xb"]), ge2.Tensor(i["t"])),
     lambda i: TF.nll_loss(i["xb"], i["t"]), FP32, True),
    ("bce_with_logits", lambda g, i: F.binary_cross_entropy_with_logits(g(i["xb"]), g(i["prob"])),
     lambda i: TF.binary_cross_entropy_with_logits(i["xb"], i["prob"]), FP32, True),
    ("add_mixed", lambda g, i: g(i["xb"]) + g(i["xf"]), lambda i: i["xb"] + i["xf"], FP32, True),
    ("mul_scalar", lambda g, i: g(i["xb"]) * 2.0, lambda i: i["xb"] * 2.0, BF16, True),
    ("cat", lambda g, i: ge2.cat([g(i["xb"]), g(i["xf"])]), lambda i: torch.cat([i["xb"], i["xf"]]), FP32, True),
    ("stack", lambda g, i: ge2.stack([g(i["xb"]), g(i["xf"])]),
     lambda i: torch.stack([i["xb"], i["xf"]]), FP32, True),
    ("where", lambda g, i: ge2.where(g(i["xf"]) > 0, g(i["xb"]), g(i["xf"])),
     lambda i: torch.where(i["xf"] > 0, i["xb"], i["xf"]), FP32, True),
    ("relu", lambda g, i: ge2.relu(g(i["xb"])), lambda i: TF.relu(i["xb"]), BF16, True),
    ("gelu", lambda g, i: F.gelu(g(i["xb"])), lambda i: TF.gelu(i["xb"]), BF16, True),
    ("embedding", lambda g, i: F.embedding(ge2.Tensor(i["idx"]), g(i["w"])),
     lambda i: TF.embedding(i["idx"], i["w"]), FP32, True),
    ("max_pool2d", lambda g, i: F.max_pool2d(g(i["imgb"]), 2), lambda i: TF.max_pool2d(i["imgb"], 2), BF16, True),
]


# ops given inputs of two floating dtypes: outside autocast ge2 refuses some and types others by the
# first; torch refuses others (CUDA layer_norm with a bf16 input and fp32 weights)
MIXED = ("matmul_mixed", "cat", "stack", "mse_loss", "bce_with_logits", "add_mixed", "where", "layer_norm")


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch's CPU rms_norm
@pytest.mark.parametrize("name,op,torch_op,cuda_dtype,cpu_same", OPS, ids=[o[0] for o in OPS])
def test_op_dtype_matches_torch_autocast(name, op, torch_op, cuda_dtype, cpu_same):
    inputs = _op_inputs()
    with ge2.autocast(DEVICE.type, dtype=BF16):
        out = op(_g, inputs)
    if ON_CUDA and not (name == "rms_norm" and TORCH_VERSION < (2, 12)):  # rms_norm joined the list in 2.12
        with torch.autocast("cuda", dtype=BF16):
            assert torch_op(inputs).dtype == cuda_dtype, f"{name}: the written-out CUDA rule is out of date"
    if not ON_CUDA and cpu_same:
        with torch.autocast("cpu", dtype=BF16):
            assert torch_op(inputs).dtype == cuda_dtype
    assert out.dtype == cuda_dtype, f"{name}: {out.dtype} under autocast, torch's CUDA rule says {cuda_dtype}"
    if name not in MIXED:
        assert op(_g, inputs).dtype == torch_op(inputs).dtype  # outside a region nothing is cast


def test_fp16_dtype_and_values():
    x, w = randn(3, 5, seed=1), randn(4, 5, seed=2)
    with ge2.autocast(DEVICE.type, dtype=FP16):
        y = F.linear(_g(x), _g(w))
    assert y.dtype == FP16
    ref = x.double() @ w.double().T
    assert_matches(y.data, ref, x.half() @ w.half().T if ON_CUDA else (x.half().float() @ w.half().float().T).half())


# ---------------------------------------------------------------------------------------------
# a Linear + conv model: outputs and gradients against torch's autocast
# ---------------------------------------------------------------------------------------------
def _model_params():
    return dict(k=randn(4, 3, 3, 3, seed=20) * 0.3, kb=randn(4, seed=21) * 0.1, w=randn(7, 4 * 5 * 6, seed=22) * 0.05,
                b=randn(7, seed=23) * 0.1)


def _forward(conv2d, relu, linear, mse, x, p, target):
    h = relu(conv2d(x, p["k"], p["kb"], padding=1))
    out = linear(h.reshape(h.shape[0], -1), p["w"], p["b"])
    return out, mse(out, target)


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_model_outputs_and_grads_match_torch_autocast(dtype):
    if dtype == FP16 and not ON_CUDA:
        pytest.skip("torch's CPU autocast is bfloat16 only")
    x = randn(3, 3, 5, 6, seed=24, noncontig=True)  # every other element of a wider buffer
    target = randn(3, 7, seed=25)
    params = _model_params()

    gp = {k: _g(v, requires_grad=True) for k, v in params.items()}
    gx = _g(x, requires_grad=True)
    with ge2.autocast(DEVICE.type, dtype=dtype):
        out, loss = _forward(F.conv2d, ge2.relu, F.linear, F.mse_loss, gx, gp, _g(target))
    assert out.dtype == dtype and loss.dtype == FP32
    loss.backward()

    tp = {k: v.clone().requires_grad_() for k, v in params.items()}
    tx = x.clone().requires_grad_()
    with torch.autocast(DEVICE.type, dtype=dtype):
        tout, tloss = _forward(TF.conv2d, TF.relu, TF.linear, TF.mse_loss, tx, tp, target)
    tloss.backward()

    rp = {k: v.double().requires_grad_() for k, v in params.items()}
    rx = x.double().requires_grad_()
    rout, rloss = _forward(TF.conv2d, TF.relu, TF.linear, TF.mse_loss, rx, rp, target.double())
    rloss.backward()

    assert_matches(out.data, rout, tout, name="output")
    # the loss is one number (its error vs torch's is noise): it must be the fp32 mse of ge2's own output
    assert_matches(loss.data, TF.mse_loss(out.data.double(), target.double()), name="loss")
    assert gx.grad.dtype == FP32 and all(gp[k].grad.dtype == FP32 for k in gp)
    assert_matches(gx.grad.data, rx.grad, tx.grad, name="dx")
    for k in params:
        assert_matches(gp[k].grad.data, rp[k].grad, tp[k].grad, name=f"d{k}")


# ---------------------------------------------------------------------------------------------
# the weight-cast cache
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def cast_counts(monkeypatch):
    counts: collections.Counter = collections.Counter()
    # every cast of a parameter: the autograd copy, or the plain one whose gradient the op writes itself (linear)
    for name in ("_copy", "_plain_copy"):
        def counting(t, dtype, real=getattr(autocast_mode, name)):
            counts[id(t)] += 1
            return real(t, dtype)

        monkeypatch.setattr(autocast_mode, name, counting)
    return counts


def test_weight_cast_once_per_region(cast_counts):
    lin = ge2.nn.Linear(5, 5)
    x = _g(randn(3, 5, seed=30))
    with ge2.autocast(DEVICE.type, dtype=BF16):
        y = lin(ge2.relu(lin(x)))  # the layer used twice: one cast of W and b, reused
        with ge2.autocast(DEVICE.type, dtype=BF16):  # a nested region shares the outer cache
            lin(x)
    assert cast_counts[id(lin.weight)] == 1 and cast_counts[id(lin.bias)] == 1
    assert not autocast_mode.state.cache  # emptied when the outermost region exits
    y.sum().backward()
    assert lin.weight.grad.dtype == FP32
    with ge2.autocast(DEVICE.type, dtype=BF16):  # a new region casts again
        lin(x)
    assert cast_counts[id(lin.weight)] == 2
    with ge2.autocast(DEVICE.type, dtype=BF16, cache_enabled=False):
        lin(x)
        lin(x)
    assert cast_counts[id(lin.weight)] == 4


def test_weight_cast_refreshed_after_in_place_update(cast_counts):
    lin = ge2.nn.Linear(5, 4)
    x = _g(randn(3, 5, seed=31))
    opt = ge2.optim.SGD(lin.parameters(), lr=0.5)
    with ge2.autocast(DEVICE.type, dtype=BF16):
        lin(x).sum().backward()
        opt.step()  # the parameters change in place inside the region
        y = lin(x)
    assert cast_counts[id(lin.weight)] == 2
    expect = F.linear(x, lin.weight, lin.bias)
    assert_matches(y.data.float(), expect.data.double(), expect.data.to(BF16).float())


def test_capture_clears_the_cache():
    lin = ge2.nn.Linear(5, 4)
    x = _g(randn(3, 5, seed=32))
    step = ge2.capture(lambda inp: lin(inp))
    with ge2.autocast(DEVICE.type, dtype=BF16):
        lin(x)
        assert autocast_mode.state.cache
        assert step(x).dtype == BF16
        assert not autocast_mode.state.cache


# ---------------------------------------------------------------------------------------------
# nesting, thread-locality, decorator, errors
# ---------------------------------------------------------------------------------------------
def test_nesting_and_flags():
    x, w = _g(randn(3, 5, seed=40)), _g(randn(4, 5, seed=41))
    dev = DEVICE.type
    assert not ge2.amp.is_autocast_enabled(dev)
    with ge2.autocast(dev, dtype=BF16):
        assert ge2.amp.is_autocast_enabled(dev) and ge2.amp.get_autocast_dtype(dev) == BF16
        with ge2.autocast(dev, enabled=False):
            assert F.linear(x, w).dtype == FP32 and not ge2.amp.is_autocast_enabled(dev)
        with ge2.autocast(dev, dtype=FP16):
            assert F.linear(x, w).dtype == FP16
        assert F.linear(x, w).dtype == BF16
    assert F.linear(x, w).dtype == FP32 and not autocast_mode.state.on
    other = "cpu" if dev == "cuda" else "cuda"
    with ge2.autocast(other, dtype=BF16):  # a region for the other device type leaves these tensors alone
        assert F.linear(x, w).dtype == FP32


def test_thread_local():
    x, w = _g(randn(3, 5, seed=42)), _g(randn(4, 5, seed=43))
    seen = {}
    with ge2.autocast(DEVICE.type, dtype=BF16):
        t = threading.Thread(target=lambda: seen.setdefault("dtype", F.linear(x, w).dtype))
        t.start()
        t.join()
        assert F.linear(x, w).dtype == BF16
    assert seen["dtype"] == FP32


def test_decorator_and_helper():
    x, w = _g(randn(3, 5, seed=44)), _g(randn(4, 5, seed=45))

    @ge2.autocast(DEVICE.type, dtype=BF16)
    def f(a, b):
        return F.linear(a, b), ge2.amp.autocast_low(a, b, None)

    y, (a, b, none) = f(x, w)
    assert y.dtype == BF16 and a.dtype == BF16 and b.dtype == BF16 and none is None
    assert F.linear(x, w).dtype == FP32
    assert ge2.amp.autocast_low(x, w) == (x, w)
    assert ge2.amp.autocast is ge2.autocast


def test_errors():
    with pytest.raises(ValueError, match="autocast: dtype"):
        ge2.autocast(DEVICE.type, dtype=FP32)
    with pytest.raises(ValueError, match="autocast: device_type"):
        ge2.autocast("tpu")
    with pytest.raises(ValueError, match="growth_factor"):
        ge2.amp.GradScaler(growth_factor=0.5)


# ---------------------------------------------------------------------------------------------
# GradScaler
# ---------------------------------------------------------------------------------------------
def _poison(grad: torch.Tensor, step: int, bad: dict) -> None:
    if step in bad:
        grad[0, 0] = bad[step]


@pytest.mark.parametrize("kind", ["adamw", "sgd_clip"])
def test_grad_scaler_matches_torch(kind):
    w0, b0 = randn(3, 4, seed=50), randn(3, seed=51)
    bad = {1: float("inf"), 2: float("nan"), 5: float("-inf")}  # overflows at these steps
    gw, gb = _g(w0, requires_grad=True), _g(b0, requires_grad=True)
    tw, tb = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    if kind == "adamw":
        opt, topt = ge2.optim.AdamW([gw, gb], lr=0.05), torch.optim.AdamW([tw, tb], lr=0.05)
    else:
        opt, topt = (ge2.optim.SGD([gw, gb], lr=0.05, momentum=0.9),
                     torch.optim.SGD([tw, tb], lr=0.05, momentum=0.9))
    scaler = ge2.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    tscaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0 ** 10, growth_interval=2)
    for step in range(7):
        x = randn(5, 4, seed=60 + step)
        loss = F.mse_loss(F.linear(_g(x), gw, gb), _g(x[:, :3]))
        scaler.scale(loss).backward()
        _poison(gw.grad.data, step, bad)
        tloss = TF.mse_loss(TF.linear(x, tw, tb), x[:, :3])
        tscaler.scale(tloss).backward()
        _poison(tw.grad, step, bad)
        if kind == "sgd_clip":
            scaler.unscale_(opt)
            ge2.nn.utils.clip_grad_norm_([gw, gb], 1.0)
            tscaler.unscale_(topt)
            torch.nn.utils.clip_grad_norm_([tw, tb], 1.0)
        scaler.step(opt)
        scaler.update()
        tscaler.step(topt)
        tscaler.update()
        opt.zero_grad()
        topt.zero_grad()
        assert scaler.get_scale() == tscaler.get_scale(), f"step {step}"
        assert scaler._get_growth_tracker() == tscaler._get_growth_tracker(), f"step {step}"
        assert torch.allclose(gw.data, tw.detach(), rtol=1e-5, atol=1e-6), f"step {step}"
        assert torch.allclose(gb.data, tb.detach(), rtol=1e-5, atol=1e-6), f"step {step}"
    assert opt.step_count == 4  # 7 steps, 3 skipped on the device


def test_grad_scaler_state_dict_round_trip():
    w = _g(randn(3, 4, seed=70), requires_grad=True)
    opt = ge2.optim.SGD([w], lr=0.1)
    scaler = ge2.amp.GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    for _ in range(2):
        scaler.scale((w * w).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    sd = scaler.state_dict()
    assert sd == {"scale": 256.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 3,
                  "_growth_tracker": 2}
    again = ge2.amp.GradScaler()
    again.load_state_dict(sd)
    assert again.state_dict() == sd
    tscaler = torch.amp.GradScaler(DEVICE.type)
    tscaler.load_state_dict(sd)  # torch's format, both ways
    assert tscaler.state_dict() == sd
    again.load_state_dict(tscaler.state_dict())
    again.scale((w * w).sum()).backward()  # the device tensors start from the loaded values
    again.step(opt)
    again.update()
    assert again.get_scale() == 1024.0 and again._get_growth_tracker() == 0
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        again.scale((w * w).sum()).backward()
        again.step(opt)
        again.step(opt)


def test_grad_scaler_disabled_is_plain_step():
    w = _g(randn(3, 4, seed=71), requires_grad=True)
    opt = ge2.optim.SGD([w], lr=0.1)
    scaler = ge2.amp.GradScaler(enabled=False)
    loss = (w * w).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = w.data.clone()
    scaler.step(opt)
    scaler.update()
    assert torch.allclose(w.data, before - 0.2 * before) and scaler.state_dict() == {}


def test_grad_scaler_step_has_no_host_sync():
    lin = ge2.nn.Linear(4, 3)
    opt = ge2.optim.AdamW(lin.parameters(), lr=0.01)
    scaler = ge2.amp.GradScaler(init_scale=2.0 ** 8)
    x, y = _g(randn(5, 4, seed=72)), _g(randn(5, 3, seed=73))

    def train_step():
        with ge2.autocast(DEVICE.type, dtype=BF16):
            loss = F.mse_loss(lin(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    train_step()  # a warm-up step, as ge2.capture runs before it captures
    # a capture copies the optimizer's address tables from pinned memory: pinning is no arithmetic
    pinning = frozenset({"pin_memory", "_pin_memory", "is_pinned"})
    with graphs._recorded(graphs._Recording(capturing=True)), torch_op_guard(MEMORY_OPS | pinning) as ops:
        train_step()  # Tensor.item() would raise CaptureError here
    reads = {name for name in ops if name in ("_local_scalar_dense", "item", "is_nonzero", "equal")}
    assert not reads, f"host reads in a GradScaler step: {reads}"
    with record_torch_ops() as ops:
        scaler.get_scale()
    assert ops["_local_scalar_dense"] == 1  # the guard does see a host read


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_amp_step_matches_eager():
    torch.manual_seed(0)
    models, outs = [], []
    for captured in (False, True):
        torch.manual_seed(0)
        lin1, lin2 = ge2.nn.Linear(16, 32), ge2.nn.Linear(32, 8)
        params = list(lin1.parameters()) + list(lin2.parameters())
        opt = ge2.optim.AdamW(params, lr=0.01)
        scaler = ge2.amp.GradScaler(init_scale=2.0 ** 20, growth_interval=3)  # overflows first, then backs off

        def train_step(x, y):
            with ge2.autocast("cuda", dtype=FP16):
                loss = F.mse_loss(lin2(ge2.relu(lin1(x))), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=False)
            return loss

        step = ge2.capture(train_step) if captured else train_step
        losses = []
        for i in range(8):
            x, y = _g(randn(24, 16, seed=80 + i)), _g(randn(24, 8, seed=90 + i) * 100)
            losses.append(step(x, y).data.clone())
        models.append([p.data.clone() for p in params])
        outs.append((torch.stack(losses), scaler.get_scale()))
        if captured:
            assert step.captured
    for a, b in zip(*models):
        assert torch.equal(a, b)
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]
