"""ge2's compiled helpers for the repeated-call path of an op (``native.c``): the call key, a kernel
launch whose parameters are packed once, the registry's entry, and ``Function.apply`` when nothing is
recorded.

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
         "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}  # struct formats of Triton's scalar types
_module: Any = None  # the built module; False where it cannot be built
# CUDA's CUtensorMapDataType for fp32 read as tf32 (TMA rounds on load): descriptors made with
# ``round_f32_to_tf32=True`` (ge2.kernels.gemm._tma_rounding) are encoded with it
CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 = 11


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


def function_apply(tensor: type, context: type, version: type, grad_state, python_apply: Callable) -> Callable | None:
    """``Function.apply``'s compiled version (``native.c``: the path without recording in C, recording
    through ``python_apply``), or None where the module cannot be built."""
    built = module()
    if built is None:
        return None
    built.set_autograd(tensor, context, version, grad_state, python_apply, torch.Tensor)
    return built.apply


def needs_triton_launcher(launcher) -> bool:
    """Whether a compiled kernel's launcher must run as Triton's Python code: scratch memory (allocated
    per launch) or clusters (num_ctas > 1), which neither direct launch path provides."""
    return bool(launcher.global_scratch_size or launcher.profile_scratch_size or getattr(launcher, "num_ctas", 1) != 1)


def _tensor_map(value, meta: dict | None) -> tuple | None:
    """A TMA descriptor argument as ``Launch``'s tensor-map spec plus the shape and strides Triton passes
    after the map (its ``make_tensordesc_arg``), or None where this packer does not reproduce it."""
    base = getattr(value, "base", None)
    if meta is None or not isinstance(base, torch.Tensor) or list(value.strides)[-1:] != [1]:
        return None
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    shape, strides = [int(v) for v in value.shape], [int(v) for v in value.strides]
    if meta["fp4_padded"]:
        shape[-1] *= 2
    elem_type = CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 if getattr(value, "round_f32_to_tf32", False) else meta["elem_type"]
    spec = (base.data_ptr(), int(meta["swizzle"]), int(meta["elem_size"]), int(TMA_DTYPE_DEVICE_TO_HOST[elem_type]),
            tuple(int(v) for v in meta["block_size"]), tuple(shape), tuple(strides), value.padding == "nan")
    return spec, shape, strides


def packed_launch(kernel, grid: tuple, values: list, slots: list[int]) -> tuple[Callable, Any] | None:
    """(launch, packed) for one launch of ``kernel`` (a compiled Triton kernel) over ``grid`` with these
    argument values, the arguments at positions ``slots`` being device addresses passed per call in
    position order: ``launch(packed, stream, *addresses)`` launches, and returns False (nothing
    launched) on a thread without a CUDA context. A TMA descriptor argument becomes a tensor map
    encoded here whose global address is the one passed per call (its base tensor's).

    None when the kernel has an argument this packer does not lay out (16-bit float scalars, a
    descriptor the kernel reads without TMA), needs what only Triton's launcher provides (scratch
    memory, clusters), runs under a Triton whose layout is not reproduced here, or the module cannot
    be built.
    """
    if not triton.__version__.startswith(LAUNCH_TRITON_VERSIONS) or (built := module()) is None:
        return None
    launcher = kernel.run  # initialises the function handle
    if needs_triton_launcher(launcher):
        return None
    signature = list(getattr(kernel.src, "signature", {}).values())
    if len(signature) != len(values):
        return None
    map_metas = list(getattr(kernel.metadata, "tensordesc_meta", None) or [])
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
    storage, offsets, addresses, maps = bytearray(), [], [], []

    def scalar(kind: str, value) -> bool:
        offsets.append(len(storage))
        try:
            storage.extend(struct.pack(_PACK[kind], value))
        except (KeyError, struct.error):  # an unknown type, or out of its range: Triton would not type it so
            return False
        storage.extend(bytes(-len(storage) % 8))  # each parameter 8-byte aligned
        return True

    for kind, value, slot in flat:
        if kind.startswith("tensordesc"):
            if not slot or not map_metas or (tensor_map := _tensor_map(value, map_metas.pop(0))) is None:
                return None
            spec, shape, strides = tensor_map
            storage.extend(bytes(-len(storage) % 128))  # a CUtensorMap is 128-byte aligned
            offsets.append(len(storage))
            maps.append((len(addresses), spec))
            addresses.append(len(storage))
            storage.extend(bytes(128))
            if not all(scalar("i32", v) for v in shape) or not all(scalar("i64", v) for v in strides):
                return None
        elif slot or (kind.startswith("*") and type(value) is int):
            if not kind.startswith("*") or (not slot and type(value) is not int):
                return None
            if slot:
                addresses.append(len(storage))
            if not scalar("u64", 0 if slot else value):
                return None
        elif type(value) not in (int, bool, float) or not scalar(kind, value):
            return None
    if map_metas:  # descriptors Triton lowered that this packer did not meet
        return None
    for _ in range(2):  # the global and profile scratch addresses Triton appends (none here)
        scalar("u64", 0)
    packed = built.Launch(kernel.function, tuple(grid), 32 * kernel.metadata.num_warps, kernel.metadata.shared,
                          bool(launcher.launch_cooperative_grid), bool(launcher.launch_pdl), bytes(storage),
                          tuple(offsets), tuple(addresses), tuple(maps))
    return built.launch, packed
