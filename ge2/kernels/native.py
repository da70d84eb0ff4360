"""ge2's compiled helpers for the repeated-call path of an op (``native.c``): the call key, and a
kernel launch whose parameters are packed once.

A replayed op (``ge2.backend.call_plans``) costs a few µs of host time, of which the call key and the
kernel launch are most of what ge2 controls. In Python the key pays the interpreter for every item
it reads (five per tensor); Triton's C launcher parses all of a kernel's arguments, constexprs
included, from a Python tuple on every call. ``native.c`` builds the same key in C and launches from a
parameter block packed when the plan is recorded, taking only the device addresses per call.

The module is compiled on first use by Triton's module builder into Triton's cache (the way Triton
builds its own launchers: gcc or clang, Triton's CUDA headers). Where it cannot be built, or with
``GE2_NATIVE=0``, the Python key and Triton's launcher run instead; ``tests/test_call_plans.py``
checks that both keys agree item for item.
"""
from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import triton

ENABLED: bool = os.environ.get("GE2_NATIVE", "1") not in ("", "0")
# Triton versions whose kernel parameter layout ``packed_launch`` reproduces (signature order,
# constexprs left out, tuples flattened, then the global and profile scratch addresses); with others
# call plans keep Triton's launcher.
LAUNCH_TRITON_VERSIONS = ("3.6.",)
_PACK = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
         "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}
_module: Any = None  # the built module; False where it cannot be built


def module():
    """The ge2_native module (built on the first call), or None where it cannot be built."""
    global _module
    if _module is None:
        _module = False
        if ENABLED:
            try:
                from triton.backends.nvidia import driver as nvidia
                from triton.runtime.build import compile_module_from_src

                source = (Path(__file__).parent / "native.c").read_text()
                built = compile_module_from_src(source, "ge2_native", include_dirs=nvidia.include_dirs)
                built.set_types(torch.Tensor, torch.dtype)
                _module = built
            except Exception as e:  # no C compiler: the Python key and Triton's launcher still work
                warnings.warn(f"ge2: compiled call-path helpers unavailable ({type(e).__name__}: {e}); "
                              "using the Python call key and Triton's launcher", RuntimeWarning, stacklevel=2)
    return _module or None


def call_key() -> Callable[[str, str, tuple, dict], tuple | None] | None:
    """``call_key(op, precision, inputs, attrs)`` in C, or None."""
    built = module()
    return built.call_key if built is not None else None


def needs_triton_launcher(launcher) -> bool:
    """Whether a compiled kernel's launcher must run as Triton's Python code: scratch memory (allocated
    per launch) or clusters (num_ctas > 1), which neither direct launch path provides."""
    return bool(launcher.global_scratch_size or launcher.profile_scratch_size or getattr(launcher, "num_ctas", 1) != 1)


def packed_launch(kernel, grid: tuple, values: list, slots: list[int]) -> tuple[Callable, Any] | None:
    """(launch, packed) for one launch of ``kernel`` (a compiled Triton kernel) over ``grid`` with these
    argument values, the arguments at positions ``slots`` being device addresses passed per call in
    position order: ``launch(packed, stream, *addresses)`` launches, and returns False (nothing
    launched) on a thread without a CUDA context.

    None when the kernel has an argument this packer does not lay out (TMA descriptors, 16-bit float
    scalars), needs what only Triton's launcher provides (scratch memory, clusters), runs under a
    Triton whose layout is not reproduced here, or the module cannot be built.
    """
    if not triton.__version__.startswith(LAUNCH_TRITON_VERSIONS) or (built := module()) is None:
        return None
    launcher = kernel.run  # initialises the function handle
    if needs_triton_launcher(launcher):
        return None
    signature = list(getattr(kernel.src, "signature", {}).values())
    if len(signature) != len(values):
        return None
    flat: list[tuple[str, Any, bool]] = []  # (type, value, an address passed per call?), tuples flattened

    def flatten(kind, value, slot: bool) -> bool:
        if isinstance(kind, tuple):
            return (type(value) is tuple and len(value) == len(kind) and not slot
                    and all(flatten(k, v, False) for k, v in zip(kind, value)))
        if kind != "constexpr":
            flat.append((kind, value, slot))
        return kind != "constexpr" or not slot

    if not all(flatten(kind, value, at in slots) for at, (kind, value) in enumerate(zip(signature, values))):
        return None
    storage, offsets, addresses = bytearray(), [], []
    for kind, value, slot in flat:
        offsets.append(len(storage))
        if slot:
            if not kind.startswith("*"):
                return None
            addresses.append(len(storage))
            value = 0
        if kind.startswith("*") and type(value) is int:
            storage += struct.pack("Q", value)
        elif kind in _PACK and type(value) in (int, bool, float):
            try:
                storage += struct.pack(_PACK[kind], value)
            except struct.error:  # out of the type's range: Triton would not have typed it so
                return None
        else:
            return None
        storage += bytes(-len(storage) % 8)  # each parameter 8-byte aligned
    for _ in range(2):  # the global and profile scratch addresses Triton appends (none here)
        offsets.append(len(storage))
        storage += bytes(8)
    packed = built.Launch(kernel.function, tuple(grid), 32 * kernel.metadata.num_warps, kernel.metadata.shared,
                          bool(launcher.launch_cooperative_grid), bool(launcher.launch_pdl), bytes(storage),
                          tuple(offsets), tuple(addresses))
    return built.launch, packed
