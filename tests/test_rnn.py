"""nn.RNN / LSTM / GRU and their cells against torch's modules loaded with the same weights (float64 reference).

CPU (interpreter): the persistent kernel runs as a single program (no one to wait for at its barrier)
and the stepwise path (GEMM + fused cell per step) is forced on some cases; on the GPU the same tests
take the multi-program persistent kernel wherever it fits, and ``LARGE`` adds 100-step, wider cases.
"""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
from ge2.kernels import rnn as K
from ge2.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tests.numerics import DEVICE, LARGE, assert_matches, randn


def _pair(cls: str, dtype=torch.float32, **kw):
    """(ge2 module, torch float64 module, torch module in dtype) with the same weights."""
    ref = getattr(torch.nn, cls)(**kw).to(DEVICE, torch.float64)
    low = getattr(torch.nn, cls)(**kw).to(DEVICE, dtype)
    low.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
    mod = getattr(nn, cls)(**kw, device=DEVICE, dtype=dtype)
    mod.load_state_dict({k: ge2.from_torch(v.to(dtype)) for k, v in ref.state_dict().items()})
    return mod, ref, low


def _states(out):
    """output, then the state tensors of a layer's (output, h) / (output, (h, c)) / cell result, flat."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple):
        return [out[0], *out[1]]
    return list(out) if isinstance(out, tuple) else [out]


def _check(cls: str, kw: dict, x: torch.Tensor, hx=None, lengths=None, packed=False, path=None, cell=False):
    """Outputs, final states and every gradient (input, h0/c0, parameters) vs torch, in float32."""
    mod, ref, low = _pair(cls, **kw)
    mod.path = path
    if kw.get("dropout"):
        for m in (mod, ref, low):
            m.train()
    bf = kw.get("batch_first", False)

    def run(m, x_, hx_, wrap):
        if packed:
            seq = (pack_padded_sequence if wrap is ge2.from_torch else torch.nn.utils.rnn.pack_padded_sequence)(
                x_, lengths, batch_first=bf, enforce_sorted=False)
            out = m(seq, hx_)
            pad = pad_packed_sequence if wrap is ge2.from_torch else torch.nn.utils.rnn.pad_packed_sequence
            return (pad(out[0], batch_first=bf, total_length=x.shape[1 if bf else 0])[0], out[1])
        if lengths is not None and wrap is ge2.from_torch:
            return m(x_, hx_, lengths=lengths)
        return m(x_, hx_)

    leaves = {}
    results = {}
    for tag, m, dt, wrap in (("ge2", mod, torch.float32, ge2.from_torch), ("ref", ref, torch.float64, None),
                             ("low", low, torch.float32, None)):
        def leaf(t):
            t = t.detach().to(dt)
            return wrap(t).requires_grad_() if wrap else t.requires_grad_()
        xs = leaf(x)
        hs = None if hx is None else (tuple(leaf(h) for h in hx) if isinstance(hx, tuple) else leaf(hx))
        out = _states(run(m, xs, hs, wrap))
        results[tag] = [o.data if wrap else o for o in out]
        leaves[tag] = [xs] + (list(hs) if isinstance(hs, tuple) else ([hs] if hs is not None else []))
        params = list(m.parameters())
        gen = torch.Generator().manual_seed(1)
        loss = None
        for o in out:
            w = torch.randn(tuple(o.shape), generator=gen, dtype=torch.float64).to(DEVICE, dt)
            term = (o * (wrap(w) if wrap else w)).sum()
            loss = term if loss is None else loss + term
        loss.backward()
        grads = [t.grad for t in leaves[tag]] + [p.grad for p in params]
        results[tag + "_grads"] = [g.data if wrap else g for g in grads]
    for i, (o, r, t) in enumerate(zip(results["ge2"], results["ref"], results["low"])):
        assert tuple(o.shape) == tuple(r.shape), f"output {i}: {tuple(o.shape)} vs {tuple(r.shape)}"
        assert_matches(o, r, t, name=f"output {i}")
    names = ["dx"] + [f"dh{i}" for i in range(len(leaves["ge2"]) - 1)] + [n for n, _ in mod.named_parameters()]
    for n, o, r, t in zip(names, results["ge2_grads"], results["ref_grads"], results["low_grads"]):
        assert o is not None, n
        assert_matches(o, r, t, name=n)


H0 = object()  # marker: draw h0 (and c0) of the right shape


def _hx(cls, kw, B):
    D = 2 if kw.get("bidirectional") else 1
    shape = (kw.get("num_layers", 1) * D, B, kw["hidden_size"])
    h = randn(*shape, dtype=torch.float64, seed=3)
    return (h, randn(*shape, dtype=torch.float64, seed=4)) if cls == "LSTM" else h


CASES = [  # (class, constructor kwargs, T, B, give h0, path: "persistent" also runs the persistent backward)
    ("LSTM", dict(input_size=4, hidden_size=5, bidirectional=True, batch_first=True), 7, 3, True, "persistent"),
    ("GRU", dict(input_size=3, hidden_size=6, num_layers=2, bias=False), 7, 2, True, "persistent"),
    ("RNN", dict(input_size=4, hidden_size=3, nonlinearity="relu", bidirectional=True), 1, 1, False, "persistent"),
    ("RNN", dict(input_size=2, hidden_size=5, num_layers=2, dropout=1.0), 7, 3, True, None),
]


@pytest.mark.parametrize("cls,kw,T,B,give_h,path", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_layer_matches_torch(cls, kw, T, B, give_h, path):
    shape = (B, T, kw["input_size"]) if kw.get("batch_first") else (T, B, kw["input_size"])
    x = randn(*shape, dtype=torch.float64, noncontig=True, seed=2)
    _check(cls, kw, x, _hx(cls, kw, B) if give_h else None, path=path)


def test_packed_sequence_lstm_bidirectional():
    lengths = torch.tensor([7, 5, 2, 1])
    kw = dict(input_size=3, hidden_size=5, bidirectional=True)
    _check("LSTM", kw, randn(7, 4, 3, dtype=torch.float64, seed=5), _hx("LSTM", kw, 4), lengths=lengths,
           packed=True)


def test_lengths_stepwise_gru_reverse():
    """The stepwise path (per-step GEMM + fused cell) with variable lengths in both directions."""
    kw = dict(input_size=3, hidden_size=4, bidirectional=True, batch_first=True)
    x = randn(3, 6, 3, dtype=torch.float64, seed=6)
    _check("GRU", kw, x, _hx("GRU", kw, 3), lengths=torch.tensor([6, 2, 4]), packed=True, path="stepwise")


def test_stepwise_lstm_and_rnn():
    kw = dict(input_size=3, hidden_size=5)
    _check("LSTM", kw, randn(4, 2, 3, dtype=torch.float64, seed=7), _hx("LSTM", kw, 2), path="stepwise")
    _check("RNN", kw, randn(4, 2, 3, dtype=torch.float64, seed=8), None, path="stepwise")


def test_lengths_keyword_matches_packed_torch():
    """ge2's ``lengths=`` on a padded batch equals torch's packed run, padding outputs are 0."""
    kw = dict(input_size=3, hidden_size=5)
    lengths = torch.tensor([5, 3, 1])
    mod, ref, _ = _pair("RNN", **kw)
    x = randn(5, 3, 3, seed=9)
    out, h = mod(ge2.from_torch(x), lengths=lengths)
    seq = torch.nn.utils.rnn.pack_padded_sequence(x.double(), lengths)
    r_out, r_h = ref(seq)
    r_out = torch.nn.utils.rnn.pad_packed_sequence(r_out, total_length=5)[0]
    assert_matches(out.data, r_out, None, name="output")
    assert_matches(h.data, r_h, None, name="h_n")
    assert (out.data[3:, 1] == 0).all() and (out.data[1:, 2] == 0).all()


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_torch(cls):
    kw = dict(input_size=4, hidden_size=5)
    mod, ref, low = _pair(cls, **kw)
    x = randn(3, 4, dtype=torch.float64, seed=10)
    hx = randn(3, 5, dtype=torch.float64, seed=11)
    hxs = (hx, randn(3, 5, dtype=torch.float64, seed=12)) if cls == "LSTMCell" else (hx,)
    outs = {}
    for tag, m, dt in (("ge2", mod, torch.float32), ("ref", ref, torch.float64), ("low", low, torch.float32)):
        w = ge2.from_torch if tag == "ge2" else (lambda t: t)
        xs = w(x.detach().to(dt).clone()).requires_grad_()
        hs = tuple(w(h.detach().to(dt).clone()).requires_grad_() for h in hxs)
        o = m(xs, hs if cls == "LSTMCell" else hs[0])
        o = o if isinstance(o, tuple) else (o,)
        loss = None
        for i, t in enumerate(o):
            term = (t * w(randn(3, 5, dtype=dt, seed=20 + i))).sum()
            loss = term if loss is None else loss + term
        loss.backward()
        outs[tag] = [t.data for t in o] + [t.grad.data if tag == "ge2" else t.grad for t in (xs, *hs)] + \
                    [p.grad.data if tag == "ge2" else p.grad for p in m.parameters()]
    for i, (o, r, t) in enumerate(zip(outs["ge2"], outs["ref"], outs["low"])):
        assert_matches(o, r, t, name=f"{cls} result {i}")
    # unbatched input and no state
    o = mod(ge2.from_torch(x[0].float()))
    r = ref(x[0])
    assert_matches((o[0] if isinstance(o, tuple) else o).data, r[0] if isinstance(r, tuple) else r, None)


def test_parameters_init_and_names_match_torch():
    for cls, kw in (("LSTM", dict(num_layers=2, bidirectional=True)), ("GRU", {}), ("RNN", dict(bias=False))):
        t = getattr(torch.nn, cls)(4, 6, **kw)
        g = getattr(nn, cls)(4, 6, **kw)
        assert [(n, tuple(p.shape)) for n, p in t.named_parameters()] == \
               [(n, tuple(p.shape)) for n, p in g.named_parameters()]
        for p in g.parameters():  # U(-1/sqrt(H), 1/sqrt(H)), as torch
            assert p.data.abs().max().item() <= 6 ** -0.5 and p.data.std().item() > 0.1
    assert "LSTM(4, 6, num_layers=2" in repr(nn.LSTM(4, 6, num_layers=2))


def test_errors_name_op_argument_and_shapes():
    m = nn.LSTM(4, 5, batch_first=True, device=DEVICE)
    x = ge2.from_torch(randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"LSTM: input has 3 features .* input_size is 4"):
        m(ge2.from_torch(randn(2, 3, 3)))
    h = ge2.from_torch(randn(1, 3, 5))
    with pytest.raises(ValueError, match=r"LSTM: h0 must be \[1, 2, 5\].*got \[1, 3, 5\].*batch_first=True"):
        m(x, (h, h))
    with pytest.raises(TypeError, match="LSTM: hx must be a tuple"):
        m(x, ge2.from_torch(randn(1, 2, 5)))
    with pytest.raises(ValueError, match="proj_size is not supported"):
        nn.LSTM(4, 5, proj_size=2)
    with pytest.raises(ValueError, match=r"GRU: lengths must be in \[1, 3\]"):
        nn.GRU(4, 5, batch_first=True, device=DEVICE)(x, lengths=[3, 4])
    with pytest.raises(ValueError, match="lengths must be sorted"):
        pack_padded_sequence(x, [1, 3], batch_first=True)
    with pytest.raises(ValueError, match="RNN: nonlinearity"):
        nn.RNN(4, 5, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"GRUCell: input must be \[batch, 4\]"):
        nn.GRUCell(4, 5, device=DEVICE)(ge2.from_torch(randn(2, 3)))
    with pytest.raises(ValueError, match=r"rnn_forward: h0 must be \[2, 5\]"):
        ge2.backend.call("rnn_forward", randn(3, 2, 5), randn(5, 5), None, randn(3, 5), None, None,
                         mode="rnn_tanh", reverse=False, save=False)


def test_persistent_plan_line():
    """Where the persistent kernel applies on an H100-sized GPU (132 SMs) and where it falls back."""
    gpu, lstm = torch.device("cuda", 0), K.MODES["lstm"]
    assert K.persistent_plan(512, lstm, torch.float32, gpu, backward=False, sms=132) is not None
    assert K.persistent_plan(1024, lstm, torch.bfloat16, gpu, backward=False, sms=132) is not None
    # backward: 16 units per program (W_hh streamed from L1/L2), row blocks added while the grid fits the SMs
    assert K.persistent_plan(1024, lstm, torch.float32, gpu, backward=True, sms=132)[:2] == (64, 16)
    assert K.persistent_plan(256, lstm, torch.float32, gpu, backward=True, sms=132)[:2] == (16, 16)
    for h in (5, 1000, 4096):
        assert K.persistent_plan(h, lstm, torch.float32, gpu, backward=True, sms=132)[0] <= 132
    assert K.bwd_row_blocks(16, 64, 132) == [16, 32, 64]  # 64 programs
    assert K.bwd_row_blocks(64, 64, 132) == [32, 64]  # 128 programs
    assert K.bwd_row_blocks(64, 7, 132) == [16]
    assert K.bwd_row_blocks(200, 64, 132) == []
    assert K.persistent_plan(8192, lstm, torch.bfloat16, gpu, backward=False, sms=132) is None
    for h in (5, 100, 1000, 2048):  # never more programs than SMs: the grid barrier needs all of them resident
        plan = K.persistent_plan(h, K.MODES["gru"], torch.bfloat16, gpu, backward=False, sms=132)
        assert plan is None or plan[0] <= 132
    cpu = torch.device("cpu")
    assert K.persistent_plan(16, lstm, torch.float32, cpu, backward=True)[0] == 1  # one program on the interpreter


@pytest.mark.skipif(not LARGE, reason="long sequences and wide layers only with GE2_TEST_LARGE")
@pytest.mark.parametrize("cls,path", [("LSTM", "persistent"), ("GRU", "persistent"), ("RNN", None),
                                      ("LSTM", "stepwise")])
def test_long_sequences_large(cls, path):
    kw = dict(input_size=40, hidden_size=77, num_layers=2, bidirectional=True)
    lengths = torch.tensor([100, 64, 99, 1, 37, 100, 2, 50, 80, 3, 100, 20, 7, 9, 90, 33, 17])
    _check(cls, kw, randn(100, 17, 40, dtype=torch.float64, seed=13), _hx(cls, kw, 17), lengths=lengths,
           packed=True, path=path)


@pytest.mark.skipif(not LARGE, reason="GPU sizes only with GE2_TEST_LARGE")
@pytest.mark.parametrize("hidden", [256, 1024])
def test_wide_lstm_large(hidden):
    kw = dict(input_size=64, hidden_size=hidden, batch_first=True)
    _check("LSTM", kw, randn(33, 20, 64, dtype=torch.float64, seed=14), _hx("LSTM", kw, 33))


@pytest.mark.parametrize("batch_m,early", [(True, "auto"), (False, True), (False, False)])
@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_persistent_forward_dot_orientations(cls, batch_m, early, monkeypatch):
    """Both forms of the persistent forward's dot (h_prev x W_hh^T with batch rows as M, and W_hh x h_prev^T),
    the second with the step's loads before the h exchange and after the dot."""
    monkeypatch.setattr(K, "FWD_BATCH_M", batch_m)
    monkeypatch.setattr(K, "FWD_EARLY_LOADS", early)
    monkeypatch.setattr(K, "FWD_BATCH_M_MIN_K", 0)  # the batch-rows-as-M form at any width
    kw = dict(input_size=3, hidden_size=7)
    _check(cls, kw, randn(5, 3, 3, dtype=torch.float64, noncontig=True, seed=21), _hx(cls, kw, 3), path="persistent")


@pytest.mark.skipif(not LARGE, reason="GPU sizes only with GE2_TEST_LARGE")
@pytest.mark.parametrize("batch_m", [True, False])
def test_persistent_forward_row_rounds_large(batch_m, monkeypatch):
    """More batch rows than one dot takes (rounds of 64 / _block_b rows), with variable lengths."""
    monkeypatch.setattr(K, "FWD_BATCH_M", batch_m)
    monkeypatch.setattr(K, "FWD_BATCH_M_MIN_K", 0)
    kw = dict(input_size=24, hidden_size=300)
    lengths = torch.randint(1, 10, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    lengths[0] = 9
    _check("LSTM", kw, randn(9, 70, 24, dtype=torch.float64, seed=22), _hx("LSTM", kw, 70),
           lengths=torch.tensor(lengths), packed=True, path="persistent")


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_stepwise_forward_forms(cls, fused, monkeypatch):
    """The stepwise forward as one fused dot + cell launch a step over a grid of several unit and row blocks
    and K chunks (16 units, 16 rows, 16-wide chunks of hidden 20), and as a GEMM + cell launch a step."""
    monkeypatch.setattr(K, "FWD_STEP_FUSED", fused)
    monkeypatch.setattr(K, "FWD_STEP_CONFIG", (16, 16, 16, 4, 1))
    kw = dict(input_size=3, hidden_size=20)
    lengths = torch.tensor([4, 1, 3, 4, 2, 4, 4, 1, 3, 2, 4, 4, 1, 2, 3, 4, 4, 2])
    _check(cls, kw, randn(4, 18, 3, dtype=torch.float64, noncontig=True, seed=23), _hx(cls, kw, 18),
           lengths=lengths, packed=True, path="stepwise")


@pytest.mark.parametrize("cls,early", [("LSTM", True), ("LSTM", False), ("GRU", True), ("RNN", True)])
def test_persistent_backward_load_orders(cls, early, monkeypatch):
    """The persistent backward with each step's cell inputs issued before the barrier of the step ahead
    (carried through the loop) and after the dot, with variable lengths in both directions."""
    monkeypatch.setattr(K, "BWD_EARLY_LOADS", early)
    kw = dict(input_size=3, hidden_size=6, bidirectional=True)
    lengths = torch.tensor([2, 5, 1, 4])
    _check(cls, kw, randn(5, 4, 3, dtype=torch.float64, noncontig=True, seed=24), _hx(cls, kw, 4),
           lengths=lengths, packed=True, path="persistent")


@pytest.mark.skipif(not LARGE, reason="GPU sizes only with GE2_TEST_LARGE")
@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_persistent_backward_load_orders_large(cls, early, monkeypatch):
    """Both load orders over several unit blocks and row blocks (hidden 300, 70 rows), variable lengths."""
    monkeypatch.setattr(K, "BWD_EARLY_LOADS", early)
    kw = dict(input_size=24, hidden_size=300, bidirectional=True)
    lengths = torch.randint(1, 12, (70,), generator=torch.Generator().manual_seed(6))
    lengths[3] = 12
    _check(cls, kw, randn(12, 70, 24, dtype=torch.float64, seed=25), _hx(cls, kw, 70), lengths=lengths,
           packed=True, path="persistent")
