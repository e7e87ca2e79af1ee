"""An `hf:DIR` generation target (a causal LM, an encoder-decoder or a vision-language model) to an artifact checked
against transformers' greedy generate: in memory, or with the weights streamed from the safetensors files (causal LMs
and vision-language models)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..capture.converter import quantize_like
from ..generate.generator_artifact import load_generator, save_generator
from ..hf.causal_lm import convert_causal_lm, repeat_slice
from ..hf.convert import causal_lm_from, seq2seq_lm_from
from ..hf.directory import tokenizer_files
from ..hf.seq2seq import convert_seq2seq
from ..hf.streamed import streamed_causal_lm
from ..hf.tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION
from ..hf.verify import check_generation, verify_generation, verify_seq2seq, verify_vision_language
from ..hf.verify_slice import verify_streamed
from ..hf.vision_language import convert_vision_language, processor_files, vision_language_from, with_processor_text
from .conversion import BytesFn, Conversion, ProgressFn


def export_generator(target: str, out: Path, *, task: str, stream: bool, platforms: Sequence[str], force: bool, verify: bool,
                     dtype: str | None, seed: int, max_cache_len: int, max_batch: int, max_source_len: int,
                     verify_tokens: int, verify_layers: int, repeat_layers: bool, progress: ProgressFn | None,
                     on_bytes: BytesFn | None, quantize: str | None = None, group_size: int = 64) -> Conversion:
    """See pipeline.convert_target. A streamed model deeper than `verify_layers` is verified on a slice of its first
    layers, converted the same way, so that verification never needs the whole model in memory."""
    def report(stage: str, message: str) -> None:
        if progress:
            progress(stage, message)

    checks: list[str] = []
    if stream:
        vision = task == IMAGE_TEXT_TO_TEXT
        report("build model", f"build {target} with fake parameters, map its safetensors files")
        lm, directory, weights = streamed_causal_lm(target, vision=vision)
        gigabytes = weights.checkpoint.nbytes / 1e9
        if vision:
            generator = convert_vision_language(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                                progress=progress, weights=weights, quantize=quantize, group_size=group_size)
        else:
            generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                          progress=progress, weights=weights, repeat_layers=repeat_layers, quantize=quantize,
                                          group_size=group_size)

        def check(tmp: Path) -> None:
            checks.append(verify_streamed(directory, tmp, lm.config, layers=verify_layers, tokens=verify_tokens, dtype=dtype,
                                          max_cache_len=max_cache_len, max_batch=max_batch, seed=seed, progress=progress,
                                          repeat_slice=repeat_slice(lm) if repeat_layers and not vision else None,
                                          quantization=generator.prefill_model.quantization, vision=vision))

        entries = "encode_image, prefill and decode" if vision else "prefill and decode"
        saving = f"jax.export {entries}, stream {gigabytes:.2f} GB of weights into {out}"
    else:
        report("build model", f"load {target} with transformers")
        if task == IMAGE_TEXT_TO_TEXT:
            lm, directory = vision_language_from(target)
            generator = convert_vision_language(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                                progress=progress, quantize=quantize, group_size=group_size)
            compare, entries = verify_vision_language, "encode_image, prefill and decode"
        elif task == TEXT2TEXT_GENERATION:
            lm, directory = seq2seq_lm_from(target)
            generator = convert_seq2seq(lm, max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len,
                                        dtype=dtype, progress=progress, quantize=quantize, group_size=group_size)
            compare, entries = verify_seq2seq, "encode and decode"
        else:
            lm, directory = causal_lm_from(target)
            generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                          progress=progress, repeat_layers=repeat_layers, quantize=quantize,
                                          group_size=group_size)
            compare, entries = verify_generation, "prefill and decode"

        def check(tmp: Path) -> None:
            report("verify", f"greedy-generate {verify_tokens} tokens with the saved artifact and with transformers")
            quantization = generator.entries()[next(iter(generator.entries()))].quantization
            result = compare(quantize_like(lm, quantization), load_generator(tmp), tokens=verify_tokens, seed=seed)
            how = f" (its {quantization['scheme']} weights dequantized)" if quantization else ""
            checks.append(f"verified against transformers{how}:\n{result.summary()}")
            check_generation(result)

        saving = f"jax.export {entries}, write {out}"
    generator.tokenizer_files = tokenizer_files(directory)
    if task == IMAGE_TEXT_TO_TEXT:
        generator.tokenizer_files.update(processor_files(directory))
        generator.vision = with_processor_text(generator.vision, directory)
    report("save", saving)
    save_generator(generator, out, force=force, platforms=list(platforms), source=target, check=check if verify else None,
                   on_bytes=on_bytes)
    if stream and not verify:
        checks.append("not verified (--no-verify)")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Conversion(out, size, str(generator), stream, checks)
