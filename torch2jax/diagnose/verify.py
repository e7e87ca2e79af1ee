"""Numerical verification (convert half): run torch and a converted/loaded model on the same inputs.

Inputs: the example inputs, random inputs of the same shapes (a model that only works on the
example values cannot pass), and random inputs with every symbolic dim at a second size (nor can
an artifact that only works at the traced size).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

from ..capture.exporter import plain_containers
from ..capture.torch_arrays import to_numpy, to_torch
from ..errors import ExamplePathError, VerificationError
from ..ir import structure
from ..ir.graph import Graph
from ..lowering import interpreter
from ..runtime.collector import existing_objects_frozen
from ..runtime.model import Model

# A float32 output beyond tolerance is judged against torch's own float64 run up to this many params (a copy of the
# module in float64 is made): see _judge_against_float64.
FLOAT64_REFERENCE_MAX_PARAMS = 50_000_000

# (rtol, atol) by dtype of the torch output: float32 as a float32 model should match
TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


@dataclass
class OutputCheck:
    path: str
    dtype: str
    shape: tuple
    max_abs: float
    max_rel: float
    passed: bool
    note: str = ""  # why it passes although beyond tolerance (as close to float64 as torch's own float32 result)


@dataclass
class Run:
    label: str
    outputs: list[OutputCheck] = field(default_factory=list)
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


@dataclass
class Report:
    runs: list[Run]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.runs)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for r in self.runs for o in r.outputs if o.max_abs == o.max_abs), default=0.0)  # NaN: not compared

    def summary(self) -> str:
        """The report as text, one line per output (the CLI, error messages)."""
        return "\n".join(self.lines())

    def lines(self, markdown: bool = False) -> list[str]:
        """The report one output a line: indented text, or a markdown table with each tolerance (--report files)."""
        lines = list(_TABLE_HEAD) if markdown else []
        for run in self.runs:
            if run.skipped:
                lines.append(f"| {run.label} | skipped: {run.skipped} | | | | | | |" if markdown
                             else f"  {run.label}: skipped ({run.skipped})")
                continue
            lines += [_table_row(run.label, o) if markdown else _text_line(run.label, o) for o in run.outputs]
        return lines


_TABLE_HEAD = (
    "| inputs | output | dtype | shape | max abs err | max rel err | tolerance (rtol, atol) | ok |",
    "|---|---|---|---|---|---|---|---|",
)


def _text_line(label: str, o: OutputCheck) -> str:
    mark = "ok " if o.passed else "FAIL"
    where = f"{label} {o.path} {o.dtype}{list(o.shape)}"
    errors = "values not compared" if o.max_abs != o.max_abs else f"max abs err {o.max_abs:.3g}, max rel err {o.max_rel:.3g}"
    return f"  {mark} {where} {errors}" + (f" ({o.note})" if o.note else "")


def _table_row(label: str, o: OutputCheck) -> str:
    rtol, atol = TOLERANCES.get(o.dtype, (0.0, 0.0))
    mark = "yes" if o.passed else "**NO**"
    errors = f"{o.max_abs:.3g} | {o.max_rel:.3g} | {rtol:g}, {atol:g}"
    return f"| {label} | {o.path} | {o.dtype} | {list(o.shape)} | {errors} | {mark} |"


@existing_objects_frozen()
def verify(module: torch.nn.Module, model: Model, args: tuple, kwargs: dict, seed: int = 0) -> Report:
    """Compare `model` with `module` on the example inputs, fresh random inputs of the same shapes,
    and a second size of each symbolic dim."""
    runs = [_compare("example inputs", module, model, args, kwargs)]
    for extra in (random_inputs(model.graph, args, kwargs, seed), second_size_inputs(model.graph, args, kwargs, seed)):
        if extra is None:
            continue
        label, new_args, new_kwargs = extra
        try:
            runs.append(_compare(label, module, model, new_args, new_kwargs))
        except _TorchFailed as err:
            runs.append(Run(label, skipped=f"torch itself fails on these inputs: {err}"))
        except ExamplePathError as err:  # a model converted along the example's path refuses inputs off it, as it must
            runs.append(Run(label, skipped=f"these inputs take another path than the example's, which the model refuses "
                                           f"({len(err.failed)} value(s) differ)"))
    return Report(runs)


def check(report: Report) -> None:
    if not report.passed:
        raise VerificationError("the converted model's outputs differ from PyTorch's beyond tolerance:\n" + report.summary())


class _TorchFailed(Exception):
    pass


def _fresh(tree: Any) -> Any:
    """Copies of the tensors in `tree`: each run (torch's, torch's float64 one) gets its own, so that a forward that
    writes into its inputs leaves the others' values, and the converted model's, as the caller gave them."""
    return pytree.tree_map_only(torch.Tensor, torch.clone, tree)


def _compare(label: str, module, model: Model, args: tuple, kwargs: dict) -> Run:
    with torch.no_grad():
        try:
            expected = module(*_fresh(args), **_fresh(kwargs))
        except Exception as err:
            raise _TorchFailed(str(err).splitlines()[0] if str(err) else type(err).__name__) from err
    np_args = pytree.tree_map_only(torch.Tensor, to_numpy, args)
    np_kwargs = pytree.tree_map_only(torch.Tensor, to_numpy, kwargs)
    random = interpreter.needs_rng(model.graph)
    if random:  # torch's and JAX's random streams differ: compare what does not depend on the draw
        label = f"{label} [random ops: shapes and dtypes compared, not values]"
        got = model(*np_args, rng=jax.random.key(0), **np_kwargs)
    else:
        got = model(*np_args, **np_kwargs)
    want_leaves, _ = pytree.tree_flatten(plain_containers(expected))  # as the converter saw it (a KV cache as tensors)
    want_leaves = [w for w in want_leaves if isinstance(w, torch.Tensor)]
    got_leaves = [g for g in pytree.tree_flatten(_as_torch_tree(got))[0] if isinstance(g, torch.Tensor)]
    run = Run(label)
    names = [n for n, g in zip(structure.leaf_paths(model.graph.out_spec), pytree.tree_flatten(_as_torch_tree(got))[0])
             if isinstance(g, torch.Tensor)]
    for name, want, have in zip(names, want_leaves, got_leaves):
        run.outputs.append(_check_layout(name, want, have) if random else _check_output(name, want, have))
    if len(want_leaves) != len(got_leaves):
        run.outputs.append(OutputCheck("structure", "-", (), float("inf"), float("inf"), False))
    elif not random and not run.passed:
        _judge_against_float64(run, module, args, kwargs, want_leaves, got_leaves)
    return run


def _judge_against_float64(run: Run, module, args: tuple, kwargs: dict, want: list, have: list) -> None:
    """A float32 output beyond tolerance passes when it is as close to the float64 answer (the module run in float64
    by torch) as torch's own float32 result: at most 2x torch's error, in the largest and in the mean. There the
    model is ill-conditioned (a layer norm over near-constant rows amplifies rounding), not mis-converted; torch's
    float32 result is no nearer the true one than ours. A wrong lowering stays far from float64 and still fails."""
    failing = [i for i, o in enumerate(run.outputs) if not o.passed and o.dtype == "float32"]
    if not failing or sum(p.numel() for p in module.parameters()) > FLOAT64_REFERENCE_MAX_PARAMS:
        return
    widen = lambda t: t.to(torch.float64) if t.is_floating_point() else t  # noqa: E731
    try:
        exact = copy.deepcopy(module).to(torch.float64)
        with torch.no_grad():
            reference = exact(*pytree.tree_map_only(torch.Tensor, widen, _fresh(args)),
                              **pytree.tree_map_only(torch.Tensor, widen, _fresh(kwargs)))
    except Exception:  # noqa: BLE001 - a module torch cannot run in float64 keeps its verdict
        return
    exact_leaves = [leaf for leaf in pytree.tree_flatten(reference)[0] if isinstance(leaf, torch.Tensor)]
    if len(exact_leaves) != len(want):
        return
    for i in failing:
        exact_leaf, torch_leaf, ours = exact_leaves[i].to(torch.float64), want[i].to(torch.float64), have[i].to(torch.float64)
        if not (exact_leaf.shape == torch_leaf.shape == ours.shape) or not bool(torch.isfinite(exact_leaf).all()):
            continue
        torch_err, our_err = (torch_leaf - exact_leaf).abs(), (ours - exact_leaf).abs()
        if not bool(torch.isfinite(our_err).all()):
            continue
        if our_err.max() <= 2 * torch_err.max() and our_err.mean() <= 2 * torch_err.mean():
            note = (f"as close to torch's float64 result as torch's float32 one: max err {float(our_err.max()):.3g}, "
                    f"torch's {float(torch_err.max()):.3g}")
            run.outputs[i] = replace(run.outputs[i], passed=True, note=note)


def _as_torch_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_torch_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_torch_tree(v) for v in value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return to_torch(np.asarray(value))
    return value


def _check_layout(path: str, want: torch.Tensor, have: torch.Tensor) -> OutputCheck:
    """For outputs of random graphs: the same shape and dtype (int64/float64 as carried without x64)."""
    dtype = str(want.dtype).removeprefix("torch.")
    same_dtype = have.dtype == want.dtype or (want.dtype, have.dtype) in _NARROWED
    passed = tuple(have.shape) == tuple(want.shape) and same_dtype
    return OutputCheck(path, dtype, tuple(want.shape), float("nan"), float("nan"), passed)


_NARROWED = {(torch.int64, torch.int32), (torch.float64, torch.float32), (torch.complex128, torch.complex64)}


def _check_output(path: str, want: torch.Tensor, have: torch.Tensor) -> OutputCheck:
    dtype = str(want.dtype).removeprefix("torch.")
    shape = tuple(want.shape)
    if tuple(have.shape) != shape:
        return OutputCheck(f"{path} (shape {list(have.shape)})", dtype, shape, float("inf"), float("inf"), False)
    w = want.detach().to(torch.float64)
    h = have.to(torch.float64)
    # NaNs and infinities must sit in the same places; the rest is compared numerically
    special_ok = bool((torch.isnan(w) == torch.isnan(h)).all()) and bool((torch.isinf(w) == torch.isinf(h)).all())
    special_ok = special_ok and bool((w[torch.isinf(w)] == h[torch.isinf(w)]).all())
    finite = torch.isfinite(w) & torch.isfinite(h)
    diff = (w - h).abs()[finite]
    if diff.numel() == 0:
        return OutputCheck(path, dtype, shape, 0.0, 0.0, special_ok)
    scale = w.abs()[finite]
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    within = bool((diff <= atol + rtol * scale).all())
    max_rel = float((diff / scale.clamp_min(max(atol, 1e-12))).max())  # relative to |torch|, floored at atol
    return OutputCheck(path, dtype, shape, float(diff.max()), max_rel, within and special_ok)


def random_inputs(graph: Graph, args: tuple, kwargs: dict, seed: int) -> tuple[str, tuple, dict] | None:
    """Fresh random inputs of the example shapes: catches a model that only works on the example values."""
    return _resampled(graph, args, kwargs, {}, seed, "random inputs")


def second_size_inputs(graph: Graph, args: tuple, kwargs: dict, seed: int) -> tuple[str, tuple, dict] | None:
    """The example inputs with every symbolic dim moved to another size in its declared range."""
    current: dict[str, int] = {}
    for inp, tensor in _user_tensors(graph, args, kwargs) or []:
        if inp.meta is None:
            continue
        for dim, size in zip(inp.meta.shape, tensor.shape):
            if isinstance(dim, str) and dim.isidentifier():
                current.setdefault(dim, int(size))
    new_sizes = {}
    for name, size in current.items():
        bounds = graph.symbols.get(name, {})
        hi = bounds.get("max")
        lo = max(bounds.get("min") or 1, 1)
        candidate = size + 1 if hi is None or size + 1 <= hi else size - 1
        if candidate < lo:
            continue
        new_sizes[name] = candidate
    if not new_sizes:
        return None
    label = "second size (" + ", ".join(f"{k}={v}" for k, v in new_sizes.items()) + ")"
    return _resampled(graph, args, kwargs, new_sizes, seed + 1, label)


def _user_tensors(graph: Graph, args: tuple, kwargs: dict) -> list | None:
    tensors = [x for x in pytree.tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    inputs = [inp for inp in graph.user_inputs if not (inp.baked and inp.meta is None)]  # python values stay as they are
    return list(zip(inputs, tensors)) if len(tensors) == len(inputs) else None


def _resampled(graph: Graph, args: tuple, kwargs: dict, new_sizes: dict[str, int], seed: int, label: str):
    """New inputs like the examples, with symbolic dims resized per `new_sizes`; None if they can't be matched."""
    pairs = _user_tensors(graph, args, kwargs)
    if pairs is None:
        return None
    gen = torch.Generator().manual_seed(seed)
    flat, spec = pytree.tree_flatten((args, kwargs))
    pair_iter = iter(pairs)
    resized = []
    for leaf in flat:
        if not isinstance(leaf, torch.Tensor):
            resized.append(leaf)
            continue
        inp, tensor = next(pair_iter)
        if inp.baked:  # a tensor input fixed to its example value: the model takes no other
            resized.append(tensor)
            continue
        dims = inp.meta.shape if inp.meta else list(tensor.shape)
        shape = [new_sizes.get(d, s) if isinstance(d, str) else s for d, s in zip(dims, tensor.shape)]
        resized.append(_like(tensor, shape, gen))
    new_args, new_kwargs = pytree.tree_unflatten(resized, spec)
    return label, tuple(new_args), dict(new_kwargs)


def _like(tensor: torch.Tensor, shape: list[int], gen: torch.Generator) -> torch.Tensor:
    """A tensor of a new shape with values like the example's: floats random, others drawn from it."""
    if tensor.is_floating_point():
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(tensor.dtype)
    pool = tensor.reshape(-1)
    if pool.numel() == 0:
        return torch.zeros(shape, dtype=tensor.dtype)
    picks = torch.randint(0, pool.numel(), shape, generator=gen)
    return pool[picks]
