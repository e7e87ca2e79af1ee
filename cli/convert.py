"""`torch2jax convert`: a model file or an hf: directory to a verified artifact (torch2jax.pipeline.convert_target)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Progress, handles_errors


@click.command()
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
                             "both for `torch2jax generate`. The others are one forward pass through the task's auto class: "
                             "feature-extraction, text-/token-/image-/audio-classification, fill-mask, question-answering, "
                             "multiple-choice, object-detection, semantic-segmentation, depth-estimation, "
                             "zero-shot-image-classification, automatic-speech-recognition (CTC).")
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
@click.option("--quantize", type=click.Choice(["int8", "int4", "int8-dynamic"]),
              help="Store the weights of the matrix products (nn.Linear's: the projections and LM head of a decoder, an "
                   "encoder-decoder or a vision-language model's language model, not its vision tower) quantized, "
                   "weight-only: int8 with one scale per output row, int4 two per byte with one scale per --group-size "
                   "input columns; int8-dynamic stores int8 and also rounds each Linear's input rows to int8 as it "
                   "multiplies (int8 x int8 products: no float copy of a weight on CPU). Verification compares with torch "
                   "running the same weights dequantized (and, for int8-dynamic, the same rounded inputs).")
@click.option("--group-size", default=64, show_default=True, help="--quantize int4: input columns sharing one scale.")
@click.option("--specialize", multiple=True, metavar="NAME",
              help="Fix this integer input to its example value, repeatable: for a model that reads an input's values to "
                   "decide shapes (an image's size). Side-data inputs are fixed automatically where torch.export stops on "
                   "their values; the artifact refuses any other value.")
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@handles_errors
def convert(target, out_dir, inputs, weights, platforms, force, no_verify, train, dtype, lowerings, seed, report_file, repro_dir,
            task, max_cache_len, max_batch, max_source_len, verify_tokens, weights_in_memory, verify_layers, trace_all_layers,
            quantize, group_size, specialize, quiet):
    """Convert TARGET (model.py:Model, model.py:make_model, or hf:DIR) into an artifact directory.

    \b
    Example:
      torch2jax convert sample_models/tiny_gpt.py:TinyGPT --out out/gpt
      torch2jax convert model.py:Net --input x=float32[batch,3,32,32] --out out/net --report report.md
      torch2jax convert hf:path/to/llama --task text-generation --max-cache-len 512 --max-batch 8 --out out/llm
      torch2jax convert hf:path/to/t5 --task text2text-generation --max-source-len 512 --out out/t5
      torch2jax convert hf:path/to/llama --dtype bfloat16 --quantize int8 --out out/llm-int8

    hf:DIR is a local model directory as save_pretrained writes it (config.json, *.safetensors,
    tokenizer files); nothing is downloaded.

    By default the saved artifact is loaded back and compared with PyTorch on the example
    inputs, on random inputs of the same shapes and on a second size of each symbolic dim; a
    mismatch exits with status 3 and leaves no output directory. When a single op stops the
    conversion, a standalone script reproducing it is written and its path printed.
    """
    from torch2jax.hf.options import GenerationOptions
    from torch2jax.pipeline import convert_target

    options = GenerationOptions(max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len, dtype=dtype,
                                stream_weights=not weights_in_memory, repeat_layers=not trace_all_layers, quantize=quantize,
                                group_size=group_size)
    progress = Progress(quiet)
    try:
        result = convert_target(
            target, out_dir, options=options, inputs=inputs, weights=weights, task=task,
            platforms=[p.strip() for p in platforms.split(",") if p.strip()], force=force, verify=not no_verify,
            train=train, seed=seed, verify_tokens=verify_tokens, verify_layers=verify_layers, specialize=specialize,
            lowerings=lowerings, report=report_file, repro_dir=repro_dir, progress=progress, on_bytes=progress.bytes_written,
        )
    finally:
        progress.done()
        if report_file and Path(report_file).is_file():  # written pass or fail, once the conversion began
            click.echo(f"report: {report_file}", err=True)
    click.echo(result.summary())
