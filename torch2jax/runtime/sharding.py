"""Serving a loaded artifact on a `jax.sharding.Mesh`: which param is split how, and what that costs.

    m = torch2jax.load("out/llm", mesh=mesh, sharding="auto")      # or {"*.q_proj.weight": P("model", None), ...}
    m.sharding_report()                                             # specs, bytes per device, collectives

JAX does the distributing (GSPMD): this module only decides a `PartitionSpec` per param and places
the inputs' batch dim on the data axis. Every spec is numerically correct under GSPMD; a poor one only
costs collectives, which `ShardingPlan.report` counts in the compiled step.

`"auto"` is Megatron-style tensor parallelism over the mesh axis `model` (column-parallel q/k/v/gate/up
projections, row-parallel output/down projections, MoE experts split on their hidden dim, embeddings
and norms replicated) and data parallelism over the axis `data`. Rules are tried in order, by name
pattern (fnmatch: `*` also matches dots), the first match winning: the user's, then the source model's
own plan when the manifest carries one (transformers' `base_model_tp_plan`: "colwise", "rowwise",
"packed_colwise"), then the built-in `AUTO_RULES`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ..errors import ShardingError
from ..ir import dtypes, structure, symbolic
from ..ir.graph import Graph

DATA, MODEL = "data", "model"

# name pattern -> spec, for the layer names of transformers' decoders and encoders. torch's Linear keeps
# its weight as [out, in]: column-parallel splits dim 0, row-parallel dim 1. GPT-2's Conv1D is [in, out].
AUTO_RULES: tuple[tuple[str, tuple], ...] = (
    *((f"*.{n}.weight", (MODEL, None)) for n in ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj",
                                               "gate_up_proj", "query", "key", "value", "fc1", "w1", "w3")),
    *((f"*.{n}.bias", (MODEL,)) for n in ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj",
                                         "gate_up_proj", "query", "key", "value", "fc1", "w1", "w3")),
    *((f"*.{n}.weight", (None, MODEL)) for n in ("o_proj", "down_proj", "dense_4h_to_h", "fc2", "w2", "out_proj")),
    ("*.attention.output.dense.weight", (None, MODEL)),  # BERT-style
    ("*.intermediate.dense.weight", (MODEL, None)),
    ("*.intermediate.dense.bias", (MODEL,)),
    ("*.output.dense.weight", (None, MODEL)),
    ("*.c_attn.weight", (None, MODEL)), ("*.c_attn.bias", (MODEL,)),  # GPT-2 Conv1D: [in, out]
    ("*.c_fc.weight", (None, MODEL)), ("*.c_fc.bias", (MODEL,)),
    ("*.c_proj.weight", (MODEL, None)),
    ("*.experts.gate_up_proj", (None, MODEL, None)),  # fused experts [E, 2 * hidden, in]
    ("*.experts.down_proj", (None, None, MODEL)),  # [E, out, hidden]
)

Rules = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    pattern: str  # fnmatch over param names
    spec: PartitionSpec
    origin: str  # "yours", "the model's tp plan (colwise)", "auto"


@dataclass(frozen=True)
class ParamPlacement:
    name: str
    shape: tuple[int, ...]
    dtype: str
    spec: PartitionSpec
    rule: str  # the rule that chose the spec and where it came from ("" when none matched: replicated)
    note: str = ""  # why an auto rule was not applied

    def bytes_per_device(self, mesh: Mesh) -> int:
        shard = NamedSharding(mesh, self.spec).shard_shape(self.shape)
        return int(np.prod(shard, dtype=np.int64)) * dtypes.jax_dtype(self.dtype).itemsize


class ShardingPlan:
    """Where each param lives on `mesh`, and how a call's inputs are placed (batch dim on the data axis)."""

    def __init__(self, mesh: Mesh, placements: dict[str, ParamPlacement]):
        self.mesh = mesh
        self.placements = placements

    @property
    def data_axis(self) -> str | None:
        return DATA if DATA in self.mesh.axis_names else None

    def shardings(self) -> dict[str, NamedSharding]:
        return {name: NamedSharding(self.mesh, p.spec) for name, p in self.placements.items()}

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def _split(self, axis: str, size: int) -> str | None:
        """`axis` when the mesh has it and it divides `size`; None (that dim stays whole) otherwise."""
        return axis if axis in self.mesh.axis_names and size % self.mesh.shape[axis] == 0 else None

    def constrain_inputs(self, graph: Graph, leaves: list) -> list:
        """Inside a traced call: each input whose dim 0 is the model's batch dim goes on the data axis."""
        batch = _batch_symbol(graph)
        out = []
        for inp, value in zip(graph.user_inputs, leaves):
            if batch is not None and inp.meta is not None and inp.meta.shape and inp.meta.shape[0] == batch:
                value = jax.lax.with_sharding_constraint(value, self._batch_only(value.shape))
            out.append(value)
        return out

    def _batch_only(self, shape: Sequence[int]) -> NamedSharding:
        """Dim 0 on the data axis (where it divides); the other dims left to GSPMD (a cache keeps its head split)."""
        free = PartitionSpec.UNCONSTRAINED
        return NamedSharding(self.mesh, PartitionSpec(self._split(DATA, shape[0]) or free, *[free] * (len(shape) - 1)))

    def cache_sharding(self, shape: Sequence[int]) -> NamedSharding:
        """A KV cache tensor [batch, kv_heads, slots, head_dim]: rows on the data axis, heads on the model axis
        (each where it divides), so attention over a head's cache needs no collective."""
        spec = [self._split(DATA, shape[0]), self._split(MODEL, shape[1])] + [None] * (len(shape) - 2)
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def report(self, compiled_text: str | None = None) -> ShardingReport:
        return ShardingReport(self.mesh, list(self.placements.values()), count_collectives(compiled_text) if compiled_text else {})

    def report_for(self, model: Any, args: tuple, kwargs: dict) -> ShardingReport:
        """The report with the collectives of `model`'s bound call compiled for these inputs (default: example
        zeros shaped like its signature)."""
        if not args and not kwargs:
            args, kwargs = structure.unflatten(model.graph.in_spec, self.example_inputs(model.graph))
        rng = jax.random.key(0) if model.needs_rng else None
        compiled = model._jitted.lower(model.params, args, kwargs, rng).compile()
        return self.report(compiled.as_text())

    def example_inputs(self, graph: Graph) -> list[np.ndarray]:
        """Zeros shaped like the signature; each symbolic dim the smallest multiple of the data axis it allows."""
        step = self.mesh.shape[self.data_axis] if self.data_axis else 1
        values = {}
        for name, bounds in (graph.symbols or {}).items():
            lo, hi = int(bounds.get("min") or 1), bounds.get("max")
            value = -(-max(lo, 2) // step) * step
            values[name] = value if hi is None or value <= int(hi) else lo
        leaves = []
        for inp in graph.user_inputs:
            shape = [int(symbolic.evaluate(d, values)) for d in inp.meta.shape]
            leaves.append(np.zeros(shape, dtypes.jax_dtype(inp.meta.dtype)))
        return leaves


@dataclass
class ShardingReport:
    """Each param's PartitionSpec and bytes per device, and the collectives XLA put in the compiled step."""

    mesh: Mesh
    params: list[ParamPlacement]
    collectives: dict[str, int]

    @property
    def bytes_per_device(self) -> int:
        return sum(p.bytes_per_device(self.mesh) for p in self.params)

    @property
    def total_bytes(self) -> int:
        return sum(int(np.prod(p.shape, dtype=np.int64)) * dtypes.jax_dtype(p.dtype).itemsize for p in self.params)

    def __str__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in self.mesh.shape.items())
        width = max([len(p.name) for p in self.params] + [5])
        lines = [f"mesh ({axes}), {self.mesh.size} devices",
                 f"{'param':<{width}}  {'shape':<18} {'spec':<24} {'per device':>12}"]
        for p in self.params:
            note = f"  ({p.note or p.rule})" if p.note or p.rule else ""
            lines.append(f"{p.name:<{width}}  {str(list(p.shape)):<18} {_spec_text(p.spec):<24} "
                         f"{_human(p.bytes_per_device(self.mesh)):>12}{note}")
        lines.append(f"params: {_human(self.total_bytes)} in all, {_human(self.bytes_per_device)} per device")
        if self.collectives:
            lines.append("collectives in the compiled step: " + ", ".join(f"{k} {v}" for k, v in self.collectives.items()))
        return "\n".join(lines)


def plan(tree: Mapping[str, tuple[tuple[int, ...], str]], mesh: Mesh, sharding: str | Rules | None = "auto",
         hints: Mapping[str, str] | None = None) -> ShardingPlan:
    """A spec for every param of `tree` ({name: (shape, dtype)}): the user's rules first, then the model's own
    tensor-parallel plan (`hints`: {module or param pattern: style}, from the manifest), then the auto rules."""
    if not isinstance(mesh, Mesh):
        raise ShardingError(f"mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh((2, 4), ('data', 'model'))), got {type(mesh).__name__}")
    user = _user_rules(sharding, mesh)
    auto = [Rule(pattern, PartitionSpec(*spec), "auto") for pattern, spec in AUTO_RULES] if MODEL in mesh.axis_names else []
    placements = {}
    for name, (shape, dtype) in tree.items():
        shape = tuple(shape)
        hinted = _hinted_rules(name, len(shape), hints or {}) if MODEL in mesh.axis_names else []
        placements[name] = _place(name, shape, dtype, user, hinted + auto, mesh)
    for name, placement in placements.items():  # a quantized weight's scales go where its rows and groups go
        base = placements.get(name.removesuffix(SCALE_SUFFIX)) if name.endswith(SCALE_SUFFIX) else None
        if base is not None and not placement.rule.endswith("(yours)"):
            placements[name] = _with_weight(placement, base, mesh)
    return ShardingPlan(mesh, placements)


SCALE_SUFFIX = "_scale"  # runtime/quantize.py: `<weight>_scale` holds a quantized weight's scales


def _with_weight(scale: ParamPlacement, weight: ParamPlacement, mesh: Mesh) -> ParamPlacement:
    """The scales of a quantized [out, in] weight: [out] per row, or [out, in / group] per group, split as the weight is."""
    spec = PartitionSpec(*(list(weight.spec) + [None] * len(scale.shape))[: len(scale.shape)])
    if not any(spec):
        return ParamPlacement(scale.name, scale.shape, scale.dtype, PartitionSpec(), "")
    problem = _misfit(spec, scale.shape, mesh)
    if problem:
        return ParamPlacement(scale.name, scale.shape, scale.dtype, PartitionSpec(), "", f"replicated: {problem}")
    return ParamPlacement(scale.name, scale.shape, scale.dtype, spec, f"with {weight.name}")


# a tp-plan style -> the dim it splits over the model axis, by param rank (None: the param stays whole)
_STYLE_DIM = {"colwise": lambda rank: rank - 2 if rank >= 2 else 0, "packed_colwise": lambda rank: rank - 2 if rank >= 2 else 0,
              "rowwise": lambda rank: rank - 1 if rank >= 2 else None}


def _hinted_rules(name: str, rank: int, hints: Mapping[str, str]) -> list[Rule]:
    """The tp-plan rules that name this param: a module pattern covers its `.weight` and `.bias`, a param
    pattern (fused experts) the param itself. Column-parallel splits the output dim (dim -2 of a [.., out, in]
    weight, dim 0 of a bias); row-parallel the input dim (dim -1; its bias stays whole)."""
    rules = []
    for pattern, style in hints.items():
        if style not in _STYLE_DIM:
            continue
        for candidate in (pattern, f"{pattern}.weight", f"{pattern}.bias"):
            if fnmatch.fnmatchcase(name, candidate):
                dim = _STYLE_DIM[style](rank)
                spec = [None] * rank
                if dim is not None:
                    spec[dim] = MODEL
                rules.append(Rule(candidate, PartitionSpec(*spec), f"the model's tp plan: {style}"))
    return rules


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same devices and axis names with automatic (GSPMD) axes: `jax.make_mesh` defaults to explicit axes,
    under which sharding is part of each array's type and a row-parallel matmul of the rebuilt graph fails."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def count_collectives(hlo_text: str) -> dict[str, int]:
    """How many of each collective op the compiled (optimized) HLO runs; async pairs count once."""
    counts = {}
    for op in COLLECTIVES:
        counts[op] = len(re.findall(rf"= [^=]*? {op}(?:-start)?\(", hlo_text))
    return counts


# -- internals --------------------------------------------------------------------------------
def _user_rules(sharding: str | Rules | None, mesh: Mesh) -> list[Rule]:
    if sharding is None or sharding == "auto":
        return []
    if sharding == "replicated":
        return [Rule("*", PartitionSpec(), "replicated")]
    if isinstance(sharding, str):
        raise ShardingError(f"sharding={sharding!r}: give 'auto', 'replicated', or a dict of rules "
                            "{'<name pattern>': PartitionSpec(...)}")
    if not isinstance(sharding, Mapping):
        raise ShardingError(f"sharding must be 'auto', 'replicated' or a dict of rules, got {type(sharding).__name__}")
    rules = []
    for pattern, spec in sharding.items():
        if spec is None:
            spec = PartitionSpec()
        elif not isinstance(spec, PartitionSpec):
            if not isinstance(spec, (tuple, list)):
                raise ShardingError(f"rule {pattern!r}: give a PartitionSpec (or a tuple of axis names / None), got {spec!r}")
            spec = PartitionSpec(*spec)
        for axis in _axes_of(spec):
            if axis not in mesh.axis_names:
                raise ShardingError(f"rule {pattern!r} uses mesh axis {axis!r}, but the mesh has axes {tuple(mesh.axis_names)}")
        rules.append(Rule(str(pattern), spec, "yours"))
    return rules


def _place(name: str, shape: tuple[int, ...], dtype: str, user: list[Rule], fallback: list[Rule], mesh: Mesh) -> ParamPlacement:
    """The first matching rule's spec. The user's rules must fit; the others (the model's plan, auto) are skipped
    for a param they do not fit (odd sizes, another layout), which then stays whole and says why."""
    for rule in user:
        if fnmatch.fnmatchcase(name, rule.pattern):
            problem = _misfit(rule.spec, shape, mesh)
            if problem:
                raise ShardingError(f"rule {rule.pattern!r} does not fit param {name!r} {list(shape)}: {problem}")
            return ParamPlacement(name, shape, dtype, rule.spec, f"{rule.pattern} ({rule.origin})")
    for rule in fallback:
        if fnmatch.fnmatchcase(name, rule.pattern):
            problem = _misfit(rule.spec, shape, mesh)
            if problem:
                return ParamPlacement(name, shape, dtype, PartitionSpec(), "", f"replicated: {problem}")
            return ParamPlacement(name, shape, dtype, rule.spec, f"{rule.pattern} ({rule.origin})")
    return ParamPlacement(name, shape, dtype, PartitionSpec(), "")


def _misfit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> str:
    if len(spec) > len(shape):
        return f"the spec {_spec_text(spec)} has {len(spec)} dims, the param {len(shape)}"
    for dim, entry in enumerate(spec):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        if shape[dim] % size:
            return f"dim {dim} ({shape[dim]}) is not divisible by mesh axis {'x'.join(axes)} ({size} devices)"
    return ""


def _axes_of(spec: PartitionSpec) -> list[str]:
    out = []
    for entry in spec:
        out += [entry] if isinstance(entry, str) else list(entry or ())
    return out


def _batch_symbol(graph: Graph) -> str | None:
    """The batch dim: the symbolic dim 0 of the first input (inputs without it are left replicated)."""
    for inp in graph.user_inputs:
        if inp.meta is not None and inp.meta.shape:
            first = inp.meta.shape[0]
            return first if symbolic.is_symbol(first) else None
    return None


def _spec_text(spec: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(e) if e is not None else "None" for e in spec) + ")" if len(spec) else "replicated"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
