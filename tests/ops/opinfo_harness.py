"""Run one OpInfo sample through torch.export -> torch2jax -> jax.jit and compare with torch eager."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np
import torch
from torch.testing._internal import common_utils as _common_utils
from torch.testing._internal.opinfo import core as _opinfo_core

from torch2jax.capture import decomposition, exporter
from torch2jax.capture.fx import capture, dtype_name
from torch2jax.capture.torch_arrays import to_jax, to_numpy
from torch2jax.errors import ExportError, InputMutationWarning, UnsupportedOpsError
from torch2jax.ir import dtypes
from torch2jax.lowering import interpreter
from torch2jax.runtime.model import Model

# OpInfo's sample_inputs looks for the unittest.TestCase running it by walking the whole call stack with source
# lookups (inspect.stack), a third of a small op's case; these tests are no TestCases, so it always finds none
_common_utils.extract_test_fn = _opinfo_core.extract_test_fn = lambda: None

SAMPLES_PER_OP = int(os.environ.get("T2J_OPINFO_SAMPLES", "1"))  # 0 = every sample (make test-ops-full)
CAPPED_TORCH_LIMITS = 20  # a capped run stops looking for a sample torch can run after this many torch limits


class TorchLimit(Exception):
    """torch.export itself cannot export this sample: torch's limit, not ours."""


class Refused(Exception):
    """Not converted by design: the op's output shape depends on the input values (docs/limitations.md)."""


@dataclass
class SampleTally:
    """What one case's samples did, for the report (record_property "samples") and the verdict."""

    ran: int = 0
    failures: list = field(default_factory=list)  # (sample index, exception)
    refused: list = field(default_factory=list)
    torch_limits: list = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"passed": self.ran, "failed": len(self.failures), "refused": len(self.refused),
                "torch-limit": len(self.torch_limits)}


def run_samples(opinfo, dtype, check: Callable[[Prepared], None]) -> SampleTally:
    """Every sample of the case up to the quota through `check` (one way: export, eager or compile), which
    raises TorchLimit for torch's own limit, Refused for a by-design refusal, anything else for a failure.
    A failing sample does not stop the others, so the report counts samples."""
    torch.manual_seed(0)
    tally = SampleTally()
    for index, sample in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
        if SAMPLES_PER_OP and (tally.ran + len(tally.failures) + len(tally.refused) >= SAMPLES_PER_OP
                               or len(tally.torch_limits) >= CAPPED_TORCH_LIMITS):
            break  # e.g. an op torch.export rejects sample after sample (gaussian_nll_loss: 324 of 324, 15 s)
        try:
            prepared = prepare(opinfo, sample)
        except Exception as err:  # the sample itself fails in torch eager
            tally.torch_limits.append(f"eager: {err}")
            continue
        try:
            check(prepared)
        except TorchLimit as err:
            tally.torch_limits.append(str(err))
        except Refused as err:
            tally.refused.append(str(err))
        except Exception as err:
            tally.failures.append((index, err))
        else:
            tally.ran += 1
    return tally


def verdict(tally: SampleTally, record_property, limit: str, refusal: str) -> None:
    """Record the counts; fail with the first failure; skip (saying why) when no sample ran."""
    import pytest

    record_property("samples", tally.counts())
    if tally.failures:
        index, first = tally.failures[0]
        raise AssertionError(f"{len(tally.failures)} of {tally.ran + len(tally.failures)} samples failed; sample {index}: "
                             f"{type(first).__name__}: {first}") from first
    if tally.ran == 0 and tally.refused:
        pytest.skip(f"{refusal} ({tally.refused[0]})")
    if tally.ran == 0:
        pytest.skip(f"{limit}: " + (tally.torch_limits[0] if tally.torch_limits else "no samples"))


def refuse_value_dependent(err: UnsupportedOpsError) -> None:
    """A converter refusal of a value-dependent shape is by design (Refused); any other missing op is a failure."""
    if "depends on the input values" in str(err):
        raise Refused(", ".join(err.ops)) from None
    raise err


@dataclass
class Prepared:
    module: torch.nn.Module
    inputs: tuple
    expected: object
    case_id: str = ""
    sample: object = None  # the OpInfo SampleInput, for comparisons that need the op's arguments


class CallFn(torch.nn.Module):
    """A module whose forward calls `fn` on its tensor inputs: one op (or a small function) to convert."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *tensors):
        return self.fn(*tensors)


class _OpModule(torch.nn.Module):
    """Calls the op with the sample's tensors as inputs and its other arguments baked in.

    An op that writes to its inputs (`uniform_`, training batch norm's running stats, ...) gets
    copies of those inputs, returned after its output: a converted function cannot write into its
    inputs (JAX arrays are immutable; the converter drops such writes with a warning), so the op's
    in-place effect is checked as an output.
    """

    def __init__(self, op, template, written: tuple[int, ...] = ()):
        super().__init__()
        self.op = op
        self.template = template
        self.written = written

    def forward(self, *tensors):
        tensors = tuple(t.clone() if i in self.written else t for i, t in enumerate(tensors))
        args, kwargs = _fill(self.template, iter(tensors))
        out = self.op(*args, **kwargs)
        # torch.return_types (max.dim, sort, topk, ...) are structseqs: compare them as plain tuples
        out = tuple(out) if isinstance(out, tuple) and type(out).__module__ == "torch.return_types" else out
        return (out, *(tensors[i] for i in self.written)) if self.written else out


def _split(value, tensors: list):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot()
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _split(v, tensors) for k, v in value.items()}
    return value


class _Slot:
    pass


def _fill(value, it):
    if isinstance(value, _Slot):
        return next(it)
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, it) for v in value)
    if isinstance(value, dict):
        return {k: _fill(v, it) for k, v in value.items()}
    return value


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.layout != torch.strided:  # sparse inputs: not written in place by any OpInfo sample
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def case_id(opinfo) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def prepare(opinfo, sample, copy_all_inputs: bool = False) -> Prepared:
    """The op as a module, its tensor inputs and torch's result. Inputs the op writes to are given
    as copies and returned (found by running it once; `copy_all_inputs` when that run cannot tell,
    e.g. batch norm's kernel updating its running stats to the values they had)."""
    tensors: list = []
    template = _split(((sample.input, *sample.args), dict(sample.kwargs)), tensors)
    probe = [t.detach().clone() for t in tensors]
    versions = [t._version for t in probe]
    with torch.no_grad():
        _OpModule(opinfo.op, template)(*probe)
    # some kernels (batch norm's running stats) write without bumping the version counter
    written = tuple(i for i, (t, v, before) in enumerate(zip(probe, versions, tensors))
                    if copy_all_inputs or t._version != v or not _same(t, before))
    module = _OpModule(opinfo.op, template, written)
    inputs = tuple(t.detach().clone() for t in tensors)
    with torch.no_grad():
        expected = module(*(t.clone() for t in inputs))
    return Prepared(module, inputs, expected, case_id(opinfo), sample)


def convert_sample(prepared: Prepared) -> Model:
    try:
        ep, names, *_ = exporter.export(prepared.module, prepared.inputs, None, None, fix_automatically=False)
        ep = decomposition.decompose(ep)
    except Exception as err:  # torch's limit, recorded as such
        raise TorchLimit(str(err).split("\n")[0][:200]) from err
    captured = capture(ep, names)
    if captured.input_writes:  # the op writes to an input not copied: again with copies, compared as outputs
        raise InputMutationWarning("\n".join(captured.input_writes))
    interpreter.check_supported(captured.graph, captured.schemas)
    run = interpreter.build(captured.graph)
    params = {name: to_jax(t) for name, t in captured.tensors.items()}
    return Model(run, params, captured.graph)


def convert_op_sample(opinfo, sample, prepared: Prepared) -> tuple[Prepared, Model]:
    """convert_sample, again with every input copied when the op writes to one the probe missed."""
    try:
        return prepared, convert_sample(prepared)
    except (InputMutationWarning, ExportError) as err:
        if isinstance(err, ExportError) and "modifies its input" not in str(err):
            raise
        prepared = prepare(opinfo, sample, copy_all_inputs=True)
        return prepared, convert_sample(prepared)


def run_and_compare(prepared: Prepared, model: Model) -> None:
    from .comparisons import COMPARISONS

    if prepared.case_id in COMPARISONS:  # results defined only up to a choice torch leaves open
        return COMPARISONS[prepared.case_id].check(prepared, model)
    if interpreter.needs_rng(model.graph):  # random ops: statistics, not exact values (random_check.py)
        from .random_check import check_random

        return check_random(prepared, model)
    inputs = [to_numpy(t) for t in prepared.inputs]
    got = model(*inputs)
    try:
        compare(prepared.expected, got, "output")
    except AssertionError:
        if not as_accurate_as_torch(prepared, got):
            raise


# assert_close's default (rtol, atol) per floating dtype
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}


def as_accurate_as_torch(prepared: Prepared, got) -> bool:
    """Whether each floating output is as close to the float64 result as torch's own output is.

    Where terms cancel, torch's float32 (or bfloat16) result is itself off from the exact one by more
    than assert_close's tolerance, and a different but equally valid summation order lands
    elsewhere. Such an output passes when, element by element, our distance to the float64 result
    is within the dtype's tolerance plus twice torch's own distance at that element. Used only
    after the direct comparison failed, and only where the op runs in float64 too.
    """
    widened = _in_float64(prepared)
    if widened is None:
        return False
    module, wide = widened
    try:
        with torch.no_grad():
            truth = module(*wide)
    except Exception:  # the op has no float64 kernel, or mixes in a tensor of its own
        return False
    expected, got, truth = leaves(prepared.expected), leaves(got), leaves(truth)
    if not len(expected) == len(got) == len(truth):
        return False
    for k, (want, ours, exact) in enumerate(zip(expected, got, truth)):
        try:
            compare(want, ours, f"output[{k}]")
            continue
        except AssertionError:
            pass
        if not isinstance(want, torch.Tensor) or want.dtype not in _TOLERANCES or exact.dtype != torch.float64:
            return False
        rtol, atol = _TOLERANCES[want.dtype]
        exact = exact.numpy()
        ours = np.asarray(jax.device_get(ours)).astype(np.float64)
        theirs = want.detach().double().numpy()
        if ours.shape != exact.shape or not np.array_equal(np.isnan(ours), np.isnan(exact)):
            return False
        finite = np.isfinite(exact)
        if not np.array_equal(ours[~finite], exact[~finite], equal_nan=True):
            return False
        torch_error = np.abs(theirs - exact)[finite]
        bound = atol + rtol * np.abs(exact[finite]) + 2 * torch_error
        if not np.all(np.abs(ours[finite] - exact[finite]) <= bound):
            return False
    return True


def _in_float64(prepared: Prepared) -> tuple[torch.nn.Module, list] | None:
    """The op and inputs to compute in float64: floating inputs widened, and a floating `dtype=`
    argument (a factory op such as linspace) raised. None when nothing would be wider."""
    module = prepared.module
    if isinstance(module, _OpModule):
        args, kwargs = module.template
        if kwargs.get("dtype") in _TOLERANCES:
            module = _OpModule(module.op, (args, {**kwargs, "dtype": torch.float64}), module.written)
    wide = [t.double() if t.is_floating_point() else t for t in prepared.inputs]
    if module is prepared.module and all(w is t for w, t in zip(wide, prepared.inputs)):
        return None
    return module, wide


def leaves(value) -> list:
    """The tensors (and other leaves) of a nested list/tuple output, in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def check_shape_and_dtype(want: torch.Tensor, got, path: str) -> None:
    """Our output has torch's shape, and the dtype JAX carries torch's in (what is defined when values are not)."""
    got = np.asarray(jax.device_get(got))
    assert tuple(got.shape) == tuple(want.shape), f"{path}: shape {got.shape}, torch {tuple(want.shape)}"
    want_dtype = dtypes.jax_dtype(dtype_name(want.dtype))
    assert got.dtype == want_dtype, f"{path}: dtype {got.dtype}, expected {want_dtype}"


def compare(expected, got, path: str) -> None:
    """torch's result vs ours, element-wise with assert_close's dtype-aware tolerances, NaN == NaN."""
    if isinstance(expected, torch.Tensor):
        got = np.asarray(jax.device_get(got))
        want = expected.detach()
        if got.dtype.kind == "V" or str(got.dtype) == "bfloat16":
            got_t = torch.from_numpy(got.astype(np.float32)).to(want.dtype)
        else:
            got_t = torch.from_numpy(np.array(got))
        if want.dtype in (torch.int64,) and got_t.dtype == torch.int32:
            got_t = got_t.to(torch.int64)
        narrowed = {torch.float64: torch.float32, torch.complex128: torch.complex64}  # x64 off: documented policy
        if narrowed.get(want.dtype) == got_t.dtype:
            got_t = got_t.to(want.dtype)
            torch.testing.assert_close(got_t, want, equal_nan=True, check_dtype=False, rtol=1.3e-6, atol=1e-5, msg=lambda m: f"{path}: {m}")
            return
        torch.testing.assert_close(got_t, want, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), f"{path}: structure differs"
        for i, (e, g) in enumerate(zip(expected, got)):
            compare(e, g, f"{path}[{i}]")
    elif isinstance(expected, (int, float, bool)):
        assert np.allclose(np.asarray(got), expected, equal_nan=True), f"{path}: {got} != {expected}"


# --- the compile way: the same prepared op under torch.compile(backend=torch2jax) -------------------


class CompiledOp:
    """The op module under `torch.compile(backend=torch2jax, fullgraph=True)`, called as a converted Model
    is (numpy in, numpy out), so every check above applies unchanged. `rng=key` seeds torch's generator
    from the key before the call: the backend draws each call's JAX key from it. OpInfo's random ops
    reseed inside (`wrapper_set_seed`), which dynamo cannot put in a graph: compiled, they call the op
    directly (`_unseeded`)."""

    def __init__(self, prepared: Prepared):
        from torch2jax.eager.dynamo_backend import backend

        torch._dynamo.reset()  # one op per compile: dynamo would stop recompiling _OpModule.forward after 8
        self.compiled = torch.compile(prepared.module, backend=backend, fullgraph=True)

    def __call__(self, *inputs, rng=None):
        from torch2jax.capture.torch_arrays import to_torch

        tensors = [to_torch(x) for x in inputs]
        with _unseeded(), torch.no_grad():
            if rng is not None:
                torch.manual_seed(int(np.asarray(jax.random.key_data(rng)).ravel()[-1]))
            return _numpy_leaves(self.compiled(*tensors))


def _unseeded():
    """OpInfo's `wrapper_set_seed(op, ...)` as a plain call of `op`."""
    from .random_check import seed_wrapper_replaced

    return seed_wrapper_replaced(lambda op, *args, **kwargs: op(*args, **kwargs))


def _numpy_leaves(value):
    if isinstance(value, torch.Tensor):
        return to_numpy(value)
    if isinstance(value, (list, tuple)):
        return [_numpy_leaves(v) for v in value]
    return value


def compile_sample(prepared: Prepared) -> CompiledOp:
    """Compile and run the op once: torch.compile's own limits (a graph break under fullgraph) are
    TorchLimit; an op the backend ran in torch rather than JAX is UnsupportedOpsError, as export reports
    it: for want of a lowering, or refused because its output shape depends on the input values."""
    from torch._dynamo.utils import counters

    from torch2jax.eager.partition import NO_LOWERING, VALUE_SHAPED

    compiled = CompiledOp(prepared)
    counters[NO_LOWERING].clear()
    counters[VALUE_SHAPED].clear()
    try:
        compiled(*[to_numpy(t) for t in prepared.inputs])
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as err:
        raise TorchLimit("torch.compile: " + str(err).split("\n")[0][:200]) from err
    if counters[NO_LOWERING]:
        ops = sorted(counters[NO_LOWERING])
        raise UnsupportedOpsError(f"{len(ops)} op(s) have no JAX lowering and ran in torch: {', '.join(ops)}", ops)
    if counters[VALUE_SHAPED]:
        ops = sorted(counters[VALUE_SHAPED])
        raise UnsupportedOpsError(f"ran in torch: the output shape of {', '.join(ops)} depends on the input values", ops)
    return compiled


def draws_random(prepared: Prepared) -> bool:
    """Whether torch's own results differ between two seeds (the compile way has no graph to ask)."""
    from .random_check import _seeded

    def run(seed):
        with _seeded(seed), torch.no_grad():
            return leaves(prepared.module(*(t.clone() for t in prepared.inputs)))

    first, second = run(0), run(1)
    return any(isinstance(a, torch.Tensor) and not _same(a, b) for a, b in zip(first, second))


def run_and_compare_compiled(prepared: Prepared, compiled: CompiledOp) -> None:
    """run_and_compare for the compile way: the same comparisons, random checks and tolerances. The
    backend keeps int64 and float64 (x64 on), so the dtypes expected are torch's own."""
    with jax.enable_x64(True):
        _run_and_compare_compiled(prepared, compiled)


def _run_and_compare_compiled(prepared: Prepared, compiled: CompiledOp) -> None:
    from .comparisons import COMPARISONS

    if prepared.case_id in COMPARISONS:
        return COMPARISONS[prepared.case_id].check(prepared, compiled)
    if draws_random(prepared):
        from .random_check import check_random

        return check_random(prepared, compiled)
    got = compiled(*[to_numpy(t) for t in prepared.inputs])
    try:
        compare(prepared.expected, got, "output")
    except AssertionError:
        if not as_accurate_as_torch(prepared, got):
            raise


__all__ = [
    "CallFn", "Prepared", "TorchLimit", "UnsupportedOpsError", "SAMPLES_PER_OP", "CAPPED_TORCH_LIMITS",
    "Refused", "SampleTally", "refuse_value_dependent", "run_samples", "verdict",
    "case_id", "check_shape_and_dtype", "compare", "leaves", "convert_op_sample", "convert_sample", "prepare", "run_and_compare",
    "EagerModel", "NotOnJaxDevice", "run_eager_and_compare",
    "CompiledOp", "compile_sample", "draws_random", "run_and_compare_compiled",
]


# The eager way: the same samples run op by op on the `jax` device (torch2jax.eager) ---------------


class _NoGraph:
    def all_nodes(self) -> list:
        return []


class EagerModel:
    """The sample's module on the jax device, called like a converted Model: numpy inputs in, JAX
    arrays out, `rng=key` for the random draws (the device's own key, replaced for the call)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.graph = _NoGraph()  # run_and_compare asks the graph for random ops; draws_random answers instead

    def __call__(self, *inputs, rng=None):
        import torch2jax.eager as te
        from torch2jax.capture.torch_arrays import to_torch
        from torch2jax.eager import rng as device_rng

        tensors = [to_torch(x).to("jax") for x in inputs]
        draws = device_rng.traced(rng) if rng is not None else device_rng.traced(jax.random.key(0))
        with draws, torch.no_grad():
            out = self.module(*tensors)
        out = tuple(out) if isinstance(out, tuple) and type(out).__module__ == "torch.return_types" else out
        return _jax_leaves(out, te.jax_view)

    def draws_random(self, inputs) -> bool:
        """Whether two keys give different outputs (how the eager way tells a random op)."""
        a, b = leaves(self(*inputs, rng=jax.random.key(0))), leaves(self(*inputs, rng=jax.random.key(1)))
        return any(not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
                   for x, y in zip(a, b) if isinstance(x, jax.Array))


class NotOnJaxDevice(Exception):
    """The op returned a CPU tensor for jax inputs, as torch does for factories with tensor bounds
    (linspace(start, end) on any device): nothing was computed on the jax device."""


def _jax_leaves(value, jax_view):
    if isinstance(value, torch.Tensor):
        if value.device.type != "jax":
            raise NotOnJaxDevice(f"the op returned a tensor on {value.device}")
        return jax_view(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_jax_leaves(v, jax_view) for v in value)
    return value


def run_eager_and_compare(prepared: Prepared) -> None:
    """The sample on the jax device against torch eager on CPU: run_and_compare's checks, with
    random ops told apart by drawing twice (there is no graph to read them from)."""
    from .comparisons import COMPARISONS

    model = EagerModel(prepared.module)
    if prepared.case_id not in COMPARISONS and model.draws_random([to_numpy(t) for t in prepared.inputs]):
        from .random_check import check_random

        with jax.enable_x64(True):  # the device keeps int64 (its dtypes are torch's, not x32's)
            return check_random(prepared, model)
    return run_and_compare(prepared, model)
