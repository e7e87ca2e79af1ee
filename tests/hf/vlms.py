"""Tiny random-weight vision-language models of real transformers architectures, written with save_pretrained
together with their processor (image processor, a word-level tokenizer with the image token, a chat template)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB, PAD, BOS, EOS, IMAGE = 128, 0, 1, 2, 3
# one user turn: the image, then the text; the generation prompt after it
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
ARCHITECTURES = ("llava",)


def tokenizer():
    """A word-level tokenizer over the 128 ids: <pad> <s> </s> <image> w4 ... w127, the image token special."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<image>": IMAGE, **{f"w{i}": i for i in range(4, VOCAB)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()
    return tf.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                      extra_special_tokens={"image_token": "<image>"}, padding_side="left")


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
                                      vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                                      num_additional_image_tokens=1)
        return model.eval(), processor
    raise KeyError(name)


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
