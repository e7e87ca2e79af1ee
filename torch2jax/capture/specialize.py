"""Integer inputs whose values decide shapes (an image's size, a patch grid), fixed to their example values.

A vision-language model reads `image_sizes.tolist()` to decide how many patches each image has; torch.export
cannot capture a shape that depends on an input's values and stops at a data-dependent guard
(GuardOnDataDependentSymNode). When that happens, `export` tries again with such an input replaced, inside the
traced forward, by a constant holding its example value. torch's constant propagation then computes the shapes
on the real values, and the graph is fixed to them. The input stays in the model's signature; the artifact
refuses any other value with an error that names it (GraphInput.baked).

Only inputs that describe images or other side data are tried automatically: an integer tensor of at most
MAX_ELEMENTS elements with no dynamic dim, whose name is not a per-token input (ids, masks, positions, labels).
Fixing those would make an artifact that only runs its example prompt; `specialize=[name]` asks for any input
by name.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

MAX_ELEMENTS = 1024
# per-token inputs: fixing their values fixes the prompt
_PER_TOKEN = re.compile(r"(^|_)(ids|mask|masks|labels|positions?)$|input_ids|attention_mask|position_ids")


@dataclass
class FixedInput:
    """A top-level tensor input fixed to its example value: where it sits in forward's call, and the value."""

    name: str
    position: int | None  # index into args, or None for a keyword input
    value: torch.Tensor

    @property
    def values(self) -> list:
        return self.value.tolist()


def named_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> list[tuple[str, int | None, Any]]:
    """(name, position or None, value) of each top-level input, positional ones named by forward's parameters."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    named = [(params[i] if i < len(params) else f"args[{i}]", i, value) for i, value in enumerate(args)]
    return named + [(key, None, value) for key, value in kwargs.items()]


def candidates(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic: set[str]) -> list[FixedInput]:
    """The inputs worth fixing automatically, smallest first (see the module docstring)."""
    found = []
    for name, position, value in named_inputs(module, args, kwargs):
        if (isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()
                and value.numel() <= MAX_ELEMENTS and name not in dynamic and not _PER_TOKEN.search(name)):
            found.append(FixedInput(name, position, value.detach().clone()))
    return sorted(found, key=lambda f: f.value.numel())


def by_name(module: torch.nn.Module, args: tuple, kwargs: dict, names: list[str]) -> list[FixedInput]:
    """The inputs a user asked to fix; an unknown name or a non-tensor is refused by name."""
    from ..errors import InputSpecError

    inputs = {name: (position, value) for name, position, value in named_inputs(module, args, kwargs)}
    fixed = []
    for name in names:
        if name not in inputs:
            raise InputSpecError(f"specialize: {name!r} is not an input of this call; its inputs are {', '.join(inputs)}")
        position, value = inputs[name]
        if not isinstance(value, torch.Tensor):
            raise InputSpecError(f"specialize: input {name!r} is a {type(value).__name__}; only tensor inputs are fixed "
                                 "(python values are fixed already)")
        fixed.append(FixedInput(name, position, value.detach().clone()))
    return fixed


@contextmanager
def fixed_while_tracing(module: torch.nn.Module, fixed: list[FixedInput]) -> Iterator[None]:
    """While torch.export traces `module`, its forward sees each fixed input as a constant made inside the trace,
    and torch propagates constants of up to MAX_ELEMENTS elements (its own limit is 1: scalars only)."""
    if not fixed:
        yield
        return

    def swap(_module, args, kwargs):
        args, kwargs = list(args), dict(kwargs)
        for f in fixed:
            constant = torch.tensor(f.values, dtype=f.value.dtype)
            if f.position is None:
                kwargs[f.name] = constant
            elif f.position < len(args):
                args[f.position] = constant
        return tuple(args), kwargs

    from torch._subclasses import fake_tensor
    from torch.fx.experimental import proxy_tensor

    handle = module.register_forward_pre_hook(swap, with_kwargs=True, prepend=True)
    try:
        with mock.patch.object(fake_tensor, "CONSTANT_NUMEL_LIMIT", MAX_ELEMENTS), \
                mock.patch.object(proxy_tensor, "CONSTANT_NUMEL_LIMIT", MAX_ELEMENTS):
            yield
    finally:
        handle.remove()


def data_dependent_guard(err: BaseException) -> str | None:
    """The condition of the data-dependent guard torch.export stopped at (anywhere in the error's chain), or None."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, GuardOnDataDependentSymNode):
            return str(err.cond)
        err = err.__cause__ or err.__context__
    return None
