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

Before any input, the module's small integer buffers kept out of its state_dict (ConstantBuffer: a convolution's
stride or padding, as EnCodec keeps them) are traced as constants the same way: values the module fixed when it was
built. A forward that writes into one shows it is state, and the export runs without them.
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


@dataclass
class ConstantBuffer:
    """A small integer buffer kept out of the state_dict (`persistent=False`): a value the module derived when it
    was built (a convolution's stride or padding, as EnCodec keeps them), not state. Its name in named_buffers,
    the module that holds it, and its value."""

    path: str
    owner: torch.nn.Module
    name: str
    value: torch.Tensor


class BufferWritten(RuntimeError):
    """forward() wrote into a buffer it was tracing as a constant: that buffer is state, not a constant."""


def constant_buffers(module: torch.nn.Module) -> list[ConstantBuffer]:
    """The buffers a data-dependent guard may read that are constants of the module (see ConstantBuffer); buffers
    without values (fake or meta, before streamed weights arrive) are left out."""
    from .fake_params import is_fake

    saved = set(module.state_dict(keep_vars=True))
    found = []
    for path, buffer in module.named_buffers(remove_duplicate=False):
        if (path in saved or buffer.is_floating_point() or buffer.is_complex() or buffer.numel() > MAX_ELEMENTS
                or buffer.device.type == "meta" or is_fake(buffer)):
            continue
        owner, _, name = path.rpartition(".")
        found.append(ConstantBuffer(path, module.get_submodule(owner) if owner else module, name, buffer.detach().clone()))
    return found


@contextmanager
def fixed_while_tracing(module: torch.nn.Module, fixed: list[FixedInput],
                        buffers: list[ConstantBuffer] | None = None) -> Iterator[None]:
    """While torch.export traces `module`, its forward sees each fixed input, and each of `buffers`, as a constant
    made inside the trace, and torch propagates constants of up to MAX_ELEMENTS elements (its own limit is 1:
    scalars only). A forward that writes into one of those buffers raises BufferWritten: it is state after all."""
    buffers = buffers or []
    if not fixed and not buffers:
        yield
        return
    swapped: list[tuple[ConstantBuffer, Any, torch.Tensor, int]] = []

    def swap(_module, args, kwargs):
        args, kwargs = list(args), dict(kwargs)
        for f in fixed:
            constant = torch.tensor(f.values, dtype=f.value.dtype)
            if f.position is None:
                kwargs[f.name] = constant
            elif f.position < len(args):
                args[f.position] = constant
        for b in buffers:
            constant = torch.tensor(b.value.tolist(), dtype=b.value.dtype).reshape(b.value.shape)
            swapped.append((b, b.owner._buffers[b.name], constant, constant._version))
            b.owner._buffers[b.name] = constant
        return tuple(args), kwargs

    def restore(*_):
        written = [b.path for b, _traced, constant, version in swapped if constant._version != version]
        while swapped:
            b, traced, _constant, _version = swapped.pop()
            b.owner._buffers[b.name] = traced
        if written:
            raise BufferWritten(f"forward() writes into buffer(s) {', '.join(written)}")

    from torch._subclasses import fake_tensor
    from torch.fx.experimental import proxy_tensor

    originals = [(b, b.owner._buffers[b.name]) for b in buffers]
    handles = [module.register_forward_pre_hook(swap, with_kwargs=True, prepend=True)]
    if buffers:
        handles.append(module.register_forward_hook(restore))
    try:
        with mock.patch.object(fake_tensor, "CONSTANT_NUMEL_LIMIT", MAX_ELEMENTS), \
                mock.patch.object(proxy_tensor, "CONSTANT_NUMEL_LIMIT", MAX_ELEMENTS):
            yield
    finally:
        for handle in handles:
            handle.remove()
        constants = {id(constant) for _b, _traced, constant, _version in swapped}
        for b, original in originals:  # a forward that raised left a constant in place of the module's own buffer
            if id(b.owner._buffers.get(b.name)) in constants:
                b.owner._buffers[b.name] = original
        swapped.clear()


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


FOLD_LIMIT = 1 << 16  # elements: a value computed from fixed inputs larger than this stays computed in the graph


def fold_constants(ep: torch.export.ExportedProgram) -> int:
    """Evaluate what the graph computes from its lifted tensor constants alone (a fixed input's value and what the
    model derives from it: patch counts, cumulative lengths, split points) and lift the results as constants.

    torch.export traced those ops on constant values and so saw concrete shapes, but decomposing the program
    retraces it without the constants' values, where a `repeat_interleave` by the fixed grid has a data-dependent
    size again. Ops that mutate, draw random numbers or build tensors from literals alone are left in the graph.
    Returns the number of values folded."""
    import operator

    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

    graph = ep.graph_module.graph
    specs = ep.graph_signature.input_specs
    known: dict[torch.fx.Node, Any] = {}  # values computed here; `derived`: those that read a constant
    for node, spec in zip(graph.find_nodes(op="placeholder"), specs):
        if spec.kind == InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(spec.target), torch.Tensor):
            known[node] = ep.constants[spec.target]
    if not known:
        return 0
    derived = dict.fromkeys(known)  # ordered: the folded constants are named in graph order
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if any(n in known for n in _written(node)):
            return 0  # a value computed here is written to in place later: the graph is left whole
        inputs = node.all_input_nodes
        if not _foldable(node, operator.getitem) or not _small(node) or not all(n in known for n in inputs):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: known[n])
        try:
            known[node] = node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - left to the graph, which fails (or not) the usual way
            continue
        if any(n in derived for n in inputs):
            derived[node] = None
    frontier = [node for node in derived if node.op == "call_function" and isinstance(known[node], torch.Tensor)
                and any(user not in known for user in node.users)]
    fake_mode = next((n.meta["val"].fake_mode for n in graph.find_nodes(op="placeholder")
                      if hasattr(n.meta.get("val"), "fake_mode")), None)
    first_user_input = next((i for i, spec in enumerate(specs) if spec.kind == InputKind.USER_INPUT), len(specs))
    anchor = list(graph.find_nodes(op="placeholder"))
    for count, node in enumerate(frontier):
        value = known[node].detach().clone().contiguous()
        target = f"folded_constant_{count}"
        while target in ep.constants:
            target += "_"
        insert_before = anchor[first_user_input] if first_user_input < len(anchor) else None
        with (graph.inserting_before(insert_before) if insert_before is not None else graph.inserting_after(anchor[-1])):
            placeholder = graph.placeholder(f"c_{target}")
        placeholder.meta.update(node.meta)
        if fake_mode is not None:
            placeholder.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(placeholder)
        ep.constants[target] = value
        specs.insert(first_user_input, InputSpec(kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=placeholder.name),
                                                 target=target, persistent=None))
        anchor.insert(first_user_input, placeholder)
        first_user_input += 1
    for node in reversed(list(known)):  # checks on the folded values (which held when they were computed) go too
        if node.op == "call_function" and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    ep.graph_module.recompile()
    return len(frontier)


def _small(node: torch.fx.Node) -> bool:
    """At most FOLD_LIMIT elements in each tensor the node makes (by its traced metadata; a symbolic size is not)."""
    values = node.meta.get("val")
    values = values if isinstance(values, (list, tuple)) else [values]
    return all(not isinstance(v, torch.Tensor) or (isinstance(v.numel(), int) and v.numel() <= FOLD_LIMIT)
               for v in values)


def _written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes an in-place op writes to (`detach_` writes no values)."""
    if not isinstance(node.target, torch._ops.OpOverload) or node.target is torch.ops.aten.detach_.default:
        return []
    schema = node.target._schema
    if not schema.is_mutable:
        return []
    written = []
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            written.extend(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, torch.fx.Node))
    return written


def _foldable(node: torch.fx.Node, getitem: Any) -> bool:
    """A pure op: no mutation (`detach_` changes no values), no randomness."""
    if node.target is getitem or node.target is torch.ops.aten.detach_.default:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    return not schema.is_mutable and torch.Tag.nondeterministic_seeded not in node.target.tags
