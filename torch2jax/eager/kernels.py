"""The `jax` device's kernels: each ATen op runs its registered JAX lowering.

Registered for the PrivateUse1 dispatch key, below Autograd, so torch's autograd formulas,
torch.optim and every composite op run unchanged and call these kernels. Every op is planned
once, on first use:

- a view (`view`, `as_strided`, `unfold`, ...): torch's meta kernel makes the tensor, which
  keeps the device and shares the base's storage, so views alias as on CPU (storage.py);
- an op with a lowering: run the lowering on the arguments as JAX arrays;
- an in-place (`add_`) or out= (`add.out`) variant: run the functional op's lowering and write
  the result into `self` / `out`, through whatever view it is;
- otherwise torch's decomposition, whose ops come back here;
- otherwise an error naming the op and the way to add it.

Before a lowering runs, torch's meta kernel checks the arguments and gives the result dtypes
and shapes (meta.py): the lowering's result is cast to torch's dtype, as the interpreter does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..capture.torch_arrays import to_jax, to_torch
from ..errors import LoweringError
from ..lowering.interpreter import LoweringContext
from ..ops import Lowering, lookup, registered
from . import compiled_lowerings, data_dependent, rng, storage
from .meta import OutSpec, out_spec
from .tensors import as_array, check_devices, empty, first_dtype, is_jax, scalar_array, scalar_dtype, to_jax_args, wrap

aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_PLANS: dict[Any, Callable] = {}

Plan = Callable[[Any, tuple, dict], Any]


class UnsupportedOnJaxDevice(NotImplementedError):
    """An op with neither a JAX lowering nor a torch decomposition."""


def fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 kernel of every ATen op: its plan, made on first use."""
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = make_plan(op)
    with jax.enable_x64(True):
        return plan(op, args, kwargs)


def kernel_for(op: Any) -> Callable:
    """A kernel for one overload, registered directly (no fallback lookup, no composite detour).
    Its plan is made on first use, so a lowering registered before then takes effect."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return fallback(op, *args, **kwargs)

    return kernel


def directly_registered_ops() -> list:
    """The registry's ATen overloads that get their own PrivateUse1 kernel.

    Left to the fallback: views (torch's composite makes them, aliasing storage) and ops torch
    implements for every backend above the backend key (CompositeImplicitAutograd: registering a
    backend kernel would drop their autograd; CompositeExplicitAutograd: they take tensors of
    other devices, as `_to_copy` does). A CompositeExplicitAutogradNonFunctional op (`add.Tensor`,
    which torch would run as `empty` + `add.out`) gets its lowering directly.
    """
    ops = []
    for name in registered():
        namespace, _, rest = name.partition(".")
        packet_name, _, overload = rest.partition(".")
        if namespace != "aten" or name in _SPECIAL:
            continue
        op = getattr(getattr(aten, packet_name, None), overload, None)
        if op is None or _is_view(op):
            continue
        qualified = op.name()
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
               for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")):
            continue
        ops.append(op)
    return ops


def make_plan(op: Any) -> Plan:
    name = str(op)
    if name in _SPECIAL:
        return _SPECIAL[name]
    if _is_view(op):
        return _view
    lowering = lookup(name)
    if lowering is not None:
        return _functional(lowering, data_dependent.spec_of if name in data_dependent.OPS else out_spec)
    schema = op._schema
    out_args = [a.name for a in schema.arguments if a.is_out]
    if out_args:
        functional = _functional_variant(op, out_args)
        if functional is not None:
            return _out_variant(functional, out_args)
    elif schema.arguments and _writes(schema.arguments[0]) and op._overloadpacket.__name__.endswith("_"):
        functional = _functional_variant(op, [])
        if functional is not None:
            return _in_place(functional)
    decomposition = torch._decomp.decomposition_table.get(op)
    if decomposition is not None:
        return _decomposed(decomposition)
    return _unsupported


def _writes(argument: Any) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _is_view(op: Any) -> bool:
    returns = op._schema.returns
    return (
        bool(returns)
        and returns[0].alias_info is not None
        and not returns[0].alias_info.is_write
        and not any(_writes(a) for a in op._schema.arguments)
    )


def _functional_variant(op: Any, out_args: list[str]) -> Any:
    """The overload computing what `op` writes: same arguments, no out=, no trailing underscore."""
    packet = op._overloadpacket.__name__
    names = [(a.name, str(a.type)) for a in op._schema.arguments if a.name not in out_args]
    candidates = [packet.rstrip("_")] + ([packet.rstrip("_") + "_functional"] if packet.endswith("_") else [])
    for candidate in candidates:
        functional_packet = getattr(aten, candidate, None)
        if functional_packet is None:
            continue
        for overload in functional_packet.overloads():
            functional = getattr(functional_packet, overload)
            schema = functional._schema
            if any(a.is_out or _writes(a) for a in schema.arguments):
                continue
            own = [(a.name, str(a.type)) for a in schema.arguments]
            extra = schema.arguments[len(names):]  # a factory's dtype/layout/device/pin_memory
            if own[: len(names)] == names and all(a.kwarg_only and a.has_default_value() for a in extra):
                if lookup(str(functional)) is not None or functional in torch._decomp.decomposition_table:
                    return functional
    return None


# Plans -------------------------------------------------------------------------------------------


def _view(op: Any, args: tuple, kwargs: dict) -> Any:
    return op.redispatch(_META, *args, **kwargs)


def _compute(op: Any, args: tuple, kwargs: dict) -> tuple[Any, OutSpec]:
    """(the op's raw JAX result, torch's OutSpec) for a functional op with a lowering or a decomposition."""
    spec = out_spec(op, args, kwargs)
    lowering = lookup(str(op))
    if lowering is None:  # a decomposition: run it on jax tensors, its ops come back here
        result = torch._decomp.decomposition_table[op](*args, **kwargs)
        return _arrays(result), spec
    return _lower(lowering, spec, _scalars_as_arrays(op, args), kwargs), spec


_TENSOR_SLOTS: dict[Any, tuple] = {}


def _scalars_as_arrays(op: Any, args: tuple) -> tuple:
    """A python number where the schema has a Tensor (torch passes `x * 2`'s 2 so) becomes a
    cached device scalar of the tensor's dtype, as torch's promotion would make it."""
    slots = _TENSOR_SLOTS.get(op)
    if slots is None:
        tensor_type = torch._C.TensorType.get()
        slots = _TENSOR_SLOTS[op] = tuple(i for i, a in enumerate(op._schema.arguments) if a.type == tensor_type)
    if not any(isinstance(args[i], (int, float, bool)) for i in slots if i < len(args)):
        return args
    like = first_dtype(args)
    return tuple(
        scalar_array(value, scalar_dtype(np.dtype(type(value)), like))
        if i in slots and isinstance(value, (int, float, bool)) else value
        for i, value in enumerate(args)
    )


def _lower(lowering: Lowering, spec: OutSpec, args: tuple, kwargs: dict) -> Any:
    devices: list = []
    like = first_dtype(args)
    jax_args = to_jax_args(args, devices, like)
    jax_kwargs = {k: to_jax_args(v, devices, like) for k, v in kwargs.items()}
    check_devices(devices)
    try:
        if lowering.ctx:
            key, index = rng.next_key()
            return lowering.fn(LoweringContext(spec.node, {}, key, index), *jax_args, **jax_kwargs)
        return compiled_lowerings.run(lowering, jax_args, jax_kwargs)
    except Exception as err:  # torch's meta kernel accepted the arguments: a lowering's limit or bug
        raise LoweringError(f"the JAX lowering of {lowering.op} failed on the jax device: {type(err).__name__}: {err}") from err


def _functional(lowering: Lowering, spec_of: Callable[[Any, tuple, dict], OutSpec]) -> Plan:
    def run(op: Any, args: tuple, kwargs: dict) -> Any:
        spec = spec_of(op, args, kwargs)
        return _to_tensors(_lower(lowering, spec, _scalars_as_arrays(op, args), kwargs), spec.outputs)

    return run


def _in_place(functional: Any) -> Plan:
    def run(op: Any, args: tuple, kwargs: dict) -> Any:
        out_spec(op, args, kwargs)  # torch's checks: shapes, whether the result casts to self's dtype
        self = args[0]
        result, _ = _compute(functional, args, kwargs)
        _store(self, result)
        return self

    return run


def _out_variant(functional: Any, out_args: list[str]) -> Plan:
    def run(op: Any, args: tuple, kwargs: dict) -> Any:
        outs = [kwargs[name] for name in out_args]
        plain = {k: v for k, v in kwargs.items() if k not in out_args}
        result, spec = _compute(functional, args, plain)
        results = [result] if len(outs) == 1 else list(result)
        for out, value in zip(outs, results):
            shape = tuple(jnp.shape(value))
            if tuple(out.shape) != shape:
                out.resize_(shape)
            _store(out, value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def _decomposed(decomposition: Callable) -> Plan:
    def run(op: Any, args: tuple, kwargs: dict) -> Any:
        return decomposition(*args, **kwargs)

    return run


def _unsupported(op: Any, args: tuple, kwargs: dict) -> Any:
    name = op._schema.name + ("." + op._schema.overload_name if op._schema.overload_name else "")
    raise UnsupportedOnJaxDevice(
        f"{name} has no JAX lowering and no torch decomposition, so it cannot run on the jax device.\n"
        f"  schema: {op._schema}\n"
        f"Register one with @torch2jax.register_lowering({name!r}) (see docs/api.md), "
        "or move the tensors to the CPU for this op."
    )


# Results ------------------------------------------------------------------------------------------


def _arrays(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return storage.read(result) if is_jax(result) else to_jax(result)
    if isinstance(result, (list, tuple)):
        return [_arrays(r) for r in result]
    return result


def _to_tensors(result: Any, outputs: Any) -> Any:
    """Wrap a lowering's result as jax tensors with torch's dtypes (outputs=None: as they come)."""
    if isinstance(outputs, tuple) and len(outputs) == 2 and isinstance(outputs[0], torch.dtype):
        dtype, shape = outputs
        array = as_array(result)
        if array.shape != shape:
            array = jnp.broadcast_to(array, shape)
        return wrap(array, dtype)
    if isinstance(outputs, list):
        return tuple(_to_tensors(r, o) for r, o in zip(result, outputs))
    if isinstance(result, (list, tuple)):
        return tuple(_to_tensors(r, None) for r in result)
    if result is None or isinstance(result, (int, float, bool, complex)):
        return result
    return wrap(result)


def _store(target: torch.Tensor, value: Any) -> None:
    """Write `value` into `target`'s elements: broadcast to its shape, cast to its dtype."""
    array = as_array(value)
    want = storage.numpy_dtype(target.dtype)
    shape = tuple(target.shape)
    if array.shape != shape:
        array = jnp.broadcast_to(array, shape)
    if array.dtype != want:
        array = array.astype(want)
    storage.write(target, array)


# Ops with their own kernels --------------------------------------------------------------------------


def _empty(op: Any, args: tuple, kwargs: dict) -> Any:
    size = tuple(args[0])
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    tensor = empty(size, dtype)
    if op is aten.empty_strided.default:
        stride = tuple(args[1])
        if stride != tensor.stride():
            numel = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
            tensor = empty((numel,), dtype).as_strided(size, stride)
    return tensor


def _zero(op: Any, args: tuple, kwargs: dict) -> Any:
    """zero_: torch's decomposition (zeros_like) comes back to zero_ itself on a new device."""
    _store(args[0], jnp.zeros((), storage.numpy_dtype(args[0].dtype)))
    return args[0]


def _local_scalar_dense(op: Any, args: tuple, kwargs: dict) -> Any:
    array = storage.read(args[0])
    if isinstance(array, jax.core.Tracer):
        raise RuntimeError(
            "a tensor's value was read in Python (.item(), bool(tensor), an `if` on a tensor) inside "
            "te.jit / te.jit_train_step, where values are not known while JAX traces the program: "
            "keep that code outside the compiled function, or write it with tensor ops (torch.where)"
        )
    return array.item()


def copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """copy_ between any two devices, at least one of them `jax`."""
    if is_jax(dst):
        value = storage.read(src) if is_jax(src) else to_jax(src)
        with jax.enable_x64(True):
            _store(dst, value)
        return dst
    dst.copy_(to_torch(storage.read(src)))
    return dst


def _copy_plan(op: Any, args: tuple, kwargs: dict) -> Any:
    return copy(args[0], args[1])


def _copy_from(op: Any, args: tuple, kwargs: dict) -> Any:
    src, dst = args[0], args[1]
    if op is aten._copy_from_and_resize.default and tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return copy(dst, src)


def _resize(op: Any, args: tuple, kwargs: dict) -> Any:
    tensor, size = args[0], tuple(args[1])
    holder = storage.storage_of(tensor)
    strides = storage.contiguous_strides(size)
    aten.set_.source_Storage_storage_offset.redispatch(_META, tensor, tensor.untyped_storage(), tensor.storage_offset(), size, strides)
    needed = tensor.storage_offset() + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride())) + 1
    if all(tensor.shape) and needed > holder.numel:
        old = None if holder.array is None else holder.array.reshape(-1)
        holder.numel = needed
        if old is not None:
            holder.array = jnp.concatenate([old, jnp.zeros((needed - old.shape[0],), holder.dtype)])
    return tensor


def _index_put_impl(op: Any, args: tuple, kwargs: dict) -> Any:
    """_index_put_impl_ (what `x[idx] = v` and index_put_ call): index_put's lowering, written back."""
    values = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}
    values.update(zip([a.name for a in op._schema.arguments], args), **kwargs)
    self = values["self"]
    result, _ = _compute(aten.index_put.default, (self, values["indices"], values["values"], values["accumulate"]), {})
    _store(self, result)
    return self


def _equal(op: Any, args: tuple, kwargs: dict) -> bool:
    a, b = args
    if tuple(a.shape) != tuple(b.shape):
        return False
    devices: list = []
    x, y = to_jax_args((a, b), devices)
    check_devices(devices)
    return bool(jnp.array_equal(x, y))


def _cumulative_helper(op: Any, args: tuple, kwargs: dict) -> None:
    """_cummax_helper / _cummin_helper(self, values, indices, dim): cummax's lowering, written to both."""
    self, values, indices, dim = args
    functional = aten.cummax.default if "cummax" in str(op) else aten.cummin.default
    result, _ = _compute(functional, (self, dim), {})
    _store(values, result[0])
    _store(indices, result[1])


def _batch_norm_updating_stats(op: Any, args: tuple, kwargs: dict) -> Any:
    """_native_batch_norm_legit (training, running stats updated in place): the functional variant's
    lowering, its new running statistics written into the running_mean / running_var tensors."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = args
    result, spec = _compute(aten._native_batch_norm_legit_functional.default, args, kwargs)
    out, mean, rstd, new_mean, new_var = result
    _store(running_mean, new_mean)
    _store(running_var, new_var)
    outputs = out_spec(op, args, kwargs).outputs
    return _to_tensors((out, mean, rstd), outputs)


def _set_storage(op: Any, args: tuple, kwargs: dict) -> Any:
    """set_(storage, offset, size, stride): torch's meta kernel puts the storage (and the holder
    it carries) under the tensor, with the given geometry."""
    return op.redispatch(_META, *args, **kwargs)


def _convolution(op: Any, args: tuple, kwargs: dict) -> Any:
    """convolution_overrideable, where torch sends a convolution on a device it does not know."""
    return _run_as(aten.convolution.default, args, kwargs)


def _convolution_backward(op: Any, args: tuple, kwargs: dict) -> Any:
    grad, x, weight, *rest = args
    output_mask = rest[-1]
    bias_sizes = [grad.shape[1]] if output_mask[2] else None
    return _run_as(aten.convolution_backward.default, (grad, x, weight, bias_sizes, *rest), kwargs)


def _run_as(op: Any, args: tuple, kwargs: dict) -> Any:
    lowering = lookup(str(op))
    spec = out_spec(op, args, kwargs)
    return _to_tensors(_lower(lowering, spec, _scalars_as_arrays(op, args), kwargs), spec.outputs)


_SPECIAL: dict[str, Plan] = {
    "aten.convolution_overrideable.default": _convolution,
    "aten.convolution_backward_overrideable.default": _convolution_backward,
    "aten.empty.memory_format": _empty,
    "aten.empty_strided.default": _empty,
    "aten._local_scalar_dense.default": _local_scalar_dense,
    "aten._copy_from.default": _copy_from,
    "aten._copy_from_and_resize.default": _copy_from,
    "aten.copy_.default": _copy_plan,
    "aten.resize_.default": _resize,
    "aten.zero_.default": _zero,
    "aten.set_.source_Storage_storage_offset": _set_storage,
    "aten.set_.source_Storage": _set_storage,
    "aten.equal.default": _equal,
    "aten._cummax_helper.default": _cumulative_helper,
    "aten._cummin_helper.default": _cumulative_helper,
    "aten._native_batch_norm_legit.default": _batch_norm_updating_stats,
    "aten._index_put_impl_.default": _index_put_impl,
    "aten.masked_select.default": data_dependent.masked_select,
}

# Ops torch implements for every backend (CompositeExplicitAutograd) in a way that needs real
# memory; the jax device registers its own kernel for them.
OWN_KERNELS = ("copy_", "convolution_overrideable", "convolution_backward_overrideable")
