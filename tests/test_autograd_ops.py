"""Every Tensor op, forward and backward, against torch autograd (and float64 references)."""
from __future__ import annotations

import pytest
import torch

import ge2
from numerics import DEVICE, LARGE, assert_matches, randn


def _ge2_inputs(xs, requires_grad=True):
    return [ge2.from_torch(x, requires_grad=requires_grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in xs]


def _torch_inputs(xs, dtype=None):
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(x.detach().to(dtype or x.dtype).requires_grad_())
        else:
            out.append(x)
    return out


def check(ge2_fn, torch_fn, inputs, *, grad=True, factor=2.0):
    """Forward and (random-cotangent) backward of ge2_fn vs torch_fn in the same dtype and in float64."""
    g_in = _ge2_inputs(inputs, grad)
    t_in = _torch_inputs(inputs)
    r_in = _torch_inputs(inputs, torch.float64)
    out = ge2_fn(*g_in)
    t_out = torch_fn(*t_in)
    r_out = torch_fn(*r_in)
    assert out.shape == t_out.shape and out.dtype == t_out.dtype, (out.shape, t_out.shape, out.dtype, t_out.dtype)
    assert_matches(out.data, r_out, t_out, factor=factor, name="forward")
    if not grad:
        return
    gy = randn(*t_out.shape, dtype=t_out.dtype)
    out.backward(ge2.from_torch(gy))
    t_out.backward(gy)
    r_out.backward(gy.double())
    for i, (g, t, r) in enumerate(zip(g_in, t_in, r_in)):
        if isinstance(g, ge2.Tensor) and g.requires_grad:
            assert g.grad is not None, f"input {i} got no gradient"
            assert g.grad.shape == g.shape and g.grad.dtype == g.dtype
            assert_matches(g.grad.data, r.grad, t.grad, factor=factor, name=f"grad of input {i}")


FLOATS = [torch.float32, torch.bfloat16, torch.float16]

BINARY_SHAPES = [((7,), (7,)), ((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((2, 3), ()), ((5, 1), (1, 6))]
if LARGE:
    BINARY_SHAPES += [((1000, 333), (333,)), ((64, 1, 257), (1, 129, 257))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
def test_binary(op, shapes):
    a, b = randn(*shapes[0]), randn(*shapes[1])
    if op == "pow":
        a = a.abs() + 0.5
    if op == "div":
        b = b.sign() * (b.abs() + 0.5)
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "div": lambda x, y: x / y, "pow": lambda x, y: x ** y}[op]
    check(fn, fn, [a, b])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("noncontig", [False, True])
def test_binary_dtypes_and_strides(dtype, noncontig):
    a = randn(4, 9, dtype=dtype, noncontig=noncontig)
    b = randn(9, 4, dtype=dtype).t()  # transposed view
    check(lambda x, y: x * y + x / (y.abs() + 1.0), lambda x, y: x * y + x / (y.abs() + 1.0), [a, b])


@pytest.mark.parametrize("scalar", [2.5, -3, 0.1])
def test_scalar_operands(scalar):
    a = randn(3, 5)
    check(lambda x: (scalar - x) * scalar / (x.abs() + 1) + x ** 2 + scalar ** (x * 0.1),
          lambda x: (scalar - x) * scalar / (x.abs() + 1) + x ** 2 + scalar ** (x * 0.1), [a])


def test_bf16_scalar_rounds_like_torch():
    a = randn(64, dtype=torch.bfloat16)
    check(lambda x: x * 0.1 + 0.3, lambda x: x * 0.1 + 0.3, [a], factor=1.0)


UNARY = {
    "neg": (lambda x: -x, lambda x: -x, None),
    "exp": (lambda x: x.exp(), torch.exp, None),
    "log": (lambda x: x.log(), torch.log, "pos"),
    "sqrt": (lambda x: x.sqrt(), torch.sqrt, "pos"),
    "abs": (lambda x: x.abs(), torch.abs, None),
    "tanh": (lambda x: x.tanh(), torch.tanh, None),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid, None),
    "relu": (lambda x: x.relu(), torch.relu, None),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary(name, dtype):
    g_fn, t_fn, domain = UNARY[name]
    x = randn(5, 7, dtype=dtype, noncontig=True)
    if domain == "pos":
        x = x.abs() + 0.1
    check(g_fn, t_fn, [x])


@pytest.mark.parametrize("act", ["leaky_relu", "gelu", "gelu_tanh", "silu"])
def test_other_activations(act):
    import torch.nn.functional as F

    ref = {"leaky_relu": lambda x: F.leaky_relu(x, 0.2), "gelu": F.gelu,
           "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}[act]
    check(lambda x: ge2.autograd.math.activation(x, act, 0.2), ref, [randn(6, 5) * 3])


REDUCTIONS = [
    ((4, 5, 6), None, False), ((4, 5, 6), 1, False), ((4, 5, 6), (0, 2), True), ((4, 5, 6), -1, True),
    ((1, 7), 0, False), ((9,), 0, True), ((), None, False),
]
if LARGE:
    REDUCTIONS += [((512, 1000), 1, False), ((3, 70000), None, False), ((1000, 64), 0, True)]


@pytest.mark.parametrize("shape,dim,keepdim", REDUCTIONS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_reductions(op, shape, dim, keepdim):
    x = randn(*shape)
    fn = {"sum": lambda t: t.sum(dim, keepdim=keepdim) if dim is not None else t.sum(),
          "mean": lambda t: t.mean(dim, keepdim=keepdim) if dim is not None else t.mean(),
          "amax": lambda t: t.amax(dim, keepdim=keepdim) if dim is not None else t.amax()}[op]
    check(fn, fn, [x])


@pytest.mark.parametrize("dtype", FLOATS)
def test_reductions_dtypes_noncontig(dtype):
    x = randn(6, 11, dtype=dtype, noncontig=True)
    check(lambda t: t.sum(0) + t.mean(0) * 2, lambda t: t.sum(0) + t.mean(0) * 2, [x])


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_max_dim(dim, keepdim):
    x = randn(5, 8)
    g = ge2.from_torch(x, requires_grad=True)
    values, indices = g.max(dim, keepdim=keepdim)
    t = x.clone().requires_grad_()
    tv, ti = t.max(dim, keepdim=keepdim)
    assert torch.equal(indices.data.cpu(), ti.cpu()) and indices.dtype == torch.int64
    assert torch.equal(values.data, tv.detach())
    assert not indices.requires_grad
    gy = randn(*tv.shape)
    values.backward(ge2.from_torch(gy))
    tv.backward(gy)
    assert torch.equal(g.grad.data, t.grad)


def test_max_all_ties_share_gradient():
    x = torch.tensor([1.0, 3.0, 3.0, -2.0], device=DEVICE)
    check(lambda t: t.max(), lambda t: t.max(), [x])


VIEWS = {
    "reshape": (lambda t: t.reshape(6, -1), lambda t: t.reshape(6, -1)),
    "view": (lambda t: t.view(2, 3, 4, 5), lambda t: t.view(2, 3, 4, 5)),
    "flatten": (lambda t: t.flatten(1), lambda t: t.flatten(1)),
    "transpose": (lambda t: t.transpose(0, 2), lambda t: t.transpose(0, 2)),
    "T": (lambda t: t.T, lambda t: t.permute(2, 1, 0)),
    "permute": (lambda t: t.permute(1, 2, 0), lambda t: t.permute(1, 2, 0)),
    "unsqueeze": (lambda t: t.unsqueeze(1), lambda t: t.unsqueeze(1)),
    "squeeze": (lambda t: t[:, :1].squeeze(1), lambda t: t[:, :1].squeeze(1)),
    "expand": (lambda t: t[:, :1].expand(2, 3, 5, 10), lambda t: t[:, :1].expand(2, 3, 5, 10)),
    "index": (lambda t: t[1, ::2, None, ..., 1:4], lambda t: t[1, ::2, None, ..., 1:4]),
    "index_neg": (lambda t: t[-1], lambda t: t[-1]),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views(name):
    g_fn, t_fn = VIEWS[name]
    # Multiply by a non-trivial factor so the gradient path carries real values through a kernel.
    check(lambda t: g_fn(t * 1.5), lambda t: t_fn(t * 1.5), [randn(3, 4, 10)])


def test_views_of_noncontiguous_input():
    x = randn(4, 6, noncontig=True)
    check(lambda t: t.T.reshape(-1) * 2, lambda t: t.T.reshape(-1) * 2, [x])


@pytest.mark.parametrize("a_shape,b_shape", [
    ((5, 3), (3, 4)), ((3,), (3, 4)), ((5, 3), (3,)), ((4,), (4,)), ((2, 5, 3), (3, 4)),
    ((2, 1, 5, 3), (3, 3, 2)), ((1, 7), (7, 1)), ((2, 3, 6), (2, 6, 5)),
])
def test_matmul(a_shape, b_shape):
    check(lambda a, b: a @ b, lambda a, b: a @ b, [randn(*a_shape), randn(*b_shape)])


def test_matmul_transposed_inputs():
    a, b = randn(6, 5).t(), randn(7, 6).t()
    check(lambda x, y: x @ y, lambda x, y: x @ y, [a, b])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_half(dtype):
    check(lambda a, b: a @ b, lambda a, b: a @ b, [randn(9, 17, dtype=dtype), randn(17, 5, dtype=dtype)])


def test_where():
    c = randn(4, 1, 5) > 0
    a, b = randn(4, 3, 5), randn(3, 1)
    check(lambda x, y: ge2.where(ge2.from_torch(c), x, y), lambda x, y: torch.where(c, x, y), [a, b])
    check(lambda x: ge2.where(ge2.from_torch(c), x, 0.5), lambda x: torch.where(c, x, 0.5), [a])


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(op):
    a = randn(4, 5)
    b = a.clone()
    b[::2] = randn(2, 5)
    out = getattr(ge2.from_torch(a), f"__{op}__")(ge2.from_torch(b))
    ref = getattr(a, f"__{op}__")(b)
    assert out.dtype == torch.bool and torch.equal(out.data, ref)
    out = getattr(ge2.from_torch(a), f"__{op}__")(0.0)
    assert torch.equal(out.data, getattr(a, f"__{op}__")(0.0))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(dim):
    xs = [randn(3, 2), randn(3, 2), randn(3, 2)]
    if dim == 0:
        xs[1] = randn(5, 2)
    elif dim in (1, -1):
        xs[1] = randn(3, 4)
    check(lambda *t: ge2.cat(list(t), dim) * 2, lambda *t: torch.cat(t, dim) * 2, xs)
    ys = [randn(3, 2) for _ in range(3)]
    check(lambda *t: ge2.stack(list(t), dim) * 2, lambda *t: torch.stack(t, dim) * 2, ys)


def test_dtype_cast_gradient():
    x = randn(4, 3)
    check(lambda t: t.to(torch.bfloat16).float() * 3, lambda t: t.to(torch.bfloat16).float() * 3, [x])


def test_composite_expression():
    x, w, b = randn(8, 5), randn(5, 3), randn(3)
    fn = lambda x, w, b: ((x @ w + b).tanh() * (x @ w).sigmoid()).sum(1).mean()  # noqa: E731
    check(fn, fn, [x, w, b])
