"""Stage 1 (convert half): torch.export, retried where a data-dependent guard stops it.

When torch.export stops at a guard on a tensor's value, the export is tried again with the module's small
integer buffers traced as constants, then with integer side-data inputs fixed to their example values one at a
time (specialize.py), then along the example's side of every such guard (example_path.py). The module's outputs
are made plain containers while tracing. Dynamic dims: dynamic_shapes.py; torch's failures made readable:
export_errors.py; the next stage: decomposition.py.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any, NamedTuple

import torch

from ..errors import ExportError
from . import example_path, trace_forwards
from . import specialize as specialize_inputs
from .dynamic_shapes import normalize_dynamic_shapes, symbol_names
from .export_errors import export_failure_message


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
    except ExportError:  # a stand-in's refusal (hf/stand_ins) already names the model's own cause
        raise
    except Exception as err:  # torch's own reason is the useful part
        raise ExportError(export_failure_message(err, fixed)) from err
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
