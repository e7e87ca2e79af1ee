"""Vision-language models whose text model keeps a recurrent state: Qwen3.5 and Qwen3.5-MoE, Qwen3-VL's vision tower
(a resampled position table, no deepstack) before Qwen3.5's hybrid of gated-delta-net and attention layers. The
multimodal step runs over the recurrent step's cache (hf/steps/vision_language.RecurrentMultimodalStep): each tiny
random-weight model's image features and greedy tokens are compared with transformers', left padding is shown to stay
out of the state, and the artifact round-trips through save + load with each cache tensor's kind."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.image_positions import image_index, rope_index
from torch2jax.hf.verify import check_generation, verify_vision_language

from . import vlms
from .recurrent_checks import widened

# per layer: the gated delta rule's conv and recurrent states, then the attention layer's keys and values
KINDS = ("state", "state", "kv", "kv")
TEXT = dict(vocab_size=vlms.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                             "partial_rotary_factor": 1.0},
            eos_token_id=vlms.EOS, bos_token_id=vlms.BOS, pad_token_id=vlms.PAD, tie_word_embeddings=False)
# 8x8 patches merged 2x2, a learned 4x4 position table resampled to each grid
VISION = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4, patch_size=8,
              spatial_merge_size=2, num_position_embeddings=16)


def tiny_qwen3_5(name: str) -> torch.nn.Module:
    """A Qwen3.5 (or Qwen3.5-MoE: 4 experts, 2 per token, a shared one) vision-language model with random weights drawn
    wider than transformers' init (recurrent_checks.widened), so that its greedy tokens depend on the whole context."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "qwen3_5":
        text = tf.Qwen3_5TextConfig(**TEXT)
        config = tf.Qwen3_5Config(text_config=text.to_dict(), vision_config=tf.Qwen3_5VisionConfig(**VISION).to_dict(),
                                  image_token_id=vlms.IMAGE, vision_start_token_id=vlms.BOI,
                                  vision_end_token_id=vlms.EOI, video_token_id=vlms.SOFT)
        return widened(tf.Qwen3_5ForConditionalGeneration(config))
    text = tf.Qwen3_5MoeTextConfig(**TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=32)
    config = tf.Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=tf.Qwen3_5MoeVisionConfig(**VISION).to_dict(),
                                 image_token_id=vlms.IMAGE, vision_start_token_id=vlms.BOI, vision_end_token_id=vlms.EOI,
                                 video_token_id=vlms.SOFT)
    model = tf.Qwen3_5MoeForConditionalGeneration(config)
    with torch.no_grad():  # the experts' weights are parameters, not Linear modules: drawn wide too
        for layer in model.model.language_model.layers:
            for weight in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                weight.normal_(0, weight.shape[-1] ** -0.5)
    return widened(model)


@pytest.fixture(scope="module", params=["qwen3_5", pytest.param("qwen3_5_moe", marks=pytest.mark.slow)])
def converted(request):
    """(the transformers model, its generator)."""
    model = tiny_qwen3_5(request.param)
    return model, torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)


def prompt(rng: np.random.Generator, before: int, image_tokens: int, after: int) -> list[int]:
    """Words, an image's tokens between its start and end tokens, words."""
    words = lambda n: rng.integers(vlms.FIRST_WORD, vlms.VOCAB, n).tolist()  # noqa: E731
    return words(before) + [vlms.BOI] + [vlms.IMAGE] * image_tokens + [vlms.EOI] + words(after)


def test_features_and_greedy_equal_transformers(converted):
    """The cache is the recurrent step's (the delta rule's states, then the attention layer's keys and values); the
    image features of two grids equal transformers' get_image_features (no deepstack: one merger's features); 8 greedy
    tokens for a left-padded batch of two prompts, an image each, equal transformers' generate."""
    model, g = converted
    assert g.spec.cache_kinds == KINDS
    assert (g.vision.position_table, g.vision.feature_size, g.vision.rotary_3d) == (4, 64, True)
    grids = np.asarray([[1, 6, 10], [1, 8, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids))
    assert getattr(want, "deepstack_features", None) is None
    np.testing.assert_allclose(np.asarray(g.encode_patches(pixels, grids)), torch.cat(list(want.pooler_output)).numpy(),
                               rtol=1e-5, atol=1e-5)
    result = verify_vision_language(model, g, tokens=8)
    check_generation(result)
    assert len({t for _, theirs in result.rows for t in theirs}) > 2  # tokens that vary: a wrong state would show


def prefill(g, ids: np.ndarray, mask: np.ndarray, pixels: np.ndarray, grids: np.ndarray) -> tuple:
    """One prefill of `ids` (their images' patches and grids in order) from an empty cache, as generate runs it: (the
    last logits, the cache) as NumPy arrays."""
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    index = image_index(np.where(mask, ids, -1), g.vision.image_token_id)
    rope, _ = rope_index(ids, mask, grids, g.vision.image_token_id, g.vision.spatial_merge_size)
    write_at = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    logits, cache = g.prefill(g.new_cache(len(ids)), *(jnp.asarray(a) for a in (ids, positions, write_at, mask)),
                              g.encode_patches(pixels, grids), jnp.asarray(index), jnp.asarray(rope - positions[None]))
    return np.asarray(logits), [np.asarray(tensor) for tensor in cache]


def test_left_padding_stays_out_of_the_state(converted):
    """A row left-padded with arbitrary words (not the pad token) beside a longer row ends its prompt with the states
    and logits of the row alone: the padding never enters the recurrent state (generate writes the pad token there,
    which would hide a leak; the prefill step is given the words themselves)."""
    _, g = converted
    rng = np.random.default_rng(2)
    grids = np.asarray([[1, 4, 4], [1, 6, 4]])
    pixels = rng.standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    short, long = prompt(rng, 1, 4, 2), prompt(rng, 5, 6, 4)
    pad = len(long) - len(short)
    ids = np.asarray([rng.integers(vlms.FIRST_WORD, vlms.VOCAB, pad).tolist() + short, long])
    mask = np.ones(ids.shape, bool)
    mask[0, :pad] = False
    logits, cache = prefill(g, ids, mask, pixels, grids)
    alone_logits, alone_cache = prefill(g, np.asarray([short]), np.ones((1, len(short)), bool), pixels[:16], grids[:1])
    np.testing.assert_allclose(logits[0], alone_logits[0], atol=1e-4)
    states = [(padded, alone) for kind, padded, alone in zip(g.spec.cache_kinds, cache, alone_cache) if kind == "state"]
    assert len(states) == 2
    for padded, alone in states:
        np.testing.assert_allclose(padded[0], alone[0], atol=1e-4)


def test_save_and_load_keep_the_cache_kinds(converted, tmp_path):
    """The saved manifest marks each cache tensor's kind; the loaded artifact's greedy tokens equal transformers'."""
    model, g = converted
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    cache = json.loads((tmp_path / "out" / "manifest.json").read_text())["generation"]["cache"]
    assert cache["kinds"] == list(KINDS)
    assert (loaded.spec.cache_kinds, loaded.spec.cache_dtypes) == (KINDS, g.spec.cache_dtypes)
    check_generation(verify_vision_language(model, loaded, tokens=8))


def test_a_recurrent_text_model_refuses_image_tokens_that_attend_ahead():
    """Bidirectional image blocks (Gemma 3) or a prefix-LM over a recurrent text model: refused, naming why."""
    from torch2jax.hf.steps.vision_language import LanguageCache

    with pytest.raises(InputSpecError, match="keeps a recurrent state"):
        LanguageCache(layout=None, keeps_state=True).step(torch.nn.Module(), image_blocks=4)


@pytest.mark.slow(reason="the server's batch over a recurrent VLM, ~1 min on 2 cores; the generator's own checks above")
def test_served_requests_equal_generate_alone():
    """The server's batch engine (serve/engine.py) over the recurrent VLM: requests with images of different grids and
    a text-only one, prompts cut across prefill chunks, each get the tokens generate gives them alone (each row keeps
    its own state; no prefix cache)."""
    from torch2jax.serve.engine import BatchEngine
    from torch2jax.serve.scheduler import Request, Scheduler

    from ..serve.test_scheduler import run as run_scheduler

    g = torch2jax.convert_hf(tiny_qwen3_5("qwen3_5"), task="image-text-to-text", max_cache_len=64, max_batch=4)
    engine = BatchEngine(g, 4, chunk=16)
    assert engine.prefix is None
    rng = np.random.default_rng(3)
    load = []
    for grid in ([1, 4, 4], [1, 6, 4], None, [1, 4, 8], [1, 4, 4]):
        words = rng.integers(vlms.FIRST_WORD, vlms.VOCAB, int(rng.integers(2, 20))).tolist()
        if grid is None:
            load.append((Request(words, 6, lambda e: None, end_tokens=()), {}))
            continue
        grids = np.asarray([grid])
        tokens = int(np.prod(grid)) // 4
        pixels = rng.standard_normal((int(np.prod(grid)), *g.vision.pixel_shape)).astype(np.float32)
        request = Request(words[:1] + [vlms.BOI] + [vlms.IMAGE] * tokens + [vlms.EOI] + words[1:], 6, lambda e: None,
                          end_tokens=(), image_features=g.image_features(tokens, pixels, image_grid_thw=grids),
                          image_grids=grids)
        load.append((request, dict(pixel_values=pixels, image_grid_thw=grids)))
    run_scheduler(Scheduler(engine, max_queue=8), {0: [r for r, _ in load[:3]], 2: [r for r, _ in load[3:]]})
    for request, images in load:
        alone = g.generate(np.asarray([request.prompt]), max_new_tokens=6, eos_token_id=[], **images)
        assert request.tokens == alone[0, len(request.prompt):].tolist()
