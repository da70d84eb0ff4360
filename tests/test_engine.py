"""Autograd engine semantics: graph shapes, accumulation, grad modes, retain_graph, versions."""
from __future__ import annotations

import pytest
import torch

import ge2
from numerics import randn


def leaf(*shape):
    return ge2.from_torch(randn(*shape), requires_grad=True)


def torch_grad(fn, *xs):
    ts = [x.data.detach().clone().requires_grad_() for x in xs]
    fn(*ts).backward()
    return [t.grad for t in ts]


def close(a, b):
    return torch.allclose(a.data if isinstance(a, ge2.Tensor) else a, b, rtol=1e-5, atol=1e-6)


def test_diamond_graph():
    x = leaf(3, 4)
    fn = lambda x: ((x * 2).exp() + (x * 2).sigmoid() * x).sum()  # noqa: E731
    fn(x).backward()
    (ref,) = torch_grad(fn, x)
    assert close(x.grad, ref)


def test_reuse_and_shared_intermediate():
    x, y = leaf(5), leaf(5)
    def fn(x, y):
        h = x * y
        return (h * h + h * x + h).sum()
    fn(x, y).backward()
    rx, ry = torch_grad(fn, x, y)
    assert close(x.grad, rx) and close(y.grad, ry)


def test_gradients_accumulate_across_backward_calls():
    x = leaf(4)
    (x * 3).sum().backward()
    first = x.grad.data.clone()
    (x * x).sum().backward()
    assert close(x.grad, first + 2 * x.data)
    x.grad = None
    (x * 3).sum().backward()
    assert close(x.grad, first)


def test_grad_takes_the_leafs_layout_like_torch():
    # A channels-last leaf gets a channels-last .grad (accumulations then stay flat), a contiguous
    # leaf a contiguous one whatever the layout of the gradient that reaches it.
    for memory_format in (torch.channels_last, torch.contiguous_format):
        x = ge2.from_torch(randn(2, 3, 4, 5).contiguous(memory_format=memory_format), requires_grad=True)
        g = randn(2, 5, 4, 3, seed=1).permute(0, 3, 2, 1)  # neither layout
        fn = lambda x: x * ge2.from_torch(g)  # noqa: E731
        for _ in range(2):
            fn(x).backward(ge2.from_torch(randn(2, 3, 4, 5, seed=2)))
        ref = x.data.detach().clone().requires_grad_()
        for _ in range(2):
            (ref * g).backward(randn(2, 3, 4, 5, seed=2))
        assert x.grad.data.stride() == ref.grad.stride() and close(x.grad, ref.grad)


def test_grad_of_same_leaf_twice_in_one_node_is_not_aliased():
    x = leaf(3)
    y = leaf(3)
    (x + y).sum().backward()
    x.grad.data.mul_(0)  # a user scaling one grad in place must not touch the other
    assert close(y.grad, torch.ones(3, device=x.device))


def test_no_grad_context_and_decorator():
    x = leaf(3)
    with ge2.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None

    @ge2.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad
    with ge2.no_grad():
        with ge2.enable_grad():
            z = x * 2
    assert z.requires_grad and z.grad_fn is not None
    assert ge2.is_grad_enabled()


def test_set_grad_enabled():
    x = leaf(2)
    with ge2.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad


def test_detach_stops_gradient():
    x = leaf(4)
    y = x * 2
    z = (y.detach() * x).sum()
    z.backward()
    assert close(x.grad, 2 * x.data)
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and d.data.data_ptr() == y.data.data_ptr()


def test_retain_graph():
    x = leaf(3)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    g1 = x.grad.data.clone()
    y.backward()
    assert close(x.grad, 2 * g1)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_deep_chain_is_iterative():
    # 10,000 nodes: a recursive engine would hit Python's recursion limit. The oracle backend
    # keeps this test about the engine (each step is one tiny op either way).
    with ge2.use_backend("torch"):
        x = leaf(1)
        y = x
        for _ in range(10_000):
            y = y * 1.0001
        y.sum().backward()
    t = x.data.clone().requires_grad_()
    ty = t
    for _ in range(10_000):
        ty = ty * 1.0001
    ty.sum().backward()
    assert close(x.grad, t.grad)


def test_inplace_after_save_raises():
    x = leaf(4)
    h = x * 2
    y = h.exp()  # saves its output y
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_inplace_on_saved_input_through_a_view_raises():
    x = leaf(2, 3)
    h = x * 1.0
    y = (h * h).sum()  # mul saves h
    with ge2.no_grad():
        h.view(6).mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_inplace_add_on_nonleaf_records_gradient():
    x, r = leaf(5), leaf(5)
    h = x * 3
    h += r  # the ResNet pattern: out += identity
    (h * h).sum().backward()
    rx, rr = torch_grad(lambda x, r: ((x * 3 + r) ** 2).sum(), x, r)
    assert close(x.grad, rx) and close(r.grad, rr)
    assert h._version == 1


def test_inplace_on_leaf_requiring_grad_raises():
    x = leaf(3)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x.add_(1.0)
    with ge2.no_grad():
        x.sub_(x * 0.5)  # the optimizer pattern works under no_grad
    assert x._version == 1


def test_non_scalar_backward_needs_gradient():
    x = leaf(3)
    y = x * 2
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        y.backward()
    y.backward(ge2.from_torch(randn(3)))
    assert x.grad is not None
    with pytest.raises(ValueError, match="gradient has shape"):
        (x * 2).backward(ge2.from_torch(randn(4)))


def test_backward_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        ge2.from_torch(randn(2)).sum().backward()


def test_retain_grad_on_intermediate():
    x = leaf(3)
    h = x * 2
    h.retain_grad()
    (h * h).sum().backward()
    assert close(h.grad, 2 * h.data)
    assert close(x.grad, 8 * x.data)


def test_unused_branch_and_partial_requires_grad():
    x = leaf(3)
    c = ge2.from_torch(randn(3))
    values, indices = (x * c).reshape(1, 3).max(1)
    _unused = x.exp()
    values.sum().backward()
    assert c.grad is None
    expected = torch.zeros(3, device=x.device)
    expected[indices.data[0]] = c.data[indices.data[0]]
    assert close(x.grad, expected)


def test_requires_grad_rules():
    with pytest.raises(RuntimeError, match="floating-point"):
        ge2.arange(3).requires_grad_()
    y = leaf(2) * 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        y.requires_grad = False


def test_version_counter_shared_by_views():
    x = ge2.from_torch(randn(4, 4))
    v = x[1]
    v.fill_(1.0)
    assert x._version == 1 and v._version == 1
    x.zero_()
    assert v._version == 2


def test_grad_mode_decorator_is_reentrant():
    x = leaf(2)

    @ge2.no_grad()
    def recurse(n):
        return recurse(n - 1) if n else x * 2

    assert not recurse(3).requires_grad and ge2.is_grad_enabled()

    @ge2.set_grad_enabled(False)
    def f():
        return x * 2

    ge2.set_grad_enabled(True)
    assert not f().requires_grad and not f().requires_grad and ge2.is_grad_enabled()


def test_inplace_on_an_input_saved_as_a_view_raises():
    # Linear saves x.reshape(-1, in): a view of x. Writing x in place must still be caught.
    x = ge2.from_torch(randn(2, 3, 4), requires_grad=True)
    h = x * 1.0
    w = leaf(5, 4)
    y = ge2.nn.functional.linear(h, w).sum()
    with ge2.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def _apply_cases(x, y, w, b):
    """Ops whose results test_the_compiled_apply_matches_the_python_apply compares: fresh outputs,
    views (which share their input's version counter), a view of a view, several outputs, scalars."""
    return {
        "x + y": lambda: x + y,
        "2.5 - x": lambda: 2.5 - x,
        "x[1:]": lambda: x[1:],
        "x[1:].reshape(-1)": lambda: x[1:].reshape(-1),
        "x.transpose(0, 1)": lambda: x.transpose(0, 1),
        "x.max(dim=1)": lambda: x.max(dim=1),
        "linear relu": lambda: ge2.nn.functional.linear(x, w, b, activation="relu"),
    }


def _described(result, inputs):
    """Each output's data, and which input's version counter it shares (index, or None: its own)."""
    outs = result if isinstance(result, tuple) else (result,)
    return [(o.data, o.requires_grad, o.grad_fn,
             next((i for i, t in enumerate(inputs) if t._version_counter is o._version_counter), None))
            for o in outs]


@pytest.mark.parametrize("grad", ["no inputs require grad", "no_grad"])
def test_the_compiled_apply_matches_the_python_apply(grad, monkeypatch):
    from ge2.autograd import function

    if function.Function.apply.__func__ is function._python_apply:
        pytest.skip("ge2's compiled helpers are not built here")
    needs = grad == "no_grad"
    x, y = ge2.from_torch(randn(5, 7), requires_grad=needs), ge2.from_torch(randn(5, 7))
    w, b = ge2.from_torch(randn(3, 7)), ge2.from_torch(randn(3))
    inputs = (x, y, w, b)
    with ge2.set_grad_enabled(not needs):
        compiled = {k: _described(f(), inputs) for k, f in _apply_cases(*inputs).items()}
        monkeypatch.setattr(function.Function, "apply", classmethod(function._python_apply))
        python = {k: _described(f(), inputs) for k, f in _apply_cases(*inputs).items()}
    for name in compiled:
        assert len(compiled[name]) == len(python[name]), name
        for (data, rg, fn, shared), (data_p, rg_p, fn_p, shared_p) in zip(compiled[name], python[name]):
            assert torch.equal(data, data_p) and data.stride() == data_p.stride(), name
            assert (rg, fn, shared) == (rg_p, fn_p, shared_p) == (False, None, shared_p), name
    assert compiled["x[1:]"][0][3] == 0 and compiled["x[1:].reshape(-1)"][0][3] == 0  # views share x's counter
    assert compiled["x + y"][0][3] is None


def test_the_compiled_apply_records_through_python():
    x = leaf(4, 3)
    y = (x * x).sum()
    assert y.grad_fn is not None and y.requires_grad
    y.backward()
    assert close(x.grad, 2 * x.data)
