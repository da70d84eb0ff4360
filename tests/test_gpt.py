"""ge2.models.GPT: parity with a nanoGPT-style torch model, weight tying, sampling kernels, generate with a
KV cache, ``ge2 train --model gpt`` (end to end, resume, NaN stop) and ``ge2 generate``."""
from __future__ import annotations

import json
import math

import pytest
import safetensors.torch
import torch
from numerics import DEVICE, LARGE, assert_matches, randn, rel_error

import ge2
from ge2 import backend, cli
from ge2.autograd.sampling import multinomial, top_k_mask
from ge2.models import GPT

from bench.torch_gpt import TorchGPT  # nanoGPT in torch: the reference


CFG = dict(vocab_size=29, block_size=9, n_layer=2, n_head=2, n_embd=12)


def _randomize(model: GPT, seed: int) -> None:
    """Weights away from nanoGPT's init (biases and norms 0/1 there): every term of the model is exercised."""
    g = torch.Generator().manual_seed(seed)
    with ge2.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            v = 1.0 + 0.2 * r if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.3 * r
            p.data.copy_(v.to(p.dtype))


def _torch_twins(model: GPT, tmp_path, **cfg):
    """The torch model in float64 and float32 with ge2's weights, loaded through the safetensors file."""
    path = tmp_path / "gpt.safetensors"
    ge2.save_safetensors(model, path)
    state = safetensors.torch.load_file(str(path))
    assert set(state) == set(model.state_dict())  # torch's key names, both tied keys included
    twins = []
    for dtype in (torch.float64, torch.float32):
        t = TorchGPT(**cfg).to(dtype)
        t.load_state_dict(state)
        twins.append(t.to(DEVICE))
    return twins


def _tokens(B: int, T: int, V: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# ---------------------------------------------------------------------------------------------
# sampling kernels
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M,V,k,dtype,noncontig", [
    (1, 1, 1, torch.float32, False), (3, 37, 5, torch.float32, True), (2, 1500, 7, torch.float32, False),
    (4, 50, 50, torch.float32, False), (2, 33, 3, torch.bfloat16, False)])
def test_topk_mask_matches_torch(M, V, k, dtype, noncontig):
    x = randn(M, V, dtype=dtype, noncontig=noncontig, seed=V + k)
    if V > 4:
        x[0, 1] = x[0, 3]  # a tie somewhere in the row
    y = backend.call("topk_mask", x, k=k)
    with ge2.use_backend("torch"):
        ref = backend.call("topk_mask", x, k=k)
    assert y.dtype == dtype and torch.equal(y, ref)
    kth = torch.topk(x.float(), k, dim=1).values[:, -1:]
    assert torch.equal(y > float("-inf"), x.float() >= kth)
    assert ((y > float("-inf")).sum(1) >= k).all()
    # the functional: any leading dims, k past V keeps everything
    z = top_k_mask(ge2.Tensor(x.reshape(M, 1, V)), k)
    assert torch.equal(z.data.reshape(M, V), ref)
    assert torch.equal(top_k_mask(ge2.Tensor(x), V + 3).data, x)


def test_multinomial_matches_oracle_and_frequencies():
    logits = randn(5, 1500, noncontig=True, seed=1) * 3
    p = torch.softmax(logits.double(), 1).float()
    p[:, 7] = 0.0
    state = torch.tensor([1234, 99], dtype=torch.int64, device=DEVICE)
    got = backend.call("multinomial", p, state)
    with ge2.use_backend("torch"):
        ref = backend.call("multinomial", p, state)
    assert got.dtype == torch.int64 and torch.equal(got, ref)
    # only positive entries are drawn; the functional advances the state by the number of rows
    masked = torch.softmax(top_k_mask(ge2.Tensor(logits), 2).data, 1)
    draws = multinomial(ge2.Tensor(masked), state)
    assert draws.shape == (5, 1) and state.tolist() == [1234, 104]
    assert all(masked[r, draws.data[r, 0]] > 0 for r in range(5))
    # frequencies of 2000 draws (one per row) against the probabilities: a chi-square test at 5 dof
    probs = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.4, 0.1])
    rows = probs.expand(2000, 6).to(DEVICE)
    counts = torch.bincount(multinomial(ge2.Tensor(rows * 7.0), state).data.reshape(-1).cpu(), minlength=6)
    assert counts[2] == 0
    expected = probs * 2000
    keep = expected > 0
    chi2 = (((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum().item()
    assert chi2 < 20.5  # the 0.1 % quantile of chi-square with 4 dof is 18.5


def test_sampling_errors():
    with pytest.raises(ValueError, match=r"topk_mask: k must be an int in \[1, 4\]"):
        backend.call("topk_mask", randn(2, 4), k=5)
    with pytest.raises(ValueError, match="top_k_mask: k must be a positive int"):
        top_k_mask(ge2.Tensor(randn(2, 4)), 0)
    with pytest.raises(ValueError, match=r"multinomial: state must be int64 \[2\]"):
        backend.call("multinomial", randn(2, 4).abs(), torch.zeros(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="V >= 1"):
        multinomial(ge2.Tensor(randn(2, 0)))


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_gpt_matches_nanogpt_in_torch(tmp_path, bias):
    """Logits, loss and every gradient against the same model in torch (float64 reference, fp32 budget)."""
    cfg = dict(CFG, bias=bias)
    ge2.manual_seed(0)
    model = GPT(**cfg)
    _randomize(model, seed=1 + bias)
    t64, t32 = _torch_twins(model, tmp_path, **cfg)
    idx, targets = _tokens(3, 7, cfg["vocab_size"], 2), _tokens(3, 7, cfg["vocab_size"], 3)
    targets[1, 4] = -1  # ignored, as nanoGPT's ignore_index
    logits, none = model(ge2.Tensor(idx))
    assert none is None and logits.shape == (3, 7, cfg["vocab_size"])
    assert_matches(logits.data, t64(idx)[0], t32(idx)[0], name="logits")

    none, loss = model(ge2.Tensor(idx), ge2.Tensor(targets))
    assert none is None  # the fused loss never forms the logits
    loss.backward()
    ref_losses = []
    for t in (t64, t32):
        _, l_t = t(idx, targets)
        l_t.backward()
        ref_losses.append(l_t)
    assert_matches(loss.data, ref_losses[0], ref_losses[1], name="loss")
    p64, p32 = dict(t64.named_parameters()), dict(t32.named_parameters())
    assert set(p64) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert_matches(p.grad.data, p64[name].grad, p32[name].grad, name=f"grad of {name}")


def test_weight_tying_one_parameter_two_gradients():
    ge2.manual_seed(0)
    model = GPT(**CFG)
    wte = model.transformer["wte"].weight
    assert model.lm_head.weight is wte
    assert sum(p is wte for p in model.parameters()) == 1
    sd = model.state_dict()
    assert "lm_head.weight" in sd and sd["lm_head.weight"].data.data_ptr() == wte.data.data_ptr()
    idx, targets = ge2.Tensor(_tokens(2, 5, 29, 4)), ge2.Tensor(_tokens(2, 5, 29, 5))
    _, loss = model(idx, targets)
    loss.backward()
    # rows of tokens absent from idx get the head's gradient only (non-zero: every row is a class);
    # the rows present get both (their values are checked against torch's tied model above)
    unused = torch.ones(29, dtype=torch.bool, device=DEVICE)
    unused[idx.data.reshape(-1)] = False
    assert unused.any() and (wte.grad.data[unused].abs().sum(1) > 0).all()
    opt = model.configure_optimizer(1e-2)
    assert sum(p is wte for g in opt.param_groups for p in g["params"]) == 1
    before = wte.data.clone()
    opt.step()
    assert model.lm_head.weight is model.transformer["wte"].weight and not torch.equal(before, wte.data)


def test_generate_seeded_topk_and_kv_cache(tmp_path):
    ge2.manual_seed(0)
    model = GPT(**CFG)
    _randomize(model, seed=7)
    t64, t32 = _torch_twins(model, tmp_path, **CFG)
    prompt = ge2.Tensor(_tokens(2, 3, 29, 6))
    ge2.manual_seed(5)
    a = model.generate(prompt, 5, temperature=0.9, top_k=4)
    ge2.manual_seed(5)
    b = model.generate(prompt, 5, temperature=0.9, top_k=4)
    assert a.shape == (2, 8) and torch.equal(a.data, b.data)
    assert torch.equal(a.data[:, :3], prompt.data)
    # every drawn token is among the 4 most likely under the full recomputation of its prefix
    ref_logits = t64(a.data[:, :-1])[0]
    for n in range(3, 8):
        top4 = torch.topk(ref_logits[:, n - 1], 4).indices
        assert all(a.data[r, n] in top4[r] for r in range(2))
    # the KV-cache path's logits against the whole prefix recomputed (float64 torch, fp32 budget)
    from ge2.models.gpt import KVCache

    caches = [KVCache() for _ in range(CFG["n_layer"])]
    seq = a.data
    with ge2.no_grad():
        model.eval()
        got = [model._last_logits(ge2.Tensor(seq[:, :3]), caches, 0).data]
        got += [model._last_logits(ge2.Tensor(seq[:, n - 1:n].contiguous()), caches, n - 1).data
                for n in range(4, 8)]
    ref32 = t32(seq[:, :-1])[0]
    for i, n in enumerate(range(3, 8)):
        assert_matches(got[i], ref_logits[:, n - 1], ref32[:, n - 1], name=f"cached logits at {n - 1}")


def test_generate_past_block_size_crops_like_nanogpt(tmp_path):
    """Greedy decoding (top_k=1) past block_size equals torch recomputing the last block_size tokens."""
    ge2.manual_seed(0)
    model = GPT(**CFG)
    _randomize(model, seed=8)
    t64, _ = _torch_twins(model, tmp_path, **CFG)
    seq = _tokens(1, 7, 29, 9)
    out = model.generate(ge2.Tensor(seq), 5, top_k=1)  # positions 7..11: the cache, then the crop
    for _ in range(5):
        nxt = t64(seq[:, -CFG["block_size"]:])[0][:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out.data, seq)


def test_gpt_errors():
    with pytest.raises(ValueError, match="n_embd 10 is not divisible by n_head 3"):
        GPT(29, 8, 1, 3, 10)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        GPT(29, 0, 1, 2, 8)
    model = GPT(29, 4, 1, 2, 8)
    with pytest.raises(ValueError, match=r"idx has 5 tokens per sequence but block_size is 4 \(idx \[2, 5\]\)"):
        model(ge2.Tensor(_tokens(2, 5, 29, 0)))
    with pytest.raises(TypeError, match="idx must hold integer token ids, got float32"):
        model(ge2.Tensor(randn(2, 3)))
    with pytest.raises(ValueError, match=r"idx must be \[B, T\] with T >= 1, got \[3\]"):
        model(ge2.Tensor(_tokens(1, 3, 29, 0)[0]))
    with pytest.raises(ValueError, match=r"targets must be a ge2 Tensor shaped like idx \[2, 3\], got \[2, 2\]"):
        model(ge2.Tensor(_tokens(2, 3, 29, 0)), ge2.Tensor(_tokens(2, 2, 29, 0)))
    idx = ge2.Tensor(_tokens(1, 2, 29, 0))
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got 0"):
        model.generate(idx, 2, temperature=0)
    with pytest.raises(ValueError, match="top_k must be None or a positive int, got 0"):
        model.generate(idx, 2, top_k=0)
    with pytest.raises(ValueError, match="max_new_tokens must be a non-negative int"):
        model.generate(idx, -1)


# ---------------------------------------------------------------------------------------------
# ge2 train --model gpt / ge2 generate
# ---------------------------------------------------------------------------------------------
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "3",
        "--eval-iters", "1", "--log-interval", "1", "--warmup-steps", "1", "--no-progress", "--max-bytes", "200000"]


def test_train_gpt_end_to_end_and_generate(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["train", "--model", "gpt", "--max-steps", "3", "--eval-interval", "2", "--out", str(out)] + TINY)
    assert rc == 0
    log = json.loads((out / "log.json").read_text())
    assert [r["step"] for r in log["train"]] == [1, 2, 3] and [r["step"] for r in log["val"]] == [2, 3]
    assert all(math.isfinite(r["loss"]) for r in log["train"] + log["val"])
    assert abs(log["train"][0]["loss"] - math.log(256)) < 0.5  # a fresh model is near uniform over bytes
    assert log["corpus"]["bytes"] == 200_000 and log["model"]["vocab_size"] == 256
    for name in ("ckpt.ge2", "model.safetensors", "curves.png"):
        assert (out / name).stat().st_size > 0
    capsys.readouterr()
    rc = cli.main(["generate", "--checkpoint", str(out / "model.safetensors"), "--prompt", "import ",
                   "--max-new-tokens", "4", "--top-k", "3", "--seed", "1"])
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith("import ")
    rc = cli.main(["generate", "--checkpoint", str(out / "ckpt.ge2"), "--prompt", "import ",
                   "--max-new-tokens", "4", "--top-k", "3", "--seed", "1"])
    assert rc == 0 and capsys.readouterr().out == text  # the same weights and seed: the same text
    assert cli.main(["generate", "--checkpoint", str(out / "nope.ge2")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_resume_equals_uninterrupted(tmp_path):
    common = ["--lr-decay-steps", "4", "--dropout", "0.1", "--eval-interval", "2"] + TINY
    assert cli.main(["train", "--model", "gpt", "--max-steps", "4", "--out", str(tmp_path / "a")] + common) == 0
    assert cli.main(["train", "--model", "gpt", "--max-steps", "2", "--out", str(tmp_path / "b")] + common) == 0
    assert cli.main(["train", "--model", "gpt", "--max-steps", "4", "--out", str(tmp_path / "b"), "--resume"]
                    + common) == 0
    a = ge2.load(tmp_path / "a" / "ckpt.ge2")
    b = ge2.load(tmp_path / "b" / "ckpt.ge2")
    assert a["step"] == b["step"] == 4

    def same(x, y, what):
        # bit for bit on the CPU; on the GPU the embedding backward's atomic adds reorder between any
        # two runs (resumed or not), so there the two runs agree to fp32 rounding
        if torch.cuda.is_available():
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, msg=what)
        else:
            assert torch.equal(x, y), what

    for key in a["model"]:
        same(a["model"][key].data, b["model"][key].data, key)
    for i, st in a["optimizer"]["state"].items():
        for name, v in st.items():
            same(v, b["optimizer"]["state"][i][name], f"optimizer state {i} {name}")
    same(torch.tensor([r["loss"] for r in a["log"]["train"]]), torch.tensor([r["loss"] for r in b["log"]["train"]]),
         "losses")


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", "gpt", "--eval-interval", "1", "--out", str(out)] + TINY
    assert cli.main(args + ["--max-steps", "1"]) == 0
    ckpt = ge2.load(out / "ckpt.ge2")
    ckpt["model"]["transformer.ln_f.weight"].data[0] = float("nan")  # a poisoned model
    ge2.save(ckpt, out / "ckpt.ge2")
    good = (out / "ckpt.ge2").read_bytes()
    capsys.readouterr()
    assert cli.main(args + ["--max-steps", "3", "--resume"]) == 1
    err = capsys.readouterr().err
    assert "the training loss is nan at step 2" in err and "the last good checkpoint is kept" in err
    assert (out / "ckpt.ge2").read_bytes() == good


# ---------------------------------------------------------------------------------------------
# GPU: 200 steps of ge2 and torch from the same init on the same batches
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (LARGE and torch.cuda.is_available()), reason="a 200-step run: GPU only")
def test_convergence_matches_torch_200_steps(tmp_path):
    from ge2.data.text import RandomWindows, TextCorpus, TextWindows

    cfg = dict(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128, bias=True)
    ge2.set_matmul_precision("ieee")  # torch's fp32 semantics on both sides
    torch.backends.cuda.matmul.allow_tf32 = False
    ge2.manual_seed(0)
    model = GPT(**cfg)
    _, ref = _torch_twins(model, tmp_path, **cfg)
    loader = RandomWindows(TextWindows(TextCorpus(max_bytes=4 * 2**20).train, 64), 32, seed=0)
    opt = model.configure_optimizer(1e-3, weight_decay=0.1)
    decay = [p for p in ref.parameters() if p.ndim >= 2]
    ref_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": [p for p in ref.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.95))
    ours, theirs = [], []
    for _ in range(200):
        x, y = next(loader)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        ge2.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _, ref_loss = ref(x.data, y.data)
        ref_opt.zero_grad()
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ours.append(loss.item())
        theirs.append(ref_loss.item())
    assert theirs[-1] < theirs[0] - 1.0  # it learns
    worst = max(abs(a - b) / b for a, b in zip(ours, theirs))
    assert worst <= 1e-3, f"largest relative loss difference over 200 steps {worst:.2e}"
    assert rel_error(model.lm_head.weight.data, ref.lm_head.weight.data) < 1e-3
