"""Further vision-language families built on ones the converter already lowers: LLaVA-NeXT-Video (LLaVA-NeXT's images;
its videos refused), EXAONE 4.5 (a Qwen2.5-VL tower with grouped-query attention, an EXAONE 4 text model with plain
positions) and HyperCLOVAX Vision V2 (a Qwen2.5-VL tower and a linear projector, a HyperCLOVAX text model with plain
positions), each a tiny random-weight model, its image features and greedy tokens compared with transformers'."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.hf.verify import check_generation, verify_vision_language

from . import vlms

TEXT = dict(vocab_size=vlms.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, eos_token_id=vlms.EOS, bos_token_id=vlms.BOS,
            pad_token_id=vlms.PAD)


def test_llava_next_video_images_equal_transformers_and_videos_are_refused():
    """LLaVA-NeXT-Video with images is LLaVA-NeXT (its vision_resampler pools only video frames): the packed features
    of images of two sizes equal transformers' get_image_features, 8 greedy tokens for a left-padded batch equal its
    generate, and video inputs are refused by name."""
    import transformers as tf

    torch.manual_seed(0)
    vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=32, patch_size=8, projection_dim=32)
    grids = [[32, 64], [64, 32], [64, 64]]
    config = tf.LlavaNextVideoConfig(vision_config=vision, text_config=tf.LlamaConfig(**TEXT), image_token_id=vlms.IMAGE,
                                     video_token_id=vlms.BOI, image_grid_pinpoints=grids, vision_feature_layer=-2,
                                     vision_feature_select_strategy="default")
    model = tf.LlavaNextVideoForConditionalGeneration(config).eval()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=96, max_batch=2)
    assert (g.vision.tokens_per_image, g.vision.grid_pinpoints) == (16, ((32, 64), (64, 32), (64, 64)))
    sizes = np.asarray([[30, 60], [50, 50]], np.int64)
    pixels = np.random.default_rng(1).standard_normal((2, 5, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(sizes)).pooler_output
    np.testing.assert_allclose(np.asarray(g.encode_grids(pixels, sizes)), torch.cat(want).numpy(), rtol=1e-5, atol=1e-5)
    check_generation(verify_vision_language(model, g, tokens=8))
    with pytest.raises(InputSpecError, match="video inputs are not supported"):
        g.generate(np.asarray([[vlms.BOS, vlms.FIRST_WORD]]), pixel_values_videos=pixels)


def qwen2_5_tower_family(name: str):
    """A tiny EXAONE 4.5 (its tower's grouped-query attention: 2 key/value heads for 4 query heads) or HyperCLOVAX
    Vision V2 (Qwen2.5-VL's tower, a linear projector from its 48 features to the text model's 64) with random weights:
    windows of 2x2 merged tokens and one full-attention block."""
    import transformers as tf
    from transformers.models.exaone4_5 import configuration_exaone4_5 as exaone
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    torch.manual_seed(0)
    tower = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4, spatial_merge_size=2,
                 temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1])
    if name == "exaone4_5":
        vision = exaone.Exaone4_5_VisionConfig(**tower, num_key_value_heads=2, out_hidden_size=64)
        text = tf.Exaone4Config(**TEXT, sliding_window=64, layer_types=["sliding_attention", "full_attention"])
        config = exaone.Exaone4_5_Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                                         image_token_id=vlms.IMAGE, video_token_id=vlms.BOI)
        return tf.Exaone4_5_ForConditionalGeneration(config).eval()
    vision = Qwen2_5_VLVisionConfig(**tower, out_hidden_size=48)
    text = tf.HyperCLOVAXConfig(**TEXT, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=0.75)
    config = tf.HyperCLOVAXVisionV2Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                                          image_token_id=vlms.IMAGE, video_token_id=vlms.BOI)
    return tf.HyperCLOVAXVisionV2ForConditionalGeneration(config).eval()


@pytest.mark.parametrize("name", ["exaone4_5", "hyperclovax_vision_v2"])
def test_qwen2_5_tower_family_features_and_greedy_equal_transformers(name):
    """EXAONE 4.5 and HyperCLOVAX Vision V2: Qwen2.5-VL's windowed tower (EXAONE's with grouped-query attention,
    HyperCLOVAX's followed by its projector) and a text model given plain 1-D positions (no rope index): the image
    features of two grids equal transformers', and 8 greedy tokens for a left-padded batch equal its generate."""
    model = qwen2_5_tower_family(name)
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)
    assert (g.vision.window_size, g.vision.text_positions, g.vision.feature_size) == (2, True, 64)
    grids = np.asarray([[1, 6, 10], [1, 8, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids))
    np.testing.assert_allclose(np.asarray(g.encode_patches(pixels, grids)), torch.cat(list(want.pooler_output)).numpy(),
                               rtol=1e-5, atol=1e-5)
    check_generation(verify_vision_language(model, g, tokens=8))
