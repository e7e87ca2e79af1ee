"""Vision-language families that reuse an existing path over their own text model: Aria (fixed-size images through its
projector's learned queries, a mixture-of-experts text model), Llama 4 (fixed-size tiles through a pixel-shuffled tower,
a chunked-attention MoE text model) and Mistral Large 4 (Mistral3's Pixtral tower and projector, a sparse-attention MLA
text model), each tiny with random weights, its greedy tokens compared with transformers' generate; Llama 4's refusal of
a cache longer than an attention chunk; and Gemma 4's refusals (no vision tower: a text model; a vision tower: named)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.hf.verify import check_generation, verify_vision_language

from . import vlms


def aria():
    """Aria: an Idefics3 tower over 16x16 images in 8x8 patches, its projector's 4 queries a 4-patch image."""
    import transformers as tf

    vision = dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, image_size=16, patch_size=8)
    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, head_dim=16, moe_num_experts=3, moe_topk=2, moe_num_shared_experts=1,
                moe_intermediate_size=8, max_position_embeddings=128, pad_token_id=vlms.PAD, bos_token_id=vlms.BOS,
                eos_token_id=vlms.EOS)
    config = tf.AriaConfig(vision_config=vision, text_config=text, projector_patch_to_query_dict={4: 4},
                           max_value_projector_patch_to_query_dict=4, image_token_id=vlms.IMAGE)
    return tf.AriaForConditionalGeneration(config)


def llama4():
    """Llama 4: 28x28 tiles in 14x14 patches, pixel-shuffled by 0.5 into one token a tile; MoE on every other layer;
    chunks of attention longer than the cache (see test_llama4_cache_longer_than_a_chunk_is_refused)."""
    import transformers as tf

    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, image_size=28,
                  patch_size=14, pixel_shuffle_ratio=0.5, projector_input_dim=32, projector_output_dim=32,
                  vision_output_dim=32)
    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=64, max_position_embeddings=128,
                pad_token_id=vlms.PAD, bos_token_id=vlms.BOS, eos_token_id=vlms.EOS)
    config = tf.Llama4Config(vision_config=vision, text_config=text, image_token_index=vlms.IMAGE,
                             boi_token_index=vlms.BOI, eoi_token_index=vlms.EOI)
    return tf.Llama4ForConditionalGeneration(config)


def mistral_large4():
    """Mistral Large 4: a Pixtral tower in 4x4 patches merged 2x2, sparse (indexed) MLA attention, one MoE layer."""
    import transformers as tf

    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                  image_size=16, patch_size=4, head_dim=8)
    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
                n_routed_experts=2, num_experts_per_tok=1, kv_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8,
                qk_nope_head_dim=4, index_topk=4, index_head_dim=8, index_n_heads=2, first_k_dense_replace=1,
                mlp_layer_types=["dense", "sparse"], max_position_embeddings=128, pad_token_id=vlms.PAD,
                bos_token_id=vlms.BOS, eos_token_id=vlms.EOS)
    config = tf.MistralLarge4Config(vision_config=vision, text_config=text, image_token_index=vlms.IMAGE,
                                    spatial_merge_size=2)
    return tf.MistralLarge4ForConditionalGeneration(config)


FAMILIES = {"aria": aria, "llama4": llama4, "mistral_large4": mistral_large4}


# Mistral Large 4 in the slow tier: Mistral3's Pixtral path (tests/hf/test_vision_language.py) before a sparse-attention
# MLA text model (tests/hf/test_sparse_attention_generation.py), ~20 s on 2 cores
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "mistral_large4" else n for n in FAMILIES])
def test_greedy_equals_transformers(name, tmp_path):
    """6 greedy tokens for a left-padded batch with an image each equal transformers' generate (Aria's also from its
    saved artifact loaded: the sweep checks every family's after load)."""
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)
    check_generation(verify_vision_language(model, g, tokens=6))
    if name == "llama4":  # its processor writes tile separators and image markers around the image tokens
        assert "Llama4Processor" in g.vision.processor_unsupported
    if name == "aria":
        loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
        check_generation(verify_vision_language(model, loaded, tokens=6))
        aria_pixel_mask(model, loaded)


def aria_pixel_mask(model, g):
    """Aria's processor marks each image's real pixels in pixel_mask: one that marks every pixel real changes nothing
    in transformers and is taken; one that marks padding (which moves the tower's patch positions) is refused."""
    pixels = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ids = np.asarray([[vlms.BOS] + [vlms.IMAGE] * g.vision.tokens_per_image + [vlms.FIRST_WORD, vlms.FIRST_WORD + 1]])
    real = np.ones((1, 16, 16), bool)
    with torch.no_grad():
        theirs = model.generate(torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                                pixel_mask=torch.from_numpy(real), max_new_tokens=4, do_sample=False,
                                pad_token_id=vlms.PAD, eos_token_id=None)
    ours = g.generate(ids, pixel_values=pixels, pixel_mask=real, max_new_tokens=4, eos_token_id=[])
    np.testing.assert_array_equal(ours, theirs.numpy())
    padded = real.copy()
    padded[:, 12:] = False
    with pytest.raises(InputSpecError, match="pixel_mask marks padding"):
        g.generate(ids, pixel_values=pixels, pixel_mask=padded, max_new_tokens=2)


def test_llama4_cache_longer_than_a_chunk_is_refused():
    """Llama 4's chunked-attention layers attend within chunks, the step across its whole cache: a cache longer than a
    chunk is refused, naming the longest that is not."""
    torch.manual_seed(0)
    model = llama4().eval()
    model.config.text_config.attention_chunk_size = 16
    with pytest.raises(InputSpecError, match="pass --max-cache-len 16 or less"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)
    import transformers

    text = transformers.Llama4ForCausalLM(model.config.text_config).eval()  # the text model alone: refused the same way
    with pytest.raises(InputSpecError, match="Llama4ForCausalLM's chunked-attention layers .* --max-cache-len 16 or less"):
        torch2jax.convert_hf(text, task="text-generation", max_cache_len=40, max_batch=2)


def test_gemma4_refusals_name_why():
    """Gemma 4 built without a vision tower is a text model (the refusal names --task text-generation); with one, its
    patch sequences and vision-only bidirectional attention are refused by name."""
    import transformers as tf

    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, hidden_size_per_layer_input=0, vocab_size_per_layer_input=vlms.VOCAB,
                layer_types=["full_attention"], pad_token_id=vlms.PAD)
    bare = tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(text_config=text, vision_config=None, audio_config=None))
    with pytest.raises(InputSpecError, match="without a vision tower .* convert it with --task text-generation"):
        torch2jax.convert_hf(bare, task="image-text-to-text", max_cache_len=16, max_batch=1)
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, head_dim=8)
    seeing = tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(text_config=text, vision_config=vision, audio_config=None))
    with pytest.raises(InputSpecError, match="Gemma4ForConditionalGeneration's images are not supported: .*image_position_ids"):
        torch2jax.convert_hf(seeing, task="image-text-to-text", max_cache_len=16, max_batch=1)
