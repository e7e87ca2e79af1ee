"""Where each param of a fake-parameter module comes from in a safetensors checkpoint.

Checkpoint names are not the module's state_dict names one to one:
  - tied weights (lm_head.weight) are stored once, under either name;
  - non-persistent buffers (rotary inv_freq) are not stored: the module's constructed value is kept;
  - a wrapper adds or drops a prefix (`model.`, `transformer.`): names match on whole dotted suffixes;
  - a library may rename and fuse weights at load time (transformers stacks Mixtral's per-expert
    `w1`/`w3`/`w2` into `gate_up_proj`/`down_proj`): its rules, given as `Rename`s and `Fuse`s
    (hf/checkpoint_rules.py reads transformers' own), are applied here, tensor by tensor.
`resolve` maps every param at once and fails listing every param without a source and every
tensor whose shape or dtype differs; nothing is read until the artifact is written.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import InputSpecError
from ..ir.dtypes import is_floating, jax_dtype, numpy_dtype
from ..runtime.checkpoint import DeferredArray
from ..runtime.quantize import StoredWeight
from .checkpoint_files import Checkpoint, aligned_empty, mapped
from .fake_params import is_fake
from .fx import dtype_name


@dataclass(frozen=True)
class Rename:
    """A regex substitution on checkpoint names (transformers' WeightRenaming)."""

    pattern: str
    replacement: str


@dataclass(frozen=True)
class Fuse:
    """Several checkpoint tensors -> one param: per source pattern (a `*` is the expert index) the matches
    stacked along `stack_dim` in index order, then the patterns concatenated along `concat_dim`, then the two axes
    of `swap` exchanged (with `swap_if_needed`, only where that gives the param's shape and the stored one does not:
    transformers' Transpose(check_dims=True), for checkpoints stored either way)."""

    sources: tuple[str, ...]
    target: str
    stack_dim: int | None
    concat_dim: int | None
    swap: tuple[int, int] | None = None
    swap_if_needed: bool = False


@dataclass
class Recipe:
    """How one param is made: one checkpoint tensor, or several fused."""

    parts: list[list[str]]  # per source pattern, the checkpoint names in index order
    fuse: Fuse | None = None
    label: str = field(default="")
    stored: StoredWeight | None = None  # a weight the checkpoint stores quantized (hf/prequantized.py)


class WeightSource:
    """A checkpoint plus the rules that name its tensors as the module names its params."""

    def __init__(self, checkpoint: Checkpoint, renames: tuple[Rename, ...] = (), fuses: tuple[Fuse, ...] = (),
                 cast: bool = False, stored: tuple[dict[str, StoredWeight], set[str]] | None = None):
        self.checkpoint = checkpoint
        self.cast = cast  # the conversion asked for a dtype: floating tensors are converted to it on read
        # weights stored quantized ({checkpoint name: StoredWeight}) and the tensors that make them, not params themselves
        self.stored, taken = stored or ({}, set())
        self.recipes = _recipes(checkpoint, renames, fuses, self.stored, taken)
        self._by_suffix: dict[str, list[str]] = defaultdict(list)
        for name in self.recipes:
            parts = name.split(".")
            for i in range(1, len(parts)):
                self._by_suffix[".".join(parts[i:])].append(name)

    def resolve(self, tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, Any]:
        """{name: DeferredArray} for every param the checkpoint holds, the real tensor for buffers it does not.

        `aliases` (tied name -> kept name) lets a tied param come from either name.
        """
        tied: dict[str, list[str]] = defaultdict(list)
        for alias, kept in aliases.items():
            tied[kept].append(alias)
        out: dict[str, Any] = {}
        missing, mismatched, used = [], [], set()
        for name, tensor in tensors.items():
            found = next((key for key in (self._match(n) for n in (name, *tied[name])) if key is not None), None)
            if found is None:
                if is_fake(tensor):
                    missing.append(name)
                else:
                    out[name] = tensor  # a buffer the module computed (non-persistent, or absent from the file)
                continue
            used.add(found)
            recipe = self.recipes[found]
            if recipe.stored is not None:
                self._resolve_stored(name, tensor, recipe, out, mismatched)
                continue
            shape, dtype = self._result(recipe, tuple(tensor.shape))
            want = numpy_dtype(dtype_name(tensor.dtype))
            if shape != tuple(tensor.shape) or (dtype != want and not (self.cast and is_floating(dtype) and is_floating(want))):
                mismatched.append(f"{name}: the module has {want}{list(tensor.shape)}, {recipe.label} is {dtype}{list(shape)}")
                continue
            carried = np.dtype(jax_dtype(dtype_name(tensor.dtype)))  # as JAX holds it (int64 -> int32 without x64)
            out[name] = DeferredArray(shape, carried, self._reader(recipe, shape, dtype, carried), recipe.label)
        if missing or mismatched:
            raise InputSpecError(self._problems(missing, mismatched, used))
        return out

    @staticmethod
    def _resolve_stored(name: str, tensor: torch.Tensor, recipe: Recipe, out: dict, mismatched: list) -> None:
        """A weight stored quantized: a DeferredArray of the float weight (read dequantized) that carries the stored
        form as `stored`, which runtime/quantize.adopt_stored keeps where the weight only feeds matmuls."""
        stored = recipe.stored
        want = numpy_dtype(dtype_name(tensor.dtype))
        if stored.shape != tuple(tensor.shape) or not is_floating(want):
            mismatched.append(f"{name}: the module has {want}{list(tensor.shape)}, {recipe.label} is {list(stored.shape)}")
            return
        carried = np.dtype(jax_dtype(dtype_name(tensor.dtype)))
        value = DeferredArray(stored.shape, carried, lambda: stored.dequantize().astype(carried), recipe.label)
        value.stored = stored
        out[name] = value

    def check(self, module: torch.nn.Module) -> dict[str, Any]:
        """Resolve the module's own state before anything is exported: a wrong checkpoint fails at once. Returns what
        `resolve` returns, tied names once."""
        seen: dict[int, str] = {}
        tensors, aliases = {}, {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                aliases[name] = seen[id(tensor)]
                continue
            seen[id(tensor)] = name
            tensors[name] = tensor
        return self.resolve(tensors, aliases)

    def materialize(self, module: torch.nn.Module) -> torch.nn.Module:
        """Give a fake-parameter module its real weights, to run it in torch (verification): each tensor stored as
        the module holds it is memory-mapped from its file (file-backed pages, not a copy); fused or cast ones are read."""
        from .torch_arrays import to_torch, torch_view

        tied: dict[int, list[str]] = defaultdict(list)  # one tensor under several names: each gets the same values
        tensors = {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            if is_fake(tensor):
                tied[id(tensor)].append(name)
                tensors[id(tensor)] = tensor
        state = {}
        for identity, names in tied.items():
            tensor = tensors[identity]
            key = next((k for k in map(self._match, names) if k is not None), None)
            if key is None:
                continue
            recipe = self.recipes[key]
            want = numpy_dtype(dtype_name(tensor.dtype))
            if recipe.stored is not None:  # dequantized, as transformers loads such a checkpoint on CPU
                state.update(dict.fromkeys(names, to_torch(recipe.stored.dequantize().astype(want))))
                continue
            entry = self.checkpoint.entries[recipe.parts[0][0]]
            stored_as_module = recipe.fuse is None and entry.dtype == want
            values = torch_view(mapped(entry)) if stored_as_module else to_torch(
                self._reader(recipe, tuple(tensor.shape), entry.dtype, want)())
            state.update(dict.fromkeys(names, values))
        module.load_state_dict(state, strict=False, assign=True)
        for names in tied.values():  # assign gave each name its own Parameter: tie them again
            first = module.get_parameter(names[0]) if len(names) > 1 else None
            for name in names[1:]:
                owner, _, attr = name.rpartition(".")
                setattr(module.get_submodule(owner), attr, first)
        return module

    # -- internals ---------------------------------------------------------------------------
    def _match(self, name: str) -> str | None:
        """The recipe for `name`: the same name, or one that differs by a whole leading prefix either way."""
        if name in self.recipes:
            return name
        longer = self._by_suffix.get(name, [])
        if len(longer) == 1:
            return longer[0]
        parts = name.split(".")
        shorter = [".".join(parts[i:]) for i in range(1, len(parts)) if ".".join(parts[i:]) in self.recipes]
        return shorter[0] if len(shorter) == 1 and not longer else None

    def _result(self, recipe: Recipe, wanted: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], np.dtype]:
        """The param's shape and dtype as the recipe makes it (`wanted`: the module's shape, which decides a swap
        made only if needed)."""
        shape, dtype = self._assembled(recipe)
        swap = recipe.fuse.swap if recipe.fuse is not None else None
        if swap is None or shape == (-1,):
            return shape, dtype
        swapped = list(shape)
        swapped[swap[0]], swapped[swap[1]] = shape[swap[1]], shape[swap[0]]
        if recipe.fuse.swap_if_needed and (wanted is None or shape == wanted):
            return shape, dtype
        return tuple(swapped), dtype

    def _assembled(self, recipe: Recipe) -> tuple[tuple[int, ...], np.dtype]:
        """The shape and dtype of the recipe's stacked and joined parts, before any swap."""
        entries = [[self.checkpoint.entries[n] for n in names] for names in recipe.parts]
        first = entries[0][0]
        if recipe.fuse is None:
            return first.shape, first.dtype
        shapes = []
        for group in entries:
            if any(e.shape != group[0].shape or e.dtype != first.dtype for e in group):
                return (-1,), first.dtype  # parts that cannot be stacked: reported as a mismatch
            shape = list(group[0].shape)
            if recipe.fuse.stack_dim is not None:
                shape.insert(recipe.fuse.stack_dim, len(group))
            shapes.append(shape)
        shape = list(shapes[0])
        axis = recipe.fuse.concat_dim
        if axis is not None:
            if any(len(s) != len(shape) or s[:axis] + s[axis + 1:] != shape[:axis] + shape[axis + 1:] for s in shapes):
                return (-1,), first.dtype
            shape[axis] = sum(s[axis] for s in shapes)
        return tuple(shape), first.dtype

    def _reader(self, recipe: Recipe, shape: tuple[int, ...], stored: np.dtype, want: np.dtype):
        checkpoint = self.checkpoint
        assembled = self._assembled(recipe)[0] if recipe.fuse is not None else shape
        # a swap always, or only where the stored layout is not the param's (a square one is taken as stored)
        swap = recipe.fuse is not None and recipe.fuse.swap is not None and (not recipe.fuse.swap_if_needed or assembled != shape)

        def read() -> np.ndarray:
            if recipe.fuse is None:
                values = checkpoint.read(recipe.parts[0][0])
                return values if stored == want else values.astype(want)
            out = aligned_empty(shape, want)  # filled part by part: one part in memory besides the result
            if not swap:
                return fill(out)
            out[...] = np.swapaxes(fill(aligned_empty(assembled, want)), *recipe.fuse.swap)  # a swap: one more copy
            return out

        def fill(out: np.ndarray) -> np.ndarray:
            stack, axis = recipe.fuse.stack_dim, recipe.fuse.concat_dim
            offset = 0
            for names in recipe.parts:
                stacked = list(checkpoint.entries[names[0]].shape)
                if stack is not None:
                    stacked.insert(stack, len(names))
                width = stacked[axis] if axis is not None else 0
                for index, part in enumerate(names):
                    where: list[Any] = [slice(None)] * out.ndim
                    if stack is not None:
                        where[stack] = index
                    if axis is not None:
                        where[axis] = slice(offset, offset + width)
                    out[tuple(where)] = checkpoint.read(part)
                offset += width
            return out

        return read

    def _problems(self, missing: list[str], mismatched: list[str], used: set[str]) -> str:
        unused = [n for n in self.recipes if n not in used]
        return mismatch_report(missing, unused, mismatched)


LISTED = 20  # names listed in a mismatch report, the rest counted


def mismatch_report(missing: list[str], unused: list[str], mismatched: list[str], *,
                    subject: str = "the checkpoint does not match the model", differ: str = "shape or dtype",
                    closing: str = "Is this the checkpoint of this model (config.json / the model file)? Nothing was written.",
                    ) -> str:
    """The one report of a checkpoint that does not fit its model, streamed (WeightSource) or loaded by transformers
    (hf/directory.py): the params without a tensor, the tensors no param took (only where a param lacks one: an
    unused tensor alone is harmless), the tensors of another shape (`mismatched`: one line each); LISTED of each at most."""
    lines = [f"{subject}:"]
    if missing:
        lines.append(f"  {len(missing)} param(s) have no tensor in the checkpoint: {_first_names(missing)}")
        if unused:
            lines.append(f"  checkpoint tensors no param took: {_first_names(unused)}")
    if mismatched:
        lines.append(f"  {len(mismatched)} tensor(s) differ in {differ}:")
        lines += [f"    {line}" for line in mismatched[:LISTED]]
    lines.append(closing)
    return "\n".join(lines)


def _first_names(names: list[str]) -> str:
    more = f" (and {len(names) - LISTED} more)" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _empty_groups(count: int) -> list[dict[int, str]]:
    return [{} for _ in range(count)]


def _recipes(checkpoint: Checkpoint, renames: tuple[Rename, ...], fuses: tuple[Fuse, ...],
             stored: dict[str, StoredWeight] | None = None, taken_by_stored: set[str] = frozenset()) -> dict[str, Recipe]:
    """Param name -> recipe, after renaming every checkpoint name and grouping the fused ones. A weight stored quantized
    counts as one tensor under its weight's name (its parts are no params); it is never fused."""
    stored = stored or {}
    renamed = {}
    for name in [*(n for n in checkpoint.entries if n not in taken_by_stored), *stored]:
        new = name
        for rule in renames:
            new = re.sub(rule.pattern, rule.replacement, new)
        renamed[name] = new
    recipes: dict[str, Recipe] = {}
    taken: set[str] = set(stored)
    for fuse in fuses:
        groups: dict[str, list[dict[int, str]]] = defaultdict(functools.partial(_empty_groups, len(fuse.sources)))
        for k, source in enumerate(fuse.sources):
            pattern = re.compile(re.escape(source).replace(r"\*", r"(\d+)"))
            for original, name in renamed.items():
                match = pattern.search(name)
                if match is None or original in taken:
                    continue
                target = name[: match.start()] + fuse.target + name[match.end():]
                groups[target][k][int(match.group(1)) if match.groups() else 0] = original
        for target, per_source in groups.items():
            if any(not found for found in per_source):
                continue  # an incomplete group: its tensors stay unmatched and are reported if a param needs them
            parts = [[found[i] for i in sorted(found)] for found in per_source]
            label = f"checkpoint tensors {parts[0][0]} ... ({sum(len(p) for p in parts)} fused)"
            recipes[target] = Recipe(parts, fuse, label)
            taken.update(n for p in parts for n in p)
    for original, name in renamed.items():
        if original in stored:
            recipes.setdefault(name, Recipe([[original]], None, f"checkpoint tensor {original} ({stored[original].description})",
                                            stored[original]))
        elif original not in taken:
            recipes.setdefault(name, Recipe([[original]], None, f"checkpoint tensor {original}"))
    return recipes
