"""``ge2.autocast``: run each op in the precision torch's autocast gives it, per thread.

Inside an enabled region the functional ops ask one question first (``state.on``, a thread-local
flag; nothing else runs when autocast is off) and then cast their floating inputs by one of torch's
three policies (its CUDA op lists, followed on the CPU too):

- ``cast_low``: matmul-like ops (linear, matmul, conv2d, scaled-dot-product attention) take
  fp32/fp16/bf16 inputs in the region's low dtype;
- ``cast_fp32``: ops that need fp32's range or accuracy (softmax, log-softmax, the losses,
  layer/RMS norm, sum, exp, log, pow) take fp16/bf16 inputs up to fp32;
- ``cast_widest``: ops that need one dtype for several inputs (cat, stack) take the widest.

Ops on no list run in their inputs' dtypes (elementwise arithmetic promotes by itself). A cast is
an autograd op (``Tensor.to``): its gradient is cast back, so a leaf gets a gradient in its own
dtype. A leaf that requires grad (a Parameter) is cast once per region and the copy reused
(torch's weight cache); the cache empties when the outermost region exits, and around every call
of a ``ge2.capture``-d step, so no copy crosses a graph's boundary.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

LOW_DTYPES = (torch.float16, torch.bfloat16)
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)  # float64 and integers never autocast
_DEVICE_TYPES = ("cuda", "cpu")


class _State(threading.local):
    """One thread's autocast state: ``on`` is the only thing an op reads while autocast is off."""

    def __init__(self) -> None:
        self.on = False  # some device type has an enabled region on this thread
        self.low: dict[str, torch.dtype] = {}  # device type -> the low dtype of its innermost region
        self.cache_enabled = True
        self.saved: list[tuple[dict[str, torch.dtype], bool]] = []  # what each open region replaced
        # (id(leaf), dtype, grad mode or "plain") -> (leaf, version, copy)
        self.cache: dict[tuple, tuple[Any, int, Any]] = {}


state = _State()


class autocast:
    """Context manager / decorator: ops in the block run in torch's autocast precisions.

    ``device_type`` ("cuda" or "cpu") picks the tensors it applies to; ``dtype`` is the low dtype
    (bfloat16 or float16; default float16 on "cuda", bfloat16 on "cpu", as torch); ``enabled=False``
    turns autocast off inside an enclosing region; ``cache_enabled`` keeps one low-precision copy
    of each parameter per region.
    """

    def __init__(self, device_type: str = "cuda", dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool = True):
        device_type = torch.device(device_type).type if not isinstance(device_type, str) else device_type
        if device_type not in _DEVICE_TYPES:
            raise ValueError(f"autocast: device_type must be one of {_DEVICE_TYPES}, got {device_type!r}")
        if dtype is None:
            dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
        if dtype not in LOW_DTYPES:
            raise ValueError(f"autocast: dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        self.device_type, self.fast_dtype = device_type, dtype
        self.enabled, self.cache_enabled = bool(enabled), bool(cache_enabled)

    def __enter__(self) -> "autocast":
        s = state
        s.saved.append((s.low, s.cache_enabled))
        s.low = dict(s.low)
        if self.enabled:
            s.low[self.device_type] = self.fast_dtype
        else:
            s.low.pop(self.device_type, None)
        s.cache_enabled = self.cache_enabled
        s.on = bool(s.low)
        return self

    def __exit__(self, *exc: Any) -> None:
        s = state
        s.low, s.cache_enabled = s.saved.pop()
        s.on = bool(s.low)
        if not s.saved:
            s.cache.clear()  # torch's rule: the weight cache lives as long as the outermost region

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device_type, self.fast_dtype, self.enabled, self.cache_enabled):
                return fn(*args, **kwargs)
        return wrapper

    def __repr__(self) -> str:
        return (f"autocast(device_type={self.device_type!r}, dtype={self.fast_dtype}, enabled={self.enabled}, "
                f"cache_enabled={self.cache_enabled})")


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether ops on ``device_type`` tensors autocast on this thread now."""
    return device_type in state.low


def get_autocast_dtype(device_type: str = "cuda") -> torch.dtype | None:
    """The low dtype of the innermost enabled region for ``device_type`` (None when off)."""
    return state.low.get(device_type)


def clear_cache() -> None:
    """Drop this thread's cached low-precision parameter copies (``ge2.capture`` calls it around a step)."""
    state.cache.clear()


# ---------------------------------------------------------------------------------------------
# the three cast policies
# ---------------------------------------------------------------------------------------------
def _region_dtype(tensors: tuple) -> torch.dtype | None:
    """The low dtype that applies to these op inputs: the region of the first tensor's device type."""
    from ge2.autograd.tensor import Tensor

    for t in tensors:
        if isinstance(t, Tensor):
            return state.low.get(t.data.device.type)
    return None


def _copy(t: Any, dtype: torch.dtype) -> Any:
    """t cast to dtype as an autograd op (a copy; its backward casts the gradient back)."""
    from ge2.autograd.math import to

    return to(t, dtype=dtype)


def _cacheable(t: Any) -> bool:
    """A parameter (a leaf that requires grad, not a view) whose casts the region's weight cache keeps."""
    return state.cache_enabled and t.grad_fn is None and t.requires_grad and t.data._base is None


def _cached(t: Any, key: tuple, make: Callable[[], Any]) -> Any:
    """The cache's copy of t under key, made by ``make`` when missing or when t changed in place since."""
    hit = state.cache.get(key)
    # the version check catches an in-place update (an optimizer step) inside the region
    if hit is not None and hit[0] is t and hit[1] == t._version_counter.value:
        return hit[2]
    out = make()
    state.cache[key] = (t, t._version_counter.value, out)  # holds t: its id stays unique meanwhile
    return out


def _cast(t: Any, dtype: torch.dtype) -> Any:
    if _cacheable(t):
        from ge2.autograd import grad_mode

        return _cached(t, (id(t), dtype, grad_mode.is_grad_enabled()), lambda: _copy(t, dtype))
    return _copy(t, dtype)


def cached_low_copy(t: Any, like: Any) -> torch.Tensor | None:
    """The region's low-dtype copy of parameter ``t`` as a plain torch tensor (no autograd node), cast once per
    region like the weight cache, for an op whose input ``like`` picks the region and that writes ``t``'s
    gradient in ``t``'s own dtype itself (``linear``: from the GEMM's fp32 accumulator, so no cast runs
    backward). None where ``cast_low`` would not cache a cast of ``t``: the op then casts as usual."""
    low = _region_dtype((like,))
    if low is None or not _is_tensor(t) or t.dtype not in _ELIGIBLE or t.dtype == low or not _cacheable(t):
        return None
    return _cached(t, (id(t), low, "plain"), lambda: _plain_copy(t, low))


def _plain_copy(t: Any, dtype: torch.dtype) -> torch.Tensor:
    """t's data cast to dtype, outside autograd."""
    out = torch.empty_like(t.data, dtype=dtype)
    out.copy_(t.data)
    return out


def _is_tensor(t: Any) -> bool:
    from ge2.autograd.tensor import Tensor

    return isinstance(t, Tensor)


def cast_low(*tensors: Any) -> tuple:
    """lower_precision_fp policy: fp32/fp16/bf16 Tensors in the region's low dtype; others as given."""
    low = _region_dtype(tensors)
    if low is None:
        return tensors
    return tuple(_cast(t, low) if _is_tensor(t) and t.dtype in _ELIGIBLE and t.dtype != low else t
                 for t in tensors)


def cast_fp32(*tensors: Any) -> tuple:
    """fp32 policy: fp16/bf16 Tensors up to float32; others as given."""
    if _region_dtype(tensors) is None:
        return tensors
    return tuple(_cast(t, torch.float32) if _is_tensor(t) and t.dtype in LOW_DTYPES else t for t in tensors)


def cast_widest(*tensors: Any) -> tuple:
    """promote policy: every floating Tensor in the widest floating dtype among them."""
    if _region_dtype(tensors) is None:
        return tensors
    floats = [t.dtype for t in tensors if _is_tensor(t) and t.dtype.is_floating_point]
    if not floats:
        return tensors
    widest = floats[0]
    for dt in floats[1:]:
        widest = torch.promote_types(widest, dt)
    return tuple(_cast(t, widest) if _is_tensor(t) and t.dtype.is_floating_point and t.dtype != widest else t
                 for t in tensors)


def autocast_low(*tensors: Any) -> tuple:
    """For ops outside ge2's functional layer (attention): the tensors cast as a matmul's inputs would be.

    Returns the tuple unchanged when autocast is off for their device type.
    """
    if not state.on:
        return tensors
    return cast_low(*tensors)
