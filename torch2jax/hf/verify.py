"""Checking a converted causal LM or encoder-decoder against transformers' own greedy generate, as `convert`
checks a forward pass.

Two prompts (sources) of random token ids, one padded to the other's length (a causal LM's on the left,
an encoder-decoder's on the right), run through both; every generated token must be equal (float32).
A bfloat16 conversion is compared with transformers in bfloat16 on its first tokens only (see
`BFLOAT16_TOKENS`): later tokens may part at a near-tie.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import VerificationError
from ..generate.generator import left_pad
from ..generate.seq2seq import right_pad

BFLOAT16_TOKENS = 8


@dataclass
class GenerationCheck:
    tokens: int
    rows: list[tuple[list[int], list[int]]]  # (ours, transformers') new tokens per row
    alone: bool = False  # transformers generated each row alone (a recurrent model: see verify_generation)

    def summary(self) -> str:
        lines = []
        of = " of the row alone" if self.alone else ""
        for row, (ours, theirs) in enumerate(self.rows):
            same = _common_prefix(ours, theirs)
            rule = f" (bfloat16: the first {self.tokens} must be)" if self.tokens < len(theirs) else ""
            lines.append(f"  row {row}: {same} of {len(theirs)} greedy tokens equal to transformers' generate{of}{rule}")
        return "\n".join(lines)

    @property
    def ok(self) -> bool:
        return all(_common_prefix(ours, theirs) >= self.tokens for ours, theirs in self.rows)


def verify_generation(lm: torch.nn.Module, generator, tokens: int = 16, seed: int = 0) -> GenerationCheck:
    """Greedy-generate `tokens` tokens for two prompts (one left-padded) with both; no end token stops either.

    A model with recurrent state (the artifact's cache has "state" tensors) is compared with transformers generating
    each prompt alone: several of transformers' recurrent models let left padding into their state (RWKV and xLSTM
    ignore the attention mask; RecurrentGemma's and LFM2's convolutions take the pads' biases), where the artifact keeps
    it out, so a padded row's right answer is the row's own."""
    lengths = (7, 4)
    if max(lengths) + tokens > generator.spec.max_cache_len:
        tokens = generator.spec.max_cache_len - max(lengths)
    rng = np.random.default_rng(seed)
    batch = min(2, generator.spec.max_batch)
    prompts = [rng.integers(0, generator.spec.vocab_size, length).tolist() for length in lengths[:batch]]
    ids, mask = left_pad(prompts, generator.spec.pad_token_id)
    ours = generator.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False, num_beams=1,
                              eos_token_id=[])
    width = ids.shape[1]
    alone = "state" in (getattr(generator.spec, "cache_kinds", ()) or ())
    if alone:
        theirs = [transformers_greedy(lm, np.asarray([prompt]), tokens, generator.spec.pad_token_id)[0, len(prompt):]
                  for prompt in prompts]
    else:
        theirs = transformers_greedy(lm, ids, tokens, generator.spec.pad_token_id, mask)[:, width:]
    rows = [(ours[r, width:].tolist(), theirs[r].tolist()) for r in range(len(prompts))]
    compared = tokens if generator.spec.cache_dtype != "bfloat16" else min(tokens, BFLOAT16_TOKENS)
    return GenerationCheck(compared, rows, alone)


def verify_seq2seq(lm: torch.nn.Module, generator, tokens: int = 16, seed: int = 0) -> GenerationCheck:
    """Greedy-generate `tokens` tokens for two sources (one right-padded, with its mask) with both; no end token
    stops either (transformers' forced-BOS/EOS tokens, which the artifact applies too, still come). Whisper's sources
    are random features, a VisionEncoderDecoderModel's random images (a fixed size: no padding, no mask)."""
    tokens = min(tokens, generator.spec.max_cache_len)
    rng = np.random.default_rng(seed)
    batch = min(2, generator.spec.max_batch)
    if generator.spec.fixed_shape_source:
        features = rng.standard_normal((batch, *generator.spec.feature_shape)).astype(np.float32)
        ours = generator.generate(**{generator.spec.source_input: features}, max_new_tokens=tokens, do_sample=False,
                                  num_beams=1, eos_token_id=[])
        theirs = transformers_greedy(lm, features, tokens, generator.spec.pad_token_id, dtype=next(lm.parameters()).dtype)
    else:
        lengths = (7, 4)
        sources = [rng.integers(0, generator.spec.vocab_size, min(length, generator.spec.max_source_len)).tolist()
                   for length in lengths[:batch]]
        ids, mask = right_pad(sources, generator.spec.pad_token_id)
        ours = generator.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False, num_beams=1,
                                  eos_token_id=[])
        theirs = transformers_greedy(lm, ids, tokens, generator.spec.pad_token_id, mask)
    start = theirs.shape[1] - tokens  # 1, or 0 where transformers drops the start token (Whisper)
    rows = [(ours[r, 1:].tolist(), theirs[r, start:].tolist()) for r in range(batch)]
    compared = tokens if generator.spec.cache_dtype != "bfloat16" else min(tokens, BFLOAT16_TOKENS)
    return GenerationCheck(compared, rows)


IMAGE_CHECK_TEXT = (5, 2)  # the vision-language check's text tokens besides the image's, per prompt


def image_tokens(vision) -> int:
    """How many image tokens the vision-language check's one image expands to (the most, where the two differ)."""
    if getattr(vision, "patch_size", 0):  # Pixtral: the first image at the config's nominal size
        return vision.native_tokens(check_image_sizes(vision)[0])
    if vision.grid_pinpoints:  # LLaVA-NeXT: an image the size of the first grid (its whole view and that grid's tiles)
        return vision.grid_tokens(vision.grid_pinpoints[0])
    return 4 if vision.spatial_merge_size else vision.tokens_per_image  # variable resolution (Qwen2-VL): 2x2 tokens


CHECK_IMAGE_SIDE = 8  # Pixtral: the check's image is at most this many merged patches a side (a real config's nominal
# 1540-pixel image would be thousands of tokens)


def check_image_sizes(vision) -> list[tuple[int, int]]:
    """Pixtral (images at their own size): the check's two images, the config's nominal size (at most CHECK_IMAGE_SIDE
    merged patches a side) and one a merged patch shorter (padded to the first, as the processor pads), so that the two
    prompts take different token counts."""
    side = vision.patch_size * vision.patch_merge
    height, width = (min(n, CHECK_IMAGE_SIDE * side) for n in vision.pixel_shape[1:])
    return [(height, width), (height - side if height >= 2 * side else height, width)]


def verify_vision_language(vlm: torch.nn.Module, generator, tokens: int = 16, seed: int = 0) -> GenerationCheck:
    """Greedy-generate `tokens` tokens for two prompts, each of random text around one image's expanded image tokens,
    one left-padded, with random pixel values, with both; no end token stops either. An image-text-to-text
    encoder-decoder (VisionEncoderDecoderModel, a Seq2SeqGenerator: no prompt) is checked as one, on two random images."""
    if getattr(generator, "vision", None) is None:
        return verify_seq2seq(vlm, generator, tokens, seed)
    vision = generator.vision
    merge, pins, native = vision.spatial_merge_size, vision.grid_pinpoints, getattr(vision, "patch_size", 0)
    per_image, lengths = image_tokens(vision), IMAGE_CHECK_TEXT
    size = pins[0] if pins else None
    if per_image + max(lengths) + tokens > generator.spec.max_cache_len:
        tokens = generator.spec.max_cache_len - per_image - max(lengths)
    if tokens < 1:
        raise VerificationError(
            f"the check's prompts hold {per_image} image tokens and {max(lengths)} of text, more than the artifact's "
            f"{generator.spec.max_cache_len} cache slots leave room for: convert with --max-cache-len "
            f"{per_image + max(lengths) + 16} or more to check it")
    rng = np.random.default_rng(seed)
    batch = min(2, generator.spec.max_batch)
    text = [t for t in range(generator.spec.vocab_size) if t != vision.image_token_id]
    prompts = []
    sizes = check_image_sizes(vision)[:batch] if native else None
    for row, length in enumerate(lengths[:batch]):
        words = rng.choice(text, length).tolist()
        count = vision.native_tokens(sizes[row]) if native else per_image
        prompts.append(words[:1] + [vision.image_token_id] * count + words[1:])
    ids, mask = left_pad(prompts, generator.spec.pad_token_id)
    grids = {}
    if merge:
        grids = {"image_grid_thw": np.asarray([[1, 2 * merge, 2 * merge]] * batch, np.int64)}
        pixels = rng.standard_normal((batch * 4 * merge * merge, *vision.pixel_shape)).astype(np.float32)
        if getattr(vision, "patch_tower", "") == "naflex":  # LFM2-VL: a row of patches an image, grids 2m x 2m, m x 4m
            shapes = np.asarray([[2 * merge, 2 * merge], [merge, 4 * merge]][:batch], np.int64)
            pixels = pixels.reshape(batch, 4 * merge * merge, -1)
            grids = {"spatial_shapes": shapes, "pixel_attention_mask": np.ones(pixels.shape[:2], np.int64)}
    elif native:  # each image's pixels at its top left, zeros beyond (the processor's padding)
        grids = {"image_sizes": np.asarray(sizes, np.int64)}
        pixels = rng.standard_normal((batch, vision.pixel_shape[0], *sizes[0])).astype(np.float32)
        for image, (height, width) in zip(pixels, sizes):
            image[:, height:], image[:, :, width:] = 0, 0
    elif pins:
        grids = {"image_sizes": np.asarray([size] * batch, np.int64)}
        pixels = rng.standard_normal((batch, vision.grid_tiles(size), *vision.pixel_shape)).astype(np.float32)
    else:
        pixels = rng.standard_normal((batch, *vision.pixel_shape)).astype(np.float32)
        second = generator.encode_model.graph.user_inputs[1:]  # DeepSeek-VL hybrid: each image at its high resolution
        if second:
            high = rng.standard_normal((batch, *second[0].meta.shape[1:])).astype(np.float32)
            grids = {"high_res_pixel_values": high}
    ours = generator.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=tokens, do_sample=False,
                              eos_token_id=[], **grids)
    extra = {**processor_token_types(vlm, vision, ids), **{k: torch.from_numpy(v) for k, v in grids.items()}}
    if merge and "image_merge_sizes" in inspect.signature(vlm.forward).parameters:  # VideoLLaMA3's processor: 1 an image
        extra["image_merge_sizes"] = torch.full((batch,), merge, dtype=torch.long)
    # Idefics2/3 and SmolVLM take [prompts, images per prompt, C, H, W]: one image each here
    given = pixels[:, None] if getattr(vision, "image_batches", False) else pixels
    theirs = transformers_greedy(vlm, ids, tokens, generator.spec.pad_token_id, mask,
                                 pixel_values=torch.from_numpy(given).to(next(vlm.parameters()).dtype), **extra)
    width = ids.shape[1]
    rows = [(ours[r, width:].tolist(), theirs[r, width:].tolist()) for r in range(batch)]
    compared = tokens if generator.spec.cache_dtype != "bfloat16" else min(tokens, BFLOAT16_TOKENS)
    return GenerationCheck(compared, rows)


def processor_token_types(vlm: torch.nn.Module, vision, ids: np.ndarray) -> dict:
    """The token_type_ids the model's processor adds, for models that read them: Gemma 3's 1 at image tokens (an
    image's tokens attend both ways), PaliGemma's 0 over the whole prompt (the prefix attends both ways)."""
    parameters = inspect.signature(vlm.forward).parameters
    if "mm_token_type_ids" in parameters:  # Qwen2-VL: 1 at image tokens (its 3-D positions are computed from them)
        return {"mm_token_type_ids": torch.from_numpy((ids == vision.image_token_id).astype(np.int32))}
    if "token_type_ids" not in parameters:
        return {}
    types = np.zeros(ids.shape, np.int64) if vision.prefix_lm else (ids == vision.image_token_id).astype(np.int64)
    return {"token_type_ids": torch.from_numpy(types)}


def transformers_greedy(lm: torch.nn.Module, ids: np.ndarray, tokens: int, pad_token_id: int,
                        mask: np.ndarray | None = None, eos_token_id: int | None = None, dtype: torch.dtype | None = None,
                        **inputs: torch.Tensor) -> np.ndarray:
    """transformers' own greedy generate, the reference; eos_token_id=None makes exactly `tokens` new tokens.
    `ids` may be float features (Whisper), cast to `dtype`; `inputs` go to generate as they are (pixel_values)."""
    # BLIP-2's generate calls its wrapped language model's, which reads that model's own generation config
    configs = [m.generation_config for m in (lm, getattr(lm, "language_model", None))
               if getattr(m, "generation_config", None) is not None]
    saved = [c.eos_token_id for c in configs]
    for config in configs:
        config.eos_token_id = eos_token_id
    try:
        with torch.no_grad():
            source = torch.from_numpy(np.asarray(ids))
            source = source if dtype is None else source.to(dtype)
            # the prompt by name where generate's first argument is the image (BLIP-2's generate(pixel_values, input_ids))
            by_name = next(iter(inspect.signature(lm.generate).parameters)) == "pixel_values"
            prompt, named = ((), {"input_ids": source}) if by_name else ((source,), {})
            out = lm.generate(*prompt, **named, max_new_tokens=tokens, do_sample=False, num_beams=1, pad_token_id=pad_token_id,
                              attention_mask=None if mask is None else torch.from_numpy(np.asarray(mask)).long(), **inputs)
        return out.numpy()
    finally:
        for config, eos in zip(configs, saved):
            config.eos_token_id = eos


def check_generation(result: GenerationCheck) -> None:
    if not result.ok:
        raise VerificationError(
            "generation differs from transformers' greedy generate:\n" + result.summary()
            + "\n(ours vs transformers, new tokens per row: "
            + "; ".join(f"{o[:result.tokens]} vs {t[:result.tokens]}" for o, t in result.rows) + ")"
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
