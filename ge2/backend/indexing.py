"""Indexing ops: schemas and Triton implementations (kernels in ``ge2.kernels.indexing``).

``index_read(x, i0, ..., i7, *, adv_dims, check=None) -> out``
    x[adv]: x is the basic view of a key, i_k (broadcast to one shape) index its dims adv_dims[k].
``index_write(x, value, i0, ..., *, adv_dims, accumulate=False, check=None) -> x``
    x[adv] = value (or += with accumulate; duplicates add up), in place.
``index_select(x, index, *, dim, check=None) -> out``
``index_put_along(x, index, src, *, dim, mode, op, alpha=None, check=None) -> x``
    in place along dim: mode "store" (index_copy, index_fill with a number src) or "add" (index_add).
``nonzero(x, *, as_tuple=False)``   one host sync: the count decides the output's size.
``one_hot(index, *, num_classes, check=None) -> int64 [*index.shape, num_classes]``

Out-of-range indices raise ValueError: at the call on the CPU or with ``check=True``; on the GPU
by default without a host sync, at a later indexing call or ``ge2.check_pending_indices()``.
"""
from __future__ import annotations

import torch

from ge2.backend.registry import ALL_DTYPES, defop, register
from ge2.backend.schema import Schema, TensorArg, shape_str
from ge2.kernels import indexing as K

INDEX_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
MAX_INDICES = 8
_INDEX_ARGS = tuple(TensorArg(f"i{k}", INDEX_DTYPES, optional=True) for k in range(MAX_INDICES))


def _check_adv(op: str, x, indices, adv_dims) -> None:
    indices = [t for t in indices if t is not None]
    if not indices or len(indices) != len(adv_dims):
        raise ValueError(f"{op}: {len(indices)} index tensors for {len(adv_dims)} indexed dims")
    if any(tuple(t.shape) != tuple(indices[0].shape) for t in indices):
        raise ValueError(f"{op}: index tensors must be broadcast to one shape, got "
                         f"{', '.join(shape_str(t.shape) for t in indices)}")
    if list(adv_dims) != sorted(set(adv_dims)) or adv_dims[-1] >= x.dim():
        raise ValueError(f"{op}: adv_dims {adv_dims} must be increasing dims of x {shape_str(x.shape)}")


def _check_read(op: str, x, *indices, adv_dims, check=None) -> None:
    _check_adv(op, x, indices, adv_dims)


def _check_write(op: str, x, value, *indices, adv_dims, accumulate=False, check=None) -> None:
    _check_adv(op, x, indices, adv_dims)
    plan_shape = K.result_layout(tuple(x.shape), tuple(adv_dims), tuple(indices[0].shape))[2]
    try:
        fits = tuple(torch.broadcast_shapes(tuple(value.shape), plan_shape)) == plan_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: value of shape {shape_str(value.shape)} cannot be broadcast to the indexed "
                         f"shape {shape_str(plan_shape)}")


def _indices(indices) -> list:
    return [t for t in indices if t is not None]


defop("index_read", Schema((TensorArg("x"),) + _INDEX_ARGS, _check_read))
register("index_read", "triton", dtypes=ALL_DTYPES)(
    lambda x, *indices, adv_dims, check=None: K.index_read(x, _indices(indices), tuple(adv_dims), check))

defop("index_write", Schema((TensorArg("x"), TensorArg("value")) + _INDEX_ARGS, _check_write))


@register("index_write", "triton", dtypes=ALL_DTYPES)
def _index_write(x, value, *indices, adv_dims, accumulate=False, check=None):
    K.index_write(x, _indices(indices), tuple(adv_dims), value, accumulate, check)
    return x


def _check_dim(op: str, x, dim) -> None:
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        raise ValueError(f"{op}: dim {dim} is out of range for a tensor of shape {shape_str(x.shape)}")


def _check_index_1d(op: str, index) -> None:
    if index.dim() > 1:
        raise ValueError(f"{op}: index must be 0-D or 1-D, got shape {shape_str(index.shape)}")


def _check_index_select(op: str, x, index, *, dim, check=None) -> None:
    _check_dim(op, x, dim)
    _check_index_1d(op, index)


defop("index_select", Schema((TensorArg("x"), TensorArg("index", INDEX_DTYPES)), _check_index_select))
register("index_select", "triton", dtypes=ALL_DTYPES)(
    lambda x, index, *, dim, check=None: K.index_select(x, dim % max(x.dim(), 1), index, check) if x.dim()
    else K.index_select(x.reshape(1), 0, index, check).reshape(index.shape))


def _check_put_along(op: str, x, index, src, *, dim, mode, op_name="index_put", alpha=None, check=None) -> None:
    _check_dim(op_name, x, dim)
    _check_index_1d(op_name, index)
    if mode not in ("store", "add"):
        raise ValueError(f"{op}: mode must be 'store' or 'add', got {mode!r}")
    if isinstance(src, torch.Tensor):
        want = list(x.shape)
        if want:
            want[dim % len(want)] = index.numel()
        if list(src.shape) != want and not (src.numel() == index.numel() and x.dim() <= 1):
            raise ValueError(f"{op_name}: source has shape {shape_str(src.shape)} but x {shape_str(x.shape)} with "
                             f"{index.numel()} indices along dim {dim} needs {shape_str(want)}")


defop("index_put_along", Schema((TensorArg("x"), TensorArg("index", INDEX_DTYPES),
                                  TensorArg("src", scalar_ok=True)), _check_put_along))


@register("index_put_along", "triton", dtypes=ALL_DTYPES)
def _index_put_along(x, index, src, *, dim, mode, op_name="index_put", alpha=None, check=None):
    view = x if x.dim() else x.reshape(1)
    K.index_put_along(view, dim % view.dim(), index, src.reshape(-1) if isinstance(src, torch.Tensor) and
                      x.dim() == 0 else src, mode, op_name, alpha, check)
    return x


defop("nonzero", Schema((TensorArg("x"),)))
register("nonzero", "triton", dtypes=ALL_DTYPES)(lambda x, *, as_tuple=False: K.nonzero(x, as_tuple))


def _check_one_hot(op: str, index, *, num_classes, check=None) -> None:
    if num_classes < 0:
        raise ValueError(f"{op}: num_classes must be >= 0, got {num_classes}")


defop("one_hot", Schema((TensorArg("index", (torch.int64,)),), _check_one_hot))
register("one_hot", "triton", dtypes=(torch.int64,))(
    lambda index, *, num_classes, check=None: K.one_hot(index, num_classes, check))
