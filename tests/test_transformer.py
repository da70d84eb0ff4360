"""TransformerEncoderLayer / TransformerEncoder against torch's, loaded from the same weights."""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
from tests.numerics import DEVICE, assert_matches, randn


def _pair(**kw):
    """torch's layer and ge2's from the same seed, both initialised on the test device (the CPU's and
    a GPU's generators draw different numbers)."""
    torch.manual_seed(11)
    t = torch.nn.TransformerEncoderLayer(**kw, device=DEVICE)
    torch.manual_seed(11)
    g = nn.TransformerEncoderLayer(**kw)
    return t, g


def test_state_dict_keys_and_init_match_torch():
    """torch's keys; the attention block's weights from the same seed are torch's (the later layers' are
    drawn after ge2's attention-dropout seed: torch's init rule, other numbers)."""
    t, g = _pair(d_model=16, nhead=2, dim_feedforward=24)
    assert list(g.state_dict()) == list(t.state_dict())
    for key, value in t.state_dict().items():
        mine = g.state_dict()[key].data
        assert mine.shape == value.shape, key
        if key.startswith("self_attn.") or key.startswith("norm"):
            assert torch.equal(mine, value), key


@pytest.mark.parametrize("norm_first,activation,batch_first,masks", [
    (False, "relu", False, "none"), (True, "gelu", True, "causal"), (False, "gelu", True, "padding"),
    (True, "relu", False, "padding"),
])
def test_layer_matches_torch(norm_first, activation, batch_first, masks):
    E, N, S = 16, 3, 7
    t, g = _pair(d_model=E, nhead=4, dim_feedforward=40, dropout=0.0, activation=activation,
                 batch_first=batch_first, norm_first=norm_first)
    g.load_state_dict({k: ge2.from_torch(v.detach().clone()) for k, v in t.state_dict().items()})
    x = randn(N, S, E) if batch_first else randn(S, N, E)
    mask = kpm = None
    causal = masks == "causal"
    if causal:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(S, device=DEVICE)
    if masks == "padding":
        kpm = torch.rand(N, S, device=DEVICE) > 0.7
        kpm[:, 0] = False
    t64 = __import__("copy").deepcopy(t).double()
    xt, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    xg = ge2.from_torch(x.clone(), requires_grad=True)
    yt = t(xt, src_mask=mask, src_key_padding_mask=kpm, is_causal=causal)
    y64 = t64(x64, src_mask=mask.double() if mask is not None else None, src_key_padding_mask=kpm, is_causal=causal)
    yg = g(xg, src_mask=ge2.from_torch(mask) if mask is not None else None,
           src_key_padding_mask=ge2.from_torch(kpm) if kpm is not None else None, is_causal=causal)
    assert_matches(yg.data, y64, yt, name="forward")
    gy = randn(*yt.shape)
    yt.backward(gy)
    y64.backward(gy.double())
    yg.backward(ge2.from_torch(gy))
    assert_matches(xg.grad.data, x64.grad, xt.grad, name="grad x")
    t_params, r_params = dict(t.named_parameters()), dict(t64.named_parameters())
    for name, p in g.named_parameters():
        assert_matches(p.grad.data, r_params[name].grad, t_params[name].grad, name=f"grad {name}")


def test_encoder_stack_and_fresh_dropout_masks():
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.5, batch_first=True)
    enc = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(16))
    t = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.5,
                                                                     batch_first=True), 3,
                                    norm=torch.nn.LayerNorm(16), enable_nested_tensor=False).to(DEVICE)
    assert list(enc.state_dict()) == list(t.state_dict())
    seeds = {name: tuple(b.data.tolist()) for name, b in enc.named_buffers() if name.endswith("rng_state")}
    assert len(set(seeds.values())) == len(seeds)  # every copied dropout draws its own masks
    enc.load_state_dict({k: ge2.from_torch(v.detach().clone()) for k, v in t.state_dict().items()})
    enc.eval()
    t.eval()
    x = randn(2, 5, 16)
    with torch.no_grad():
        ref = t(x)
    assert_matches(enc(ge2.from_torch(x)).data, t.double()(x.double()), ref, name="encoder (eval)")


def test_bad_activation_is_refused():
    with pytest.raises(ValueError, match="activation should be relu/gelu, not 'swish'"):
        nn.TransformerEncoderLayer(8, 2, activation="swish")
