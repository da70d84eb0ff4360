"""Datasets and the DataLoader."""
from ge2.data.dataset import DataLoader, Dataset, TensorDataset  # noqa: F401
from ge2.data import datasets  # noqa: F401
from ge2.data.sampler import DistributedSampler  # noqa: F401
from ge2.data import text  # noqa: F401
from ge2.data.text import RandomWindows, TextCorpus, TextWindows  # noqa: F401
