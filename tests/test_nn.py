"""ge2.nn: Module semantics, and every layer forward and backward vs torch's layer with copied weights."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from numerics import DEVICE, LARGE, assert_matches, randn


def compare_layer(g_layer: nn.Module, t_layer: torch.nn.Module, x: torch.Tensor, *, grad_x: bool = True,
                  factor: float = 2.0, copy_weights: bool = True) -> None:
    """Forward and backward of g_layer vs t_layer (fp32) and a float64 copy of it, from the same weights."""
    t_layer = t_layer.to(DEVICE)
    if copy_weights:
        g_layer.load_state_dict(t_layer.state_dict())
    t64 = copy.deepcopy(t_layer).double()
    xg = ge2.from_torch(x.clone(), requires_grad=grad_x and x.is_floating_point())
    xt = x.clone().requires_grad_(grad_x and x.is_floating_point())
    x64 = (x.double() if x.is_floating_point() else x.clone()).requires_grad_(grad_x and x.is_floating_point())
    yg, yt, y64 = g_layer(xg), t_layer(xt), t64(x64)
    assert yg.shape == yt.shape and yg.dtype == yt.dtype
    assert_matches(yg.data, y64, yt, factor=factor, name="forward")
    gy = randn(*yt.shape, seed=7)
    yg.backward(ge2.from_torch(gy))
    yt.backward(gy)
    y64.backward(gy.double())
    if grad_x and x.is_floating_point():
        assert_matches(xg.grad.data, x64.grad, xt.grad, factor=factor, name="grad x")
    t_params = dict(t_layer.named_parameters())
    r_params = dict(t64.named_parameters())
    for name, p in g_layer.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert_matches(p.grad.data, r_params[name].grad, t_params[name].grad, factor=factor, name=f"grad {name}")


# ---------------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.ones(3, device=DEVICE))
        self.register_buffer("count", ge2.zeros(1))
        self.register_buffer("scratch", ge2.zeros(2), persistent=False)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)) * self.scale


def test_module_registration_and_traversal():
    m = nn.Sequential(Block(), nn.Linear(3, 2, activation="tanh"))
    # torch's order: a module's own parameters, then its children's
    assert [n for n, _ in m.named_parameters()] == ["0.scale", "0.fc.weight", "0.fc.bias", "1.weight", "1.bias"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in m.parameters())
    assert [type(c).__name__ for c in m.children()] == ["Block", "Linear"]
    assert [type(c).__name__ for c in m.modules()] == ["Sequential", "Block", "Linear", "ReLU", "Linear"]
    assert list(m.state_dict()) == ["0.scale", "0.count", "0.fc.weight", "0.fc.bias", "1.weight", "1.bias"]
    assert m[0].fc.in_features == 4 and len(m) == 2
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'nope'"):
        m[0].nope
    m.eval()
    assert not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    shared = nn.Linear(2, 2)
    twice = nn.Sequential(shared, shared)
    assert len(list(twice.parameters())) == 2  # a shared parameter is listed once


def test_python_control_flow_in_forward_and_module_list():
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4, activation="tanh") for _ in range(3))

        def forward(self, x, depth):
            for i, layer in enumerate(self.layers):
                if i >= depth:  # define-by-run: the graph is whatever this call executed
                    break
                x = layer(x) + x if i % 2 else layer(x)
            return x

    m = Tower()
    assert len(list(m.parameters())) == 6
    x = ge2.from_torch(randn(2, 4))
    m(x, depth=2).backward(ge2.from_torch(randn(2, 4, seed=1)))
    assert m.layers[1].weight.grad is not None and m.layers[2].weight.grad is None


def test_module_repr_is_readable():
    m = nn.Sequential(nn.Linear(64, 128, activation="relu"), nn.Dropout(0.25), nn.Linear(128, 10))
    assert repr(m) == (
        "Sequential(\n"
        "  (0): Linear(in_features=64, out_features=128, bias=True, activation='relu')\n"
        "  (1): Dropout(p=0.25)\n"
        "  (2): Linear(in_features=128, out_features=10, bias=True)\n"
        ")")


def test_module_needs_super_init_and_typed_assignment():
    class Forgot(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(torch.ones(1))

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        Forgot()
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="cannot assign a int to a parameter"):
        lin.weight = 3
    lin.bias = None
    assert [n for n, _ in lin.named_parameters()] == ["weight"]


def test_zero_grad_and_to_dtype():
    m = nn.Linear(3, 2)
    x = ge2.from_torch(randn(4, 3))
    m(x).backward(ge2.from_torch(randn(4, 2)))
    assert m.weight.grad is not None
    m.zero_grad(set_to_none=False)
    assert torch.count_nonzero(m.weight.grad.data) == 0
    m.zero_grad()
    assert m.weight.grad is None
    w = m.weight
    m.to(torch.float64)
    assert m.weight is w and w.dtype == torch.float64  # same Parameter object, new memory


def test_state_dict_strictness_errors_name_the_keys():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    sd = m.state_dict()
    other = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    other.load_state_dict(sd)
    assert torch.equal(other[1].weight.data, m[1].weight.data)
    missing = {k: v for k, v in sd.items() if k != "1.bias"}
    with pytest.raises(nn.StateDictError, match="missing key\\(s\\): 1.bias"):
        other.load_state_dict(missing)
    with pytest.raises(RuntimeError, match="unexpected key\\(s\\): extra.weight"):
        other.load_state_dict({**sd, "extra.weight": ge2.zeros(1)})
    with pytest.raises(ValueError, match="size mismatch for 0.weight: the checkpoint has shape \\[5, 3\\], "
                                         "the model has \\[4, 3\\]"):
        other.load_state_dict({**sd, "0.weight": ge2.zeros(5, 3)})
    result = other.load_state_dict(missing, strict=False)
    assert result.missing_keys == ["1.bias"] and result.unexpected_keys == []
    with pytest.raises(ValueError, match="size mismatch"):  # shapes are checked even when not strict
        other.load_state_dict({"0.weight": ge2.zeros(5, 3)}, strict=False)


def test_default_init_matches_torch_layers():
    torch.manual_seed(3)
    t = torch.nn.Linear(7, 5, device=DEVICE)
    ge2.manual_seed(3)
    g = nn.Linear(7, 5)
    assert torch.equal(g.weight.data, t.weight.data) and torch.equal(g.bias.data, t.bias.data)
    torch.manual_seed(4)
    te = torch.nn.Embedding(6, 3, padding_idx=2, device=DEVICE)
    ge2.manual_seed(4)
    ge_ = nn.Embedding(6, 3, padding_idx=2)
    assert torch.equal(ge_.weight.data, te.weight.data)


def test_init_functions_match_torch_formulas():
    w = ge2.empty(300, 200)
    for fn, tfn, kwargs in [(nn.init.kaiming_uniform_, torch.nn.init.kaiming_uniform_, dict(a=math.sqrt(5))),
                            (nn.init.kaiming_normal_, torch.nn.init.kaiming_normal_, dict(nonlinearity="relu")),
                            (nn.init.xavier_uniform_, torch.nn.init.xavier_uniform_, dict(gain=2.0)),
                            (nn.init.xavier_normal_, torch.nn.init.xavier_normal_, dict())]:
        ref = torch.empty(300, 200, device=DEVICE)
        torch.manual_seed(0)
        tfn(ref, **kwargs)
        torch.manual_seed(0)
        fn(w, **kwargs)
        assert torch.equal(w.data, ref), fn.__name__
    nn.init.ones_(w)
    assert torch.all(w.data == 1)
    nn.init.zeros_(w)
    assert torch.count_nonzero(w.data) == 0
    with pytest.raises(ValueError, match="at least 2 dims"):
        nn.init.xavier_uniform_(ge2.empty(3))


# ---------------------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act, t_act", [(None, torch.nn.Identity()), ("relu", torch.nn.ReLU()),
                                        ("gelu", torch.nn.GELU()), ("tanh", torch.nn.Tanh()),
                                        ("leaky_relu", torch.nn.LeakyReLU(0.2))])
def test_linear_fused_activation_vs_torch(act, t_act):
    g = nn.Linear(7, 5, activation=act, negative_slope=0.2)
    t = torch.nn.Sequential(torch.nn.Linear(7, 5), t_act).to(DEVICE)
    g.load_state_dict({"weight": t[0].weight, "bias": t[0].bias})  # torch Parameters load directly
    assert not g.weight.data.requires_grad and g.weight.data.grad_fn is None  # ...detached from torch's graph
    x = randn(6, 7, noncontig=True)
    xg, xt = ge2.from_torch(x, requires_grad=True), x.clone().requires_grad_()
    x64 = x.double().requires_grad_()
    t64 = copy.deepcopy(t).double()
    yg, yt, y64 = g(xg), t(xt), t64(x64)
    assert_matches(yg.data, y64, yt, name="forward")
    gy = randn(6, 5, seed=1)
    yg.backward(ge2.from_torch(gy)), yt.backward(gy), y64.backward(gy.double())
    assert_matches(xg.grad.data, x64.grad, xt.grad, name="grad x")
    assert_matches(g.weight.grad.data, t64[0].weight.grad, t[0].weight.grad, name="grad W")
    assert_matches(g.bias.grad.data, t64[0].bias.grad, t[0].bias.grad, name="grad b")


def test_linear_leading_dims_no_bias_and_vector_input():
    compare_layer(nn.Linear(9, 4, bias=False), torch.nn.Linear(9, 4, bias=False), randn(2, 3, 9))
    compare_layer(nn.Linear(9, 1), torch.nn.Linear(9, 1), randn(9))


def test_linear_errors_name_the_shapes():
    lin = nn.Linear(784, 512)
    with pytest.raises(ValueError, match=r"linear: x \[2, 100\] has 100 features but weight \[512, 784\] expects 784"):
        lin(ge2.zeros(2, 100))
    with pytest.raises(TypeError, match="x has dtype float64 but weight has float32"):
        lin(ge2.zeros(2, 784, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.Linear(2, 2, activation="swish")


# ---------------------------------------------------------------------------------------------
# activations, flatten, softmax
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("g, t", [(nn.ReLU(), torch.nn.ReLU()), (nn.LeakyReLU(0.1), torch.nn.LeakyReLU(0.1)),
                                  (nn.GELU(), torch.nn.GELU()), (nn.GELU("tanh"), torch.nn.GELU("tanh")),
                                  (nn.Sigmoid(), torch.nn.Sigmoid()), (nn.Tanh(), torch.nn.Tanh()),
                                  (nn.SiLU(), torch.nn.SiLU()), (nn.Softmax(1), torch.nn.Softmax(1)),
                                  (nn.LogSoftmax(-1), torch.nn.LogSoftmax(-1)), (nn.Flatten(), torch.nn.Flatten())],
                         ids=lambda m: repr(m))
def test_parameter_free_layers_vs_torch(g, t):
    compare_layer(g, t, randn(3, 5, 2, noncontig=True), copy_weights=False)


# ---------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------
def _randomize(t_layer):
    with torch.no_grad():
        for p in t_layer.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return t_layer


@pytest.mark.parametrize("shape, normalized", [((4, 7), 7), ((2, 3, 5), (3, 5)), ((1, 1), 1), ((3, 4500), 4500)])
def test_layer_norm_vs_torch(shape, normalized):
    compare_layer(nn.LayerNorm(normalized), _randomize(torch.nn.LayerNorm(normalized)), randn(*shape) * 3 + 2)


def test_layer_norm_without_affine_and_noncontiguous():
    compare_layer(nn.LayerNorm(6, elementwise_affine=False), torch.nn.LayerNorm(6, elementwise_affine=False),
                  randn(5, 6, noncontig=True), copy_weights=False)


def _row_norm_vs_torch(M: int, N: int, dtype: torch.dtype, rms: bool, noncontig: bool = False) -> None:
    """F.layer_norm / F.rms_norm forward and every gradient vs torch in ``dtype`` and in float64."""
    x64 = randn(M, N, dtype=torch.float64, seed=1, noncontig=noncontig) * 3 + 2
    w64, b64 = randn(N, dtype=torch.float64, seed=2), randn(N, dtype=torch.float64, seed=3)
    gy = randn(M, N, dtype=dtype, seed=4)
    outs = {}
    for kind, dt in (("ge2", dtype), ("torch", dtype), ("ref", torch.float64)):
        x, w, b = (t.to(dt).requires_grad_() for t in (x64, w64, b64))
        if kind == "ge2":
            xg, wg, bg = (ge2.from_torch(t.detach().clone(), requires_grad=True) for t in (x, w, b))
            y = F.rms_norm(xg, (N,), wg, 1e-6) if rms else F.layer_norm(xg, (N,), wg, bg, 1e-5)
            y.backward(ge2.from_torch(gy.clone()))
            outs[kind] = [y.data, xg.grad.data, wg.grad.data] + ([] if rms else [bg.grad.data])
        else:
            y = torch.nn.functional.rms_norm(x, (N,), w, 1e-6) if rms else \
                torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)
            y.backward(gy.to(dt))
            outs[kind] = [y.detach(), x.grad, w.grad] + ([] if rms else [b.grad])
    for name, g, t, r in zip(("y", "grad x", "grad weight", "grad bias"), outs["ge2"], outs["torch"], outs["ref"]):
        assert_matches(g, r, t, name=f"{'rms' if rms else 'layer'}_norm {M}x{N} {dtype} {name}")


@pytest.mark.parametrize("rms", [False, True])
def test_row_norm_backward_programs_taking_several_tiles(monkeypatch, rms):
    # one SM: the persistent backward's two programs each sum the dweight/dbias of several row tiles
    monkeypatch.setattr("ge2.kernels.norm._sm_count", lambda device: 1)
    monkeypatch.setattr("ge2.kernels.norm.TILE", 256)
    _row_norm_vs_torch(301, 40, torch.float32, rms, noncontig=True)


@pytest.mark.skipif(not LARGE, reason="GPT-sized rows: GPU (GE2_TEST_LARGE=1)")
@pytest.mark.parametrize("M, N, dtype", [(16384, 384, torch.bfloat16), (8192, 768, torch.bfloat16),
                                         (8192, 4096, torch.bfloat16), (1000, 4097, torch.float32),
                                         (2049, 1000, torch.float32)])
def test_row_norm_large_vs_torch(M, N, dtype):
    _row_norm_vs_torch(M, N, dtype, rms=False)
    _row_norm_vs_torch(M, N, dtype, rms=True)


@pytest.mark.parametrize("shape, normalized", [((4, 7), 7), ((2, 3, 5), (3, 5))])
def test_rms_norm_vs_torch(shape, normalized):
    compare_layer(nn.RMSNorm(normalized, eps=1e-6), _randomize(torch.nn.RMSNorm(normalized, eps=1e-6)), randn(*shape))


@pytest.mark.parametrize("g_cls, t_cls, shape", [(nn.BatchNorm1d, torch.nn.BatchNorm1d, (6, 5)),
                                                 (nn.BatchNorm1d, torch.nn.BatchNorm1d, (3, 4, 7)),
                                                 (nn.BatchNorm2d, torch.nn.BatchNorm2d, (2, 3, 5, 4))])
def test_batch_norm_train_and_eval_vs_torch(g_cls, t_cls, shape):
    C = shape[1]
    g, t = g_cls(C, momentum=0.3), _randomize(t_cls(C, momentum=0.3))
    x = randn(*shape) * 2 + 1
    compare_layer(g, t, x)
    # running statistics after one training step (unbiased variance, momentum 0.3)
    assert_matches(g.running_mean.data, t.running_mean.double(), t.running_mean, name="running_mean")
    assert_matches(g.running_var.data, t.running_var.double(), t.running_var, name="running_var")
    assert int(g.num_batches_tracked.item()) == 1
    # eval uses the running statistics: a different function of x, with its own gradient
    g.eval(), t.eval()
    for p in g.parameters():
        p.grad = None
    compare_layer(g, t, randn(*shape, seed=3), copy_weights=False)
    assert int(g.num_batches_tracked.item()) == 1


def test_batch_norm_errors():
    bn = nn.BatchNorm1d(4)
    with pytest.raises(ValueError, match="x \\[3, 5\\] has 5 channels but the layer has 4"):
        bn(ge2.zeros(3, 5))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(ge2.zeros(1, 4))


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------
def test_dropout_masks_scale_and_gradient():
    ge2.manual_seed(0)
    drop = nn.Dropout(0.3)
    x = ge2.from_torch(randn(64, 33).abs() + 0.5, requires_grad=True)
    y = drop(x)
    kept = y.data != 0
    frac = kept.float().mean().item()
    assert 0.6 < frac < 0.8  # 2112 draws of keep-probability 0.7
    assert torch.allclose(y.data[kept], x.data[kept] / 0.7, rtol=1e-6)
    gy = randn(64, 33, seed=2)
    y.backward(ge2.from_torch(gy))
    # the gradient uses the same mask as the forward, rebuilt from the saved RNG state
    assert torch.equal(x.grad.data != 0, kept)
    assert torch.allclose(x.grad.data[kept], gy[kept] / 0.7, rtol=1e-6)
    y2 = drop(x)
    assert not torch.equal(y2.data != 0, kept)  # the state advanced: a fresh mask
    drop.eval()
    assert drop(x) is x


def test_dropout_is_reproducible_from_the_seed():
    masks = []
    for _ in range(2):
        ge2.manual_seed(11)
        drop = nn.Dropout(0.5)
        x = ge2.ones(1000)
        masks.append([drop(x).data != 0 for _ in range(2)])
    assert torch.equal(masks[0][0], masks[1][0]) and torch.equal(masks[0][1], masks[1][1])
    assert torch.equal(nn.Dropout(1.0)(ge2.ones(10)).data, torch.zeros(10, device=DEVICE))


def test_dropout_matches_the_philox_oracle_bit_for_bit():
    x = randn(37, 29, noncontig=True)
    state = torch.tensor([2 ** 40 + 12345, 2 ** 33 + 5], dtype=torch.int64, device=DEVICE)  # 64-bit seed, offset
    y = ge2.backend.call("dropout", x, state, p=0.4)
    with ge2.use_backend("torch"):
        ref = ge2.backend.call("dropout", x, state, p=0.4)
    assert torch.equal(y, ref)
    assert 0.5 < (y != 0).float().mean().item() < 0.7


# ---------------------------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_vs_torch(padding_idx):
    t = torch.nn.Embedding(9, 5, padding_idx=padding_idx)
    g = nn.Embedding(9, 5, padding_idx=padding_idx)
    idx = torch.tensor([[0, 2, 8], [2, 2, 5]], device=DEVICE)  # repeats: their gradients add
    compare_layer(g, t, idx, grad_x=False)
    if padding_idx is not None:
        assert torch.count_nonzero(g.weight.grad.data[padding_idx]) == 0


def test_embedding_of_strided_indices():
    """A column slice of an index tensor (strided ids) gives torch's rows and gradient."""
    t = torch.nn.Embedding(9, 5)
    g = nn.Embedding(9, 5)
    idx = torch.tensor([[7, 1, 1], [5, 1, 1], [0, 8, 3]], device=DEVICE)[:, 0:2]
    assert not idx.is_contiguous()
    compare_layer(g, t, idx, grad_x=False)


def test_embedding_out_of_range_index_raises():
    g = nn.Embedding(4, 3)
    with pytest.raises(ValueError, match="embedding: 1 index value\\(s\\) out of range: a table of 4 rows"):
        g(ge2.tensor([0, 4]))
        ge2.check_pending_indices()  # on the GPU the count is raised without a host sync, later
    with pytest.raises(TypeError, match="indices must be an integer Tensor"):
        g(ge2.zeros(2))


# ---------------------------------------------------------------------------------------------
# losses, clipping
# ---------------------------------------------------------------------------------------------
def test_loss_modules_vs_torch():
    logits = randn(6, 4)
    target = torch.tensor([0, 3, 1, 1, 2, 3], device=DEVICE)
    weight = randn(4).abs() + 0.5
    TF = torch.nn.functional
    cases = [  # (ge2 module, torch function of (input, target) in the input's dtype, input, target)
        (nn.CrossEntropyLoss(), lambda x, t: TF.cross_entropy(x, t), logits, target),
        (nn.CrossEntropyLoss(ge2.from_torch(weight), label_smoothing=0.1, reduction="sum"),
         lambda x, t: TF.cross_entropy(x, t, weight.to(x.dtype), label_smoothing=0.1, reduction="sum"), logits, target),
        (nn.NLLLoss(), lambda x, t: TF.nll_loss(x, t), torch.log_softmax(logits, 1), target),
        (nn.MSELoss(), lambda x, t: TF.mse_loss(x, t.to(x.dtype)), randn(5, 3), torch.rand(5, 3, device=DEVICE)),
        (nn.BCEWithLogitsLoss(), lambda x, t: TF.binary_cross_entropy_with_logits(x, t.to(x.dtype)), randn(5, 3),
         torch.rand(5, 3, device=DEVICE)),
    ]
    for g, t_fn, inp, tgt in cases:
        xg = ge2.from_torch(inp.clone(), requires_grad=True)
        xt, x64 = inp.clone().requires_grad_(), inp.double().requires_grad_()
        lg, lt, l64 = g(xg, ge2.from_torch(tgt)), t_fn(xt, tgt), t_fn(x64, tgt)
        assert_matches(lg.data, l64, lt, name=repr(g))
        lg.backward()
        lt.backward()
        l64.backward()
        assert_matches(xg.grad.data, x64.grad, xt.grad, name=f"grad {g!r}")


@pytest.mark.parametrize("max_norm, norm_type", [(0.5, 2.0), (100.0, 2.0), (0.3, math.inf)])
def test_clip_grad_norm_vs_torch(max_norm, norm_type):
    shapes = [(3, 5), (7,), (1,), (40, 31)]
    grads = [randn(*s, seed=i) for i, s in enumerate(shapes)]
    gp = [nn.Parameter(torch.zeros(s, device=DEVICE)) for s in shapes]
    tp = [torch.zeros(s, device=DEVICE, requires_grad=True) for s in shapes]
    for p, t, g in zip(gp, tp, grads):
        p.grad, t.grad = ge2.from_torch(g.clone()), g.clone()
    total = nn.utils.clip_grad_norm_(gp, max_norm, norm_type)
    ref = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type)
    assert total.shape == () and abs(total.item() - ref.item()) <= 1e-6 * ref.item()
    for p, t in zip(gp, tp):
        assert torch.allclose(p.grad.data, t.grad, rtol=2e-6, atol=1e-7)


def test_module_dict():
    d = nn.ModuleDict({"a": nn.Linear(3, 4), "b": nn.ReLU()})
    d["c"] = nn.Linear(4, 2)
    assert list(d) == ["a", "b", "c"] and len(d) == 3 and "b" in d
    assert [k for k, _ in d.named_parameters()] == ["a.weight", "a.bias", "c.weight", "c.bias"]
    d.update([("b", nn.Tanh())])
    assert isinstance(d["b"], nn.Tanh) and list(d.keys()) == ["a", "b", "c"]
    assert isinstance(d.pop("b"), nn.Tanh) and list(d) == ["a", "c"]
    with pytest.raises(TypeError, match="ModuleDict"):
        d["x"] = 3
    with pytest.raises(KeyError, match="ModuleDict"):
        d["x.y"] = nn.ReLU()


def test_deepcopy_of_a_module_copies_its_parameters():
    lin = nn.Linear(4, 3)
    dup = copy.deepcopy(lin)
    assert type(dup.weight) is type(lin.weight) and dup.weight.requires_grad
    assert torch.equal(dup.weight.data, lin.weight.data) and dup.weight.data.data_ptr() != lin.weight.data.data_ptr()
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        copy.deepcopy(lin.weight * 2)
