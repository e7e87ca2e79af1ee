"""Ops whose output size depends on the values: eager mode knows the values, so it knows the size.

torch's meta kernels cannot size `nonzero`, `unique`, `repeat_interleave` (without output_size) or
`bincount`; export refuses them. On the `jax` device the inputs are concrete, so the size is counted
here (numpy, on the host) and the registry's own lowering runs with it, exactly as it runs in an
exported graph whose size torch knew. The values are checked as torch's CPU kernel checks them, with
its messages, since a lowering cannot raise on data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..ir.graph import Node, TensorMeta
from . import storage
from .meta import OutSpec


def _spec(op: Any, outputs: Any) -> OutSpec:
    """An OutSpec for one output (dtype, shape) or a list of them, as meta.out_spec makes them."""
    def meta(dtype: torch.dtype, shape: tuple) -> TensorMeta:
        return TensorMeta(str(dtype).removeprefix("torch."), list(shape))

    metas = [meta(*o) for o in outputs] if isinstance(outputs, list) else meta(*outputs)
    return OutSpec(outputs, Node(name=str(op), op=str(op), args=[], kwargs={}, meta=metas))


def _values(tensor: torch.Tensor) -> np.ndarray:
    return np.asarray(storage.read(tensor))


def _nonzero(op: Any, x: torch.Tensor) -> OutSpec:
    return _spec(op, (torch.int64, (int(np.count_nonzero(_values(x))), x.dim())))


def _distinct_rows(rows: np.ndarray, sort: bool) -> int:
    if rows.shape[0] == 0:
        return 0
    if sort:
        rows = rows[np.lexsort(rows.T[::-1])] if rows.shape[1] else rows[:1]
    differs = np.any(rows[1:] != rows[:-1], axis=1)
    return 1 + int(np.count_nonzero(differs))


def _unique_spec(op: Any, x: torch.Tensor, dim: int | None, sort: bool, inverse: bool, counts: bool) -> OutSpec:
    values = _values(x)
    if dim is None:
        k = _distinct_rows(values.reshape(-1, 1), sort)
        value_shape, inverse_shape = (k,), tuple(x.shape)
    else:
        axis = dim % x.dim()
        if x.numel() == 0 and x.shape[axis] != 0:  # torch's CPU kernel's check
            raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
        moved = np.moveaxis(values, axis, 0)
        k = _distinct_rows(moved.reshape(moved.shape[0], int(np.prod(moved.shape[1:]))), sort)  # -1 is ambiguous at 0
        value_shape = tuple(k if i == axis else s for i, s in enumerate(x.shape))
        inverse_shape = (x.shape[axis],)
    return _spec(op, [
        (x.dtype, value_shape),
        (torch.int64, inverse_shape if inverse else (0,)),
        (torch.int64, (k,) if counts else (0,)),
    ])


_INDEX_DTYPES = (torch.int32, torch.int64)
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _repeat_interleave(op: Any, repeats: torch.Tensor, output_size: int | None) -> OutSpec:
    """repeat_interleave(repeats): index i repeats[i] times, sum(repeats) long (torch's CPU kernel's checks)."""
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in _INDEX_DTYPES:
        raise NotImplementedError(f"\"repeat_interleave_cpu\" not implemented for {repeats.dtype}: repeats has to be Long or Int tensor")
    if repeats.shape[0] == 0:  # torch returns an empty tensor, whatever output_size says
        return _spec(op, (repeats.dtype, (0,)))
    counts = _values(repeats).astype(np.int64)
    if (counts < 0).any():
        raise RuntimeError("repeats can not be negative")
    total = int(counts.sum())
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    return _spec(op, (repeats.dtype, (total,)))


def _bincount(op: Any, x: torch.Tensor, weights: torch.Tensor | None, minlength: int) -> OutSpec:
    """bincount: max(x) + 1 bins, at least minlength, with torch's CPU kernel's checks and dtypes."""
    if x.dtype not in _INTEGER_DTYPES:
        raise NotImplementedError(f'"bincount_cpu" not implemented for {x.dtype}')
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if x.dim() == 1 and x.shape[0] == 0:
        return _spec(op, (torch.int64, (minlength,)))
    values = _values(x) if x.dim() == 1 else None
    if values is None or int(values.min()) < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    dtype = torch.int64 if weights is None else torch.float32 if weights.dtype == torch.float32 else torch.float64
    return _spec(op, (dtype, (max(int(values.max()) + 1, minlength),)))


def spec_of(op: Any, args: tuple, kwargs: dict) -> OutSpec:
    """torch's output dtypes and shapes for a data-dependent op, counted from the values."""
    name = str(op)
    bound = op._schema.arguments
    values = {a.name: a.default_value for a in bound if a.has_default_value()}
    values.update(zip([a.name for a in bound], args))
    values.update(kwargs)
    if name == "aten.repeat_interleave.Tensor":
        return _repeat_interleave(op, values["repeats"], values["output_size"])
    x = values["self"]
    if name == "aten.bincount.default":
        return _bincount(op, x, values["weights"], values["minlength"])
    if name == "aten.nonzero.default":
        return _nonzero(op, x)
    if name == "aten._unique2.default":
        return _unique_spec(op, x, None, True, values["return_inverse"], values["return_counts"])
    if name == "aten.unique_dim.default":
        return _unique_spec(op, x, values["dim"], True, values["return_inverse"], values["return_counts"])
    return _unique_spec(op, x, values["dim"], False, values["return_inverse"], values["return_counts"])


OPS = ("aten.nonzero.default", "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
       "aten.repeat_interleave.Tensor", "aten.bincount.default")


def masked_select(op: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """x[mask] over their broadcast shape: boolean indexing, which the index lowering runs eagerly."""
    x, mask = args
    x, mask = torch.broadcast_tensors(x, mask)
    return x[mask]
