"""The interpreter: walks a portable graph and runs each node's lowering on JAX values.

`build(graph)` returns a pure function `run(params, leaves, rng=None) -> (outputs, updates)`:
`leaves` are the flat user inputs, `outputs` the flat user outputs, `updates` the new values of
buffers the graph mutates, keyed by state_dict name. It is traceable: jit, grad, vmap and
jax.export all go through it. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..errors import LoweringError, Torch2JaxError, UnsupportedOpsError
from ..ir import dtypes, symbolic
from ..ir.graph import EXAMPLE_CHECKS, PARAM_KINDS, Graph, Node, TensorMeta
from ..ops import lookup


class LoweringContext:
    """What a `ctx=True` lowering may ask about its node: output dtype/shape and a PRNG key."""

    def __init__(self, node: Node, symbols: dict[str, Any], rng: jax.Array | None, index: int,
                 checks: ExampleChecks | None = None):
        self.node = node
        self._symbols = symbols
        self._rng = rng
        self._index = index
        self._checks = checks

    def check_example(self, dim: Any, actual: Any) -> None:
        """`dim` of the output is a size the conversion took from the example inputs (a count of selected elements):
        `actual`, that count computed from these inputs, must equal it (capture/example_path.py)."""
        if self._checks is not None and isinstance(dim, str):
            self._checks.record(dim, actual)

    @property
    def out_meta(self) -> Any:
        return self.node.meta

    @property
    def out_dtype(self):
        meta = self.node.meta
        if not isinstance(meta, TensorMeta):
            raise LoweringError(f"{self.node.op} expects one tensor output")
        return dtypes.jax_dtype(meta.dtype)

    @property
    def out_shape(self) -> tuple:
        return self.shape_of(self.node.meta)

    def shape_of(self, meta: TensorMeta) -> tuple:
        return tuple(symbolic.evaluate(d, self._symbols) for d in meta.shape)

    def rng(self) -> jax.Array:
        """A key for this node alone: the model's key folded with the node's position."""
        if self._rng is None:
            raise Torch2JaxError(
                f"{self.node.op} (node {self.node.name}) draws random numbers: pass a PRNG key, "
                "e.g. model(x, rng=jax.random.key(0)) or model.apply(params, x, rng=key)"
            )
        return jax.random.fold_in(self._rng, self._index)


def find_unsupported(graph: Graph) -> list[tuple[str, Node]]:
    """Every op without a lowering (subgraphs and ops wrapped by higher-order ops included), with its first node."""
    missing: dict[str, Node] = {}
    for node in graph.all_nodes():
        for op in (node.op, *_wrapped_ops(node)):
            if op not in missing and lookup(op) is None:
                missing[op] = node
    return list(missing.items())


def _wrapped_ops(node: Node) -> list[str]:
    """Ops passed to a higher-order op as arguments (with_effects' op), which need lowerings too."""
    return [a["op"] for a in node.args if isinstance(a, dict) and set(a) == {"op"} and isinstance(a["op"], str)]


def needs_rng(graph: Graph) -> bool:
    from ..ops.random import draws_random

    return any(draws_random(node) for node in graph.all_nodes())


def check_supported(graph: Graph, schemas: dict[str, str] | None = None) -> None:
    """Raise one error listing every unsupported op, with its schema and the user's source line."""
    missing = find_unsupported(graph)
    if missing:
        lines = [f"{len(missing)} op(s) in this model have no JAX lowering yet:"]
        for op, node in missing:
            schema = (schemas or {}).get(op)
            lines.append(f"  - {op} (node {node.name})")
            if schema:
                lines.append(f"      schema: {schema}")
            if node.source:
                lines.append("      at " + "\n         ".join(node.source.strip().splitlines()))
            if not op.startswith(("aten.", "operator.", "higher_order.", "torch.", "math.")):
                lines.append(f"      write its lowering: @torch2jax.register_lowering({_qualified(op)!r})")
        lines.append(
            "Register a lowering with @torch2jax.register_lowering('<op>') (see docs/api.md), "
            "or report the op so it can be added."
        )
        raise UnsupportedOpsError("\n".join(lines), [op for op, _ in missing], graph=graph)


def _qualified(op: str) -> str:
    """`mylib.my_op.default` -> `mylib::my_op` (the form torch.library and register_lowering take)."""
    namespace, name, overload = (op.split(".") + ["default"])[:3]
    return f"{namespace}::{name}" + ("" if overload == "default" else f".{overload}")


def build(graph: Graph, observe: Callable[[Node, Any], None] | None = None) -> Callable:
    """A pure JAX function running `graph`; fails early if any op has no lowering.

    `observe(node, value)`, if given, sees every node's result (used by bisect to compare per node).
    """
    check_supported(graph)
    program = _Program(graph, observe)
    param_inputs = [i for i in graph.inputs if i.kind in PARAM_KINDS]
    user_inputs = graph.user_inputs

    def run(params: dict, leaves: Sequence, rng: jax.Array | None = None):
        if len(leaves) != len(user_inputs):
            raise Torch2JaxError(f"the graph takes {len(user_inputs)} inputs, got {len(leaves)}")
        env: dict[str, Any] = {}
        symbols: dict[str, Any] = {}
        for inp in param_inputs:
            env[inp.name] = params[graph.aliases.get(inp.target, inp.target)]
        _bind(user_inputs, leaves, env, symbols)
        for inp in graph.inputs:
            if inp.kind == "token":
                env[inp.name] = None
        checks = ExampleChecks(graph) if graph.example_values else None
        if checks is not None:
            symbols.update(checks.values)
        program.run_nodes(env, symbols, rng, checks)
        outputs = [decode(o.value, env) for o in graph.user_outputs]
        updates = {o.target: decode(o.value, env) for o in graph.mutations}
        if checks is not None:
            updates[EXAMPLE_CHECKS] = checks.flags()
        return outputs, updates

    return run


def _bind(inputs: Sequence, values: Sequence, env: dict, symbols: dict) -> None:
    """Put input values in `env` and bind the symbolic dims their shapes carry."""
    for inp, value in zip(inputs, values):
        env[inp.name] = value
        if inp.meta is not None and value is not None:
            for dim, actual in zip(inp.meta.shape, jnp.shape(value)):
                if symbolic.is_symbol(dim):
                    symbols.setdefault(dim, actual)


class _Program:
    """One graph's nodes with their lowerings looked up, and its subgraphs (control-flow bodies) alike."""

    def __init__(self, graph: Graph, observe: Callable[[Node, Any], None] | None = None):
        self.graph = graph
        self.observe = observe
        self.lowerings = [lookup(node.op) for node in graph.nodes]
        self.subprograms = {name: _Program(sub) for name, sub in graph.subgraphs.items()}

    def run_nodes(self, env: dict, symbols: dict, rng: jax.Array | None, checks: ExampleChecks | None = None) -> None:
        for index, (node, lowering) in enumerate(zip(self.graph.nodes, self.lowerings)):
            env[node.name] = _run_node(node, lowering, env, symbols, rng, index, self, checks)
            if checks is not None and node.name in checks.defined_at:
                env[node.name] = checks.after(node, env[node.name], env)
            if self.observe is not None:
                self.observe(node, env[node.name])

    def subgraph_function(self, name: str, symbols: dict, rng: jax.Array | None, index: int) -> Callable:
        """Subgraph `name` as a JAX-traceable function of its inputs, returning the list of its outputs.

        Control-flow lowerings hand it to lax.cond / while_loop / scan / map, which trace it. Random
        ops inside get keys derived from the calling node's (the same key on every iteration).
        """
        program = self.subprograms[name]
        key = None if rng is None else jax.random.fold_in(rng, index)

        def call(*values: Any) -> list:
            env: dict[str, Any] = {}
            inner = dict(symbols)
            _bind(program.graph.inputs, values, env, inner)
            program.run_nodes(env, inner, key)
            return [decode(o.value, env) for o in program.graph.outputs]

        return call


def _run_node(node: Node, lowering, env: dict, symbols: dict, rng, index: int, program: _Program,
              checks: ExampleChecks | None = None) -> Any:
    def subgraph(name: str) -> Callable:
        return program.subgraph_function(name, symbols, rng, index)

    args = decode(node.args, env, subgraph)
    kwargs = {key: decode(value, env, subgraph) for key, value in node.kwargs.items()}
    try:
        if lowering.ctx:
            result = lowering.fn(LoweringContext(node, symbols, rng, index, checks), *args, **kwargs)
        else:
            result = lowering.fn(*args, **kwargs)
    except Torch2JaxError:
        raise
    except Exception as err:  # a lowering bug or an unsupported argument: name the node
        shapes = ", ".join(_describe(a) for a in args)
        where = f"\n  at {node.source.strip().splitlines()[-1].strip()}" if node.source else ""
        raise LoweringError(
            f"lowering {node.op} failed on node {node.name} with inputs ({shapes}): "
            f"{type(err).__name__}: {err}{where}",
            node=node,
        ) from err
    return _match_meta(result, node.meta)


# ops whose output size follows from their scalar arguments alone: when such an argument was taken from the example
# (and is checked where it was read), the size needs no check of its own
SIZED_BY_ARGUMENTS = {"aten.slice.Tensor", "aten.narrow.default", "aten.split_with_sizes.default", "aten.arange.start",
                      "aten.arange.default", "aten.arange.start_step"}
# ops that define a value the conversion may take from the example, because their lowering (or ExampleChecks.after)
# checks it at run time (and x[mask], as torch2jax.selected_rows): the others stay refused
# (capture/data_dependent_shapes.py)
CHECKS_EXAMPLE_VALUES = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.repeat_interleave.Tensor",
                         "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
                         *SIZED_BY_ARGUMENTS}


class ExampleChecks:
    """One run's checks that these inputs take the path the conversion took from the example inputs
    (graph.example_values): a flag per entry, returned with the updates under EXAMPLE_CHECKS (runtime/model.py reads
    them). An entry is a value or a condition:

    - a value ({"value": int}) read with `.item()` is compared where it is read and replaced by the example's value, so
      the shapes that depend on it are static; a count of selected elements is compared by its op's lowering
      (ctx.check_example);
    - a condition ({"condition": text}) is torch's runtime assertion of a branch the example took on a value left
      free (a float read with `.item()`): its truth on these inputs."""

    def __init__(self, graph: Graph):
        entries = graph.example_values
        self.keys = list(entries)
        self.values = {key: int(info["value"]) for key, info in entries.items() if "value" in info}
        self.defined_at: dict[str, list[str]] = {}
        for key, info in entries.items():
            self.defined_at.setdefault(info["node"], []).append(key)
        self._flags: dict[str, Any] = {}

    def record(self, symbol: str, actual: Any) -> None:
        if symbol in self.values:
            self._flags[symbol] = jnp.asarray(actual) == self.values[symbol]

    def after(self, node: Node, result: Any, env: dict) -> Any:
        """Check what `node` defines or asserts; a scalar read from a tensor becomes the example's value."""
        for key in self.defined_at[node.name]:
            if key in self._flags:
                continue
            if key not in self.values:  # a condition: the assertion's argument
                self._flags[key] = decode(node.args[0], env)
                continue
            value = self.values[key]
            read = node.meta.get("sym") if isinstance(node.meta, dict) else None
            if read in (key, f"Eq({key}, 1)"):  # an int read with .item(), or a bool (torch's Eq(u, 1))
                if isinstance(result, (bool, int)):
                    self._flags[key] = int(result) == value
                else:
                    self._flags[key] = jnp.asarray(result).astype(jnp.int32) == value
                    result = bool(value) if read != key else value
            elif node.op in SIZED_BY_ARGUMENTS:
                self._flags[key] = True
            else:
                raise LoweringError(
                    f"{node.op} (node {node.name}) makes a tensor whose size ({key} = {value} on the example inputs) "
                    "depends on the input values, and has no lowering that checks it at run time", node=node)
        return result

    def flags(self) -> jax.Array:
        missing = [key for key in self.keys if key not in self._flags]
        if missing:
            raise LoweringError(f"no run-time check for what was taken from the example inputs: {', '.join(missing)}")
        return jnp.stack([jnp.asarray(self._flags[key], jnp.bool_) for key in self.keys])


def _match_meta(value: Any, meta: Any) -> Any:
    """Give each array the dtype torch computed for it (torch's result-dtype rules are the contract)."""
    if isinstance(meta, TensorMeta) and hasattr(value, "dtype"):
        want = dtypes.jax_dtype(meta.dtype)
        if value.dtype != want:
            return value.astype(want)
        return value
    if isinstance(meta, list) and isinstance(value, (list, tuple)) and len(meta) == len(value):
        return type(value)(_match_meta(v, m) for v, m in zip(value, meta))
    return value


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)) and value and all(hasattr(v, "shape") for v in value):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    return repr(value)


def decode(value: Any, env: dict, subgraph: Callable[[str], Callable] | None = None) -> Any:
    """Turn an encoded argument into the python/JAX value a lowering receives.

    `subgraph(name)` turns a {"subgraph": name} argument into a callable (control-flow branches).
    """
    if isinstance(value, list):
        return [decode(v, env, subgraph) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (key, item), = value.items()
            if key == "ref":
                return env[item]
            if key == "subgraph" and subgraph is not None:
                return subgraph(item)
            if key == "dtype":
                return dtypes.jax_dtype(item)
            if key == "float":
                return float(item)
            if key in ("device", "layout", "memory_format"):
                return item
        return {k: decode(v, env, subgraph) for k, v in value.items()}
    return value
