"""Ops whose output size depends on the values: eager mode knows the values, so it knows the size.

torch's meta kernels cannot size `nonzero` or `unique`; export refuses them. On the `jax` device
the inputs are concrete, so the size is counted here (numpy, on the host) and the registry's own
lowering runs with it, exactly as it runs in an exported graph whose size torch knew.
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
        moved = np.moveaxis(values, axis, 0)
        k = _distinct_rows(moved.reshape(moved.shape[0], -1), sort)
        value_shape = tuple(k if i == axis else s for i, s in enumerate(x.shape))
        inverse_shape = (x.shape[axis],)
    return _spec(op, [
        (x.dtype, value_shape),
        (torch.int64, inverse_shape if inverse else (0,)),
        (torch.int64, (k,) if counts else (0,)),
    ])


def spec_of(op: Any, args: tuple, kwargs: dict) -> OutSpec:
    """torch's output dtypes and shapes for a data-dependent op, counted from the values."""
    name = str(op)
    bound = op._schema.arguments
    values = {a.name: a.default_value for a in bound if a.has_default_value()}
    values.update(zip([a.name for a in bound], args))
    values.update(kwargs)
    x = values["self"]
    if name == "aten.nonzero.default":
        return _nonzero(op, x)
    if name == "aten._unique2.default":
        return _unique_spec(op, x, None, True, values["return_inverse"], values["return_counts"])
    if name == "aten.unique_dim.default":
        return _unique_spec(op, x, values["dim"], True, values["return_inverse"], values["return_counts"])
    return _unique_spec(op, x, values["dim"], False, values["return_inverse"], values["return_counts"])


OPS = ("aten.nonzero.default", "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default")


def masked_select(op: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """x[mask] over their broadcast shape: boolean indexing, which the index lowering runs eagerly."""
    x, mask = args
    x, mask = torch.broadcast_tensors(x, mask)
    return x[mask]
