"""Streamed weights for forward-pass targets: a model file with `--weights *.safetensors` and an hf: forward
task are built with fake parameters, their weights streamed into the artifact, and the saved params equal
the in-memory conversion's bit for bit; verification runs torch on the weights memory-mapped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.capture.converter import convert
from torch2jax.capture.fake_params import is_fake
from torch2jax.pipeline import resolve_target as resolve

from ..helpers import cli


@pytest.fixture(scope="module")
def gpt_weights(tmp_path_factory):
    """TinyGPT's state_dict (its head tied to the embedding, stored under both names, as load_weights needs)."""
    from safetensors.torch import save_file

    from sample_models.tiny_gpt import TinyGPT

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "gpt.safetensors"
    save_file({name: t.clone() for name, t in TinyGPT().state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def gpt_weights_once(tmp_path_factory):
    """The same model saved by safetensors' save_model, which stores the tied pair once (one of the names)."""
    from safetensors.torch import save_model

    from sample_models.tiny_gpt import TinyGPT

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "gpt-once.safetensors"
    save_model(TinyGPT(), str(path))
    return path


def _saved_params(target, weights, stream, out, task=None):
    resolved = resolve(target, [], str(weights) if weights else None, task=task, stream=stream)
    assert any(is_fake(p) for p in resolved.module.parameters()) == stream
    model = convert(resolved.module, resolved.args, resolved.kwargs, resolved.dynamic_shapes, weights=resolved.weights)
    torch2jax.save(model, out)
    return torch2jax.load(out)


def _assert_bitwise(a, b) -> None:
    assert a.manifest["params"]["tree"] == b.manifest["params"]["tree"]
    assert a.manifest["params"]["aliases"] == b.manifest["params"]["aliases"]
    for name in a.params:
        assert np.asarray(a.params[name]).tobytes() == np.asarray(b.params[name]).tobytes(), name


def test_model_file_weights_streamed_equal_in_memory(gpt_weights, tmp_path):
    target = "sample_models/tiny_gpt.py:TinyGPT"
    streamed = _saved_params(target, gpt_weights, True, tmp_path / "streamed")
    in_memory = _saved_params(target, gpt_weights, False, tmp_path / "in-memory")
    assert streamed.manifest["params"]["aliases"] == {"head.weight": "tok.weight"}
    _assert_bitwise(streamed, in_memory)


def test_materialized_module_runs_on_mapped_weights_and_stays_tied(gpt_weights_once):
    from safetensors.torch import load_model

    from sample_models.tiny_gpt import TinyGPT

    resolved = resolve("sample_models/tiny_gpt.py:TinyGPT", [], str(gpt_weights_once), stream=True)
    module = resolved.weights.materialize(resolved.module)
    assert module.head.weight is module.tok.weight and not is_fake(module.tok.weight)
    reference = TinyGPT()
    load_model(reference, str(gpt_weights_once))
    with torch.no_grad():
        assert torch.equal(module(*resolved.args), reference.eval()(*resolved.args))


def test_hf_forward_task_streamed_equals_in_memory(tmp_path):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=100,
                           max_position_embeddings=64, num_labels=3)
    tf.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    target = f"hf:{tmp_path / 'bert'}"
    _assert_bitwise(_saved_params(target, None, True, tmp_path / "streamed"), _saved_params(target, None, False, tmp_path / "mem"))


@pytest.mark.slow  # the console script (~60 s); tests/hf/test_streamed_weights.py runs the streaming CLI by default
def test_cli_streams_weights_and_says_how_it_verified(gpt_weights, tmp_path):
    out = tmp_path / "gpt"
    result = cli("convert", "sample_models/tiny_gpt.py:TinyGPT", "--weights", str(gpt_weights), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "weights streamed from the safetensors files" in result.stdout
    assert "verified against PyTorch (the whole model, its weights memory-mapped from the safetensors files)" in result.stdout
    in_memory = tmp_path / "gpt-in-memory"
    result = cli("convert", "sample_models/tiny_gpt.py:TinyGPT", "--weights", str(gpt_weights), "--weights-in-memory",
                 "--no-verify", "--out", str(in_memory))
    assert result.returncode == 0 and "streamed" not in result.stdout
    _assert_bitwise(torch2jax.load(out), torch2jax.load(in_memory))
