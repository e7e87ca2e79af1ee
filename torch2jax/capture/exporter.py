"""Stage 1 (convert half): torch.export + run_decompositions, with torch's errors made readable.

Dynamic dims are accepted in torch's own form (`torch.export.Dim`) or a plain one without torch
objects: `{"x": {0: "batch"}}` (a name, or `{"name": "batch", "min": 1, "max": 64}`). Dims that
share a name are the same dim.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..errors import ExportError, InputSpecError
from . import example_path, node_decompose, trace_forwards
from . import specialize as specialize_inputs

# Ops torch2jax lowers better whole than decomposed (design: keep high-level ops whole).
KEEP_WHOLE = (
    "aten.scaled_dot_product_attention.default",
)


def export(module: torch.nn.Module, args: tuple, kwargs: dict | None, dynamic_shapes: Any, strict: bool = False,
           specialize: list[str] | None = None, fix_automatically: bool = True) -> Exported:
    """torch.export the module (before decomposition), with the symbol names and the inputs fixed on the way.

    `specialize` names tensor inputs to fix to their example values (specialize.py); when torch.export stops at a
    data-dependent guard, the side-data inputs it may come from are fixed too, one at a time, while that moves it
    (unless `fix_automatically` is False: a single op's test, where a fixed index would change what is tested)."""
    kwargs = dict(kwargs or {})
    args = tuple(args)
    dims = normalize_dynamic_shapes(dynamic_shapes)
    fixed = specialize_inputs.by_name(module, args, kwargs, list(specialize or []))
    followed: list[bool] = []
    try:
        if fix_automatically:
            ep = _export_fixing(module, args, kwargs, dims, strict, fixed, followed)
        else:
            ep = _export_once(module, args, kwargs, dims, strict, fixed)
    except Exception as err:  # torch's own reason is the useful part
        raise ExportError(_export_failure_message(err, fixed)) from err
    return Exported(ep, symbol_names(ep, module, args, kwargs, dims), fixed, bool(followed))


class Exported(NamedTuple):
    program: torch.export.ExportedProgram
    names: dict[str, str]  # torch's symbols -> the user's dim names
    fixed: list  # specialize.FixedInput: inputs the graph is fixed to
    followed_example: bool = False  # data-dependent guards took the example's side (example_path.py)


def _export_fixing(module, args: tuple, kwargs: dict, dims: Any, strict: bool, fixed: list, followed: list):
    """_export_once; on a data-dependent guard, again with each automatic candidate fixed in turn, keeping (in
    `fixed`) those that move the guard, until the export succeeds or no candidate is left; then once more along the
    example inputs' side of every such guard (example_path.py; `followed` gets True), the first guard's error if
    even that fails."""
    try:
        return _export_once(module, args, kwargs, dims, strict, fixed)
    except Exception as err:
        guard = specialize_inputs.data_dependent_guard(err)
        if guard is None:
            raise
        failure = err
    buffers = specialize_inputs.constant_buffers(module)
    if buffers:  # the guard may read a constant the module keeps as a buffer (a conv's stride): traced as constants
        try:
            return _export_once(module, args, kwargs, dims, strict, fixed, buffers=buffers)
        except Exception as err:
            moved = specialize_inputs.data_dependent_guard(err)
            if moved is not None and moved != guard:
                guard, failure = moved, err
            else:  # no further, or a buffer written in forward (state, not a constant): traced as inputs again
                buffers = []
    taken = {f.name for f in fixed}
    for candidate in specialize_inputs.candidates(module, args, kwargs, _dynamic_inputs(module, args, kwargs, dims)):
        if candidate.name in taken:
            continue
        try:
            ep = _export_once(module, args, kwargs, dims, strict, [*fixed, candidate], buffers=buffers)
        except Exception as err:
            moved = specialize_inputs.data_dependent_guard(err)
            if moved is None:
                raise
            if moved != guard:  # the candidate's values were what torch stopped at: keep it fixed
                fixed.append(candidate)
                guard, failure = moved, err
            continue
        fixed.append(candidate)
        return ep
    if dims is not None:  # a graph for every size of a dynamic dim: no one example's path (example_path.py)
        raise failure
    try:  # the guard reads values no input fixes: along the example's side of it, checked at run time
        with example_path.following_example():
            ep = _export_once(module, args, kwargs, dims, strict, fixed, deferred=True, buffers=buffers)
        followed.append(True)
        return ep
    except Exception:  # noqa: BLE001 - the first guard, at the model's line, is the one to report
        pass
    raise failure


def _export_once(module, args: tuple, kwargs: dict, dims: Any, strict: bool, fixed: list, deferred: bool = False,
                 buffers: list | None = None):
    """torch.export once. torch prints the partial graph of a failed export to stderr; that is dropped (the error
    says where the model stopped), whatever else is written there is passed on. `deferred`: torch's
    prefer_deferred_runtime_asserts_over_guards, which the example path needs where a selection's count is read
    again (torch otherwise loses track of it: PendingUnbackedSymbolNotFound). `buffers`: constant buffers traced
    as constants (specialize.ConstantBuffer)."""
    plain = module.register_forward_hook(lambda _module, _args, output: plain_containers(output))
    written = io.StringIO()
    partial = ""
    try:
        with warnings.catch_warnings(), specialize_inputs.fixed_while_tracing(module, fixed, buffers), \
                trace_forwards.installed(module), _distribution_checks_off(), contextlib.redirect_stderr(written):
            warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations, not the user's concern
            return torch.export.export(module, args, kwargs, dynamic_shapes=dims, strict=strict,
                                       **({"prefer_deferred_runtime_asserts_over_guards": True} if deferred else {}))
    except Exception as err:
        partial = str(getattr(err, "partial_fx_graph", "") or "")
        raise
    finally:
        plain.remove()
        text = written.getvalue()
        sys.stderr.write(text.replace(partial + "\n", "") if partial else text)


@contextlib.contextmanager
def _distribution_checks_off():
    """torch.distributions checks its arguments' values when built (Categorical(logits=...) in BLT's patcher) and
    raises on invalid ones: a branch on data, where torch.export stops. A converted function cannot raise on data
    (docs/limitations.md), so the checks are off while tracing; valid inputs give the same graph."""
    from torch.distributions import Distribution

    default = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(default)


def _dynamic_inputs(module, args: tuple, kwargs: dict, dims: Any) -> set[str]:
    """Names of the top-level inputs with a dynamic dim declared (never fixed automatically)."""
    if dims is None:
        return set()
    names = [name for name, _position, _value in specialize_inputs.named_inputs(module, args, kwargs)]
    if isinstance(dims, dict):
        return {name for name in names if dims.get(name) is not None}
    return {name for name, spec in zip(names, dims) if spec is not None}


def plain_containers(value: Any) -> Any:
    """`value` with dict subclasses (transformers' ModelOutput) made plain dicts, keys in the same order, and KV caches
    plain tensors (`_cache_as_dict`).

    A ModelOutput flattens in the order its fields were set but is rebuilt in its class's field order, so
    run_decompositions, which retraces through a rebuild, can reorder the graph's outputs while keeping the
    first out_spec (an image model's `hidden_states` and `pooler_output` swapped). Plain dicts keep their order;
    the artifact describes model outputs as dicts anyway."""
    if isinstance(value, dict):
        return {key: plain_containers(item) for key, item in value.items()}
    if type(value) in (tuple, list):
        return type(value)(plain_containers(item) for item in value)
    return _cache_as_dict(value)


def _cache_as_dict(value: Any) -> Any:
    """A transformers KV cache returned as an output (a base model called with use_cache=True) as plain tensors:
    {"keys": [per layer], "values": [per layer]}, an encoder-decoder's as {"self_attention": ..., "cross_attention": ...};
    torch.export refuses the cache object itself as an output. Anything else is returned as it is."""
    kind = type(value).__name__
    if not kind.endswith("Cache"):
        return value
    if hasattr(value, "self_attention_cache") and hasattr(value, "cross_attention_cache"):
        return {"self_attention": _cache_as_dict(value.self_attention_cache),
                "cross_attention": _cache_as_dict(value.cross_attention_cache)}
    layers = getattr(value, "layers", None)
    if not isinstance(layers, (list, tuple)) or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        return value
    filled = [layer for layer in layers if isinstance(layer.keys, torch.Tensor) and isinstance(layer.values, torch.Tensor)]
    return {"keys": [layer.keys for layer in filled], "values": [layer.values for layer in filled]}


def decompose(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Decompose to the core ATen opset, keeping KEEP_WHOLE ops as they are: node by node where the program
    allows it (node_decompose.py), else by torch's retrace of the whole program."""
    try:
        with warnings.catch_warnings(), _cia_ops_remembered():
            warnings.simplefilter("ignore", FutureWarning)
            table = decompositions()
            try:
                by_node = node_decompose.decompose_nodes(ep, table, _decomposed_by_retrace(table))
            except Exception:  # noqa: BLE001 - torch internals it leans on moved: the retrace is the reference
                by_node = None
            return by_node if by_node is not None else ep.run_decompositions(table)
    except Exception as err:
        raise ExportError(f"torch could not decompose the exported program to core ATen: {_first_paragraph(err)}") from err


def _decomposed_by_retrace(table) -> Callable[[Any], bool]:
    """Which ops run_decompositions(table) replaces: those in the table, the CompositeImplicitAutograd ops torch
    does not offer to keep (reshape, dropout, to, ...), which decompose whenever they are traced, and those with a
    python kernel at autograd (native_batch_norm, the upsamplings), which the retrace's python dispatcher runs."""
    from torch._C import DispatchKey
    from torch.export import decomp_utils

    keepable = decomp_utils._collect_all_valid_cia_ops()  # remembered inside _cia_ops_remembered
    python_kernels = {DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd}

    def decomposed(op: Any) -> bool:
        if op in table:
            return True
        return isinstance(op, torch._ops.OpOverload) and op not in keepable and (
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
            or not python_kernels.isdisjoint(op.py_kernels))

    return decomposed


_CIA_MODULES = ("torch.export.exported_program", "torch.export.decomp_utils")
_cia_memo: dict[str, Any] = {}


@contextlib.contextmanager
def _cia_ops_remembered():
    """torch lists every CompositeImplicitAutograd op afresh each time it builds a decomposition table or decomposes
    (for each op namespace it walks all of the dispatcher's registrations again): a third of a small model's
    decomposition. While this is open the list is kept, and made again when the namespaces or the number of
    CompositeImplicitAutograd registrations change (a custom op registered since)."""
    import importlib

    from torch._export import utils as export_utils

    modules = [importlib.import_module(name) for name in _CIA_MODULES]
    if not all(hasattr(module, "_collect_all_valid_cia_ops") for module in modules):  # another torch: leave it be
        yield
        return
    collect = export_utils._collect_all_valid_cia_ops

    def state() -> tuple:
        return tuple(torch.ops._dir), len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))

    def remembered() -> set:
        if _cia_memo.get("key") != state():
            _cia_memo["ops"] = frozenset(collect())
            _cia_memo["key"] = state()  # after: listing the ops makes torch.ops load their namespaces
        return set(_cia_memo["ops"])

    previous = [module._collect_all_valid_cia_ops for module in modules]  # ours again when nested
    for module in modules:
        module._collect_all_valid_cia_ops = remembered
    try:
        yield
    finally:
        for module, before in zip(modules, previous):
            module._collect_all_valid_cia_ops = before


def subclass_param_names(ep: torch.export.ExportedProgram) -> dict[str, str]:
    """Readable names for the inner tensors of tensor-subclass params (torchao's quantized weights): decomposition
    unwraps `lin.weight` into `lin.parametrizations.weight.original0..N`; these become `lin.weight.qdata`,
    `lin.weight.scale`, ... after the subclass's own `__tensor_flatten__` attribute names."""
    renames = {}
    for name, value in ep.state_dict.items():
        flatten = getattr(value, "__tensor_flatten__", None)
        if flatten is None or type(value) in (torch.Tensor, torch.nn.Parameter):
            continue
        inner = flatten()[0]
        if any(hasattr(getattr(value, attr), "__tensor_flatten__") and type(getattr(value, attr)) is not torch.Tensor
               for attr in inner):
            continue  # nested subclasses flatten further; torch's numbering is kept for them
        prefix, _, leaf = name.rpartition(".")
        base = f"{prefix}.parametrizations.{leaf}" if prefix else f"parametrizations.{leaf}"
        renames.update({f"{base}.original{i}": f"{name}.{attr}" for i, attr in enumerate(inner)})
    return renames


def decompositions():
    """torch's core ATen decomposition table less KEEP_WHOLE: what export and the compile backend decompose."""
    with _cia_ops_remembered():
        table = torch.export.default_decompositions()
    for name in KEEP_WHOLE:
        namespace, op, overload = name.split(".")
        table.pop(getattr(getattr(getattr(torch.ops, namespace), op), overload), None)
    return table


def normalize_dynamic_shapes(spec: Any) -> Any:
    """Plain names -> torch.export.Dim (one Dim per distinct name); torch Dims pass through."""
    if spec is None:
        return None
    made: dict[str, Any] = {}

    def make(entry: Any) -> Any:
        if isinstance(entry, str):
            return dim(entry, None, None)
        if isinstance(entry, dict) and "name" in entry:
            return dim(entry["name"], entry.get("min"), entry.get("max"))
        return entry

    def dim(name: str, lo: int | None, hi: int | None) -> Any:
        if not isinstance(name, str) or not name.isidentifier():
            raise InputSpecError(f"dynamic dim name {name!r} must be an identifier such as 'batch'")
        if name not in made:
            options = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
            if hi is not None and (hi <= 1 or (lo is not None and hi <= lo)):
                raise InputSpecError(
                    f"dynamic dim {name!r} has range [{lo}, {hi}], which leaves it no room to vary: "
                    "make it static (drop it from dynamic_shapes) or widen the range"
                )
            made[name] = torch.export.Dim(name, **options)
        return made[name]

    def walk(node: Any) -> Any:
        if isinstance(node, dict) and node and all(isinstance(k, int) for k in node):
            return {k: make(v) for k, v in node.items()}
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [walk(v) if isinstance(v, (dict, list, tuple)) else make(v) for v in node]
            return type(node)(items)
        return make(node)

    return walk(spec)


def symbol_names(ep, module, args: tuple, kwargs: dict, dims: Any) -> dict[str, str]:
    """Map torch's symbols (s0, s77) to the user's dim names by walking inputs and specs together."""
    if dims is None:
        return {}
    per_leaf = _flat_dim_specs(module, args, kwargs, dims)
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    names: dict[str, str] = {}
    for input_name, spec in zip(user_inputs, per_leaf):
        val = placeholders[input_name].meta.get("val")
        if spec is None or not isinstance(val, torch.Tensor):
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, d in items:
            if d is None or not hasattr(d, "__name__"):
                continue
            size = val.shape[axis]
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                names.setdefault(str(size.node.expr), d.__name__)
    return names


def _flat_dim_specs(module, args: tuple, kwargs: dict, dims: Any) -> list:
    """One dim spec (or None) per tensor leaf, in torch's flattening order of (args, kwargs)."""
    if isinstance(dims, dict):
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
        except TypeError:
            bound = None
        params = list(bound.arguments) if bound is not None else []
        positional = [dims.get(params[i]) if i < len(params) else None for i in range(len(args))]
        keyword = {k: dims.get(k) for k in kwargs}
    else:
        positional = list(dims) + [None] * (len(args) - len(dims))
        keyword = {k: None for k in kwargs}
    flat: list = []
    for value, spec in zip(args, positional):
        _walk(value, spec, flat)
    for key, value in kwargs.items():
        _walk(value, keyword[key], flat)
    return flat


def _walk(value: Any, spec: Any, flat: list) -> None:
    if isinstance(value, torch.Tensor):
        flat.append(spec)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None, flat)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, spec.get(key) if isinstance(spec, dict) else None, flat)
    elif value is not None:
        flat.append(None)


def _first_paragraph(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.split("\n\n")[0].strip()


def _export_failure_message(err: BaseException, fixed: list | None = None) -> str:
    guard = specialize_inputs.data_dependent_guard(err)
    reason = _guard_reason(err) if guard is not None else _first_paragraph(err)
    hint = ""
    lowered = str(err).lower()
    if guard is not None or "data-dependent" in lowered or "could not guard" in lowered:
        hint = (
            "\nThe model branches on a tensor's value. torch.export cannot capture that; "
            "express the branch with torch.cond, or make the condition depend on shapes only"
        )
        if fixed:
            hint += f" (tried with {', '.join(f.name for f in fixed)} fixed to the example value)"
        hint += ". If the value comes from an integer input that describes the data (an image's size), " \
                "specialize=[its name] (--specialize) fixes it to the example value."
    elif "top-level keys must be the arg names" in lowered:
        hint = "\nName the dynamic dims by forward()'s parameter names (the keys torch lists above)."
    elif "constraints violated" in lowered or "specialized" in lowered or "dynamic_shapes" in lowered:
        hint = "\nCheck the dynamic dims you declared: torch found the model needs a fixed size or a narrower range there."
    elif "not a known type" in lowered and "pytree" in lowered:
        hint = (
            "\nThe model takes or returns an object torch.export cannot flatten. For transformers models, "
            "pass use_cache=False (config or kwargs) or return a plain tuple/dict."
        )
    return f"torch.export could not capture the model ({type(err).__name__}):\n{reason}{hint}"


def _guard_reason(err: BaseException) -> str:
    """A data-dependent guard's condition and the model's line that asked for it, without the partial graph torch
    prints before them."""
    lines = [line.strip() for line in str(err).splitlines()]
    cond = next((line for line in lines if line.startswith("Could not guard")), None)
    where = _model_line(err) or next((line for line in lines if line.startswith("Caused by:")), None)
    return "\n".join(line for line in (cond, where) if line) or _first_paragraph(err)


def _model_line(err: BaseException) -> str | None:
    """The innermost frame of the failure outside torch and torch2jax: the model's own line."""
    import traceback

    inner = err
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    skip = (os.sep + "torch" + os.sep, os.sep + "torch2jax" + os.sep, os.sep + "contextlib.py", os.sep + "functools.py")
    frames = [f for f in traceback.extract_tb(inner.__traceback__) if not any(part in f.filename for part in skip)]
    if not frames:
        return None
    frame = frames[-1]
    short = frame.filename.split("site-packages" + os.sep)[-1]
    return f"at {short}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
