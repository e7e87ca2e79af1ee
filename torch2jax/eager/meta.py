"""What torch says an op returns (dtypes, shapes), from its meta kernel, cached per signature.

Running the op on meta tensors first gives the `jax` device torch's own argument checks and
error messages (shape mismatches, in-place casts), and the result dtypes and shapes the
lowerings are held to: the same contract the interpreter gets from torch.export's fake tensors.
The answer depends only on shapes, dtypes and non-tensor arguments, so it is cached on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ir.graph import Node, TensorMeta
from .tensors import DEVICE, check_devices

_CACHE: dict[tuple, OutSpec] = {}
_CACHE_LIMIT = 50_000


@dataclass(frozen=True)
class OutSpec:
    """torch's result of an op: `outputs` mirrors its structure with (dtype, shape) per tensor."""

    outputs: Any  # (torch.dtype, tuple) | list of them | None when torch cannot say (data-dependent)
    node: Node


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in value.items())
    if isinstance(value, torch.Generator):
        return "generator"
    if isinstance(value, (bool, int, float, complex)):
        return (type(value), value)  # 1, 1.0 and True are equal keys but promote differently
    return value


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type != DEVICE:
            return value
        return torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, torch.device) and value.type == DEVICE:
        return torch.device("meta")
    if isinstance(value, str) and value.split(":")[0] == DEVICE:
        return "meta"
    if isinstance(value, torch.Generator):
        return None
    return value


def _scalar_in_tensor_slot(op: Any, args: tuple) -> bool:
    tensor_type = torch._C.TensorType.get()
    return any(a.type == tensor_type and isinstance(v, (int, float, bool))
               for a, v in zip(op._schema.arguments, args))


def _other_devices(value: Any, found: list) -> None:
    """Devices of tensors that cannot join a jax op (any but jax, and CPU scalars)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != DEVICE and not (value.dim() == 0 and value.device.type == "cpu"):
            found.append(value.device)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _other_devices(v, found)


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape))
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [_describe(v) for v in value]
    return None


def _node_meta(outputs: Any) -> Any:
    if isinstance(outputs, tuple) and len(outputs) == 2 and isinstance(outputs[0], torch.dtype):
        return TensorMeta(str(outputs[0]).removeprefix("torch."), list(outputs[1]))
    if isinstance(outputs, list):
        return [_node_meta(o) for o in outputs]
    return None


def out_spec(op: Any, args: tuple, kwargs: dict) -> OutSpec:
    """torch's answer for `op(*args, **kwargs)`; raises torch's own error for bad arguments."""
    try:
        key = (op, _signature(args), _signature(kwargs))
        hit = _CACHE.get(key)
    except TypeError:  # an unhashable argument: compute, do not cache
        key, hit = None, None
    if hit is not None:
        return hit
    outputs = _run_meta(op, args, kwargs)
    spec = OutSpec(outputs, Node(name=str(op), op=str(op), args=[], kwargs={}, meta=_node_meta(outputs)))
    if key is not None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = spec
    return spec


def _run_meta(op: Any, args: tuple, kwargs: dict) -> Any:
    from torch._subclasses.fake_tensor import DataDependentOutputException

    devices: list = []
    _other_devices(args, devices)
    _other_devices(list(kwargs.values()), devices)
    check_devices(devices)
    meta_args = _to_meta(args)
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    if _scalar_in_tensor_slot(op, args):
        op = op._overloadpacket  # torch passes `x % 2`'s 2 as a number; the packet takes it as torch would
    try:
        result = op(*meta_args, **meta_kwargs)
    except (DataDependentOutputException, NotImplementedError):
        return None  # the output's size depends on the values (nonzero, unique): the lowering decides
    except RuntimeError as err:
        if "data-dependent" in str(err) or "Meta" in str(err) and "backend" in str(err):
            return None
        raise
    return _describe(result)
