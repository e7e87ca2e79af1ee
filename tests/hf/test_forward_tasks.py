"""`hf:DIR` targets for forward-pass tasks: the model from its auto class, example inputs from its config,
converted and verified like any model file target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError, Torch2JaxError
from torch2jax.pipeline import resolve_target as resolve

from ..helpers import cli, max_err


def _small(**extra):
    return dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, **extra)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    import transformers as tf

    root = tmp_path_factory.mktemp("hf-forward")
    torch.manual_seed(0)
    made = {
        "bert-cls": tf.BertForSequenceClassification(tf.BertConfig(**_small(vocab_size=100, max_position_embeddings=64, num_labels=3))),
        "bert": tf.BertModel(tf.BertConfig(**_small(vocab_size=100, max_position_embeddings=64))),
        "vit": tf.ViTForImageClassification(tf.ViTConfig(**_small(image_size=32, patch_size=8, num_labels=5))),
    }
    for name, model in made.items():
        model.save_pretrained(root / name)
    return {name: root / name for name in made}


def test_cli_converts_and_verifies_a_text_classifier_and_an_image_classifier(hf_dirs, tmp_path):
    for name, signature in (("bert-cls", "(input_ids: int64[batch, seq], attention_mask: int64[batch, seq])"),
                            ("vit", "(pixel_values: float32[batch, 3, 32, 32])")):
        out = tmp_path / name
        result = cli("convert", f"hf:{hf_dirs[name]}", "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert signature in result.stdout and "second size (batch=3" in result.stdout
        assert torch2jax.load(out).manifest["source"] == f"hf:{hf_dirs[name]}"


def test_task_defaults_from_the_architecture_and_can_be_chosen(hf_dirs):
    import transformers

    classifier = resolve(f"hf:{hf_dirs['bert-cls']}", [])
    assert isinstance(classifier.module, transformers.BertForSequenceClassification)
    assert set(classifier.kwargs) == {"input_ids", "attention_mask"} and classifier.kwargs["input_ids"].shape == (2, 16)
    features = resolve(f"hf:{hf_dirs['bert-cls']}", [], task="feature-extraction")
    assert type(features.module) is transformers.BertModel
    model = torch2jax.convert(features.module, features.args, features.kwargs, features.dynamic_shapes)
    ids = np.random.default_rng(0).integers(0, 100, (3, 9))
    got = model(input_ids=ids, attention_mask=np.ones_like(ids))
    with torch.no_grad():
        want = features.module(input_ids=torch.from_numpy(ids), attention_mask=torch.ones(3, 9, dtype=torch.long))
    assert max_err(got["last_hidden_state"], want.last_hidden_state) < 1e-5


def test_bad_hf_targets_say_what_is_wrong(hf_dirs, tmp_path):
    with pytest.raises(InputSpecError, match="task 'summarization' is not supported for hf: targets"):
        resolve(f"hf:{hf_dirs['bert']}", [], task="summarization")
    with pytest.raises(InputSpecError, match="is not a directory: hf: takes a local model directory"):
        resolve(f"hf:{tmp_path / 'missing'}", [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputSpecError, match="has no config.json"):
        resolve(f"hf:{tmp_path / 'empty'}", [])
    with pytest.raises(Torch2JaxError, match="task 'text-classification' is a forward pass"):
        torch2jax.convert_hf(hf_dirs["bert-cls"])
    result = cli("convert", f"hf:{tmp_path / 'missing'}", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "nothing is downloaded" in result.stderr and not (tmp_path / "out").exists()
