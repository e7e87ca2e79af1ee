"""Tiny random-weight causal LMs of real transformers architectures, written with save_pretrained, and a word-level
tokenizer over their ids."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, PAD, BOS, EOS = 128, 0, 1, 2
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS, bos_token_id=BOS, pad_token_id=PAD)


def _build(name: str, layers: int = 2):
    import transformers as tf

    common = dict(_COMMON, num_hidden_layers=layers)

    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    if name == "mistral":  # a window shorter than the generated text, so the sliding mask matters
        return tf.MistralForCausalLM(tf.MistralConfig(**common, sliding_window=8))
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
    if name == "gemma":
        return tf.GemmaForCausalLM(tf.GemmaConfig(**common, head_dim=16))
    if name == "gemma2":  # alternating sliding / full layers, logit soft-capping, eager attention
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(**common, head_dim=16, sliding_window=8))
    if name == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(**common))
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_head=4, n_positions=256, n_layer=layers,
                                                eos_token_id=EOS, bos_token_id=BOS))
    if name == "gpt_neo":  # a local layer's window of 8, read from its own causal table (hf/stand_ins/local_attention.py)
        return tf.GPTNeoForCausalLM(tf.GPTNeoConfig(vocab_size=VOCAB, hidden_size=64, num_layers=layers, num_heads=4,
                                                    attention_types=[[["global", "local"], layers // 2]], window_size=8,
                                                    intermediate_size=128, max_position_embeddings=256, eos_token_id=EOS,
                                                    bos_token_id=BOS, pad_token_id=PAD))
    if name == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))
    if name == "qwen2_moe":
        return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                         shared_expert_intermediate_size=64))
    raise KeyError(name)


ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "gpt2", "gpt_neo", "mixtral", "qwen2_moe")


def build_lm(name: str, layers: int = 2) -> torch.nn.Module:
    """A random-weight model of this architecture (seeded)."""
    torch.manual_seed(0)
    return _build(name, layers).eval()


def write_lm(name: str, directory: Path, layers: int = 2) -> Path:
    """save_pretrained a random-weight model of this architecture (seeded) into directory/name."""
    out = directory / name
    build_lm(name, layers).save_pretrained(out)
    return out


def load_lm(path: Path, dtype: torch.dtype = torch.float32):
    """The same model through transformers, as the reference."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()


def hf_greedy(lm, ids: torch.Tensor, new: int, mask: torch.Tensor | None = None, eos: int | None = None):
    """transformers' own greedy generate; eos=None generates exactly `new` tokens (no end token)."""
    from torch2jax.hf.verify import transformers_greedy

    return transformers_greedy(lm, ids.numpy(), new, PAD, None if mask is None else mask.numpy(), eos)


def write_tokenizer(directory) -> None:
    """A word-level tokenizer over the model's 128 ids (w3 ... w127), saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 128)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(directory / "tokenizer.json"))
