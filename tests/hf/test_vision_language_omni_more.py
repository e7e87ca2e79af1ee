"""More omni-named image-text-to-text families: Cosmos3-Omni (the Cosmos3 reasoner, Qwen3-VL's classes under its own
name) generates through the Qwen3-VL path, its greedy tokens equal to transformers' generate on a left-padded batch of
two images of different grids, before and after save/load; Nemotron-H Omni (a RADIO tower before a whole Nemotron-H
causal LM) is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.hf.verify import transformers_greedy

VOCAB, PAD, IMAGE, VIDEO, VSTART, VEND, FIRST_WORD = 128, 0, 3, 4, 5, 6, 10
NEW = 16


def cosmos3_omni():
    """A tiny Cosmos3-Omni, random weights (seeded): 8x8 patches merged 2x2, a learned 4x4 position table resampled to
    each grid, deepstack features from both vision blocks (index 5, past the tower's two blocks, makes none in
    transformers, as in the sweep's shrunk default config), 3-D interleaved rotary in a two-layer text model. The tower's
    weights are drawn with std 0.3 so that a wrong patch position, window or mask changes the tokens."""
    import transformers as tf

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=512, pad_token_id=PAD,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                                 "rope_theta": 10000.0})
    vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=4, patch_size=8,
                  spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 1, 5])
    config = tf.Cosmos3OmniConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                                  vision_start_token_id=VSTART, vision_end_token_id=VEND)
    model = tf.Cosmos3OmniForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, weight in model.model.visual.named_parameters():
            if weight.dim() > 1 or "pos_embed" in name:
                weight.normal_(0.0, 0.3)
    return model


def prompts(grids: np.ndarray, lengths: tuple) -> list[list[int]]:
    """Random text around each grid's image tokens (vision start, grid_h * grid_w / 4 image tokens, vision end)."""
    rng = np.random.default_rng(0)
    rows = []
    for grid, length in zip(grids, lengths):
        words = rng.integers(FIRST_WORD, VOCAB, length).tolist()
        rows.append(words[:1] + [VSTART] + [IMAGE] * (int(np.prod(grid)) // 4) + [VEND] + words[1:])
    return rows


def test_cosmos3_omni_greedy_equals_transformers_before_and_after_save(tmp_path):
    """Cosmos3-Omni: two images of different grids (6x10 and 8x4 patches) in a left-padded batch of different prompt
    lengths give transformers' greedy tokens (its tower's resampled position table, deepstack features, 3-D positions
    continuing in decode), and the artifact saved and loaded gives them again."""
    model = cosmos3_omni()
    g = torch2jax.convert_hf(model, max_cache_len=64, max_batch=2)
    assert g.vision.position_table == 4
    grids = np.asarray([[1, 6, 10], [1, 8, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    ids, mask = left_pad(prompts(grids, (6, 2)), PAD)
    want = transformers_greedy(model, ids, NEW, PAD, mask, pixel_values=torch.from_numpy(pixels),
                               image_grid_thw=torch.from_numpy(grids),
                               mm_token_type_ids=torch.from_numpy((ids == IMAGE).astype(np.int32)))
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=NEW,
                      eos_token_id=[])
    np.testing.assert_array_equal(ours, want)
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    again = loaded.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=NEW,
                            eos_token_id=[])
    np.testing.assert_array_equal(again, want)


def test_nemotron_h_omni_images_refused_by_name():
    """Nemotron-H Omni's RADIO tower (class and register tokens per image, a position table resized per image) before a
    whole Nemotron-H causal LM is not converted: the refusal names the model, why, and the text model's own path."""
    import transformers as tf

    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, patch_size=16, image_size=32,
                  max_img_size=64, video_temporal_patch_size=2)
    text = dict(vocab_size=VOCAB, hidden_size=32, layers_block_type=["mamba", "attention"], num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=64, mamba_num_heads=4, mamba_head_dim=8,
                ssm_state_size=8, n_groups=1, chunk_size=8)
    config = tf.NemotronH_Omni_Reasoning_V3_Config(vision_config=vision, text_config=text, vision_hidden_size=32,
                                                   projector_hidden_size=32, image_token_id=IMAGE)
    model = tf.NemotronH_Omni_Reasoning_V3(config).eval()
    for task in ("image-text-to-text", None):  # None: the task its class implies (an image-text-to-text class)
        with pytest.raises(InputSpecError, match="NemotronH_Omni_Reasoning_V3's images are not supported: its RADIO"):
            torch2jax.convert_hf(model, task=task, max_cache_len=32, max_batch=1)
