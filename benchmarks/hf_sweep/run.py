"""The architecture sweep: every transformers model type, its base model and main task head, converted,
compared with torch, saved and loaded; torch.onnx + onnxruntime on the same model as the anchor.

    python -m benchmarks.hf_sweep.run [--only TYPE ...] [--shard I/N] [--limit N] [--timeout S]
    make test-models-hf

Each row (model type, class) runs in its own process with a time limit, so one hang or crash costs one
row. Rows already in results.json are skipped (resumable); the file is rewritten atomically after each
row. Configs and inputs come from configs.json (extract_configs.py). docs/models.md is generated from
the results by report.py.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIGS = HERE / "configs.json"
RESULTS = HERE / "results.json"
TIMEOUT_S = 300
# What a row's seconds measure; rows timed another way are left out of the time summary until run again.
# 2: convert + jax.export + save + load + the loaded artifact's checked runs, torch's forward passes not counted.
# 3: as 2, of the converter that decomposes node by node and keeps the collector off older objects (2 timed an
#    earlier, slower converter: left out so that the summary is one converter's)
TIMING = 3

OK = "ok"
NO_INPUTS = "no config or inputs"
BUILD = "model build fails"  # the class cannot be built from the config: transformers' or the config's, not run
EAGER = "torch eager fails"
EXPORT = "fails in torch.export"
LOWERING = "fails in our lowering"
MISMATCH = "mismatch"
SAVE_LOAD = "fails at save or load"
TIMEOUT = "timeout"
STATUSES = [OK, BUILD, EAGER, EXPORT, LOWERING, MISMATCH, SAVE_LOAD, TIMEOUT, NO_INPUTS]
ONNX_EXPORT = "fails in torch.onnx.export"
ONNX_RUN = "fails in onnxruntime"

# The main task head, by the first auto mapping that lists the model type.
HEAD_MAPPINGS = [
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
]


def load_configs(path: Path = CONFIGS) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text())["configs"]


def _first(name: Any) -> str | None:
    if isinstance(name, (list, tuple)):
        return name[0] if name else None
    return name


def rows_of(configs: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(model_type, class name, role) for every architecture: its base model and main task head.
    Tester configs first, then the generic ones; within each, in a fixed pseudo-random order (by a hash of
    the name), so that a partial sweep is a fair sample rather than the first letters of the alphabet."""
    import transformers
    from transformers.models.auto import modeling_auto

    exported = set(dir(transformers))  # a tester may list a class transformers keeps internal
    rows = []
    for model_type, entry in sorted(configs.items(), key=lambda kv: (kv[1]["source"] != "tester", _spread(kv[0]))):
        classes = [c for c in entry.get("model_classes", []) if c in exported]
        base = _first(modeling_auto.MODEL_MAPPING_NAMES.get(model_type))
        mapped = base is not None
        if base is None:
            base = next((c for c in classes if c.endswith("Model")), None)
        if base is None:  # no base model of that name: a backbone, a codec, a vision tower of its own
            base = next((c for c in classes if "For" not in c), None)
        if base is not None:
            rows.append((model_type, base, "base"))
        head = next((h for h in (_first(getattr(modeling_auto, m).get(model_type)) for m in HEAD_MAPPINGS) if h), None)
        if head is None and not mapped:  # a task the main mappings leave out: depth, segmentation, pose, ...
            head = next((c for c in classes if "For" in c and c != base), None)
        if head is not None:
            rows.append((model_type, head, "head"))
    return rows


def _spread(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def row_key(model_type: str, class_name: str) -> str:
    return f"{model_type}:{class_name}"


def make_inputs(specs: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """The inputs a spec list describes, drawn with a fixed seed (recorded integer values as recorded)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    inputs: dict[str, Any] = {}
    for spec in specs:
        kind = spec["kind"]
        if kind == "unsupported":
            continue
        if kind == "value":
            inputs[spec["name"]] = spec["value"]
            continue
        shape, dtype = tuple(spec["shape"]), getattr(torch, spec["dtype"])
        if kind == "empty":
            value = torch.empty(shape, dtype=dtype)
        elif kind == "ones":
            value = torch.ones(shape, dtype=dtype)
        elif "values" in spec:
            value = torch.tensor(spec["values"], dtype=torch.int64).reshape(shape).to(dtype)
        elif kind == "int":
            value = torch.randint(spec["low"], max(spec["high"], spec["low"] + 1), shape, generator=gen).to(dtype)
        elif kind == "uniform":
            value = torch.rand(shape, generator=gen).to(dtype)
        else:
            value = torch.randn(shape, generator=gen).to(dtype)
        inputs[spec["name"]] = value
    return inputs


def build(entry: dict[str, Any], class_name: str, **overrides: Any) -> Any:
    """The model from the recorded config (`overrides` set on it), random weights (seeded), eval mode, no KV cache
    returned."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[entry["model_type"]].from_dict(entry["config"])
    for key, value in overrides.items():
        setattr(config, key, value)
    for sub in [config] + [getattr(config, k) for k in ("text_config", "decoder", "language_config") if hasattr(config, k)]:
        if hasattr(sub, "use_cache"):
            sub.use_cache = False
    cls = getattr(transformers, class_name)
    config = _config_for(cls, config)
    torch.manual_seed(0)
    model = cls(config).eval()
    _draw_zero_params(model, getattr(config, "initializer_range", None) or 0.02)
    return model


def _config_for(cls: Any, config: Any) -> Any:
    """The config a model class takes: a language-model head of a multimodal type (Qwen3_5ForCausalLM, Llama4's,
    Emu3's, Musicgen's decoder) is built from the composite config's sub-config of its own class."""
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    subs = [v for v in vars(config).values() if isinstance(v, want)]
    return subs[0] if len(subs) == 1 else config


def _draw_zero_params(model: Any, std: float) -> None:
    """Params the model's init leaves all zero, biases aside, drawn at random (seeded): a zero-initialized gate or
    projection (a router, a cross-attention gate, a mask token) would hide what follows it from the comparison, and
    a zero router ties its experts' scores, whose top-k order torch leaves unspecified."""
    import torch

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and param.numel() and not name.endswith("bias") and not param.any():
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32).to(param.dtype) * std)


def _accepted(module: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs the module's forward takes (a head may take fewer than the tester's common set)."""
    params = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return inputs
    return {k: v for k, v in inputs.items() if k in params}


def _first_line(err: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if line.endswith(":") and len(lines) > 1:  # "could not capture the model (X):" and its reason below
        line = f"{line} {lines[1]}"
    return f"{type(err).__name__}: {line}"[:300]


def _copies(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()}


def _tensor_leaves(value: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    return [leaf for leaf in pytree.tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def run_torch2jax(module: Any, inputs: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """What `torch2jax convert` does: convert, export, save, load, and compare the loaded artifact with torch
    eager (on the example inputs and on fresh random ones). The row's status, error, worst error and times.

    Timed, as for the ONNX anchor (export, save, session, run): the conversion, the save, the load and the
    loaded artifact's runs (its compilation included); not timed: torch's own forward passes and the
    comparisons. When the loaded artifact mismatches, the in-memory model is compared too (untimed), so that
    the row says whether the lowering or the round trip is at fault."""
    import torch2jax
    from torch2jax.capture.converter import StageTimer, convert
    from torch2jax.diagnose.verify import verify
    from torch2jax.errors import ExportError
    from torch2jax.hf import stand_ins  # noqa: F401 - as torch2jax.convert does for transformers modules
    from torch2jax.runtime import artifact, stablehlo

    row: dict[str, Any] = {"status": None, "error": None, "max_abs": None, "seconds": {}}
    stage = {"name": "export"}
    timer = StageTimer(lambda name, _message: stage.update(name=name))
    start = time.perf_counter()
    try:
        model = convert(module, (), inputs, timer=timer)  # torch2jax.convert, with its stages seen
        stage["name"] = "jax.export"
        exported = stablehlo.export(model, ("cpu",))
    except ExportError as err:
        where = next((line.strip() for line in str(err).splitlines() if line.startswith("at ")), None)
        return {**row, "status": EXPORT, "error": _first_line(err), "stage": stage["name"], **({"where": where} if where else {})}
    except Exception as err:  # anything after torch.export is ours: capture, lowering, weights, tracing
        ops = {"ops": list(err.ops)} if getattr(err, "ops", None) else {}  # UnsupportedOpsError names them
        return {**row, "status": LOWERING, "error": _first_line(err), "stage": stage["name"], **ops}
    row["seconds"]["convert"] = time.perf_counter() - start
    fixed = [inp.name for inp in model.graph.user_inputs if inp.baked and inp.meta is not None]
    if fixed:  # integer inputs fixed to their example values (torch2jax/capture/specialize.py)
        row["fixed"] = fixed
    row["stages"] = {name: round(seconds, 3) for name, seconds in timer.timings.items()}  # where convert's time went
    try:
        start = time.perf_counter()
        artifact.save(model, workdir / "artifact", platforms=("cpu",), exported=exported)  # as the CLI saves
        row["seconds"]["save"] = time.perf_counter() - start
        start = time.perf_counter()
        loaded = torch2jax.load(workdir / "artifact")
        row["seconds"]["load"] = time.perf_counter() - start
    except Exception as err:
        return {**row, "status": SAVE_LOAD, "error": _first_line(err), "stage": "save/load"}
    start = time.perf_counter()
    try:
        with _forward_time(module) as torch_seconds:
            report = verify(module, loaded, (), inputs)
    except Exception as err:  # a lowering that fails when compiled
        return {**row, "status": LOWERING, "error": _first_line(err), "stage": "run"}
    row["seconds"]["run"] = time.perf_counter() - start - torch_seconds["total"]
    row["max_abs"] = report.max_abs
    if loaded.graph.example_values:  # converted along the example's path (torch2jax/capture/example_path.py)
        row["example_values"] = len(loaded.graph.example_values)
    skipped = [f"{run.label}: {run.skipped}" for run in report.runs if run.skipped]
    if skipped:
        row["skipped"] = skipped
    if not report.passed:
        failed = [f"{o.path} max abs {o.max_abs:.3g}" for r in report.runs for o in r.outputs if not o.passed]
        try:
            in_memory = verify(module, model, (), inputs).passed
        except Exception:  # noqa: BLE001 - the loaded artifact's failure is the row's
            in_memory = False
        where = "after load: " if in_memory else ""
        return {**row, "status": MISMATCH, "error": (where + "; ".join(failed))[:300],
                "stage": "compare after load" if in_memory else "compare"}
    row["seconds"]["total"] = sum(row["seconds"].values())
    return {**row, "status": OK, "timing": TIMING}


@contextmanager
def _forward_time(module: Any) -> Iterator[dict[str, float]]:
    """The seconds `module`'s forward passes take inside the block, added up (`["total"]`), by hooks removed after."""
    spent = {"total": 0.0, "start": 0.0}

    def before(*_: Any) -> None:
        spent["start"] = time.perf_counter()

    def after(*_: Any) -> None:
        spent["total"] += time.perf_counter() - spent["start"]

    hooks = [module.register_forward_pre_hook(before, with_kwargs=True), module.register_forward_hook(after, with_kwargs=True)]
    try:
        yield spent
    finally:
        for hook in hooks:
            hook.remove()


def run_onnx(module: Any, inputs: dict[str, Any], expected: Any, workdir: Path) -> dict[str, Any]:
    """torch.onnx.export(dynamo=True) + an onnxruntime session on the same inputs, compared the same way."""
    import numpy as np
    import torch

    from torch2jax.diagnose.verify import TOLERANCES

    row: dict[str, Any] = {"status": None, "error": None, "max_abs": None, "seconds": None}
    start = time.perf_counter()
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, (), kwargs=inputs, dynamo=True, verbose=False)
        program.save(str(workdir / "model.onnx"))
    except Exception as err:  # torch.onnx's own first line names only the step; its cause says why
        root = err
        while root.__cause__ is not None:
            root = root.__cause__
        return {**row, "status": ONNX_EXPORT, "error": _first_line(root)}
    try:
        import onnxruntime as ort

        session = ort.InferenceSession(str(workdir / "model.onnx"), providers=["CPUExecutionProvider"])
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        names = [i.name for i in session.get_inputs()]
        feed = {n: tensors[n].numpy() for n in names if n in tensors}
        if len(feed) != len(names):  # inputs renamed: by order
            feed = {n: t.numpy() for n, t in zip(names, tensors.values())}
        got = session.run(None, feed)
    except Exception as err:
        return {**row, "status": ONNX_RUN, "error": _first_line(err)}
    row["seconds"] = time.perf_counter() - start
    want = _tensor_leaves(expected)
    if len(want) != len(got):
        return {**row, "status": MISMATCH, "error": f"{len(got)} outputs, torch has {len(want)}"}
    worst, passed = 0.0, True
    for w, g in zip(want, got):
        w = w.detach().numpy()
        if w.shape != g.shape:
            return {**row, "status": MISMATCH, "error": f"shape {list(g.shape)}, torch {list(w.shape)}"}
        rtol, atol = TOLERANCES.get(str(w.dtype), (0.0, 0.0))
        if w.size and np.issubdtype(w.dtype, np.number):
            diff = np.abs(w.astype(np.float64) - g.astype(np.float64))
            finite = np.isfinite(diff)
            worst = max(worst, float(diff[finite].max()) if finite.any() else 0.0)
            passed &= bool((diff[finite] <= atol + rtol * np.abs(w.astype(np.float64))[finite]).all())
            passed &= bool((np.isnan(w) == np.isnan(g)).all()) if np.issubdtype(w.dtype, np.floating) else True
    row["max_abs"] = worst
    return {**row, "status": OK if passed else MISMATCH, "error": None if passed else f"max abs {worst:.3g}"}


def run_row(entry: dict[str, Any], class_name: str, *, onnx: bool = True, workdir: Path | None = None,
            partial: Path | None = None) -> dict[str, Any]:
    """One row in this process: build, torch eager, torch2jax (and the ONNX anchor). `partial` is
    rewritten after each part, so that a parent that kills this process on timeout keeps what finished."""
    import torch

    row: dict[str, Any] = {"model_type": entry["model_type"], "class": class_name, "source": entry["source"]}

    def done(**more: Any) -> dict[str, Any]:
        row.update(more)
        if partial is not None:
            _write_atomic(partial, row)
        return row

    if entry.get("config") is None or not entry.get("inputs"):
        return done(status=NO_INPUTS, error=entry.get("note", "no inputs recorded"))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = workdir or Path(tmp)
        try:
            module = build(entry, class_name)
        except Exception as err:
            return done(status=BUILD, error=_first_line(err))
        try:
            inputs = _accepted(module, make_inputs(entry["inputs"]))
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    expected = module(**_copies(inputs))  # a forward that writes into its inputs (TVP) leaves them as drawn
            except RuntimeError:
                # torch's CPU grouped_mm refuses the tester's odd expert sizes (unaligned strides): the model's own
                # batched experts, which the converter selects for MoE models anyway (torch2jax.hf), run them
                if not hasattr(module, "set_experts_implementation"):
                    raise
                module.set_experts_implementation("batched_mm")
                row["experts"] = "batched_mm"
                start = time.perf_counter()
                with torch.no_grad():
                    expected = module(**_copies(inputs))  # a forward that writes into its inputs (TVP) leaves them as drawn
            row["torch_seconds"] = time.perf_counter() - start
        except Exception as err:
            return done(status=EAGER, error=_first_line(err))
        _warm_torch_export()
        # the converter that runs second finds torch's caches warm for this model's ops: every other row, ONNX goes first
        onnx_first = onnx and int(_spread(row_key(entry["model_type"], class_name)), 16) % 2 == 1
        if onnx_first:
            done(onnx=run_onnx(module, inputs, expected, workdir))
        try:
            done(**run_torch2jax(module, inputs, workdir))
        except Exception as err:  # noqa: BLE001 - the harness records, it does not stop
            done(status=LOWERING, error=_first_line(err), stage="harness", trace=traceback.format_exc()[-1000:])
        if row.get("status") == MISMATCH and row.get("stage") == "compare":
            why = mismatch_cause(module, inputs, expected)
            if why:
                done(error=f"{why}: {row['error']}"[:300])
        if onnx and not onnx_first:
            done(onnx=run_onnx(module, inputs, expected, workdir))
    return row


def mismatch_cause(module: Any, inputs: dict[str, Any], expected: Any) -> str | None:
    """Where a mismatch comes from, in a few words: torch.export's own program already departs from eager (the model
    takes another path when traced, which no exporter can follow), else the first departing node (diagnose.bisect),
    named as an order of tied values where it is one. None when the diagnosis itself fails."""
    import torch

    from torch2jax.diagnose.bisect import bisect
    from torch2jax.diagnose.verify import TOLERANCES

    rtol, atol = TOLERANCES["float32"]
    try:
        program = torch.export.export(module, (), kwargs=_copies(inputs), strict=False)
        with torch.no_grad():
            traced = program.module()(**_copies(inputs))
        pairs = list(zip(_tensor_leaves(expected), _tensor_leaves(traced)))
        worst = max((float((w.double() - t.double()).abs().max()) for w, t in pairs
                     if w.is_floating_point() and w.shape == t.shape and w.numel()
                     and not torch.allclose(w, t, rtol=rtol, atol=atol, equal_nan=True)), default=0.0)
        if worst:
            return f"torch.export's own program departs from eager by {worst:.3g} (the model takes another path when traced)"
        divergence, _ = bisect(module, (), _copies(inputs))
    except Exception:  # noqa: BLE001 - a diagnosis that fails leaves the row's error as it is
        return None
    if divergence is None:
        return None
    line = divergence.source.strip().splitlines()[-1].strip() if divergence.source else "?"
    if divergence.ties:
        return f"an order of tied values ({divergence.op}), which torch leaves unspecified, at `{line}`"
    return f"first departs at {divergence.op}, `{line}`"


def _warm_torch_export() -> None:
    """torch.export and its decomposition once on a trivial module: both converters start from torch.export,
    and whichever ran first in a fresh process would otherwise pay torch's one-time setup for both."""
    import torch

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.layer_norm(x @ x, x.shape[-1:]).softmax(-1)

    torch.export.export(Tiny(), (torch.ones(2, 2),)).run_decompositions()


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


# imported once by the fork server each row's process is forked from: a row then starts in a fraction of a second,
# where a fresh interpreter spent about 3 s importing these (imports are in no row's measured seconds either way)
PRELOAD = ["torch", "transformers", "jax", "onnxruntime", "onnxscript", "torch2jax"]


def _row_process(key: str, partial: str, log: str) -> None:
    """A row's own process: its output to `log` (the sweep prints one line per row), the row to `partial`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    model_type, class_name = key.split(":", 1)
    run_row(load_configs()[model_type], class_name, partial=Path(partial))


def run_in_subprocess(model_type: str, class_name: str, timeout_s: float) -> dict[str, Any]:
    """One row in its own process (forked from a server that imported the libraries), killed after timeout_s; what
    it finished before is kept."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as tmp:
        partial, log = Path(tmp) / "row.json", Path(tmp) / "row.log"
        start = time.perf_counter()
        process = context.Process(target=_row_process, args=(row_key(model_type, class_name), str(partial), str(log)))
        process.start()
        process.join(timeout_s)
        timed_out = process.is_alive()
        if timed_out:
            process.kill()
            process.join()
        last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        crashed = not timed_out and process.exitcode != 0 and f"process exit {process.exitcode}: {last}"
        row = json.loads(partial.read_text()) if partial.exists() else {}
        row.setdefault("model_type", model_type)
        row.setdefault("class", class_name)
        row["wall_seconds"] = time.perf_counter() - start
        if timed_out:
            row.setdefault("status", TIMEOUT)
            row.setdefault("error", f"no result within {timeout_s:.0f} s")
            if row["status"] != TIMEOUT and "onnx" not in row:
                row["onnx"] = {"status": TIMEOUT, "error": f"no result within {timeout_s:.0f} s"}
        elif "status" not in row or row.get("status") is None:
            row["status"], row["error"] = LOWERING, str(crashed)[:300]
        return row


def load_results(path: Path = RESULTS) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"rows": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="model types to run")
    parser.add_argument("--shard", default="0/1", help="I/N: every N-th row starting at I")
    parser.add_argument("--limit", type=int, default=None, help="at most this many new rows")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per row")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--rerun", action="store_true", help="run rows already in the results again")
    parser.add_argument("--retime", action="store_true", help="run again the passing rows timed another way (TIMING)")
    ns = parser.parse_args()
    configs = load_configs()
    index, count = (int(x) for x in ns.shard.split("/"))
    rows = [r for i, r in enumerate(rows_of(configs)) if i % count == index]
    if ns.only:
        rows = [r for r in rows if r[0] in ns.only]
    results = load_results(ns.results)
    results["registered"] = len(configs)
    def wanted(key: str) -> bool:
        old = results["rows"].get(key)
        return ns.rerun or old is None or (ns.retime and old["status"] == OK and old.get("timing") != TIMING)

    todo = [r for r in rows if wanted(row_key(r[0], r[1]))]
    if ns.limit is not None:
        todo = todo[: ns.limit]
    print(f"{len(todo)} rows to run ({len(results['rows'])} in {ns.results.name})", flush=True)
    for n, (model_type, class_name, role) in enumerate(todo, 1):
        row = run_in_subprocess(model_type, class_name, ns.timeout)
        row["role"] = role
        row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")  # to find the rows a busy machine may have slowed
        results["rows"][row_key(model_type, class_name)] = row
        _write_atomic(ns.results, results)
        onnx = row.get("onnx", {}).get("status", "-")
        print(f"[{n}/{len(todo)}] {model_type} {class_name}: {row['status']} ({row.get('error') or ''})"[:200]
              + f" | onnx: {onnx} | {row['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
