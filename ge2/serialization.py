"""Checkpoints: ``ge2.save(obj, path)`` / ``ge2.load(path)`` for nested state dicts of tensors.

File layout (no pickle, so loading a file runs no code):

    b"GE2CKPT\\n" | header length (uint64 LE) | header (JSON) | payload | b"GE2END" | crc32 (uint32 LE)

The header describes the object tree (dicts with any str/int keys, lists, tuples, numbers, strings,
None, dtypes) with tensors replaced by references into the payload, where each tensor's raw bytes
lie (so a load is bit-exact, NaN payloads and all). The writer goes to a temporary file in the same
directory, fsyncs it and renames it over the target: a crash leaves the old checkpoint or the new
one, never half of one. The reader checks the magic, the sizes and the CRC and names what is wrong.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from typing import Any

import torch

from ge2 import runtime
from ge2.autograd.tensor import Tensor

MAGIC = b"GE2CKPT\n"
END = b"GE2END"
VERSION = 1

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool, torch.complex64, torch.complex128)}


class CheckpointError(ValueError):
    """The file is not a ge2 checkpoint, or it is truncated or corrupted."""


def _encode(obj: Any, tensors: list[tuple[str, torch.Tensor]]) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"v": obj}
    if isinstance(obj, Tensor):
        tensors.append(("ge2", obj.data))
        return {"tensor": len(tensors) - 1}
    if isinstance(obj, torch.Tensor):
        tensors.append(("torch", obj))
        return {"tensor": len(tensors) - 1}
    if isinstance(obj, torch.dtype):
        return {"dtype": str(obj).replace("torch.", "")}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"save: dict keys must be str or int, got {type(k).__name__} ({k!r})")
        return {"dict": [[k, _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"list" if isinstance(obj, list) else "tuple": [_encode(v, tensors) for v in obj]}
    raise TypeError(f"save: cannot store a {type(obj).__name__}; checkpoints hold dicts, lists, tuples, numbers, "
                    "strings, None, dtypes and tensors")


def _decode(node: Any, tensors: list[Any]) -> Any:
    if "v" in node:
        return node["v"]
    if "tensor" in node:
        return tensors[node["tensor"]]
    if "dtype" in node:
        return _DTYPES[node["dtype"]]
    if "dict" in node:
        return {k: _decode(v, tensors) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, tensors) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, tensors) for v in node["tuple"])
    raise CheckpointError(f"load: unknown node in the checkpoint header: {sorted(node)}")


def _bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` (e.g. {"model": model.state_dict(), "optimizer": opt.state_dict()}) to ``path`` atomically."""
    path = os.fspath(path)
    tensors: list[tuple[str, torch.Tensor]] = []
    tree = _encode(obj, tensors)
    metas, chunks, offset = [], [], 0
    for kind, t in tensors:
        if t.dtype not in _DTYPES.values():
            raise TypeError(f"save: tensors of dtype {t.dtype} are not supported")
        data = _bytes(t)
        metas.append({"kind": kind, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                      "offset": offset, "nbytes": len(data)})
        chunks.append(data)
        offset += len(data)
    header = json.dumps({"version": VERSION, "tree": tree, "tensors": metas, "payload_bytes": offset}).encode()
    crc = zlib.crc32(header)
    for c in chunks:
        crc = zlib.crc32(c, crc)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ge2ckpt-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for c in chunks:
                f.write(c)
            f.write(END)
            f.write(struct.pack("<I", crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path: str | os.PathLike, map_location=None) -> Any:
    """Read a checkpoint written by ``save``; tensors go to ``map_location`` (default ``ge2.device()``)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        blob = f.read()
    name = os.path.basename(path)
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"load: {name} is not a ge2 checkpoint (it does not start with {MAGIC!r}; "
                              "ge2.load reads files written by ge2.save)")
    pos = len(MAGIC)
    if len(blob) < pos + 8:
        raise CheckpointError(f"load: {name} is truncated ({len(blob)} bytes, the header length is missing)")
    (hlen,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    if len(blob) < pos + hlen:
        raise CheckpointError(f"load: {name} is truncated ({len(blob)} bytes; the header alone needs {pos + hlen})")
    try:
        header = json.loads(blob[pos:pos + hlen])
    except ValueError as e:
        raise CheckpointError(f"load: {name} has a corrupted header ({e})") from None
    pos += hlen
    payload = header["payload_bytes"]
    expected = pos + payload + len(END) + 4
    if len(blob) != expected:
        raise CheckpointError(f"load: {name} is truncated or has trailing data: {len(blob)} bytes, expected {expected}")
    if blob[pos + payload:pos + payload + len(END)] != END:
        raise CheckpointError(f"load: {name} is corrupted (end marker missing)")
    (crc,) = struct.unpack_from("<I", blob, pos + payload + len(END))
    if zlib.crc32(blob[pos:pos + payload], zlib.crc32(blob[len(MAGIC) + 8:len(MAGIC) + 8 + hlen])) != crc:
        raise CheckpointError(f"load: {name} is corrupted (checksum mismatch)")
    device = runtime.resolve_device(map_location)
    tensors = []
    for m in header["tensors"]:
        dtype = _DTYPES[m["dtype"]]
        raw = bytearray(blob[pos + m["offset"]:pos + m["offset"] + m["nbytes"]])
        if m["nbytes"]:
            t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(m["shape"])
        else:
            t = torch.empty(m["shape"], dtype=dtype)
        t = t.to(device)
        tensors.append(Tensor(t) if m["kind"] == "ge2" else t)
    return _decode(header["tree"], tensors)


# ---------------------------------------------------------------------------------------------
# safetensors: weights for (and from) torch users
# ---------------------------------------------------------------------------------------------
def save_safetensors(obj: Any, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write a module's state_dict (or a state dict of tensors) as a safetensors file, torch's key names.

    ``torch_module.load_state_dict(safetensors.torch.load_file(path))`` then loads it into the
    equivalent torch model. Tensors that share memory (tied weights) are written once per key, as
    torch's ``state_dict`` lists them. Written to a temporary file and renamed over ``path``.
    """
    from safetensors.torch import save_file

    state = obj.state_dict() if hasattr(obj, "state_dict") and callable(obj.state_dict) else obj
    if not hasattr(state, "items"):
        raise TypeError(f"save_safetensors: expected a Module or a dict of tensors, got {type(obj).__name__}")
    tensors = {}
    for key, value in state.items():
        data = value.data if isinstance(value, Tensor) else value
        if not isinstance(key, str) or not isinstance(data, torch.Tensor):
            raise TypeError(f"save_safetensors: {key!r} must map a str to a tensor, got {type(value).__name__}")
        tensors[key] = data.detach().to("cpu", copy=True).contiguous()  # one buffer per key: ties untied
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_safetensors(path: str | os.PathLike, device: str | torch.device | None = None) -> dict[str, Tensor]:
    """A safetensors file (ge2's or torch's) as {name: ge2 Tensor} on ``device`` (default: ge2.device()).

    ``module.load_state_dict(ge2.load_safetensors(path))`` loads torch-saved weights.
    """
    from safetensors.torch import load_file

    dev = runtime.resolve_device(device) if device is not None else runtime.device()
    return {k: Tensor(v) for k, v in load_file(os.fspath(path), device=str(dev)).items()}
