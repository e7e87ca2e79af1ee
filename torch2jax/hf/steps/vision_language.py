"""A vision-language model (LLaVA) as three entry points over one params tree, the causal-LM step reused:

    encode_image  pixel_values [images, C, H, W] -> image features [images, tokens_per_image, hidden]
    prefill       the causal-LM step (hf/steps/causal_lm.py) over text embeddings, with the image features merged in
                  at the image-token positions, plus two inputs:
                    image_features  [image_rows, hidden]  every image's features, one row per image token
                    image_index     [B, T]  the row of image_features each position takes, -1 for a text token
    decode        the same traced step with one token per row and one (unused) feature row

Mistral3 and LightOnOCR (a Pixtral tower, each image at its own size) are the same three entry points with their own
encoder (PixtralEncoder: each image's patches in row-major order, attention within an image through a mask, the
merger's blocks gathered by index), the patches cut by the runtime from pixel_values and image_sizes. Mistral Large 4 is
Mistral3's tower and projector before a sparse-attention (indexed MLA) text model.

Aria (its projector's learned queries over an Idefics3 tower) and Llama 4 (a pixel-shuffled tower over fixed-size tiles)
take ImageEncoder's fixed-size images through their own get_image_features. Llama 4's chunked-attention layers are
exact only while every position lies in the first chunk: a longer cache is refused (kv_cache.check_chunked_attention). Gemma 4
(patch sequences with positions and padding, attention both ways within an image on sliding layers only) is refused
by name; one built without a vision tower is refused as the text model it is.

Qwen2-VL (variable resolution) is the same three entry points with its own encoder (PatchEncoder: flattened
patches in merge groups, a per-image attention mask instead of cu_seqlens) and a third step input, rope_offsets
[3, B, T]: its 3-D rotary positions minus the text positions (the runtime computes them, generate/vision_language.py
rope_index; decode passes zeros and continues from each row's largest position + 1). The GLM-4V family is built the
same way (its tower's own ends in PatchEncoder; its rope index, over the processor's mm_token_type_ids, gives the same
positions for images). EXAONE 4.5 and HyperCLOVAX Vision V2 are Qwen2.5-VL's tower (EXAONE's attention grouped-query,
HyperCLOVAX's followed by a linear projector) before a text model of plain 1-D positions: their step takes no rope_offsets.
Qwen3.5 and Qwen3.5-MoE are Qwen3-VL's tower without deepstack before a text model whose gated-delta-net layers keep a
recurrent state: their step (RecurrentMultimodalStep) is the same merge over the recurrent step's cache
(hf/steps/recurrent.py: each recurrent layer's states, each attention layer's keys and values, each tensor's kind in the
generation spec), left padding kept out of the state as there (LanguageCache picks the cache of any VLM's text model).

The Qwen2.5-Omni and Qwen3-Omni-MoE thinkers are Qwen2.5-VL's and Qwen3-VL's path without their audio tower, with a
rope index of their own (hf/steps/omni.py, generate/omni_positions.py: images counted by their vision-start tokens).
VideoLLaMA3, PaddleOCR-VL, Cosmos3-Edge, LFM3-VL, Kimi K2.5, Muse Glimmer, LFM2-VL (SigLIP2 NaFlex,
hf/steps/naflex_towers.py) and MiniMax M3 VL (CLIP layers with 3-D rotary, hf/steps/clip_patch_tower.py) are
variable-resolution towers (hf/steps/patch_towers.py: merge groups of patches, attention within an image by a mask from
image ids, their per-patch inputs made torch-free by generate/patch_inputs.py and generate/naflex_inputs.py).
Qianfan-OCR (InternVL's layout), Inkling (each processor patch an image token) and Step3p7 (global views) take the
fixed-size path with parts of their own (hf/steps/fixed_images.py), as does Unlimited-OCR (global views whose
feature rows end with a learned newline, hf/steps/newline_views.py); DeepSeek-VL hybrid's two resolutions convert in
hf/steps/two_resolutions.py. Cosmos3-Omni is Qwen3-VL's classes under its own name.

Ovis2, Chameleon and Emu3, whose image reaches the text model as tokens of a vocabulary (a visual vocabulary's
embeddings; a VQ-VAE's codes, which encode_image returns and the runtime maps to text token ids for the step to embed),
are built in hf/steps/image_tokens.py. Fuyu (image patches placed by image_patches_indices), Kosmos-2 (features placed
by image_embeds_position_mask) and GIT (its image features prepended to the whole padded prompt by its own forward) are
refused by name (UNSUPPORTED_IMAGES).

BLIP-2 is LLaVA's three entry points over a language model that is a whole causal LM of its own (`language_model`, called
by the step directly: BLIP-2's forward takes pixel_values at every call), its image features a Q-Former's learned queries
over the tower's patches, projected. Models of another design (cross-attention to the image: Mllama, IDEFICS, BLIP; a
Q-Former that reads the prompt: InstructBLIP) are refused naming why (UNSUPPORTED_IMAGES).

With `quantize`, the language step's matrix-product weights (its projections and LM head) are stored quantized as a
causal LM's are (runtime/quantize.py); the vision tower and projector, run once per image, keep the model's dtype.

Where each image feature goes is what transformers computes in Python from the input ids (its
`get_placeholder_mask` and `masked_scatter`: the image tokens in row-major order take the feature rows in
order); the torch-free runtime computes `image_index` from the ids the same way (generate/vision_language.py).
An image-token id is embedded as token 0 (its row never matters: the feature replaces it), so an image token
outside the text vocabulary is safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...capture.converter import StageTimer, cast_module, model_from, trace
from ...capture.fx import dtype_name
from ...errors import ExportError, InputSpecError, Torch2JaxError
from ...generate.generator import GenerationSpec
from ...generate.image_processing import TILED, ImageProcessor
from ...generate.vision_language import VisionLanguageGenerator, native_patches
from ...generate.vision_spec import VisionSpec
from ...runtime.model import Model
from ...runtime.quantize import DEFAULT_GROUP_SIZE, check_scheme, quantize_model, share_quantized_params
from ..directory import processor_files, transformers
from . import fixed_images, newline_views, recurrent
from .causal_lm import DecoderStep, example_step_inputs, step_dynamic_shapes
from .kv_cache import adopt_parts, cache_layout, check_limits, generation_fields

IMAGES_PER_PROMPT = 4  # the encoder's symbolic image count goes up to this many images per prompt of the batch
SUPPORTED = ("LlavaForConditionalGeneration", "Gemma3ForConditionalGeneration", "PaliGemmaForConditionalGeneration",
             "InternVLForConditionalGeneration", "LlavaNextForConditionalGeneration", "LlavaOnevisionForConditionalGeneration",
             "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
             "Qwen3VLMoeForConditionalGeneration", "VipLlavaForConditionalGeneration", "AyaVisionForConditionalGeneration",
             "Cohere2VisionForConditionalGeneration", "GotOcr2ForConditionalGeneration", "VideoLlavaForConditionalGeneration",
             "DeepseekVLForConditionalGeneration", "JanusForConditionalGeneration", "Glm4vForConditionalGeneration",
             "Glm4vMoeForConditionalGeneration", "Glm46VForConditionalGeneration", "GlmOcrForConditionalGeneration",
             "Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration", "Idefics2ForConditionalGeneration",
             "Mistral3ForConditionalGeneration", "LightOnOcrForConditionalGeneration",
             "LlavaNextVideoForConditionalGeneration", "Exaone4_5_ForConditionalGeneration",
             "HyperCLOVAXVisionV2ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
             "Qwen3_5MoeForConditionalGeneration")
# Cosmos3-Omni (the Cosmos3 reasoner): Qwen3-VL's classes under its own name (its modular file subclasses them line for line)
SUPPORTED += ("Cosmos3OmniForConditionalGeneration",)
# Aria (fixed-size images, its projector's learned queries), Mistral Large 4 (Mistral3's Pixtral tower and projector),
# Llama 4 (fixed-size tiles, a pixel-shuffled tower's features): each an existing path over its own text model
SUPPORTED += ("AriaForConditionalGeneration", "MistralLarge4ForConditionalGeneration", "Llama4ForConditionalGeneration")
# fixed-size images (or tiles) at image tokens through their own get_image_features (hf/steps/fixed_images.py): Qianfan-OCR
# (InternVL's tower, pixel shuffle and projector), Inkling (each patch of its processor's one image token), DeepSeek-VL
# hybrid (each image at two resolutions, two towers joined)
SUPPORTED += ("QianfanOCRForConditionalGeneration", "InklingForConditionalGeneration",
              "DeepseekVLHybridForConditionalGeneration", "Step3p7ForConditionalGeneration")
# Unlimited-OCR: global views through a SAM tower and a CLIP-like encoder, a newline after each row of features
# (hf/steps/newline_views.py), before a text model of reference sliding-window attention (a cache within its window)
SUPPORTED += newline_views.NEWLINE_VIEWS
# models whose language part is a whole causal LM (`language_model`, with its own LM head) that the step calls: the model's
# own forward takes pixel_values at every call (BLIP-2: a Q-Former's query outputs, projected, are the image features)
WRAPPED_LANGUAGE_MODEL = ("Blip2ForConditionalGeneration",)
SUPPORTED += WRAPPED_LANGUAGE_MODEL
# image tokens of a vocabulary (hf/steps/image_tokens.py): Ovis2's visual vocabulary, Chameleon's and Emu3's VQ codes
TOKEN_IMAGES = ("Ovis2ForConditionalGeneration", "ChameleonForConditionalGeneration", "Emu3ForConditionalGeneration")
SUPPORTED += TOKEN_IMAGES
# a Pixtral tower over each image at its own size (pixel_values padded to the largest, image_sizes), its patches merged
# merge x merge into tokens (PixtralEncoder)
NATIVE_RESOLUTION = ("Mistral3ForConditionalGeneration", "LightOnOcrForConditionalGeneration",
                     "MistralLarge4ForConditionalGeneration")
# models whose pixel_values are [prompts, images, C, H, W], all-zero images padding (dropped), encoded with a mask of
# their real pixels (idefics_image_features)
IMAGE_BATCHES = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration", "Idefics2ForConditionalGeneration")
# variable-resolution models: flattened patches + image_grid_thw in, multimodal (3-D) rotary positions
VARIABLE_RESOLUTION = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                       "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                       "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "Glm46VForConditionalGeneration",
                       "GlmOcrForConditionalGeneration", "Exaone4_5_ForConditionalGeneration",
                       "HyperCLOVAXVisionV2ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                       "Qwen3_5MoeForConditionalGeneration", "Cosmos3OmniForConditionalGeneration")
# the Omni thinkers' text + image path (hf/steps/omni.py): Qwen2.5-VL's tower (separate q, k, v) or Qwen3-VL's (with
# deepstack) before their text model, their own rope index (generate/omni_positions.py); audio and video refused
OMNI_THINKERS = ("Qwen2_5OmniThinkerForConditionalGeneration", "Qwen3OmniMoeThinkerForConditionalGeneration")
SUPPORTED += OMNI_THINKERS
VARIABLE_RESOLUTION += OMNI_THINKERS
# variable-resolution models whose text model takes plain 1-D positions (no rope index; transformers' arange positions):
# EXAONE 4.5 (a Qwen2.5-VL tower with grouped-query attention, an EXAONE 4 text model) and HyperCLOVAX-SEED Vision V2 (a
# Qwen2.5-VL tower, a linear projector to a HyperCLOVAX text model)
TEXT_POSITIONS = ("Exaone4_5_ForConditionalGeneration", "HyperCLOVAXVisionV2ForConditionalGeneration")
# variable-resolution SigLIP towers (hf/steps/patch_towers.py): VideoLLaMA3 (one token a patch, a Qwen2 text model of
# 1-D positions), PaddleOCR-VL (raster patches merged by its projector, Qwen2-VL's rope index) and Cosmos3-Edge (a
# SigLIP2 tower, its position table resized with antialiasing per image, Qwen2-VL's rope index); LFM3-VL (depthwise
# convolutions over each image's patch grid beside its attention layers, an LFM3 text model of 1-D positions); Kimi
# K2.5 (raster patches, a bicubic position table, a DeepSeek-V3 text model of 1-D positions); Muse Glimmer (Kimi's
# layers with window attention, its own table taps and pixel shuffle, a Gemma 2-like text model of 1-D positions)
PATCH_TOWERS = ("VideoLlama3ForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
                "Cosmos3EdgeForConditionalGeneration", "Lfm3VlForConditionalGeneration", "Kimi_K25ForConditionalGeneration",
                "MuseGlimmerForConditionalGeneration")
SUPPORTED += PATCH_TOWERS
TEXT_POSITIONS += ("VideoLlama3ForConditionalGeneration", "Lfm3VlForConditionalGeneration",
                   "Kimi_K25ForConditionalGeneration", "MuseGlimmerForConditionalGeneration")
# LFM2-VL: a SigLIP2 NaFlex tower (padded patch rows, its table resized per image) and a pixel-unshuffle projector
# (hf/steps/naflex_towers.py), an LFM2 text model (short convolutions' recurrent state) of 1-D positions
PATCH_TOWERS += ("Lfm2VlForConditionalGeneration",)
SUPPORTED += ("Lfm2VlForConditionalGeneration",)
TEXT_POSITIONS += ("Lfm2VlForConditionalGeneration",)
# MiniMax M3 VL (hf/steps/clip_patch_tower.py): CLIP layers with 3-D rotary over Qwen2-VL's patches, a projector that
# joins each merge group after projecting its patches, a MiniMax M3 text model of 1-D positions
PATCH_TOWERS += ("MiniMaxM3SparseForConditionalGeneration",)
SUPPORTED += ("MiniMaxM3SparseForConditionalGeneration",)
TEXT_POSITIONS += ("MiniMaxM3SparseForConditionalGeneration",)
# LLaVA-NeXT / OneVision ("anyres"): an image is its whole view and a grid of tiles, packed per image at run time
# (generate/anyres.py). LLaVA-NeXT-Video's images are LLaVA-NeXT's (its get_image_features and processor's image tokens are
# the same); its vision_resampler pools only video frames, which the runtime refuses
ANY_RESOLUTION = ("LlavaNextForConditionalGeneration", "LlavaOnevisionForConditionalGeneration",
                  "LlavaNextVideoForConditionalGeneration")
# models whose image tokens attend to each other both ways within one image (transformers' token_type_ids blocks)
BIDIRECTIONAL_IMAGES = ("Gemma3ForConditionalGeneration",)
# prefix-LMs: the whole prompt (image and text, token type 0) attends both ways; generated tokens causally
PREFIX_LM = ("PaliGemmaForConditionalGeneration",)
POSITION_OFFSET = {"PaliGemmaForConditionalGeneration": 1}  # PaliGemma's positions count from 1
# models whose processor cuts an image into tiles, each an image of the model: the most per image (InternVL: GotOcr2's
# default max_patches 12, and a thumbnail)
MAX_TILES = {"InternVLForConditionalGeneration": 13, "QianfanOCRForConditionalGeneration": 13}
# Idefics3 / SmolVLM: a grid of up to 4 x 4 tiles (longest_edge 4 * the tile side) and the whole image; Idefics2: 4 and
# the whole image
MAX_TILES.update({"Idefics3ForConditionalGeneration": 17, "SmolVLMForConditionalGeneration": 17,
                  "Idefics2ForConditionalGeneration": 5})
# Llama 4: up to max_patches 16 tiles and the whole image; Aria with split_image: up to 8 crops (its 1x8 resolution)
MAX_TILES.update({"Llama4ForConditionalGeneration": 17, "AriaForConditionalGeneration": 8})
# models whose processor writes an image as more than its image tokens (tile markers, line breaks, its own prompt):
# they generate from the processor's input_ids and pixel_values; processor_inputs refuses, saying why
PROCESSOR_UNSUPPORTED = {
    "Lfm2VlForConditionalGeneration": "Lfm2VlProcessor resizes an image to a patch budget (or cuts it into tiles and "
                                      "a thumbnail) and writes its tokens between image start and end tokens, which "
                                      "the torch-free image processor does not reproduce",
    "AyaVisionForConditionalGeneration": "AyaVisionProcessor cuts an image into tiles and writes each tile's tokens "
                                         "after a tile marker, between its start and end of image tokens",
    "Cohere2VisionForConditionalGeneration": "Cohere2VisionProcessor cuts an image into tiles and writes each tile's "
                                             "tokens with a line break, between its start and end of image tokens",
    "GotOcr2ForConditionalGeneration": "GotOcr2Processor writes its own prompt format (a system turn, the image tokens "
                                       "between <img> and </img>), not a chat template's",
    "Idefics3ForConditionalGeneration": "Idefics3Processor cuts an image into tiles and writes each tile's tokens after "
                                        "its row and column marker, the whole image's after a global-image marker",
    "SmolVLMForConditionalGeneration": "SmolVLMProcessor cuts an image into tiles and writes each tile's tokens after "
                                       "its row and column marker, the whole image's after a global-image marker",
    "Idefics2ForConditionalGeneration": "Idefics2Processor writes an image's tokens (and its tiles' with image "
                                        "splitting) between fake image-boundary tokens",
    "Llama4ForConditionalGeneration": "Llama4Processor cuts an image into tiles and writes each tile's tokens with tile "
                                      "separators, the whole image's after an image marker, between its start and end "
                                      "of image tokens",
    "AriaForConditionalGeneration": "AriaProcessor pads each image to a square and marks the padding in pixel_mask, "
                                    "which moves the tower's patch positions (only unpadded, square images are taken)",
    "Ovis2ForConditionalGeneration": "Ovis2Processor cuts an image into a grid of crops and writes visual indicator "
                                     "tokens around them",
    "ChameleonForConditionalGeneration": "ChameleonProcessor writes an image's tokens between its own begin and end of "
                                         "image tokens",
    "Emu3ForConditionalGeneration": "Emu3Processor writes an image's size and its begin and end of image tokens around "
                                    "its rows of image tokens",
    "InklingForConditionalGeneration": "InklingImageProcessor (torchvision only) cuts an image into patches padded with "
                                       "-1 and repeated over two frames, which the torch-free image processor does not "
                                       "reproduce",
    "DeepseekVLHybridForConditionalGeneration": "DeepseekVLHybridImageProcessor makes each image at two resolutions "
                                                "(pixel_values and high_res_pixel_values), which the torch-free image "
                                                "processor does not reproduce",
    "Step3p7ForConditionalGeneration": "Step3p7Processor crops a large image into local patches (pixel_values_local, "
                                       "which are not converted) and writes each patch's tokens and the global view's "
                                       "between their own start and end tokens, with patch newlines",
    "UnlimitedOcrForConditionalGeneration": "UnlimitedOcrImageProcessor (torchvision) pads an image to a square of "
                                            "its background color and crops a large one into local patches "
                                            "(pixel_values_local, patches_grid, which are not converted), which the "
                                            "torch-free image processor does not reproduce",
}
# Pixtral-tower models' processors, whose settings with_processor_text reads from processor_config.json (both need
# torchvision to load): (patch_size, spatial_merge_size) they default to
NATIVE_PROCESSORS = {"Mistral3ForConditionalGeneration": ("PixtralProcessor", (16, 1)),
                     "MistralLarge4ForConditionalGeneration": ("PixtralProcessor", (16, 1)),
                     "LightOnOcrForConditionalGeneration": ("LightOnOcrProcessor", (14, 2))}


class ImageEncoder(torch.nn.Module):
    """forward(pixel_values) -> image features [images, tokens_per_image, hidden] (the model's get_image_features);
    LLaVA-NeXT: each tile's features as rows [tiles * tokens_per_tile + 1, hidden], the image_newline vector last."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values):
        if type(self.vlm).__name__ == "LlavaForConditionalGeneration":
            return llava_image_features(self.vlm, pixel_values)
        if type(self.vlm).__name__ in IMAGE_BATCHES:
            return idefics_image_features(self.vlm, pixel_values)
        if type(self.vlm).__name__ in ANY_RESOLUTION:  # each tile's features as rows, then the image_newline row
            features = llava_image_features(self.vlm, pixel_values)
            newline = self.vlm.model.image_newline.to(features.dtype)
            return torch.cat([features.reshape(-1, features.shape[-1]), newline[None]])
        if type(self.vlm).__name__ in fixed_images.GLOBAL_VIEWS:  # Step3p7: its global views as one tensor
            return fixed_images.global_view_features(self.vlm, pixel_values)
        if type(self.vlm).__name__ in newline_views.NEWLINE_VIEWS:  # Unlimited-OCR: rows ended by image_newline
            return newline_views.newline_view_features(self.vlm, pixel_values)
        # DeepSeek-VL, Janus: only their inner model has get_image_features
        features = getattr(self.vlm, "get_image_features", None) or self.vlm.model.get_image_features
        out = features(pixel_values=pixel_values)
        return out if isinstance(out, torch.Tensor) else out.pooler_output


class PatchEncoder(torch.nn.Module):
    """The Qwen2-VL family's vision tower (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) over variable-resolution patches,
    exportable with a symbolic patch count:

        forward(pixel_values [M, merge^2, patch_dim], position_ids [M, merge^2, 2], image_ids [M][, grid inputs])
            -> features [M, hidden]

    M is the number of merged tokens (one per image token); the patches come in the processor's order (each
    merge x merge block consecutive), and `position_ids` are each patch's (row, column) in its image, as
    transformers' get_vision_position_ids makes them. transformers splits the attention by image with cu_seqlens
    (data-dependent sizes); here every patch attends to the patches of its own image through a mask built from
    `image_ids`, which is the same attention (images have one frame: grid_t 1).

    Qwen2.5-VL's blocks other than `fullatt_block_indexes` attend within windows (tiles of merged tokens): transformers
    reorders the tokens window by window, attends per window (cu_window_seqlens) and restores the order after the
    merger. Attention, rotary embedding and the per-token layers commute with that reordering, so here the tokens
    stay in order and those blocks take a mask built from `window_ids` (generate/vision_language.py patch_windows).

    Qwen3-VL adds a learned position table resampled to each image's grid, which takes each patch's bilinear taps
    `interp_indices` / `interp_weights` [M, merge^2, 4] (generate/vision_language.py patch_interpolation) in place of
    `window_ids`, and returns its deepstack features (the mergers of `deepstack_visual_indexes`' outputs) after the
    merged features, joined along the last axis: [M, hidden * (1 + deepstack layers)].

    The GLM-4V family (GLM-4.1V, GLM-4.5V, GLM-4.6V, GLM-OCR) is the same tower with its own ends: an RMSNorm after the
    patch embedding and a position table resampled bicubically (its 16 taps in `interp_indices` / `interp_weights`,
    generate/image_positions.py patch_bicubic; GLM-OCR has neither), query and key RMSNorms in attention (GLM-OCR),
    and a post-layernorm and a strided convolution over each merge x merge block before the merger."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)
        visual = vision_tower(vlm)
        self.full_attention = set(getattr(visual, "fullatt_block_indexes", None) or ())
        self.deepstack = list(getattr(visual, "deepstack_visual_indexes", None) or ())
        self.interpolated = hasattr(visual, "pos_embed") or hasattr(visual, "embeddings")
        self.glm = hasattr(visual, "downsample")  # the GLM-4V family's ends (see the class docstring)

    def forward(self, pixel_values, position_ids, image_ids, grid_input=None, grid_weights=None):
        """`grid_input`: Qwen2.5-VL's window_ids, or Qwen3-VL's / GLM-4V's interp_indices (with `grid_weights`, its
        interp_weights)."""
        import sys

        visual = vision_tower(self.vlm)
        apply_rotary_pos_emb_vision = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        hidden = visual.patch_embed(pixel_values.reshape(-1, pixel_values.shape[-1]))
        if hasattr(visual, "post_conv_layernorm"):
            hidden = visual.post_conv_layernorm(hidden)
        window_ids = None
        if self.interpolated and self.glm:  # GLM-4V: the table's bicubic taps, summed in float32 as grid_sample does
            indices, weights = (t.reshape(-1, t.shape[-1]) for t in (grid_input, grid_weights))
            table = visual.embeddings.position_embedding.weight
            taps = table.float().index_select(0, indices.reshape(-1)).reshape(*indices.shape, -1)
            hidden = hidden + (taps * weights.float()[:, :, None]).sum(1).to(table.dtype)
        elif self.interpolated:  # the learned position table at each patch: its bilinear taps, weighted
            indices, weights = (t.reshape(-1, t.shape[-1]) for t in (grid_input, grid_weights))
            hidden = hidden + (visual.pos_embed(indices) * weights[:, :, None]).sum(1).to(hidden.dtype)
        else:
            window_ids = grid_input
        cos, sin = visual.rotary_pos_emb(hidden, position_ids.reshape(-1, 2))

        def same(ids):  # [1, 1, patches, patches]: patch i and j share the id of their merged token
            ids = ids[:, None].expand(-1, group).reshape(-1)
            return (ids[:, None] == ids[None, :])[None, None]

        image = same(image_ids)
        window = same(window_ids) if window_ids is not None else image
        stacks = []
        for index, block in enumerate(visual.blocks):
            mask = image if index in self.full_attention else window
            x = block.norm1(hidden)
            attn, n = block.attn, x.shape[0]
            if hasattr(attn, "kv_dim"):  # EXAONE 4.5: grouped-query attention, its queries, keys and values split
                q, k, v = (t.reshape(n, -1, attn.head_dim)
                           for t in attn.qkv(x).split([attn.q_dim, attn.kv_dim, attn.kv_dim], dim=-1))
            elif not hasattr(attn, "qkv"):  # Qwen2.5-Omni: separate query, key and value projections
                q, k, v = (proj(x).reshape(n, attn.num_heads, -1) for proj in (attn.q, attn.k, attn.v))
            else:
                q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            if hasattr(attn, "q_norm"):  # GLM-OCR
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
            q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
            if k.shape[1] != q.shape[1]:  # each key/value head serves its group of query heads (transformers' repeat_kv)
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
            hidden = hidden + attn.proj(out[0].transpose(0, 1).reshape(n, -1))
            hidden = hidden + block.mlp(block.norm2(hidden))
            if index in self.deepstack:
                stacks.append(visual.deepstack_merger_list[self.deepstack.index(index)](hidden))
        if self.glm:  # each merge x merge block (consecutive patches) convolved into one token, then the merger
            merge = visual.spatial_merge_size
            hidden = visual.post_layernorm(hidden).view(-1, merge, merge, hidden.shape[-1]).permute(0, 3, 1, 2)
            return visual.merger(visual.downsample(hidden).reshape(-1, visual.downsample.out_channels))
        merged = visual.merger(hidden)
        projector = getattr(self.vlm.model, "projector", None)  # HyperCLOVAX: a linear map to the text hidden size
        if projector is not None:
            merged = projector(merged)
        return torch.cat([merged, *stacks], dim=-1) if stacks else merged


def vision_tower(vlm: torch.nn.Module) -> torch.nn.Module:
    """The variable-resolution tower: the Qwen2-VL family's `visual`, HyperCLOVAX Vision V2's `vision_model`."""
    inner = vlm.model
    return inner.visual if hasattr(inner, "visual") else inner.vision_model


class PixtralEncoder(torch.nn.Module):
    """Mistral3's and LightOnOCR's Pixtral tower and patch-merging projector over images at their own sizes, exportable
    with symbolic patch and token counts:

        forward(patches [P, C*p*p], positions [P, 2], image_ids [P], merge_index [M, merge^2]) -> features [M, hidden]

    `patches` are every image's patches in transformers' order (image by image, row-major), each flattened as its
    patch convolution reads it (channel, row, column), so the convolution is one matrix product; `positions` each
    patch's (row, column) in its image; `image_ids` its image; `merge_index` the patches of each merged token (a
    merge x merge block, row-major, as transformers' unfold takes them; an odd last row or column is left out as unfold
    leaves it). transformers crops each image's patches from a padded batch and attends within each image through a
    block mask; here the same mask is built from `image_ids`, and the merger gathers its blocks by index instead of
    splitting and unfolding per image (which torch.export would specialize to the traced sizes)."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def parts(self) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
        """(the Pixtral tower, the projector, the tower's layer(s) it projects): Mistral3's vision_tower,
        multi_modal_projector and vision_feature_layer; LightOnOCR's vision_encoder, vision_projection and last layer."""
        inner = self.vlm.model
        if hasattr(inner, "vision_tower"):
            return inner.vision_tower, inner.multi_modal_projector, self.vlm.config.vision_feature_layer
        return inner.vision_encoder, inner.vision_projection, -1

    def forward(self, patches, positions, image_ids, merge_index):
        tower, projector, layers = self.parts()
        weight = tower.patch_conv.weight
        hidden = torch.nn.functional.linear(patches.to(weight.dtype), weight.reshape(weight.shape[0], -1))
        hidden = tower.ln_pre(hidden[None])
        cos, sin = tower.patch_positional_embedding(hidden, positions)
        same = image_ids[:, None] == image_ids[None, :]
        mask = torch.zeros(same.shape, dtype=hidden.dtype).masked_fill(~same, torch.finfo(hidden.dtype).min)
        states = [hidden]  # transformers' hidden_states: the embeddings, then each layer's output
        for layer in tower.transformer.layers:
            states.append(layer(states[-1], mask[None, None], position_embeddings=(cos, sin)))
        chosen = torch.cat([states[k] for k in ([layers] if isinstance(layers, int) else layers)], dim=-1)[0]
        chosen = projector.norm(chosen)
        blocks = chosen.index_select(0, merge_index.reshape(-1)).reshape(*merge_index.shape, -1)
        merged = projector.patch_merger.merging_layer(blocks.transpose(1, 2).reshape(merge_index.shape[0], -1))
        return projector.linear_2(projector.act(projector.linear_1(merged)))


def llava_image_features(vlm: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """LlavaModel.get_image_features as one batched tensor (transformers' returns a list of per-image tensors, which
    torch.export would specialize to the traced image count): the chosen vision layer(s), CLS dropped for the
    "default" strategy, projected."""
    config, model = vlm.config, vlm.model
    hidden = model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True).hidden_states
    layers = config.vision_feature_layer
    chosen = [hidden[layer] for layer in (layers if isinstance(layers, (list, tuple)) else [layers])]
    if config.vision_feature_select_strategy == "default":
        chosen = [h[:, 1:] for h in chosen]
    return model.multi_modal_projector(torch.cat(chosen, dim=-1))


def idefics_image_features(vlm: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Idefics2/3's and SmolVLM's get_image_features over real images [N, C, H, W] with every pixel real (the runtime
    drops the padding images and refuses padded pixels, generate/vision_language.py): transformers' boolean indexing of
    the real images sizes the batch from the data, which torch.export cannot trace. The tower, then the connector (a
    pixel shuffle and MLP; Idefics2: a perceiver resampler over the patches)."""
    model, patch = vlm.model, int(vlm.config.vision_config.patch_size)
    mask = torch.ones((pixel_values.shape[0], pixel_values.shape[2] // patch, pixel_values.shape[3] // patch),
                      dtype=torch.bool, device=pixel_values.device)
    hidden = model.vision_model(pixel_values=pixel_values, patch_attention_mask=mask, return_dict=True).last_hidden_state
    if type(vlm).__name__ == "Idefics2ForConditionalGeneration":
        return model.connector(hidden, attention_mask=mask.view(pixel_values.shape[0], -1))
    return model.connector(hidden)


class MultimodalStep(DecoderStep):
    """forward(input_ids, position_ids, write_at, kv_valid, cache, image_features, image_index) -> (last logits, cache):
    the causal-LM step over the token embeddings, each image-token position's embedding replaced by its feature row.
    With `image_blocks` (tokens per image; Gemma 3) the tokens of one image also attend to each other both ways, as
    transformers' token_type_ids blocks do: image token i belongs to image i // image_blocks."""

    def __init__(self, lm: torch.nn.Module, layout: Any, image_blocks: int | None = None, prefix_lm: bool = False,
                 position_offset: int = 0, deepstack: int = 0, owner: torch.nn.Module | None = None):
        super().__init__(lm, layout, owner)
        self.image_blocks, self.prefix_lm, self.position_offset = image_blocks, prefix_lm, position_offset
        self.deepstack = deepstack  # Qwen3-VL: the feature rows also hold this many deepstack features (PatchEncoder)

    def forward(self, input_ids, position_ids, write_at, kv_valid, cache, image_features, image_index, rope_offsets=None):
        if self.deepstack:  # the merged features, then one block per deepstack layer, each added after its layer
            width = image_features.shape[-1] // (1 + self.deepstack)
            layers = [image_features[:, width * (k + 1):width * (k + 2)] for k in range(self.deepstack)]
            with deepstack_rows(self.lm, image_index, layers):
                return self._forward(input_ids, position_ids, write_at, kv_valid, cache, image_features[:, :width],
                                     image_index, rope_offsets)
        return self._forward(input_ids, position_ids, write_at, kv_valid, cache, image_features, image_index, rope_offsets)

    def _forward(self, input_ids, position_ids, write_at, kv_valid, cache, image_features, image_index, rope_offsets):
        is_image = image_index >= 0
        embeds = self.lm.get_input_embeddings()(torch.where(is_image, torch.zeros_like(input_ids), input_ids))
        rows = image_features.to(embeds.dtype).index_select(0, image_index.clamp(min=0).reshape(-1))
        embeds = torch.where(is_image[..., None], rows.reshape(*input_ids.shape, -1), embeds)
        also = None
        if self.image_blocks:
            block = torch.where(is_image, torch.div(image_index, self.image_blocks, rounding_mode="floor"), -1)  # [B, T]
            keys = write_columns(torch.full((input_ids.shape[0], kv_valid.shape[1]), -1, dtype=block.dtype), write_at, block)
            also = (block[:, :, None] >= 0) & (block[:, :, None] == keys[:, None, :])  # [B, T, L]
        if self.prefix_lm:  # every token of the prompt (this step's tokens) sees every other one; decode sees its own
            written = write_columns(torch.zeros(kv_valid.shape, dtype=torch.bool), write_at,
                                    torch.ones(input_ids.shape, dtype=torch.bool))
            also = written[:, None, :].expand(-1, input_ids.shape[1], -1)
        positions = position_ids + self.position_offset if self.position_offset else position_ids
        if rope_offsets is not None:  # Qwen2-VL's 3-D (temporal, height, width) positions: the text position + offsets
            positions = positions[None] + rope_offsets
        return self.step({"inputs_embeds": embeds}, positions, write_at, kv_valid, cache, also)


class RecurrentMultimodalStep(MultimodalStep, recurrent.RecurrentStep):
    """MultimodalStep over a text model with recurrent layers (Qwen3.5's gated delta rule beside its attention layers):
    the same embedding and feature merge, then RecurrentStep's `step` over its StateLayout's cache (each recurrent
    layer's states, each attention layer's keys and values), so left padding stays out of the state as it does for
    the text-only LM (hf/steps/recurrent.py)."""


@dataclasses.dataclass(frozen=True)
class LanguageCache:
    """The language model's cache as the multimodal step takes it: an attention-only KV cache (kv_cache.CacheLayout), or
    a recurrent step's StateLayout where the text model keeps a recurrent state (hf/steps/recurrent.py)."""

    layout: Any
    keeps_state: bool

    def dynamic_shapes(self, max_batch: int) -> tuple:
        """The step's own five inputs' symbolic dims (ids, positions, write_at, kv_valid, cache)."""
        if self.keeps_state:
            return recurrent.dynamic_shapes(self.layout, max_batch)
        return step_dynamic_shapes(self.layout, max_batch)

    def spec(self, vlm: torch.nn.Module, max_batch: int) -> GenerationSpec:
        """The generation spec; a recurrent layout's marks each cache tensor's kind ("kv" or "state") and dtype."""
        if self.keeps_state:
            return GenerationSpec(**recurrent.spec_fields(vlm, self.layout, max_batch))
        return GenerationSpec(**generation_fields(vlm, self.layout, max_batch))

    def step(self, vlm: torch.nn.Module, **options: Any) -> MultimodalStep:
        """The multimodal step over this cache (`options` as MultimodalStep's). A recurrent text model reads each token
        once, in order: an image's tokens cannot attend to later ones (Gemma 3's image blocks, a prefix-LM)."""
        if not self.keeps_state:
            if type(vlm).__name__ in WRAPPED_LANGUAGE_MODEL:
                return MultimodalStep(vlm.language_model, self.layout, owner=vlm, **options)
            return MultimodalStep(vlm, self.layout, **options)
        if options.get("image_blocks") or options.get("prefix_lm"):
            raise InputSpecError(f"{type(vlm).__name__}'s text model keeps a recurrent state, and its image tokens "
                                 "attend to later tokens (bidirectional image blocks or a prefix-LM), which a recurrent "
                                 "layer's state cannot: not supported")
        return RecurrentMultimodalStep(vlm, self.layout, **options)


def language_cache(vlm: torch.nn.Module, max_cache_len: int) -> LanguageCache:
    """The cache of `vlm`'s language model: a StateLayout where it has recurrent mixers (hf/stand_ins/mixers.py),
    else the KV-cache layout."""
    if recurrent.keeps_recurrent_state(vlm):
        return LanguageCache(recurrent.state_layout(vlm, max_cache_len), True)
    return LanguageCache(cache_layout(language_model(vlm), max_cache_len), False)


def language_model(vlm: torch.nn.Module) -> torch.nn.Module:
    """The module a step calls for `vlm`'s language part: the model itself, or its wrapped causal LM."""
    return vlm.language_model if type(vlm).__name__ in WRAPPED_LANGUAGE_MODEL else vlm


def write_columns(table: torch.Tensor, write_at: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`table` [B, L] with each row's step values [B, T] written at the step's slots: `write_at` [B, T] (each row's
    own) or [T] (shared by every row)."""
    return table.index_copy(1, write_at, values) if write_at.dim() == 1 else table.scatter(1, write_at, values)


@contextlib.contextmanager
def deepstack_rows(vlm: torch.nn.Module, image_index: torch.Tensor, layers: list[torch.Tensor]):
    """Qwen3-VL's text model adds deepstack features to the image positions' hidden states after its first layers
    (`_deepstack_process`, given the image positions as a boolean mask and the features in their order). For the
    call, its language model is handed `image_index` and the feature rows instead, and adds row image_index[b, t] at
    each image position (0 elsewhere): the same sums, with no boolean indexing (which torch.export cannot size)."""
    text = vlm.model.language_model
    forward = text.forward

    def with_deepstack(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(visual_pos_masks=image_index, deepstack_visual_embeds=layers)
        return forward(*args, **kwargs)

    def process(hidden_states, visual_pos_masks, visual_embeds):
        rows = visual_embeds.to(hidden_states.dtype).index_select(0, visual_pos_masks.clamp(min=0).reshape(-1))
        rows = rows.reshape(*visual_pos_masks.shape, -1)
        return hidden_states + torch.where(visual_pos_masks[..., None] >= 0, rows, torch.zeros_like(rows))

    names = ("forward", "_deepstack_process")
    saved = {name: text.__dict__[name] for name in names if name in text.__dict__}  # an instance's own, kept
    text.forward, text._deepstack_process = with_deepstack, process
    try:
        yield
    finally:
        for name in names:
            del text.__dict__[name]
        text.__dict__.update(saved)


# families refused by name: what their images need that the three entry points do not lower yet
UNSUPPORTED_IMAGES = {
    "Ernie4_5_VLMoeForConditionalGeneration": "its MoE layers send image tokens (and their start and end tokens: "
                                              "moe_mm_token_type_ids) to vision experts and text tokens to text "
                                              "experts, a routing by token type that the multimodal step's text model "
                                              "does not take, and its 3-D rope index reads the processor's "
                                              "mm_token_type_ids",
    "MiniCPMV4_6ForConditionalGeneration": "its NaViT tower merges 2x2 windows by window attention between two of its "
                                           "layers (vit_merger after insert_layer_id) and then again in its merger, "
                                           "over each image's target_sizes and slices; that tower is not built yet "
                                           "(a config whose image_token_id is None places no image at all)",
    "MiniCPMV4_7ForConditionalGeneration": "its NaViT tower merges 2x2 windows by window attention between two of its "
                                           "layers (vit_merger after insert_layer_id) and then again in its merger, "
                                           "over each image's target_sizes and slices; that tower is not built yet "
                                           "(a config whose image_token_id is None places no image at all)",
    "MiniCPMOcrForConditionalGeneration": "its NaViT tower merges 2x2 windows by window attention between two of its "
                                          "layers (vit_merger after insert_layer_id, unless downsample_mode is 4x) and "
                                          "in its merger, over each image's target_sizes and slices; that tower is "
                                          "not built yet (a config whose image_token_id is None places no image at all)",
    "Gemma4ForConditionalGeneration": "its vision tower takes each image as a padded sequence of patches with their "
                                      "(x, y) positions (image_position_ids, -1 for padding), pools them by position "
                                      "and drops the padding (a feature count read from the data), and its text model "
                                      "attends both ways within an image on its sliding layers only "
                                      "(mm_token_type_ids)",
    "Gemma4UnifiedForConditionalGeneration": "its encoder-free vision embedder takes each image as a padded sequence of "
                                             "raw patches with their (x, y) positions (image_position_ids, -1 for "
                                             "padding) and keeps only the real ones (a feature count read from the "
                                             "data), and its text model attends both ways within an image on its "
                                             "sliding layers only (mm_token_type_ids)",
    "InstructBlipForConditionalGeneration": "its Q-Former reads the instruction (qformer_input_ids) beside the image, so "
                                            "an image's features depend on the prompt, and encode_image takes the image alone",
    "InstructBlipVideoForConditionalGeneration": "its Q-Former reads the instruction (qformer_input_ids) beside the video "
                                                 "frames, so their features depend on the prompt, and encode_image takes "
                                                 "the image alone",
    "MllamaForConditionalGeneration": "its text model reads the image through cross-attention layers (a second cache, of "
                                      "the image's keys and values), which the multimodal step does not hold",
    "IdeficsForVisionText2Text": "its text model reads the image through gated cross-attention layers over a perceiver's "
                                 "latents (a second cache), which the multimodal step does not hold",
    "BlipForConditionalGeneration": "its text decoder cross-attends to the image features (an image-to-text "
                                    "encoder-decoder), where the multimodal step merges features into the prompt",
    "FuyuForCausalLM": "it takes an image as image_patches (its processor's patches, as many as the image's size makes) "
                       "placed at prompt positions by image_patches_indices, not pixel_values at expanded image tokens; "
                       "that input path (and the check's) is not built yet",
    "Kosmos2ForConditionalGeneration": "it places its image features by image_embeds_position_mask (an input its "
                                       "processor makes, not image tokens in the ids), and its text model numbers "
                                       "positions from the padding in input_ids; neither is reproduced yet",
    "Kosmos2_5ForConditionalGeneration": "it takes an image as Pix2Struct flattened_patches (each patch's row and "
                                         "column in its first two values, as many as the image's size makes, with "
                                         "their attention mask), places the features by image_embeds_position_mask (an "
                                         "input its processor makes, not image tokens in the ids), adds a segment "
                                         "embedding by that mask and numbers its sinusoidal positions from the padding "
                                         "in input_ids, as Kosmos-2 does; none of these is reproduced yet",
    "EvollaForProteinText2Text": "it reads protein sequences, not images: protein_input_ids through a SaProt encoder "
                                 "and a latent resampler, read by cross-attention adapters inside its Llama layers "
                                 "(with optional structure and MSA features), which the multimodal step (features "
                                 "merged at image tokens, one cache) does not hold",
    "PI0ForConditionalGeneration": "it is a vision-language-action policy, not a text generator: its forward returns a "
                                   "flow-matching velocity over action chunks (logits of shape [B, chunk_size, "
                                   "max_action_dim]) and sample_actions integrates it from noise over a PaliGemma "
                                   "prefix cache; there are no tokens to generate. Its PaliGemma design generates "
                                   "as PaliGemmaForConditionalGeneration (a PaliGemma checkpoint)",
    "GitForCausalLM": "it prepends its image features to the whole (left-padded) prompt itself, with no image tokens in "
                      "input_ids: the image rows sit before the padding, attend to each other both ways, take no "
                      "position embedding (the text's positions count from 0 after them) and stay in the cache that "
                      "decode's attention mask is widened over; the three entry points place features at image "
                      "tokens of the ids, which GIT's prompts do not hold",
    "Glm5NextForConditionalGeneration": "its text model is not lowered for generation: its linear-attention layers "
                                        "(Glm5NextTextLinearAttention, Kimi-style KDA: a forget-gated recurrent state "
                                        "and a short convolution) have no generation stand-in (hf/stand_ins/mixers.py), "
                                        "and its indexer over pooled keys (index_kpool) beside latent attention under "
                                        "hyper-connections does not trace over the step's cache; its GLM-OCR-like "
                                        "tower is not the obstacle (GlmOcrForConditionalGeneration generates with "
                                        "images)",
    "HYV4VLForConditionalGeneration": "its image features end each merged row with a learned newline feature, its "
                                      "position table is resampled on a grid shifted by scale (size + 0.1) / edge, "
                                      "and its own 3-D rope index (W + 1 columns a row, each frame a block of "
                                      "max(H, W + 1) positions) drives interleaved multimodal rotary in an HY V4 text "
                                      "model (latent attention with sinks, an indexer and hyper-connections); none of "
                                      "these is lowered yet. The text model alone generates as HYV4ForCausalLM "
                                      "(--task text-generation on an hy_v4 checkpoint)",
    "NemotronH_Omni_Reasoning_V3": "its RADIO vision tower takes each image as packed patches (image_grid_hw) with "
                                   "class and register tokens prepended per image and its position table resized "
                                   "bilinearly to each image's grid (first to a square of the longer side, then "
                                   "cropped), which no converted tower reproduces yet, and its language model is a "
                                   "whole Nemotron-H causal LM (Mamba2 layers' recurrent state) that the wrapped-"
                                   "language-model step does not hold; its audio tower is not converted either. The "
                                   "text model alone generates as NemotronHForCausalLM (--task text-generation on a "
                                   "nemotron_h checkpoint)",
}


# refused families whose text-generation conversion takes their text-only prompts (the sweep's rows)
TEXT_ONLY_GENERATES = ("Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration", "FuyuForCausalLM",
                       "GitForCausalLM")


def check_supported(vlm: torch.nn.Module) -> None:
    """InputSpecError unless `vlm`'s images can be lowered: a model built without a vision tower (Gemma 4's vision_config
    None) is a text model, and says so; a family refused by name says why."""
    name = type(vlm).__name__
    if hasattr(vlm.config, "vision_config") and vlm.config.vision_config is None:
        raise InputSpecError(f"{name} was built without a vision tower (its config's vision_config is None), so it "
                             "takes no images: convert it with --task text-generation")
    if name in UNSUPPORTED_IMAGES:
        text_only = (" Text-only prompts generate through its text-generation conversion (--task text-generation)"
                     if name in TEXT_ONLY_GENERATES else "")
        raise InputSpecError(f"{name}'s images are not supported: {UNSUPPORTED_IMAGES[name]}.{text_only}")
    if name not in SUPPORTED and name.endswith("ForCausalLM") and not hasattr(vlm.config, "vision_config"):
        # Mistral 4: transformers lists its causal LM among the image-text-to-text classes; it holds no vision tower
        raise InputSpecError(f"{name} has no vision tower (its config holds no vision_config), so it takes no images: "
                             "convert it with --task text-generation")
    if name not in SUPPORTED:
        raise InputSpecError(f"image-text-to-text conversion supports {', '.join(SUPPORTED)}; {name} is not supported yet "
                             "(docs/limitations.md)")


def prepared(vlm: torch.nn.Module, max_cache_len: int, max_batch: int, dtype: Any, weights: Any, quantize: str | None,
             group_size: int) -> torch.nn.Module:
    """What every vision-language conversion starts with: the limits, the family and the scheme checked, the model in
    eval mode at `dtype`."""
    check_limits(max_cache_len, max_batch)
    check_supported(vlm)
    if quantize is not None:
        check_scheme(quantize, group_size)
    vlm = vlm.eval()
    return cast_module(vlm, dtype, weights) if dtype is not None else vlm


def example_image_inputs(layout: Any, max_batch: int, feature_size: int, dtype: Any) -> tuple[int, tuple, Any, Any]:
    """The multimodal step's example inputs for its trace: (batch, the causal-LM step's inputs for `batch` rows of 3
    tokens, 7 feature rows, image_index [batch, 3] placing some of them), batch = min(max_batch, 2)."""
    batch = min(max_batch, 2)
    index = torch.tensor([[0, 1, -1], [2, -1, 3]])[:batch]
    return batch, example_step_inputs(layout, batch, 3), torch.zeros((7, feature_size), dtype=dtype), index


def check_image_token(vlm: torch.nn.Module) -> None:
    """InputSpecError where `vlm`'s image_token_id lies outside its text vocabulary, for the families whose forward
    embeds the image tokens before replacing them: transformers' embedding lookup fails on those ids too, so the config
    is inconsistent (the step itself embeds an image token as token 0)."""
    vocab, token = int(vlm.config.get_text_config().vocab_size), int(vlm.config.image_token_id)
    if not 0 <= token < vocab:
        raise InputSpecError(f"{type(vlm).__name__}'s image_token_id {token} is outside its text vocabulary of {vocab} "
                             "(transformers' embedding lookup fails on it too): the config is inconsistent")


def convert_vision_language(vlm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                            progress: Any = None, weights: Any = None, quantize: str | None = None,
                            group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """A transformers vision-language model -> a torch-free `VisionLanguageGenerator` (encode_image, prefill, decode).
    `weights` (a capture.weight_source.WeightSource) streams the params of a model built with fake parameters;
    `quantize` / `group_size` as in hf.steps.causal_lm.convert_causal_lm, for the language step's weights. The
    TOKEN_IMAGES families convert through hf/steps/image_tokens.py, PATCH_TOWERS through hf/steps/patch_towers.py,
    OMNI_THINKERS through hf/steps/omni.py and fixed_images.TWO_RESOLUTIONS through hf/steps/two_resolutions.py
    (hf/convert.py chooses)."""
    name = type(vlm).__name__
    if name in TOKEN_IMAGES + PATCH_TOWERS + OMNI_THINKERS + fixed_images.TWO_RESOLUTIONS:
        raise Torch2JaxError(f"{name} converts through its own module, not convert_vision_language: call "
                             "torch2jax.convert_hf (hf/convert.py IMAGE_CONVERTERS chooses it)")
    vlm = prepared(vlm, max_cache_len, max_batch, dtype, weights, quantize, group_size)
    if type(vlm).__name__ in NATIVE_RESOLUTION:
        return convert_native_resolution(vlm, max_cache_len=max_cache_len, max_batch=max_batch, progress=progress,
                                         weights=weights, quantize=quantize, group_size=group_size)
    if type(vlm).__name__ in VARIABLE_RESOLUTION:
        return convert_variable_resolution(vlm, max_cache_len=max_cache_len, max_batch=max_batch, progress=progress,
                                           weights=weights, quantize=quantize, group_size=group_size)
    config = vlm.config
    vision = config.vision_config
    if type(vlm).__name__ in fixed_images.EMBEDS_IMAGE_TOKENS:
        check_image_token(vlm)
    pixel_shape = fixed_images.pixel_shape(vlm)  # Inkling: its patches' own shape (hf/steps/fixed_images.py)
    if pixel_shape is None:
        size = vision.image_size if isinstance(vision.image_size, (list, tuple)) else (vision.image_size,) * 2  # InternVL
        pixel_shape = (int(getattr(vision, "num_channels", 3)), int(size[0]), int(size[1]))
    encoder = ImageEncoder(vlm).eval()
    try:
        with torch.no_grad():
            probe = encoder(torch.zeros((1, *pixel_shape), dtype=next(vlm.parameters()).dtype))
    except RuntimeError as err:  # e.g. a projector sized for other features than the tower makes
        raise InputSpecError(f"{type(vlm).__name__}'s vision tower and projector fail on an image of its config's size "
                             f"{list(pixel_shape)} ({str(err).splitlines()[0]}): the vision config is inconsistent (its "
                             "sizes do not chain), and transformers' own image features fail the same way") from err
    pinpoints = _grid_pinpoints(vlm, probe)
    if pinpoints is not None:  # rows: one tile's, then the newline
        tokens_per_image, feature_size = int(probe.shape[0]) - 1, int(probe.shape[1])
    else:
        tokens_per_image, feature_size = int(probe.shape[1]), int(probe.shape[2])
    language = language_cache(vlm, max_cache_len)
    layout = language.layout
    timer = StageTimer(progress)
    tiles = 1 + max(h // pixel_shape[1] * (w // pixel_shape[2]) for h, w in pinpoints) if pinpoints else 1
    max_images = IMAGES_PER_PROMPT * max_batch * MAX_TILES.get(type(vlm).__name__, tiles)
    if type(vlm).__name__ in fixed_images.TOKEN_PER_IMAGE:  # Inkling: each patch one token, every token in a prompt
        max_images = max_batch * max_cache_len
    images = {"name": "images", "min": 1, "max": max_images}
    encode_captured, _ = trace(encoder, (torch.zeros((2, *pixel_shape), dtype=probe.dtype),), None, ({0: images},), timer,
                               what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    batch, step_args, features, index = example_image_inputs(layout, max_batch, feature_size, probe.dtype)
    feature_rows = {"name": "image_rows", "min": 1, "max": max_images * tokens_per_image}
    shapes = language.dynamic_shapes(max_batch)
    blocks = tokens_per_image if type(vlm).__name__ in BIDIRECTIONAL_IMAGES else None
    kind = type(vlm).__name__
    step = language.step(vlm, image_blocks=blocks, prefix_lm=kind in PREFIX_LM,
                         position_offset=POSITION_OFFSET.get(kind, 0))
    captured, _ = trace(step.eval(), (*step_args, features, index), None,
                        (*shapes, {0: feature_rows}, shapes[0]), timer, what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec = language.spec(vlm, max_batch)
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = getattr(config, "image_token_index", None)
    if image_token is None:
        raise ExportError(f"{type(vlm).__name__}'s config names no image_token_id")
    spec_vision = VisionSpec(image_token_id=int(image_token), tokens_per_image=tokens_per_image, feature_size=feature_size,
                             feature_dtype=dtype_name(probe.dtype), pixel_shape=pixel_shape, max_images=max_images,
                             bidirectional_images=blocks is not None, prefix_lm=kind in PREFIX_LM, grid_pinpoints=pinpoints,
                             max_grid_tiles=_max_grid_tiles(vlm), processor_unsupported=PROCESSOR_UNSUPPORTED.get(kind),
                             image_batches=kind in IMAGE_BATCHES)
    return VisionLanguageGenerator(encode, prefill, decode, spec, spec_vision)


def _grid_pinpoints(vlm: torch.nn.Module, probe: torch.Tensor) -> tuple[tuple[int, int], ...] | None:
    """LLaVA-NeXT's / OneVision's image_grid_pinpoints (None for other models), once their packing is known to apply:
    a tile's features are a square map of its patches (CLS dropped by the "default" strategy, or a tower without one)."""
    if type(vlm).__name__ not in ANY_RESOLUTION:
        return None
    config = vlm.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    if int(probe.shape[0]) - 1 != side * side:
        raise InputSpecError(f"{type(vlm).__name__} with vision_feature_select_strategy "
                             f"{config.vision_feature_select_strategy!r} gives {int(probe.shape[0]) - 1} features a tile, "
                             f"not the {side}x{side} map of its patches that transformers' pack_image_features lays out "
                             "(a CLIP tower takes 'default', which drops its CLS feature)")
    return tuple((int(h), int(w)) for h, w in config.image_grid_pinpoints)


def _max_grid_tiles(vlm: torch.nn.Module) -> int:
    """OneVision's "anyres_max_N" N (0 for LLaVA-NeXT, whose maps are never shrunk)."""
    if type(vlm).__name__ != "LlavaOnevisionForConditionalGeneration":
        return 0
    ratio = str(getattr(vlm.config, "vision_aspect_ratio", "anyres_max_9"))
    if not ratio.startswith("anyres_max_") or not ratio.removeprefix("anyres_max_").isdigit():
        raise InputSpecError(f"LLaVA-OneVision's vision_aspect_ratio {ratio!r} is not supported (anyres_max_N)")
    return int(ratio.removeprefix("anyres_max_"))


def convert_variable_resolution(vlm: torch.nn.Module, *, max_cache_len: int, max_batch: int, progress: Any = None,
                                weights: Any = None, quantize: str | None = None,
                                group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """The Qwen2-VL family and GLM-4V's: encode_image over merged groups of patches (PatchEncoder; with Qwen2.5-VL's
    window ids or Qwen3-VL's / GLM-4V's position-table taps), prefill/decode with 3-D rotary offsets (and Qwen3-VL's
    deepstack features)."""
    config, vision = vlm.config, vlm.config.vision_config
    merge = int(vision.spatial_merge_size)
    # Qwen2.5-VL: the side of its attention windows, in merged tokens (transformers' vit_merger_window_size)
    window = int(vision.window_size) // merge // int(vision.patch_size) if getattr(vision, "window_size", None) else 0
    # Qwen3-VL: the side of its learned position table, resampled to each grid; its deepstack layers
    table = int(vision.num_position_embeddings ** 0.5) if getattr(vision, "num_position_embeddings", None) else 0
    bicubic = hasattr(vision_tower(vlm), "embeddings")  # GLM-4V: its table, resampled bicubically (16 taps a patch)
    if bicubic:
        table = int(vision.image_size) // int(vision.patch_size)
    # only the indexes of blocks the tower has make features (transformers' loop over its blocks never meets the rest)
    depth = len(vision_tower(vlm).blocks) if hasattr(vision_tower(vlm), "blocks") else None
    deepstack = len([i for i in getattr(vision, "deepstack_visual_indexes", None) or () if depth is None or 0 <= i < depth])
    group = merge * merge
    patch_dim = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    dtype = next(vlm.parameters()).dtype
    encoder = PatchEncoder(vlm).eval()
    language = language_cache(vlm, max_cache_len)
    layout = language.layout
    timer = StageTimer(progress)
    max_rows = max_batch * max_cache_len  # every image token sits in a prompt
    merged = {"name": "image_rows", "min": 1, "max": max_rows}
    grid_inputs = [torch.tensor([0, 1, 2])] if window else []
    if table:
        taps = 16 if bicubic else 4
        grid_inputs = [torch.zeros((3, group, taps), dtype=torch.long),
                       torch.full((3, group, taps), 1 / taps, dtype=torch.float32 if bicubic else dtype)]
    example = (torch.zeros((3, group, patch_dim), dtype=dtype), torch.zeros((3, group, 2), dtype=torch.long),
               torch.tensor([0, 0, 1]), *grid_inputs)
    with torch.no_grad():
        feature_size = int(encoder(*example).shape[-1])
    hidden = int(config.get_text_config().hidden_size)
    if feature_size != hidden * (1 + deepstack):  # transformers' masked_scatter would refuse them too
        raise InputSpecError(f"{type(vlm).__name__}'s vision tower makes features of {feature_size // (1 + deepstack)}, "
                             f"its text model's hidden size is {hidden}: the config is inconsistent (the vision "
                             "config's out_hidden_size must be the text hidden size)")
    check_image_token(vlm)  # these models embed the image tokens before replacing them
    encode_captured, _ = trace(encoder, example, None, ({0: merged},) * len(example), timer, what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    batch, step_args, features, index = example_image_inputs(layout, max_batch, feature_size, dtype)
    offsets = torch.zeros((3, batch, 3), dtype=torch.long)
    shapes = language.dynamic_shapes(max_batch)
    offset_dims = {axis + 1: d for axis, d in shapes[0].items()}
    text_positions = type(vlm).__name__ in TEXT_POSITIONS  # no rope_offsets input: the text positions as they are
    rope = () if text_positions else (offsets,)
    step = language.step(vlm, deepstack=deepstack)
    captured, _ = trace(step.eval(), (*step_args, features, index, *rope), None,
                        (*shapes, {0: merged}, shapes[0], *((offset_dims,) if rope else ())), timer,
                        what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec = language.spec(vlm, max_batch)
    spec_vision = VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=0, feature_size=feature_size,
                             feature_dtype=dtype_name(dtype), pixel_shape=(patch_dim,), max_images=max_rows,
                             spatial_merge_size=merge, window_size=window, position_table=table, bicubic_table=bicubic,
                             text_positions=text_positions)
    return VisionLanguageGenerator(encode, prefill, decode, spec, spec_vision)


def convert_native_resolution(vlm: torch.nn.Module, *, max_cache_len: int, max_batch: int, progress: Any = None,
                              weights: Any = None, quantize: str | None = None,
                              group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """Mistral3's and LightOnOCR's: encode_image over each image's patches at its own size (PixtralEncoder), the
    causal-LM step with the merged tokens' features at the image tokens."""
    config, vision = vlm.config, vlm.config.vision_config
    merge, patch, channels = int(config.spatial_merge_size), int(vision.patch_size), int(vision.num_channels)
    dtype = next(vlm.parameters()).dtype
    encoder = PixtralEncoder(vlm).eval()
    language = language_cache(vlm, max_cache_len)
    layout = language.layout
    timer = StageTimer(progress)
    max_rows = max_batch * max_cache_len  # every image token sits in a prompt
    merged = {"name": "image_rows", "min": 1, "max": max_rows}
    # an image makes at least one token; its patches outside whole merge blocks (an odd last row or column) are at most
    # (2 * merge - 1)^2 per token
    patches = {"name": "patches", "min": 1, "max": max_rows * (2 * merge - 1) ** 2}
    # two images of 3x3 and 2x4 merged tokens' patches (the first with an odd row and column left out of its blocks)
    sizes = np.asarray([[3 * merge + 1, 3 * merge + 1], [2 * merge, 4 * merge]]) * patch
    pixels = np.zeros((2, channels, int(sizes[:, 0].max()), int(sizes[:, 1].max())), np.float32)
    example = tuple(torch.from_numpy(a) for a in native_patches(pixels, sizes, patch, merge))
    example = (example[0].to(dtype), *example[1:])
    with torch.no_grad():
        feature_size = int(encoder(*example).shape[-1])
    hidden = int(config.get_text_config().hidden_size)
    if feature_size != hidden:
        raise InputSpecError(f"{type(vlm).__name__}'s projector makes features of {feature_size}, its text model's "
                             f"hidden size is {hidden}: the config is inconsistent")
    encode_captured, _ = trace(encoder, example, None, ({0: patches}, {0: patches}, {0: patches}, {0: merged}), timer,
                               what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    batch, step_args, features, index = example_image_inputs(layout, max_batch, feature_size, dtype)
    shapes = language.dynamic_shapes(max_batch)
    step = language.step(vlm)
    captured, _ = trace(step.eval(), (*step_args, features, index), None, (*shapes, {0: merged}, shapes[0]), timer,
                        what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec = language.spec(vlm, max_batch)
    size = int(vision.image_size)
    processor = NATIVE_PROCESSORS[type(vlm).__name__][0]
    unread = (f"{processor}'s settings (its patch size and merge, PixtralProcessor's image break and end tokens) are "
              "read from the model directory's processor_config.json at conversion, and there was none")
    spec_vision = VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=0, feature_size=feature_size,
                             feature_dtype=dtype_name(dtype), pixel_shape=(channels, size, size), max_images=max_rows,
                             processor_unsupported=unread, patch_size=patch, patch_merge=merge)
    return VisionLanguageGenerator(encode, prefill, decode, spec, spec_vision)


def _entry_points(encode: Model, captured: Any, timer: StageTimer, weights: Any, quantize: str | None,
                  group_size: int) -> tuple[Model, Model, Model]:
    """(encode_image, prefill, decode) over one params dict, from the encoder's model and the traced multimodal step;
    with `quantize`, the step's matrix-product weights quantized (the encoder reads none of them). The step may hold
    constants torch.export lifted (Chameleon's mask of its image tokens' logits) that the encoder does not read; the
    encoder may hold none, as each graph numbers its own lifted_tensor_N and the two would share one name."""
    _drop_unused_symbols(captured.graph)
    prefill = model_from(captured, timer, weights)
    lifted = [name for name in set(prefill.params) - set(encode.params) if name.startswith("lifted_tensor")]
    if set(encode.params) != set(prefill.params) - set(lifted) or any(n.startswith("lifted_tensor") for n in encode.params):
        raise ExportError("the image encoder and the language step do not share one params tree: "
                          f"{sorted(set(encode.params) ^ set(prefill.params))[:10]}")
    if quantize is not None:
        with timer.stage("quantize", f"quantize the language model's matmul weights to {quantize}"):
            prefill = quantize_model(prefill, quantize, group_size)
    graph = share_quantized_params(encode.graph, prefill) if quantize is not None else encode.graph
    encode = Model(encode._run, prefill.params, graph)  # one params dict for all three
    decode = Model(prefill._run, prefill.params, prefill.graph.with_fixed_dims({"tokens": 1, "image_rows": 1}))
    decode.quantization = prefill.quantization
    return encode, prefill, decode


def _drop_unused_symbols(graph: Any) -> None:
    """torch.export's range constraints may keep symbols of intermediate sizes that were later replaced (the image
    rows gathered per position); a dim no input carries cannot be exported, so only the inputs' dims are kept."""
    used = {str(d) for item in graph.inputs if item.meta is not None for d in (item.meta.shape or ()) if isinstance(d, str)}
    graph.symbols = {name: bounds for name, bounds in graph.symbols.items() if name in used}


def with_processor_text(vision: VisionSpec, directory: Path) -> VisionSpec:
    """The spec with what the model's processor writes for one image: the chat template's placeholder and what the
    processor expands it to (LLaVA: the image token once -> tokens_per_image times; Gemma 3: its begin-of-image token
    -> the full image sequence). Unchanged where the directory has no processor transformers can load."""
    if not (directory / "processor_config.json").is_file() and not (directory / "preprocessor_config.json").is_file():
        return vision
    if vision.patch_size:
        return _native_processor(vision, directory)
    wrap = _tile_wrap(directory)
    if wrap is not None and _image_processor_kind(directory) in TILED:
        # InternVL (its processor needs torchvision for videos): the tokenizer names what it writes around an image;
        # Qianfan-OCR's chat template writes a placeholder of its own (hf/steps/fixed_images.py)
        return dataclasses.replace(vision, tile_wrap=wrap, image_placeholder=fixed_images.image_placeholder(directory))
    try:
        processor = transformers().AutoProcessor.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError, ImportError):  # ImportError: Qwen2VLProcessor needs torchvision
        return vision
    full = getattr(processor, "full_image_sequence", None)
    placeholder = getattr(processor, "boi_token", None) if full else getattr(processor, "image_token", None)
    if not isinstance(placeholder, str):
        return vision
    expansion = full if isinstance(full, str) else placeholder * vision.tokens_per_image
    if vision.spatial_merge_size or vision.grid_pinpoints:  # Qwen2-VL, LLaVA-NeXT: it depends on each image's size
        expansion = None
    prompt = None
    if type(processor).__name__ == "PaliGemmaProcessor":  # no chat template: the image tokens, BOS, the prompt, a newline
        prompt = f"{placeholder}{processor.tokenizer.bos_token}{{prompt}}\n"
    if type(processor).__name__ == "JanusProcessor":  # the image tokens between its begin and end of image tokens
        if getattr(processor, "use_default_system_prompt", False):
            return dataclasses.replace(vision, processor_unsupported="JanusProcessor with use_default_system_prompt "
                                                                     "writes its own system prompt")
        expansion = processor.image_start_token + expansion + processor.image_end_token
    return dataclasses.replace(vision, image_placeholder=placeholder, image_expansion=expansion, prompt_format=prompt)


def _native_processor(vision: VisionSpec, directory: Path) -> VisionSpec:
    """Mistral3's PixtralProcessor or LightOnOCR's processor, from its processor_config.json (as its to_dict writes it;
    loading the processor itself needs torchvision): the spec ready for processor_inputs (PixtralProcessor's image
    token and its image break and end tokens), or unchanged, refusing, where the file is missing; refusing, saying why,
    where its tokens would not be the model's (another patch size times merge)."""
    try:
        config = json.loads((directory / "processor_config.json").read_text())
    except (OSError, ValueError):
        return vision
    kind = config.get("processor_class") if isinstance(config, dict) else None
    defaults = {name: sizes for name, sizes in NATIVE_PROCESSORS.values()}
    if kind not in defaults:
        return vision
    side = int(config.get("patch_size", defaults[kind][0])) * int(config.get("spatial_merge_size", defaults[kind][1]))
    model_side = vision.patch_size * vision.patch_merge
    if side != model_side:
        return dataclasses.replace(vision, processor_unsupported=f"{kind} writes an image token per {side}x{side} pixels "
                                   f"(patch_size x spatial_merge_size), the model makes one per {model_side}x{model_side}")
    if kind == "LightOnOcrProcessor":  # the image tokens alone; the placeholder is the image token
        return dataclasses.replace(vision, processor_unsupported=None)
    rows = (str(config.get("image_break_token", "[IMG_BREAK]")), str(config.get("image_end_token", "[IMG_END]")))
    return dataclasses.replace(vision, processor_unsupported=None, image_rows=rows,
                               image_placeholder=str(config.get("image_token", "[IMG]")))


def _image_processor_kind(directory: Path) -> str | None:
    try:
        processor = ImageProcessor.from_files(processor_files(directory))
    except Torch2JaxError:
        return None
    return processor.kind if processor is not None else None


def _tile_wrap(directory: Path) -> tuple[str, str] | None:
    """InternVL's image start and end tokens, as its tokenizer config names them (start_image_token, end_image_token,
    beside context_image_token: the image token); None for other tokenizers."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    extra = config.get("extra_special_tokens")
    named = {**config, **(extra if isinstance(extra, dict) else {})}
    names = [named.get(key) for key in ("start_image_token", "end_image_token", "context_image_token")]
    return (names[0], names[1]) if all(isinstance(name, str) for name in names) else None
