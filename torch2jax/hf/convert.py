"""A Hugging Face model (a local directory, or the model object) to a torch-free generator: the one conversion dispatch
that `torch2jax.convert_hf`, `pipeline.convert_target` (what `torch2jax convert hf:DIR` runs) and the verification of a
streamed model's slice (hf/verify_slice.py) all call.

The way through the hf room, in order: the source resolved once (hf/source.py: the directory, its config, the task, the
model loaded or built with fake params), then by task one of three step converters over the KV cache layout of
hf/steps/kv_cache.py: a causal LM's step (hf/steps/causal_lm.py, alike layers repeated by hf/steps/layer_repeat.py), an
encoder-decoder's encode and decode steps (hf/steps/seq2seq.py; an image-text-to-text encoder-decoder too,
VisionEncoderDecoderModel's image encoder read as its source) or a vision-language model's image encoder and
multimodal step (hf/steps/vision_language.py); last, the directory's tokenizer (and processor) files attached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..generate.generator import Generator
from ..generate.processors import GenerationSettings
from ..generate.seq2seq import Seq2SeqGenerator
from ..generate.vision_language import VisionLanguageGenerator
from .options import GenerationOptions
from .source import HFSource, load_generation_model, resolve_source
from .steps.causal_lm import convert_causal_lm
from .steps.fixed_images import TWO_RESOLUTIONS
from .steps.image_tokens import convert_token_images
from .steps.omni import convert_omni_thinker
from .steps.patch_towers import convert_patch_tower
from .steps.recurrent import convert_recurrent_lm, keeps_recurrent_state
from .steps.seq2seq import convert_seq2seq
from .steps.two_resolutions import convert_two_resolutions
from .steps.vision_language import OMNI_THINKERS, PATCH_TOWERS, TOKEN_IMAGES, convert_vision_language, with_processor_text
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION, reads_images

AnyGenerator = Generator | Seq2SeqGenerator | VisionLanguageGenerator
ProgressFn = Callable[[str, str], None]  # (stage, message), as each conversion stage starts
# vision-language families with a conversion of their own, each taking convert_vision_language's arguments: image tokens
# of a vocabulary (Ovis2, Chameleon, Emu3), SigLIP-style towers over patches, the Omni thinkers (without their audio
# tower, their own rope index), DeepSeek-VL hybrid's two resolutions
IMAGE_CONVERTERS = {**dict.fromkeys(TOKEN_IMAGES, convert_token_images), **dict.fromkeys(PATCH_TOWERS, convert_patch_tower),
                    **dict.fromkeys(OMNI_THINKERS, convert_omni_thinker),
                    **dict.fromkeys(TWO_RESOLUTIONS, convert_two_resolutions)}


def convert_hf(source: Any, options: GenerationOptions | None = None, *, task: str | None = None,
               progress: ProgressFn | None = None) -> AnyGenerator:
    """`source` (an `hf:DIR` / path, or a transformers model) -> its generator: resolved, loaded (or built with fake
    params, with `options.stream_weights`) and converted. torch2jax.convert_hf documents the options."""
    options = options or GenerationOptions()
    resolved = resolve_source(source, task)
    loaded = load_generation_model(resolved, options.stream_weights)
    return convert_generator(loaded, options, progress)


def convert_generator(source: HFSource, options: GenerationOptions, progress: ProgressFn | None = None) -> AnyGenerator:
    """The loaded source (hf/source.load_generation_model) -> its generator, by task, with the directory's tokenizer
    (and processor) files attached to travel with the artifact."""
    common = dict(max_cache_len=options.max_cache_len, max_batch=options.max_batch, dtype=options.dtype, progress=progress,
                  quantize=options.quantize, group_size=options.group_size)
    # an image-text-to-text encoder-decoder (VisionEncoderDecoderModel: TrOCR, Donut) is an encoder-decoder whose source
    # is pixels: the seq2seq steps, not a vision-language model's (whose image tokens go into a causal LM's prompt)
    seq2seq = source.task == TEXT2TEXT_GENERATION or (source.task == IMAGE_TEXT_TO_TEXT and reads_images(source.model))
    if source.task == IMAGE_TEXT_TO_TEXT and not seq2seq:
        convert = IMAGE_CONVERTERS.get(type(source.model).__name__, convert_vision_language)
        generator = convert(source.model, weights=source.weights, **common)
    elif seq2seq:
        generator = convert_seq2seq(source.model, max_source_len=options.max_source_len, weights=source.weights, **common)
    else:  # state-space layers (Mamba, Mamba2 and hybrids): their recurrent state is the cache (hf/steps/recurrent.py)
        convert = convert_recurrent_lm if keeps_recurrent_state(source.model) else convert_causal_lm
        generator = convert(source.model, weights=source.weights, repeat_layers=options.repeat_layers, **common)
    # the checkpoint's generation config (sampling settings, logits processors): each generate call's defaults
    settings = GenerationSettings.from_config(getattr(source.model, "generation_config", None))
    generator.spec = dataclasses.replace(generator.spec, settings=settings)
    if source.directory is not None:
        generator.tokenizer_files = dict(source.tokenizer_files)
        if source.task == IMAGE_TEXT_TO_TEXT:
            generator.tokenizer_files.update(source.processor_files)
        if isinstance(generator, VisionLanguageGenerator):
            generator.vision = with_processor_text(generator.vision, source.directory)
    return generator
