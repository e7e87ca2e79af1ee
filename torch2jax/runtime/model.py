"""The model users hold: from `convert` (in memory) or `load` (from an artifact). Torch-free.

    model(*inputs, **kw)                 bound call on model.params, jit-compiled once per input shape
    model.apply(params, *inputs, **kw)   pure and traceable: jit, grad, vmap, shard
    model.params                         the params pytree, keyed by state_dict names

Inputs are checked against the graph's signature before anything runs, so a wrong count,
dtype, shape or structure fails with a message naming the input, not deep inside XLA. A bound
call runs those checks while jax traces it, that is once per distinct input signature (structure,
dtypes, shapes): every later call with that signature is one jax.jit dispatch and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ExamplePathError, SignatureError, Torch2JaxError
from ..ir import dtypes, structure, symbolic
from ..ir.graph import EXAMPLE_CHECKS, Graph, TensorMeta
from .sharding import ShardingPlan

# run(params, leaves, rng) -> (flat user outputs, {mutated buffer name: new value})
RunFn = Callable[[dict, list, Any], tuple[list, dict]]


class Model:
    """A converted model: a pure function of (params, inputs) and the params it was converted with."""

    def __init__(self, run: RunFn, params: dict, graph: Graph, manifest: dict | None = None, backend: str = "graph"):
        self._run = run
        self.params = params
        self.graph = graph
        self.manifest = manifest
        self.backend = backend  # "graph" (interpreted portable graph) or "exported" (StableHLO)
        self.sharding: ShardingPlan | None = None  # set when loaded onto a mesh, before the first call
        # the source model's own tensor-parallel plan ({module pattern: "colwise" | "rowwise" | ...}, transformers'
        # base_model_tp_plan), saved in the manifest to seed sharding="auto" at load time
        self.sharding_hints: dict[str, str] = {}
        # weight-only quantization (runtime/quantize.py): scheme, which params, bytes before and after; {} if none
        self.quantization: dict[str, Any] = {}
        self._jitted = jax.jit(self._checked_call)
        self._jitted_tensors = jax.jit(self._tensors_call)

    # -- public API -------------------------------------------------------------------------
    def apply(self, params: dict, *args: Any, rng: jax.Array | None = None, mutable: bool = False, **kwargs: Any) -> Any:
        """Run the model on `params`. Pure and traceable.

        With `mutable=True` returns `(outputs, updates)` where `updates` maps each buffer the
        forward pass mutates (e.g. BatchNorm running stats in train mode) to its new value.
        """
        leaves = check_inputs(self.graph, flatten_inputs(self.graph, args, kwargs))
        outputs, updates = self._run(params, leaves, rng)
        updates = self._checked_example_path(updates)
        return self._finish(outputs, updates, mutable)

    def example_checks(self, params: dict, *args: Any, rng: jax.Array | None = None, **kwargs: Any) -> jax.Array:
        """For a model converted along its example inputs' path (graph.example_values): a bool per value or condition
        taken from the example, True where these inputs give the same. Pure and traceable, for code that runs `apply`
        under its own jit, where the check cannot raise: `jnp.all(model.example_checks(params, x))`. Empty otherwise."""
        leaves = check_inputs(self.graph, flatten_inputs(self.graph, args, kwargs))
        _outputs, updates = self._run(params, leaves, rng)
        return updates.get(EXAMPLE_CHECKS, jnp.ones((0,), jnp.bool_))

    def __call__(self, *args: Any, rng: jax.Array | None = None, **kwargs: Any) -> Any:
        """Run on `self.params` (compiled once per input shape); mutated buffers update `self.params`."""
        python = [inp.baked and inp.meta is None for inp in self.graph.user_inputs]
        if any(inp.baked for inp in self.graph.user_inputs):  # python values are checked here, where they are not traced
            check_inputs(self.graph, flatten_inputs(self.graph, args, kwargs), baked_only=True)
            kwargs = with_baked_defaults(self.graph, kwargs)
        try:
            if any(python):  # jit takes no strings: the baked python values stay out of its arguments
                leaves = flatten_inputs(self.graph, args, kwargs)
                tensors = [leaf for leaf, baked in zip(leaves, python) if not baked]
                outputs, updates = self._jitted_tensors(self.params, tensors, rng)
            else:
                outputs, updates = self._jitted(self.params, args, kwargs, rng)
        except TypeError:
            # jax refused an argument before tracing it (a string, an arbitrary object): name the input
            check_inputs(self.graph, flatten_inputs(self.graph, args, kwargs))
            raise
        updates = self._checked_example_path(updates)
        if updates:
            self.params = {**self.params, **updates}
        # python values the graph returns as they are (a model's spatial sizes as ints), not as jit's arrays
        outputs = [o.value if isinstance(o.value, (bool, int, float)) else value for o, value in zip(self.graph.user_outputs, outputs)]
        # rebuilt here, not inside jit: jax would return a dict output with its keys sorted, not in the module's order
        return structure.unflatten(self.graph.out_spec, outputs)

    def call_flat(self, leaves: list, rng: jax.Array | None = None) -> Any:
        """Call on flat inputs in graph order (the order manifest["inputs"] lists them)."""
        leaves, inputs = list(leaves), self.graph.user_inputs
        if len(leaves) == sum(not inp.baked for inp in inputs) < len(inputs):  # the baked python values go back in place
            tensors = iter(leaves)
            leaves = [baked_leaf(inp) if inp.baked else next(tensors) for inp in inputs]
        args, kwargs = structure.unflatten(self.graph.in_spec, leaves)
        return self(*args, rng=rng, **kwargs)

    def state_dict(self, params: dict | None = None) -> dict[str, np.ndarray]:
        """`params` (default: self.params) as numpy arrays under every state_dict name, tied names included.

        Load them back into the torch module with
        `module.load_state_dict({k: torch.from_numpy(v) for k, v in jm.state_dict().items()})`.
        """
        params = self.params if params is None else params
        out = {name: np.asarray(value) for name, value in params.items()}
        for alias, kept in self.graph.aliases.items():
            out[alias] = out[kept]
        return out

    def sharding_report(self, *args: Any, **kwargs: Any) -> Any:
        """Each param's PartitionSpec and bytes per device on the mesh, and the collectives of the compiled
        call on these inputs (default: zeros shaped like the signature, batch a multiple of the data axis)."""
        if self.sharding is None:
            raise Torch2JaxError("this model is not on a mesh: load it with torch2jax.load(path, mesh=mesh)")
        return self.sharding.report_for(self, args, kwargs)

    @property
    def needs_rng(self) -> bool:
        """Whether the graph draws random numbers, so that calls need `rng=`."""
        from ..lowering.interpreter import needs_rng

        return needs_rng(self.graph)

    @property
    def signature(self) -> str:
        """A one-line description of the inputs, e.g. `(x: float32[batch, 3, 32, 32])`."""
        return _signature_of(self.graph)

    def __repr__(self) -> str:
        count = sum(int(np.prod(np.shape(p))) for p in jax.tree.leaves(self.params))
        return f"<torch2jax.Model {self.signature} params={count:,} backend={self.backend}>"

    # -- internals ---------------------------------------------------------------------------
    def _checked_call(self, params: dict, args: tuple, kwargs: dict, rng: Any) -> tuple[list, dict]:
        """The traced body of `__call__`: the input checks, then the run (flat outputs, updates)."""
        leaves = check_inputs(self.graph, flatten_inputs(self.graph, args, kwargs))
        if self.sharding is not None:
            leaves = self.sharding.constrain_inputs(self.graph, leaves)
        return self._run(params, leaves, rng)

    def _tensors_call(self, params: dict, tensors: list, rng: Any) -> tuple[list, dict]:
        """`_checked_call` on the call's array inputs, the baked python values put back in place as constants."""
        arrays = iter(tensors)
        leaves = [baked_leaf(inp) if inp.baked and inp.meta is None else next(arrays) for inp in self.graph.user_inputs]
        args, kwargs = structure.unflatten(self.graph.in_spec, leaves)
        return self._checked_call(params, args, kwargs, rng)

    def _checked_example_path(self, updates: dict) -> dict:
        """`updates` less the flags of a model converted along its example inputs' path (capture/example_path.py);
        raises if these inputs gave another value than the example at any place the model reads one. Under the
        caller's own jit the flags are not known yet and are dropped (docs/limitations.md)."""
        if EXAMPLE_CHECKS not in updates:
            return updates
        updates = dict(updates)
        flags = updates.pop(EXAMPLE_CHECKS)
        if isinstance(flags, jax.core.Tracer):
            return updates
        flags = np.asarray(flags)
        if not flags.all():
            raise ExamplePathError(self.graph.example_values, flags, draws_random=self.needs_rng)
        return updates

    def _finish(self, outputs: list, updates: dict, mutable: bool) -> Any:
        result = structure.unflatten(self.graph.out_spec, outputs)
        if mutable:
            return result, updates
        if updates:
            names = ", ".join(sorted(updates))
            raise Torch2JaxError(
                f"this model updates buffers in its forward pass ({names}); call "
                "model.apply(params, ..., mutable=True) to get (outputs, updates), or call the model "
                "directly to update model.params in place"
            )
        return result


def flatten_inputs(graph: Graph, args: tuple, kwargs: dict) -> list:
    """The call's leaves in graph order; a missing or unexpected input is named with its signature."""
    spec = graph.in_spec
    kwargs = with_baked_defaults(graph, kwargs)
    if spec.get("type") == "tuple" and len(spec.get("children", [])) == 2:
        _check_arity(graph, tuple(args), dict(kwargs))
    return structure.flatten((tuple(args), dict(kwargs)), spec, "inputs")


def with_baked_defaults(graph: Graph, kwargs: dict) -> dict:
    """`kwargs` with the baked python keyword inputs the call leaves out set to their baked values."""
    spec = graph.in_spec
    if spec.get("type") != "tuple" or len(spec.get("children", [])) != 2 or spec["children"][1].get("type") != "dict":
        return kwargs
    keys = spec["children"][1].get("keys", [])
    missing = {inp.name: baked_leaf(inp) for inp in graph.user_inputs if inp.baked and inp.name in keys and inp.name not in kwargs}
    return {**kwargs, **missing} if missing else kwargs


def baked_leaf(inp: Any) -> Any:
    """A baked input's value as a call passes it: the python value, or a fixed tensor input's array."""
    return np.asarray(inp.value, dtypes.jax_dtype(inp.meta.dtype)) if inp.meta is not None else inp.value


def _check_arity(graph: Graph, args: tuple, kwargs: dict) -> None:
    args_spec, kwargs_spec = graph.in_spec["children"]
    positional = args_spec.get("children", [])
    keywords = list(kwargs_spec.get("keys", [])) if kwargs_spec.get("type") == "dict" else []
    described = iter(_describe_inputs(graph))
    by_position = [_take(described, structure.count_leaves(child)) for child in positional]
    by_keyword = {key: _take(described, structure.count_leaves(child)) for key, child in zip(keywords, kwargs_spec.get("children", []))}
    takes = f"the model takes {_signature_of(graph)}"
    if len(args) < len(positional):
        missing = "; ".join(by_position[len(args) :])
        raise SignatureError(f"missing input {missing}: {takes}")
    if len(args) > len(positional):
        raise SignatureError(f"unexpected input: {len(args)} positional inputs given, {takes}")
    unexpected = [key for key in kwargs if key not in by_keyword]
    if unexpected:
        raise SignatureError(f"unexpected keyword input {', '.join(repr(k) for k in unexpected)}: {takes}")
    absent = [key for key in by_keyword if key not in kwargs]
    if absent:
        raise SignatureError(f"missing keyword input {'; '.join(by_keyword[k] for k in absent)}: {takes}")


def _describe_inputs(graph: Graph) -> list[str]:
    return [f"{inp.name!r} ({_describe_input(inp)})" for inp in graph.user_inputs]


def _take(described, count: int) -> str:
    return ", ".join(next(described, "?") for _ in range(count)) or "(no tensors)"


def _signature_of(graph: Graph) -> str:
    return "(" + ", ".join(f"{inp.name}: {_describe_input(inp)}" for inp in graph.user_inputs) + ")"


def _describe_input(inp: Any) -> str:
    return f"{inp.value!r} (fixed at conversion)" if inp.baked else _describe_meta(inp.meta)


def check_inputs(graph: Graph, leaves: list, baked_only: bool = False) -> list:
    """Convert leaves to arrays and check them against the graph's input metadata (with `baked_only`, only the
    python values the graph was specialized on)."""
    inputs = graph.user_inputs
    if len(leaves) != len(inputs):
        names = ", ".join(i.name for i in inputs)
        raise SignatureError(f"expected {len(inputs)} inputs ({names}), got {len(leaves)}")
    bound: dict[str, tuple[int, str]] = {}
    checked = []
    for inp, value in zip(inputs, leaves):
        meta = inp.meta
        if inp.baked and not isinstance(value, jax.core.Tracer) and not _same_constant(value, inp.value):
            if meta is not None:
                raise SignatureError(
                    f"input {inp.name!r} was fixed to its example value {inp.value} when the model was converted (its "
                    f"values decide shapes); got {np.asarray(value).tolist()}: convert again with that value as the example")
            raise SignatureError(
                f"input {inp.name!r} was {inp.value!r} when the model was converted, and torch.export fixed the graph "
                f"to that value; got {value!r}: convert again with {inp.name}={value!r} for that behaviour")
        if meta is None or baked_only:
            checked.append(value)
            continue
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            if isinstance(value, (np.generic, int, float, bool, list, tuple)):
                value = jnp.asarray(value)
            else:
                raise SignatureError(f"input {inp.name!r} must be an array ({_describe_meta(meta)}), got {type(value).__name__}")
        want = dtypes.jax_dtype(meta.dtype)
        if isinstance(value, np.ndarray):
            value = jnp.asarray(value)
        if value.dtype != want:
            raise SignatureError(
                f"input {inp.name!r} expects dtype {meta.dtype}, got {value.dtype}; "
                f"cast it first (e.g. x.astype('{want.name}'))"
            )
        _check_shape(inp.name, meta, tuple(value.shape), bound, graph.symbols)
        checked.append(value)
    return checked


def _check_shape(name: str, meta: TensorMeta, shape: tuple, bound: dict, ranges: dict) -> None:
    expected = _describe_meta(meta)
    if len(shape) != len(meta.shape):
        raise SignatureError(f"input {name!r} expects rank {len(meta.shape)} ({expected}), got shape {list(shape)}")
    for axis, (dim, actual) in enumerate(zip(meta.shape, shape)):
        if not isinstance(actual, int):
            continue  # symbolic (under jax.export tracing): jax checks it
        if isinstance(dim, int):
            if dim != actual:
                raise SignatureError(f"input {name!r} expects {expected}, got shape {list(shape)} (axis {axis} must be {dim})")
        elif symbolic.is_symbol(dim):
            if dim in bound and bound[dim][0] != actual:
                other_value, other = bound[dim]
                raise SignatureError(
                    f"input {name!r} axis {axis} is dim {dim!r} = {actual}, but {other} gave {dim} = {other_value}"
                )
            bound.setdefault(dim, (actual, f"input {name!r}"))
            lo, hi = ranges.get(dim, {}).get("min"), ranges.get(dim, {}).get("max")
            if (lo is not None and actual < lo) or (hi is not None and actual > hi):
                raise SignatureError(
                    f"input {name!r} axis {axis} is dim {dim!r} = {actual}, outside its declared range "
                    f"[{lo}, {'inf' if hi is None else hi}]"
                )


def _same_constant(value: Any, baked: Any) -> bool:
    """Whether a call's value is the one baked in: bools, strings and None by type and value, numbers by value, a
    fixed tensor input (baked as nested lists) by shape and values."""
    if isinstance(baked, list):
        try:
            array = np.asarray(value)
        except Exception:  # an object that is no array at all
            return False
        expected = np.asarray(baked)
        return array.shape == expected.shape and bool(np.array_equal(array, expected))
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        if np.ndim(value) != 0:
            return False
        value = value.item()
    if any(isinstance(v, (bool, str)) or v is None for v in (value, baked)):
        return type(value) is type(baked) and value == baked
    return isinstance(value, (int, float)) and value == baked


def _describe_meta(meta: TensorMeta | None) -> str:
    if meta is None:
        return "python value"
    return f"{meta.dtype}[{', '.join(str(d) for d in meta.shape)}]"
