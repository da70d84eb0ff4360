"""Indexing, gather and scatter with gradients (ops in ``ge2.backend.indexing`` / ``ge2.backend.scatter``).

``x[key]`` with only ints, slices, None and ``...`` stays a view (``math.index``); a key with
integer tensors, lists or bool masks is split into that basic view plus index tensors
(broadcast together; a mask becomes its ``nonzero`` coordinates, one host sync) and read by a
gather kernel; ``x[key] = v`` writes through the same walk in place. Gradients: a read scatters
its gradient back with atomics (duplicates add up); a write zeroes the written positions of the
gradient and gathers the value's gradient. This module installs the Tensor methods at its bottom.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch

from ge2 import backend
from ge2.autograd import grad_mode
from ge2.autograd import math as M
from ge2.autograd.function import Function
from ge2.autograd.tensor import Tensor, _check_inplace
from ge2.backend.schema import normalize_dims, shape_str
from ge2.kernels.scatter import check_pending_indices  # noqa: F401  (re-exported as ge2.check_pending_indices)

call = backend.call


# ---------------------------------------------------------------------------------------------
# keys
# ---------------------------------------------------------------------------------------------
def _key_tensor(k, device: torch.device) -> torch.Tensor:
    """An advanced key entry as a torch tensor (int or bool) on ``device``."""
    if isinstance(k, Tensor):
        t = k.data
    elif isinstance(k, (list, tuple)):
        t = torch.tensor(k) if len(k) else torch.zeros(0, dtype=torch.int64)
    else:
        raise TypeError(f"index: unsupported index type {type(k).__name__}")
    if t.dtype.is_floating_point or t.is_complex():
        raise TypeError(f"index: tensors used as indices must be integer or bool, got {t.dtype}")
    return t.to(device)


def parse_key(x: Tensor, key):
    """(basic key, adv_dims, broadcast index tensors) of ``x[key]``, or None for a basic key (a view)."""
    keys = key if isinstance(key, tuple) else (key,)
    items, consumed, advanced = [], 0, False
    for k in keys:
        if isinstance(k, bool):
            raise TypeError("index: a Python bool is not a supported index (use a bool Tensor mask)")
        if k is None or k is Ellipsis or isinstance(k, slice):
            items.append(k)
            consumed += isinstance(k, slice)
        elif isinstance(k, numbers.Integral):
            items.append(int(k))
            consumed += 1
        elif isinstance(k, torch.Tensor):
            raise TypeError("index: got a torch.Tensor index; wrap it with ge2.from_torch(t)")
        else:
            t = _key_tensor(k, x.device)
            if t.dtype in (torch.bool, torch.uint8):
                if t.dim() == 0:
                    raise TypeError("index: a 0-d bool mask is not supported")
                consumed += t.dim()
            else:
                consumed += 1
            items.append(t)
            advanced = True
    if not advanced:
        return None
    if sum(k is Ellipsis for k in items) > 1:
        raise IndexError("index: an index can only have a single ellipsis ('...')")
    if consumed > x.ndim:
        raise IndexError(f"index: too many indices for a tensor of shape {list(x.shape)} ({consumed} dims indexed)")
    basic, adv_dims, indices, vd, xd = [], [], [], 0, 0
    for it in items:
        if it is Ellipsis:
            n = x.ndim - consumed
            basic += [slice(None)] * n
            vd, xd = vd + n, xd + n
        elif it is None:
            basic.append(None)
            vd += 1
        elif isinstance(it, slice):
            basic.append(it)
            vd, xd = vd + 1, xd + 1
        elif isinstance(it, int):
            basic.append(it)
            xd += 1
        elif it.dtype in (torch.bool, torch.uint8):
            want = tuple(x.shape[xd:xd + it.dim()])
            if tuple(it.shape) != want:
                raise IndexError(f"index: the mask of shape {list(it.shape)} does not match the indexed dims "
                                 f"{list(want)} of a tensor of shape {list(x.shape)} (starting at dim {xd})")
            for coord in call("nonzero", it, as_tuple=True):
                basic.append(slice(None))
                adv_dims.append(vd)
                indices.append(coord)
                vd, xd = vd + 1, xd + 1
        else:
            basic.append(slice(None))
            adv_dims.append(vd)
            indices.append(it)
            vd, xd = vd + 1, xd + 1
    if len(indices) > 8:
        raise IndexError(f"index: at most 8 indexed dims are supported, got {len(indices)}")
    try:
        indices = list(torch.broadcast_tensors(*indices))
    except RuntimeError:
        raise IndexError("index: shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(shape_str(t.shape) for t in indices)) from None
    return tuple(basic), tuple(adv_dims), indices


def _basic_view(t: torch.Tensor, basic: tuple, shape) -> torch.Tensor:
    try:
        return t[basic]
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor shape {list(shape)})") from None
    except ValueError as e:  # a slice step <= 0
        raise ValueError(f"index: {e} (tensor shape {list(shape)})") from None


class AdvancedIndex(Function):
    """x[basic][adv]: a gather; the gradient scatter-adds into zeros (duplicates accumulate)."""

    @staticmethod
    def forward(ctx, x, basic, adv_dims, *indices):
        ctx.shape, ctx.basic, ctx.adv_dims, ctx.indices = tuple(x.shape), basic, adv_dims, indices
        return call("index_read", _basic_view(x, basic, x.shape), *indices, adv_dims=adv_dims)

    @staticmethod
    def backward(ctx, gy):
        gx = torch.zeros(ctx.shape, dtype=gy.dtype, device=gy.device)
        call("index_write", gx[ctx.basic], gy, *ctx.indices, adv_dims=ctx.adv_dims, accumulate=True)
        return (gx, None, None) + (None,) * len(ctx.indices)


class IndexPut(Function):
    """A copy of x with x[basic][adv] = value (or += with accumulate); adv may be empty (a basic key)."""

    @staticmethod
    def forward(ctx, x, value, basic, adv_dims, accumulate, *indices):
        ctx.basic, ctx.adv_dims, ctx.indices, ctx.accumulate = basic, adv_dims, indices, accumulate
        ctx.value_meta = (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None
        out = x.clone()
        _write(out, value, basic, adv_dims, indices, accumulate)
        return out

    @staticmethod
    def backward(ctx, gy):
        gx = gy
        if not ctx.accumulate:
            gx = gy.clone()
            _write(gx, 0, ctx.basic, ctx.adv_dims, ctx.indices, False)
        gv = None
        if ctx.value_meta is not None and ctx.needs_input_grad[1]:
            gv = gy[ctx.basic]
            if ctx.adv_dims:
                gv = call("index_read", gv, *ctx.indices, adv_dims=ctx.adv_dims)
            gv = M.sum_to_shape(gv, ctx.value_meta[0]).to(ctx.value_meta[1])
        return (gx, gv, None, None, None) + (None,) * len(ctx.indices)


def _write(t: torch.Tensor, value, basic, adv_dims, indices, accumulate: bool) -> None:
    """t[basic][adv] = value (or +=) in t's memory; value a torch tensor or a number."""
    view = _basic_view(t, basic, t.shape)
    if adv_dims:
        if not isinstance(value, torch.Tensor):
            value = torch.full((), value, dtype=t.dtype, device=t.device)
        call("index_write", view, value, *indices, adv_dims=adv_dims, accumulate=accumulate)
    elif accumulate:
        view.copy_(call("add", view, value))
    elif isinstance(value, torch.Tensor):
        try:
            view.copy_(value)
        except RuntimeError:
            raise ValueError(f"setitem: value of shape {list(value.shape)} cannot be broadcast to the indexed "
                             f"shape {list(view.shape)}") from None
    else:
        view.fill_(value)


def getitem(x: Tensor, key) -> Tensor:
    """x[key] as torch: basic keys give a view, advanced keys (tensors, lists, masks) a gathered copy."""
    parsed = parse_key(x, key)
    if parsed is None:
        return M.index(x, key)
    basic, adv_dims, indices = parsed
    return AdvancedIndex.apply(x, basic, adv_dims, *indices)


def _value(value, op: str):
    if isinstance(value, (Tensor, numbers.Number)) and not isinstance(value, complex):
        return value
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: got a torch.Tensor value; wrap it with ge2.from_torch(t)")
    raise TypeError(f"{op}: value must be a Tensor or a number, got {type(value).__name__}")


def _put(x: Tensor, key, value, accumulate: bool, op: str) -> Tensor:
    value = _value(value, op)
    parsed = parse_key(x, key)
    basic, adv_dims, indices = parsed if parsed is not None else (key if isinstance(key, tuple) else (key,), (), [])
    needs = isinstance(value, Tensor) and value.requires_grad
    if grad_mode.is_grad_enabled() and (x.requires_grad or needs):
        return M.inplace(x, lambda: IndexPut.apply(x, value, basic, adv_dims, accumulate, *indices), op)
    _check_inplace(x, op)
    _write(x.data, value.data if isinstance(value, Tensor) else value, basic, adv_dims, indices, accumulate)
    x._version_counter.value += 1
    return x


def setitem(x: Tensor, key, value) -> None:
    """x[key] = value in place (a Tensor broadcast to the indexed shape, or a number); recorded on non-leaves."""
    _put(x, key, value, False, "setitem")


def index_put_(x: Tensor, indices: Sequence, values, accumulate: bool = False) -> Tensor:
    """x[indices] = values (or += with accumulate: duplicate indices add up), in place."""
    return _put(x, tuple(indices), values, accumulate, "index_put_")


def index_put(x: Tensor, indices: Sequence, values, accumulate: bool = False) -> Tensor:
    """A copy of x with x[indices] = values (or +=)."""
    return index_put_(M.clone(x), indices, values, accumulate)


# ---------------------------------------------------------------------------------------------
# index_select / index_add / index_copy / index_fill / masked_*
# ---------------------------------------------------------------------------------------------
def _dim(op: str, dim: int, ndim: int) -> int:
    return normalize_dims(op, dim, ndim)[0] if ndim else 0


def _index_arg(op: str, index) -> torch.Tensor:
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}: index must be an integer Tensor, got {type(index).__name__}")
    if index.dtype.is_floating_point or index.dtype == torch.bool:
        raise TypeError(f"{op}: index must be an integer Tensor, got dtype {index.dtype}")
    return index.data


class IndexSelect(Function):
    @staticmethod
    def forward(ctx, x, index, dim):
        ctx.shape, ctx.index, ctx.dim = tuple(x.shape), index, dim
        return call("index_select", x, index, dim=dim)

    @staticmethod
    def backward(ctx, gy):
        gx = torch.zeros(ctx.shape, dtype=gy.dtype, device=gy.device)
        call("index_put_along", gx, ctx.index, gy, dim=ctx.dim, mode="add", op_name="index_select")
        return gx, None, None


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """x at positions ``index`` (1-D) along ``dim``: x's shape with that dim of size len(index)."""
    return IndexSelect.apply(x, _index_arg("index_select", index), _dim("index_select", dim, x.ndim))


class IndexPutAlong(Function):
    """index_add (mode add, alpha) / index_copy (store a tensor) / index_fill (store a number) along dim."""

    @staticmethod
    def forward(ctx, x, index, src, dim, mode, alpha, op):
        ctx.index, ctx.dim, ctx.mode, ctx.alpha = index, dim, mode, alpha
        out = x.clone()
        call("index_put_along", out, index, src, dim=dim, mode=mode, op_name=op,
             **({"alpha": alpha} if alpha is not None else {}))
        return out

    @staticmethod
    def backward(ctx, gy):
        gx = gy
        if ctx.mode == "store":
            gx = gy.clone()
            call("index_put_along", gx, ctx.index, 0, dim=ctx.dim, mode="store", op_name="index_fill")
        gs = None
        if ctx.needs_input_grad[2]:
            gs = call("index_select", gy, ctx.index, dim=ctx.dim)
            if ctx.alpha is not None and ctx.alpha != 1:
                gs = call("mul", gs, ctx.alpha)
        return gx, None, gs, None, None, None, None


def _src(op: str, x: Tensor, source) -> Tensor:
    if not isinstance(source, Tensor):
        raise TypeError(f"{op}: source must be a Tensor, got {type(source).__name__}")
    if source.dtype != x.dtype:
        raise TypeError(f"{op}: source has dtype {source.dtype}, x has {x.dtype}; they must match")
    return source


def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """A copy of x with alpha * source added at ``index`` along ``dim`` (duplicates add up)."""
    return IndexPutAlong.apply(x, _index_arg("index_add", index), _src("index_add", x, source),
                               _dim("index_add", dim, x.ndim), "add", alpha, "index_add")


def index_copy(x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of x with source's slices written at ``index`` along ``dim``."""
    return IndexPutAlong.apply(x, _index_arg("index_copy", index), _src("index_copy", x, source),
                               _dim("index_copy", dim, x.ndim), "store", None, "index_copy")


def index_fill(x: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """A copy of x with ``value`` (a number or 0-d Tensor) at ``index`` along ``dim``."""
    if isinstance(value, Tensor):
        if value.ndim:
            raise ValueError(f"index_fill: value must be a number or a 0-d Tensor, got shape {list(value.shape)}")
        value = value.item()
    return IndexPutAlong.apply(x, _index_arg("index_fill", index), _value(value, "index_fill"),
                               _dim("index_fill", dim, x.ndim), "store", None, "index_fill")


def _mask(op: str, x: Tensor, mask) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{op}: mask must be a bool Tensor, got "
                        f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
    return mask


def masked_fill(x: Tensor, mask: Tensor, value) -> Tensor:
    """x with ``value`` where mask (broadcast to x's shape) is True; reuses the ``where`` kernel."""
    mask = _mask("masked_fill", x, mask)
    try:
        shape = torch.broadcast_shapes(tuple(mask.shape), tuple(x.shape))
    except RuntimeError:
        shape = None
    if shape != tuple(x.shape):
        raise ValueError(f"masked_fill: mask {shape_str(mask.shape)} cannot be broadcast to x {shape_str(x.shape)}")
    if isinstance(value, Tensor):
        if value.ndim:
            raise ValueError(f"masked_fill: value must be a number or a 0-d Tensor, got shape {list(value.shape)}")
        fill = M.to(value, dtype=x.dtype)
    else:
        fill = Tensor(torch.full((), _value(value, "masked_fill"), dtype=x.dtype, device=x.device))
    return M.where(mask, fill, x)


def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    """The elements of x (broadcast with mask) where mask is True, 1-D (one host sync for the count)."""
    mask = _mask("masked_select", x, mask)
    try:
        shape = torch.broadcast_shapes(tuple(mask.shape), tuple(x.shape))
    except RuntimeError:
        raise ValueError(f"masked_select: mask {shape_str(mask.shape)} and x {shape_str(x.shape)} do not "
                         "broadcast") from None
    xb = M.expand(x, shape) if tuple(x.shape) != shape else x
    if not shape:
        xb, mb = M.reshape(xb, 1), mask.data.reshape(1)
    else:
        mb = mask.data.expand(shape)
    return getitem(xb, Tensor(mb))


# ---------------------------------------------------------------------------------------------
# gather / scatter / take_along_dim
# ---------------------------------------------------------------------------------------------
def _long_index(op: str, index) -> torch.Tensor:
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}: index must be an int64 Tensor, got {type(index).__name__}")
    if index.dtype != torch.int64:
        raise TypeError(f"{op}: index must be int64, got {index.dtype}")
    return index.data


class Gather(Function):
    @staticmethod
    def forward(ctx, x, index, dim):
        ctx.shape, ctx.index, ctx.dim = tuple(x.shape), index, dim
        return call("gather", x, index, dim=dim)

    @staticmethod
    def backward(ctx, gy):
        zeros = torch.zeros(ctx.shape, dtype=gy.dtype, device=gy.device)
        return call("scatter", zeros, ctx.index, gy, dim=ctx.dim, reduce="add", op_name="gather"), None, None


def gather(x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """out[..i, j, k..] = x[..i, index[..i, j, k..], k..] along ``dim``: index's shape, x's dtype."""
    if sparse_grad:
        raise ValueError("gather: sparse_grad=True is not supported by ge2")
    return Gather.apply(x, _long_index("gather", index), _dim("gather", dim, x.ndim))


def _src_part(gsrc: torch.Tensor, src_shape, index_shape) -> torch.Tensor:
    """A gradient of index's shape placed into zeros of src's shape (src may be larger than index)."""
    if tuple(src_shape) == tuple(index_shape):
        return gsrc
    out = torch.zeros(src_shape, dtype=gsrc.dtype, device=gsrc.device)
    out[tuple(slice(0, s) for s in index_shape)] = gsrc
    return out


class Scatter(Function):
    """scatter / scatter_add / scatter_reduce (out of place), with torch's gradients for every reduce."""

    @staticmethod
    def forward(ctx, x, index, src, dim, reduce, include_self, op):
        out = call("scatter", x, index, src, dim=dim, reduce=reduce, include_self=include_self, op_name=op)
        ctx.index, ctx.dim, ctx.reduce, ctx.include_self = index, dim, reduce, include_self
        ctx.src_shape = tuple(src.shape) if isinstance(src, torch.Tensor) else None
        if ctx.reduce in ("amax", "amin", "prod") and True in ctx.needs_input_grad:
            ctx.value = None if isinstance(src, torch.Tensor) else src  # a number is not saved as a tensor
            ctx.save_for_backward(x, src if ctx.value is None else None, out)
        return out

    @staticmethod
    def backward(ctx, gy):
        index, dim, reduce = ctx.index, ctx.dim, ctx.reduce
        need_x, need_src = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        zeroed = None
        if reduce == "store" or not ctx.include_self:
            zeroed = call("scatter", gy, index, 0, dim=dim)  # positions written by src: no gradient to x
        gx = gsrc = None
        if reduce in ("store", "add", "sum"):
            gx = zeroed if zeroed is not None else gy
            if need_src:
                gsrc = call("gather", gy, index, dim=dim)
        elif reduce == "mean":
            base = torch.full(gy.shape, 1 if ctx.include_self else 0, dtype=gy.dtype, device=gy.device)
            count = call("scatter", base, index, 1, dim=dim, reduce="add")
            g = call("div", gy, count)
            gx = g if ctx.include_self else zeroed
            if need_src:
                gsrc = call("gather", g, index, dim=dim)
        elif reduce == "prod":
            x, src, out = ctx.saved_tensors
            gx, gsrc = _prod_backward(gy, x, src if src is not None else ctx.value, out, index, dim, ctx.include_self,
                                      zeroed, need_x, need_src)
        else:  # amax / amin: the gradient is shared evenly among the elements equal to the result
            x, src, out = ctx.saved_tensors
            src = src[tuple(slice(0, s) for s in index.shape)]
            hit_src = call("eq", src, call("gather", out, index, dim=dim))
            hit_x = call("eq", x, out) if ctx.include_self else torch.zeros(x.shape, dtype=torch.bool, device=x.device)
            count = call("scatter", hit_x.to(gy.dtype), index, hit_src.to(gy.dtype), dim=dim, reduce="add")
            g = call("div", gy, count)
            gx = call("where", hit_x, g, 0.0) if ctx.include_self else zeroed
            if need_src:
                gsrc = call("where", hit_src, call("gather", g, index, dim=dim), 0.0)
        if gsrc is not None:
            gsrc = _src_part(gsrc, ctx.src_shape, index.shape)
        return (gx if need_x else None), None, gsrc, None, None, None, None


def _prod_backward(gy, x, src, out, index, dim, include_self, zeroed, need_x, need_src):
    """Gradients of scatter_reduce(prod) by torch's rule: each factor gets gy times the product of the
    others, found without dividing by a zero. x: gy * (the result with x's zeros taken as 1) / (x with
    zeros as 1). src: gy * out / src where src != 0; where src is the only zero src of its group, gy *
    (the result with that zero taken as 1); where a group has two or more zero srcs, 0 (out is 0)."""
    if isinstance(src, torch.Tensor):  # (else a number: scatter(value=v, reduce="multiply"), no src gradient)
        src = src[tuple(slice(0, s) for s in index.shape)]
    gx = gsrc = None
    if need_x:
        if include_self:
            masked_x = call("where", call("eq", x, 0), 1.0, x)
            masked_out = call("scatter", masked_x, index, src, dim=dim, reduce="prod")
            gx = call("div", call("mul", gy, masked_out), masked_x)
        else:
            gx = zeroed  # x's positions that src reached were replaced, not multiplied
    if need_src:
        src_zero = call("eq", src, 0)
        zeros = torch.zeros(x.shape, dtype=gy.dtype, device=gy.device)
        n_zero = call("gather", call("scatter", zeros, index, src_zero.to(gy.dtype), dim=dim, reduce="add"), index,
                      dim=dim)
        single = call("logical_and", src_zero, call("eq", n_zero, 1))
        alone = call("scatter", x, index, call("where", single, 1.0, src), dim=dim, reduce="prod",
                     include_self=include_self)
        others = call("gather", call("mul", gy, alone), index, dim=dim)
        ratio = call("div", call("gather", call("mul", gy, out), index, dim=dim), call("where", src_zero, 1.0, src))
        gsrc = call("where", single, others, ratio)
    return gx, gsrc


def _scatter(op: str, x: Tensor, dim: int, index: Tensor, src, reduce: str, include_self: bool = True) -> Tensor:
    if isinstance(src, Tensor):
        if src.dtype != x.dtype:
            raise TypeError(f"{op}: src has dtype {src.dtype}, x has {x.dtype}; they must match")
    else:
        src = _value(src, op)
    return Scatter.apply(x, _long_index(op, index), src, _dim(op, dim, x.ndim), reduce, include_self, op)


_LEGACY_REDUCE = {None: "store", "add": "add", "multiply": "prod"}


def scatter(x: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """A copy of x with src (a Tensor, or ``value``/a number) written at ``index`` along ``dim``."""
    if (src is None) == (value is None):
        raise TypeError("scatter: pass exactly one of src and value")
    if reduce not in _LEGACY_REDUCE:
        raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    return _scatter("scatter", x, dim, index, src if src is not None else value, _LEGACY_REDUCE[reduce])


def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of x with src added at ``index`` along ``dim``: duplicates accumulate (atomics)."""
    return _scatter("scatter_add", x, dim, index, src, "add")


def scatter_reduce(x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """x with src reduced into it at ``index`` along ``dim``: reduce in sum, prod, mean, amax, amin."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise ValueError(f"scatter_reduce: reduce must be one of sum, prod, mean, amax, amin, got {reduce!r}")
    return _scatter("scatter_reduce", x, dim, index, src, reduce, include_self)


def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """Values of x at ``indices`` along ``dim`` (x and indices broadcast in the other dims); dim=None: flat."""
    if dim is None:
        return gather(M.reshape(x, -1), 0, M.reshape(indices, -1) if isinstance(indices, Tensor) else indices)
    if not isinstance(indices, Tensor) or indices.ndim != x.ndim:
        raise ValueError(f"take_along_dim: x {shape_str(x.shape)} and indices "
                         f"{shape_str(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__} "
                         "must have the same number of dims")
    d = _dim("take_along_dim", dim, x.ndim)
    others = [1 if i == d else s for i, s in enumerate(x.shape)]
    others_i = [1 if i == d else s for i, s in enumerate(indices.shape)]
    try:
        b = list(torch.broadcast_shapes(tuple(others), tuple(others_i)))
    except RuntimeError:
        raise ValueError(f"take_along_dim: x {shape_str(x.shape)} and indices {shape_str(indices.shape)} do not "
                         f"broadcast outside dim {d}") from None
    xs, is_ = list(b), list(b)
    if x.ndim:
        xs[d], is_[d] = x.shape[d], indices.shape[d]
    xb = M.expand(x, tuple(xs)) if tuple(xs) != tuple(x.shape) else x
    ib = Tensor(_long_index("take_along_dim", indices).expand(is_))
    return gather(xb, d, ib)


# ---------------------------------------------------------------------------------------------
# nonzero / one_hot (no gradient)
# ---------------------------------------------------------------------------------------------
def nonzero(x: Tensor, *, as_tuple: bool = False):
    """Coordinates of x's nonzero elements: [n, ndim] int64, or a tuple of ndim [n] (one host sync)."""
    out = call("nonzero", x.data, as_tuple=as_tuple)
    return tuple(Tensor(t) for t in out) if as_tuple else Tensor(out)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 [*tensor.shape, num_classes] with a 1 at each class (num_classes=-1: max + 1, a host sync)."""
    if not isinstance(tensor, Tensor) or tensor.dtype != torch.int64:
        raise TypeError("one_hot: tensor must be an int64 Tensor of class indices, got "
                        f"{tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__}")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise ValueError("one_hot: cannot infer num_classes from an empty tensor; pass num_classes")
        num_classes = int(call("amax", tensor.data).item()) + 1
    return Tensor(call("one_hot", tensor.data, num_classes=num_classes))


# ---------------------------------------------------------------------------------------------
# Tensor methods
# ---------------------------------------------------------------------------------------------
def _inplace_method(fn, name):
    def method(self, *args, **kwargs):
        return M.inplace(self, lambda: fn(self, *args, **kwargs), name)
    method.__name__ = name
    return method


def _install_methods() -> None:
    T = Tensor
    T.__getitem__ = getitem
    T.__setitem__ = setitem
    T.index_select, T.index_add, T.index_copy, T.index_fill = index_select, index_add, index_copy, index_fill
    T.masked_fill, T.masked_select, T.take_along_dim, T.gather = masked_fill, masked_select, take_along_dim, gather
    T.scatter, T.scatter_add, T.scatter_reduce = scatter, scatter_add, scatter_reduce
    T.index_put, T.index_put_, T.nonzero = index_put, index_put_, nonzero
    for name, fn in (("index_add_", index_add), ("index_copy_", index_copy), ("index_fill_", index_fill),
                     ("masked_fill_", masked_fill), ("scatter_", scatter), ("scatter_add_", scatter_add),
                     ("scatter_reduce_", scatter_reduce)):
        setattr(T, name, _inplace_method(fn, name))


_install_methods()
