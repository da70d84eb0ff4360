"""Bundled real datasets (no download)."""
from __future__ import annotations

import torch

from ge2.data.dataset import TensorDataset, random_split_indices


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), split train/test deterministically.

    x: float32 [n, 64] scaled to [0, 1] (pixel / 16); y: int64 [n]. Same seed, same split.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("ge2.data.datasets.digits needs scikit-learn (it ships the digits inside its package): "
                          "pip install ge2[data]  (or: pip install scikit-learn)") from e
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"digits: test_fraction must be in (0, 1), got {test_fraction}")
    bunch = load_digits()
    x = torch.from_numpy(bunch.data).to(torch.float32) / 16.0  # host-side data preparation, once
    y = torch.from_numpy(bunch.target).to(torch.int64)
    train_idx, test_idx = random_split_indices(len(y), [1.0 - test_fraction, test_fraction], seed)
    return (TensorDataset(x[train_idx].contiguous(), y[train_idx].contiguous()),
            TensorDataset(x[test_idx].contiguous(), y[test_idx].contiguous()))
