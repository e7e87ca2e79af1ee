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
    ("dbrx", "DbrxModel"),  # experts looped over in its own code: replaced while tracing (torch2jax/hf/experts.py)
    ("llava_next", "LlavaNextModel"),  # image_sizes decides shapes: fixed to its example value (capture/specialize.py)
    # rotary positions from the token types (hf/rope_index.py), patch interpolation from the fixed grid
    # (hf/vision_grids.py), image features placed by a bool mask whose count the model asserts (ops/indexing.py)
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
