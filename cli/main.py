"""`torch2jax` console script: convert, inspect, verify, run.

Exit codes: 0 ok; 1 conversion or artifact error; 2 bad usage or input spec; 3 numerics differ
from PyTorch beyond tolerance. Errors are one paragraph on stderr, never a raw traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import click

EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 1, 2, 3


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    click.secho("error: ", fg="red", bold=True, err=True, nl=False)
    click.echo(message, err=True)
    sys.exit(code)


def handles_errors(fn):
    """Turn torch2jax's own errors into a one-paragraph message and an exit code a CI step can use."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from torch2jax.errors import InputSpecError, SignatureError, Torch2JaxError, VerificationError

        try:
            return fn(*args, **kwargs)
        except VerificationError as err:
            _fail(str(err), EXIT_MISMATCH)
        except (InputSpecError, SignatureError) as err:
            _fail(str(err), EXIT_USAGE)
        except Torch2JaxError as err:
            _fail(str(err), EXIT_ERROR)

    return wrapper


class Progress:
    """Step lines with timings on stderr: `[export] torch.export ... 0.84s`."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.start: float | None = None
        self.label = ""

    def __call__(self, stage: str, message: str) -> None:
        self.done()
        self.label = f"[{stage}] {message}"
        self.start = time.perf_counter()
        if not self.quiet:
            click.echo(f"{self.label} ...", err=True, nl=False)

    def done(self) -> None:
        if self.start is not None and not self.quiet:
            click.echo(f" {time.perf_counter() - self.start:.2f}s", err=True)
        self.start = None

    def bytes_written(self, written: int, total: int) -> None:
        """How far a long write is, redrawn in place on a terminal; a log gets the step's time only."""
        if self.quiet or self.start is None or not click.get_text_stream("stderr").isatty():
            return
        click.echo(f"\r{self.label} ... {written / 1e9:.2f} / {total / 1e9:.2f} GB", err=True, nl=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torch2jax-aot", prog_name="torch2jax")
def main() -> None:
    """Export PyTorch models to JAX: StableHLO + Orbax weights, loadable without PyTorch.

    \b
    torch2jax convert sample_models/mlp.py:MLP --out out/mlp
    torch2jax inspect out/mlp
    torch2jax run out/mlp --input x=x.npy --out y.npz
    """


@main.command()
@click.argument("target")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Artifact directory to write.")
@click.option("--input", "inputs", multiple=True, metavar="SPEC",
              help="Example input, repeatable: x=float32[batch,3,224,224] (names are symbolic dims), "
                   "ids=int64[batch,seq=16](0..50), or x=file.npy. Default: example_inputs() in the model file.")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="state_dict to load: .safetensors, or .pt/.pth (read with weights_only=True).")
@click.option("--platforms", default="cpu,cuda,tpu", show_default=True, help="Comma-separated jax.export platforms.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--no-verify", is_flag=True, help="Skip comparing the saved artifact with PyTorch.")
@click.option("--train", is_flag=True, help="Export in training mode (default: module.eval()).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "float64"]),
              help="Convert the model and its floating inputs to this dtype first, as module.to(dtype) would.")
@click.option("--lowerings", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="Python file(s) registering lowerings for custom ops (torch2jax.register_lowering).")
@click.option("--seed", default=0, show_default=True, help="Seed for model construction and random example inputs.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False),
              help="Write a markdown report (stages, timings, op counts, per-output errors, environment), pass or fail.")
@click.option("--repro-dir", type=click.Path(file_okay=False),
              help="Where to write the standalone reproduction when one op fails (default: $TMPDIR/torch2jax-repro).")
@click.option("--task", help="hf: targets: what to build (default: from config.json's architectures). text-generation: "
                             "prefill/decode entry points with a KV cache; text2text-generation (encoder-decoders): encode/decode; "
                             "both for `torch2jax generate`.")
@click.option("--max-cache-len", default=512, show_default=True,
              help="text-generation: KV cache slots (prompt + new tokens); text2text-generation: the most new tokens.")
@click.option("--max-batch", default=8, show_default=True, help="text-generation: most prompts per generate call.")
@click.option("--max-source-len", default=512, show_default=True, help="text2text-generation: the longest source, in tokens.")
@click.option("--verify-tokens", default=16, show_default=True,
              help="text-generation: greedy tokens compared with transformers' generate (float32: all equal; bfloat16: the first 8).")
@click.option("--weights-in-memory", is_flag=True,
              help="Load the whole model in torch first (hf: targets with transformers; about 5x the weights in RAM) instead "
                   "of streaming the weights from the safetensors files, the default for hf: and --weights *.safetensors.")
@click.option("--verify-layers", default=2, show_default=True,
              help="Streamed hf: models deeper than this are verified on a slice of their first N layers (real weights, the "
                   "same streamed path), so that verification never needs the whole model in memory; at least 5 units where "
                   "the conversion repeats a middle layer's graph, so that the slice is converted that way too.")
@click.option("--trace-all-layers", is_flag=True,
              help="text-generation: torch.export every decoder layer. By default a stack of alike layers is traced at 3 and "
                   "4 layers and a middle layer's graph repeated for the rest (checked: 3 repeated to 4 must equal 4 traced, "
                   "else every layer is traced), which makes deep models several times faster to convert.")
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@handles_errors
def convert(target, out_dir, inputs, weights, platforms, force, no_verify, train, dtype, lowerings, seed, report_file, repro_dir,
            task, max_cache_len, max_batch, max_source_len, verify_tokens, weights_in_memory, verify_layers, trace_all_layers,
            quiet):
    """Convert TARGET (model.py:Model, model.py:make_model, or hf:DIR) into an artifact directory.

    \b
    Example:
      torch2jax convert sample_models/tiny_gpt.py:TinyGPT --out out/gpt
      torch2jax convert model.py:Net --input x=float32[batch,3,32,32] --out out/net --report report.md
      torch2jax convert hf:path/to/llama --task text-generation --max-cache-len 512 --max-batch 8 --out out/llm
      torch2jax convert hf:path/to/t5 --task text2text-generation --max-source-len 512 --out out/t5

    hf:DIR is a local model directory as save_pretrained writes it (config.json, *.safetensors,
    tokenizer files); nothing is downloaded.

    By default the saved artifact is loaded back and compared with PyTorch on the example
    inputs, on random inputs of the same shapes and on a second size of each symbolic dim; a
    mismatch exits with status 3 and leaves no output directory. When a single op stops the
    conversion, a standalone script reproducing it is written and its path printed.
    """
    from torch2jax.diagnose.report import ReportData, reporting

    out = Path(out_dir)
    if out.exists() and not force:
        _fail(f"{out} already exists; pass --force to replace it", EXIT_USAGE)
    hf_task = _hf_task(target, task) if target.startswith("hf:") else None
    if hf_task == "text-generation" and not weights_in_memory:  # encoder-decoders are converted in memory only
        _convert_hf_streamed(target, out, task, max_cache_len, max_batch, dtype, platforms, force, no_verify, verify_tokens,
                             verify_layers, seed, quiet, repeat_layers=not trace_all_layers)
        return
    if hf_task in ("text-generation", "text2text-generation"):
        _convert_hf(target, out, task, hf_task, max_cache_len, max_batch, max_source_len, dtype, platforms, force, no_verify,
                    verify_tokens, seed, quiet, repeat_layers=not trace_all_layers)
        return
    if task and not target.startswith("hf:"):
        _fail(f"--task applies to hf: targets; {target} is a model file target", EXIT_USAGE)
    data = ReportData(title="torch2jax conversion report", target=target, artifact=str(out))
    with reporting(data, report_file, lambda line: click.echo(line, err=True)):
        _convert(data, target, out, inputs, weights, platforms, force, no_verify, train, dtype, lowerings, seed, repro_dir, quiet, task,
                 stream=not weights_in_memory)


def _hf_task(target: str, task: str | None) -> str:
    """The task of an hf: target: --task, else what its config.json's architectures imply."""
    if task:
        return task
    import transformers

    from torch2jax.capture.hf import default_task, model_dir

    return default_task(transformers.AutoConfig.from_pretrained(model_dir(target), local_files_only=True))


def _convert(data, target, out, inputs, weights, platforms, force, no_verify, train, dtype, lowerings, seed, repro_dir, quiet,
             task=None, stream=True):
    from torch2jax.capture.converter import StageTimer, cast
    from torch2jax.capture.converter import convert as convert_module
    from torch2jax.capture.target import resolve
    from torch2jax.errors import LoweringError, UnsupportedOpsError
    from torch2jax.runtime import artifact, stablehlo

    progress = Progress(quiet)
    timer = StageTimer(progress)
    data.timings = timer.timings
    with timer.stage("build model", f"build {target}"):
        for path in lowerings:
            _import_lowerings(path)
        resolved = resolve(target, list(inputs), weights, train=train, seed=seed, task=task, stream=stream)
        if dtype:
            resolved.module, resolved.args, resolved.kwargs = cast(resolved.module, resolved.args, resolved.kwargs, dtype)
            if resolved.weights is not None:
                resolved.weights.cast = True  # the files' floating tensors are converted to `dtype` as they are read
    model = None
    try:
        model = convert_module(resolved.module, resolved.args, resolved.kwargs, resolved.dynamic_shapes, timer=timer,
                               weights=resolved.weights)
        data.graph = model.graph
        with timer.stage("jax.export", "jax.export to StableHLO"):
            exported = stablehlo.export(model, [p.strip() for p in platforms.split(",") if p.strip()])
    except (UnsupportedOpsError, LoweringError) as err:
        progress.done()
        _add_repro(err, model.graph if model is not None else None, resolved, repro_dir)
        raise

    def verify_artifact(tmp: Path) -> None:
        if no_verify:
            return
        from torch2jax.diagnose.verify import check, verify

        with timer.stage("verify", "compare the saved artifact with PyTorch"):
            loaded = artifact.load(tmp)
            module = resolved.module if resolved.weights is None else resolved.weights.materialize(resolved.module)
            data.verification = verify(module, loaded, resolved.args, resolved.kwargs, seed)
        check(data.verification)

    progress("save", f"write {out}")
    start = time.perf_counter()
    try:
        artifact.save(model, out, force=force, source=target, exported=exported, check=verify_artifact,
                      on_bytes=progress.bytes_written)
    finally:
        progress.done()
        # verification runs inside the save (before the rename); count it once, under its own name
        timer.timings["save"] = time.perf_counter() - start - timer.timings.get("verify", 0.0)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    streamed = ", weights streamed from the safetensors files" if resolved.weights is not None else ""
    click.echo(f"wrote {out} ({size / 1e6:.2f} MB{streamed}) {model.signature}")
    if data.verification is not None:
        how = " (the whole model, its weights memory-mapped from the safetensors files)" if streamed else ""
        click.echo(f"verified against PyTorch{how}:\n{data.verification.summary()}")


def _convert_hf(target, out, task, generation_task, max_cache_len, max_batch, max_source_len, dtype, platforms, force,
                no_verify, verify_tokens, seed, quiet, repeat_layers=True):
    """hf:DIR -> a text-generation (causal LM) or text2text-generation (encoder-decoder) artifact, the model loaded in
    memory, verified token by token against transformers' generate."""
    from torch2jax.capture.hf import tokenizer_files
    from torch2jax.diagnose import generation
    from torch2jax.serve.artifact import load_generator

    progress = Progress(quiet)
    progress("build model", f"load {target} with transformers")
    if generation_task == "text2text-generation":
        from torch2jax.capture.hf import seq2seq_lm_from
        from torch2jax.capture.seq2seq import convert_seq2seq

        lm, directory = seq2seq_lm_from(target)
        generator = convert_seq2seq(lm, max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len,
                                    dtype=dtype, progress=progress)
        compare, entries = generation.verify_seq2seq, "encode and decode"
    else:
        from torch2jax.capture.decoder import convert_causal_lm
        from torch2jax.capture.hf import causal_lm_from

        lm, directory = causal_lm_from(target, task)
        generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, progress=progress,
                                      repeat_layers=repeat_layers)
        compare, entries = generation.verify_generation, "prefill and decode"
    generator.tokenizer_files = tokenizer_files(directory)
    checked = []

    def verify(tmp: Path) -> None:
        if no_verify:
            return
        progress("verify", f"greedy-generate {verify_tokens} tokens with the saved artifact and with transformers")
        checked.append(compare(lm, load_generator(tmp), tokens=verify_tokens, seed=seed))
        progress.done()
        generation.check_generation(checked[-1])

    progress("save", f"jax.export {entries}, write {out}")
    _save_generator(generator, out, force, platforms, target, verify, progress, "")
    if checked:
        click.echo(f"verified against transformers:\n{checked[-1].summary()}")


def _save_generator(generator, out, force, platforms, target, check, progress, note) -> None:
    from torch2jax.serve.artifact import save_generator

    platform_list = [p.strip() for p in platforms.split(",") if p.strip()]
    save_generator(generator, out, force=force, platforms=platform_list, source=target, check=check,
                   on_bytes=progress.bytes_written)
    progress.done()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    click.echo(f"wrote {out} ({size / 1e6:.2f} MB{note}) {generator}")


def _convert_hf_streamed(target, out, task, max_cache_len, max_batch, dtype, platforms, force, no_verify, verify_tokens,
                         verify_layers, seed, quiet, repeat_layers=True):
    """hf:DIR -> a text-generation artifact with the weights streamed from the safetensors files (never all in memory),
    verified against transformers on the whole model when it has at most `verify_layers` layers, else on a slice."""
    from torch2jax.capture.decoder import convert_causal_lm, repeat_slice
    from torch2jax.capture.hf import streamed_causal_lm, tokenizer_files
    from torch2jax.diagnose.streamed import verify_streamed

    progress = Progress(quiet)
    progress("build model", f"build {target} with fake parameters, map its safetensors files")
    lm, directory, weights = streamed_causal_lm(target, task)
    gigabytes = weights.checkpoint.nbytes / 1e9
    generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, progress=progress,
                                  weights=weights, repeat_layers=repeat_layers)
    generator.tokenizer_files = tokenizer_files(directory)
    checked = []

    def verify(tmp: Path) -> None:
        if no_verify:
            return
        checked.append(verify_streamed(directory, tmp, lm.config, layers=verify_layers, tokens=verify_tokens, dtype=dtype,
                                       max_cache_len=max_cache_len, max_batch=max_batch, seed=seed, progress=progress,
                                       repeat_slice=repeat_slice(lm) if repeat_layers else None))
        progress.done()

    progress("save", f"jax.export prefill and decode, stream {gigabytes:.2f} GB of weights into {out}")
    _save_generator(generator, out, force, platforms, target, verify, progress, ", weights streamed from the safetensors files")
    if checked:
        click.echo(checked[-1])
    elif no_verify:
        click.echo("not verified (--no-verify)")


def _add_repro(err, graph, resolved, repro_dir) -> None:
    """Write a standalone script reproducing the one failing op, and name it in the error."""
    import torch.utils._pytree as pytree

    from torch2jax.diagnose import repro
    from torch2jax.errors import UnsupportedOpsError

    graph = getattr(err, "graph", None) or graph
    ops = getattr(err, "ops", None) or ([err.node.op] if getattr(err, "node", None) is not None else [])
    node = repro.failing_node(graph, ops) if graph is not None else None
    if node is None:
        return
    shapes = [tuple(x.shape) for x in pytree.tree_flatten((resolved.args, resolved.kwargs))[0] if hasattr(x, "shape")]
    model_file = getattr(resolved.file_module, "__file__", None)
    reason = f"no JAX lowering for {node.op}" if isinstance(err, UnsupportedOpsError) else str(err)
    path = repro.write_repro(graph, node, repro.symbol_sizes(graph, shapes), reason, repro_dir, model_file)
    err.args = (f"{err}\nA standalone reproduction of this op: {path} (run it with python after adding or fixing the lowering).",)


def _import_lowerings(path: str) -> None:
    import importlib.util

    from torch2jax.errors import Torch2JaxError

    spec = importlib.util.spec_from_file_location(f"torch2jax_lowerings_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise Torch2JaxError(f"importing lowerings from {path} failed: {type(err).__name__}: {err}") from None


@main.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the raw manifest.")
@click.option("--mesh", metavar="AXIS=N,...", help="Also plan the params on this device mesh (e.g. data=2,model=4) and "
              "report each param's spec, bytes per device and the collectives of the compiled call. On a CPU-only "
              "machine the devices are simulated.")
@click.option("--sharding", default="auto", show_default=True, metavar="auto|replicated|RULES.json",
              help="With --mesh: the sharding rules; a JSON file maps name patterns to axis lists, "
              'e.g. {"*.q_proj.weight": ["model", null]}.')
@handles_errors
def inspect(artifact_dir, as_json, mesh, sharding):
    """Show an artifact's manifest, signature and params summary.

    \b
    Examples:
      torch2jax inspect out/gpt
      torch2jax inspect out/llm --mesh data=2,model=4
    """
    from torch2jax.runtime.artifact import read_manifest

    manifest = read_manifest(Path(artifact_dir))
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    axes, rules = (_parse_mesh(mesh), _read_rules(sharding)) if mesh else (None, None)
    _print_summary(artifact_dir, manifest)
    if axes:
        _print_sharding(artifact_dir, axes, rules)


def _print_summary(artifact_dir: str, manifest: dict) -> None:
    versions = manifest.get("versions", {})
    params = manifest["params"]
    click.echo(f"artifact  {artifact_dir}  (format {manifest['format_version']}, created {manifest.get('created')})")
    click.echo(f"source    {manifest.get('source')}")
    click.echo("versions  " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    vjp = f"   vjp order {manifest['vjp_order']}" if "vjp_order" in manifest else ""
    click.echo(f"platforms {', '.join(manifest.get('platforms', []))}{vjp}")
    if manifest.get("task"):
        click.echo(f"task      {manifest['task']}")
    generation = manifest.get("generation")
    if isinstance(generation, dict):
        cache = generation.get("cache", {})
        click.echo(f"generate  max_cache_len {generation.get('max_cache_len')}, max_batch {generation.get('max_batch')}, "
                   f"vocab {generation.get('vocab_size')}, end tokens {generation.get('eos_token_ids')}, "
                   f"pad {generation.get('pad_token_id')}")
        click.echo(f"kv cache  {len(cache.get('shapes', []))} {cache.get('dtype')} tensors of {cache.get('shapes', [[]])[0]} "
                   "(state: allocated at load, donated to each step, never saved)")
        cross = generation.get("cross")
        if isinstance(cross, dict):
            encoder = generation.get("encoder_input") or {}
            click.echo(f"encoder   reads {encoder.get('name')} {encoder.get('shape')}, max_source_len "
                       f"{generation.get('max_source_len')}; the decoder starts from {generation.get('decoder_start_token_id')}")
            click.echo(f"cross     {len(cross.get('shapes', []))} {cross.get('dtype')} tensors of {cross.get('shapes', [[]])[0]} "
                       "(state: computed by encode, read by each decode step, never saved)")
    entries = manifest.get("entries") if isinstance(manifest.get("entries"), dict) else {"": manifest}
    for name, entry in entries.items():
        if name:
            click.echo(f"entry     {name}")
        _print_signature(entry, indent="  " if name else "")
    if manifest.get("mutated_buffers"):
        click.echo(f"mutates   {', '.join(manifest['mutated_buffers'])}")
    click.echo(f"params    {params['count']:,} values, {params['bytes'] / 1e6:.2f} MB in {len(params['tree'])} tensors")
    for name, spec in list(params["tree"].items())[:20]:
        click.echo(f"  {name}: {spec['dtype']}{spec['shape']}")
    if len(params["tree"]) > 20:
        click.echo(f"  ... {len(params['tree']) - 20} more")
    for alias, kept in params.get("aliases", {}).items():
        click.echo(f"  {alias} -> tied to {kept}")


def _parse_mesh(text: str) -> dict[str, int]:
    axes = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name.strip().isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise click.BadParameter(f"{part!r}: give the mesh as AXIS=N pairs, e.g. data=2,model=4", param_hint="--mesh")
        axes[name.strip()] = int(size)
    return axes


def _read_rules(sharding: str) -> object:
    if sharding in ("auto", "replicated"):
        return sharding
    try:
        rules = json.loads(Path(sharding).read_text())
    except (OSError, ValueError) as err:
        raise click.BadParameter(f"{sharding}: not 'auto', 'replicated' or a readable JSON file of rules ({err})",
                                 param_hint="--sharding") from None
    if not isinstance(rules, dict):
        raise click.BadParameter(f"{sharding}: the rules file must hold a JSON object {{pattern: [axis or null, ...]}}",
                                 param_hint="--sharding")
    return {pattern: None if axes is None else tuple(axes) for pattern, axes in rules.items()}


def _print_sharding(artifact_dir: str, axes: dict[str, int], rules: object) -> None:
    import math

    import jax

    import torch2jax

    needed = math.prod(axes.values())
    try:
        jax.config.update("jax_num_cpu_devices", max(needed, 1))  # only takes effect before jax starts its CPU backend
    except RuntimeError:
        pass
    devices = jax.devices()
    if len(devices) < needed:
        raise click.ClickException(f"the mesh {axes} needs {needed} devices; this machine has {len(devices)} "
                                   f"{devices[0].platform} devices")
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices[:needed])
    click.echo("")
    click.echo(torch2jax.load(artifact_dir, mesh=mesh, sharding=rules).sharding_report())


@main.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="NAME=FILE",
              help="Input array, repeatable: x=x.npy (or an .npz holding NAME).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Where to write the outputs (.npz).")
@click.option("--from-graph", is_flag=True, help="Rebuild the function from graph.json instead of the StableHLO.")
@click.option("--seed", default=0, show_default=True, help="PRNG seed for models with random ops (train-mode dropout).")
@handles_errors
def run(artifact_dir, inputs, out_file, from_graph, seed):
    """Call an artifact on .npy/.npz inputs and write its outputs to an .npz file.

    \b
    Example:
      torch2jax run out/mlp --input x=x.npy --out y.npz
    """
    import numpy as np

    import torch2jax
    from torch2jax.errors import InputSpecError
    from torch2jax.ir import specs

    model = torch2jax.load(artifact_dir, from_graph=from_graph)
    arrays = {}
    for text in inputs:
        item = specs.parse(text)
        if not isinstance(item, specs.FileInput):
            raise InputSpecError(f"--input {text!r}: run takes array files, e.g. x=x.npy")
        arrays[item.name] = specs.load_array(item)
    names = [i["name"] for i in model.manifest["inputs"]]
    missing = [n for n in names if n not in arrays]
    unknown = [n for n in arrays if n not in names]
    if missing or unknown:
        raise InputSpecError(f"the artifact takes inputs {names}; missing {missing}, unknown {unknown}")
    rng = None
    if model.needs_rng:
        import jax

        rng = jax.random.key(seed)
    outputs = model.call_flat([arrays[n] for n in names], rng)
    flat = _flatten_outputs(outputs)
    out = Path(out_file)
    tmp = out.with_name(f".{out.name}.tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in flat.items()})
    os.replace(tmp, out)
    for key, value in flat.items():
        click.echo(f"{key}: {np.asarray(value).dtype}{list(np.shape(value))}")
    click.echo(f"wrote {out}")


def _print_signature(entry: dict, indent: str) -> None:
    click.echo(f"{indent}inputs")
    for item in entry.get("inputs", []):
        click.echo(f"{indent}  {item['name']}: {item['dtype']}[{', '.join(map(str, item['shape']))}]")
    for name, bounds in entry.get("symbols", {}).items():
        hi = "inf" if bounds.get("max") is None else bounds["max"]
        click.echo(f"{indent}  dim {name} in [{bounds.get('min')}, {hi}]")
    click.echo(f"{indent}outputs")
    for item in entry.get("outputs", []):
        shape = "?" if item.get("shape") is None else ", ".join(map(str, item["shape"]))
        click.echo(f"{indent}  {item.get('name')}: {item.get('dtype')}[{shape}]")


def _flatten_outputs(value, prefix: str = "output") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten_outputs(item, f"{key}" if prefix == "output" else f"{prefix}.{key}"))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten_outputs(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}


@main.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--prompt", "prompts", multiple=True, help="Prompt text (repeatable: a batch); needs the model's tokenizer.")
@click.option("--ids", "id_lists", multiple=True, help="Prompt token ids, comma-separated (repeatable: a batch), e.g. 1,450,7483.")
@click.option("--max-new-tokens", default=32, show_default=True)
@click.option("--temperature", type=float, help="Sample with this temperature (default: greedy decoding).")
@click.option("--top-k", type=int, help="Sample from the k most likely tokens.")
@click.option("--top-p", type=float, help="Sample from the smallest set of tokens whose probability reaches p.")
@click.option("--seed", default=0, show_default=True, help="PRNG seed for sampling.")
@click.option("--from-graph", is_flag=True, help="Rebuild the functions from their graphs instead of the StableHLO.")
@handles_errors
def generate(artifact_dir, prompts, id_lists, max_new_tokens, temperature, top_k, top_p, seed, from_graph):
    """Generate text (or token ids) with a text-generation or text2text-generation artifact; needs no torch.

    A causal LM continues each prompt (printed with it); an encoder-decoder reads each prompt as its source
    and prints the decoder's output, from its start token.

    \b
    Example:
      torch2jax generate out/llm --prompt "The capital of France is" --max-new-tokens 32
      torch2jax generate out/llm --ids 1,450,7483 --temperature 0.8 --top-p 0.9 --seed 0
      torch2jax generate out/t5 --prompt "translate English to German: Hello" --max-new-tokens 32
    """

    import torch2jax
    from torch2jax.errors import InputSpecError
    from torch2jax.serve.generator import left_pad
    from torch2jax.serve.seq2seq import right_pad

    if bool(prompts) == bool(id_lists):
        raise InputSpecError("give the prompt as --prompt TEXT or as --ids 1,2,3 (one of them, repeatable for a batch)")
    g = torch2jax.load(artifact_dir, from_graph=from_graph)
    if not isinstance(g, (torch2jax.Generator, torch2jax.Seq2SeqGenerator)):
        raise InputSpecError(f"{artifact_dir} is not a text-generation artifact (convert hf:DIR --task text-generation, "
                             "or --task text2text-generation for an encoder-decoder)")
    seq2seq = isinstance(g, torch2jax.Seq2SeqGenerator)
    if seq2seq and g.spec.takes_features:
        raise InputSpecError(f"{artifact_dir} reads audio features (input_features), not token ids: call "
                             "torch2jax.load(...).generate(input_features=...) in Python")
    tokenizer = None
    if prompts:
        if "tokenizer.json" not in g.tokenizer_files:
            raise InputSpecError(f"{artifact_dir} has no tokenizer (its model directory had no tokenizer.json): "
                                 "pass token ids with --ids 1,450,7483 instead")
        tokenizer = g.tokenizer
        rows = [tokenizer.encode(text).ids for text in prompts]
    else:
        try:
            rows = [[int(t) for t in text.split(",") if t.strip()] for text in id_lists]
        except ValueError:
            raise InputSpecError(f"--ids takes comma-separated integers, got {list(id_lists)}") from None
    if any(not row for row in rows):
        raise InputSpecError("a prompt has no tokens")
    ids, mask = (right_pad if seq2seq else left_pad)(rows, g.spec.pad_token_id)
    width = 1 if seq2seq else ids.shape[1]  # where the new tokens start: after the start token, or the prompt
    sampling = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if v is not None}
    options = {}
    if sampling:
        import jax

        options = {"do_sample": True, "rng": jax.random.key(seed), **sampling}
    start = time.perf_counter()
    out = g.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, **options)
    elapsed = time.perf_counter() - start
    for r, row in enumerate(rows):
        new = [int(t) for t in out[r, width:]]
        ended = next((i for i, t in enumerate(new) if t in g.spec.eos_token_ids), None)
        new = new if ended is None else new[: ended + 1]
        shown = [int(out[r, 0]), *new] if seq2seq else row + new
        click.echo(tokenizer.decode(shown) if tokenizer is not None else ",".join(map(str, shown)))
    click.echo(f"{out.shape[1] - width} new tokens x {len(rows)} rows in {elapsed:.2f}s (first call includes compilation)", err=True)


@main.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.argument("target")
@click.option("--weights", type=click.Path(dir_okay=False), help="state_dict to load into TARGET before comparing.")
@click.option("--input", "inputs", multiple=True, metavar="SPEC", help="Inputs as for convert (default: example_inputs()).")
@click.option("--seed", default=0, show_default=True)
@click.option("--report", "report_file", type=click.Path(dir_okay=False),
              help="Write a markdown report (per-output errors, timings, op counts, environment), pass or fail.")
@handles_errors
def verify(artifact_dir, target, weights, inputs, seed, report_file):
    """Compare an artifact with PyTorch running TARGET on the same inputs.

    \b
    Example:
      torch2jax verify out/gpt sample_models/tiny_gpt.py:TinyGPT --report verify.md

    Inputs: the example inputs, random inputs of the same shapes, and a second size of every
    symbolic dim. Exit status 3 when an output differs beyond its dtype's tolerance.
    """
    import torch2jax
    from torch2jax.capture.converter import StageTimer
    from torch2jax.capture.target import resolve
    from torch2jax.diagnose.report import ReportData, reporting
    from torch2jax.diagnose.verify import check
    from torch2jax.diagnose.verify import verify as run_verify

    timer = StageTimer()
    data = ReportData(title="torch2jax verification report", target=target, artifact=str(artifact_dir), timings=timer.timings)
    with reporting(data, report_file, lambda line: click.echo(line, err=True)):
        with timer.stage("load artifact", ""):
            model = torch2jax.load(artifact_dir)
        data.graph = model.graph
        with timer.stage("build torch model", ""):
            resolved = resolve(target, list(inputs), weights, seed=seed)
        with timer.stage("compare", ""):
            data.verification = run_verify(resolved.module, model, resolved.args, resolved.kwargs, seed)
        click.echo(data.verification.summary())
        check(data.verification)
    click.echo(f"ok: max abs error {data.verification.max_abs:.3g}")


@main.command()
@click.argument("target")
@click.option("--input", "inputs", multiple=True, metavar="SPEC", help="Inputs as for convert (default: example_inputs()).")
@click.option("--weights", type=click.Path(dir_okay=False), help="state_dict to load into TARGET.")
@click.option("--lowerings", multiple=True, type=click.Path(dir_okay=False, exists=True), help="Custom-op lowerings to import.")
@click.option("--seed", default=0, show_default=True)
@handles_errors
def bisect(target, inputs, weights, lowerings, seed):
    """Run torch and JAX node by node and name the first node whose output departs.

    \b
    Example:
      torch2jax bisect sample_models/tiny_gpt.py:TinyGPT
    Exit status 3 when a node diverges, 0 when every node matches.
    """
    for path in lowerings:
        _import_lowerings(path)
    from torch2jax.capture.target import resolve
    from torch2jax.diagnose.bisect import bisect as run_bisect

    resolved = resolve(target, list(inputs), weights, seed=seed)
    divergence, checked = run_bisect(resolved.module, resolved.args, resolved.kwargs)
    if divergence is None:
        click.echo(f"ok: all {checked} compared nodes match torch within tolerance")
        return
    _fail(str(divergence), EXIT_MISMATCH)


from cli import serve as _serve  # noqa: E402, F401  (registers `torch2jax serve`)

if __name__ == "__main__":
    main()
