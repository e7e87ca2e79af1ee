"""Document and other image-text-to-text families of their own (hf/steps/newline_views.py), each tiny with random
weights: greedy tokens against transformers' generate on the same weights and images, image features against the
model's own get_image_features; and the families refused by name (UNSUPPORTED_IMAGES), each naming why."""

from __future__ import annotations

import re

import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError

from . import vlms
from .test_vision_language_fixed import check_global_views


def unlimited_ocr(sliding_window: int = 32):
    """Unlimited-OCR: a SAM tower over 128x128 global views in 16x16 patches (windows of 2 patches, one global layer,
    two stride-2 convolutions: a 2x2 grid), a CLIP-like encoder, projected; 2 rows of 2 features and a newline each,
    then the view separator (7 tokens an image), before a DeepSeek-like MoE text model of reference sliding-window
    layers. The towers' weights are drawn at std 0.3, so a wrong position, window or newline changes the tokens."""
    import transformers as tf

    sam = dict(hidden_size=16, output_channels=16, num_hidden_layers=2, num_attention_heads=2, image_size=128,
               patch_size=16, window_size=2, global_attn_indexes=[1], mlp_dim=32, downsample_channels=[16, 32])
    encoder = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=128,
                   patch_size=14)
    text = dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=128, n_routed_experts=4, n_shared_experts=1,
                num_experts_per_tok=2, moe_intermediate_size=16, mlp_layer_types=["dense", "sparse"],
                sliding_window=sliding_window, pad_token_id=vlms.PAD, bos_token_id=vlms.BOS, eos_token_id=vlms.EOS)
    config = tf.UnlimitedOcrConfig(vision_config=dict(sam_config=sam, encoder_config=encoder), text_config=text,
                                   image_token_id=vlms.IMAGE)
    model = tf.UnlimitedOcrForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            if not name.startswith("language_model"):
                param.normal_(0.0, 0.3)
    return model


def test_unlimited_ocr_global_views_greedy_equal_transformers():
    """Unlimited-OCR's global views: the encoder's features (newlines and separator included) equal
    get_image_features, greedy tokens (two prompts, one left-padded) transformers' generate; no local patches
    (num_local_patches zeros, their patches_grid unread) is taken, local patches are refused, and so are its processor
    and a cache longer than the reference sliding window. (Save/load is the fixed-size path's, tested in
    test_vision_language.py: here it would add ~6 s.)"""
    torch.manual_seed(0)
    model = unlimited_ocr()
    g = check_global_views(model, 32, (7, (3, 128, 128)), atol=1e-5, patches_grid=[[1, 1]])
    assert "UnlimitedOcrImageProcessor" in g.vision.processor_unsupported
    with pytest.raises(InputSpecError, match="reference sliding-window layers .* --max-cache-len 32 or less"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)


def kosmos2_5():
    """Kosmos-2.5: a Pix2Struct tower over flattened patches, a text model placing features by
    image_embeds_position_mask (the sizes of transformers' own tester)."""
    import transformers as tf

    text = dict(vocab_size=99, embed_dim=32, layers=1, ffn_dim=64, attention_heads=4)
    vision = dict(hidden_size=32, patch_embed_hidden_size=48, intermediate_size=64, head_dim=8, num_hidden_layers=1,
                  num_attention_heads=4)
    config = tf.Kosmos2_5Config(text_config=text, vision_config=vision, latent_query_num=3)
    return tf.Kosmos2_5ForConditionalGeneration(config).eval()


def evolla():
    """Evolla: a SaProt protein encoder and resampler read by cross-attention adapters in a Llama text model."""
    import transformers as tf

    protein = dict(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=4, intermediate_size=11)
    config = tf.EvollaConfig(protein_encoder_config=protein, vocab_size=100, hidden_size=4, intermediate_size=7,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, aligner_ffn_mult=1,
                             aligner_num_add_layers=1, resampler_depth=1, resampler_dim_head=4, resampler_heads=2,
                             resampler_num_latents=7, resampler_ff_mult=1)
    return tf.EvollaForProteinText2Text(config).eval()


def pi0():
    """PI0: a PaliGemma prefix and a Gemma action expert, its output flow-matching velocities over action chunks."""
    import transformers as tf

    gemma = dict(model_type="gemma", vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=8, patch_size=4, projection_dim=16)
    vlm = dict(model_type="paligemma", vision_config=vision, text_config=dict(gemma, num_image_tokens=4),
               image_token_index=127, projection_dim=16)
    config = tf.PI0Config(vlm_config=vlm, dit_config=dict(gemma, is_causal=True), chunk_size=4, max_state_dim=8,
                          max_action_dim=8)
    return tf.PI0ForConditionalGeneration(config).eval()


@pytest.mark.parametrize(("build", "reason"), [
    (kosmos2_5, "Kosmos2_5ForConditionalGeneration's images are not supported: it takes an image as Pix2Struct "
                "flattened_patches"),
    (evolla, "EvollaForProteinText2Text's images are not supported: it reads protein sequences, not images"),
    (pi0, "PI0ForConditionalGeneration's images are not supported: it is a vision-language-action policy, not a text "
          "generator"),
], ids=["kosmos2_5", "evolla", "pi0"])
def test_families_refused_by_name(build, reason):
    """Kosmos-2.5 (features placed by a mask input, Pix2Struct patches), Evolla (protein sequences into cross-attention
    adapters) and PI0 (actions, not tokens) are refused at conversion, each naming why, not with the generic list."""
    torch.manual_seed(0)
    with pytest.raises(InputSpecError, match=re.escape(reason)):
        torch2jax.convert_hf(build(), task="image-text-to-text", max_cache_len=16, max_batch=1)
