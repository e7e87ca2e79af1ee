"""Generation with images, torch-free: a vision-language artifact's three entry points over one params tree.

    g = torch2jax.load("out/vlm")                              # a VisionLanguageGenerator
    ids = g.generate(input_ids, pixel_values=pixels, attention_mask=mask, max_new_tokens=32)
    ids, pixels = g.processor_inputs("What is in the picture?", "cat.png")   # as the model's processor makes them
    [reply] = g.generate_text(["What is in the picture?"], images=["cat.png"])

`encode_image` turns pixel values into image features; `prefill` is the causal-LM step over text embeddings
with each image token's embedding replaced by its feature row; `decode` is the causal-LM decode step. Which
feature row each image token takes is computed from the ids, as transformers does (image_positions.py): the
image tokens in row-major order take the images' features in order. Everything else (the donated cache, whose
tensors may be a recurrent text model's states as well as keys and values (Qwen3.5), the left-padded batch, the length
buckets, sampling) is the causal LM's (generate/generator.py). The manifest's vision
section is vision_spec.py; the processor, torch-free, vision_processor.py. Mistral3 and LightOnOCR take each image at
its own size (image_sizes): the runtime cuts the padded pixels into each image's patches and merge blocks
(native_patches), as transformers crops and unfolds them. Chameleon's and Emu3's encode_image gives VQ codes, which
the runtime maps to the image tokens' ids (vision_spec.image_token_rows; Emu3: each image's own codes cropped from the
padded batch's, each row ended by its row-end token).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..ir import dtypes
from ..runtime.artifact import ArtifactContents
from ..runtime.model import Model
from ..runtime.sharding import ShardingPlan
from . import vision_processor
from .generator import GenerationSpec, Generator
from .image_positions import image_index, patch_bicubic, patch_interpolation, patch_positions, patch_windows, rope_index
from .image_processing import ImageProcessor
from .loop import Completion, call_entry, finish, until_end
from .naflex_inputs import naflex_patches
from .omni_positions import omni_rope_index, refuse_audio_video
from .patch_inputs import encoder_inputs
from .prompts import check_prompt
from .text import ChatTemplate
from .vision_spec import VisionSpec, image_token_rows


class VisionLanguageGenerator(Generator):
    """A vision-language model's encode_image, prefill and decode over one params tree, with `generate`."""

    TASK = "image-text-to-text"
    ENTRY_POINTS = ("prefill", "decode", "encode_image")

    def __init__(self, encode: Model, prefill: Model, decode: Model, spec: GenerationSpec, vision: VisionSpec,
                 manifest: dict | None = None, tokenizer_files: dict[str, Path] | None = None,
                 sharding: ShardingPlan | None = None):
        super().__init__(prefill, decode, spec, manifest, tokenizer_files, sharding=sharding)
        self.encode_model = encode
        self.vision = vision
        self._encode = jax.jit(lambda params, *inputs: call_entry(self.encode_model, params, *inputs))

    @classmethod
    def from_artifact(cls, contents: ArtifactContents) -> VisionLanguageGenerator:
        models, manifest = contents.models, contents.manifest
        return cls(models["encode_image"], models["prefill"], models["decode"], GenerationSpec.from_json(manifest.get("generation")),
                   VisionSpec.from_json(manifest.get("vision")), manifest, contents.tokenizer_files, sharding=contents.sharding)

    def entries(self) -> dict[str, Model]:
        return {"prefill": self.prefill_model, "decode": self.decode_model, "encode_image": self.encode_model}

    def manifest_sections(self) -> dict:
        return {**super().manifest_sections(), "vision": self.vision.to_json()}

    def encode_images(self, pixel_values: Any, high_res_pixel_values: Any = None) -> jax.Array:
        """[N, C, H, W] pixel values -> [N, tokens_per_image, feature_size] image features (LLaVA-NeXT: N tiles ->
        their feature rows [N * tokens_per_image + 1, feature_size], the image_newline vector last; DeepSeek-VL
        hybrid: with each image's high_res_pixel_values too)."""
        pixels = np.asarray(pixel_values)
        if pixels.ndim == len(self.vision.pixel_shape):  # one image (Inkling's images are its patches, of rank 4)
            pixels = pixels[None]
        if pixels.ndim != len(self.vision.pixel_shape) + 1 or tuple(pixels.shape[1:]) != self.vision.pixel_shape:
            raise InputSpecError(f"pixel_values must be [images, {', '.join(map(str, self.vision.pixel_shape))}] "
                                 f"(as the model's processor makes them), got {list(pixels.shape)}")
        if not 1 <= pixels.shape[0] <= self.vision.max_images:
            raise InputSpecError(f"{pixels.shape[0]} images: this artifact takes 1 to {self.vision.max_images} per call")
        return self._encode(self.params, jnp.asarray(pixels, dtypes.jax_dtype(self.vision.feature_dtype)),
                            *self._high_res(high_res_pixel_values, len(pixels)))

    def _high_res(self, high_res_pixel_values: Any, images: int) -> tuple:
        """The encoder's second input where it takes one (DeepSeek-VL hybrid: each image at its high resolution,
        [images, C, H, W] as its processor makes them), checked against the encoder's shape; () for other models."""
        inputs = self.encode_model.graph.user_inputs
        if len(inputs) < 2:
            if high_res_pixel_values is not None:
                raise InputSpecError("high_res_pixel_values are for DeepSeek-VL hybrid's images; this model takes none")
            return ()
        shape = tuple(inputs[1].meta.shape[1:])
        if high_res_pixel_values is None:
            raise InputSpecError("this model takes each image at two resolutions: give high_res_pixel_values with "
                                 "pixel_values, as its processor makes them")
        pixels = np.asarray(high_res_pixel_values)
        if pixels.ndim != 4 or len(pixels) != images or tuple(pixels.shape[1:]) != shape:
            raise InputSpecError(f"high_res_pixel_values must be [{images}, {', '.join(map(str, shape))}] (one per image "
                                 f"of pixel_values), got {list(pixels.shape)}")
        return (jnp.asarray(pixels, dtypes.jax_dtype(self.vision.feature_dtype)),)

    def encode_grids(self, pixel_values: Any, image_sizes: Any, batch_num_images: Any = None) -> jax.Array:
        """LLaVA-NeXT / OneVision: [images, tiles, C, H, W] pixel values (each image's whole view and grid tiles, then
        zero tiles up to the most) and image_sizes [images, 2] (height, width), as their processors make them -> the
        images' tokens' features [rows, feature_size] in order: each image's tiles encoded, then packed
        (anyres.packed_taps). OneVision's `batch_num_images` (images per prompt, as its processor returns it): an image
        among several in a prompt is its whole view alone."""
        sizes, pixels = np.asarray(image_sizes), np.asarray(pixel_values)
        if sizes.ndim != 2 or sizes.shape[1] != 2 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
            raise InputSpecError(f"image_sizes must be [images, 2] positive integers (height, width), got "
                                 f"{sizes.dtype}{list(sizes.shape)}")
        if pixels.ndim != 5 or pixels.shape[0] != len(sizes) or tuple(pixels.shape[2:]) != self.vision.pixel_shape:
            raise InputSpecError(f"pixel_values must be [{len(sizes)} images, tiles, {', '.join(map(str, self.vision.pixel_shape))}]"
                                 f" (as the model's processor makes them), got {list(pixels.shape)}")
        whole = self.vision.whole_only(batch_num_images, len(sizes))
        counts = [self.vision.grid_tiles(size, alone) for size, alone in zip(sizes, whole)]
        if max(counts) > pixels.shape[1]:
            raise InputSpecError(f"image_sizes {sizes.tolist()} need {counts} tiles, pixel_values has {pixels.shape[1]} per image")
        rows = self.encode_images(np.concatenate([image[:count] for image, count in zip(pixels, counts)]))
        starts = np.cumsum([0, *counts]) * self.vision.tokens_per_image
        taps = [self.vision.grid_taps(size, int(first), rows.shape[0] - 1, alone) for size, first, alone in zip(sizes, starts, whole)]
        index, weight = (np.concatenate(parts) for parts in zip(*taps))
        if not weight[:, 1:].any():  # every token one row (LLaVA-NeXT; OneVision's maps not shrunk)
            return jnp.take(rows, jnp.asarray(index[:, 0]), axis=0)
        picked = jnp.take(rows, jnp.asarray(index.reshape(-1)), axis=0).reshape(*index.shape, rows.shape[-1])
        return (picked * jnp.asarray(weight, rows.dtype)[..., None]).sum(axis=1)

    def encode_patches(self, pixel_values: Any, image_grid_thw: Any) -> jax.Array:
        """Variable resolution (Qwen2-VL): [patches, patch_dim] flattened patches and [images, 3] grids, as the
        processor makes them -> [patches / merge^2, feature_size] image features, the images' in order."""
        merge = self.vision.spatial_merge_size
        grids = np.asarray(image_grid_thw)
        pixels = np.asarray(pixel_values)
        if grids.ndim != 2 or grids.shape[1] != 3 or not np.issubdtype(grids.dtype, np.integer) or (grids < 1).any():
            raise InputSpecError(f"image_grid_thw must be [images, 3] positive integers (t, h, w), got {grids.dtype}{list(grids.shape)}")
        if (grids[:, 0] != 1).any() or (grids[:, 1:] % merge).any():
            raise InputSpecError(f"image_grid_thw: each image has t = 1 (video is not supported) and h, w multiples of {merge}")
        if self.vision.patch_tower:  # another tower's patch layout (PaddleOCR-VL: raster order), patch_inputs.py
            return self._encode(self.params, *encoder_inputs(self.vision, pixels, grids, self._id_dtype))
        total = int(np.prod(grids, axis=1).sum())
        if pixels.ndim != 2 or pixels.shape != (total, self.vision.pixel_shape[0]):
            raise InputSpecError(f"pixel_values must be [patches, {self.vision.pixel_shape[0]}] flattened patches, "
                                 f"{total} of them for image_grid_thw {grids.tolist()}; got {list(pixels.shape)}")
        rows = total // (merge * merge)
        if rows > self.vision.max_images:
            raise InputSpecError(f"{rows} image tokens: this artifact takes at most {self.vision.max_images} per call")
        group = merge * merge
        positions = patch_positions(grids, merge).reshape(rows, group, 2)
        image_ids = np.repeat(np.arange(len(grids)), np.prod(grids, axis=1) // group)
        dtype = dtypes.jax_dtype(self.vision.feature_dtype)
        ids = [positions, image_ids]
        if self.vision.window_size:
            ids.append(patch_windows(grids, merge, self.vision.window_size))
        taps = []
        if self.vision.position_table:  # Qwen3-VL: bilinear taps in the model's dtype; GLM-4V: bicubic, in float32
            resample = patch_bicubic if self.vision.bicubic_table else patch_interpolation
            indices, weights = resample(grids, merge, self.vision.position_table)
            ids.append(indices.reshape(rows, group, -1))
            taps = [jnp.asarray(weights.reshape(rows, group, -1), jnp.float32 if self.vision.bicubic_table else dtype)]
        return self._encode(self.params, jnp.asarray(pixels.reshape(rows, group, -1), dtype),
                            *(jnp.asarray(i, self._id_dtype) for i in ids), *taps)

    def encode_native(self, pixel_values: Any, image_sizes: Any) -> jax.Array:
        """Pixtral (Mistral3, LightOnOCR): [images, C, H, W] pixel values, each image at the top left of its own
        (height, width) in `image_sizes` [images, 2], the rest padding, as the processor makes them -> the images' merged
        tokens' features [tokens, feature_size] in order (native_patches). Emu3: its image tokens' ids [tokens, 1] in
        order, each image's VQ codes cropped from the padded batch's (image_token_rows)."""
        sizes, pixels = np.asarray(image_sizes), np.asarray(pixel_values)
        channels = self.vision.pixel_shape[0]
        if sizes.ndim != 2 or sizes.shape[1] != 2 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
            raise InputSpecError(f"image_sizes must be [images, 2] positive integers (height, width), got "
                                 f"{sizes.dtype}{list(sizes.shape)}")
        if pixels.ndim != 4 or pixels.shape[0] != len(sizes) or pixels.shape[1] != channels:
            raise InputSpecError(f"pixel_values must be [{len(sizes)} images, {channels}, height, width] (as the model's "
                                 f"processor makes them, padded to the largest image), got {list(pixels.shape)}")
        if (sizes > np.asarray(pixels.shape[2:])).any():
            raise InputSpecError(f"image_sizes {sizes.tolist()} name images larger than pixel_values' "
                                 f"{list(pixels.shape[2:])} pixels: give each image's own size, as the processor does")
        side = self.vision.patch_size * self.vision.patch_merge
        if (sizes < side).any():
            raise InputSpecError(f"image_sizes {sizes.tolist()}: an image smaller than {side}x{side} pixels (one merged "
                                 "patch) makes no image token; resize it as the model's processor does")
        tokens = sum(self.vision.native_tokens(size) for size in sizes)
        if tokens > self.vision.max_images:
            raise InputSpecError(f"{tokens} image tokens: this artifact takes at most {self.vision.max_images} per call")
        if self.vision.row_end_token is not None:  # Emu3: the padded batch's VQ codes, each image's cropped
            if pixels.shape[2] % side or pixels.shape[3] % side or min(pixels.shape[2:]) < 2 * side:
                raise InputSpecError(f"pixel_values of {list(pixels.shape[2:])} pixels: this model's images are padded "
                                     f"to multiples of {side} pixels a side, at least {2 * side}, as its processor "
                                     "resizes them")
            n, c, height, width = pixels.shape  # each side as whole latent rows (image_tokens.CodeEncoder)
            blocks = pixels.reshape(n, c, height // side, side, width // side, side)
            codes = self._encode(self.params, jnp.asarray(blocks, dtypes.jax_dtype(self.vision.feature_dtype)))
            return jnp.asarray(image_token_rows(self.vision, codes, sizes))
        patches, positions, image_ids, merge_index = native_patches(pixels, sizes, self.vision.patch_size,
                                                                    self.vision.patch_merge)
        return self._encode(self.params, jnp.asarray(patches, dtypes.jax_dtype(self.vision.feature_dtype)),
                            *(jnp.asarray(i, self._id_dtype) for i in (positions, image_ids, merge_index)))

    def generate(self, input_ids: Any, attention_mask: Any = None, *, pixel_values: Any = None, image_grid_thw: Any = None,
                 image_sizes: Any = None, batch_num_images: Any = None, pixel_values_videos: Any = None,
                 token_type_ids: Any = None, pixel_attention_mask: Any = None, pixel_mask: Any = None,
                 image_merge_sizes: Any = None, spatial_shapes: Any = None,
                 high_res_pixel_values: Any = None,
                 max_new_tokens: int = 32, do_sample: bool | None = None, temperature: Any = None, top_k: Any = None,
                 top_p: Any = None, rng: jax.Array | None = None, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, stream: bool = False, **settings: Any) -> np.ndarray | Iterator[np.ndarray]:
        """As transformers' generate: [B, L] ids (left-padded, with `attention_mask`) holding the image tokens the
        processor expanded, and `pixel_values` [images, C, H, W] for them in order -> [B, L + new] ids (Qwen2-VL: with
        image_grid_thw; LLaVA-NeXT and OneVision: [images, tiles, C, H, W] with image_sizes, OneVision's
        batch_num_images too for several images in a prompt; Mistral3 and LightOnOCR: each image at its own size,
        padded to the largest, with image_sizes; Idefics2/3 and SmolVLM: [B, images, C, H, W] with all-zero
        padding images, and their pixel_attention_mask; DeepSeek-VL hybrid: with high_res_pixel_values [images, C, H,
        W]; Inkling: its patches [patches, 2, p, p, C]; LFM2-VL: [images, patches, C*p*p] padded rows of patches with
        spatial_shapes and pixel_attention_mask, generate/naflex_inputs.py). `token_type_ids` (Gemma 3's processor output) is accepted
        and not needed: the image tokens are found in the ids; so is an Aria processor's `pixel_mask` that marks every
        pixel real (one that marks padding is refused). `settings`: Generator.generate's logits processors and
        warpers (repetition_penalty, no_repeat_ngram_size, min_new_tokens, ..., min_p, typical_p), by name."""
        if pixel_values_videos is not None:
            raise InputSpecError("video inputs are not supported: give images (pixel_values)")
        refuse_audio_video(settings)  # the Omni thinkers' audio features, video grids: not converted
        # Step3p7's local patches (its processor's crops of a large image; none: num_local_patches all 0) and Inkling's
        # audio: not converted
        local, unused = settings.pop("num_local_patches", None), ("pixel_values_local", "audio_input_ids", "audio_input_ids_mask")
        settings.pop("patches_grid", None)  # Unlimited-OCR: the local patches' layout, read only with them (refused)
        given = [name for name in unused if settings.pop(name, None) is not None]
        if given or (local is not None and np.asarray(local).any()):
            raise InputSpecError(f"{', '.join(given or ['num_local_patches'])}: local image patches (Step3p7) and audio "
                                 "(Inkling) are not supported; give images as global views alone (pixel_values, no "
                                 "local patches) and no audio")
        if image_merge_sizes is not None and (np.asarray(image_merge_sizes) != self.vision.spatial_merge_size).any():
            # VideoLLaMA3's processor output: each image's merge, which the encoder was traced for (1 an image)
            raise InputSpecError(f"image_merge_sizes {np.asarray(image_merge_sizes).tolist()}: this artifact's images are "
                                 f"merged {self.vision.spatial_merge_size} x {self.vision.spatial_merge_size} (as its "
                                 "processor merges images), not otherwise")
        if self.vision.patch_tower == "naflex" and pixel_values is not None:  # LFM2-VL's padded batch (naflex_inputs.py)
            pixel_values, image_grid_thw = naflex_patches(self.vision, pixel_values, spatial_shapes, pixel_attention_mask)
            pixel_attention_mask = None
        elif spatial_shapes is not None:
            raise InputSpecError("spatial_shapes is for SigLIP2 NaFlex images (LFM2-VL); this model takes none")
        merge = self.vision.spatial_merge_size
        if image_grid_thw is not None and not merge:
            raise InputSpecError("image_grid_thw is for variable-resolution models (Qwen2-VL); this model takes fixed-size images")
        if merge and pixel_values is not None and image_grid_thw is None:
            raise InputSpecError("this model takes variable-resolution images: give image_grid_thw with pixel_values, "
                                 "as its processor makes them")
        grids, native = self.vision.grid_pinpoints, self.vision.patch_size
        if (image_sizes is not None) != bool((grids or native) and pixel_values is not None):
            raise InputSpecError("this model cuts images into grids of tiles: give image_sizes with pixel_values (its "
                                 "processor makes both), and neither without images" if grids else
                                 "this model takes each image at its own size: give image_sizes with pixel_values (its "
                                 "processor makes both), and neither without images" if native else
                                 "image_sizes are for LLaVA-NeXT's, OneVision's and Pixtral's images; this model takes none")
        if pixel_mask is not None and not np.asarray(pixel_mask).all():  # transformers masks those patches out of the tower
            raise InputSpecError("pixel_mask marks padding pixels (AriaProcessor pads an image that is not square), "
                                 "which the image encoder does not take: give square images (no padding)")
        if pixel_attention_mask is not None and not self.vision.image_batches:
            raise InputSpecError("pixel_attention_mask is for Idefics2/3's and SmolVLM's images; this model takes none")
        if self.vision.image_batches and pixel_values is not None:
            pixel_values = self.real_images(pixel_values, pixel_attention_mask)
        ids, mask = check_prompt(input_ids, attention_mask, self.spec, max_new_tokens,
                                 image_token=self.vision.image_token_id)
        index = image_index(np.where(mask, ids, -1), self.vision.image_token_id)
        features = self.image_features(int((index >= 0).sum()), pixel_values, image_grid_thw, image_sizes,
                                       batch_num_images, high_res_pixel_values=high_res_pixel_values)
        given = dict(settings, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
        request = self._request(given, rng, eos_token_id, pad_token_id, prompt=ids, counted_from=np.argmax(mask, axis=1))

        delta = None
        rotary = self.vision.rotary_3d  # not EXAONE 4.5's and HyperCLOVAX's plain text positions
        if rotary and self.vision.omni is not None:  # the Omni thinkers' own rope index (omni_positions.py)
            rope, delta = omni_rope_index(ids, mask, image_grid_thw, self.vision.image_token_id, merge, self.vision.omni)
        elif rotary:
            rope, delta = rope_index(ids, mask, image_grid_thw, self.vision.image_token_id, merge)

        def prefill_inputs(width: int) -> tuple:
            padded = np.full((ids.shape[0], width), -1, np.int64)
            padded[:, width - ids.shape[1]:] = index
            if not rotary:
                return features, jnp.asarray(padded, self._id_dtype)
            padded_mask = np.zeros((ids.shape[0], width), bool)
            padded_mask[:, width - ids.shape[1]:] = mask
            offsets = np.zeros((3, ids.shape[0], width), np.int64)  # 3-D positions minus the text positions
            offsets[:, :, width - ids.shape[1]:] = rope
            offsets -= np.maximum(np.cumsum(padded_mask, axis=1) - 1, 0)[None]
            return features, jnp.asarray(padded, self._id_dtype), jnp.asarray(offsets, self._id_dtype)

        # fixed-size images: every row's image tokens stay out of the length bucket (only the text is padded to it);
        # where their count varies with the image's size (Qwen2-VL, LLaVA-NeXT, Pixtral), the bucket covers them (fewer
        # prefills)
        unbucketed = 0 if merge or grids or native else int((index >= 0).sum(axis=1).min())
        return finish(ids, self._steps(ids, mask, max_new_tokens, request, prefill_inputs, delta, unbucketed), stream)

    def image_features(self, tokens: int, pixel_values: Any = None, image_grid_thw: Any = None, image_sizes: Any = None,
                       batch_num_images: Any = None, *, high_res_pixel_values: Any = None) -> jax.Array:
        """The feature rows [tokens, feature_size] of prompts holding `tokens` image tokens, from their images as the
        processor makes them (generate's arguments), in the order the image tokens take them; one unused row when there
        are no images (the step's input is never empty). InputSpecError when the images make another number of rows."""
        merge, grids, native = self.vision.spatial_merge_size, self.vision.grid_pinpoints, self.vision.patch_size
        if pixel_values is None:
            if tokens:
                raise InputSpecError(f"the prompts hold {tokens} image tokens but no pixel_values were given")
            return jnp.zeros((1, self.vision.feature_size), dtypes.jax_dtype(self.vision.feature_dtype))
        if merge or grids or native:
            features = (self.encode_patches(pixel_values, image_grid_thw) if merge else
                        self.encode_native(pixel_values, image_sizes) if native else
                        self.encode_grids(pixel_values, image_sizes, batch_num_images))
            if features.shape[0] != tokens:
                raise InputSpecError(f"image features and image tokens do not match: the images make {features.shape[0]} "
                                     f"features, the prompts hold {tokens} image tokens (id {self.vision.image_token_id})")
            return features
        encoded = self.encode_images(pixel_values, high_res_pixel_values)
        if encoded.shape[0] * encoded.shape[1] != tokens:
            raise InputSpecError(f"image features and image tokens do not match: {encoded.shape[0]} images make "
                                 f"{encoded.shape[0] * encoded.shape[1]} features, the prompts hold {tokens} image tokens "
                                 f"(id {self.vision.image_token_id}); expand each image's token to "
                                 f"{self.vision.tokens_per_image} as the processor does")
        if self.vision.image_vocabulary is not None:  # Chameleon: each image token's VQ code -> its token id
            return jnp.asarray(image_token_rows(self.vision, encoded))
        return encoded.reshape(-1, encoded.shape[-1])

    def real_images(self, pixel_values: Any, pixel_attention_mask: Any = None) -> np.ndarray:
        """Idefics2/3, SmolVLM: [B, images, C, H, W] pixel values (or [images, C, H, W]) -> the real images [N, C, H, W]
        in order, as transformers' get_image_features keeps them: all-zero images are padding (SmolVLM: the first kept
        when all are). The encoder takes every pixel as real: a pixel_attention_mask that masks any pixel of a real
        image (images of several sizes padded into one batch) is refused rather than encoded otherwise."""
        pixels = np.asarray(pixel_values)
        if pixels.ndim == 5:
            pixels = pixels.reshape(-1, *pixels.shape[2:])
        if pixels.ndim != 4:
            raise InputSpecError(f"pixel_values must be [prompts, images, {', '.join(map(str, self.vision.pixel_shape))}] "
                                 f"(as the model's processor makes them), got {list(np.shape(pixel_values))}")
        real = (pixels != 0).reshape(len(pixels), -1).any(axis=1)
        real[0] |= not real.any()
        if pixel_attention_mask is not None:
            given = np.asarray(pixel_attention_mask)
            if given.size != len(pixels) * int(np.prod(pixels.shape[2:])):
                raise InputSpecError(f"pixel_attention_mask must be one [height, width] mask per image of pixel_values, "
                                     f"got {list(given.shape)} for {list(np.shape(pixel_values))}")
            if not given.reshape(len(pixels), -1)[real].all():
                raise InputSpecError("pixel_attention_mask masks pixels of a real image (images of several sizes padded "
                                     "into one batch): not supported, give each prompt's images at the tile size")
        return pixels[real]

    def _decode_inputs(self, batch: int) -> tuple:
        """One unused feature row and no image token: decode is the prefill step with one token."""
        inputs = (jnp.zeros((1, self.vision.feature_size), dtypes.jax_dtype(self.vision.feature_dtype)),
                  jnp.full((batch, 1), -1, self._id_dtype))
        if self.vision.rotary_3d:  # decode's three positions are all the text position (+ the row's delta)
            inputs = (*inputs, jnp.zeros((3, batch, 1), self._id_dtype))
        return inputs

    # -- the processor, torch-free (vision_processor.py) ------------------------------------
    @property
    def image_processor(self) -> ImageProcessor:
        """The model's image preprocessing (Pillow), from its processor config."""
        return vision_processor.image_processor(self.tokenizer_files)

    def chat_template(self) -> ChatTemplate:
        """The processor's chat template (chat_template.jinja / .json), else the tokenizer's."""
        return vision_processor.chat_template(self.tokenizer_files)

    def processor_inputs(self, prompt: str, image: Any) -> tuple[np.ndarray, ...]:
        """One user turn of `prompt` and `image` (one, or a list in order) as the model's processor makes it: (input_ids,
        pixel_values), and for the families that need them the image grids or sizes (vision_processor.processor_inputs
        says which)."""
        vision_processor.check_reproduced(self.vision)  # before the tokenizer, which a model built in memory lacks
        return vision_processor.processor_inputs(self.vision, self.tokenizer_files, self.tokenizer, prompt, image)

    def _reply_to_images(self, prompts: Sequence[Any], images: Sequence[Any], options: dict) -> Completion:
        """One user turn of the one prompt and the images, built as the processor builds it: the reply alone."""
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise InputSpecError("images go with one text prompt: the images and the prompt make one user turn")
        ids, pixels, *grid = self.processor_inputs(prompts[0], list(images))
        inputs = {}
        if grid:  # Qwen2-VL: each image's patch grid; LLaVA-NeXT: each image's size (OneVision: and the image count)
            sized = self.vision.grid_pinpoints or self.vision.patch_size
            inputs["image_sizes" if sized else "image_grid_thw"] = grid[0]
            if len(grid) > 1:
                inputs["batch_num_images"] = grid[1]
        out = self.generate(ids, pixel_values=pixels, **inputs, **options)
        new = until_end([int(t) for t in out[0, ids.shape[1]:]], self.spec.eos_token_ids)
        return Completion(new, len(new), self.tokenizer.decode(new, skip_special_tokens=True))


def native_patches(pixels: np.ndarray, sizes: np.ndarray, patch: int,
                   merge: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pixtral's encoder inputs from [images, C, H, W] padded pixels and each image's (height, width): (patches
    [P, C*patch*patch] image by image, row-major, each flattened channel, row, column as its patch convolution reads
    it; positions [P, 2] each patch's (row, column); image_ids [P]; merge_index [M, merge^2] the patches of each merge x
    merge block, blocks row-major, patches row-major within a block). As transformers does, an image's partial patches
    at its bottom and right edges are dropped, and so are its patches outside whole blocks from the merge (they still
    attend)."""
    parts, positions, image_ids, merge_index = [], [], [], []
    start = 0
    for number, (image, (height, width)) in enumerate(zip(pixels, sizes)):
        rows, cols = int(height) // patch, int(width) // patch
        grid = image[:, :rows * patch, :cols * patch].reshape(image.shape[0], rows, patch, cols, patch)
        parts.append(grid.transpose(1, 3, 0, 2, 4).reshape(rows * cols, -1))
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        positions.append(np.stack([r.reshape(-1), c.reshape(-1)], axis=-1))
        image_ids.append(np.full(rows * cols, number))
        a, b, i, j = np.meshgrid(np.arange(rows // merge), np.arange(cols // merge), np.arange(merge), np.arange(merge),
                                 indexing="ij")
        merge_index.append((start + (a * merge + i) * cols + b * merge + j).reshape(-1, merge * merge))
        start += rows * cols
    return (np.concatenate(parts), np.concatenate(positions).astype(np.int64), np.concatenate(image_ids).astype(np.int64),
            np.concatenate(merge_index).astype(np.int64))
