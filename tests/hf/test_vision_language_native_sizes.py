"""Vision-language families whose images come at their own sizes through towers of their own: LFM2-VL (a SigLIP2 NaFlex
tower over padded patch rows of variable length, a pixel-unshuffle projector, an LFM2 text model with a recurrent
convolution state), its greedy tokens and image features compared with transformers' on the same weights and images;
and the image-text-to-text families refused by name (ERNIE 4.5 VL MoE, MiniCPM-V 4.6 / 4.7, MiniCPM-OCR), each
refusal saying why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.naflex_inputs import naflex_patches
from torch2jax.hf.verify import check_generation, verify_vision_language

from . import vlms


def lfm2_vl(downsample: int = 2):
    """LFM2-VL: 4x4-pixel patches, a 4x4 position table resized to each image's grid, blocks of downsample x downsample
    patches one token; an LFM2 text model of a convolution layer and an attention layer. Weights drawn wider than the
    default init so that the greedy tokens vary with the image, the position table widest so that a wrong resize of it
    changes them."""
    import transformers as tf

    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, patch_size=4, num_patches=16, vision_use_head=False)
    text = dict(model_type="lfm2", vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                max_position_embeddings=128, pad_token_id=vlms.PAD, bos_token_id=vlms.BOS, eos_token_id=vlms.EOS)
    config = tf.Lfm2VlConfig(vision_config=vision, text_config=text, image_token_id=vlms.IMAGE,
                             projector_hidden_size=32, downsample_factor=downsample)
    torch.manual_seed(0)
    model = tf.Lfm2VlForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1:
                param.normal_(0, 0.2)
        model.model.vision_tower.embeddings.position_embedding.weight.normal_(0, 2)
    return model


@pytest.fixture(scope="module")
def converted():
    """(LFM2-VL, its generator): converted once for the tests below."""
    model = lfm2_vl()
    return model, torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)


def test_lfm2_vl_greedy_equals_transformers(converted, tmp_path):
    """The sweep's check (two images of 4x4 and 2x8 patches, no padding) before and after save/load."""
    model, g = converted
    assert "Lfm2VlProcessor" in g.vision.processor_unsupported
    check_generation(verify_vision_language(model, g, tokens=6))
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    check_generation(verify_vision_language(model, loaded, tokens=6))


def test_lfm2_vl_images_of_two_sizes_padded(converted):
    """Two images of 4x6 and 2x4 patches (6 and 2 tokens), the second padded to the first's 24 patches as its processor
    pads them (pixel_attention_mask): the features equal transformers' get_image_features and the greedy tokens its
    generate; inputs not as the processor makes them are refused."""
    model, g = converted
    rng = np.random.default_rng(1)
    shapes = np.asarray([[4, 6], [2, 4]], np.int64)
    pixels = rng.standard_normal((2, 24, 48)).astype(np.float32)
    mask = np.arange(24)[None] < shapes.prod(1)[:, None]
    pixels[1, 8:] = 0
    words = (rng.integers(vlms.FIRST_WORD, vlms.VOCAB, 8)).tolist()
    rows = [[vlms.BOS, words[0]] + [vlms.IMAGE] * 6 + words[1:3],
            [vlms.BOS, words[3]] + [vlms.IMAGE] * 2 + words[4:8]]
    ids = np.full((2, 10), vlms.PAD, np.int64)
    attention = np.zeros((2, 10), np.int64)
    for r, row in enumerate(rows):
        ids[r, 10 - len(row):], attention[r, 10 - len(row):] = row, 1
    inputs = dict(pixel_values=pixels, spatial_shapes=shapes, pixel_attention_mask=mask.astype(np.int64))
    with torch.no_grad():
        theirs_features = torch.cat(model.get_image_features(
            torch.from_numpy(pixels), torch.from_numpy(shapes), torch.from_numpy(mask)).pooler_output).numpy()
        theirs = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(attention),
                                **{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=6,
                                do_sample=False, pad_token_id=vlms.PAD, eos_token_id=None).numpy()
    flat, grids = naflex_patches(g.vision, pixels, shapes, mask)
    ours_features = np.asarray(g.encode_patches(flat, grids))
    np.testing.assert_allclose(ours_features, theirs_features, rtol=1e-5, atol=1e-5)
    ours = g.generate(ids, attention_mask=attention, **inputs, max_new_tokens=6, eos_token_id=[])
    np.testing.assert_array_equal(ours, theirs)
    assert len(set(theirs[:, 10:].reshape(-1).tolist())) > 1  # the check can tell the tokens apart
    with pytest.raises(InputSpecError, match="give spatial_shapes"):
        g.generate(ids, attention_mask=attention, pixel_values=pixels, max_new_tokens=2)
    shifted = np.roll(mask, 1, axis=1)
    with pytest.raises(InputSpecError, match="pixel_attention_mask must mark each image's first"):
        g.generate(ids, attention_mask=attention, **dict(inputs, pixel_attention_mask=shifted), max_new_tokens=2)
    with pytest.raises(InputSpecError, match="multiples of 2"):
        g.generate(ids, attention_mask=attention, **dict(inputs, spatial_shapes=np.asarray([[3, 6], [2, 4]])),
                   max_new_tokens=2)


def ernie_vl():
    import transformers as tf

    text = dict(vocab_size=vlms.VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, moe_intermediate_size=[32, 32], moe_k=2, moe_num_experts=4,
                moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse"],
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, patch_size=14, spatial_merge_size=1)
    config = tf.Ernie4_5_VLMoeConfig(text_config=text, vision_config=vision, image_start_token_id=5,
                                     image_end_token_id=6, image_token_id=7, video_start_token_id=3,
                                     video_end_token_id=4, video_token_id=8)
    return tf.Ernie4_5_VLMoeForConditionalGeneration(config)


def minicpm(kind: str):
    import transformers as tf

    config_class, model_class = {"minicpmv4_6": ("MiniCPMV4_6Config", "MiniCPMV4_6ForConditionalGeneration"),
                                 "minicpmv4_7": ("MiniCPMV4_7Config", "MiniCPMV4_7ForConditionalGeneration"),
                                 "minicpm_ocr": ("MiniCPMOcrConfig", "MiniCPMOcrForConditionalGeneration")}[kind]
    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"],
                linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=16, insert_layer_id=0)
    config = getattr(tf, config_class)(text_config=text, vision_config=vision, insert_layer_id=0)
    return getattr(tf, model_class)(config)


@pytest.mark.parametrize("kind, why", [("ernie4_5_vl_moe", "vision experts"), ("minicpmv4_6", "window attention"),
                                       ("minicpmv4_7", "window attention"), ("minicpm_ocr", "window attention")])
def test_refused_families_say_why(kind, why):
    """ERNIE 4.5 VL MoE (image tokens routed to vision experts by token type) and the MiniCPM-V NaViT towers (a
    window-attention merger between their layers) are refused by name, saying why."""
    torch.manual_seed(0)
    model = (ernie_vl() if kind == "ernie4_5_vl_moe" else minicpm(kind)).eval()
    with pytest.raises(InputSpecError, match=f"{type(model).__name__}'s images are not supported: .*{why}"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)
