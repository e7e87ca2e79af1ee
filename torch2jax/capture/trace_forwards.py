"""Forwards (and other methods) that stand in for a module class's own while torch.export traces it.

Some model code cannot be captured as written: a mixture-of-experts layer that loops over the experts its tokens
hit (`for e in hit.nonzero()`, then `torch.where(mask[e])`) makes every shape depend on the routing, and a
vision-language model that walks its token types in Python (`groupby(mm_token_type_ids.tolist())`) to place its
rotary positions stops torch.export at the `.tolist()`. A method registered here for that class computes the same
function in a form with static shapes (every expert on every token, weighted by the routing; the positions as
running sums over the batch), and is installed on each instance only for the export, so the user's module is
unchanged afterwards. Registrations come from the rooms that know the model code (torch2jax/hf/stand_ins/),
keyed by the class's qualified name so that registering does not import the model's module.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_STAND_INS: dict[str, list[tuple[str, Callable, Callable[[type], bool] | None]]] = {}
_FUNCTIONS: dict[str, Callable[[Callable], Callable]] = {}


def register(qualified_name: str, function: Callable, method: str = "forward",
             applies: Callable[[type], bool] | None = None) -> None:
    """While tracing, instances of the class `module.QualName` run `function(self, ...)` as their `method`
    (where `applies(cls)`, if given, says the class's own method is the one the stand-in was written for)."""
    _STAND_INS.setdefault(qualified_name, []).append((method, function, applies))


def register_function(qualified_name: str, wrap: Callable[[Callable], Callable]) -> None:
    """While tracing, the module-level function `module.name` is `wrap(function)` wherever a loaded module of the
    same package holds it (model code imports shared helpers by name)."""
    _FUNCTIONS[qualified_name] = wrap


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@contextmanager
def installed(module: torch.nn.Module) -> Iterator[list[str]]:
    """The registered methods set on every matching submodule of `module` (yields the class names replaced)."""
    replaced: list[tuple[torch.nn.Module, str, object]] = []
    names: list[str] = []
    if _STAND_INS:
        for sub in module.modules():
            for method, function, applies in _STAND_INS.get(_qualified(type(sub)), ()):
                if applies is not None and not applies(type(sub)):
                    continue
                replaced.append((sub, method, sub.__dict__.get(method)))
                setattr(sub, method, types.MethodType(function, sub))
                if type(sub).__name__ not in names:
                    names.append(type(sub).__name__)
    patched = _patch_functions()
    try:
        yield names
    finally:
        for module, name, own in patched:
            setattr(module, name, own)
        for sub, method, own in reversed(replaced):
            if own is None:
                delattr(sub, method)  # the class's method again
            else:
                setattr(sub, method, own)


def _patch_functions() -> list[tuple[types.ModuleType, str, Callable]]:
    """The registered function stand-ins set in every loaded module of their package that holds the function."""
    patched = []
    for qualified_name, wrap in _FUNCTIONS.items():
        module_name, name = qualified_name.rsplit(".", 1)
        home = sys.modules.get(module_name)
        own = getattr(home, name, None)
        if own is None:
            continue
        stand_in = wrap(own)
        package = module_name.split(".")[0] + "."
        for module in [m for key, m in list(sys.modules.items()) if key.startswith(package) and m is not None]:
            if getattr(module, "__dict__", {}).get(name) is own:
                patched.append((module, name, own))
                setattr(module, name, stand_in)
    return patched
