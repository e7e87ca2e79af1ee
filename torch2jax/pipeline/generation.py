"""An `hf:DIR` generation target (a causal LM, an encoder-decoder or a vision-language model) to an artifact checked
against transformers' greedy generate: in memory, or with the weights streamed from the safetensors files (causal LMs
and vision-language models).

The conversion itself is hf.convert.convert_generator, as for torch2jax.convert_hf; what is the pipeline's own is the
check before the rename (hf/verify.py against the model in memory; hf/verify_slice.py for streamed weights) and the save.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..capture.converter import quantize_like
from ..generate.artifacts import load_generator, save_generator
from ..generate.seq2seq import Seq2SeqGenerator
from ..hf.convert import convert_generator
from ..hf.options import GenerationOptions
from ..hf.source import HFSource, load_generation_model
from ..hf.steps.causal_lm import repeat_slice
from ..hf.tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION
from ..hf.verify import check_generation, verify_generation, verify_seq2seq, verify_vision_language
from ..hf.verify_slice import verify_streamed
from .conversion import BytesFn, Conversion, ProgressFn

# what each task's artifact holds, for the progress line; and the comparison with transformers of a model in memory
ENTRY_POINTS = {IMAGE_TEXT_TO_TEXT: "encode_image, prefill and decode", TEXT2TEXT_GENERATION: "encode and decode"}
COMPARE_IN_MEMORY = {IMAGE_TEXT_TO_TEXT: verify_vision_language, TEXT2TEXT_GENERATION: verify_seq2seq}


def export_generator(source: HFSource, out: Path, *, options: GenerationOptions, platforms: Sequence[str], force: bool,
                     verify: bool, seed: int, verify_tokens: int, verify_layers: int, progress: ProgressFn | None,
                     on_bytes: BytesFn | None) -> Conversion:
    """See pipeline.convert_target; `source` as hf.source.resolve_source gives it (the model not yet loaded). A streamed
    model deeper than `verify_layers` is verified on a slice of its first layers, converted the same way, so that
    verification never needs the whole model in memory."""
    def report(stage: str, message: str) -> None:
        if progress:
            progress(stage, message)

    stream = options.stream_weights
    how = "build {} with fake parameters, map its safetensors files" if stream else "load {} with transformers"
    report("build model", how.format(source.name))
    source = load_generation_model(source, stream)
    generator = convert_generator(source, options, progress)
    quantization = next(iter(generator.entries().values())).quantization  # {} when the weights are stored as they are
    checks: list[str] = []
    if stream:
        vision = source.task == IMAGE_TEXT_TO_TEXT

        def check(tmp: Path) -> None:
            checks.append(verify_streamed(source, tmp, options, layers=verify_layers, tokens=verify_tokens, seed=seed,
                                          progress=progress, quantization=quantization,
                                          repeat_slice=repeat_slice(source.model) if options.repeat_layers and not vision else None))

        written = f"stream {source.weights.checkpoint.nbytes / 1e9:.2f} GB of weights into {out}"
    else:
        compare = COMPARE_IN_MEMORY.get(source.task, verify_generation)

        def check(tmp: Path) -> None:
            report("verify", f"greedy-generate {verify_tokens} tokens with the saved artifact and with transformers")
            result = compare(quantize_like(source.model, quantization), load_generator(tmp), tokens=verify_tokens, seed=seed)
            how = f" (its {quantization['scheme']} weights dequantized)" if quantization else ""
            checks.append(f"verified against transformers{how}:\n{result.summary()}")
            check_generation(result)

        written = f"write {out}"
    entry_points = "encode and decode" if isinstance(generator, Seq2SeqGenerator) else ENTRY_POINTS.get(
        source.task, "prefill and decode")  # an image encoder-decoder's task is image-text-to-text
    report("save", f"jax.export {entry_points}, {written}")
    save_generator(generator, out, force=force, platforms=list(platforms), source=source.name,
                   check=check if verify else None, on_bytes=on_bytes)
    if stream and not verify:
        checks.append("not verified (--no-verify)")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Conversion(out, size, str(generator), stream, checks)
