"""Variable-resolution towers beside the Qwen2-VL family's (PatchEncoder, hf/steps/vision_language.py): flattened
patches and image_grid_thw in, attention split per image (transformers' cu_seqlens), here a mask from `image_ids` so the
tower traces with a symbolic patch count.

    VideoLLaMA3   a SigLIP tower with 2-D axial rotary positions (no position table), each image's patches unmerged
                  (its processor's merge_size is 1 for images: one token a patch, raster order), an MLP projector;
                  a Qwen2 text model of plain 1-D positions (TEXT_POSITIONS: no rope index).
    PaddleOCR-VL  a SigLIP tower whose learned position table is resampled bilinearly (half-pixel, align_corners False)
                  to each image's grid, 2-D axial rotary positions, a post-layernorm, then a projector over each
                  merge x merge block; an ERNIE 4.5 text model with Qwen2-VL's 3-D rope index (rope_offsets). Its
                  processor gives the patches in raster order as [patches, C, p, p]; the runtime puts them in merge
                  groups (generate/patch_inputs.py), which the tower does not see (attention, rotary and the table
                  taps are per patch) and the projector's blocks need.

    Cosmos3-Edge  a SigLIP2 tower (no rotary positions) whose learned table is resized to each image's grid by an
                  antialiased bilinear interpolate: each patch's weights on the whole table, a matrix product
                  (ResampledPatchEncoder); Qwen3.5-MoE's merger; a Llama-like text model with Qwen2-VL's rope index.
    LFM3-VL       Qwen2-VL's patches and rotary positions, its layers gated depthwise 3x3 convolutions over each image's
                  patch grid (each patch's neighbours gathered by index: ConvPatchEncoder) or grouped-query attention;
                  an LFM3 text model (a short convolution's recurrent state) of 1-D positions.
    Kimi K2.5     PaddleOCR-VL's raster patches and merge, its table resampled bicubically (16 taps), its own 2-D rotary
                  layout (KimiPatchEncoder); a DeepSeek-V3 text model of 1-D positions.
    LFM2-VL       a SigLIP2 NaFlex tower (its processor's padded patch rows cut to each image's own) and a pixel-unshuffle
                  projector (hf/steps/naflex_towers.py); an LFM2 text model of 1-D positions.

Each takes pixel_values [M, merge^2, patch_dim] (M the image tokens, each merge x merge block's patches consecutive)
with image_ids [M] and its per-patch inputs (generate/patch_inputs.py) -> features [M, hidden], as PatchEncoder does.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ...capture.converter import StageTimer, model_from, trace
from ...capture.fx import dtype_name
from ...errors import InputSpecError
from ...generate.vision_language import VisionLanguageGenerator
from ...generate.vision_spec import VisionSpec
from ...runtime.quantize import DEFAULT_GROUP_SIZE
from .clip_patch_tower import ClipPatchEncoder, check_dense_attention
from .image_attention import image_mask, resampled_patches, within_image_layers
from .kv_cache import adopt_parts
from .naflex_towers import NaflexPatchEncoder, naflex_sizes
from .vision_language import (
    PROCESSOR_UNSUPPORTED,
    TEXT_POSITIONS,
    MultimodalStep,
    _entry_points,
    check_image_token,
    example_image_inputs,
    language_cache,
    prepared,
)

# models whose forward embeds the video token as token 0, as it does the image token (Kimi K2.5's `multimodal_mask`)
VIDEO_AS_PAD = ("Kimi_K25ForConditionalGeneration", "MuseGlimmerForConditionalGeneration")
# transformers class -> the tower's kind (its runtime inputs, generate/patch_inputs.py)
TOWER_KINDS = {"VideoLlama3ForConditionalGeneration": "", "PaddleOCRVLForConditionalGeneration": "raster",
                "Cosmos3EdgeForConditionalGeneration": "resampled", "Lfm3VlForConditionalGeneration": "conv",
                "Kimi_K25ForConditionalGeneration": "raster", "MuseGlimmerForConditionalGeneration": "windowed",
                "Lfm2VlForConditionalGeneration": "naflex", "MiniMaxM3SparseForConditionalGeneration": ""}


class SiglipPatchEncoder(torch.nn.Module):
    """VideoLLaMA3's and PaddleOCR-VL's SigLIP tower and projector over merge groups of patches (module docstring):
    every patch attends to its own image's patches through a mask from `image_ids` (transformers attends per image
    over cu_seqlens), with the tower's own projections, rotary embedding and layer norms."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)
        self.paddle = type(vlm).__name__ == "PaddleOCRVLForConditionalGeneration"

    def tower(self) -> torch.nn.Module:
        inner = self.vlm.model
        return inner.visual.vision_model if self.paddle else inner.vision_model

    def forward(self, pixel_values, position_ids, image_ids, interp_indices=None, interp_weights=None):
        visual = self.tower()
        rotate = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        flat = pixel_values.reshape(-1, pixel_values.shape[-1])
        if self.paddle:  # the patch convolution over [patches, C, p, p], then the table's bilinear taps
            embeddings = visual.embeddings
            conv = embeddings.patch_embedding
            side = conv.kernel_size[0]
            hidden = conv(flat.reshape(flat.shape[0], -1, side, side).to(conv.weight.dtype)).reshape(flat.shape[0], -1)
            indices, weights = (t.reshape(-1, t.shape[-1]) for t in (interp_indices, interp_weights))
            table = embeddings.position_embedding(indices)
            hidden = hidden + (table * weights[:, :, None]).sum(1).to(hidden.dtype)
            rotary = visual.encoder.rotary_pos_emb
        else:
            hidden = visual.embeddings(flat.to(visual.embeddings.patch_embedding.weight.dtype))
            rotary = visual.rotary_pos_emb
        cos, sin = rotary(hidden, position_ids.reshape(-1, 2))
        hidden = within_image_layers(visual.encoder.layers, hidden, image_mask(image_ids, group),
                                     lambda q, k: rotate(q, k, cos, sin))
        hidden = visual.post_layernorm(hidden)
        if self.paddle:  # each merge x merge block's patches (consecutive, row-major) side by side, then the MLP
            projector = self.vlm.model.projector
            blocks = projector.pre_norm(hidden).reshape(-1, group * hidden.shape[-1])
            return projector.linear_2(projector.act(projector.linear_1(blocks)))
        return self.vlm.model.projector(hidden)  # VideoLLaMA3: one token a patch (merge_size 1)


class ResampledPatchEncoder(torch.nn.Module):
    """Cosmos3-Edge's SigLIP2 tower and projector over merge groups of patches (the processor's order):

        forward(pixel_values [M, merge^2, patch_dim], image_ids [M], resample [M, merge^2, side^2]) -> [M, hidden]

    transformers resizes its learned side x side position table to each image's grid with an antialiased bilinear
    F.interpolate (in float32) per image; here each patch's row of that resampling, `resample` (its weight on every
    table row, generate/patch_inputs.py antialias_weights), is one matrix product with the table. No rotary positions;
    attention within each image through a mask from `image_ids`."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values, image_ids, resample):
        visual = self.vlm.model.visual
        hidden = resampled_patches(visual.embeddings, pixel_values, resample)
        hidden = within_image_layers(visual.encoder.layers, hidden, image_mask(image_ids, pixel_values.shape[1]))
        return self.vlm.model.projector(visual.post_layernorm(hidden))


class ConvPatchEncoder(torch.nn.Module):
    """LFM3-VL's tower and projector over merge groups of patches (the processor's order), its layers gated depthwise
    convolutions over each image's patch grid or grouped-query attention within each image:

        forward(pixel_values [M, merge^2, patch_dim], position_ids [M, merge^2, 2], image_ids [M],
                neighbors [M, merge^2, k * k]) -> [M, hidden]

    transformers rasters each image's patches to its grid to convolve them (sizes read from image_grid_thw); here each
    patch's k x k neighbourhood is gathered by `neighbors` (the flat index of each tap's patch, -1 outside the image:
    the convolution's zero padding; generate/patch_inputs.py conv_neighbors) and weighted by the kernel."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values, position_ids, image_ids, neighbors):
        visual = self.vlm.model.vision_tower
        rotate = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        hidden = visual.patch_embed(pixel_values.reshape(-1, pixel_values.shape[-1]).to(visual.patch_embed.weight.dtype))
        hidden = visual.embedding_norm(hidden)
        cos, sin = visual.rotary_pos_emb(hidden, position_ids.reshape(-1, 2))
        ids = image_ids[:, None].expand(-1, group).reshape(-1)
        mask = (ids[:, None] == ids[None, :])[None, None]
        taps = neighbors.reshape(-1, neighbors.shape[-1])
        outside = (taps < 0)[..., None]
        for layer in visual.layers:
            x, n = layer.operator_norm(hidden), hidden.shape[0]
            if layer.is_attention_layer:
                attn = layer.self_attn
                q = attn.q_norm(attn.q_proj(x).view(n, -1, attn.head_dim))
                k = attn.k_norm(attn.k_proj(x).view(n, -1, attn.head_dim))
                v = attn.v_proj(x).view(n, -1, attn.head_dim)
                q, k = rotate(q, k, cos, sin)
                q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
                if k.shape[1] != q.shape[1]:  # each key/value head serves its group of query heads
                    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
                x = attn.out_proj(out[0].transpose(0, 1).reshape(n, -1))
            else:
                conv = layer.conv
                input_gate, output_gate, conv_input = conv.in_proj(x).chunk(3, dim=-1)
                gated = input_gate * conv_input
                near = gated.index_select(0, taps.clamp(min=0).reshape(-1)).reshape(*taps.shape, -1)
                near = torch.where(outside, torch.zeros_like(near), near)
                kernel = conv.spatial_conv.weight.reshape(gated.shape[-1], -1).t()  # [k * k, channels], taps row-major
                x = conv.out_proj(output_gate * (near * kernel[None]).sum(1))
            hidden = hidden + x
            hidden = hidden + layer.feed_forward(layer.ffn_norm(hidden))
        return self.vlm.model.multi_modal_projector(hidden)


class KimiPatchEncoder(torch.nn.Module):
    """Kimi K2.5's MoonViT tower and projector over merge groups of patches (its processor gives them raster, as
    [patches, C, p, p]; the runtime regroups them, generate/patch_inputs.py "raster"):

        forward(pixel_values [M, merge^2, C*p*p], position_ids [M, merge^2, 2], image_ids [M],
                interp_indices, interp_weights [M, merge^2, 16]) -> [M, hidden]

    Its learned position table is resampled bicubically to each image's grid (16 taps a patch, weights in float32), an
    image (one frame) adds the time table's zero row; 2-D rotary positions; attention within each image through a
    mask; the temporal merge of one frame is each merge block's patches as they are (weight 1), then the projector."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values, position_ids, image_ids, interp_indices, interp_weights):
        visual = self.vlm.model.vision_tower
        rotate = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        flat = pixel_values.reshape(-1, pixel_values.shape[-1])
        embed = visual.patch_embed
        side = embed.proj.kernel_size[0]
        hidden = embed.proj(flat.reshape(flat.shape[0], -1, side, side).to(embed.proj.weight.dtype)).reshape(flat.shape[0], -1)
        table = embed.pos_emb.position_embeddings.flatten(0, 1)
        indices, weights = (t.reshape(-1, t.shape[-1]) for t in (interp_indices, interp_weights))
        taps = table.index_select(0, indices.reshape(-1)).reshape(*indices.shape, -1)
        positions = (taps * weights.to(table.dtype)[:, :, None]).sum(1) + embed.pos_emb.time_position_embeddings[0]
        hidden = hidden + positions.to(hidden.dtype)
        cos, sin = visual.rotary_emb(hidden, position_ids.reshape(-1, 2))
        ids = image_ids[:, None].expand(-1, group).reshape(-1)
        mask = (ids[:, None] == ids[None, :])[None, None]
        for block in visual.layers:
            hidden = kimi_layer(block, hidden, mask, cos, sin, rotate)
        hidden = visual.final_layernorm(hidden)
        return self.vlm.model.mm_projector(hidden.reshape(-1, group, hidden.shape[-1])).squeeze(1)


def kimi_layer(block: torch.nn.Module, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               rotate: Any) -> torch.Tensor:
    """One layer of Kimi K2.5's tower (Muse Glimmer's too) over every patch at once [patches, hidden]: attention within
    `mask` (its image, or its window) instead of transformers' per-image cu_seqlens, then the MLP."""
    attn, n = block.attn, hidden.shape[0]
    x = block.norm1(hidden)
    q, k, v = (proj(x).reshape(1, n, -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = rotate(q, k, cos, sin)
    q, k, v = (t.transpose(2, 1) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    hidden = hidden + attn.proj(out[0].transpose(0, 1).reshape(n, -1))
    return hidden + block.mlp(block.norm2(hidden))


class WindowedPatchEncoder(torch.nn.Module):
    """Muse Glimmer's tower (Kimi K2.5's layers) and adapter over merge groups of its raster patches:

        forward(pixel_values [M, merge^2, patch_dim], position_ids [M, merge^2, 2], image_ids [M], window_ids
                [M, merge^2], interp_indices, interp_weights [M, merge^2, 4]) -> [M, hidden]

    Its table's bilinear taps (zero padding, over the grid as transformers passes it: height and width swapped) and its
    rotary positions ((column, row) + 1) come from the runtime (generate/patch_inputs.py "windowed"). transformers
    reorders the patches window by window for its window-attention layers and back after them; attention and the
    per-patch layers commute with that, so here the patches stay in merge groups and those layers take a mask from
    `window_ids` (its full-attention layers one from `image_ids`). The pixel shuffle joins each block's patches
    channel-major."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values, position_ids, image_ids, window_ids, interp_indices, interp_weights):
        model = self.vlm.model
        visual = model.vision_tower
        rotate = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        embedder = visual.patch_embedder
        weight = embedder.patch_embedding.weight
        hidden = embedder.patch_embedding(pixel_values.reshape(-1, pixel_values.shape[-1]).to(weight.dtype))
        indices, weights = (t.reshape(-1, t.shape[-1]) for t in (interp_indices, interp_weights))
        positions = (embedder.position_embedding_table(indices) * weights[:, :, None]).sum(1)
        hidden = visual.ln_pre(hidden + positions.to(hidden.dtype))
        cos, sin = visual.rotary_emb(hidden, position_ids.reshape(-1, 2))

        def same(ids):
            return (ids[:, None] == ids[None, :])[None, None]

        image = same(image_ids[:, None].expand(-1, group).reshape(-1))
        window = same(window_ids.reshape(-1))
        for index, block in enumerate(visual.layers):
            mask = window if visual.config.layer_types[index] == "window_attention" else image
            hidden = kimi_layer(block, hidden, mask, cos, sin, rotate)
        hidden = visual.ln_post(hidden)
        hidden = hidden.reshape(-1, group, hidden.shape[-1]).permute(0, 2, 1).reshape(-1, group * hidden.shape[-1])
        return model.perception_emb_norm(model.vision_projection(model.vision_adapter(hidden)))


class VideoAsPadStep(MultimodalStep):
    """The multimodal step of Kimi K2.5 and Muse Glimmer, whose forward embeds the video token as token 0 as it does the
    image token (its `multimodal_mask`): a video token among the text (or generated) is embedded as token 0."""

    def __init__(self, lm: torch.nn.Module, layout: Any, video_token_id: int):
        super().__init__(lm, layout)
        self.video_token_id = video_token_id

    def _forward(self, input_ids, *rest):
        ids = torch.where(input_ids == self.video_token_id, torch.zeros_like(input_ids), input_ids)
        return super()._forward(ids, *rest)


def tower_sizes(vlm: torch.nn.Module) -> tuple[int, int, int]:
    """(merge, patch_dim, position table side) of a PATCH_TOWERS model's images (LFM3-VL: its kernel's side)."""
    if type(vlm).__name__ == "Lfm2VlForConditionalGeneration":  # its downsample_factor merges (naflex_towers.py)
        return naflex_sizes(vlm)
    vision = vlm.config.vision_config
    patch_dim = int(getattr(vision, "num_channels", 0) or 0) * int(vision.patch_size) ** 2
    if type(vlm).__name__ == "PaddleOCRVLForConditionalGeneration":
        table = int(vlm.model.visual.vision_model.embeddings.num_grid_per_side)
        return int(vision.spatial_merge_size), patch_dim, table
    if type(vlm).__name__ == "Lfm3VlForConditionalGeneration":  # Qwen2-VL's patches; the kernel's side for "table"
        kernel = int(vision.conv_kernel_size)
        if kernel % 2 == 0:
            raise InputSpecError(f"Lfm3VlForConditionalGeneration with conv_kernel_size {kernel}: an even kernel's "
                                 "padding changes the grid's size, which transformers' own reshape refuses")
        patch_dim = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
        return int(vision.spatial_merge_size), patch_dim, kernel
    if type(vlm).__name__ == "Kimi_K25ForConditionalGeneration":
        height, width = (int(k) for k in vision.merge_kernel_size)
        if height != width or int(vision.pos_emb_height) != int(vision.pos_emb_width):
            raise InputSpecError(f"Kimi_K25ForConditionalGeneration with merge_kernel_size {[height, width]} and a "
                                 f"{vision.pos_emb_height}x{vision.pos_emb_width} position table: only square ones are "
                                 "taken (image_grid_thw's multiples and the table's taps assume them)")
        return height, 3 * int(vision.patch_size) ** 2, int(vision.pos_emb_height)
    if type(vlm).__name__ == "MuseGlimmerForConditionalGeneration":
        if int(vision.pos_emb_height) != int(vision.pos_emb_width):
            raise InputSpecError(f"MuseGlimmerForConditionalGeneration with a {vision.pos_emb_height}x"
                                 f"{vision.pos_emb_width} position table: only a square one is taken")
        return int(vision.merge_size), int(vision.patch_temporal) * 3 * int(vision.patch_size) ** 2, int(vision.pos_emb_height)
    if type(vlm).__name__ == "MiniMaxM3SparseForConditionalGeneration":  # Qwen2.5-VL's 3-D patches
        patch_dim = int(vision.num_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
        return int(vision.spatial_merge_size), patch_dim, 0
    if type(vlm).__name__ == "Cosmos3EdgeForConditionalGeneration":
        return int(vision.spatial_merge_size), patch_dim, int(vlm.model.visual.embeddings.position_embedding_size)
    return 1, patch_dim, 0  # VideoLLaMA3: its image processor's merge_size for images


def convert_patch_tower(vlm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                        progress: Any = None, weights: Any = None, quantize: str | None = None,
                        group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """encode_image over merge groups of patches (SiglipPatchEncoder), the multimodal step with Qwen2-VL's 3-D rotary
    offsets (PaddleOCR-VL) or plain text positions (VideoLLaMA3). The options as vision_language.convert_vision_language's."""
    vlm = prepared(vlm, max_cache_len, max_batch, dtype, weights, quantize, group_size)
    config, name = vlm.config, type(vlm).__name__
    merge, patch_dim, table = tower_sizes(vlm)
    group = merge * merge
    dtype = next(vlm.parameters()).dtype
    kind = TOWER_KINDS[name]
    kimi = name == "Kimi_K25ForConditionalGeneration"
    if name == "MiniMaxM3SparseForConditionalGeneration":
        check_dense_attention(vlm)
    encoder = ({"Kimi_K25ForConditionalGeneration": KimiPatchEncoder,
                "MiniMaxM3SparseForConditionalGeneration": ClipPatchEncoder}.get(name) or
               {"resampled": ResampledPatchEncoder, "conv": ConvPatchEncoder,
                "windowed": WindowedPatchEncoder, "naflex": NaflexPatchEncoder}.get(kind, SiglipPatchEncoder))(vlm).eval()
    language = language_cache(vlm, max_cache_len)
    layout = language.layout
    timer = StageTimer(progress)
    max_rows = max_batch * max_cache_len  # every image token sits in a prompt
    merged = {"name": "image_rows", "min": 1, "max": max_rows}
    taps = [torch.zeros((3, group, 4), dtype=torch.long), torch.full((3, group, 4), 0.25, dtype=dtype)] if table else []
    if kimi:  # bicubic: 16 taps, float32 weights
        taps = [torch.zeros((3, group, 16), dtype=torch.long), torch.full((3, group, 16), 1 / 16)]
    if kind == "windowed":  # each patch's window id, then the table's taps
        taps = [torch.tensor([[0] * group, [0] * group, [1] * group]), *taps]
    if kind == "conv":  # each patch's k x k neighbours (-1 outside its image)
        taps = [torch.full((3, group, table * table), -1, dtype=torch.long)]
    example = (torch.zeros((3, group, patch_dim), dtype=dtype), torch.zeros((3, group, 2), dtype=torch.long),
               torch.tensor([0, 0, 1]), *taps)
    if kind in ("resampled", "naflex"):  # no rotary positions; each patch's weights on the whole table, float32
        example = (example[0], example[2], torch.full((3, group, table * table), 1 / table ** 2))
    try:
        with torch.no_grad():
            feature_size = int(encoder(*example).shape[-1])
    except RuntimeError as err:  # e.g. a projector sized for other features than the tower makes
        raise InputSpecError(f"{name}'s vision tower and projector fail on a few patches "
                             f"({str(err).splitlines()[0]}): the config is inconsistent (its sizes do not chain, e.g. "
                             "a projector sized for another tower's hidden size), and transformers' own image "
                             "features fail the same way") from err
    text = config.get_text_config()
    if feature_size != int(text.hidden_size):
        raise InputSpecError(f"{name}'s projector makes features of {feature_size}, its text model's hidden size is "
                             f"{text.hidden_size}: the config is inconsistent")
    check_image_token(vlm)  # these models embed the image tokens before replacing them
    encode_captured, _ = trace(encoder, example, None, ({0: merged},) * len(example), timer, what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    batch, step_args, features, index = example_image_inputs(layout, max_batch, feature_size, dtype)
    shapes = language.dynamic_shapes(max_batch)
    text_positions = name in TEXT_POSITIONS
    rope = () if text_positions else (torch.zeros((3, batch, 3), dtype=torch.long),)
    rope_dims = () if text_positions else ({axis + 1: d for axis, d in shapes[0].items()},)
    step = language.step(vlm)
    if name in VIDEO_AS_PAD and not language.keeps_state:  # its video token embedded as token 0, as its forward does
        step = VideoAsPadStep(vlm, layout, video_token_id=int(config.video_token_id))
    elif name in VIDEO_AS_PAD:
        raise InputSpecError(f"{name} with a text model that keeps a recurrent state: its video token's embedding "
                             "(token 0's, as its forward makes it) is not lowered over a recurrent step")
    captured, _ = trace(step.eval(), (*step_args, features, index, *rope), None, (*shapes, {0: merged}, shapes[0], *rope_dims),
                        timer, what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec = language.spec(vlm, max_batch)
    vision = config.vision_config
    pixel_shape = ((patch_dim // int(vision.patch_size) ** 2, int(vision.patch_size), int(vision.patch_size))
                   if kind == "raster" else (patch_dim,))
    spec_vision = VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=0, feature_size=feature_size,
                             feature_dtype=dtype_name(dtype), pixel_shape=pixel_shape, max_images=max_rows,
                             spatial_merge_size=merge, position_table=table, text_positions=text_positions,
                             bicubic_table=kimi, window_size=table if kind == "windowed" else 0,
                             patch_tower=kind, processor_unsupported=PROCESSOR_UNSUPPORTED.get(name))
    return VisionLanguageGenerator(encode, prefill, decode, spec, spec_vision)

