"""`torch2jax.convert_hf`: a Hugging Face model (a local directory, or the model object) to a torch-free generator.

The way through the hf room, in order: the task (hf/tasks.py), the model loaded or built with fake
params (hf/directory.py, hf/streamed.py), then one of the two generators: a causal LM's step over the
KV cache (hf/causal_lm.py, which repeats alike layers with hf/layer_repeat.py) or an encoder-decoder's
encode and decode steps (hf/seq2seq.py), both over the cache layout of hf/kv_cache.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputSpecError
from ..generate.generator import Generator
from ..generate.seq2seq import Seq2SeqGenerator
from ..runtime.quantize import DEFAULT_GROUP_SIZE
from .causal_lm import convert_causal_lm
from .directory import load_model, model_dir, prepare_for_export, read_config, tokenizer_files, transformers
from .seq2seq import convert_seq2seq
from .streamed import streamed_causal_lm
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION, check_generation_task, task_of
from .vision_language import convert_vision_language, processor_files, vision_language_from, with_processor_text


def convert_hf(
    source: Any,
    *,
    task: str | None = None,
    max_cache_len: int = 512,
    max_batch: int = 8,
    max_source_len: int = 512,
    dtype: str | None = None,
    stream_weights: bool = False,
    repeat_layers: bool = True,
    quantize: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    progress: Callable[[str, str], None] | None = None,
) -> Generator | Seq2SeqGenerator:
    """A Hugging Face model -> a torch-free `Generator` (causal LM: prefill/decode over a donated KV cache), or for
    text2text-generation (encoder-decoders: T5, BART, Whisper) a `Seq2SeqGenerator` (encode/decode).

    Args:
      source: a local model directory as `save_pretrained` writes it (a path, or "hf:DIR"), or a transformers model.
      task: "text-generation" or "text2text-generation"; default: what the config's `architectures` implies.
      max_cache_len: KV cache slots (prompt + new tokens); for an encoder-decoder, the most new tokens.
      max_batch: the most prompts per `generate` call.
      max_source_len: encoder-decoders: the longest source, in tokens.
      dtype: e.g. "bfloat16": params and computation in that precision.
      stream_weights: a directory's causal LM (or image-text-to-text model) is built with fake params and each weight
        read from the safetensors files only when the generator is saved (memory stays flat in the model's size; it runs
        once saved and loaded).
      repeat_layers: False traces every decoder layer; by default a stack of alike layers is traced at 3 and 4 layers
        and a middle one repeated, after checking that this reproduces the 4-layer trace.
      quantize: "int8" (per output row), "int4" (in groups of `group_size` input columns) or "int8-dynamic" (int8
        weights, inputs rounded to int8 rows at each product): the weights of the projections (an encoder's and a
        decoder's) and the LM head are stored quantized (runtime/quantize.py); a vision tower keeps the model's dtype.
      group_size: int4's group of input columns sharing one scale.
      progress: called with (stage, message) as each conversion stage starts.
    """
    task = task_of(source, task)
    check_generation_task(task)
    if task == IMAGE_TEXT_TO_TEXT:
        weights = None
        if stream_weights:
            vlm, directory, weights = _streamed(source, vision=True)
        else:
            vlm, directory = vision_language_from(source)
        generator = convert_vision_language(vlm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                            progress=progress, weights=weights, quantize=quantize, group_size=group_size)
        if directory is not None:
            generator.tokenizer_files = {**tokenizer_files(directory), **processor_files(directory)}
            generator.vision = with_processor_text(generator.vision, directory)
        return generator
    if task == TEXT2TEXT_GENERATION:
        if stream_weights:
            raise InputSpecError("stream_weights=True is for causal LMs and image-text-to-text models; text2text-generation "
                                 "models load in memory: pass stream_weights=False")
        lm, directory = seq2seq_lm_from(source)
        generator = convert_seq2seq(lm, max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len,
                                    dtype=dtype, progress=progress, quantize=quantize, group_size=group_size)
    else:
        weights = None
        if stream_weights:
            lm, directory, weights = _streamed(source)
        else:
            lm, directory = causal_lm_from(source)
        generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, progress=progress,
                                      weights=weights, repeat_layers=repeat_layers, quantize=quantize, group_size=group_size)
    if directory is not None:
        generator.tokenizer_files = tokenizer_files(directory)
    return generator


def _streamed(source: Any, vision: bool = False) -> tuple[Any, Path, Any]:
    """(the model with fake params, its directory, its WeightSource): streamed_causal_lm, for a directory only."""
    if not isinstance(source, (str, os.PathLike)):
        raise InputSpecError("stream_weights=True reads the weights from a model directory: pass its path, not a model object")
    return streamed_causal_lm(source, vision=vision)


def seq2seq_lm_from(source: Any) -> tuple[Any, Path | None]:
    """(the encoder-decoder ready for export, its directory or None) from an `hf:DIR` / path or a transformers model."""
    directory = None
    if isinstance(source, (str, os.PathLike)):
        directory = model_dir(source)
        module = transformers()
        speech = type(read_config(directory)) in module.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING  # Whisper
        lm = load_model(module.AutoModelForSpeechSeq2Seq if speech else module.AutoModelForSeq2SeqLM, directory)
    elif getattr(source, "config", None) is None:
        raise InputSpecError(f"convert_hf takes a model directory or a transformers model, got {type(source).__name__}")
    else:
        lm = source
    return lm.eval(), directory


def causal_lm_from(source: Any) -> tuple[Any, Path | None]:
    """(the causal LM ready for export, its directory or None) from an `hf:DIR` / path or a transformers model."""
    directory = None
    if isinstance(source, (str, os.PathLike)):
        directory = model_dir(source)
    elif getattr(source, "config", None) is None:
        raise InputSpecError(f"convert_hf takes a model directory or a transformers model, got {type(source).__name__}")
    lm = load_model(transformers().AutoModelForCausalLM, directory) if directory is not None else source
    prepare_for_export(lm)
    return lm.eval(), directory
