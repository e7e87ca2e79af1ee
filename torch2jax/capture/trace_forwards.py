"""Forwards that stand in for a module class's own while torch.export traces it.

Some model code cannot be captured as written: a mixture-of-experts layer that loops over the experts its tokens
hit (`for e in hit.nonzero()`, then `torch.where(mask[e])`) makes every shape depend on the routing. A forward
registered here for that class computes the same function in a form with static shapes (every expert on every
token, weighted by the routing), and is installed on each instance only for the export, so the user's module is
unchanged afterwards. Registrations come from the rooms that know the model code (torch2jax/hf/experts.py), keyed
by the class's qualified name so that registering does not import the model's module.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_FORWARDS: dict[str, Callable] = {}


def register(qualified_name: str, forward: Callable) -> None:
    """While tracing, instances of the class `module.QualName` run `forward(self, ...)` instead of their own."""
    _FORWARDS[qualified_name] = forward


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@contextmanager
def installed(module: torch.nn.Module) -> Iterator[list[str]]:
    """The registered forwards set on every matching submodule of `module` (yields the class names replaced)."""
    replaced: list[tuple[torch.nn.Module, object]] = []
    names: list[str] = []
    if _FORWARDS:
        for sub in module.modules():
            forward = _FORWARDS.get(_qualified(type(sub)))
            if forward is not None:
                replaced.append((sub, sub.__dict__.get("forward")))
                sub.forward = types.MethodType(forward, sub)
                if type(sub).__name__ not in names:
                    names.append(type(sub).__name__)
    try:
        yield names
    finally:
        for sub, own in replaced:
            if own is None:
                del sub.forward  # the class's forward again
            else:
                sub.forward = own
