"""Image-text-to-text families that are variants of paths torch2jax already converts, each tiny with random weights:
greedy tokens equal transformers' generate on the same weights and inputs, from the converted generator and from its
saved artifact loaded. MiniMax M3 VL (hf/steps/clip_patch_tower.py: a CLIP-like tower with 3-D rotary positions over
Qwen2-VL's patches, 1-D text positions); Mistral 4 (a causal LM that transformers lists among the image-text-to-text
classes: refused there with the advice to convert it as text generation, which generates). HY V4 VL and GLM5-Next,
whose parts are not lowered yet, are refused by name saying why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.hf.verify import check_generation, verify_generation, verify_vision_language

from . import vlms
from .test_vision_language_patches import batch

TEXT = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=256, eos_token_id=vlms.EOS,
            bos_token_id=vlms.BOS, pad_token_id=vlms.PAD)


def minimax_m3_vl(layer_types: tuple[str, str] = ("full_attention", "full_attention")):
    """MiniMax M3 VL: 8x8 patches of 2 frames merged 2x2 by the projector, a 2-layer CLIP-like tower (heads of 16 dims,
    12 of them rotated by (t, h, w)), a MiniMax M3 text model (a dense and a mixture-of-experts layer, partial rotary)."""
    import transformers as tf

    text = dict(TEXT, dense_intermediate_size=64, shared_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                rotary_dim=8, mlp_layer_types=["dense", "sparse"], layer_types=list(layer_types),
                index_head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                  temporal_patch_size=2, spatial_merge_size=2, image_size=32)
    config = tf.MiniMaxM3VLConfig(text_config=text, vision_config=vision, projector_hidden_size=32,
                                  image_token_index=vlms.IMAGE, video_token_index=vlms.SOFT)
    model = tf.MiniMaxM3SparseForConditionalGeneration(config)
    with torch.no_grad():  # weights large enough that attention (and so the rotary positions) shapes the features
        for param in (*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters()):
            param.normal_(std=0.3)
    return model


def patch_batch(g, grids: list[list[list[int]]], seed: int = 0) -> tuple:
    """Left-padded prompts holding the images of grids (test_vision_language_patches.batch, no video token)."""
    return batch(g, grids, seed, lead=())


@pytest.fixture(scope="module")
def minimax():
    """(model, its converted generator), shared by the MiniMax M3 VL tests (one conversion)."""
    torch.manual_seed(0)
    model = minimax_m3_vl().eval()
    return model, torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)


def test_minimax_m3_vl_greedy_equals_transformers(minimax, tmp_path):
    """6 greedy tokens for a left-padded batch (one image of 4x6 patches; two of 2x4 and 4x4 in one prompt) equal
    transformers' generate; the saved artifact loaded passes the sweep's check (verify_vision_language)."""
    model, g = minimax
    ids, mask, pixels, grids = patch_batch(g, [[[1, 4, 6]], [[1, 2, 4], [1, 4, 4]]])
    with torch.no_grad():
        theirs = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
                                max_new_tokens=6, do_sample=False, pad_token_id=vlms.PAD, eos_token_id=None).numpy()
    assert len(set(theirs[:, ids.shape[1]:].reshape(-1).tolist())) > 1  # not one token repeated
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=6,
                      eos_token_id=[])
    np.testing.assert_array_equal(ours, theirs)
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))  # the sweep's check (an image a prompt), after load
    check_generation(verify_vision_language(model, loaded, tokens=6))


def test_minimax_m3_vl_rotary_positions_matter(minimax):
    """The tower's 3-D rotary positions reach the features: the same patches at swapped positions (an image of 2x4
    patches read as 4x2) give other features, each equal to transformers' get_image_features."""
    model, g = minimax
    pixels = np.random.default_rng(1).standard_normal((8, *g.vision.pixel_shape)).astype(np.float32)
    for grid in ([[1, 2, 4]], [[1, 4, 2]]):
        grid = np.asarray(grid, np.int64)
        with torch.no_grad():
            theirs = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(grid)).pooler_output[0].numpy()
        ours = np.asarray(g.encode_patches(pixels, grid))
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
    wide = np.asarray(g.encode_patches(pixels, np.asarray([[1, 2, 4]])))
    tall = np.asarray(g.encode_patches(pixels, np.asarray([[1, 4, 2]])))
    assert np.abs(wide - tall).max() > 0.01 * np.abs(wide).max()


def test_minimax_m3_vl_sparse_layers_are_refused():
    """A MiniMax M3 text model with block-sparse layers (minimax_m3_sparse: a lightning indexer over a cache layer of
    its own) is refused naming them, before any trace."""
    model = minimax_m3_vl(("full_attention", "minimax_m3_sparse")).eval()
    with pytest.raises(InputSpecError, match="minimax_m3_sparse layers .* not lowered yet"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)


def mistral4():
    """Mistral 4: latent attention (interleaved partial rotary, yarn scaling), a mixture-of-experts layer."""
    import transformers as tf

    config = tf.Mistral4Config(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                               num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                               v_head_dim=16, qk_nope_head_dim=8, head_dim=16, max_position_embeddings=256,
                               eos_token_id=vlms.EOS, bos_token_id=vlms.BOS, pad_token_id=vlms.PAD)
    return tf.Mistral4ForCausalLM(config)


def test_mistral4_is_refused_as_images_naming_text_generation():
    """Mistral 4's causal LM (listed among transformers' image-text-to-text classes) holds no vision tower: the
    image-text-to-text conversion refuses it naming --task text-generation."""
    torch.manual_seed(0)
    with pytest.raises(InputSpecError, match="no vision tower.*--task text-generation"):
        torch2jax.convert_hf(mistral4().eval(), task="image-text-to-text", max_cache_len=64, max_batch=2)


@pytest.mark.slow  # reason: the text-generation path it takes is the causal LMs' (tested beside it); the sweep runs it too
def test_mistral4_generates_as_text(tmp_path):
    """The conversion the refusal names: its greedy tokens equal transformers' generate, from its saved artifact loaded."""
    torch.manual_seed(0)
    model = mistral4().eval()
    g = torch2jax.convert_hf(model, task="text-generation", max_cache_len=64, max_batch=2)
    check_generation(verify_generation(model, torch2jax.load(torch2jax.save(g, tmp_path / "out")), tokens=6))


def _latent_text(**more) -> dict:
    """A tiny latent-attention (MLA) mixture-of-experts text config with an indexer, as HY V4 VL's and GLM5-Next's."""
    return dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8,
                index_head_dim=16, max_position_embeddings=128, pad_token_id=vlms.PAD, bos_token_id=vlms.BOS,
                eos_token_id=vlms.EOS, **more)


def hy_v4_vl():
    """HY V4 VL: a HunYuanVL-like tower (a newline feature a merged row) before an HY V4 text model with 3-D rope."""
    import transformers as tf

    text = _latent_text(qk_rope_head_dim=8, head_dim=8,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  out_hidden_size=32)
    return tf.HYV4VLForConditionalGeneration(tf.HYV4VLConfig(text_config=text, vision_config=vision,
                                                             image_token_id=vlms.IMAGE, video_token_id=vlms.SOFT))


def glm5_next():
    """GLM5-Next: a GLM-OCR-like tower before a text model of a Kimi-style linear-attention layer and an indexed one."""
    import transformers as tf

    text = _latent_text(linear_head_dim=8, linear_num_heads=4, layer_types=["linear_attention", "indexed_attention"],
                        qk_rope_head_dim=0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32,
                  projection_intermediate_size=64)
    return tf.Glm5NextForConditionalGeneration(tf.Glm5NextConfig(text_config=text, vision_config=vision,
                                                                 image_token_id=vlms.IMAGE, video_token_id=vlms.SOFT))


@pytest.mark.parametrize(("build", "why"), [(hy_v4_vl, "newline feature.*rope index.*HYV4ForCausalLM"),
                                            (glm5_next, "linear-attention layers.*no generation stand-in.*index_kpool")])
def test_unlowered_families_are_refused_naming_why(build, why):
    """HY V4 VL and GLM5-Next are refused by name before any trace, the message saying what is not lowered (and, for
    HY V4 VL, what generates instead), not the generic list of supported classes."""
    model = build().eval()
    with pytest.raises(InputSpecError, match=f"{type(model).__name__}'s images are not supported: .*{why}"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)
