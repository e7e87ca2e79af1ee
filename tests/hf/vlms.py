"""Tiny random-weight vision-language models of real transformers architectures, written with save_pretrained
together with their processor (image processor, a word-level tokenizer with the image token, a chat template)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

VOCAB, PAD, BOS, EOS = 128, 0, 1, 2
IMAGE, BOI, EOI, SOFT = 3, 4, 5, 6  # LLaVA's <image>; Gemma 3's <start_of_image>, <end_of_image>, <image_soft_token>
FIRST_WORD = 7  # w7 ... w127 are plain words


def chat_template(image: str) -> str:
    """One user turn: the image (written as `image`), then the text; the generation prompt after it."""
    return ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
            "{% if c['type'] == 'image' %}" + image + " {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


ARCHITECTURES = ("llava", "gemma3", "paligemma")


def tokenizer(special: dict | None = None):
    """A word-level tokenizer over the 128 ids: <pad> <s> </s>, the image tokens (special), w7 ... w127; `special`
    names them as a processor looks them up (default: LLaVA's and Gemma 3's names)."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<image>": IMAGE, "<start_of_image>": BOI, "<end_of_image>": EOI,
             "<image_soft_token>": SOFT, **{f"w{i}": i for i in range(FIRST_WORD, VOCAB)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()
    special = special or {"image_token": "<image>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                          "soft_token": "<image_soft_token>"}
    return tf.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                      extra_special_tokens=special, padding_side="left")


def build(name: str):
    """(model, processor) of this architecture, random weights (seeded)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, eos_token_id=EOS, bos_token_id=BOS, pad_token_id=PAD)
    if name == "llava":  # CLIP vision tower, 32x32 images in 8x8 patches: 16 image tokens (CLS dropped)
        vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     image_size=32, patch_size=8, projection_dim=32)
        config = tf.LlavaConfig(vision_config=vision, text_config=tf.LlamaConfig(**text), image_token_id=IMAGE,
                                vision_feature_layer=-2, vision_feature_select_strategy="default")
        model = tf.LlavaForConditionalGeneration(config)
        images = tf.LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = tf.LlavaProcessor(image_processor=images, tokenizer=tokenizer(), patch_size=8,
                                      vision_feature_select_strategy="default", chat_template=chat_template("<image>"),
                                      num_additional_image_tokens=1)
        return model.eval(), processor
    if name == "llava_next":  # LLaVA's tower on 32x32 tiles (16 tokens each), grids of up to 2x2 tiles, a newline per row
        vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     image_size=32, patch_size=8, projection_dim=32)
        grids = [[32, 64], [64, 32], [64, 64]]
        config = tf.LlavaNextConfig(vision_config=vision, text_config=tf.LlamaConfig(**text), image_token_id=IMAGE,
                                    image_grid_pinpoints=grids, vision_feature_layer=-2,
                                    vision_feature_select_strategy="default")
        model = tf.LlavaNextForConditionalGeneration(config)
        images = tf.LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                               image_grid_pinpoints=grids)
        processor = tf.LlavaNextProcessor(image_processor=images, tokenizer=tokenizer(), patch_size=8,
                                          vision_feature_select_strategy="default", chat_template=chat_template("<image>"),
                                          num_additional_image_tokens=1)
        return model.eval(), processor
    if name == "llava_onevision":  # a SigLIP tower (no CLS: 16 tokens a tile), grids of up to 2x2 tiles, shrunk over 1 tile
        vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       image_size=32, patch_size=8)
        grids = [[32, 32], [32, 64], [64, 32], [64, 64]]
        config = tf.LlavaOnevisionConfig(vision_config=vision, text_config=tf.Qwen2Config(**text), image_token_id=IMAGE,
                                         video_token_id=SOFT, image_grid_pinpoints=grids, vision_feature_layer=-1,
                                         vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_1")
        images = tf.LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=grids)
        return tf.LlavaOnevisionForConditionalGeneration(config).eval(), OneVisionParts(images, tokenizer(), chat_template("<image>"))
    if name == "gemma3":  # SigLIP tower, 32x32 images in 8x8 patches pooled to 4 image tokens; sliding-window layers
        vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       image_size=32, patch_size=8)
        language = tf.Gemma3TextConfig(**text, head_dim=16, sliding_window=12)
        config = tf.Gemma3Config(vision_config=vision, text_config=language, mm_tokens_per_image=4, image_token_index=SOFT,
                                 boi_token_index=BOI, eoi_token_index=EOI)
        model = tf.Gemma3ForConditionalGeneration(config)
        words = tokenizer()
        words.image_token = "<image_soft_token>"
        processor = tf.Gemma3Processor(image_processor=tf.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
                                       tokenizer=words, chat_template=chat_template("<start_of_image>"), image_seq_length=4)
        return model.eval(), processor
    if name == "paligemma":  # SigLIP tower, 16 image tokens; the prompt attends both ways, positions from 1
        vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       image_size=32, patch_size=8)
        config = tf.PaliGemmaConfig(vision_config=vision, text_config=tf.GemmaConfig(**text, head_dim=16),
                                    image_token_index=IMAGE, projection_dim=64, hidden_size=64)
        model = tf.PaliGemmaForConditionalGeneration(config)
        images = tf.SiglipImageProcessorPil(size={"height": 32, "width": 32})
        images.image_seq_length = 16
        return model.eval(), tf.PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer())
    if name == "internvl":  # an InternViT tower on 32x32 tiles of 8x8 patches, pixel-shuffled by 2: 4 tokens a tile
        vision = tf.InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         image_size=[32, 32], patch_size=[8, 8])
        config = tf.InternVLConfig(vision_config=vision.to_dict(), text_config=tf.Qwen2Config(**text).to_dict(),
                                   image_token_id=IMAGE, downsample_ratio=0.5)
        images = tf.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1, max_patches=6)
        words = tokenizer({"start_image_token": "<start_of_image>", "end_image_token": "<end_of_image>",
                           "context_image_token": "<image>", "video_token": "<image_soft_token>"})
        return tf.InternVLForConditionalGeneration(config).eval(), InternVLParts(images, words, chat_template("<image>"))
    if name in QWEN:  # variable resolution: 8x8 patches merged 2x2, an image takes (h/16)*(w/16) tokens; 3-D rope
        text_class, vision_class, config_class, model_class, vision = QWEN[name]
        rope = ({"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}}
                if name.startswith("qwen3") else {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}})
        experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16) if name.endswith("moe") else {}
        text_config = getattr(tf, text_class)(**text, **rope, **experts)
        config = getattr(tf, config_class)(text_config=text_config.to_dict(), vision_config=getattr(tf, vision_class)(**vision).to_dict(),
                                           image_token_id=IMAGE, vision_start_token_id=BOI, vision_end_token_id=EOI,
                                           video_token_id=SOFT)
        images = tf.Qwen2VLImageProcessorPil(size={"shortest_edge": 16 * 16 * 4, "longest_edge": 16 * 16 * 24}, patch_size=8,
                                             merge_size=2)
        # Qwen2VLProcessor itself needs torchvision (its video processor): its parts, expanded as it does (qwen2_vl_inputs)
        parts = QwenParts(images, tokenizer(), chat_template("<start_of_image><image><end_of_image>"))
        return getattr(tf, model_class)(config).eval(), parts
    if name in GLM:  # Qwen2-VL's layout (8x8 patches merged 2x2, 3-D rope) with GLM-4V's tower, rope index and processor
        text_class, vision_class, config_class, model_class, extra = GLM[name]
        vision = getattr(tf, vision_class)(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4,
                                           patch_size=8, spatial_merge_size=2, image_size=32)
        text_config = getattr(tf, text_class)(**text, **extra)
        config = getattr(tf, config_class)(text_config=text_config.to_dict(), vision_config=vision.to_dict(),
                                           image_token_id=IMAGE, image_start_token_id=BOI, image_end_token_id=EOI,
                                           video_token_id=SOFT)
        # its area bounds count two frames: 4 to 24 merged tokens, as Qwen2-VL's above
        images = tf.Glm4vImageProcessorPil(size={"shortest_edge": 2 * 16 * 16 * 4, "longest_edge": 2 * 16 * 16 * 24},
                                           patch_size=8, merge_size=2)
        parts = QwenParts(images, tokenizer(), chat_template("<start_of_image><image><end_of_image>"))
        model = getattr(tf, model_class)(config).eval()
        with torch.no_grad():  # scaled up where the init's small weights would hide a wrong image or position: the
            # merger's MLP (features of ~0.004 barely sway a token), the text queries and keys (flat attention ignores
            # the 3-D positions)
            merger = model.model.visual.merger
            for proj in (merger.gate_proj, merger.up_proj, merger.down_proj):
                proj.weight.mul_(10)
            for layer in model.model.language_model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.weight.mul_(8)
        return model, parts
    if name in PIXTRAL:  # a Pixtral tower on each image at its own size, 8x8 patches merged 2x2: (h/16)*(w/16) tokens
        model = PIXTRAL[name](tf, text)
        with torch.no_grad():  # scaled up where the init's small weights would hide a wrong image: the projector's
            # matrices (features of ~0.01 barely sway a token), the text attention (images barely swayed a token)
            inner = model.model
            projector = getattr(inner, "multi_modal_projector", None) or inner.vision_projection
            for linear in (projector.patch_merger.merging_layer, projector.linear_1, projector.linear_2):
                linear.weight.mul_(10)
            for layer in inner.language_model.layers:
                for linear, scale in ((layer.self_attn.q_proj, 4), (layer.self_attn.k_proj, 4),
                                      (layer.self_attn.v_proj, 10), (layer.self_attn.o_proj, 10)):
                    linear.weight.mul_(scale)
        # Mistral3's image processor keeps Pixtral's patch size of its own (PixtralProcessor passes it patch * merge)
        images = tf.PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size=8 if name == "mistral3" else 16)
        return model.eval(), PixtralParts(name, images, tokenizer())
    if name in FIXED_SIZE:  # LLaVA-shaped: one fixed-size image, a fixed number of image tokens, scattered at the image token
        return FIXED_SIZE[name](tf, text), FIXED_SIZE_PROCESSORS.get(name, lambda tf: None)(tf)
    raise KeyError(name)


def _clip(tf):
    return tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               image_size=32, patch_size=8, projection_dim=32)


def _siglip(tf):
    return tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=32, patch_size=8)


# name -> (transformers, text config's sizes) -> the model; each 32x32 image (GOT-OCR2: 64x64) a fixed number of tokens
FIXED_SIZE = {
    # CLIP tower, two layers' features (CLS dropped) joined and layer-normed by the projector: 16 tokens
    "vipllava": lambda tf, text: tf.VipLlavaForConditionalGeneration(tf.VipLlavaConfig(
        vision_config=_clip(tf), text_config=tf.LlamaConfig(**text), image_token_index=IMAGE,
        vision_feature_layer=[-2, -1])),
    # SigLIP tower pixel-shuffled by 2 (4 tokens) before a Cohere2 text model (sliding-window and global layers)
    "aya_vision": lambda tf, text: tf.AyaVisionForConditionalGeneration(tf.AyaVisionConfig(
        vision_config=_siglip(tf), text_config=tf.Cohere2Config(**text, sliding_window=8), image_token_index=IMAGE,
        downsample_factor=2)),
    "cohere2_vision": lambda tf, text: tf.Cohere2VisionForConditionalGeneration(tf.Cohere2VisionConfig(
        vision_config=_siglip(tf).to_dict(), text_config=tf.Cohere2Config(**text, sliding_window=8).to_dict(),
        image_token_id=IMAGE, downsample_factor=2, alignment_intermediate_size=32)),
    # a SAM-style tower (windowed and global blocks, relative positions) and strided convolutions: 64x64 -> 64 tokens
    "got_ocr2": lambda tf, text: tf.GotOcr2ForConditionalGeneration(tf.GotOcr2Config(
        vision_config=tf.GotOcr2VisionConfig(hidden_size=32, output_channels=64, num_hidden_layers=2, num_attention_heads=4,
                                             image_size=64, patch_size=2, window_size=14, global_attn_indexes=[1],
                                             mlp_dim=64).to_dict(),
        text_config=tf.Qwen2Config(**text).to_dict(), image_token_index=IMAGE)),
    # LLaVA's tower and projector, images only (its video tower path refused at generate): 16 tokens
    "video_llava": lambda tf, text: tf.VideoLlavaForConditionalGeneration(tf.VideoLlavaConfig(
        vision_config=_clip(tf), text_config=tf.LlamaConfig(**text), image_token_index=IMAGE, video_token_index=SOFT,
        vision_feature_layer=-2, vision_feature_select_strategy="default")),
    # a SigLIP tower's last hidden states through an MLP aligner: 16 tokens
    "deepseek_vl": lambda tf, text: tf.DeepseekVLForConditionalGeneration(tf.DeepseekVLConfig(
        vision_config=_siglip(tf).to_dict(), text_config=tf.LlamaConfig(**text).to_dict(), image_token_id=IMAGE)),
    # Janus' understanding path (its own SigLIP-like tower and aligner: 16 tokens); its VQ image generator unused
    "janus": lambda tf, text: tf.JanusForConditionalGeneration(tf.JanusConfig(
        vision_config=tf.JanusVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                                           patch_size=8, projection_dim=64, num_image_tokens=16).to_dict(),
        text_config=tf.LlamaConfig(**text).to_dict(), image_token_id=IMAGE,
        vq_config=dict(embed_dim=12, num_embeddings=12, latent_channels=12, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, num_patches=4, projection_dim=10, num_hidden_layers=1,
                       image_token_embed_dim=64))),
    # BLIP-2: 8 learned queries read the tower's patches through a Q-Former, projected to an OPT language model, which is
    # a whole causal LM of its own (language_model) the step calls: 8 tokens
    "blip_2": lambda tf, text: tf.Blip2ForConditionalGeneration(tf.Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                           patch_size=8),
        qformer_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            encoder_hidden_size=32, vocab_size=VOCAB),
        text_config=tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                 max_position_embeddings=512, word_embed_proj_dim=64, eos_token_id=EOS,
                                 bos_token_id=BOS, pad_token_id=PAD).to_dict(),
        num_query_tokens=8, image_token_id=IMAGE)),
}


def _idefics_vision(tf, kind: str):
    return getattr(tf, f"{kind}VisionConfig")(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, image_size=32, patch_size=8)


def _idefics(tf, text, kind: str):
    """Idefics3 / SmolVLM: a SigLIP-like tower (16 patches), pixel-shuffled by 2 into 4 tokens, before a Llama."""
    config = getattr(tf, f"{kind}Config")(vision_config=_idefics_vision(tf, kind).to_dict(),
                                          text_config=tf.LlamaConfig(**text).to_dict(), image_token_id=IMAGE, scale_factor=2)
    return getattr(tf, f"{kind}ForConditionalGeneration")(config)


def _idefics2(tf, text):
    """A perceiver resampler (4 latents) over the tower's 16 patches, before a Mistral; its latents random (the init's
    equal ones make 4 equal tokens) and its attention's values scaled up (other images barely swayed a token)."""
    import torch

    perceiver = tf.Idefics2PerceiverConfig(hidden_size=64, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=4,
                                           resampler_head_dim=16, num_key_value_heads=2)
    model = tf.Idefics2ForConditionalGeneration(tf.Idefics2Config(
        vision_config=_idefics_vision(tf, "Idefics2").to_dict(), perceiver_config=perceiver.to_dict(),
        text_config=tf.MistralConfig(**text).to_dict(), image_token_id=IMAGE))
    with torch.no_grad():
        resampler = model.model.connector.perceiver_resampler
        resampler.latents.normal_()
        for layer in resampler.layers:
            layer.self_attn.v_proj.weight.mul_(10)
            layer.self_attn.o_proj.weight.mul_(10)
    return model


# Idefics2/3, SmolVLM: pixel_values [prompts, images, C, H, W] padded with all-zero images; their processors (tiles
# with row / column markers, fake image-boundary tokens) are not reproduced
IMAGE_BATCHES = {"idefics3": lambda tf, text: _idefics(tf, text, "Idefics3"),
                 "smolvlm": lambda tf, text: _idefics(tf, text, "SmolVLM"), "idefics2": _idefics2}
FIXED_SIZE.update(IMAGE_BATCHES)
# the processors torch2jax reproduces for these: LLaVA's (CLIP image processor), DeepSeek-VL's and Janus' (the longest
# side resized, padded to a square of the mean color; Janus writes its image tokens between begin and end tokens)
FIXED_SIZE_PROCESSORS = {
    "vipllava": lambda tf: tf.LlavaProcessor(
        image_processor=tf.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tokenizer(), patch_size=8, vision_feature_select_strategy="default",
        chat_template=chat_template("<image>"), num_additional_image_tokens=1),
    "deepseek_vl": lambda tf: tf.DeepseekVLProcessor(
        image_processor=tf.DeepseekVLImageProcessorPil(size={"height": 32, "width": 32}), tokenizer=tokenizer(),
        chat_template=chat_template("<image>"), num_image_tokens=16),
    "janus": lambda tf: tf.JanusProcessor(
        image_processor=tf.JanusImageProcessorPil(size={"height": 32, "width": 32}), tokenizer=tokenizer(),
        chat_template=chat_template("<image>"), num_image_tokens=16),
}


def _pixtral(tf):
    return tf.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  head_dim=8, image_size=64, patch_size=8)


# name -> (transformers, text config's sizes) -> the model: a Pixtral tower (images at their own size, up to 64x64
# nominal) whose 8x8 patches a projector merges 2x2 (Mistral3: before a Mistral; LightOnOCR: before a Qwen3); their
# processors (image break and end tokens, Pixtral's own resize) are not reproduced
PIXTRAL = {
    "mistral3": lambda tf, text: tf.Mistral3ForConditionalGeneration(tf.Mistral3Config(
        vision_config=_pixtral(tf).to_dict(), text_config=tf.MistralConfig(**text).to_dict(), image_token_index=IMAGE,
        spatial_merge_size=2)),
    "lighton_ocr": lambda tf, text: tf.LightOnOcrForConditionalGeneration(tf.LightOnOcrConfig(
        vision_config=_pixtral(tf).to_dict(), text_config=tf.Qwen3Config(**text, head_dim=16).to_dict(),
        image_token_id=IMAGE, spatial_merge_size=2)),
}


# (text config, vision config, config, model class, vision config's sizes) of the Qwen2-VL family
QWEN = {
    "qwen2_vl": ("Qwen2VLTextConfig", "Qwen2VLVisionConfig", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                 dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, patch_size=8, spatial_merge_size=2)),
    # RMSNorm / SwiGLU vision blocks, the first attending within windows of 2x2 merged tokens (window_size 32 = 2 merged
    # tokens of 2 patches of 8 pixels), the second over the whole image
    "qwen2_5_vl": ("Qwen2_5_VLTextConfig", "Qwen2_5_VLVisionConfig", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                   dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4, patch_size=8,
                        spatial_merge_size=2, window_size=32, fullatt_block_indexes=[1])),
    # a learned 4x4 position table resampled to each grid; deepstack features from both vision blocks, added to the
    # image positions after the first two text layers
    "qwen3_vl": ("Qwen3VLTextConfig", "Qwen3VLVisionConfig", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                 dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4, patch_size=8,
                      spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 1])),
    # Qwen3-VL's vision tower before a mixture-of-experts text model (4 experts, 2 per token)
    "qwen3_vl_moe": ("Qwen3VLMoeTextConfig", "Qwen3VLMoeVisionConfig", "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
                     dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4, patch_size=8,
                          spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 1])),
}


# (text config, vision config, config, model class, text config's extras) of the GLM-4V family: a 4x4 position table
# resampled bicubically to each grid, 3-D rope over the text model's interleaved rotary dims
_GLM_ROPE = {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}}
GLM = {
    "glm4v": ("Glm4vTextConfig", "Glm4vVisionConfig", "Glm4vConfig", "Glm4vForConditionalGeneration", _GLM_ROPE),
    # a mixture-of-experts text model (4 routed experts, 2 per token, a shared one; the first layer dense), rotary over
    # half of each head
    "glm4v_moe": ("Glm4vMoeTextConfig", "Glm4vMoeVisionConfig", "Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration",
                  {"rope_parameters": {"rope_type": "default", "mrope_section": [1, 2, 1], "partial_rotary_factor": 0.5},
                   "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1,
                   "first_k_dense_replace": 1}),
    "glm46v": ("Glm4vTextConfig", "Glm4vVisionConfig", "Glm46VConfig", "Glm46VForConditionalGeneration", _GLM_ROPE),
    # no position table nor post-convolution norm; query and key norms in its vision attention
    "glm_ocr": ("GlmOcrTextConfig", "GlmOcrVisionConfig", "GlmOcrConfig", "GlmOcrForConditionalGeneration", _GLM_ROPE),
}


class QwenParts:
    """Qwen2VLProcessor's parts (image processor, tokenizer, chat template), saved as the processor saves them."""

    def __init__(self, image_processor, tokenizer, chat_template: str):
        self.image_processor, self.tokenizer, self.chat_template = image_processor, tokenizer, chat_template

    def save_pretrained(self, out: Path) -> None:
        self.image_processor.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        (Path(out) / "chat_template.jinja").write_text(self.chat_template)

    def __call__(self, images: list, text: str) -> dict:
        """As Qwen2VLProcessor: the image processor's patches and grids, each image's token expanded to
        grid_t*grid_h*grid_w / merge^2 tokens, tokenized."""
        inputs = self.image_processor(images, return_tensors="np")
        merge = self.image_processor.merge_size
        parts = text.split("<image>")
        assert len(parts) == len(images) + 1
        expanded = parts[0] + "".join("<image>" * (int(np.prod(grid)) // merge**2) + part
                                      for grid, part in zip(inputs["image_grid_thw"], parts[1:]))
        ids = np.asarray([self.tokenizer(expanded)["input_ids"]], np.int64)
        return {"input_ids": ids, "pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}


class InternVLParts(QwenParts):
    """InternVLProcessor's parts (it needs torchvision for its video processor), expanded as it expands an image:
    its start token, the image token 4 times per tile, its end token (transformers' replace_image_token)."""

    def __call__(self, images: list, text: str) -> dict:
        import transformers as tf

        inputs = self.image_processor(images, return_tensors="np")
        names = SimpleNamespace(start_image_token="<start_of_image>", end_image_token="<end_of_image>", image_token="<image>",
                                image_seq_length=4)
        parts = text.split("<image>")
        assert len(parts) == len(images) + 1
        expanded = parts[0] + "".join(tf.InternVLProcessor.replace_image_token(names, inputs, i) + part
                                      for i, part in enumerate(parts[1:]))
        ids = np.asarray([self.tokenizer(expanded)["input_ids"]], np.int64)
        return {"input_ids": ids, "pixel_values": inputs["pixel_values"]}


class OneVisionParts(QwenParts):
    """LlavaOnevisionProcessor's parts (it needs torchvision for its video processor), expanded as it expands an image
    (transformers' replace_image_token: 16 tokens a tile, the grid's map shrunk over anyres_max_1, a newline a row;
    an image among several in a prompt its whole view and a newline). The images are one prompt's, nested as
    apply_chat_template passes a conversation's images (a flat list would make each image a prompt of its own)."""

    def __call__(self, images: list, text: str) -> dict:
        import functools

        import transformers as tf

        inputs = self.image_processor([images], return_tensors="np")  # one prompt's images, as apply_chat_template nests them
        names = SimpleNamespace(image_token="<image>", num_image_tokens=16, vision_feature_select_strategy="full",
                                vision_aspect_ratio="anyres_max_1", image_processor=self.image_processor)
        for method in ("_get_number_of_features", "_get_unpadded_features"):
            setattr(names, method, functools.partial(getattr(tf.LlavaOnevisionProcessor, method), names))
        parts = text.split("<image>")
        assert len(parts) == len(images) + 1
        expanded = parts[0] + "".join(tf.LlavaOnevisionProcessor.replace_image_token(names, inputs, i) + part
                                      for i, part in enumerate(parts[1:]))
        ids = np.asarray([self.tokenizer(expanded)["input_ids"]], np.int64)
        return {"input_ids": ids, **{key: inputs[key] for key in ("pixel_values", "image_sizes", "batch_num_images")}}


class PixtralParts(QwenParts):
    """PixtralProcessor's (Mistral3) or LightOnOcrProcessor's parts: their image processor, and an image's expansion
    as they write it (their modules import torchvision, so it is written out here): (h/16)*(w/16) image tokens for an
    image of h x w pixels; Pixtral's a row of w/16 at a time, each row followed by an image break token (here
    <start_of_image>), the last row's by an image end token (here <end_of_image>) instead."""

    def __init__(self, name: str, image_processor, tokenizer):
        super().__init__(image_processor, tokenizer, chat_template("<image>"))
        self.name = name

    def save_pretrained(self, out: Path) -> None:
        """The parts, and processor_config.json as the processor's to_dict writes it."""
        import json

        super().save_pretrained(out)
        config = {"image_processor": self.image_processor.to_dict(), "patch_size": 8, "spatial_merge_size": 2,
                  "processor_class": "LightOnOcrProcessor"}
        if self.name == "mistral3":
            config.update(processor_class="PixtralProcessor", image_token="<image>", image_break_token="<start_of_image>",
                          image_end_token="<end_of_image>")
        (Path(out) / "processor_config.json").write_text(json.dumps(config, indent=2))

    def expansion(self, size) -> str:
        rows, columns = int(size[0]) // 16, int(size[1]) // 16
        if self.name != "mistral3":
            return "<image>" * (rows * columns)
        return "<start_of_image>".join(["<image>" * columns] * rows) + "<end_of_image>"

    def __call__(self, images: list, text: str) -> dict:
        given = {"patch_size": 16} if self.name == "mistral3" else {}  # PixtralProcessor's: patch * merge
        inputs = self.image_processor(images, **given, return_tensors="np")
        parts = text.split("<image>")
        assert len(parts) == len(images) + 1
        expanded = parts[0] + "".join(self.expansion(size) + part for size, part in zip(inputs["image_sizes"], parts[1:]))
        ids = np.asarray([self.tokenizer(expanded)["input_ids"]], np.int64)
        return {"input_ids": ids, "pixel_values": inputs["pixel_values"], "image_sizes": inputs["image_sizes"]}


def write(name: str, directory: Path) -> Path:
    """save_pretrained the model and its processor into directory/name."""
    model, processor = build(name)
    out = directory / name
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def images() -> list:
    """Three PIL images of different sizes and aspect ratios (a wide RGB, a tall RGBA, a small grayscale)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    wide = Image.fromarray(rng.integers(0, 256, (40, 70, 3), dtype=np.uint8))
    tall = Image.fromarray(rng.integers(0, 256, (90, 50, 4), dtype=np.uint8), mode="RGBA")
    small = Image.fromarray(rng.integers(0, 256, (20, 24), dtype=np.uint8), mode="L")
    return [wide, tall, small]
