"""A representative slice of the architecture sweep (benchmarks/hf_sweep), one model per family, through
the sweep's own per-row function: converts, matches torch, and round-trips through save and load."""

from __future__ import annotations

import pytest

from benchmarks.hf_sweep import run

# (model type, class): an encoder, GPT-like and Llama-like decoders, an encoder-decoder, a vision
# transformer, a ConvNet, an audio encoder-decoder, XLM (zero-size lifted constants in its params), and two the sweep
# found failing
FAMILIES = [
    ("bert", "BertModel"),
    ("gpt2", "GPT2LMHeadModel"),
    ("llama", "LlamaForCausalLM"),
    ("t5", "T5ForConditionalGeneration"),
    ("vit", "ViTForImageClassification"),
    ("resnet", "ResNetModel"),
    ("whisper", "WhisperModel"),
    ("xlm", "XLMModel"),
    # a python keyword input (use_cache=False), baked in so that it saves (fast: tests/runtime/test_artifact.py)
    pytest.param("prophetnet", "ProphetNetModel", marks=pytest.mark.slow),
    ("mixtral", "MixtralForCausalLM"),  # experts through transformers' grouped_mm custom op
    # a sigmoid router's top-k over biased scores; its gate is zero at init, drawn by the sweep (else tied scores)
    ("afmoe", "AfmoeModel"),
    ("dbrx", "DbrxModel"),  # experts looped over in its own code: replaced while tracing (torch2jax/hf/stand_ins/experts.py)
    ("llava_next", "LlavaNextModel"),  # image_sizes decides shapes: fixed to its example value (capture/specialize.py)
    # rotary positions from the token types (hf/stand_ins/rope_index.py), patch interpolation from the fixed grid
    # (hf/stand_ins/vision_grids.py), image features placed by a bool mask whose count the model asserts (ops/indexing.py)
    ("qwen3_vl", "Qwen3VLModel"),
    # branches on tensor values (`if is_global_attn:`) and selections by a mask: converted along the example's path,
    # checked on every call (capture/example_path.py); sliding chunks as_strided over a transposed view's storage
    ("longformer", "LongformerModel"),
]
FIXED = {"llava_next": ["image_sizes"], "qwen3_vl": ["image_grid_thw"]}
ALONG_EXAMPLE = {"longformer"}


@pytest.fixture(scope="module")
def configs():
    return run.load_configs()


@pytest.mark.parametrize("model_type,class_name", FAMILIES, ids=[getattr(f, "values", f)[0] for f in FAMILIES])
def test_architecture_converts_matches_and_round_trips(model_type, class_name, configs, tmp_path):
    entry = configs[model_type]
    assert entry["source"] == "tester", f"{model_type}: expected the test suite's tiny config in configs.json"
    row = run.run_row(entry, class_name, onnx=False, workdir=tmp_path)
    assert row["status"] == run.OK, f"{model_type} {class_name}: {row['status']}: {row.get('error')}"
    assert {"convert", "save", "load"} <= set(row["seconds"]) and row["max_abs"] < 1e-3
    assert row.get("fixed") == FIXED.get(model_type)
    assert bool(row.get("example_values")) == (model_type in ALONG_EXAMPLE)


def test_zero_initialized_params_are_drawn_but_not_biases():
    """A zero router gate ties every expert's score, and torch's top-k order among ties is unspecified: the sweep
    draws such params, so the comparison sees the routing (and whatever a zero gate would hide)."""
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with torch.no_grad():
        module[0].weight.zero_()
        module[0].bias.zero_()
    kept = module[1].weight.clone()
    run._draw_zero_params(module, 0.02)
    assert module[0].weight.any() and module[0].weight.abs().max() < 0.2
    assert not module[0].bias.any(), "zero biases are ordinary: left alone"
    assert torch.equal(module[1].weight, kept), "params init drew are left alone"


def test_generic_configs_stay_tiny_where_stage_lists_would_keep_them_large():
    """VibeVoice's acoustic tokenizers double their channels over seven stages: with its widths shrunk alone its
    generic model kept 1.03 B params. STAGE_SIZES cuts the stages (benchmarks/hf_sweep/extract_configs.py)."""
    from benchmarks.hf_sweep import extract_configs

    entry = extract_configs.generic("vibevoice")
    assert entry["config"]["audio_config"]["depths"] == [1, 1]
    model = run.build(entry, "VibeVoiceForConditionalGeneration")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_generic_shrink_keeps_a_layer_of_each_kind_and_token_ids_in_the_vocabulary():
    """Two sliding layers out of Gemma 4's five-and-one would leave its full attention untested, and its per-layer
    config (keyed by layer index) would name layers the shrunk model lacks; a pad id past the shrunk vocabulary fails
    nn.Embedding's check."""
    from benchmarks.hf_sweep.extract_configs import _shrink

    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    config = {"model_type": "x", "num_hidden_layers": 12, "layer_types": kinds, "vocab_size": 262144, "pad_token_id": 70000,
              "per_layer_config": {"05": {"window": None}, "11": {"window": None}, "01": {"window": 512}}}
    out = _shrink(config)
    assert out["num_hidden_layers"] == 2 and out["layer_types"] == ["sliding_attention", "full_attention"]
    assert out["per_layer_config"] == {"01": {"window": None}}, "layer 5 is now layer 1; layers 1 and 11 are gone"
    assert out["vocab_size"] == 70001
    plain = _shrink({"model_type": "y", "num_hidden_layers": 12, "layer_types": ["full_attention"] * 12, "vocab_size": 5000})
    assert plain["layer_types"] == ["full_attention"] * 2 and plain["vocab_size"] == 1000


def test_generic_audio_inputs_take_the_layout_the_model_runs_on():
    """Waveforms with a channel dim for a codec's encoder (Mimi's), found by trying the usual layouts on the model."""
    from benchmarks.hf_sweep import extract_configs

    entry = extract_configs.generic("mimi_encoder")
    assert [(i["name"], i["shape"]) for i in entry["inputs"]] == [("input_values", [2, 1, 1600])]


def test_generic_shrink_keeps_latent_attention_routing_and_rotary_sections_consistent():
    """DeepSeek-style latent attention (one key per head, qk_head_dim derived), top-k within the 4 experts left, and
    Qwen2-VL's rotary sections summing to half the shrunk rotary dims."""
    from benchmarks.hf_sweep.extract_configs import _shrink

    mla = _shrink({"model_type": "x", "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
                   "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "qk_head_dim": 192, "n_routed_experts": 256,
                   "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4})
    assert mla["num_key_value_heads"] == mla["num_attention_heads"] == 4 and mla["qk_head_dim"] == 16
    assert (mla["n_routed_experts"], mla["num_experts_per_tok"], mla["n_group"], mla["topk_group"]) == (4, 2, 2, 2)
    vl = _shrink({"model_type": "qwen2_vl_text", "hidden_size": 3584, "num_attention_heads": 28,
                  "rope_parameters": {"rope_type": "default"}})
    assert sum(vl["rope_parameters"]["mrope_section"]) == 32 // 4 // 2


def test_a_language_model_head_of_a_multimodal_type_takes_its_own_sub_config(configs):
    """Qwen3_5ForCausalLM is registered under the composite qwen3_5 type but is built from its text config."""
    model = run.build(configs["qwen3_5"], "Qwen3_5ForCausalLM")
    assert type(model.config).__name__ == "Qwen3_5TextConfig"
