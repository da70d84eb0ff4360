"""ge2.data: TensorDataset, DataLoader determinism and batching, the bundled digits dataset."""
from __future__ import annotations

import builtins

import pytest
import torch

import ge2
from ge2.data import DataLoader, TensorDataset, datasets
from numerics import DEVICE


def _dataset(n=23):
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    return TensorDataset(x, torch.arange(n))


def _ids(loader):
    return [y.data.tolist() for _, y in loader]


def test_batches_cover_the_dataset_in_order_and_move_to_the_device():
    loader = DataLoader(_dataset(), batch_size=5)
    batches = list(loader)
    assert len(loader) == len(batches) == 5
    assert [b[1].shape[0] for b in batches] == [5, 5, 5, 5, 3]
    assert sum(_ids(loader), []) == list(range(23))
    x, y = batches[1]
    assert isinstance(x, ge2.Tensor) and x.device.type == DEVICE.type and y.dtype == torch.int64
    assert torch.equal(x.data.cpu(), torch.arange(15, 30, dtype=torch.float32).reshape(5, 3))


def test_shuffle_is_deterministic_per_seed_and_epoch():
    a = DataLoader(_dataset(), batch_size=4, shuffle=True, seed=3)
    b = DataLoader(_dataset(), batch_size=4, shuffle=True, seed=3)
    a1, a2 = _ids(a), _ids(a)
    assert a1 == _ids(b) and a2 == _ids(b)  # same seed: same batches, epoch by epoch
    assert a1 != a2  # a new permutation each epoch
    assert sorted(sum(a1, [])) == list(range(23))  # a permutation: every sample once
    assert _ids(DataLoader(_dataset(), batch_size=4, shuffle=True, seed=4)) != a1
    c = DataLoader(_dataset(), batch_size=4, shuffle=True, seed=3)
    c.set_epoch(1)  # a resumed run picks up the permutation of the epoch it resumes
    assert _ids(c) == a2


def test_drop_last():
    loader = DataLoader(_dataset(), batch_size=5, shuffle=True, drop_last=True)
    assert len(loader) == 4
    assert all(len(ids) == 5 for ids in _ids(loader))


def test_errors():
    with pytest.raises(ValueError, match="tensors\\[1\\] has shape \\[4\\], but tensors\\[0\\] has 3 samples"):
        TensorDataset(torch.zeros(3, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        DataLoader(_dataset(), batch_size=0)


def test_digits_split_is_deterministic():
    pytest.importorskip("sklearn", reason="digits needs scikit-learn: pip install -e .[data]")
    train, test = datasets.digits()
    assert len(train) + len(test) == 1797 and len(test) == 359
    x, y = train.tensors
    assert x.shape == (1438, 64) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and set(y.tolist()) == set(range(10))
    train2, test2 = datasets.digits()
    assert torch.equal(test.tensors[0], test2.tensors[0]) and torch.equal(test.tensors[1], test2.tensors[1])
    assert not torch.equal(datasets.digits(seed=1)[1].tensors[1], test.tensors[1])


def test_digits_without_scikit_learn_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(ImportError, match=r"pip install ge2\[data\]"):
        datasets.digits()
