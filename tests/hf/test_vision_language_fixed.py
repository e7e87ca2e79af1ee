"""Vision-language families of fixed-size images (or tiles, or patches) at image-token positions
(hf/steps/fixed_images.py), each tiny with random weights: greedy tokens against transformers' generate, image
features against the model's own get_image_features, the torch-free processor against the model's processor where it
is reproduced; and the refusals of the families that are not, each naming why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError, Torch2JaxError
from torch2jax.generate.generator import left_pad
from torch2jax.hf.verify import check_generation, transformers_greedy, verify_vision_language

from . import vlms

QIANFAN_WRAP = {"start_image_token": "<start_of_image>", "end_image_token": "<end_of_image>",
                "context_image_token": "<image_soft_token>"}


def _text(**extra):
    return dict(vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=vlms.PAD,
                bos_token_id=vlms.BOS, eos_token_id=vlms.EOS, **extra)


def qianfan_ocr():
    """Qianfan-OCR: an InternViT-like tower over 16x16 tiles in 4x4 patches, pixel-shuffled by 0.5 (4 tokens a tile),
    a Qwen3 text model; its image token the context token (<image_soft_token>), its chat template's placeholder
    <image>. (model, processor): GotOcr2's crops of up to 6 tiles and a thumbnail."""
    import transformers as tf

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=4)
    config = tf.QianfanOCRConfig(vision_config=vision, text_config=dict(model_type="qwen3", **_text()),
                                 image_token_id=vlms.SOFT, image_seq_length=4)
    model = tf.QianfanOCRForConditionalGeneration(config).eval()
    images = tf.GotOcr2ImageProcessorPil(size={"height": 16, "width": 16}, crop_to_patches=True, min_patches=1,
                                         max_patches=6)
    processor = tf.QianfanOCRProcessor(image_processor=images, tokenizer=vlms.tokenizer(QIANFAN_WRAP), image_seq_length=4,
                                       chat_template=vlms.chat_template("<image>"))
    return model, processor


def inkling():
    """Inkling: 4x4 patches over two frames (a patch one token) through a 2-layer patch MLP, a one-layer hybrid
    sliding-window text model with a short convolution and a mixture of experts; its audio tower unused."""
    import transformers as tf

    text = _text(swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=16, sliding_window_size=8, d_rel=4,
                 rel_extent=16, moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1)
    text["num_hidden_layers"] = 1  # one hybrid sliding-window layer: its attention, short convolution and experts
    config = tf.InklingConfig(text_config=text, vision_config=dict(text_hidden_size=32, patch_size=4,
                                                                  temporal_patch_size=2, num_hidden_layers=2),
                              audio_config=dict(text_hidden_size=32), image_token_id=vlms.IMAGE, audio_token_id=vlms.SOFT,
                              image_bos_token_id=vlms.BOI, audio_bos_token_id=vlms.EOI)
    return tf.InklingForConditionalGeneration(config).eval()


def test_qianfan_ocr_greedy_features_and_processor_equal_transformers(tmp_path):
    """Qianfan-OCR: greedy tokens for two prompts (one left-padded) equal transformers' generate; the encoder's features
    equal get_image_features on 7 tiles; processor_inputs equals QianfanOCRProcessor (its placeholder <image> replaced
    by the start token, 4 image tokens a tile, the end token) on three images, and generate on them equals
    transformers'."""
    import transformers

    torch.manual_seed(0)
    model, processor = qianfan_ocr()
    model.save_pretrained(tmp_path / "qianfan")
    processor.save_pretrained(tmp_path / "qianfan")
    g = torch2jax.convert_hf(str(tmp_path / "qianfan"), task="image-text-to-text", max_cache_len=48, max_batch=2)
    model = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path / "qianfan", local_files_only=True).eval()
    assert (g.vision.tokens_per_image, g.vision.image_placeholder) == (4, "<image>")
    check_generation(verify_vision_language(model, g, tokens=6))
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w8 w9"}]}],
                                         add_generation_prompt=True, tokenize=False)
    tiles = []
    for image in vlms.images():
        want = processor(images=[image], text=[text], return_tensors="np")
        ids, pixels = g.processor_inputs("w8 w9", image)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(pixels, want["pixel_values"])
        tiles.append(len(pixels))
    assert tiles == [7, 3, 1]
    ids, pixels = g.processor_inputs("w8 w9", vlms.images()[0])  # 7 tiles
    with torch.no_grad():
        features = model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output
    np.testing.assert_allclose(np.asarray(g.encode_images(pixels)), features.numpy(), rtol=1e-5, atol=1e-6)
    # the mask given: the word-level tokenizer writes "user:" as the pad id, which generate would mask out unasked
    theirs = transformers_greedy(model, ids, 4, vlms.PAD, np.ones_like(ids), pixel_values=torch.from_numpy(pixels))
    ours = g.generate(ids, attention_mask=np.ones_like(ids), pixel_values=pixels, max_new_tokens=4, eos_token_id=[])
    np.testing.assert_array_equal(ours, theirs)


def test_inkling_greedy_equals_transformers_with_several_patches():
    """Inkling: each patch one image token, so a prompt's image is several patches; greedy tokens for two prompts (3
    and 5 patches, one left-padded) equal transformers' generate, the encoder's features its get_image_features;
    audio inputs are refused, and its processor by name."""
    torch.manual_seed(0)
    model = inkling()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=24, max_batch=2)
    assert (g.vision.tokens_per_image, g.vision.pixel_shape) == (1, (2, 4, 4, 3))
    rng = np.random.default_rng(0)
    prompts = [[vlms.BOS, vlms.BOI] + [vlms.IMAGE] * 3 + [9, 10, 11], [vlms.BOS, vlms.BOI] + [vlms.IMAGE] * 5 + [12]]
    ids, mask = left_pad(prompts, vlms.PAD)
    pixels = rng.standard_normal((8, 2, 4, 4, 3)).astype(np.float32)
    with torch.no_grad():
        features = model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output
    np.testing.assert_allclose(np.asarray(g.encode_images(pixels)), features.numpy(), rtol=1e-5, atol=1e-6)
    theirs = transformers_greedy(model, ids, 6, vlms.PAD, mask, pixel_values=torch.from_numpy(pixels))
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=6, eos_token_id=[])
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(InputSpecError, match="audio_input_ids: .* audio .*are not supported"):
        g.generate(ids, attention_mask=mask, pixel_values=pixels, audio_input_ids=np.zeros((1, 2, 80), np.int64))
    assert "InklingImageProcessor" in g.vision.processor_unsupported
    with pytest.raises(Torch2JaxError, match="InklingImageProcessor"):
        g.processor_inputs("w8", vlms.images()[0])


def deepseek_vl_hybrid():
    """DeepSeek-VL hybrid: a SigLIP tower on 16x16 images in 4x4 patches (16 tokens) and a SAM tower on the same images
    at 32x32, joined by the aligner, before a Llama. Scaled up where the init's small weights would hide a wrong input:
    high_res_vision_alpha (0 at init: the SAM tower's global-attention branch unused), the high-res projection (its
    features of ~0.002 barely change a feature), the aligner and the text attention (images barely swayed a token)."""
    import transformers as tf

    low = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=4)
    high = tf.SamVisionConfig(hidden_size=32, output_channels=8, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                              patch_size=4, window_size=4, global_attn_indexes=[1], mlp_dim=64)
    config = tf.DeepseekVLHybridConfig(vision_config=low.to_dict(), high_res_vision_config=high.to_dict(),
                                       text_config=tf.LlamaConfig(**_text()).to_dict(), image_token_id=vlms.IMAGE)
    model = tf.DeepseekVLHybridForConditionalGeneration(config).eval()
    with torch.no_grad():
        inner = model.model
        inner.high_res_vision_alpha.fill_(0.5)
        inner.high_res_vision_proj.conv2.weight.mul_(300)
        for linear, scale in ((inner.aligner.vision_proj, 5), (inner.aligner.high_res_vision_proj, 5),
                              (inner.aligner.proj, 10)):
            linear.weight.mul_(scale)
        for layer in inner.language_model.layers:
            for linear, scale in ((layer.self_attn.q_proj, 4), (layer.self_attn.k_proj, 4), (layer.self_attn.v_proj, 10),
                                  (layer.self_attn.o_proj, 10)):
                linear.weight.mul_(scale)
    return model


def test_deepseek_vl_hybrid_greedy_and_features_equal_transformers():
    """DeepSeek-VL hybrid: encode_image takes each image at both resolutions, and its features equal
    get_image_features (which the high-res pixels change); greedy tokens for two prompts (one left-padded) equal
    transformers' generate, the check's too; pixel_values without high_res_pixel_values are refused, saying so."""
    torch.manual_seed(0)
    model = deepseek_vl_hybrid()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=32, max_batch=2)
    assert (g.vision.tokens_per_image, g.vision.pixel_shape) == (16, (3, 16, 16))
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    high, other = (rng.standard_normal((2, 3, 32, 32)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        want, moved = (model.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(h)).pooler_output.numpy()
                       for h in (high, other))
    assert np.abs(want - moved).max() > 0.1  # the high-res tower matters
    np.testing.assert_allclose(np.asarray(g.encode_images(pixels, high)), want, rtol=1e-5, atol=1e-5)
    check_generation(verify_vision_language(model, g, tokens=6))
    ids, mask = left_pad([[vlms.BOS] + [vlms.IMAGE] * 16 + [9, 10, 11], [vlms.BOS, 12] + [vlms.IMAGE] * 16], vlms.PAD)
    with pytest.raises(InputSpecError, match="give high_res_pixel_values with pixel_values"):
        g.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=2)
    assert "DeepseekVLHybridImageProcessor" in g.vision.processor_unsupported


def step3p7():
    """Step3p7: a 2-D rotary tower over 32x32 global views in 4x4 patches, two stride-2 convolutions (4 tokens an image),
    projected to a Step3p7 text model (one sliding-window layer of two)."""
    import transformers as tf

    text = _text(moe_intermediate_size=16, n_routed_experts=2, num_local_experts=2, num_experts_per_tok=1,
                 share_expert_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=4, mlp_ratio=2.0)
    config = tf.Step3p7Config(vision_config=vision, text_config=text, image_token_id=vlms.IMAGE)
    return tf.Step3p7ForConditionalGeneration(config).eval()


def check_global_views(model, cache: int, layout: tuple, atol: float, **local) -> object:
    """The checks a global-views family (Step3p7, Unlimited-OCR) shares: (tokens per image, pixel shape) as `layout`,
    the encoder's features equal get_image_features, greedy tokens transformers' generate for the check's prompts;
    num_local_patches of zeros (with `local`, the other local-patch inputs it leaves unread) gives what no local
    patches give, and local patches are refused. Returns the generator."""
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=cache, max_batch=2)
    tokens, shape = layout
    assert (g.vision.tokens_per_image, g.vision.pixel_shape) == layout
    pixels = np.random.default_rng(0).standard_normal((2, *shape)).astype(np.float32)
    with torch.no_grad():
        want = torch.stack(model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output).numpy()
    np.testing.assert_allclose(np.asarray(g.encode_images(pixels)), want, rtol=1e-5, atol=atol)
    check_generation(verify_vision_language(model, g, tokens=6))
    ids = np.asarray([[vlms.BOS] + [vlms.IMAGE] * tokens + [9, 10]])
    alone = g.generate(ids, pixel_values=pixels[:1], max_new_tokens=3, eos_token_id=[])
    np.testing.assert_array_equal(g.generate(ids, pixel_values=pixels[:1], num_local_patches=[0], max_new_tokens=3,
                                             eos_token_id=[], **local), alone)
    with pytest.raises(InputSpecError, match="pixel_values_local: local image patches .* not supported"):
        g.generate(ids, pixel_values=pixels[:1], pixel_values_local=pixels, num_local_patches=[2], max_new_tokens=2)
    return g


@pytest.mark.slow  # ~22 s on 2 cores: a fixed-size tower through ImageEncoder as the others here (make test-slow)
def test_step3p7_global_views_greedy_equal_transformers():
    """Step3p7's images as global views (no local patches): the encoder's features equal get_image_features, greedy
    tokens for the check's two prompts (one left-padded) transformers' generate; num_local_patches of zeros is taken,
    local patches are refused, saying so, and so is its processor, by name."""
    torch.manual_seed(0)
    g = check_global_views(step3p7(), 24, (4, (3, 32, 32)), atol=1e-6)
    assert "Step3p7Processor crops a large image" in g.vision.processor_unsupported


def test_image_token_outside_the_text_vocabulary_is_refused():
    """Qianfan-OCR (like the others here) embeds its input ids, image tokens included, before replacing them: an
    image_token_id past the text vocabulary fails in transformers too, and conversion refuses the config by name."""
    torch.manual_seed(0)
    model, _ = qianfan_ocr()
    model.config.image_token_id = vlms.VOCAB + 5
    with pytest.raises(InputSpecError, match="QianfanOCRForConditionalGeneration's image_token_id 133 is outside its "
                                             "text vocabulary of 128"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=16, max_batch=1)


def test_git_images_are_refused_by_name():
    """GIT prepends its image features to the prompt itself (no image tokens in the ids, no position embedding for
    them): its image-text-to-text conversion is refused naming why, and pointing at its text-generation conversion."""
    import transformers as tf

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=8)
    config = tf.GitConfig(vision_config=vision, vocab_size=vlms.VOCAB, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64)
    model = tf.GitForCausalLM(config).eval()
    with pytest.raises(InputSpecError, match="GitForCausalLM's images are not supported: it prepends its image features"
                                             ".*--task text-generation"):
        torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=16, max_batch=1)
