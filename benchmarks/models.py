"""The benchmarked models: the sample models and tests/models/zoo.py's architectures, at a size where timings mean something.

Every case is called with keyword inputs (`module(**inputs)`), so torch, torch2jax, torch.compile and
ONNX Runtime all see the same names. Weights are random (seeded), nothing is downloaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for sample_models

BATCH, SEQ, HIDDEN, LAYERS, HEADS, FFN, VOCAB, MAX_SEQ = 8, 64, 256, 2, 4, 1024, 1000, 128
TEXT_DIMS = {0: "batch", 1: {"name": "seq", "max": MAX_SEQ}}
IMAGE_DIMS = {0: "batch"}


@dataclass
class BenchCase:
    module: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic_shapes: dict[str, Any]
    shape: str  # a short description of the inputs for the tables
    latency: bool = True  # False: measure conversion, size and load only


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def _text(module: torch.nn.Module, **extra: torch.Tensor) -> BenchCase:
    inputs = {"input_ids": _ids(), **extra}
    return BenchCase(module, inputs, {name: TEXT_DIMS for name in inputs}, f"{BATCH}x{SEQ} tokens")


def mlp() -> BenchCase:
    from sample_models.mlp import MLP

    return BenchCase(MLP(features=256, hidden=1024, classes=10), {"x": torch.randn(64, 256)}, {"x": {0: "batch"}}, "64x256")


def wide_mlp() -> BenchCase:
    """256 MiB of weights: conversion memory and artifact size where the weights, not fixed costs, dominate."""
    from sample_models.mlp import MLP

    module = MLP(features=4096, hidden=8192, classes=4096)
    return BenchCase(module, {"x": torch.randn(8, 4096)}, {"x": {0: "batch"}}, "8x4096", latency=False)


def cnn() -> BenchCase:
    from sample_models.cnn import make_model

    return BenchCase(make_model(), {"images": torch.randn(BATCH, 3, 64, 64)}, {"images": IMAGE_DIMS}, f"{BATCH}x3x64x64")


def tiny_gpt() -> BenchCase:
    from sample_models.tiny_gpt import TinyGPT

    module = TinyGPT(vocab=VOCAB, dim=HIDDEN, heads=HEADS, layers=LAYERS, max_seq=MAX_SEQ)
    return BenchCase(module, {"tokens": _ids()}, {"tokens": TEXT_DIMS}, f"{BATCH}x{SEQ} tokens")


def bert() -> BenchCase:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=FFN,
                     vocab_size=VOCAB, max_position_embeddings=MAX_SEQ)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ // 2:] = 0
    return _text(BertModel(cfg), attention_mask=mask)


def gpt2() -> BenchCase:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, vocab_size=VOCAB, n_positions=MAX_SEQ, use_cache=False)
    return _text(GPT2LMHeadModel(cfg))


def llama() -> BenchCase:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                      intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=MAX_SEQ, use_cache=False)
    return _text(LlamaForCausalLM(cfg))


def vit() -> BenchCase:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=FFN,
                    image_size=64, patch_size=8)
    return BenchCase(ViTModel(cfg), {"pixel_values": torch.randn(BATCH, 3, 64, 64)}, {"pixel_values": IMAGE_DIMS},
                     f"{BATCH}x3x64x64")


def resnet() -> BenchCase:
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="bottleneck")
    return BenchCase(ResNetModel(cfg), {"pixel_values": torch.randn(BATCH, 3, 64, 64)}, {"pixel_values": IMAGE_DIMS},
                     f"{BATCH}x3x64x64")


def t5() -> BenchCase:
    from transformers import T5Config, T5Model

    cfg = T5Config(num_layers=LAYERS, num_decoder_layers=LAYERS, d_model=HIDDEN, d_kv=HIDDEN // HEADS, num_heads=HEADS,
                   d_ff=FFN, vocab_size=VOCAB, use_cache=False)
    inputs = {"input_ids": _ids(), "decoder_input_ids": torch.randint(0, VOCAB, (BATCH, SEQ // 4))}
    dims = {"input_ids": TEXT_DIMS, "decoder_input_ids": {0: "batch", 1: {"name": "dec_seq", "max": MAX_SEQ}}}
    return BenchCase(T5Model(cfg), inputs, dims, f"{BATCH}x{SEQ} + {BATCH}x{SEQ // 4} tokens")


def mixtral() -> BenchCase:
    """Fewer tokens than the others: transformers' exportable expert path gathers each token's expert weights."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                        intermediate_size=FFN // 2, vocab_size=VOCAB, max_position_embeddings=MAX_SEQ, num_local_experts=4,
                        num_experts_per_tok=2, use_cache=False, experts_implementation="batched_mm")
    ids = torch.randint(0, VOCAB, (2, SEQ // 2))
    return BenchCase(MixtralForCausalLM(cfg), {"input_ids": ids}, {"input_ids": TEXT_DIMS}, f"2x{SEQ // 2} tokens")


def whisper() -> BenchCase:
    from transformers import WhisperConfig, WhisperModel

    mels, frames = 80, 2 * SEQ
    cfg = WhisperConfig(encoder_layers=LAYERS, decoder_layers=LAYERS, d_model=HIDDEN, encoder_attention_heads=HEADS,
                        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, num_mel_bins=mels,
                        max_source_positions=frames // 2, max_target_positions=MAX_SEQ, vocab_size=VOCAB, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False)
    inputs = {"input_features": torch.randn(BATCH, mels, frames), "decoder_input_ids": torch.randint(0, VOCAB, (BATCH, SEQ // 4))}
    dims = {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: {"name": "dec_seq", "max": MAX_SEQ}}}
    return BenchCase(WhisperModel(cfg), inputs, dims, f"{BATCH}x{mels}x{frames} mel + {BATCH}x{SEQ // 4} tokens")


def clip() -> BenchCase:
    from transformers import CLIPConfig, CLIPModel

    tower = {"num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": HEADS, "intermediate_size": FFN}
    cfg = CLIPConfig(text_config={**tower, "vocab_size": VOCAB, "max_position_embeddings": MAX_SEQ},
                     vision_config={**tower, "image_size": 64, "patch_size": 8}, projection_dim=HIDDEN // 2)
    inputs = {"input_ids": _ids(), "pixel_values": torch.randn(BATCH, 3, 64, 64)}
    return BenchCase(CLIPModel(cfg), inputs, {"input_ids": TEXT_DIMS, "pixel_values": IMAGE_DIMS},
                     f"{BATCH}x{SEQ} tokens + {BATCH}x3x64x64")


def convnext() -> BenchCase:
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])
    return BenchCase(ConvNextModel(cfg), {"pixel_values": torch.randn(BATCH, 3, 64, 64)}, {"pixel_values": IMAGE_DIMS},
                     f"{BATCH}x3x64x64")


def swin() -> BenchCase:
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=64, patch_size=4, embed_dim=64, depths=[2, 2], num_heads=[2, 4], window_size=4)
    return BenchCase(SwinModel(cfg), {"pixel_values": torch.randn(BATCH, 3, 64, 64)}, {"pixel_values": IMAGE_DIMS},
                     f"{BATCH}x3x64x64")


def lstm() -> BenchCase:
    from sample_models.recurrent import LSTMTagger

    module = LSTMTagger(vocab=VOCAB, dim=HIDDEN // 2, hidden=HIDDEN // 2, gru_hidden=HIDDEN // 2, tags=16)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ // 2))
    return BenchCase(module, {"ids": ids}, {"ids": {0: "batch"}}, f"{BATCH}x{SEQ // 2} tokens")


def unet() -> BenchCase:
    from sample_models.unet import TinyUNet

    return BenchCase(TinyUNet(channels=32), {"x": torch.randn(BATCH, 3, 64, 64)}, {"x": IMAGE_DIMS}, f"{BATCH}x3x64x64")


MODELS: dict[str, Callable[[], BenchCase]] = {
    "mlp": mlp,
    "cnn": cnn,
    "tiny_gpt": tiny_gpt,
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
    "vit": vit,
    "resnet": resnet,
    "t5": t5,
    "mixtral": mixtral,
    "whisper": whisper,
    "clip": clip,
    "convnext": convnext,
    "swin": swin,
    "lstm": lstm,
    "unet": unet,
    "wide_mlp": wide_mlp,
}
QUICK_MODELS = ["mlp", "tiny_gpt", "bert"]


def build(name: str) -> BenchCase:
    """Build model `name` in eval mode with seeded random weights."""
    torch.manual_seed(0)
    case = MODELS[name]()
    case.module.eval()
    return case
