"""ge2.capture: whole-step CUDA graphs (issue 7). Replay must equal eager steps; unsafe steps fail clearly.

The graph tests need a GPU; on the CPU only the documented eager fallback and argument errors run.
"""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from numerics import randn

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _model(seed: int, dropout: float = 0.0) -> nn.Module:
    ge2.manual_seed(seed)
    layers = [nn.Linear(20, 33, activation="relu")]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.LayerNorm(33), nn.Linear(33, 7)]
    return nn.Sequential(*layers)


def _batches(n: int, rows: int = 13, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(ge2.from_torch(torch.randn(rows, 20, generator=g).to(ge2.device())),
             ge2.from_torch(torch.randint(0, 7, (rows,), generator=g).to(ge2.device()))) for _ in range(n)]


def _train_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _max_rel_diff(a: nn.Module, b: nn.Module) -> float:
    worst = 0.0
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        d = (p.data.double() - q.data.double()).abs().max().item() / max(q.data.double().abs().max().item(), 1e-30)
        worst = max(worst, d)
    return worst


@cuda
@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw_cosine"])
def test_replay_matches_eager_steps(optimizer):
    models = [_model(0), _model(0)]
    if optimizer == "sgd_momentum":
        opts = [ge2.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3) for m in models]
        scheds = [None, None]
    else:
        opts = [ge2.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.05) for m in models]
        scheds = [ge2.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12) for o in opts]
    eager, captured = _train_step(models[0], opts[0]), ge2.capture(_train_step(models[1], opts[1]), warmup=2)
    losses = []
    for x, y in _batches(12):
        losses.append((eager(x, y).data.clone(), captured(x, y).data.clone()))
        for s in scheds:
            if s is not None:
                s.step()
    assert captured.captures == 1 and captured.replays == 10
    # the same kernels and configs run in both: fp32 rounding, at most
    assert _max_rel_diff(models[1], models[0]) < 1e-5
    for le, lc in losses:
        assert abs(le.item() - lc.item()) <= 1e-5 * abs(le.item())
    assert opts[1].step_count == opts[0].step_count == 12
    # the captured model's .grad is the graph's buffer and equals the eager gradient of the last step
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.allclose(q.grad.data, p.grad.data, rtol=1e-4, atol=1e-6)


@cuda
def test_dropout_masks_differ_between_replays_and_follow_eager():
    models = [_model(3, dropout=0.5), _model(3, dropout=0.5)]

    def forward(model):
        def step(x):
            return model(x)
        return step

    eager, captured = forward(models[0]), ge2.capture(forward(models[1]), warmup=1)
    x = ge2.from_torch(randn(16, 20))
    outs = [(eager(x).data.clone(), captured(x).data.clone()) for _ in range(4)]
    assert captured.replays == 3
    assert not torch.equal(outs[2][1], outs[3][1])  # fresh masks on every replay
    for e, c in outs:
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)  # and the same stream as eager steps


@cuda
def test_graph_cache_recaptures_new_shapes_and_reuses_seen_ones():
    model = _model(1)
    opt = ge2.optim.SGD(model.parameters(), lr=0.01)
    step = ge2.capture(_train_step(model, opt), warmup=1, max_graphs=2)
    big, small, other = _batches(1, 13)[0], _batches(1, 5)[0], _batches(1, 3)[0]
    for _ in range(3):
        step(*big)
    assert step.captures == 1
    for _ in range(3):
        step(*small)
    assert step.captures == 2 and len(step.graphs) == 2
    step(*big)
    assert step.captures == 2  # reused
    for _ in range(2):
        step(*other)  # a third shape evicts the least recently used (small)
    assert len(step.graphs) == 2 and step.captures == 3
    for _ in range(2):
        step(*small)
    assert step.captures == 4
    # eager and captured calls interleave freely: an eager step sees the replayed parameters
    before = [p.data.clone() for p in model.parameters()]
    _train_step(model, opt)(*big)
    assert any(not torch.equal(b, p.data) for b, p in zip(before, model.parameters()))


@cuda
@pytest.mark.parametrize("unsafe", ["item", "print", "numpy", "bool", "scheduler"])
def test_capture_unsafe_steps_raise_clear_errors(unsafe):
    model = _model(2)
    opt = ge2.optim.SGD(model.parameters(), lr=0.01)
    sched = ge2.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    inner = _train_step(model, opt)

    def step(x, y):
        loss = inner(x, y)
        if unsafe == "item":
            loss.item()
        elif unsafe == "print":
            print(loss)
        elif unsafe == "numpy":
            loss.detach().numpy()
        elif unsafe == "bool":
            bool(loss > 1)
        else:
            sched.step()
        return loss

    captured = ge2.capture(step, warmup=1)
    x, y = _batches(1)[0]
    captured(x, y)  # eager warm-up: everything allowed
    expected = {"item": r"Tensor\.item\(\)", "print": "printing a tensor", "numpy": r"Tensor\.numpy\(\)",
                "bool": r"bool\(tensor\)", "scheduler": "scheduler"}[unsafe]
    with pytest.raises(ge2.CaptureError, match=expected):
        captured(x, y)
    assert not ge2.graphs.is_capturing()
    _train_step(model, opt)(x, y)  # the failed capture left eager mode working


@cuda
def test_train_and_eval_modes_get_their_own_graphs():
    model = _model(5, dropout=0.5)
    step = ge2.capture(lambda x: model(x), warmup=1)
    x = ge2.from_torch(randn(16, 20))
    for _ in range(3):
        step(x)
    assert step.captures == 1
    model.eval()  # a graph captured with dropout on must not replay now
    outs = [step(x).data.clone() for _ in range(3)]
    assert step.captures == 2
    with ge2.no_grad():
        expected = model(x).data
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # eval: deterministic, no dropout
    model.train()
    step(x)
    assert step.captures == 2 and step.replays == 5  # the train-mode graph is reused


@cuda
def test_data_dependent_output_shapes_are_refused():
    calls = []

    def step(x):
        calls.append(1)
        return x[: len(calls)] * 2.0

    captured = ge2.capture(step, warmup=2)
    x = ge2.from_torch(randn(6, 4))
    captured(x)
    with pytest.raises(ge2.CaptureError, match="data-dependent shape"):
        captured(x)


def test_cpu_runs_eagerly_and_argument_errors():
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        ge2.capture(lambda x: x, warmup=0)
    with pytest.raises(ValueError, match="max_graphs must be >= 1"):
        ge2.capture(warmup=1, max_graphs=0)(lambda x: x)

    @ge2.capture(warmup=3)
    def decorated(x):
        return x * 2.0

    assert isinstance(decorated, ge2.CapturedStep) and decorated.warmup == 3
    x = ge2.from_torch(randn(3, 2))
    with pytest.raises(TypeError, match="argument 0 is a tuple; a captured step takes tensors"):
        decorated((x, x))
    with pytest.raises(TypeError, match="fn must be callable"):
        ge2.capture(3)
    if torch.cuda.is_available():
        pytest.skip("the eager fallback is for CPU tensors")
    model = _model(4)
    opt = ge2.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = ge2.capture(_train_step(model, opt))
    x, y = _batches(1, rows=4)[0]
    before = [p.data.clone() for p in model.parameters()]
    for _ in range(3):
        loss = step(x, y)
    assert not step.captured and step.replays == 0
    assert loss.data.isfinite().all()
    assert all(not torch.equal(b, p.data) for b, p in zip(before, model.parameters()))
