"""ge2.save_safetensors / ge2.load_safetensors: weights exchanged with torch under torch's key names."""
from __future__ import annotations

import pytest
import safetensors.torch
import torch

import ge2
import ge2.nn as nn


class Tied(nn.Module):
    """Embedding + LayerNorm + head sharing the embedding's weight, children in a ModuleDict."""

    def __init__(self):
        super().__init__()
        self.parts = nn.ModuleDict({"wte": nn.Embedding(11, 6), "ln": nn.LayerNorm(6)})
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.parts["wte"].weight
        self.bn = nn.BatchNorm1d(6)


class TorchTied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.parts = torch.nn.ModuleDict({"wte": torch.nn.Embedding(11, 6), "ln": torch.nn.LayerNorm(6)})
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.parts["wte"].weight
        self.bn = torch.nn.BatchNorm1d(6)


def test_ge2_weights_load_into_torch(tmp_path):
    model = Tied()
    with ge2.no_grad():
        model.parts["ln"].weight.copy_(ge2.randn(6))
        model.bn.running_mean.copy_(ge2.randn(6))
    path = tmp_path / "model.safetensors"
    ge2.save_safetensors(model, path)
    ref = TorchTied()
    ref.load_state_dict(safetensors.torch.load_file(str(path)))  # strict: every key, torch's names
    for name, t in ref.state_dict().items():
        assert torch.equal(t, model.state_dict()[name].data.cpu()), name
    assert ref.head.weight is ref.parts["wte"].weight


def test_torch_weights_load_into_ge2(tmp_path):
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(ref.state_dict(), str(path), metadata={"from": "torch"})
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    loaded = ge2.load_safetensors(path)
    assert all(isinstance(t, ge2.Tensor) and t.device.type == ge2.device().type for t in loaded.values())
    model.load_state_dict(loaded)
    x = torch.randn(4, 5)
    out = model(ge2.from_torch(x.to(ge2.device()))).data.cpu()
    assert torch.allclose(out, ref(x).detach(), rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_and_errors(tmp_path):
    state = {"a": ge2.randn(2, 3), "b": ge2.randn(4).to(dtype=torch.bfloat16), "c": ge2.arange(5)}
    path = tmp_path / "sd.safetensors"
    ge2.save_safetensors(state, path)
    back = ge2.load_safetensors(path, device=ge2.device())
    assert set(back) == set(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and torch.equal(back[k].data.cpu(), state[k].data.cpu())
    with pytest.raises(TypeError, match="save_safetensors"):
        ge2.save_safetensors({"a": 3}, path)
    with pytest.raises(TypeError, match="save_safetensors"):
        ge2.save_safetensors([1, 2], path)
