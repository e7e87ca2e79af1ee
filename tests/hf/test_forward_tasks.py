"""`hf:DIR` targets for forward-pass tasks: the model from its auto class, example inputs from its config,
converted and verified like any model file target."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError, Torch2JaxError
from torch2jax.hf import tasks
from torch2jax.pipeline import convert_target
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


_WAV2VEC2 = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20, conv_dim=[16, 16, 16],
                 conv_stride=[4, 4, 4], conv_kernel=[8, 8, 8], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)


def _heads():
    """(directory name -> tiny model) for each task head beyond classification: the architecture transformers' own
    pipelines use for it, small enough to convert in seconds."""
    import transformers as tf

    bert = dict(**_small(vocab_size=100, max_position_embeddings=64))
    vit = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8)
    return {
        "bert-qa": lambda: tf.BertForQuestionAnswering(tf.BertConfig(**bert)),
        "bert-choice": lambda: tf.BertForMultipleChoice(tf.BertConfig(**bert)),
        "yolos": lambda: tf.YolosForObjectDetection(tf.YolosConfig(**{**vit, "image_size": [32, 32]}, num_detection_tokens=5,
                                                                   num_labels=3)),
        "segformer": lambda: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2],
            num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, image_size=32, num_labels=3)),
        "dpt": lambda: tf.DPTForDepthEstimation(tf.DPTConfig(**vit, backbone_out_indices=[0, 1], neck_hidden_sizes=[16, 32],
                                                             reassemble_factors=[2, 1], fusion_hidden_size=32, head_hidden_size=16)),
        "wav2vec2-cls": lambda: tf.Wav2Vec2ForSequenceClassification(tf.Wav2Vec2Config(**_WAV2VEC2, num_labels=3)),
        "wav2vec2-ctc": lambda: tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(**_WAV2VEC2, vocab_size=12)),
        "ast": lambda: tf.ASTForAudioClassification(tf.ASTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, max_length=24, num_mel_bins=16,
            patch_size=2, frequency_stride=2, time_stride=2, num_labels=3)),
        "whisper-cls": lambda: tf.WhisperForAudioClassification(tf.WhisperConfig(
            d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=16, max_source_positions=30, vocab_size=100,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, num_labels=3)),
        "clip": lambda: tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=32, bos_token_id=0, eos_token_id=2),
            vision_config=dict(vit), projection_dim=16)),
    }


@pytest.fixture(scope="module")
def head_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-heads")
    for name, make in _heads().items():
        torch.manual_seed(0)
        make().save_pretrained(root / name)
    return {name: root / name for name in _heads()}


# directory -> (task inferred from its architectures, the auto class's model, example inputs {name: (shape, dynamic dims)})
HEADS = {
    "bert-qa": ("question-answering", "BertForQuestionAnswering",
                {"input_ids": ((2, 16), ("batch", "seq")), "attention_mask": ((2, 16), ("batch", "seq"))}),
    "bert-choice": ("multiple-choice", "BertForMultipleChoice",
                    {"input_ids": ((2, 3, 16), ("batch", "choices", "seq")),
                     "attention_mask": ((2, 3, 16), ("batch", "choices", "seq"))}),
    "yolos": ("object-detection", "YolosForObjectDetection", {"pixel_values": ((2, 3, 32, 32), ("batch",))}),
    "segformer": ("semantic-segmentation", "SegformerForSemanticSegmentation", {"pixel_values": ((2, 3, 32, 32), ("batch",))}),
    "dpt": ("depth-estimation", "DPTForDepthEstimation", {"pixel_values": ((2, 3, 32, 32), ("batch",))}),
    # speech classifiers are *ForSequenceClassification: found by transformers' audio-classification mapping
    "wav2vec2-cls": ("audio-classification", "Wav2Vec2ForSequenceClassification",
                     {"input_values": ((2, 4000), ("batch", "samples"))}),
    "wav2vec2-ctc": ("automatic-speech-recognition", "Wav2Vec2ForCTC", {"input_values": ((2, 4000), ("batch", "samples"))}),
    # spectrograms: AST's patches [batch, max_length, mel bins]; Whisper's encoder [batch, mel bins, 2 * positions]
    "ast": ("audio-classification", "ASTForAudioClassification", {"input_values": ((2, 24, 16), ("batch",))}),
    "whisper-cls": ("audio-classification", "WhisperForAudioClassification", {"input_features": ((2, 16, 60), ("batch",))}),
    "clip": ("zero-shot-image-classification", "CLIPModel",
             {"input_ids": ((2, 16), ("texts", "seq")), "attention_mask": ((2, 16), ("texts", "seq")),
              "pixel_values": ((2, 3, 32, 32), ("images",))}),
}


def test_each_head_gets_its_task_auto_class_and_inputs_from_the_config(head_dirs):
    for name, (task, model_class, inputs) in HEADS.items():
        target = resolve(f"hf:{head_dirs[name]}", [])
        assert type(target.module).__name__ == model_class, name
        assert tasks.default_task(target.module.config) == task, name
        assert {k: tuple(v.shape) for k, v in target.kwargs.items()} == {k: shape for k, (shape, _) in inputs.items()}, name
        dims = {k: tuple(d["name"] for d in target.dynamic_shapes[k].values()) for k in target.kwargs}
        assert dims == {k: names for k, (_, names) in inputs.items()}, name
    # the waveform's shortest length is the feature encoder's two frames (one is specialized by torch.export)
    assert resolve(f"hf:{head_dirs['wav2vec2-ctc']}", []).dynamic_shapes["input_values"][1]["min"] == 148 + 64


def _convert_and_verify(directory, out):
    """The CLI's own conversion: saved, loaded back and compared with torch on every output (example inputs, random
    inputs, a second size of each dynamic dim); a mismatch raises and leaves no directory."""
    conversion = convert_target(f"hf:{directory}", out, platforms=("cpu",))
    assert torch2jax.load(out).manifest["source"] == f"hf:{directory}"
    return "\n".join(conversion.checks)


@pytest.mark.parametrize("name", [
    "bert-qa", "clip",  # text; text and image (image alone: the ViT test above)
    pytest.param("bert-choice", marks=pytest.mark.slow), pytest.param("wav2vec2-ctc", marks=pytest.mark.slow),
    pytest.param("yolos", marks=pytest.mark.slow), pytest.param("segformer", marks=pytest.mark.slow),
    pytest.param("dpt", marks=pytest.mark.slow), pytest.param("wav2vec2-cls", marks=pytest.mark.slow),
    pytest.param("ast", marks=pytest.mark.slow), pytest.param("whisper-cls", marks=pytest.mark.slow),
])
def test_head_converts_matches_torch_on_every_output_and_loads(head_dirs, name, tmp_path):
    checks = _convert_and_verify(head_dirs[name], tmp_path / name)
    names = {"bert-qa": ["start_logits", "end_logits"], "yolos": ["logits", "pred_boxes"], "dpt": ["predicted_depth"],
             "clip": ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"]}.get(name, ["logits"])
    for output in names:
        assert "second size" in checks and f" {output} " in checks, (output, checks)
    assert " FAIL " not in checks


def test_inputs_a_config_cannot_give_ask_for_input_specs(tmp_path):
    example = tasks.Example(tmp_path, SimpleNamespace(), SimpleNamespace(main_input_name="input_features"), None)
    with pytest.raises(InputSpecError, match="main input 'input_features' has no audio sizes.*pass --input specs"):
        tasks.audio_inputs(example)
    with pytest.raises(InputSpecError, match="no text_config and vision_config.*pass --input specs"):
        tasks.text_image_inputs(example)


@pytest.mark.slow  # the console script twice (~55 s); each head converts and matches in Python above, and tests/cli runs
# the CLI's forward-pass conversion
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
    with pytest.raises(InputSpecError, match="task 'summarization' is not supported for hf: targets .supported: "
                                             "feature-extraction, .*question-answering, multiple-choice, .*object-detection"):
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
