"""Tiny configs of real architectures (random weights, nothing downloaded) and hand-written models.

Each entry builds (module, args, kwargs, dynamic_shapes). Dynamic dims are declared where the
architecture allows; the tests run every model at the example size and at a second size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..conftest import load_sample

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Case:
    module: torch.nn.Module
    args: tuple
    kwargs: dict = field(default_factory=dict)
    dynamic_shapes: Any = None


def _ids(batch=2, seq=8, vocab=100):
    return torch.randint(0, vocab, (batch, seq))


TEXT_DIMS = {0: "batch", 1: {"name": "seq", "max": 32}}


def bert() -> Case:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=100,
                     max_position_embeddings=64)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return Case(BertModel(cfg), (_ids(),), {"attention_mask": mask},
                {"input_ids": TEXT_DIMS, "attention_mask": TEXT_DIMS})


def gpt2() -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64, use_cache=False)
    return Case(GPT2LMHeadModel(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


def llama() -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                      vocab_size=100, max_position_embeddings=64, use_cache=False)
    return Case(LlamaForCausalLM(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


def qwen2() -> Case:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                      vocab_size=100, max_position_embeddings=64, use_cache=False)
    return Case(Qwen2ForCausalLM(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


def mixtral() -> Case:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                        vocab_size=100, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2, use_cache=False,
                        experts_implementation="batched_mm")  # eager routing is data-dependent; grouped_mm is a custom op
    return Case(MixtralForCausalLM(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


def t5() -> Case:
    from transformers import T5Config, T5Model

    cfg = T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=100, use_cache=False)
    return Case(T5Model(cfg), (_ids(),), {"decoder_input_ids": _ids(2, 5)},
                {"input_ids": TEXT_DIMS, "decoder_input_ids": {0: "batch", 1: {"name": "dec_seq", "max": 32}}})


def bart() -> Case:
    from transformers import BartConfig, BartModel

    cfg = BartConfig(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=100, max_position_embeddings=64, use_cache=False)
    return Case(BartModel(cfg), (_ids(),), {}, {"input_ids": {0: "batch", 1: {"name": "seq", "min": 3, "max": 32}}})


def distilbert() -> Case:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(n_layers=2, dim=64, n_heads=4, hidden_dim=128, vocab_size=100, max_position_embeddings=64)
    return Case(DistilBertModel(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


def roberta() -> Case:
    from transformers import RobertaConfig, RobertaModel

    cfg = RobertaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=100,
                        max_position_embeddings=66)
    return Case(RobertaModel(cfg), (_ids(),), {}, {"input_ids": TEXT_DIMS})


IMAGE_DIMS = {0: "batch"}


def vit() -> Case:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8)
    return Case(ViTModel(cfg), (torch.randn(2, 3, 32, 32),), {}, {"pixel_values": IMAGE_DIMS})


def resnet() -> Case:
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck")
    return Case(ResNetModel(cfg), (torch.randn(2, 3, 32, 32),), {}, {"pixel_values": IMAGE_DIMS})


def convnext() -> Case:
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)
    return Case(ConvNextModel(cfg), (torch.randn(2, 3, 32, 32),), {}, {"pixel_values": IMAGE_DIMS})


def swin() -> Case:
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    return Case(SwinModel(cfg), (torch.randn(2, 3, 32, 32),), {}, {"pixel_values": IMAGE_DIMS})


def whisper() -> Case:
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=20, max_target_positions=32,
                        vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False)
    return Case(WhisperModel(cfg), (torch.randn(2, 16, 40),), {"decoder_input_ids": _ids(2, 5)},
                {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: {"name": "dec_seq", "max": 32}}})


def wav2vec2() -> Case:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                         conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4)
    return Case(Wav2Vec2Model(cfg), (torch.randn(2, 800),), {}, {"input_values": {0: "batch"}})


def clip() -> Case:
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(
        text_config={"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
                     "vocab_size": 100, "max_position_embeddings": 32},
        vision_config={"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
                       "image_size": 32, "patch_size": 8},
        projection_dim=32,
    )
    return Case(CLIPModel(cfg), (_ids(),), {"pixel_values": torch.randn(2, 3, 32, 32)},
                {"input_ids": {0: "batch", 1: {"name": "seq", "max": 32}}, "pixel_values": {0: "batch"}})


def lstm_gru() -> Case:
    # torch unrolls the recurrence over time, so the sequence length is static; the batch stays symbolic
    return Case(load_sample("recurrent").LSTMTagger(), (torch.randint(0, 50, (2, 7)),), {}, {"ids": {0: "batch"}})


def unet() -> Case:
    return Case(load_sample("unet").TinyUNet(), (torch.randn(2, 3, 16, 16),), {}, {"x": {0: "batch"}})


class BagScatter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(40, 8, mode="mean")
        self.table = torch.nn.Embedding(40, 8)

    def forward(self, ids, offsets, groups):
        pooled = self.bag(ids, offsets)
        tokens = self.table(ids)
        sums = torch.zeros(4, 8).index_add(0, groups, tokens)
        scattered = torch.zeros(4, 8).scatter_reduce(0, groups[:, None].expand(-1, 8), tokens, reduce="amax", include_self=False)
        picked = torch.gather(tokens, 0, ids[:, None].remainder(tokens.shape[0]).expand(-1, 8))
        return pooled, sums, scattered, picked


def embedding_bag_scatter() -> Case:
    ids = torch.randint(0, 40, (10,))
    return Case(BagScatter(), (ids, torch.tensor([0, 3, 7]), torch.randint(0, 4, (10,))))


MODELS: dict[str, Callable[[], Case]] = {
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
    "qwen2": qwen2,
    "mixtral": mixtral,
    "t5": t5,
    "bart": bart,
    "distilbert": distilbert,
    "roberta": roberta,
    "vit": vit,
    "resnet": resnet,
    "convnext": convnext,
    "swin": swin,
    "whisper": whisper,
    "wav2vec2": wav2vec2,
    "clip": clip,
    "lstm_gru": lstm_gru,
    "unet": unet,
    "embedding_bag_scatter": embedding_bag_scatter,
}


# --- larger configs (the slow tier: `make test-models-full`) -------------------------------------
# Benchmark-sized: more layers, wider, longer sequences and bigger images, where XLA takes other
# code paths (e.g. YNNPACK convolutions above 16 channels, the 3-channel stem padded to 4).

LARGE_TEXT_DIMS = {0: "batch", 1: {"name": "seq", "max": 128}}


def _large_ids():
    return _ids(batch=4, seq=64, vocab=1000)


def bert_large() -> Case:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=1000,
                     max_position_embeddings=128)
    mask = torch.ones(4, 64, dtype=torch.long)
    mask[1, 40:] = 0
    return Case(BertModel(cfg), (_large_ids(),), {"attention_mask": mask},
                {"input_ids": LARGE_TEXT_DIMS, "attention_mask": LARGE_TEXT_DIMS})


def gpt2_large() -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=128, use_cache=False)
    return Case(GPT2LMHeadModel(cfg), (_large_ids(),), {}, {"input_ids": LARGE_TEXT_DIMS})


def llama_large() -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1024,
                      vocab_size=1000, max_position_embeddings=128, use_cache=False)
    return Case(LlamaForCausalLM(cfg), (_large_ids(),), {}, {"input_ids": LARGE_TEXT_DIMS})


def vit_large() -> Case:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, image_size=64, patch_size=8)
    return Case(ViTModel(cfg), (torch.randn(4, 3, 64, 64),), {}, {"pixel_values": IMAGE_DIMS})


def resnet_large() -> Case:
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[2, 2, 2, 2], layer_type="bottleneck")
    model = ResNetModel(cfg)
    _trained_batch_norm(model)
    return Case(model, (torch.randn(4, 3, 64, 64),), {}, {"pixel_values": IMAGE_DIMS})


def _trained_batch_norm(module: torch.nn.Module) -> None:
    """Non-trivial running statistics and affine params, as a trained model has (fresh ones are 0/1)."""
    generator = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5, generator=generator)
            m.running_var.uniform_(0.5, 2.0, generator=generator)
            m.weight.data.uniform_(0.5, 1.5, generator=generator)
            m.bias.data.uniform_(-0.5, 0.5, generator=generator)


LARGE_MODELS: dict[str, Callable[[], Case]] = {
    "bert_large": bert_large,
    "gpt2_large": gpt2_large,
    "llama_large": llama_large,
    "vit_large": vit_large,
    "resnet_large": resnet_large,
}
