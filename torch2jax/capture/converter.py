"""`torch2jax.convert`: nn.Module + example inputs -> an in-memory `Model` (convert half)."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import InputMutationWarning, InputSpecError
from ..lowering import interpreter, passes
from ..runtime.checkpoint import is_deferred
from ..runtime.collector import existing_objects_frozen
from ..runtime.model import Model
from ..runtime.quantize import (
    DEFAULT_GROUP_SIZE,
    adopt_stored,
    check_scheme,
    dequantize_array,
    quantize_array,
    quantize_model,
    weight_format,
)
from . import decomposition, example_path, exporter
from . import specialize as specialize_inputs
from .fake_params import has_fake_parameters, is_fake, to_dtype
from .fx import Captured, capture, input_writes_notice
from .torch_arrays import to_jax, to_torch
from .weight_source import WeightSource

ProgressFn = Callable[[str, str], None]  # (stage, message)


class StageTimer:
    """Times the named stages of a conversion and reports each to an optional progress callback."""

    def __init__(self, progress: ProgressFn | None = None):
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, message: str):
        if self.progress:
            self.progress(name, message)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start  # a stage may recur


def convert(
    module: torch.nn.Module,
    args: tuple | list | Any = (),
    kwargs: dict | None = None,
    dynamic_shapes: Any = None,
    *,
    strict: bool = False,
    dtype: str | torch.dtype | None = None,
    progress: ProgressFn | None = None,
    timer: StageTimer | None = None,
    weights: WeightSource | None = None,
    quantize: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    specialize: list[str] | None = None,
) -> Model:
    """Convert `module` to a JAX `Model`, tracing it on example `args`/`kwargs`.

    `dynamic_shapes` takes torch.export's form or a plain one such as `{"x": {0: "batch"}}`.
    The module is exported in the mode it is in: call `module.eval()` first for inference.
    `dtype` (e.g. "bfloat16") converts a copy of the module and its floating inputs first, as
    `module.to(dtype)` would: params and computation in that precision.
    `weights` streams the params of a module built with fake parameters (capture/fake_params.py)
    from a safetensors checkpoint: the Model's params are then read only when it is saved.
    `quantize` ("int8", or "int4" in groups of `group_size`) stores the weights of its matrix products quantized
    (runtime/quantize.py).
    `specialize` names integer tensor inputs to fix to their example values, for a model that reads them to decide
    shapes (an image's size); side-data inputs are fixed automatically where torch.export needs it
    (capture/specialize.py). The Model then refuses other values of them.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert() takes a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, (tuple, list)):
        args = (args,)
    if dtype is not None:
        module, args, kwargs = cast(module, tuple(args), kwargs or {}, dtype, weights)
    timer = timer or StageTimer(progress)
    if quantize is not None:
        check_scheme(quantize, group_size)
    captured, _ = trace(module, tuple(args), kwargs, dynamic_shapes, timer, strict=strict, specialize=specialize)
    model = model_from(captured, timer, weights, hints_from=module)
    if quantize is not None:
        with timer.stage("quantize", f"quantize the matmul weights to {quantize}"):
            model = quantize_model(model, quantize, group_size)
    return model


@existing_objects_frozen()
def trace(module: torch.nn.Module, args: tuple, kwargs: dict | None, dynamic_shapes: Any, timer: StageTimer, *,
          strict: bool = False, what: str = "", specialize: list[str] | None = None,
          ) -> tuple[Captured, torch.export.ExportedProgram]:
    """torch.export + core ATen decomposition, captured as the portable graph (and the program it came from).
    `what` tells the progress output what is traced, e.g. " of 3 of the 32 layers"; `specialize` names inputs
    fixed to their example values (capture/specialize.py)."""
    with timer.stage("export", f"torch.export{what}"):
        ep, names, fixed, followed = exporter.export(module, args, kwargs, dynamic_shapes, strict=strict, specialize=specialize)
    for f in fixed:
        notice = (f"input {f.name!r} is fixed to its example value {f.values} (torch.export needs its values to decide "
                  "shapes); the model refuses any other value")
        if timer.progress:
            timer.progress("export", notice)
        elif f.name not in (specialize or []):  # fixed automatically: say so where no progress is shown
            warnings.warn(notice, stacklevel=4)
    with timer.stage("decompose", "decompose to core ATen"):
        renames = decomposition.subclass_param_names(ep)
        if fixed:
            specialize_inputs.fold_constants(ep)
        decomposed = decomposition.decompose(ep)
        # along the example's path only where no dim is dynamic: the generation steps' graphs, traced on placeholder
        # inputs for every size, run without the per-call checks
        example = None if dynamic_shapes is not None else (lambda: example_path.example_values(decomposed, args, kwargs or {}))
        captured = capture(decomposed, names, renames, fixed, example=example, followed_example=followed)
    if captured.input_writes:
        notice = input_writes_notice(captured.input_writes)
        if timer.progress:
            timer.progress("export", notice)
        else:
            warnings.warn(notice, InputMutationWarning, stacklevel=4)
    if captured.graph.example_values:
        notice = example_path.describe(captured.graph.example_values)
        if timer.progress:
            timer.progress("export", notice)
        else:
            warnings.warn(notice, stacklevel=4)
    return captured, decomposed


@existing_objects_frozen()
def model_from(captured: Captured, timer: StageTimer, weights: WeightSource | None = None,
               hints_from: torch.nn.Module | None = None) -> Model:
    """The JAX `Model` of a captured graph: lowered, with its params copied to JAX (or mapped onto `weights`)."""
    with timer.stage("lower", "translate to JAX"):
        interpreter.check_supported(captured.graph, captured.schemas)
        run = interpreter.build(passes.optimize(captured.graph))  # the saved graph stays plain ATen
    if weights is not None:
        with timer.stage("weights", "map the checkpoint's tensors onto the params (read when saving)"):
            found = weights.resolve(captured.tensors, captured.graph.aliases)
            params = {name: value if is_deferred(value) else to_jax(value) for name, value in found.items()}
    else:
        with timer.stage("weights", "copy the weights into JAX arrays"):
            fake = [name for name, t in captured.tensors.items() if is_fake(t)]
            if fake:
                raise InputSpecError(f"the module's params {', '.join(fake[:5])} are fake (no values): convert it with weights=")
            params = {name: to_jax(t) for name, t in captured.tensors.items()}
    model = Model(run, params, captured.graph)
    model.sharding_hints = tp_plan_hints(hints_from) if hints_from is not None else {}
    model.timings = timer.timings
    return adopt_stored(model)  # weights the checkpoint stores quantized keep that form (runtime/quantize.py)


def tp_plan_hints(module: Any) -> dict[str, str]:
    """A module's own tensor-parallel plan, as transformers models declare it (`config.base_model_tp_plan`:
    {module pattern: style}), with the patterns prefixed by where the base model sits in `module` (e.g. "model.");
    {} for other modules. Saved in the manifest, it seeds sharding="auto" at load time."""
    config = getattr(module, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not isinstance(plan, dict):
        return {}
    prefix = getattr(module, "base_model_prefix", "")
    base = f"{prefix}." if prefix and hasattr(module, prefix) else ""
    return {f"{base}{pattern}": style for pattern, style in plan.items() if isinstance(pattern, str) and isinstance(style, str)}


def floating_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`dtype` ("bfloat16" or a torch dtype) as a floating torch dtype; anything else is refused by name."""
    target = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(target, torch.dtype) or not target.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype such as 'bfloat16', got {dtype!r}")
    return target


def cast_module(module: torch.nn.Module, dtype: str | torch.dtype, weights: WeightSource | None = None, *,
                copy_module: bool = False) -> torch.nn.Module:
    """`module` in the floating `dtype`: the prologue every conversion with a dtype shares (convert, and hf's steps).

    A module with fake params was built by the converter to stream its weights, not the user's: it is converted in
    place (torch's `.to` cannot swap a fake param) and `weights` told to convert the files' floating tensors as they are
    read. A real module is moved with `.to`; with `copy_module` a copy is, and the caller's module stays as it was."""
    target = floating_dtype(dtype)
    if weights is not None:
        weights.cast = True
    if has_fake_parameters(module):
        return to_dtype(module, target)
    return (copy.deepcopy(module) if copy_module else module).to(target)


def cast(module: torch.nn.Module, args: tuple, kwargs: dict, dtype: str | torch.dtype,
         weights: WeightSource | None = None) -> tuple[torch.nn.Module, tuple, dict]:
    """A copy of `module` in `dtype` (cast_module), with floating example inputs cast alike (the user's module is
    untouched)."""
    target = floating_dtype(dtype)

    def cast_value(value):
        return value.to(target) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    moved = cast_module(module, target, weights, copy_module=True)
    return moved, tuple(pytree.tree_map(cast_value, list(args))), pytree.tree_map(cast_value, dict(kwargs))


def load_into_torch(module: torch.nn.Module, model: Model, params: dict | None = None, strict: bool = True) -> Any:
    """Copy `params` (default: `model.params`, e.g. after fine-tuning in JAX) into `module`.

    Names are the module's state_dict names (tied weights land under every name); each value is
    cast to the dtype the module's tensor has (int32 counters back to int64, bfloat16 exactly).
    Returns torch's `load_state_dict` result (missing / unexpected keys when strict=False).
    """
    current = module.state_dict()
    state = {}
    for name, value in model.state_dict(params).items():
        tensor = to_torch(value)
        state[name] = tensor.to(current[name].dtype) if name in current else tensor
    return module.load_state_dict(state, strict=strict)


def quantize_like(module: torch.nn.Module, quantization: dict) -> torch.nn.Module:
    """Give `module` (in place) the weights a quantized conversion computes with: each quantized weight replaced by
    its dequantized values, so torch runs what the artifact runs (the reference for verification). For
    int8-dynamic, each such nn.Linear also rounds its input rows to int8 steps, as the artifact's product does."""
    if not quantization or quantization.get("stored_by") == "checkpoint":  # loaded by transformers, already dequantized
        return module
    scheme, group = quantization["scheme"], quantization.get("group_size", DEFAULT_GROUP_SIZE)
    with torch.no_grad():
        for name in quantization["params"]:
            weight = module.get_parameter(name)
            values, scale = quantize_array(weight.detach().float().numpy(), weight_format(scheme), group)
            weight.copy_(torch.from_numpy(dequantize_array(values, scale, weight_format(scheme), group)).to(weight.dtype))
            owner = module.get_submodule(name.rpartition(".")[0])
            if scheme == "int8-dynamic" and isinstance(owner, torch.nn.Linear):
                owner.register_forward_pre_hook(_round_rows_to_int8)
    return module


def _round_rows_to_int8(_module: torch.nn.Module, args: tuple) -> tuple:
    """A Linear's input as int8-dynamic multiplies it: each row at max|row| / 127 steps (ops/quantized.py)."""
    x = args[0].float()
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    step = torch.where(step > 0, step, torch.ones_like(step))
    return ((x / step).round().clamp(-127, 127) * step).to(args[0].dtype), *args[1:]
