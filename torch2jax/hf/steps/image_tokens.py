"""Vision-language models whose image reaches the text model as tokens of a vocabulary, as vision_language.py's three
entry points (encode_image, prefill, decode) over one params tree:

    Ovis2     a vision tower's softmax over a visual vocabulary, times its visual embedding table: features at the image
              tokens, as LLaVA's; with images, each of visual_indicator_token_ids takes its row of that table
    Chameleon a VQ-VAE's code for each image token, which its vocabulary_mapping turns into a text token id, embedded by
              the text model; one image is the VQ-VAE's resolution
    Emu3      the same over each image at its own size (pixel_values padded to the largest, image_sizes): each row of
              codes is followed by a row-end token, as its get_image_features lays them out

For Chameleon and Emu3, encode_image returns the codes (float32, exact to 2^24) and the runtime maps them to token ids
(VisionSpec.image_vocabulary; Emu3 crops each image's codes from the padded grid and ends each row) which the step
embeds where transformers would (TokenStep). The mapping stays out of the graphs: a constant torch.export lifts would be
a param of the encoder alone, and the entry points share one params tree.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture.converter import StageTimer, model_from, trace
from ...capture.fx import dtype_name
from ...errors import ExportError, InputSpecError
from ...generate.vision_language import VisionLanguageGenerator
from ...generate.vision_spec import VisionSpec
from ...runtime.quantize import DEFAULT_GROUP_SIZE
from .kv_cache import adopt_parts
from .vision_language import (
    IMAGES_PER_PROMPT,
    PROCESSOR_UNSUPPORTED,
    ImageEncoder,
    MultimodalStep,
    _entry_points,
    example_image_inputs,
    language_cache,
    prepared,
)

EMU3_NOMINAL_SIDE = 512  # Emu3ImageProcessor's images hold at least 512 x 512 pixels (min_pixels)


class CodeEncoder(torch.nn.Module):
    """forward(pixel_values) -> each latent position's VQ code as float32: Chameleon's [N, C, H, W] -> [N, tokens, 1]
    (its image tokens' order); Emu3's [N, C, H / f, f, W / f, f] (the padded batch, each side in whole latent rows, so
    that every symbolic size is a multiple of them, which the saved program's shape checks can compare) -> the grid
    [N, H / f, W / f] (the runtime crops each image's own)."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values):
        vq = self.vlm.model.vqmodel
        pixels = pixel_values.to(next(vq.parameters()).dtype)
        if type(self.vlm).__name__ == "ChameleonForConditionalGeneration":
            return vq.encode(pixels).image_tokens.reshape(pixel_values.shape[0], -1, 1).float()
        # Emu3VQVAE.encode up to its codes (an image is `temporal_downsample_factor` equal frames); its per-image crop
        # is a Python loop over image_sizes, left to the runtime
        n, c, rows, f, columns, _ = pixels.shape
        pixels = pixels.reshape(n, c, rows * f, columns * f)
        frames = pixels.unsqueeze(1).repeat(1, vq.config.temporal_downsample_factor, 1, 1, 1)
        hidden = vq.quant_conv(vq.encoder(frames).permute(0, 2, 1, 3, 4)).permute(0, 2, 1, 3, 4)
        return vq.quantize(hidden).squeeze(1).float()


class TokenStep(MultimodalStep):
    """MultimodalStep whose feature rows are text token ids (`token_features`: Chameleon, Emu3), embedded as the text
    model embeds them, or features (Ovis2) with its `indicators`: where the step holds an image token (transformers'
    prefill given pixel_values), indicator token k takes row (visual vocabulary - indicators + k) of the visual
    embedding table; decode embeds them as text, as transformers does without pixel_values."""

    def __init__(self, lm: torch.nn.Module, layout: Any, token_features: bool = False, indicators: tuple[int, ...] = ()):
        super().__init__(lm, layout)
        self.token_features, self.indicators = token_features, tuple(indicators)

    def _forward(self, input_ids, position_ids, write_at, kv_valid, cache, image_features, image_index, rope_offsets):
        is_image = image_index >= 0
        rows = image_features.index_select(0, image_index.clamp(min=0).reshape(-1))
        embed = self.lm.get_input_embeddings()
        if self.token_features:
            embeds = embed(torch.where(is_image, rows[:, 0].reshape(input_ids.shape).long(), input_ids))
        else:
            embeds = embed(torch.where(is_image, torch.zeros_like(input_ids), input_ids))
            embeds = torch.where(is_image[..., None], rows.to(embeds.dtype).reshape(*input_ids.shape, -1), embeds)
        if self.indicators:
            model = self.lm.model
            vocab, count = model.visual_vocab_size, model.vision_tower.num_visual_indicator_tokens
            table = model.visual_embeddings_table(torch.arange(vocab - count, vocab)).to(embeds.dtype)
            images = is_image.any()
            for k, token in enumerate(self.indicators):
                embeds = torch.where(((input_ids == token) & images)[..., None], table[k], embeds)
        return self.step({"inputs_embeds": embeds}, position_ids, write_at, kv_valid, cache, None)


def convert_token_images(vlm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                         progress: Any = None, weights: Any = None, quantize: str | None = None,
                         group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """Ovis2's, Chameleon's or Emu3's three entry points (see the module docstring); arguments as
    vision_language.convert_vision_language's."""
    vlm = prepared(vlm, max_cache_len, max_batch, dtype, weights, quantize, group_size)
    kind, config = type(vlm).__name__, vlm.config
    language = language_cache(vlm, max_cache_len)
    if language.keeps_state:
        raise InputSpecError(f"{kind}'s text model keeps a recurrent state: not supported with image tokens")
    dtype = next(vlm.parameters()).dtype
    timer = StageTimer(progress)
    extra: dict[str, Any] = {}
    if kind == "Ovis2ForConditionalGeneration":
        if config.vision_config.tokenize_function == "gumbel_argmax":
            raise InputSpecError(f"{kind} with tokenize_function 'gumbel_argmax' draws Gumbel noise for every image, so "
                                 "transformers' own features are random: not supported ('softmax', as released, and "
                                 "'st_argmax' are)")
        side = int(config.vision_config.image_size)
        pixel_shape = (int(config.vision_config.num_channels), side, side)
        encoder = ImageEncoder(vlm).eval()
        with torch.no_grad():
            probe = encoder(torch.zeros((1, *pixel_shape), dtype=dtype))
        tokens_per_image, feature_size, pixel_dtype = int(probe.shape[1]), int(probe.shape[2]), dtype
        max_images = IMAGES_PER_PROMPT * max_batch
        example, dims = torch.zeros((2, *pixel_shape), dtype=dtype), {0: {"name": "images", "min": 1, "max": max_images}}
    elif kind == "ChameleonForConditionalGeneration":
        vq = config.vq_config
        pixel_shape = (int(vq.in_channels), int(vq.resolution), int(vq.resolution))
        tokens_per_image, feature_size, pixel_dtype = _latent_positions(vlm, pixel_shape, max_cache_len), 1, torch.float32
        max_images = IMAGES_PER_PROMPT * max_batch
        example, dims = torch.zeros((2, *pixel_shape)), {0: {"name": "images", "min": 1, "max": max_images}}
        encoder = CodeEncoder(vlm).eval()
        extra["image_vocabulary"] = _image_vocabulary(vlm)
    else:  # Emu3: images at their own size, whole multiples of the VQ-VAE's downsampling a side
        factor = int(vlm.model.vqmodel.vision_spatial_factor)
        pixel_shape = (int(config.vq_config.in_channels), EMU3_NOMINAL_SIDE, EMU3_NOMINAL_SIDE)
        tokens_per_image, feature_size, pixel_dtype = 0, 1, torch.float32
        max_images = max_batch * max_cache_len  # every image token sits in a prompt
        side = {"min": 2, "max": max_cache_len}  # latent rows and columns; its convolutions need two
        example = torch.zeros((2, pixel_shape[0], 8, factor, 6, factor))
        dims = {0: {"name": "images", "min": 1, "max": max_batch * IMAGES_PER_PROMPT}, 2: {"name": "rows", **side},
                4: {"name": "columns", **side}}
        encoder = CodeEncoder(vlm).eval()
        eol = vlm.model.vocabulary_mapping.eol_token_id
        if eol is None:
            raise InputSpecError(f"{kind}'s vocabulary_map names no row-end token (<|extra_200|>), which its image tokens "
                                 "need")
        extra.update(image_vocabulary=_image_vocabulary(vlm), row_end_token=int(eol), patch_size=factor)
    if int(config.image_token_id if config.image_token_id is not None else -1) < 0:
        raise ExportError(f"{kind}'s config names no image_token_id")
    encode_captured, _ = trace(encoder, (example,), None, (dims,), timer, what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    layout = language.layout
    _, step_args, features, index = example_image_inputs(layout, max_batch, feature_size,
                                                         pixel_dtype if feature_size == 1 else dtype)
    rows = {"name": "image_rows", "min": 1, "max": max(max_images * tokens_per_image, max_batch * max_cache_len)}
    indicators = tuple(int(t) for t in getattr(config, "visual_indicator_token_ids", None) or ())
    step = TokenStep(vlm, layout, token_features=kind != "Ovis2ForConditionalGeneration", indicators=indicators)
    shapes = language.dynamic_shapes(max_batch)
    captured, _ = trace(step.eval(), (*step_args, features, index), None,
                        (*shapes, {0: rows}, shapes[0]), timer, what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec_vision = VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=tokens_per_image,
                             feature_size=feature_size, feature_dtype=dtype_name(features.dtype), pixel_shape=pixel_shape,
                             max_images=max_images, processor_unsupported=PROCESSOR_UNSUPPORTED[kind], **extra)
    return VisionLanguageGenerator(encode, prefill, decode, language.spec(vlm, max_batch), spec_vision)


def _image_vocabulary(vlm: torch.nn.Module) -> tuple[int, ...]:
    """The text token id of each VQ code, as the model's vocabulary_mapping maps them (0 for a code it does not name)."""
    return tuple(int(t) for t in vlm.model.vocabulary_mapping.img2bpe_mapping_tensor.tolist())


def _latent_positions(vlm: torch.nn.Module, pixel_shape: tuple[int, ...], max_cache_len: int) -> int:
    """Chameleon's image tokens per image (each of its downsamplings a stride-2 3x3 convolution after padding the bottom
    and right by one), refused before encoding one (its VQ-VAE's middle block attends over every latent position) where
    they outnumber the cache slots."""
    height, width = pixel_shape[1:]
    for _ in range(len(vlm.config.vq_config.channel_multiplier) - 1):
        height, width = (height - 2) // 2 + 1, (width - 2) // 2 + 1
    if height * width >= max_cache_len:
        raise InputSpecError(f"{type(vlm).__name__}'s VQ-VAE makes {height * width} image tokens from one "
                             f"{pixel_shape[1]}x{pixel_shape[2]} image (its vq_config's resolution), more than the "
                             f"{max_cache_len} cache slots hold: convert with --max-cache-len {height * width + 64} or more")
    return height * width
