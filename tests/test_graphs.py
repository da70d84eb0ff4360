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


# ---- paths (static_argnames), the undeclared-path check, repeat, early exit (issue 27) ----------------
# These run on the CPU too: there every call is eager, but paths, launch checks, repeat and stop_when
# follow the same rules (only `captures`/`replays` stay 0).
on_gpu = torch.cuda.is_available()


def _path_step(model, opt):
    def step(x, y, phase, n_micro):
        if phase == "eval":
            with ge2.no_grad():
                return F.cross_entropy(model(x), y)
        opt.zero_grad()
        rows, total = x.shape[0] // n_micro, None
        for i in range(n_micro):  # gradient accumulation over n_micro micro-batches
            part = slice(i * rows, (i + 1) * rows)
            loss = F.cross_entropy(model(x[part]), y[part]) * (1.0 / n_micro)
            loss.backward()
            total = loss if total is None else total + loss
        opt.step()
        return total
    return step


def test_static_paths_each_replay_equal_to_their_eager_runs():
    models = [_model(6), _model(6)]
    opts = [ge2.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    eager = _path_step(models[0], opts[0])
    step = ge2.capture(_path_step(models[1], opts[1]), warmup=1, static_argnames=("phase", "n_micro"))
    schedule = [("train", 1), ("train", 2), ("eval", 1)] * (3 if on_gpu else 2)  # GPU: warm-up, capture, replay
    for (x, y), (phase, n) in zip(_batches(len(schedule), rows=6, seed=3), schedule):
        want, got = eager(x, y, phase, n).data.clone(), step(x, y, phase, n_micro=n).data
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(step.paths) == 3
    assert sorted(dict((s[1], s[3]) for s in key[0] if s[0] == "static")["n_micro"] for key in step.paths) == [1, 1, 2]
    assert _max_rel_diff(models[1], models[0]) < 1e-5
    if on_gpu:
        assert step.captures == 3 and step.replays == 6  # each path: a warm-up, a capture, a replay


def test_lru_bound_holds_across_paths():
    x = ge2.from_torch(randn(3, 5))

    def powers(x, k):
        for _ in range(k):
            x = x * 1.5
        return x

    step = ge2.capture(powers, warmup=1, max_graphs=2, static_argnames="k")
    for k in [1, 1, 2, 2, 1, 3, 3, 1, 1]:
        torch.testing.assert_close(step(x, k).data, x.data * 1.5 ** k, rtol=1e-6, atol=0)
        assert len(step.paths) <= 2
    ks = [dict((s[1], s[3]) for s in key[0] if s[0] == "static")["k"] for key in step.paths]
    assert ks == [3, 1]  # 2 was least recently used when 3 arrived
    step(x, 2)  # evicted: warms up again
    assert len(step.paths) == 2 and step.captures == (3 if on_gpu else 0)
    if on_gpu:
        assert step.replays == 6
        step(x, 2)
        assert step.captures == 4 and [dict((s[1], s[3]) for s in key[0] if s[0] == "static")["k"]
                                       for key in step.paths] == [1, 2]


def test_undeclared_path_argument_raises_naming_it():
    x = ge2.from_torch(randn(4, 3))

    def powers(x, k, note):  # note never reaches a kernel
        for _ in range(k):
            x = x * 1.25
        return x

    step = ge2.capture(powers, warmup=2)
    for note in ["a", "b", "a", "c", "c", "b"]:  # a non-static value that does not change the launches is fine
        torch.testing.assert_close(step(x, 1, note).data, x.data * 1.25, rtol=1e-6, atol=0)
    assert len(step.paths) == 1
    if on_gpu:
        assert step.captures == 1 and step.replays == 2  # the capture's and the second "c": new values run eagerly once
    with pytest.raises(ge2.CaptureError, match=r"argument 'k' \(was 1, now 2\) changes the kernels.*"
                                               r"static_argnames=\('k',\)"):
        step(x, 2, "a")
    # a scalar that reaches a kernel counts as well: a replay would keep the captured one
    scaled = ge2.capture(lambda x, scale: x * scale, warmup=1)
    scaled(x, 2.0)
    scaled(x, 2.0)
    with pytest.raises(ge2.CaptureError, match=r"argument 'scale' \(was 2.0, now 3.0\)"):
        for _ in range(2):  # a first call that makes new launch plans tells nothing: the second decides
            scaled(x, 3.0)
    # declared static, every value gets its own path
    scaled = ge2.capture(lambda x, scale: x * scale, warmup=1, static_argnames="scale")
    for s in (2.0, 2.0, 3.0, 3.0, 3.0):
        torch.testing.assert_close(scaled(x, s).data, x.data * s, rtol=1e-6, atol=0)
    # Python state outside the arguments is caught among the warm-up calls
    calls = []

    def closure(x):
        calls.append(1)
        return x * 2.0 if len(calls) % 2 else x + 1.0

    step = ge2.capture(closure, warmup=4)
    with pytest.raises(ge2.CaptureError, match="Python state outside its arguments"):
        for _ in range(4):
            step(x)


def _stacks(batches):
    return (ge2.from_torch(torch.stack([x.data for x, _ in batches])),
            ge2.from_torch(torch.stack([y.data for _, y in batches])))


def test_repeat_equals_single_steps():
    models = [_model(7), _model(7)]
    opts = [ge2.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True) for m in models]
    eager = _train_step(models[0], opts[0])
    step = ge2.capture(_train_step(models[1], opts[1]), warmup=1, repeat=3)
    calls = 3 if on_gpu else 2  # GPU: warm-up, capture, replay
    batches = _batches(3 * calls, rows=5, seed=4)
    for c in range(calls):
        chunk = batches[3 * c: 3 * c + 3]
        losses = step(*_stacks(chunk))
        assert tuple(losses.shape) == (3,)
        want = torch.stack([eager(x, y).data.reshape(()) for x, y in chunk])
        torch.testing.assert_close(losses.data, want, rtol=1e-5, atol=1e-6)
    assert _max_rel_diff(models[1], models[0]) < 1e-5
    assert opts[1].step_count == opts[0].step_count == 3 * calls
    if on_gpu:
        assert step.captures == 1 and step.replays == 2
    with pytest.raises(ValueError, match=r"argument 'x' is the batch stack of 3 steps and needs a leading dim of 3"):
        step(*batches[0])


@cuda
@pytest.mark.parametrize("order", ["repeat_first", "single_first"])
def test_repeat_graph_replays_after_another_capture(order):
    """bench_train's repeat rows: a repeat=n graph and a one-step graph captured one after the other (each
    capture empties torch's caching allocators), then both replayed in turn, equal to eager steps."""
    n = 4
    models = [_model(8) for _ in range(4)]  # eager twin and captured step, for the one-step and the repeat graph
    opts = [ge2.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    eager_single, eager_repeat = _train_step(models[0], opts[0]), _train_step(models[2], opts[2])
    single = ge2.capture(_train_step(models[1], opts[1]))
    repeated = ge2.capture(_train_step(models[3], opts[3]), repeat=n)
    batches = _batches(n, rows=9, seed=5)
    stacks = _stacks(batches)

    def run_single():
        got = torch.stack([single(x, y).data.reshape(()).clone() for x, y in batches])
        return got, torch.stack([eager_single(x, y).data.reshape(()) for x, y in batches])

    def run_repeat():
        got = repeated(*stacks).data.clone()
        return got, torch.stack([eager_repeat(x, y).data.reshape(()) for x, y in batches])

    first, second = (run_repeat, run_single) if order == "repeat_first" else (run_single, run_repeat)
    for run in (first, first, first, second, second, second, first, second, first):  # warm-up, capture, replays
        got, want = run()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.cuda.synchronize()
    assert _max_rel_diff(models[1], models[0]) < 1e-5 and _max_rel_diff(models[3], models[2]) < 1e-5
    assert single.captures == 1 and repeated.captures == 1
    assert repeated.replays == (3 if order == "repeat_first" else 2)


@pytest.mark.parametrize("nodes", ["auto", "off"])
def test_stop_when_ends_steps_within_the_documented_latency(nodes, monkeypatch):
    from ge2.graphs import MAX_IN_FLIGHT

    if nodes == "off":  # the pinned-flag fallback, as where torch has no conditional nodes
        if not on_gpu:
            pytest.skip("the CPU has one mode (eager)")
        monkeypatch.setenv("GE2_CONDITIONAL_NODES", "0")

    n = 4
    total = ge2.from_torch(torch.zeros(2, device=ge2.device()))

    def accumulate(x):
        total.data.copy_((total + x.sum()).data)  # a device-side state that every step advances by 3
        return total * 1.0

    step = ge2.capture(accumulate, warmup=1, repeat=n, stop_when=lambda out: out.sum() > 80.0)
    xs = ge2.from_torch(torch.ones(n, 3, device=ge2.device()))
    outs = [step(xs) for _ in range(8)]
    outs = [None if o is None else o.data.clone() for o in outs]  # replays overwrite their outputs
    if on_gpu:
        torch.cuda.synchronize()
    assert step.stopped and step(xs) is None
    # the 14th step (4th call, 2nd row) makes total 42 (out.sum() 84 > 80); no later step may run,
    # except in pinned-flag mode
    done = total.data[0].item() / 3
    late = {"eager": 0, "conditional": 0, "pinned-flag": MAX_IN_FLIGHT * n - 1}[step.early_exit]
    assert 14 <= done <= 14 + late, (step.early_exit, done)
    print(f"early exit: {step.early_exit}, steps run {done:.0f} (the condition met at step 14)")
    if step.early_exit != "pinned-flag":
        assert outs[3][:2, 0].tolist() == [39.0, 42.0] and outs[3][2:].isnan().all()  # rows not run are NaN
    if not on_gpu:
        assert all(o is None for o in outs[4:])  # the host knows at once
    step.resume()
    step(xs)
    if on_gpu:
        torch.cuda.synchronize()
    assert total.data[0].item() / 3 > done  # resumed: steps run again


def test_path_argument_errors():
    def f(x):
        return x

    with pytest.raises(ValueError, match=r"static_argnames names 'phase', which is not a parameter of f\(x\)"):
        ge2.capture(f, static_argnames=("phase",))
    with pytest.raises(ValueError, match="repeat must be an int >= 1"):
        ge2.capture(lambda x: x, repeat=0)
    x = ge2.from_torch(randn(2, 3))
    with pytest.raises(TypeError, match="static argument 'k' must be hashable"):
        ge2.capture(lambda x, k: x, static_argnames="k")(x, [1, 2])
    with pytest.raises(TypeError, match="stop_when must return a one-element bool tensor"):
        ge2.capture(lambda x: x * 2.0, stop_when=lambda out: out)(x)

