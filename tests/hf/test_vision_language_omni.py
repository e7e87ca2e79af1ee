"""The Omni thinkers' text + image path (Qwen2.5-Omni's and Qwen3-Omni-MoE's thinker, hf/steps/omni.py): their rope
index in NumPy against transformers' own get_rope_index on the processor's layout and others, greedy tokens equal to
transformers' generate for a left-padded batch with images (and the sweep's check), the artifact without the audio
encoder's weights, and audio and video refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.generate.omni_positions import omni_rope_index
from torch2jax.hf.steps.omni import omni_tokens
from torch2jax.hf.verify import check_generation, transformers_greedy, verify_vision_language

VOCAB, PAD = 128, 0
IMAGE, VIDEO, AUDIO, AUDIO_START, AUDIO_END, VSTART, VEND = 3, 4, 5, 6, 7, 8, 9
FIRST_WORD = 10
MERGE = 2
NEW = 16
VARIANTS = ("qwen2_5_omni", "qwen3_omni")


def build(variant: str, **overrides):
    """A tiny thinker, random weights (seeded): 8x8 patches merged 2x2, a two-layer text model with 3-D rotary
    positions, a one-layer audio encoder. Qwen2.5-Omni: windowed vision attention (windows of 2x2 merged tokens) in
    the first block, full in the second; Qwen3-Omni: a 4x4 position table, deepstack features from both vision blocks,
    4 experts (2 a token)."""
    import transformers as tf

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, pad_token_id=PAD)
    audio = dict(num_mel_bins=20, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16, d_model=16,
                 output_dim=32, n_window=8)
    tokens = dict(audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END, vision_start_token_id=VSTART,
                  vision_end_token_id=VEND)
    tokens.update(overrides)
    if variant == "qwen2_5_omni":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=8, spatial_merge_size=MERGE,
                      window_size=32, fullatt_block_indexes=[1], out_hidden_size=32)
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
        config = tf.Qwen2_5OmniThinkerConfig(text_config=text, vision_config=vision, audio_config=audio,
                                             image_token_index=IMAGE, video_token_index=VIDEO, audio_token_index=AUDIO,
                                             **tokens)
        return tf.Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=8, spatial_merge_size=MERGE,
                  num_position_embeddings=16, deepstack_visual_indexes=[0, 1], out_hidden_size=32)
    text.update(rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "interleaved": True,
                                 "rope_theta": 10000.0}, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                head_dim=8)
    config = tf.Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=vision, audio_config=audio, image_token_id=IMAGE,
                                          video_token_id=VIDEO, audio_token_id=AUDIO, position_id_per_seconds=13,
                                          **tokens)
    return tf.Qwen3OmniMoeThinkerForConditionalGeneration(config).eval()


def words(rng, n: int) -> list[int]:
    return rng.integers(FIRST_WORD, VOCAB, n).tolist()


def image(grid, start: bool = True) -> list[int]:
    """An image as the processor writes it (vision start, its merged tokens, vision end), or its tokens alone."""
    tokens = [IMAGE] * (int(np.prod(grid)) // (MERGE * MERGE))
    return [VSTART, *tokens, VEND] if start else tokens


def layouts() -> dict[str, tuple[list[list[int]], np.ndarray | None]]:
    """Batches (rows, grids): the processor's layout; image tokens with no vision start before them (the sweep's
    check); one image with its start and one without, in both orders; a vision start before text; an image's tokens
    at the start of a row; text alone (a one-token row beside longer ones)."""
    rng = np.random.default_rng(0)
    g = [[1, 4, 6], [1, 6, 4], [1, 2, 8], [1, 4, 4]]
    return {
        "processor": ([words(rng, 2) + image(g[0]) + words(rng, 3) + image(g[1]) + words(rng, 1), words(rng, 4),
                       words(rng, 1) + image(g[2]) + words(rng, 5)], np.asarray(g[:3])),
        "no_start": ([words(rng, 1) + image(g[3], False) + words(rng, 4), words(rng, 1) + image(g[3], False) + words(rng, 1)],
                     np.asarray([g[3], g[3]])),
        "started_then_bare": ([words(rng, 1) + image(g[0]) + words(rng, 1) + image(g[3], False) + words(rng, 2)],
                              np.asarray([g[0], g[3]])),
        "bare_then_started": ([words(rng, 1) + image(g[3], False) + words(rng, 1) + image(g[0]) + words(rng, 2)],
                              np.asarray([g[3], g[0]])),
        "start_before_text": ([words(rng, 1) + [VSTART] + words(rng, 2) + image(g[3]) + words(rng, 1)], np.asarray([g[3]])),
        "image_first": ([image(g[3], False) + words(rng, 1) + image(g[0]) + words(rng, 1)], np.asarray([g[3], g[0]])),
        "text_only": ([words(rng, 1), words(rng, 3)], None),
    }


# the layouts on which transformers' own get_rope_index fails, per variant (a vision start not followed by an image
# token; an image's tokens first in the row, with no token before them)
FAILING = {"qwen2_5_omni": {"image_first"}, "qwen3_omni": {"start_before_text"}}


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_index_equals_the_thinkers_get_rope_index(variant):
    """omni_rope_index (NumPy) against the thinker's own get_rope_index, positions and deltas, on every layout; where
    transformers' fails, ours refuses."""
    model = build(variant)
    omni = omni_tokens(model)
    failed = set()
    for name, (rows, grids) in layouts().items():
        ids, mask = left_pad(rows, PAD)
        try:
            want, want_deltas = model.get_rope_index(torch.from_numpy(ids), None if grids is None else torch.from_numpy(grids),
                                                     None, torch.from_numpy(mask).long())
        except (RuntimeError, ValueError, IndexError):
            failed.add(name)
            with pytest.raises(InputSpecError, match="rope index"):
                omni_rope_index(ids, mask, grids, IMAGE, MERGE, omni)
            continue
        ours, deltas = omni_rope_index(ids, mask, grids, IMAGE, MERGE, omni)
        np.testing.assert_array_equal(ours, want.numpy().astype(np.int64), err_msg=name)
        np.testing.assert_array_equal(deltas, want_deltas.numpy().reshape(-1).astype(np.int64), err_msg=name)
    assert failed == FAILING[variant]


def test_a_thinker_config_without_its_vision_start_token_is_refused():
    """transformers' rope index reads vision_start_token_id, which the thinker configs do not declare: refused before
    any trace, naming it."""
    with pytest.raises(InputSpecError, match="has no vision_start_token_id"):
        torch2jax.convert_hf(build("qwen2_5_omni", vision_start_token_id=None), task="image-text-to-text",
                             max_cache_len=64, max_batch=2)


# Qwen3-Omni's conversion in the slow tier: Qwen3-VL's tower and deepstack path before a mixture-of-experts text model
# (tests/hf/test_vision_language.py's Qwen3-VL-MoE), its own rope index checked above (~45 s on 2 cores)
@pytest.fixture(scope="module", params=["qwen2_5_omni", pytest.param("qwen3_omni", marks=pytest.mark.slow(
    reason="Qwen3-VL-MoE's tower and step, converted again: about 45 s of CPU"))])
def thinker(request, tmp_path_factory):
    """(variant, the transformers model, the artifact saved and loaded)."""
    model = build(request.param)
    generator = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=64, max_batch=2)
    return request.param, model, torch2jax.load(torch2jax.save(generator, tmp_path_factory.mktemp("omni") / "out"))


def test_greedy_equals_transformers_for_a_left_padded_batch_with_images(thinker):
    """Two prompts of different lengths, left-padded, an image each as the processor writes it (grids 4x6 and 6x4
    patches): 16 greedy tokens equal transformers' generate; so do the sweep's check's, whose image tokens have no
    vision start (text positions in transformers' index); the artifact holds no audio encoder weights."""
    variant, model, g = thinker
    assert not [name for name in g.params if "audio_tower" in name] and hasattr(model.model, "audio_tower")
    assert g.vision.omni.variant == variant
    rng = np.random.default_rng(1)
    grids = np.asarray([[1, 4, 6], [1, 6, 4]])
    ids, mask = left_pad([words(rng, 1) + image(grid) + words(rng, n) for grid, n in zip(grids, (5, 1))], PAD)
    pixels = rng.standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=NEW,
                      eos_token_id=[])
    theirs = transformers_greedy(model, ids, NEW, PAD, mask, pixel_values=torch.from_numpy(pixels),
                                 image_grid_thw=torch.from_numpy(grids))
    np.testing.assert_array_equal(ours, theirs)
    # the sweep's check (image tokens after a random word, no vision start); seed 2: its random words hold no audio,
    # video or vision-start token (seed 0's hold the audio start token, refused, as transformers' index fails on it)
    check_generation(verify_vision_language(model, g, tokens=NEW, seed=2))


def test_audio_and_video_are_refused(thinker):
    """Audio features, video inputs and prompts holding audio or video tokens are refused, naming what."""
    _, _, g = thinker
    ids = np.asarray([[11, 12, 13]])
    with pytest.raises(InputSpecError, match=r"audio and video inputs are not supported \(feature_attention_mask, "
                                             r"input_features\)"):
        g.generate(ids, input_features=np.zeros((1, 20, 30), np.float32),
                   feature_attention_mask=np.ones((1, 30), np.int64), max_new_tokens=2)
    with pytest.raises(InputSpecError, match="video inputs are not supported"):
        g.generate(ids, pixel_values_videos=np.zeros((4, g.vision.pixel_shape[0]), np.float32), max_new_tokens=2)
    with pytest.raises(InputSpecError, match=r"audio and video inputs are not supported \(video_grid_thw\)"):
        g.generate(ids, video_grid_thw=np.asarray([[2, 4, 4]]), max_new_tokens=2)
    for token, what in ((AUDIO_START, "audio start"), (AUDIO, "audio"), (VIDEO, "video")):
        with pytest.raises(InputSpecError, match=f"holds the {what} token .*audio and video are not supported"):
            g.generate(np.asarray([[11, token, 12]]), max_new_tokens=2)
