"""Scans: schemas and Triton implementations (kernels in ``ge2.kernels.scan``).

``cumsum(x, *, dim, reverse=False)``, ``cumprod(...)``: floats keep their dtype, ints/bool -> int64.
``logcumsumexp(x, *, dim, reverse=False)``: floats. ``reverse`` scans from the end (the gradients).
"""
from __future__ import annotations

from ge2.backend.registry import BOOL_DTYPES, FLOAT_DTYPES, INT_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, normalize_dims
from ge2.kernels import scan as K


def _check_scan(op: str, x, *, dim, reverse: bool = False) -> None:
    if dim is None or not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    normalize_dims(op, dim, x.dim())


for _name, _op, _dtypes in (("cumsum", "sum", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),
                            ("cumprod", "prod", FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES),
                            ("logcumsumexp", "logsumexp", FLOAT_DTYPES)):
    defop(_name, Schema((TensorArg("x", _dtypes),), _check_scan))
    register(_name, "triton", dtypes=_dtypes)(
        lambda x, *, dim, reverse=False, _op=_op: K.scan(x, dim=dim, op=_op, reverse=reverse))
