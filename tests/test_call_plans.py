"""Call plans (ge2.backend.call_plans): replayed op calls give what the full path gives, and
recordings that a replay could not reproduce are refused."""
import gc
import weakref

import pytest
import torch
import triton
import triton.language as tl

import ge2
import ge2.nn.functional as F
from ge2.backend import call_plans, registry
from ge2.backend.schema import Schema, TensorArg
from ge2.kernels import gemm as gemm_kernels, native
from numerics import DEVICE, randn

pytestmark = pytest.mark.skipif(not call_plans.ENABLED, reason="GE2_CALL_PLANS=0")


def _calls(fn, inputs_per_call):
    """fn on each input tuple; returns the results and how many of the calls were replays."""
    hits = call_plans.STATS["hits"]
    outs = [fn(*inputs) for inputs in inputs_per_call]
    return outs, call_plans.STATS["hits"] - hits


def _fresh(*shape, noncontig=False, dtype=torch.float32):
    return [randn(*shape, noncontig=noncontig, dtype=dtype) for _ in range(4)]


@pytest.mark.parametrize("noncontig", [False, True])
def test_binary_broadcast_replays_match_torch(noncontig):
    xs, ys = _fresh(5, 7, noncontig=noncontig), _fresh(1, 7)
    outs, hits = _calls(lambda x, y: registry.call("add", x, y), list(zip(xs, ys)))
    assert hits == 2  # seen, recorded, replayed twice
    for out, x, y in zip(outs, xs, ys):
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_gemm_forward_and_backward_replays_match_torch():
    """Linear + relu forward and backward through autograd, four steps of new data."""
    hits0 = call_plans.STATS["hits"]
    for step in range(4):
        x, w, b = randn(6, 9), randn(5, 9), randn(5)
        gx, gw, gb = (ge2.from_torch(t, requires_grad=True) for t in (x, w, b))
        y = F.linear(gx, gw, gb, activation="relu")
        gy = randn(6, 5)
        y.backward(ge2.from_torch(gy))
        tx, tw, tb = (t.clone().requires_grad_() for t in (x, w, b))
        ty = torch.relu(tx @ tw.T + tb)
        ty.backward(gy)
        torch.testing.assert_close(y.data, ty.detach(), rtol=1e-5, atol=1e-5)
        for mine, ref in ((gx, tx), (gw, tw), (gb, tb)):
            torch.testing.assert_close(mine.grad.data, ref.grad, rtol=1e-5, atol=1e-5)
    assert call_plans.STATS["hits"] - hits0 >= 4  # forward and backward replayed in steps 3 and 4


def test_scratch_buffers_are_reallocated(monkeypatch):
    """Split-K writes partial sums into a scratch buffer the op allocates; a replay gets its own."""
    monkeypatch.setattr(gemm_kernels, "SPLIT_K_MIN_K", 16)
    monkeypatch.setattr(gemm_kernels, "SPLIT_K_CHUNK", 32)
    a, b = _fresh(3, 100), _fresh(100, 4)
    outs, hits = _calls(lambda x, y: registry.call("gemm", x, y)[0], list(zip(a, b)))
    assert hits == 2
    for out, x, y in zip(outs, a, b):
        torch.testing.assert_close(out, (x.double() @ y.double()).float(), rtol=1e-5, atol=1e-5)


def test_views_with_other_offsets_replay():
    """Inputs that are views at different storage offsets (same shape and strides) share a plan."""
    base = randn(12, 8)
    views = [base[i:i + 5, 1:] for i in range(4)]
    outs, hits = _calls(lambda x: registry.call("activation", x, act="relu"), [(v,) for v in views])
    assert hits == 2
    for out, v in zip(outs, views):
        torch.testing.assert_close(out, torch.relu(v), rtol=0, atol=0)


def test_the_same_tensor_twice_and_overlapping_inputs_replay():
    xs = _fresh(4, 6)
    outs, hits = _calls(lambda x: registry.call("add", x, x), [(x,) for x in xs])
    assert hits == 2
    for out, x in zip(outs, xs):
        torch.testing.assert_close(out, x + x, rtol=0, atol=0)
    assert call_plans.key("add", (xs[0], xs[0]), {}) != call_plans.key("add", (xs[0], xs[1]), {})
    # overlapping but not the same bytes (rows 0-3 and 1-4 of one buffer): each kernel argument is
    # one of the inputs itself, so the plan reads each from its own input, and replays with
    # disjoint inputs of the same layout reuse it
    bases = _fresh(5, 6)
    outs, hits = _calls(lambda b: registry.call("add", b[:4], b[1:]), [(b,) for b in bases])
    assert hits == 2
    for out, b in zip(outs, bases):
        torch.testing.assert_close(out, b[:4] + b[1:], rtol=0, atol=0)
    ys, zs = _fresh(4, 6), _fresh(4, 6)
    outs, hits = _calls(lambda y, z: registry.call("add", y, z), list(zip(ys, zs)))
    assert hits == 2
    for out, y, z in zip(outs, ys, zs):
        torch.testing.assert_close(out, y + z, rtol=0, atol=0)


def test_attention_on_interleaved_qkv_slices_replays():
    """q, k, v as a GPT makes them (slices of one projection's rows): forward and backward replay."""
    B, L, H, E = 2, 5, 2, 16
    hits0 = call_plans.STATS["hits"]
    for _ in range(4):
        qkv = randn(B, L, 3, H, E)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        o, lse = registry.call("attention", q, k, v, scale=0.25, is_causal=True)
        do = randn(B, H, L, E)
        dq, dk, dv = registry.call("attention_backward", do, q, k, v, o, lse, scale=0.25, is_causal=True)
        tq, tk, tv = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=0.25)
        ref.backward(do.double())
        for mine, want in ((o, ref), (dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
            torch.testing.assert_close(mine.double(), want, rtol=1e-4, atol=1e-4)
    assert call_plans.STATS["hits"] - hits0 == 4  # both ops replayed in calls 3 and 4


def test_replayed_calls_still_check_their_indices():
    """The bad-index check is host work kept in the plan as a host step: a replay with an
    out-of-range index raises as the full path does (at once on the CPU, deferred on the GPU)."""
    w = randn(7, 5)
    hits = call_plans.STATS["hits"]
    for _ in range(4):
        idx = torch.randint(0, 7, (3, 4), device=DEVICE)
        torch.testing.assert_close(registry.call("embedding", idx, w), w[idx], rtol=0, atol=0)
    assert call_plans.STATS["hits"] - hits == 2
    bad = torch.randint(0, 7, (3, 4), device=DEVICE)
    bad[1, 2] = 7
    assert call_plans.find("embedding", (bad, w), {})[1] is not None  # the next call is a replay
    with pytest.raises(ValueError, match=r"embedding: 1 index value\(s\) out of range: a table of 7 rows"):
        registry.call("embedding", bad, w)
        ge2.check_pending_indices()


def test_which_input_an_alias_repeats_is_part_of_the_key():
    # mul's backward: dx = gy * y, dy = gy * x. (g, a, g) and (g, a, a) alias different inputs.
    def grads(gy, x, y):
        return registry.call("binary_backward", gy, x, y, op_name="mul", need_a=True, need_b=True)

    for pattern, replays in (((0, 1, 0), 2), ((0, 1, 1), 2), ((0, 1, 0), 4)):  # the third: the first's plan
        hits = call_plans.STATS["hits"]
        for _ in range(4):
            g, a = randn(3, 5), randn(3, 5)
            args = tuple((g, a)[k] for k in pattern)
            dx, dy = grads(*args)
            torch.testing.assert_close(dx, args[0] * args[2], rtol=0, atol=0)
            torch.testing.assert_close(dy, args[0] * args[1], rtol=0, atol=0)
        assert call_plans.STATS["hits"] - hits == replays
    assert call_plans.key("binary_backward", (g, a, g), {}) != call_plans.key("binary_backward", (g, a, a), {})


def test_torch_work_inside_an_op_refuses_the_recording():
    """An op that fills or copies with torch cannot be replayed from its launches alone."""
    name = "test_call_plans_fill"
    if name not in registry.ops():
        from ge2.backend.schema import Schema, TensorArg

        registry.defop(name, Schema((TensorArg("x"),)))

        @registry.register(name, "triton")
        def _fill_then_add(x):
            y = torch.ones_like(x)  # torch computes: a replay would skip this fill
            return registry.call("add", x, y)

    xs = _fresh(3, 3)
    outs, hits = _calls(lambda x: registry.call(name, x), [(x,) for x in xs])
    for out, x in zip(outs, xs):
        torch.testing.assert_close(out, x + 1, rtol=0, atol=0)
    assert any(op == name and "torch ran" in why for op, why in call_plans.REFUSED)
    assert call_plans.find(name, (xs[0],), {})[1] is None


def test_keys_separate_dtypes_precisions_and_attributes():
    x32, x16 = randn(4, 5), randn(4, 5, dtype=torch.bfloat16)
    k = call_plans.key("relu", (x32,), {})
    assert k != call_plans.key("relu", (x16,), {})
    assert k != call_plans.key("relu", (x32.t().contiguous().t(),), {})  # other strides
    assert call_plans.key("softmax", (x32,), {"dim": 0}) != call_plans.key("softmax", (x32,), {"dim": 1})
    assert call_plans.key("x", (1.0,), {}) != call_plans.key("x", (-0.0,), {}) != call_plans.key("x", (0.0,), {})
    before = call_plans.key("gemm", (x32, x32), {})
    ge2.set_matmul_precision("ieee" if ge2.get_matmul_precision() != "ieee" else "tf32")  # conftest restores it
    assert call_plans.key("gemm", (x32, x32), {}) != before
    assert call_plans.key("x", ([x32],), {}) is None  # lists are not keyed: such calls take the full path


def test_plans_do_not_keep_inputs_alive():
    for _ in range(4):
        x = randn(64, 33)
        registry.call("activation", x, act="relu")
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None


def test_training_steps_replay_and_match_the_full_path(monkeypatch):
    """Six SGD steps of a small MLP: with call plans they give the parameters the full path gives."""

    def train(plans: bool):
        monkeypatch.setattr(call_plans, "ENABLED", plans)
        call_plans.clear()
        torch.manual_seed(0)
        model = ge2.nn.Sequential(ge2.nn.Linear(7, 11), ge2.nn.ReLU(), ge2.nn.Linear(11, 3)).to(DEVICE)
        opt = ge2.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x = ge2.from_torch(torch.randn(5, 7, generator=g).to(DEVICE))
            y = ge2.from_torch(torch.randint(0, 3, (5,), generator=g).to(DEVICE))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return [p.data.clone() for p in model.parameters()]

    hits = call_plans.STATS["hits"]
    replayed = train(True)
    assert call_plans.STATS["hits"] - hits >= 12
    for mine, ref in zip(replayed, train(False)):
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)


def test_torch_copies_inside_an_op_are_replayed():
    """conv2d on NCHW input copies it to channels-last with torch (a clone): the replay redoes the copy."""
    xs = [randn(2, 3, 6, 5) for _ in range(4)]
    w, b = randn(4, 3, 3, 3), randn(4)
    outs, hits = _calls(lambda x: registry.call("conv2d", x, w, b, padding=1)[0], [(x,) for x in xs])
    for out, x in zip(outs, xs):
        ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    assert hits == 2, call_plans.REFUSED


def test_kmajor_copies_in_gemm_backward_are_replayed(monkeypatch):
    """fp32 backward GEMMs copy an operand K-major with torch first; replays redo the copy."""
    monkeypatch.setattr(gemm_kernels, "KMAJOR_COPY_MIN", 0)
    ge2.set_matmul_precision("tf32x3")  # conftest restores it
    a, b, gys = _fresh(5, 7), _fresh(7, 6), _fresh(5, 6)
    outs, hits = _calls(lambda x, y, gy: registry.call("gemm_backward", gy, x, y), list(zip(a, b, gys)))
    assert hits == 2, call_plans.REFUSED
    for (da, db, _, _), x, y, gy in zip(outs, a, b, gys):
        torch.testing.assert_close(da, gy @ y.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(db, x.T @ gy, rtol=1e-5, atol=1e-5)


def test_outputs_that_are_views_of_allocations_replay():
    """conv2d_backward may return dX as a permuted view of a channels-last buffer it allocated."""
    call_plans.REFUSED.clear()  # only this test's refusals (earlier tests' first calls refuse by design)
    xs, gys = [randn(2, 3, 7, 6) for _ in range(4)], [randn(2, 4, 7, 6) for _ in range(4)]
    w = randn(4, 3, 3, 3)
    for step, (x, gy) in enumerate(zip(xs, gys)):
        gx = ge2.from_torch(x, requires_grad=True)
        gw = ge2.from_torch(w, requires_grad=True)
        F.conv2d(gx, gw, padding=1).backward(ge2.from_torch(gy))
        tx, tw = x.double().requires_grad_(), w.double().requires_grad_()
        torch.nn.functional.conv2d(tx, tw, padding=1).backward(gy.double())
        torch.testing.assert_close(gx.grad.data.double(), tx.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gw.grad.data.double(), tw.grad, rtol=1e-4, atol=1e-4)
    assert not [k for k in call_plans.REFUSED if k[0].startswith("conv2d")], call_plans.REFUSED


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="ge2's launcher is CUDA code: GPU only")


def _native_plan(name, *inputs, **attrs):
    """The plan of a repeated call, after asserting that its launches go through ge2's launcher."""
    assert native.module() is not None, "ge2_native did not build"
    for _ in range(3):
        registry.call(name, *inputs, **attrs)
    plan = call_plans.find(name, inputs, attrs)[1]
    assert plan is not None, f"{name} was not recorded"
    assert any(type(v).__name__ == "Launch" for v in plan.replay.__globals__.values()), plan.source
    return plan


def _native_runs(call):
    """call() once; how many of its op calls the compiled dispatch replayed without Python."""
    native_hits = call_plans.STATS["native"]
    call()
    return call_plans.STATS["native"] - native_hits


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_native_launches_pack_pointers_ints_tuples_and_floats(dtype):
    """add (tuple sizes, int64 scalars), a scaled softmax (an fp32 scalar), a fused GEMM (many ints):
    replays through ge2's launcher give the full path's results with new tensors."""
    def operands():
        if dtype == torch.int64:
            return (torch.randint(-2**40, 2**40, (33, 1, 7), device=DEVICE),
                    torch.randint(-2**40, 2**40, (5, 7), device=DEVICE))
        return randn(33, 1, 7, dtype=dtype), randn(5, 7, dtype=dtype)

    assert _native_plan("add", *operands()).native is not None
    for _ in range(2):
        x, y = operands()
        assert _native_runs(lambda: torch.testing.assert_close(registry.call("add", x, y), x + y, rtol=0, atol=0)) == 1
    if dtype == torch.int64:
        return
    s = randn(9, 131, dtype=dtype)
    assert _native_plan("softmax", s, dim=1, scale=0.37).native is not None
    s = randn(9, 131, dtype=dtype)
    ref = torch.softmax(s.float() * 0.37, dim=1).to(dtype)
    assert _native_runs(lambda: torch.testing.assert_close(registry.call("softmax", s, dim=1, scale=0.37), ref,
                                                           rtol=2e-2, atol=1e-3)) == 1
    a, w, b = randn(6, 9), randn(5, 9), randn(5)
    _native_plan("gemm", a, w, None, b, trans_b=True, bias_kind="per_n", act="relu")
    a, w, b = randn(6, 9), randn(5, 9), randn(5)
    out = registry.call("gemm", a, w, None, b, trans_b=True, bias_kind="per_n", act="relu")[0]
    torch.testing.assert_close(out, torch.relu(a.double() @ w.double().T + b.double()).float(), rtol=1e-4, atol=1e-4)


@gpu
def test_native_launches_run_on_the_current_stream_and_in_new_threads():
    import threading

    x, y = randn(64, 65), randn(64, 65)
    _native_plan("mul", x, y)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(50):  # queued behind each other on the side stream only
            out = registry.call("mul", x, y)
    side.synchronize()
    torch.testing.assert_close(out, x * y, rtol=0, atol=0)
    results = []
    thread = threading.Thread(target=lambda: results.append(registry.call("mul", x, y)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    torch.testing.assert_close(results[0], x * y, rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("precision", ["tf32x3", "tf32"])
def test_compiled_dispatch_returns_what_the_python_replay_returns(precision):
    """A plan with several outputs (a fused GEMM's tuple; on Hopper its kernel reads TMA descriptors,
    encoded as tf32 with "tf32") replayed by the compiled dispatch: the same structure and bits as
    the plan's Python replay (Triton's launcher); a launch hook sends the call to Python."""
    if registry.call is registry.python_call:
        pytest.skip("ge2_native cannot be built here")
    old = ge2.set_matmul_precision(precision)
    try:
        a, w, b = randn(257, 264), randn(256, 264), randn(256)  # M*N*K past gemm.SMALL_PROBLEM: TMA
        attrs = dict(trans_b=True, bias_kind="per_n", act="gelu", save_z=True)
        plan = _native_plan("gemm", a, w, None, b, **attrs)
        assert plan.native is not None, plan.source
        if torch.cuda.get_device_capability()[0] >= 9:  # the launch's tensor maps are re-aimed per call
            kinds = [str(kind) for _, lp, *_ in plan.launches for kind in lp.kernel.src.signature.values()]
            assert any(kind.startswith("tensordesc") for kind in kinds), kinds
        a, w, b = randn(257, 264), randn(256, 264), randn(256)
        python = plan.replay((a, w, None, b))
        if precision == "tf32x3":
            z = a.double() @ w.double().T + b.double()
            torch.testing.assert_close(python[1], z.float(), rtol=1e-4, atol=1e-4)
        got = []
        assert _native_runs(lambda: got.append(registry.call("gemm", a, w, None, b, **attrs))) == 1
        assert type(got[0]) is type(python) and len(got[0]) == len(python)
        for mine, theirs in zip(got[0], python):
            assert (mine is None) == (theirs is None)
            if mine is not None:
                torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
                assert mine.data_ptr() != theirs.data_ptr()  # fresh outputs each call
        from triton import knobs

        seen = []

        def hook(metadata):
            seen.append(metadata)

        knobs.runtime.launch_enter_hook.add(hook)
        try:
            assert _native_runs(lambda: registry.call("gemm", a, w, None, b, **attrs)) == 0
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        assert seen, "the hook did not see the launch the Python replay made"
        # while an outer op records, the plan replays in Python and its launch reads the descriptors'
        # addresses (call_plans._Descriptor) for ge2's packed launcher
        from ge2.kernels import launch

        recorded = []
        with launch.recording(launch.Recorder()):
            recorded.append(registry.call("gemm", a, w, None, b, **attrs))
        for mine, theirs in zip(recorded[0], python):
            if mine is not None:
                torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    finally:
        ge2.set_matmul_precision(old)


def test_the_compiled_dispatch_and_python_call_agree():
    """registry.call (compiled) and registry.python_call: the same results, plans, replays and errors."""
    if registry.call is registry.python_call:
        pytest.skip("ge2_native cannot be built here (no C compiler)")
    for entry in (registry.call, registry.python_call):
        call_plans.clear()
        x, y = randn(5, 7), randn(7)
        outs, replays = _calls(lambda u, v: entry("add", u, v), [(x, y)] * 4)
        assert replays == 2  # the first call runs, the second records, then two replays
        for out in outs:
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        torch.testing.assert_close(entry("softmax", x, dim=0, scale=2.0), torch.softmax(2 * x, dim=0))
        torch.testing.assert_close(entry("sum", x, dims=[1], keepdim=False), x.sum(1))  # a list: not keyed
        with pytest.raises(KeyError, match="no op named 'nope'"):
            entry("nope", x)
        with pytest.raises((TypeError, ValueError), match="add"):
            entry("add", x, randn(3))
        with ge2.use_backend("torch"):
            hits = call_plans.STATS["hits"]
            torch.testing.assert_close(entry("add", x, y), x + y)
            assert call_plans.STATS["hits"] == hits


def test_the_compiled_key_is_the_python_key():
    """native.c's call_key builds, item for item, the tuple python_key builds (or None with it)."""
    if native.module() is None:
        pytest.skip("ge2_native cannot be built here (no C compiler)")
    c_key = native.call_key()
    x, y = randn(4, 6), randn(4, 6, noncontig=True)
    cases = [
        ("add", (x, y), {}), ("add", (x, x), {}), ("add", (y, x, y), {}), ("mul", (x[1:], 2), {}),
        ("x", (1.5, -0.0, 0.0, True, 3, "s", None), {}), ("x", (x.to(torch.float16), x.t()), {"dim": 1}),
        ("softmax", (x,), {"dim": -1, "scale": -0.0, "mask": None, "name": "n", "flag": False,
                           "dims": (0, 1), "dtype": torch.bfloat16, "eps": 1e-5}),
        ("x", ([x],), {}), ("x", (x,), {"w": x}), ("x", (x,), {"l": [1]}), ("x", (), {}),
    ]
    for op, inputs, attrs in cases:
        for precision in ("tf32x3", "ieee"):
            expected = call_plans.python_key(op, precision, inputs, attrs)
            got = c_key(op, precision, inputs, attrs)
            assert got == expected and [type(v) for v in got or ()] == [type(v) for v in expected or ()], (op, inputs, attrs)
    assert c_key("add", "ieee", (x, y), {}) != c_key("add", "ieee", (x, x), {})


def test_an_op_recorded_while_its_inner_ops_replay():
    """linear_cross_entropy calls gemm through the registry: from the third call on, those inner calls
    replay their own plans (on the GPU with raw addresses) while the outer call is being recorded."""
    N, H, V = 6, 8, 37
    for step in range(5):
        x, w, b = randn(N, H), randn(V, H), randn(V)
        t = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(step)).to(DEVICE)
        gx, gw, gb = (ge2.from_torch(v, requires_grad=True) for v in (x, w, b))
        loss = F.linear_cross_entropy(gx, gw, ge2.from_torch(t), linear_bias=gb)
        loss.backward()
        tx, tw, tb = (v.clone().requires_grad_() for v in (x, w, b))
        ref = torch.nn.functional.cross_entropy(tx @ tw.T + tb, t)
        ref.backward()
        torch.testing.assert_close(loss.data, ref.detach(), rtol=1e-5, atol=1e-5)
        for mine, theirs in ((gx, tx), (gw, tw), (gb, tb)):
            torch.testing.assert_close(mine.grad.data, theirs.grad, rtol=1e-4, atol=1e-5)


@triton.jit
def _unplanned_double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2x: a kernel outside ge2.kernels, so no launch plan ever watches it."""
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


def _unplanned_double(x):
    y = torch.empty_like(x)
    _unplanned_double_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


registry.defop("test_unplanned_double", Schema((TensorArg("x"),)))
registry.register("test_unplanned_double", "triton")(_unplanned_double)


def test_an_op_whose_launches_are_unseen_is_not_recorded():
    """A kernel off the planned path is invisible to the recorder: replaying its op would skip it and
    return an unwritten buffer, so the recording is refused and every call runs the op."""
    xs = _fresh(7)
    outs, hits = _calls(lambda x: registry.call("test_unplanned_double", x), [(x,) for x in xs])
    assert hits == 0
    reasons = {why for op, why in call_plans.REFUSED if op == "test_unplanned_double"}
    # (the interpreter's own torch work inside the unwatched launch is refused first on the CPU)
    assert call_plans.UNSEEN in reasons if torch.cuda.is_available() else reasons
    for out, x in zip(outs, xs):
        torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)
