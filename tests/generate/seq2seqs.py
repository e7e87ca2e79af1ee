"""Tiny random-weight encoder-decoders of real transformers architectures, written with save_pretrained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

VOCAB, PAD, EOS, START = 128, 0, 2, 1  # the decoder starts from START (as BART's starts from its own token)


def build_seq2seq(name: str):
    import transformers as tf

    special = dict(vocab_size=VOCAB, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=START, bos_token_id=START)
    if name == "t5":  # relative position bias, a gated-GELU feed-forward as in T5 v1.1
        return tf.T5ForConditionalGeneration(tf.T5Config(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                                         feed_forward_proj="gated-gelu", tie_word_embeddings=False, **special))
    if name == "bart":  # learned positions offset by 2, final_logits_bias, forced_eos_token_id as BART checkpoints set it
        return tf.BartForConditionalGeneration(tf.BartConfig(
            encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128, forced_eos_token_id=EOS, **special))
    if name == "whisper":  # 16 mel bins x 40 frames -> 20 encoder positions; no suppressed tokens in this config
        return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=MEL, max_source_positions=FRAMES // 2, max_target_positions=64,
            begin_suppress_tokens=None, suppress_tokens=None, **special))
    if name == "longt5":  # local attention over blocks: the encoder pads the source to a block multiple (fixed source)
        return tf.LongT5ForConditionalGeneration(tf.LongT5Config(
            num_layers=1, num_decoder_layers=1, d_model=32, d_kv=8, num_heads=4, d_ff=64, local_radius=3,
            encoder_attention_type="local", tie_word_embeddings=False, **special))
    if name == "switch":  # mixture-of-experts T5: its forward hands use_cache to an encoder that refuses it
        return tf.SwitchTransformersForConditionalGeneration(tf.SwitchTransformersConfig(
            num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_experts=4,
            expert_capacity=64, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, **special))
    if name == "nllb_moe":  # reads the encoder's output by name (last_hidden_state)
        return tf.NllbMoeForConditionalGeneration(tf.NllbMoeConfig(
            encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4, expert_capacity=64, encoder_sparse_step=2,
            decoder_sparse_step=2, max_position_embeddings=64, **special))
    if name == "bert2bert":  # EncoderDecoderModel: BERT's decoder slices its position table at the cache's length
        def bert(**extra):
            return tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=64, pad_token_id=PAD, **extra)

        config = tf.EncoderDecoderConfig.from_encoder_decoder_configs(
            bert(), bert(is_decoder=True, add_cross_attention=True), decoder_start_token_id=START, pad_token_id=PAD,
            eos_token_id=EOS)
        return tf.EncoderDecoderModel(config)
    raise KeyError(name)


IMAGE_SIZE, CHANNELS = 32, 3  # the image encoder-decoder's pixels (ViT patches of 8: 16 patches and the CLS token)


def build_image_seq2seq():
    """VisionEncoderDecoderModel as TrOCR builds it: a ViT encoder and a TrOCR decoder (learned positions counted from
    the cache), the encoder wider than the decoder so that the model projects its output (enc_to_dec_proj); its LM head
    untied, as a tied one over random weights mostly repeats the last token."""
    import transformers as tf

    encoder = tf.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=IMAGE_SIZE, patch_size=8, num_channels=CHANNELS)
    decoder = tf.TrOCRConfig(vocab_size=VOCAB, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
                             max_position_embeddings=64, pad_token_id=PAD, bos_token_id=START, eos_token_id=EOS,
                             decoder_start_token_id=START, tie_word_embeddings=False)
    config = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder, decoder_start_token_id=START,
                                                                        pad_token_id=PAD, eos_token_id=EOS)
    return tf.VisionEncoderDecoderModel(config)


ARCHITECTURES = ("t5", "bart")
MEL, FRAMES = 16, 40


def write_seq2seq(name: str, directory: Path, weight_scale: float | None = None) -> Path:
    """save_pretrained a random-weight model of this architecture (seeded) into directory/name. `weight_scale`: every
    weight drawn from N(0, scale) instead, where each token must depend on the source and the tokens before it (the
    models' own small init mostly maps the last token to the next)."""
    torch.manual_seed(0)
    model = build_seq2seq(name).eval()
    if name == "bart":  # a nonzero bias, so that a converter dropping it would show
        model.final_logits_bias.normal_(0, 0.5)
    if name == "whisper" and weight_scale is None:  # Whisper's small init repeats one token, which would prove little
        weight_scale = 0.3
    if weight_scale is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0, weight_scale)
    out = directory / name
    model.save_pretrained(out)
    return out


def load_seq2seq(path: Path, dtype: torch.dtype = torch.float32):
    """The same model through transformers, as the reference."""
    import transformers

    auto = transformers.AutoModelForSpeechSeq2Seq if path.name == "whisper" else transformers.AutoModelForSeq2SeqLM
    return auto.from_pretrained(path, local_files_only=True, dtype=dtype).eval()


def hf_generate(lm, ids: np.ndarray, new: int, mask: np.ndarray | None = None, eos: int | None = None) -> np.ndarray:
    """transformers' own greedy generate; eos=None generates exactly `new` tokens (no end token)."""
    from torch2jax.hf.verify import transformers_greedy

    return transformers_greedy(lm, ids, new, PAD, mask, eos)
