"""Where ge2 runs: CUDA when a GPU is present, otherwise the Triton interpreter on CPU tensors.

This module must be imported before triton: without a GPU it sets ``TRITON_INTERPRET=1`` so that
every ``@triton.jit`` kernel runs on the interpreter (unless the user already chose a value).
It also owns the two global knobs every kernel reads: the autotune helper and the fp32 matmul
precision.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

_CUDA = torch.cuda.is_available()

if "TRITON_INTERPRET" not in os.environ and not _CUDA:
    if "triton" in sys.modules:
        warnings.warn(
            "ge2: triton was imported before ge2 on a machine without a GPU; kernels need the "
            "Triton interpreter. Import ge2 first or set TRITON_INTERPRET=1.",
            RuntimeWarning,
            stacklevel=2,
        )
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (must follow the TRITON_INTERPRET decision)

INTERPRETER: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _round_bf16_casts_in_interpreter() -> None:
    """Make the interpreter round fp32 -> bf16 casts to nearest even, as the GPU does.

    triton 3.6's interpreter truncates them, so every bf16 result on the CPU would differ from the
    GPU's (and torch's) in about half its elements by one ulp.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    truncating_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            x = np.asarray(src.data, dtype=np.float32)
            bits = x.view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)
            return interpreter.TensorHandle(np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16), tl.bfloat16)
        return truncating_cast(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl


if INTERPRETER:
    _round_bf16_casts_in_interpreter()
    # The interpreter evaluates masked-off lanes too (on whatever the buffer holds) and NumPy warns
    # about their log(0) or 0/0; those lanes are never stored, so the warnings carry no information.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

_default_device: str = "cuda" if _CUDA else "cpu"


def is_interpreter() -> bool:
    """True when kernels run on the Triton interpreter (CPU tensors)."""
    return INTERPRETER


def device() -> torch.device:
    """The default device of ge2 tensors: cuda if a GPU is present, else cpu (interpreter)."""
    return torch.device(_default_device)


def resolve_device(dev: str | torch.device | None) -> torch.device:
    """Turn a user's ``device=`` argument ("cuda", "cpu", "cuda:1", torch.device, None) into a device."""
    if dev is None:
        return device()
    try:
        d = torch.device(dev)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: expected 'cuda' or 'cpu', got {dev!r}") from e
    if d.type not in ("cuda", "cpu"):
        raise ValueError(f"device: ge2 runs on 'cuda' or 'cpu' (the Triton interpreter), got {dev!r}")
    if d.type == "cuda" and not _CUDA:
        raise RuntimeError(f"device: {dev!r} was asked for but no CUDA GPU is available")
    if d.type == "cpu" and not INTERPRETER:
        raise RuntimeError(
            "device: 'cpu' tensors need the Triton interpreter; set TRITON_INTERPRET=1 "
            "before importing ge2 to run kernels on the CPU"
        )
    return d


def set_default_device(dev: str | torch.device) -> None:
    """Set the device that factories use when no ``device=`` is given."""
    global _default_device
    _default_device = str(resolve_device(dev))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints, for grids: triton.cdiv is a constexpr function (~2 us a call)."""
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# fp32 matmul precision
# ---------------------------------------------------------------------------------------------
# Default "tf32x3": Triton's error-compensated tf32 (a = hi + lo, three tensor-core products
# hi*hi + hi*lo + lo*hi). An fp32 model gets fp32 accuracy (measured on the H100 at 1024-deep
# reductions: max error vs float64 2e-7 of the output's scale, cuBLAS's fp32 SGEMM 1e-6; inf and
# NaN propagate as in cuBLAS) at tensor-core speed: 3-8x faster than Triton's CUDA-core fp32 dot,
# which reaches a third of cuBLAS SGEMM (docs/gemm.md, "fp32 precision"). "ieee" is that exact
# CUDA-core FMA path (torch's default semantics); "tf32" the one-pass tensor-core mode (~1e-3
# relative error, what torch.backends.cuda.matmul.allow_tf32 = True gives). bf16/fp16 inputs
# always use tensor cores with fp32 accumulation.
_MATMUL_PRECISIONS = ("ieee", "tf32", "tf32x3")
_matmul_precision = "tf32x3"


def packed_layout(parts: tuple[torch.Tensor, ...]) -> tuple[list[int], list[int]] | None:
    """(shape, strides) of one tensor [n, *shape] whose slices are ``parts`` (n views of one storage with
    one shape and strides, offsets evenly spaced, no element shared), or None when they are not so laid out.

    q, k and v cut from one projection (a GPT's c_attn output [B, T, 3, H, E]) are such slices.
    """
    first = parts[0]
    if any(p.shape != first.shape or p.stride() != first.stride() or p.dtype != first.dtype
           or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() for p in parts[1:]):
        return None
    step = parts[1].storage_offset() - first.storage_offset() if len(parts) > 1 else 1
    if step <= 0 or any(p.storage_offset() != first.storage_offset() + i * step for i, p in enumerate(parts)):
        return None
    shape, strides = [len(parts), *first.shape], [step, *first.stride()]
    # no element shared: each stride (ascending) clears the reach of the smaller dims together
    reach = 0
    for size, stride in sorted(zip(shape, strides), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride <= reach:
            return None
        reach += (size - 1) * stride
    return shape, strides


def set_matmul_precision(precision: str) -> str:
    """Set how fp32 matmuls/convs run: "tf32x3" (default), "ieee" or "tf32". Returns the old value."""
    global _matmul_precision
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError(
            f"set_matmul_precision: precision must be one of {_MATMUL_PRECISIONS}, got {precision!r}"
        )
    old, _matmul_precision = _matmul_precision, precision
    return old


def get_matmul_precision() -> str:
    """The current fp32 matmul precision: "ieee", "tf32" or "tf32x3"."""
    return _matmul_precision


# ---------------------------------------------------------------------------------------------
# autotune
# ---------------------------------------------------------------------------------------------
def tuning_bench(kernel_call, quantiles):
    """Autotune timing for kernels of tens of microseconds: 25 ms of repeats per candidate suffice
    (Triton's default of 100 ms made first calls take seconds). Pass as ``autotune(do_bench=...)``."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def autotune(configs: list[triton.Config], key: list[str], default: int | triton.Config = 0, **kwargs):
    """Decorator: autotune over ``configs`` on a GPU, persisted per GPU model (``ge2.tuning``);
    one pinned config under the interpreter.

    ``default`` (an index into ``configs`` or a Config) is the designated config used where tuning
    cannot run: the interpreter fails on multi-config autotune, and tuning there would measure
    nothing anyway. It is also the baseline that ``ge2 autotune`` reports speed-ups against.
    ``exact_keys``: key names whose values are codes, stored unbucketed (``ge2.tuning``).
    Extra kwargs (``prune_configs_by``, ``reset_to_zero``, ``do_bench``, ...) pass to Triton.
    """
    if not configs:
        raise ValueError("autotune: configs must not be empty")
    pinned = configs[default] if isinstance(default, int) else default
    exact_keys = tuple(kwargs.pop("exact_keys", ()))
    if INTERPRETER:
        kwargs.pop("prune_configs_by", None)
        return triton.autotune(configs=[pinned], key=key, **kwargs)

    from ge2.tuning import PersistentAutotuner

    reset_to_zero, restore_value = kwargs.pop("reset_to_zero", None), kwargs.pop("restore_value", None)

    def decorator(fn):
        return PersistentAutotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value,
                                   default_config=pinned, exact_keys=exact_keys, **kwargs)

    return decorator
