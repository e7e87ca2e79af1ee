"""Resolve a model-file target (`model.py:Model`, `pkg.module:make_model`) to a module and its inputs.

Loading a model file runs the user's code: that is the point of it, and the reason errors from
it are shown with the user's own traceback, not ours.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from ..errors import InputSpecError, Torch2JaxError
from ..ir import input_specs
from .checkpoint_files import Checkpoint
from .fake_params import fake_parameters
from .torch_arrays import to_torch
from .weight_source import WeightSource


@dataclass
class Target:
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    dynamic_shapes: Any
    source: str
    file_module: ModuleType | None  # the model file; None for hf: targets
    weights: WeightSource | None = None  # streamed weights of a module with fake params (capture/weight_source.py)


def resolve(target: str, inputs: list[str], weights: str | None = None, train: bool = False, seed: int = 0,
            stream: bool = False) -> Target:
    """Build the module a model-file target names, load `weights`, and produce example inputs.

    With `stream` and safetensors `weights`, the module is built with fake parameters and `Target.weights` maps
    the files' tensors onto them: nothing is read until the artifact is written. (`hf:DIR` targets are resolved
    by hf/tasks.py.)
    """
    file_module, attr = _import_target(target)
    factory = getattr(file_module, attr, None)
    if factory is None:
        candidates = [
            name for name, value in vars(file_module).items()
            if isinstance(value, type) and issubclass(value, torch.nn.Module) and value.__module__ == file_module.__name__
        ]
        hint = f"; it defines the nn.Module classes {', '.join(candidates)}" if candidates else "; it defines no nn.Module class"
        raise Torch2JaxError(f"{target}: {attr!r} is not defined in {target.rpartition(':')[0]}{hint}")
    torch.manual_seed(seed)
    source = None
    module = _fake_module(factory, target, seed) if stream and weights and is_safetensors(weights) else None
    if module is not None:
        source = WeightSource(Checkpoint.open(weights))
        source.check(module)
    else:
        module = _instantiate(factory, target)
        if weights:
            load_weights(module, weights)
    module.train(train)
    args, kwargs, dynamic = _example_inputs(module, file_module, inputs, seed, target)
    return Target(module, args, kwargs, dynamic, target, file_module, source)


def _fake_module(factory: Any, target: str, seed: int) -> torch.nn.Module | None:
    """The module built with fake parameters, or None (with a warning) when its constructor reads parameter values
    (an init that computes from them): it is then built and loaded in memory as before."""
    try:
        with fake_parameters():
            return _instantiate(factory, target)
    except Torch2JaxError as err:
        warnings.warn(f"{target} cannot be built with fake parameters, so its weights are loaded in memory "
                      f"instead of streamed: {str(err).splitlines()[-1]}", stacklevel=3)
        torch.manual_seed(seed)  # the in-memory build starts from the same seed
        return None


def is_safetensors(path: str) -> bool:
    return str(path).endswith((".safetensors", ".index.json"))


def _import_target(target: str) -> tuple[ModuleType, str]:
    path, sep, attr = target.rpartition(":")
    if not sep or not path or not attr:
        raise Torch2JaxError(f"target {target!r} must look like model.py:Model or package.module:make_model")
    try:
        if path.endswith(".py") or "/" in path:
            file = Path(path)
            if not file.is_file():
                raise Torch2JaxError(f"target {target!r}: file {file} does not exist")
            name = f"torch2jax_user_{file.stem}"
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            sys.path.insert(0, str(file.resolve().parent))
            spec.loader.exec_module(module)
            return module, attr
        return importlib.import_module(path), attr
    except Torch2JaxError:
        raise
    except BaseException as err:  # the user's code failed: show where, in their code
        raise Torch2JaxError(f"importing {path} failed:\n{_user_traceback(err)}") from None


def _instantiate(factory: Any, target: str) -> torch.nn.Module:
    if isinstance(factory, torch.nn.Module):
        return factory
    if not callable(factory):
        raise Torch2JaxError(f"{target} is neither an nn.Module class nor a function returning one")
    required = _required_params(factory)
    if required:
        hint = f"{target.rpartition(':')[0]}:make_model"
        raise Torch2JaxError(
            f"{target} needs constructor arguments ({', '.join(required)}). Add a function that builds it, e.g.\n"
            f"    def make_model():\n        return {getattr(factory, '__name__', 'Model')}(...)\n"
            f"and convert {hint} instead."
        )
    try:
        module = factory()
    except BaseException as err:
        raise Torch2JaxError(f"building {target} failed:\n{_user_traceback(err)}") from None
    if not isinstance(module, torch.nn.Module):
        raise Torch2JaxError(f"{target} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _required_params(factory: Any) -> list[str]:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _example_inputs(module, file_module, inputs: list[str], seed: int, target: str) -> tuple[tuple, dict, Any]:
    if inputs:
        return from_specs(module, [input_specs.parse(text) for text in inputs], seed)
    maker = getattr(file_module, "example_inputs", None)
    if maker is None:
        raise InputSpecError(
            f"{target}: no example inputs. Pass --input for each forward argument, e.g. --input x=float32[batch,16], "
            "or define example_inputs() in the model file"
        )
    try:
        example = maker()
        dynamic = file_module.dynamic_shapes() if hasattr(file_module, "dynamic_shapes") else None
    except BaseException as err:
        raise Torch2JaxError(f"example_inputs() failed:\n{_user_traceback(err)}") from None
    if isinstance(example, dict):
        return (), example, dynamic
    if isinstance(example, torch.Tensor):
        return (example,), {}, dynamic
    return tuple(example), {}, dynamic


def from_specs(module: torch.nn.Module, parsed: list, seed: int) -> tuple[tuple, dict, Any]:
    """Example tensors and dynamic dims from --input specs, positional in forward()'s order."""
    rng = np.random.default_rng(seed)
    sizes = input_specs.merged_sizes([p for p in parsed if isinstance(p, input_specs.InputSpec)])
    values: dict[str, torch.Tensor] = {}
    dynamic: dict[str, dict] = {}
    for item in parsed:
        if item.name in values:
            raise InputSpecError(f"--input {item.name} is given twice")
        if isinstance(item, input_specs.FileInput):
            values[item.name] = to_torch(input_specs.load_array(item))
        else:
            values[item.name] = to_torch(input_specs.example_array(item, sizes, rng))
            if item.dynamic_dims():
                dynamic[item.name] = item.dynamic_dims()
    params = list(inspect.signature(module.forward).parameters)
    unknown = [n for n in values if n not in params]
    if unknown and not any(
        p.kind == p.VAR_KEYWORD for p in inspect.signature(module.forward).parameters.values()
    ):
        raise InputSpecError(f"--input names {unknown} are not arguments of forward({', '.join(params)})")
    args, kwargs = [], {}
    for name in params:
        if name in values and not kwargs:
            args.append(values.pop(name))
        elif name in values:
            kwargs[name] = values.pop(name)
        elif values:
            kwargs.update(values)
            values = {}
            break
        else:
            break
    kwargs.update(values)
    return tuple(args), kwargs, dynamic or None


def load_weights(module: torch.nn.Module, path: str) -> None:
    """Load a state_dict from .safetensors or .pt/.pth (weights_only: nothing is unpickled as code)."""
    file = Path(path)
    if not file.is_file():
        raise Torch2JaxError(f"weights file {file} does not exist")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state = load_file(str(file))
        except Exception as err:
            raise Torch2JaxError(f"{file} is not a readable safetensors file: {err}") from None
    else:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:
            raise Torch2JaxError(
                f"{file} could not be read as a plain state_dict with weights_only=True "
                f"({type(err).__name__}: {str(err).splitlines()[0]}). Save it with torch.save(model.state_dict(), path)."
            ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise Torch2JaxError(f"{file} is not a state_dict (a dict of tensor names to tensors)")
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k}: file {tuple(v.shape)} vs module {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing[:10])}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected[:10])}")
    if mismatched:
        problems.append("shape mismatches: " + "; ".join(mismatched[:10]))
    if problems:
        raise Torch2JaxError(f"{file} does not match the module: " + " | ".join(problems))
    module.load_state_dict(state)


def _user_traceback(err: BaseException) -> str:
    """The traceback limited to frames outside torch2jax: what the user needs to fix their code."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "torch2jax" not in Path(f.filename).parts]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(err), err)
    return "".join(lines).rstrip()
