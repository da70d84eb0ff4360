"""Persisted autotuning: tuned kernel configs survive the process, per GPU model.

Every ge2 kernel is autotuned through ``runtime.autotune``, which builds a ``PersistentAutotuner``.
Before benchmarking a new shape it looks the shape up in the tuning cache: one JSON file per GPU
model (``NVIDIA_H100_80GB_HBM3.json``) in ``$GE2_CACHE_DIR`` (default ``~/.cache/ge2``), then in the
defaults shipped inside the package (``ge2/tuned/``). A hit is used without benchmarking; a miss is
tuned by Triton as usual and the winner, with its measured time, is written back (atomically).

Keys: kernel (module.name), the kernel's autotune key values with integer sizes bucketed (codes
named in ``exact_keys`` kept as they are), and the dtypes of its tensor arguments. Bucketing rounds
a size up to the next value of the series 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and
1.5x powers of two): the best tile shape changes with how many tiles fill the GPU, which moves on
a geometric scale, so a config tuned for a size stays within ~1.5x of the shapes that reuse it
while a model's shapes map to a few entries.

An entry records the Triton version and a hash of the kernel's whole config space; an entry from
another Triton or another config space is ignored (re-tuned), never misapplied. A corrupt file is
reported with a warning and treated as empty. Under the interpreter nothing here is used (one
designated config runs).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import threading
import warnings
from typing import Any

import triton
from triton.runtime.autotuner import Autotuner

FORMAT_VERSION = 1
_DEFAULTS_DIR = os.path.join(os.path.dirname(__file__), "tuned")


def cache_dir() -> str:
    """Where tuned configs are written: $GE2_CACHE_DIR, else $XDG_CACHE_HOME/ge2 or ~/.cache/ge2."""
    if os.environ.get("GE2_CACHE_DIR"):
        return os.environ["GE2_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ge2")


def gpu_name() -> str:
    """The current GPU model as a file-name-safe string, e.g. NVIDIA_H100_80GB_HBM3."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def bucket(n: int) -> int:
    """Round n up to the series 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... (see the module docstring)."""
    if n <= 2:
        return max(int(n), 0)
    p = 1 << (int(n) - 1).bit_length()  # next power of two >= n
    return p * 3 // 4 if n <= p * 3 // 4 else p


def config_to_dict(cfg: triton.Config) -> dict[str, Any]:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "num_ctas": cfg.num_ctas, "maxnreg": cfg.maxnreg}


def space_hash(configs: list[triton.Config]) -> str:
    """A short hash of a kernel's whole config space: a changed space invalidates its entries."""
    text = json.dumps(sorted(json.dumps(config_to_dict(c), sort_keys=True) for c in configs))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


class TuningStore:
    """The JSON file of one GPU model: {"format": 1, "entries": {key: entry}}; thread-safe."""

    def __init__(self, path: str, defaults_path: str | None = None):
        self.path = path
        self.defaults_path = defaults_path
        self._entries: dict[str, dict] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _read(path: str | None) -> dict[str, dict]:
        if not path or not os.path.exists(path):
            return {}
        try:
            with open(path) as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION or not isinstance(data.get("entries"), dict):
                raise ValueError(f"not a ge2 tuning cache of format {FORMAT_VERSION}")
            return data["entries"]
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            warnings.warn(f"ge2: ignoring unreadable tuning cache {path}: {e}", RuntimeWarning, stacklevel=3)
            return {}

    def entries(self) -> dict[str, dict]:
        """All entries: shipped defaults overlaid by the user's cache."""
        with self._lock:
            if self._entries is None:
                self._entries = {**self._read(self.defaults_path), **self._read(self.path)}
            return self._entries

    def lookup(self, key: str, space: str) -> dict | None:
        """The stored entry for key if it was tuned by this Triton over this config space."""
        entry = self.entries().get(key)
        if entry is None or entry.get("triton") != triton.__version__ or entry.get("space") != space:
            return None
        return entry

    def record(self, key: str, entry: dict) -> None:
        """Add an entry and rewrite the file atomically (merged with what another process wrote)."""
        with self._lock:
            current = self._read(self.path)
            current[key] = entry
            if self._entries is not None:
                self._entries[key] = entry
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path) or ".", prefix=".tuning-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": FORMAT_VERSION, "gpu": os.path.basename(self.path)[:-5],
                               "entries": current}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)  # readers see the old file or the new one, never half
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise


_stores: dict[str, TuningStore] = {}
ALL_TUNERS: list["PersistentAutotuner"] = []  # every autotuned ge2 kernel, for reports
FORCE_RETUNE = False  # `ge2 autotune` sets it: benchmark even where the store has an entry


def store() -> TuningStore:
    """The tuning store of the current GPU model and cache directory."""
    name = gpu_name()
    path = os.path.join(cache_dir(), name + ".json")
    if path not in _stores:
        _stores[path] = TuningStore(path, os.path.join(_DEFAULTS_DIR, name + ".json"))
    return _stores[path]


class PersistentAutotuner(Autotuner):
    """triton's Autotuner that consults and fills the tuning store; counts what it benchmarked."""

    def __init__(self, *args, default_config: triton.Config | None = None, exact_keys: tuple[str, ...] = (),
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.default_config = default_config or self.configs[0]
        self.space = space_hash(self.configs)
        self.name = f"{self.base_fn.__module__}.{self.base_fn.__name__}"
        self.tuned_keys: list[tuple] = []  # shapes benchmarked in this process (for tests, `ge2 autotune`)
        self.stored_hits = 0
        # The repeated-call fast path: (key values, argument dtypes) -> the chosen config's kwargs.
        self._key_index = [self.arg_names.index(k) for k in self.keys]
        # key values stored as they are, not bucketed: codes (an activation, a mode), where nearby
        # integers mean unrelated things
        self._exact = [k in exact_keys for k in self.keys]
        self._fast: dict[tuple, tuple[dict[str, Any], Any]] = {}  # -> (config kwargs, its pre_hook)
        ALL_TUNERS.append(self)

    def _fast_key(self, args: tuple, kwargs: dict) -> tuple:
        # Cheaper than _key (no dicts), and at least as fine: a hit always means the same config.
        n = len(args)
        values = tuple(args[i] if i < n else kwargs.get(self.arg_names[i]) for i in self._key_index)
        dtypes = tuple(a.dtype for a in args if hasattr(a, "dtype"))
        if kwargs:
            dtypes += tuple((k, v.dtype) for k, v in kwargs.items() if hasattr(v, "dtype"))
        return values, dtypes

    def _key(self, args, kwargs) -> tuple:
        # The same key triton's Autotuner.run builds (key args, then every tensor arg's dtype).
        all_args = {**dict(zip(self.arg_names, args)), **kwargs}
        named = {k: v for k, v in all_args.items() if k in self.arg_names}
        key = [named[k] for k in self.keys if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(key)

    def store_key(self, key: tuple) -> str:
        exact = self._exact + [True] * (len(key) - len(self._exact))  # the dtypes after the key values
        parts = [str(bucket(v)) if isinstance(v, int) and not isinstance(v, bool) and not x else str(v)
                 for v, x in zip(key, exact)]
        return self.name + "|" + ",".join(parts)

    def run(self, *args, **kwargs):
        # Repeated shapes skip triton's Autotuner.run (its dicts and key building cost ~25 us a call).
        fast_key = self._fast_key(args, kwargs)
        hit = self._fast.get(fast_key)
        if hit is not None:
            config_kwargs, pre_hook = hit
            if pre_hook is not None:  # what triton's run does for the chosen config (e.g. TMA block shapes)
                nargs = dict(zip(self.arg_names, args))
                nargs.update(kwargs)
                nargs.update(config_kwargs)
                pre_hook(nargs)
            return self.fn.run(*args, **kwargs, **config_kwargs)
        out = self._run(*args, **kwargs)
        self._fast[fast_key] = (self.best_config.all_kwargs(), self.best_config.pre_hook)
        return out

    def _run(self, *args, **kwargs):
        if len(self.configs) <= 1:
            return super().run(*args, **kwargs)
        key = self._key(args, kwargs)
        fresh = key not in self.cache
        if fresh:
            self.nargs = dict(zip(self.arg_names, args))
            candidates = self.prune_configs(kwargs)
            if len(candidates) == 1:
                # The kernel's own pruning already decided (e.g. one config for launch-bound
                # sizes): timing a single candidate would only cost time, and needs no storing.
                self.cache[key] = candidates[0]
                fresh = False
        if fresh and not FORCE_RETUNE:
            entry = store().lookup(self.store_key(key), self.space)
            if entry is not None:
                match = [c for c in self.configs if config_to_dict(c) == entry["config"]]
                if match:
                    self.cache[key] = match[0]
                    self.stored_hits += 1
                    fresh = False
        out = super().run(*args, **kwargs)
        if fresh:
            self.tuned_keys.append(key)
            best = self.cache[key]
            timing = self.configs_timings.get(best)
            ms = timing[0] if isinstance(timing, (list, tuple)) else timing
            default = self.configs_timings.get(self.default_config)
            store().record(self.store_key(key), {
                "config": config_to_dict(best),
                "time_ms": ms,
                "default_time_ms": default[0] if isinstance(default, (list, tuple)) else default,
                "shape": [str(v) for v in key],
                "space": self.space,
                "triton": triton.__version__,
                "date": datetime.date.today().isoformat(),
            })
        return out
