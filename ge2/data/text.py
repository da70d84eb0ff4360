"""A byte-level text corpus that every machine has, and random ``block_size`` windows of it for language models.

**The corpus.** The ``.py`` files of the Python standard library that runs ge2
(``sysconfig.get_paths()["stdlib"]``), without the ``test``/``tests``/``idle_test`` folders,
``site-packages``/``dist-packages`` and ``__pycache__``: the files sorted by their path relative to
the library root, each file's bytes followed by a newline, concatenated, capped at
``DEFAULT_MAX_BYTES`` (16 MiB). On CPython 3.11 that is 734 files, 12.1 MB: all of them fit.
The exact bytes depend on the Python version, so ``TextCorpus.info`` records the version, the
file count, the size and a SHA-256 of the bytes. Any other text file works the same way
(``TextCorpus(path)``, ``ge2 train --model gpt --data PATH``).

**Bytes, not characters.** The vocabulary is the 256 byte values. A character vocabulary would
depend on the corpus (the standard library of another Python version has other characters, so
a checkpoint would only load with its own vocabulary) and could not encode a prompt with a
character the corpus lacks; bytes encode any text and any file, and give every checkpoint the
same vocabulary. Python source is nearly all ASCII, where a byte is a character; the rare
multi-byte UTF-8 character costs a few tokens, and decoding replaces an invalid sequence.

**The split** is positional, as nanoGPT's: the first ``1 - val_fraction`` of the bytes train,
the rest validate (on the standard library: modules from the end of the alphabet).

**Windows.** ``TextWindows(data, block_size)``: sample i is x = data[i : i+T], y = data[i+1 :
i+T+1] (int64). ``RandomWindows(dataset, batch_size, seed)`` serves batches of windows at random
starts; batch k is drawn by a torch generator seeded from (seed, k) alone, so a loader's position
is one integer (``state_dict()``: seed and step) and a resumed run continues with the batches an
uninterrupted run would have drawn. ``seed=None`` takes one from torch's global generator
(``ge2.manual_seed`` repeats it). Gathering is data movement on the host (an ``unfold`` view and
an ``index_select``), then one copy to the device.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from typing import Any, Iterator

import torch

from ge2 import runtime
from ge2.autograd.tensor import Tensor
from ge2.data.dataset import Dataset

VOCAB_SIZE = 256
DEFAULT_MAX_BYTES = 16 * 2**20
_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


def stdlib_files() -> tuple[str, list[str]]:
    """(the standard library's root, its corpus files relative to it, sorted)."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS]
        files += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/") for n in names if n.endswith(".py")]
    return root, sorted(files)


def stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, int]:
    """(the first max_bytes of the sorted standard-library sources, the number of files read)."""
    root, files = stdlib_files()
    parts, size, count = [], 0, 0
    for rel in files:
        if size >= max_bytes:
            break
        with open(os.path.join(root, rel), "rb") as f:
            blob = f.read() + b"\n"
        parts.append(blob[:max_bytes - size])
        size += len(parts[-1])
        count += 1
    return b"".join(parts), count


def encode(text: str | bytes) -> torch.Tensor:
    """Text (UTF-8) or bytes -> uint8 token ids [n] on the host."""
    blob = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)


def decode(ids: Any) -> str:
    """Token ids (a Tensor, torch tensor or list of ints in 0..255) -> text; invalid UTF-8 becomes U+FFFD."""
    if isinstance(ids, Tensor):
        ids = ids.data
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class TextCorpus:
    """A byte corpus split into ``train`` and ``val`` uint8 tensors; ``path=None`` is the standard library."""

    def __init__(self, path: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 val_fraction: float = 0.1):
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"TextCorpus: val_fraction must be in (0, 1), got {val_fraction!r}")
        if not isinstance(max_bytes, int) or max_bytes < 2:
            raise ValueError(f"TextCorpus: max_bytes must be an int >= 2, got {max_bytes!r}")
        if path is None:
            blob, files = stdlib_corpus(max_bytes)
            source = f"Python {platform.python_version()} standard library ({files} .py files)"
        else:
            path = os.fspath(path)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"TextCorpus: no such file: {path}")
            with open(path, "rb") as f:
                blob = f.read(max_bytes)
            files, source = 1, path
        n_val = int(len(blob) * val_fraction)
        self.data = encode(blob)
        self.train, self.val = self.data[:len(blob) - n_val], self.data[len(blob) - n_val:]
        self.info = {"source": source, "bytes": len(blob), "files": files, "train_bytes": len(self.train),
                     "val_bytes": len(self.val), "sha256": hashlib.sha256(blob).hexdigest(),
                     "vocab_size": VOCAB_SIZE}

    def __repr__(self) -> str:
        return f"TextCorpus({self.info['source']}: {self.info['bytes']:,} bytes, {len(self.train):,} train / " \
               f"{len(self.val):,} val)"


class TextWindows(Dataset):
    """Sample i of a token sequence: (x, y) = (data[i : i+T], data[i+1 : i+T+1]) as int64 [T] each."""

    def __init__(self, data: torch.Tensor, block_size: int):
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"TextWindows: block_size must be a positive int, got {block_size!r}")
        data = data.data if isinstance(data, Tensor) else data
        if not isinstance(data, torch.Tensor) or data.ndim != 1:
            raise ValueError("TextWindows: data must be a 1-D tensor of token ids")
        if data.numel() <= block_size:
            raise ValueError(f"TextWindows: {data.numel()} tokens are too few for windows of block_size "
                             f"{block_size} (x and its shifted target need block_size + 1 tokens)")
        self.data, self.block_size = data, block_size
        self._windows = data.unfold(0, block_size + 1, 1)  # [n - T, T + 1], a view

    def __len__(self) -> int:
        return self._windows.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        w = self._windows[i].to(torch.int64)
        return Tensor(w[:-1]), Tensor(w[1:])

    def gather(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows starting at ``starts`` [B]: x, y int64 [B, T] on the data's device."""
        w = self._windows.index_select(0, starts).to(torch.int64)
        return w[:, :-1], w[:, 1:]


class RandomWindows:
    """Endless batches (x, y) [batch_size, T] int64 ge2 Tensors of windows at random starts, on ``device``.

    Batch k depends on (seed, k) only: ``state_dict()`` / ``load_state_dict()`` carry (seed, step).
    """

    def __init__(self, dataset: TextWindows, batch_size: int, seed: int | None = None, device=None):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"RandomWindows: batch_size must be a positive int, got {batch_size!r}")
        self.dataset, self.batch_size = dataset, batch_size
        self.seed = int(torch.randint(0, 2**31, (1,)).item()) if seed is None else int(seed)
        self.device = runtime.resolve_device(device)
        self.step = 0

    def batch(self, k: int) -> tuple[Tensor, Tensor]:
        """Batch number k (the loader's position is unchanged)."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + k) % 2**63)
        starts = torch.randint(0, len(self.dataset), (self.batch_size,), generator=g)
        x, y = self.dataset.gather(starts)
        return Tensor(x.to(self.device, non_blocking=True)), Tensor(y.to(self.device, non_blocking=True))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.step = int(state["seed"]), int(state["step"])
