"""Variable-resolution SigLIP towers (hf/steps/patch_towers.py): VideoLLaMA3 (one token a patch, 1-D text positions),
PaddleOCR-VL (raster patches merged 2x2 by its projector, a bilinear position table, Qwen2-VL's 3-D rope index) and
Cosmos3-Edge (a SigLIP2 tower whose position table is resized with antialiasing, Qwen2-VL's 3-D rope index),
each tiny with random weights: greedy tokens for a left-padded batch of images of several sizes (two in one prompt)
equal transformers' generate, from the converted generator and from its saved artifact loaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.image_positions import patch_positions
from torch2jax.generate.patch_inputs import antialias_weights, half_pixel_taps, merge_order
from torch2jax.hf.verify import check_generation, verify_vision_language

from . import vlms

TEXT = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256, eos_token_id=vlms.EOS, bos_token_id=vlms.BOS,
            pad_token_id=vlms.PAD)
TOWER = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8)


def video_llama3():
    """VideoLLaMA3: 8x8 patches, one image token a patch (its image processor's merge_size 1), a Qwen2 text model."""
    import transformers as tf

    config = tf.VideoLlama3Config(text_config=dict(model_type="qwen2", **TEXT), vision_config=TOWER,
                                  image_token_id=vlms.IMAGE, video_token_id=vlms.SOFT)
    return tf.VideoLlama3ForConditionalGeneration(config)


def paddleocr_vl():
    """PaddleOCR-VL: 8x8 patches merged 2x2 by the projector, a 4x4 position table (32x32 pixels), an ERNIE 4.5 text
    model with 3-D rope sections [2, 3, 3]."""
    import transformers as tf

    text = dict(TEXT, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [2, 3, 3]})
    config = tf.PaddleOCRVLConfig(text_config=text, vision_config=dict(TOWER, image_size=32, spatial_merge_size=2),
                                  image_token_id=vlms.IMAGE, vision_start_token_id=vlms.BOI, vision_end_token_id=vlms.EOI,
                                  video_token_id=vlms.SOFT)
    return tf.PaddleOCRVLForConditionalGeneration(config)


def cosmos3_edge():
    """Cosmos3-Edge: 8x8 patches merged 2x2, a 4x4 position table (resized up, down and not at all by the test's
    grids), a Llama-like text model with 3-D rope sections [2, 3, 3]."""
    import transformers as tf

    text = dict(TEXT, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [2, 3, 3]})
    config = tf.Cosmos3EdgeConfig(text_config=text, vision_config=dict(TOWER, num_patches=16, spatial_merge_size=2),
                                  projector_hidden_size=32, image_token_id=vlms.IMAGE, vision_start_token_id=vlms.BOI,
                                  vision_end_token_id=vlms.EOI, video_token_id=vlms.SOFT)
    return tf.Cosmos3EdgeForConditionalGeneration(config)


def lfm3_vl():
    """LFM3-VL: 8x8 patches merged 2x2, a depthwise 3x3 convolution layer and a grouped-query attention layer in the
    tower, an LFM3 text model (a short-convolution layer's recurrent state beside an attention layer)."""
    import transformers as tf

    text = dict(TEXT, model_type="lfm3", head_dim=16, layer_types=["conv", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  patch_size=8, temporal_patch_size=1, spatial_merge_size=2, layer_types=["conv", "full_attention"])
    config = tf.Lfm3VlConfig(text_config=text, vision_config=vision, projector_hidden_size=32, image_token_id=vlms.IMAGE,
                             vision_start_token_id=vlms.BOI, vision_end_token_id=vlms.EOI, video_token_id=vlms.SOFT)
    return tf.Lfm3VlForConditionalGeneration(config)


def kimi_k25():
    """Kimi K2.5: raster 8x8 patches merged 2x2, a 4x4 position table resampled bicubically, a DeepSeek-V3 text model
    (latent attention, one dense and one mixture-of-experts layer)."""
    import transformers as tf

    text = dict(TEXT, model_type="deepseek_v3", num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=2,
                num_experts_per_tok=1, n_shared_experts=1, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
                v_head_dim=8, qk_nope_head_dim=4, first_k_dense_replace=1, n_group=1, topk_group=1)
    vision = dict(TOWER, pos_emb_height=4, pos_emb_width=4, merge_kernel_size=[2, 2])
    config = tf.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                               image_token_id=vlms.IMAGE, video_token_id=vlms.SOFT, vision_start_token_id=vlms.BOI,
                               vision_end_token_id=vlms.EOI)
    return tf.Kimi_K25ForConditionalGeneration(config)


def muse_glimmer():
    """Muse Glimmer: raster 8x8 patches shuffled 2x2, a 4x4 position table (windows of 4x4 patches: the test's 4x6 image
    has two), a window-attention and a full-attention layer, a Gemma 2-like text model (soft-capped logits)."""
    import transformers as tf

    text = dict(TEXT, head_dim=16, sliding_window=16)
    vision = dict(TOWER, pos_emb_height=4, pos_emb_width=4, merge_size=2, patch_temporal=1,
                  max_position_embeddings=16, layer_types=["window_attention", "full_attention"])
    config = tf.MuseGlimmerConfig(text_config=text, vision_config=vision, out_hidden_size=128, projector_hidden_size=32,
                                  image_token_id=vlms.IMAGE, video_token_id=vlms.SOFT)
    return tf.MuseGlimmerForConditionalGeneration(config)


FAMILIES = {"video_llama_3": video_llama3, "paddleocr_vl": paddleocr_vl, "cosmos3_edge": cosmos3_edge,
            "lfm3_vl": lfm3_vl, "kimi_k25": kimi_k25, "muse_glimmer": muse_glimmer}


def batch(g, grids: list[list[list[int]]], seed: int = 0, lead: tuple[int, ...] = (vlms.SOFT,)) -> tuple:
    """Left-padded prompts, row r holding the images of grids[r] (each between the vision start and end tokens) and
    `lead` after its BOS (a video token by default: Kimi K2.5 and Muse Glimmer embed it as token 0), their pixels as
    the family's processor lays them out, the grids."""
    rng = np.random.default_rng(seed)
    merge = g.vision.spatial_merge_size
    rows = []
    for r, images in enumerate(grids):
        row = [vlms.BOS, *lead, *rng.integers(vlms.FIRST_WORD, vlms.VOCAB, 2 + 3 * r).tolist()]
        for t, h, w in images:
            row += [vlms.BOI] + [vlms.IMAGE] * (t * h * w // merge // merge) + [vlms.EOI]
        rows.append(row + rng.integers(vlms.FIRST_WORD, vlms.VOCAB, 3).tolist())
    width = max(map(len, rows))
    ids = np.asarray([[vlms.PAD] * (width - len(r)) + r for r in rows], np.int64)
    mask = np.asarray([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int64)
    flat = np.asarray([g for images in grids for g in images], np.int64)
    patches = int(np.prod(flat, axis=1).sum())
    pixels = rng.standard_normal((patches, *g.vision.pixel_shape)).astype(np.float32)
    return ids, mask, pixels, flat


def reference(model, ids, mask, pixels, grids, tokens: int) -> np.ndarray:
    """transformers' greedy generate, with what the family's processor adds (PaddleOCR-VL: mm_token_type_ids;
    VideoLLaMA3: image_merge_sizes, 1 an image)."""
    extra = {}
    if type(model).__name__ == "VideoLlama3ForConditionalGeneration":
        extra["image_merge_sizes"] = torch.ones(len(grids), dtype=torch.long)
    elif type(model).__name__ in ("PaddleOCRVLForConditionalGeneration", "Cosmos3EdgeForConditionalGeneration"):  # 3-D
        extra["mm_token_type_ids"] = torch.from_numpy((ids == vlms.IMAGE).astype(np.int32))
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
                             max_new_tokens=tokens, do_sample=False, pad_token_id=vlms.PAD, eos_token_id=None, **extra)
    return out.numpy()


# VideoLLaMA3 (PaddleOCR-VL's SigLIP layers, plain positions as LFM3-VL's), Kimi K2.5 (PaddleOCR-VL's raster patches, its
# bicubic taps checked against transformers below) and Cosmos3-Edge (its antialiased weights checked below, Qwen2-VL's
# rope index as PaddleOCR-VL's) in the slow tier, ~20 s each on 2 cores (make test-slow)
SLOW = ("video_llama_3", "kimi_k25", "cosmos3_edge")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in FAMILIES])
def test_greedy_equals_transformers(name, tmp_path):
    """6 greedy tokens for a left-padded batch (one image of 4x6 patches; two of 2x4 and 4x4) equal transformers'
    generate, and so do the sweep's (verify_vision_language); PaddleOCR-VL's also from its saved artifact loaded (its
    patch layout is in the manifest). VideoLLaMA3 takes its processor's image_merge_sizes, and refuses other merges."""
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)
    ids, mask, pixels, grids = batch(g, [[[1, 4, 6]], [[1, 2, 4], [1, 4, 4]]])
    theirs = reference(model, ids, mask, pixels, grids, 6)
    extra = {"image_merge_sizes": np.ones(len(grids), np.int64)} if name == "video_llama_3" else {}
    if name == "paddleocr_vl":
        g = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
        assert g.vision.patch_tower == "raster"
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=6,
                      eos_token_id=[], **extra)
    np.testing.assert_array_equal(ours, theirs)
    check_generation(verify_vision_language(model, g, tokens=6))
    if name == "video_llama_3":
        with pytest.raises(InputSpecError, match="image_merge_sizes"):
            g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=2,
                       image_merge_sizes=np.full(len(grids), 2))


def test_raster_inputs_equal_transformers():
    """PaddleOCR-VL's and Kimi K2.5's runtime inputs: the half-pixel bilinear and bicubic taps equal transformers'
    (get_vision_interpolation_indices_and_weights, raster order), and the merge-group order is the order transformers'
    projector joins a block's patches in (its reshape of each image's raster features; Kimi's temporal merge index)."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    grids = np.asarray([[1, 4, 6], [1, 2, 4], [1, 6, 2]], np.int64)
    raster = patch_positions(grids, 1)
    sizes = np.concatenate([np.repeat([[h, w]], t * h * w, axis=0) for t, h, w in grids.tolist()])
    indices, weights = half_pixel_taps(raster, sizes, 4)
    theirs = get_vision_interpolation_indices_and_weights(torch.from_numpy(grids), num_grid_per_side=4)
    np.testing.assert_array_equal(indices, theirs[0].numpy())
    np.testing.assert_array_equal(weights, theirs[1].numpy())
    indices, weights = half_pixel_taps(raster, sizes, 4, bicubic=True)  # Kimi K2.5's
    theirs = get_vision_interpolation_indices_and_weights(torch.from_numpy(grids), num_grid_per_side=4, mode="bicubic")
    np.testing.assert_array_equal(indices, theirs[0].numpy())
    np.testing.assert_allclose(weights, theirs[1].numpy(), rtol=1e-6, atol=1e-7)
    order = merge_order(grids, 2)
    start = 0
    for t, h, w in grids.tolist():  # the projector's reshape(t, h/2, 2, w/2, 2).transpose(2, 3) of raster indices
        blocks = torch.arange(start, start + h * w).reshape(t, h // 2, 2, w // 2, 2).transpose(2, 3).reshape(-1)
        np.testing.assert_array_equal(order[start:start + h * w], blocks.numpy())
        start += h * w


def test_antialias_weights_equal_transformers_resize():
    """Cosmos3-Edge's runtime input: each patch's weights on the table, times the table, equal transformers'
    resize_positional_embeddings (F.interpolate, bilinear with antialias) for grids smaller, larger and the same as the
    table, in merge-group order."""
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgeVisionEmbeddings

    grids = np.asarray([[1, 2, 4], [1, 4, 6], [1, 8, 2], [1, 4, 4], [1, 2, 10]], np.int64)
    table = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(0))
    theirs = Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings(table, torch.from_numpy(grids), 2)
    ours = antialias_weights(grids, 2, 4) @ table.reshape(16, 8).numpy()
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_conv_neighbors_equal_transformers_short_conv():
    """LFM3-VL's runtime input: each patch's 3x3 neighbours (merge-group order, -1 outside its image), gathered and
    weighted by the kernel, equal transformers' Lfm3VlVisionShortConv (each image rastered to its grid and convolved)
    over images of several sizes."""
    from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionShortConv

    from torch2jax.generate.patch_inputs import conv_neighbors

    torch.manual_seed(0)
    config = lfm3_vl().config.vision_config
    conv = Lfm3VlVisionShortConv(config, 0).eval()
    grids = np.asarray([[1, 4, 6], [1, 2, 2], [1, 6, 4]], np.int64)
    hidden = torch.randn(int(np.prod(grids, axis=1).sum()), config.hidden_size)
    with torch.no_grad():
        theirs = conv(hidden, grids.tolist()).numpy()
        input_gate, output_gate, conv_input = (t.numpy() for t in conv.in_proj(hidden).chunk(3, dim=-1))
        kernel = conv.spatial_conv.weight.reshape(config.hidden_size, -1).numpy()
        out_proj = conv.out_proj.weight.numpy()
    taps = conv_neighbors(grids, 2, 3)
    gated = np.concatenate([input_gate * conv_input, np.zeros((1, config.hidden_size), np.float32)])
    near = gated[taps]  # -1 picks the zero row
    ours = (output_gate * np.einsum("pkc,ck->pc", near, kernel)) @ out_proj.T
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_every_patch_tower_family_has_its_kind():
    """vision_language.PATCH_TOWERS (what is supported) and patch_towers.TOWER_KINDS (how each converts) name the same
    classes: one added to a table alone would be refused or converted without its inputs."""
    from torch2jax.hf.steps.patch_towers import TOWER_KINDS
    from torch2jax.hf.steps.vision_language import PATCH_TOWERS

    assert set(TOWER_KINDS) == set(PATCH_TOWERS)
