"""Vision-language families whose image reaches the text model as tokens of its own kind: Ovis2 (a probabilistic visual
vocabulary, with visual indicator tokens that take visual embedding rows), Chameleon (a VQ-VAE's discrete image
tokens, embedded by the text model) and Emu3 (the same, each image at its own size, rows of codes ended by a row-end
token). Each a tiny random-weight model whose greedy tokens for a left-padded batch equal transformers' generate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.hf.verify import transformers_greedy

VOCAB, PAD, IMAGE = 64, 0, 3
INDICATORS = (4, 5)  # Ovis2's visual indicator tokens (the image's start and end, as its processor writes them)


def ovis2():
    import transformers as tf

    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=4, hidden_stride=2, vocab_size=40, num_visual_indicator_tokens=len(INDICATORS))
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, pad_token_id=PAD)
    config = tf.Ovis2Config(vision_config=vision, text_config=text, image_token_id=IMAGE,
                            visual_indicator_token_ids=list(INDICATORS), vocab_size=VOCAB, hidden_size=32)
    return tf.Ovis2ForConditionalGeneration(config).eval()


def chameleon(resolution: int = 8):
    import transformers as tf

    vocabulary = {"<pad>": PAD, "<s>": 1, "</s>": 2, "<image>": IMAGE}
    vocabulary.update({f"IMGIMG{chr(ord('A') + k)}Z": 10 + k for k in range(6)})  # VQ codes 0..5 are ids 10..15
    vocabulary.update({f"w{k}": k for k in range(16, VOCAB)})
    vq = dict(embed_dim=4, num_embeddings=6, latent_channels=4, resolution=resolution, in_channels=3, base_channels=32,
              channel_multiplier=[1, 2], num_res_blocks=1)
    config = tf.ChameleonConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                num_attention_heads=2, num_key_value_heads=1, vq_config=vq, vocabulary_map=vocabulary,
                                pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    return tf.ChameleonForConditionalGeneration(config).eval()


def emu3():
    import transformers as tf

    vocabulary = {"<pad>": PAD, "<s>": 1, "</s>": 2, "<image>": IMAGE, "<|extra_200|>": 4}
    vocabulary.update({f"<|visual token{k:06d}|>": 10 + k for k in range(8)})  # VQ codes 0..7 are ids 10..17
    vocabulary.update({f"w{k}": k for k in range(18, VOCAB)})
    vq = dict(codebook_size=8, embed_dim=4, latent_channels=4, in_channels=3, out_channels=3, temporal_downsample_factor=1,
              base_channels=32, channel_multiplier=[1, 2, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
              num_attention_heads=1)
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    config = tf.Emu3Config(vq_config=vq, text_config=text, vocabulary_map=vocabulary)
    return tf.Emu3ForConditionalGeneration(config).eval()


def prompts(per_image: int | list[int], wrap: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Two prompts, the second shorter (left-padded), each of words around one image's tokens (between `wrap`)."""
    rng = np.random.default_rng(0)
    rows = []
    for row, length in enumerate((5, 2)):
        words = rng.integers(18, VOCAB, length).tolist()
        image = [*wrap[:1], *[IMAGE] * (per_image[row] if isinstance(per_image, list) else per_image), *wrap[1:]]
        rows.append(words[:1] + image + words[1:])
    return left_pad(rows, PAD)


@pytest.mark.parametrize("family", ["ovis2", "chameleon"])
def test_image_token_families_greedy_equal_transformers(family):
    """Ovis2: the image's visual-vocabulary features at its image tokens, its indicator tokens' visual embedding rows;
    Chameleon: its VQ-VAE's codes as the text model's embedding rows (and its image tokens never generated). Eight
    greedy tokens equal transformers' (the generation sweep checks them after save + load too)."""
    torch.manual_seed(0)
    model = ovis2() if family == "ovis2" else chameleon()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=40, max_batch=2)
    per_image = g.vision.tokens_per_image
    assert per_image == (4 if family == "ovis2" else 16)
    ids, mask = prompts(per_image, INDICATORS if family == "ovis2" else ())
    pixels = np.random.default_rng(1).standard_normal((2, *g.vision.pixel_shape)).astype(np.float32)
    theirs = transformers_greedy(model, ids, 8, PAD, mask, pixel_values=torch.from_numpy(pixels))
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=8, do_sample=False, eos_token_id=[])
    np.testing.assert_array_equal(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:])


def test_chameleon_image_tokens_beyond_the_cache_are_refused():
    """A VQ-VAE whose image makes more tokens than the cache holds is refused before an image is encoded."""
    with pytest.raises(InputSpecError, match="makes 256 image tokens .* --max-cache-len 320"):
        torch2jax.convert_hf(chameleon(resolution=32), task="image-text-to-text", max_cache_len=40, max_batch=2)


def test_emu3_images_at_their_own_size_greedy_equal_transformers():
    """Emu3: two images of their own sizes padded into one batch (image_sizes); each image's VQ codes cropped from the
    padded batch's and ended row by row with <|extra_200|>, as transformers' get_image_features lays them out. Eight
    greedy tokens equal transformers'."""
    torch.manual_seed(0)
    model = emu3()
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=48, max_batch=2)
    assert (g.vision.patch_size, g.vision.row_end_token) == (4, 4)
    sizes = np.asarray([[16, 20], [12, 16]], np.int64)
    counts = [g.vision.native_tokens(size) for size in sizes]
    assert counts == [4 * 6, 3 * 5]
    ids, mask = prompts(counts)
    pixels = np.random.default_rng(1).standard_normal((2, 3, 16, 20)).astype(np.float32)
    pixels[1, :, 12:], pixels[1, :, :, 16:] = 0, 0  # the processor's padding
    theirs = transformers_greedy(model, ids, 8, PAD, mask, pixel_values=torch.from_numpy(pixels),
                                 image_sizes=torch.from_numpy(sizes))
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes, max_new_tokens=8, do_sample=False,
                      eos_token_id=[])
    np.testing.assert_array_equal(ours[:, ids.shape[1]:], theirs[:, ids.shape[1]:])
