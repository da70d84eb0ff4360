"""``RNN``, ``LSTM``, ``GRU`` and their cells, with torch's constructors, parameter names, gate order and
initialisation (a torch module's ``state_dict`` loads as is); ``PackedSequence`` and its helpers.

Per layer and direction: one GEMM projects every step's input (``linear``), then the recurrence runs as
one persistent Triton kernel (or per-step GEMM + fused cell where W_hh does not fit on chip), see
``ge2.kernels.rnn``. Variable lengths: pass ``lengths`` or a ``PackedSequence``; padding steps neither
update the state nor receive gradient, and their outputs are 0.
"""
from __future__ import annotations

import math
import sys
import types
from typing import NamedTuple

import torch

from ge2 import runtime
from ge2.autograd.dropout import dropout, new_rng_state
from ge2.autograd.linear import linear
from ge2.autograd.math import cat, stack, transpose
from ge2.autograd.rnn import recurrence
from ge2.autograd.tensor import Tensor
from ge2.backend.schema import shape_str
from ge2.nn import init
from ge2.nn.module import Module
from ge2.nn.parameter import Parameter

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
KERNEL_MODE = {"RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu", "LSTM": "lstm", "GRU": "gru"}


class PackedSequence(NamedTuple):
    """A batch of variable-length sequences: ``data`` padded time-major [T, B, *] plus int64 ``lengths`` [B].

    Unlike torch's, ``data`` keeps the padded layout (the kernels walk it with per-row lengths), so
    packing and unpacking move no data; ``sorted_indices``/``unsorted_indices`` are always None.
    """

    data: Tensor
    lengths: torch.Tensor
    sorted_indices: None = None
    unsorted_indices: None = None


def _lengths(op: str, lengths, B: int, T: int) -> torch.Tensor:
    """int64 [B] on the CPU, checked against the batch and the padded length (read on the host)."""
    raw = lengths.data if isinstance(lengths, Tensor) else lengths
    vals = [int(v) for v in (raw.reshape(-1).tolist() if isinstance(raw, torch.Tensor) else list(raw))]
    if len(vals) != B:
        raise ValueError(f"{op}: lengths has {len(vals)} entries but the batch has {B} sequences")
    if vals and (min(vals) < 1 or max(vals) > T):
        raise ValueError(f"{op}: lengths must be in [1, {T}] (the padded length), got min {min(vals)} max {max(vals)}")
    return torch.tensor(vals, dtype=torch.int64)


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """input [T, B, *] ([B, T, *] if batch_first) + lengths [B] -> PackedSequence (no data moves)."""
    x = transpose(input, 0, 1) if batch_first else input
    lens = _lengths("pack_padded_sequence", lengths, x.shape[1], x.shape[0])
    vals = lens.tolist()
    if enforce_sorted and any(b > a for a, b in zip(vals, vals[1:])):
        raise ValueError("pack_padded_sequence: lengths must be sorted in decreasing order with enforce_sorted=True, "
                         f"got {lens.tolist()}")
    return PackedSequence(x, lens)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, torch.Tensor]:
    """PackedSequence -> (padded [T, B, *] or [B, T, *], lengths [B]); T = total_length or max(lengths)."""
    if padding_value != 0.0:
        raise ValueError(f"pad_packed_sequence: padding_value must be 0 (ge2's padding is zeros), got {padding_value}")
    x, lens = sequence.data, sequence.lengths
    longest = max(lens.tolist(), default=0)
    T = longest if total_length is None else total_length
    if T < longest:
        raise ValueError(f"pad_packed_sequence: total_length {T} is less than the longest sequence ({longest})")
    if T <= x.shape[0]:
        x = x[:T]
    else:
        pad = Tensor(torch.zeros((T - x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device))
        x = cat([x, pad], 0)
    return (transpose(x, 0, 1) if batch_first else x), lens


# ``ge2.nn.utils.rnn`` as in torch (``ge2.nn.utils`` is a module, so this one is registered by hand)
utils_rnn = types.ModuleType("ge2.nn.utils.rnn", "pack_padded_sequence, pad_packed_sequence, PackedSequence")
utils_rnn.PackedSequence, utils_rnn.pack_padded_sequence = PackedSequence, pack_padded_sequence
utils_rnn.pad_packed_sequence = pad_packed_sequence
sys.modules["ge2.nn.utils.rnn"] = utils_rnn


def _uniform_init(module: Module, hidden_size: int) -> None:
    """torch's RNN init: every weight and bias U(-1/sqrt(H), 1/sqrt(H))."""
    bound = 1.0 / math.sqrt(hidden_size) if hidden_size > 0 else 0.0
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


class RNNBase(Module):
    """Shared constructor and forward of RNN / LSTM / GRU (``mode`` "RNN_TANH" | "RNN_RELU" | "LSTM" | "GRU")."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__()
        name = type(self).__name__
        if proj_size:
            raise ValueError(f"{name}: proj_size is not supported by ge2 (got {proj_size}); use a Linear after the LSTM")
        for what, v in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: {what} must be a positive int, got {v!r}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be a probability in [0, 1], got {dropout}")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        self.proj_size = 0
        self.path: str | None = None  # "persistent" | "stepwise" forces a kernel path (tests, benchmarks)
        dev = runtime.resolve_device(device)
        dt = dtype or torch.float32
        ng = GATES[mode] * hidden_size
        for layer in range(num_layers):
            for sfx in ("", "_reverse")[: 1 + bidirectional]:
                n_in = input_size if layer == 0 else hidden_size * (1 + bidirectional)
                shapes = [("weight_ih", (ng, n_in)), ("weight_hh", (ng, hidden_size))]
                if bias:
                    shapes += [("bias_ih", (ng,)), ("bias_hh", (ng,))]
                for pname, shape in shapes:
                    self.register_parameter(f"{pname}_l{layer}{sfx}",
                                            Parameter(torch.empty(shape, dtype=dt, device=dev)))
        self.register_buffer("rng_state", Tensor(new_rng_state(dev)), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _uniform_init(self, self.hidden_size)

    def _check(self, x: Tensor, hx, batch: int, batched: bool) -> None:
        name = type(self).__name__
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: input has {x.shape[-1]} features (input {shape_str(x.shape)}) but "
                             f"input_size is {self.input_size}")
        w = self.weight_ih_l0
        if x.dtype != w.dtype:
            raise TypeError(f"{name}: input is {x.dtype} but the parameters are {w.dtype}")
        if x.device != w.device:
            raise ValueError(f"{name}: input is on {x.device} but the parameters are on {w.device}; call .to()")
        want = (self.num_layers * (1 + self.bidirectional), batch, self.hidden_size)
        if not batched:
            want = (want[0], want[2])
        states = (hx if isinstance(hx, tuple) else (hx,)) if hx is not None else ()
        if self.mode == "LSTM" and hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
            raise TypeError(f"{name}: hx must be a tuple (h0, c0), got {type(hx).__name__}")
        if self.mode != "LSTM" and isinstance(hx, tuple):
            raise TypeError(f"{name}: hx must be a Tensor h0, got a tuple")
        for sname, s in zip(("h0", "c0"), states):
            if tuple(s.shape) != want:
                where = "dim 0" if self.batch_first else "dim 1"
                raise ValueError(f"{name}: {sname} must be {shape_str(want)} (num_layers * num_directions, batch, "
                                 f"hidden_size), got {shape_str(s.shape)} for input {shape_str(x.shape)} "
                                 f"(batch_first={self.batch_first}: the batch is input {where})")

    def forward(self, input, hx=None, lengths=None):
        """input [T, B, I] ([B, T, I] if batch_first, [T, I] unbatched, or a PackedSequence) -> (output, h_n).

        output [T, B, D H] (0 past each sequence's length); h_n [L D, B, H] (LSTM: (h_n, c_n)).
        ``lengths`` [B] (ge2's extension): per-sequence lengths of a padded input.
        """
        name = type(self).__name__
        packed = isinstance(input, PackedSequence)
        if packed:
            x, lens = input.data, input.lengths
            batched = True
        else:
            if not isinstance(input, Tensor) or input.dim() not in (2, 3):
                raise ValueError(f"{name}: input must be a 2-D (unbatched) or 3-D Tensor, got "
                                 f"{shape_str(input.shape) if isinstance(input, Tensor) else type(input).__name__}")
            batched = input.dim() == 3
            x = input if not batched else (transpose(input, 0, 1) if self.batch_first else input)
            if not batched:
                x = x.reshape(x.shape[0], 1, x.shape[1])
            lens = lengths
        T, B = x.shape[0], x.shape[1]
        self._check(x if batched else input, hx, B, batched)
        if lens is not None:
            lens = _lengths(name, lens, B, T).to(x.device)
        D, H = 1 + self.bidirectional, self.hidden_size
        lstm = self.mode == "LSTM"
        if hx is None:
            z = Tensor(torch.zeros((self.num_layers * D, B, H), dtype=x.dtype, device=x.device))
            h0, c0 = z, (z if lstm else None)
        else:
            h0, c0 = (hx if lstm else (hx, None))
            if not batched:
                h0 = h0.reshape(h0.shape[0], 1, H)
                c0 = c0.reshape(c0.shape[0], 1, H) if c0 is not None else None
        mode = KERNEL_MODE[self.mode]
        hs, cs = [], []
        for layer in range(self.num_layers):
            outs = []
            for d, sfx in enumerate(("", "_reverse")[:D]):
                k = layer * D + d
                p = lambda n: getattr(self, f"{n}_l{layer}{sfx}")  # noqa: E731
                gx = linear(x, p("weight_ih"), p("bias_ih") if self.bias else None)
                res = recurrence(gx, p("weight_hh"), p("bias_hh") if self.bias else None, h0[k],
                                 c0[k] if lstm else None, lens, mode, reverse=d == 1, path=self.path)
                outs.append(res[0])
                hs.append(res[1])
                if lstm:
                    cs.append(res[2])
            x = outs[0] if D == 1 else cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = dropout(x, self.dropout, True, self.rng_state.data)
        h_n = stack(hs, 0)
        c_n = stack(cs, 0) if lstm else None
        if packed:
            out = PackedSequence(x, input.lengths)
        elif not batched:
            out = x.reshape(T, D * H)
            h_n = h_n.reshape(h_n.shape[0], H)
            c_n = c_n.reshape(c_n.shape[0], H) if lstm else None
        else:
            out = transpose(x, 0, 1) if self.batch_first else x
        return out, ((h_n, c_n) if lstm else h_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        for k, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, k) != default:
                s += f", {k}={getattr(self, k)}"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype: torch.dtype | None = None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """LSTM with torch's gate order (i, f, g, o); ``proj_size`` is refused."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class GRU(RNNBase):
    """GRU with torch's gate order (r, z, n) and n = tanh(W_in x + b_in + r (W_hn h + b_hn))."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)


class RNNCellBase(Module):
    """One step of RNN / LSTM / GRU: parameters weight_ih, weight_hh, bias_ih, bias_hh as torch names them."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        self.path: str | None = None
        dev, dt = runtime.resolve_device(device), dtype or torch.float32
        ng = GATES[mode] * hidden_size
        self.weight_ih = Parameter(torch.empty((ng, input_size), dtype=dt, device=dev))
        self.weight_hh = Parameter(torch.empty((ng, hidden_size), dtype=dt, device=dev))
        self.bias_ih = Parameter(torch.empty((ng,), dtype=dt, device=dev)) if bias else None
        self.bias_hh = Parameter(torch.empty((ng,), dtype=dt, device=dev)) if bias else None
        _uniform_init(self, hidden_size)

    def forward(self, input: Tensor, hx=None):
        """input [B, I] or [I] -> h' [B, H] (LSTMCell: (h', c'))."""
        name = type(self).__name__
        if not isinstance(input, Tensor) or input.dim() not in (1, 2) or input.shape[-1] != self.input_size:
            got = shape_str(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"{name}: input must be [batch, {self.input_size}] or [{self.input_size}], got {got}")
        batched = input.dim() == 2
        x = input if batched else input.reshape(1, -1)
        B, H = x.shape[0], self.hidden_size
        lstm = self.mode == "LSTM"
        if hx is None:
            z = Tensor(torch.zeros((B, H) if batched else (H,), dtype=x.dtype, device=x.device))
            hx = (z, z) if lstm else z
        if lstm and (not isinstance(hx, tuple) or len(hx) != 2):
            raise TypeError(f"{name}: hx must be a tuple (h, c)")
        states = hx if lstm else (hx,)
        want = (B, H) if batched else (H,)
        for sname, s in zip(("h", "c"), states):
            if tuple(s.shape) != want:
                raise ValueError(f"{name}: {sname} must be {shape_str(want)} for input {shape_str(input.shape)}, "
                                 f"got {shape_str(s.shape)}")
        states = tuple(s.reshape(B, H) for s in states)
        gx = linear(x, self.weight_ih, self.bias_ih).reshape(1, B, GATES[self.mode] * H)
        res = recurrence(gx, self.weight_hh, self.bias_hh, states[0], states[1] if lstm else None, None,
                         KERNEL_MODE[self.mode], path=self.path)
        out = (res[1], res[2]) if lstm else (res[1],)
        out = out if batched else tuple(o.reshape(H) for o in out)
        return out if lstm else out[0]

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype: torch.dtype | None = None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, bias,
                         device, dtype)
        self.nonlinearity = nonlinearity


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype)


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype)
