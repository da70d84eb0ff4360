"""ge2.data.text: the standard-library byte corpus, its split, random windows and their resumable position."""
from __future__ import annotations

import pytest
import torch

import ge2
from ge2.data.text import RandomWindows, TextCorpus, TextWindows, decode, encode, stdlib_files


@pytest.fixture(scope="module")
def corpus() -> TextCorpus:
    return TextCorpus(max_bytes=300_000)


def test_stdlib_corpus_is_sorted_sources_and_deterministic(corpus):
    root, files = stdlib_files()
    assert files == sorted(files) and all(f.endswith(".py") for f in files)
    assert not any(part in ("test", "tests", "site-packages") for f in files for part in f.split("/")[:-1])
    with open(f"{root}/{files[0]}", "rb") as f:
        first = f.read()
    assert bytes(corpus.data[:len(first)].tolist()) == first  # the first sorted file comes first
    again = TextCorpus(max_bytes=300_000)
    assert corpus.info == again.info and torch.equal(corpus.data, again.data)
    assert corpus.info["bytes"] == 300_000 and corpus.info["vocab_size"] == 256


def test_split_is_positional_and_complete(corpus):
    n = corpus.info["bytes"]
    assert len(corpus.val) == int(n * 0.1) and len(corpus.train) + len(corpus.val) == n
    assert torch.equal(torch.cat([corpus.train, corpus.val]), corpus.data)
    other = TextCorpus(max_bytes=300_000, val_fraction=0.25)
    assert len(other.val) == int(n * 0.25)


def test_windows_are_shifted_by_one(corpus):
    ds = TextWindows(corpus.train, 13)
    assert len(ds) == len(corpus.train) - 13
    for i in (0, 1, 777, len(ds) - 1):
        x, y = ds[i]
        assert x.dtype == torch.int64 and x.shape == (13,)
        assert torch.equal(x.data, corpus.train[i:i + 13].long())
        assert torch.equal(y.data, corpus.train[i + 1:i + 14].long())
    starts = torch.tensor([5, 0, len(ds) - 1])
    xb, yb = ds.gather(starts)
    for r, s in enumerate(starts.tolist()):
        assert torch.equal(xb[r], ds[s][0].data) and torch.equal(yb[r], ds[s][1].data)


def test_random_windows_repeatable_and_resumable(corpus):
    ds = TextWindows(corpus.train, 7)
    a = RandomWindows(ds, 5, seed=3)
    batches = [next(a) for _ in range(4)]
    for x, y in batches:
        assert x.shape == (5, 7) and y.shape == (5, 7) and x.device.type == ge2.device().type
        assert torch.equal(x.data[:, 1:], y.data[:, :-1])  # y is x shifted by one
    assert not torch.equal(batches[0][0].data, batches[1][0].data)
    # resuming from the state after two batches continues with batches 2 and 3
    b = RandomWindows(ds, 5, seed=0)
    b.load_state_dict({"seed": 3, "step": 2})
    for want in batches[2:]:
        got = next(b)
        assert torch.equal(got[0].data, want[0].data) and torch.equal(got[1].data, want[1].data)
    assert a.state_dict() == {"seed": 3, "step": 4}
    # seed=None draws the seed from torch's generator: ge2.manual_seed repeats it
    ge2.manual_seed(11)
    s1 = RandomWindows(ds, 2).seed
    ge2.manual_seed(11)
    assert RandomWindows(ds, 2).seed == s1


def test_user_text_file(tmp_path):
    text = "héllo, wörld\n" * 50
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    c = TextCorpus(path, val_fraction=0.2)
    raw = text.encode("utf-8")
    assert c.info["bytes"] == len(raw) and c.info["files"] == 1
    assert bytes(c.data.tolist()) == raw
    assert decode(encode(text)) == text
    assert decode([0xC3]) == "\ufffd"  # a cut multi-byte character decodes to U+FFFD


def test_errors(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match="no such file"):
        TextCorpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="val_fraction"):
        TextCorpus(max_bytes=1000, val_fraction=1.0)
    with pytest.raises(ValueError, match="too few for windows of block_size 8"):
        TextWindows(corpus.train[:8], 8)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        TextWindows(corpus.train, 0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        RandomWindows(TextWindows(corpus.train, 4), 0)
