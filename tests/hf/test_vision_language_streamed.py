"""Vision-language models (image-text-to-text) with streamed weights and on a mesh: the model built with fake params,
the checkpoint's tensors mapped through transformers' own load-time renames (whatever the checkpoint's key style) and
read only when the artifact is written; the saved params equal, bit for bit, what the in-memory conversion saves
(transformers' from_pretrained state), and greedy generation equals transformers'. Loaded on a (data=2, model=4) mesh of
simulated devices (in a subprocess), the artifact generates the unsharded tokens, the vision tower planned too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch2jax
from torch2jax.capture.checkpoint_files import Checkpoint, write
from torch2jax.capture.torch_arrays import to_jax
from torch2jax.hf.directory import load_model
from torch2jax.hf.streamed import fake_causal_lm
from torch2jax.hf.verify import check_generation, verify_vision_language
from torch2jax.runtime.checkpoint import DeferredArray

from ..helpers import cli_convert_streamed
from . import vlms

PROBE = Path(__file__).with_name("vlm_mesh_probe.py")

# LLaVA runs in the default tier; Qwen2-VL (its own encoder and 3-D rotary positions) converts and compiles another
# model, so it runs with the slow tests
ARCHITECTURES = ["llava", pytest.param("qwen2_vl", marks=pytest.mark.slow(
    reason="a second architecture's streamed conversion, generation and mesh load: about a minute of CPU"))]
# per architecture: (a vision-tower projection an auto rule splits, a vision-tower param no rule covers)
VISION_PARAMS = {"llava": ("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
                           "model.vision_tower.embeddings.patch_embedding.weight"),
                 "qwen2_vl": ("model.visual.blocks.0.mlp.fc1.weight", "model.visual.patch_embed.proj.weight")}


def _auto_class():
    import transformers

    return transformers.AutoModelForImageTextToText


def _reference_state(model) -> dict:
    """What the in-memory conversion saves: from_pretrained's tensors and buffers, as JAX carries them (int64 buffers
    as int32 without x64)."""
    return {name: np.asarray(to_jax(t)) for name, t in {**model.state_dict(), **dict(model.named_buffers())}.items()}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def streamed(request, tmp_path_factory):
    """(name, model directory, the transformers model, the artifact converted with streamed weights and saved)."""
    root = tmp_path_factory.mktemp(f"vlm-streamed-{request.param}")
    source = vlms.write(request.param, root)
    out = torch2jax.save(torch2jax.convert_hf(source, max_cache_len=64, max_batch=2, stream_weights=True), root / "out")
    return request.param, source, load_model(_auto_class(), source).eval(), out


def test_streamed_params_equal_the_in_memory_ones(streamed):
    _, _, model, out = streamed
    loaded = torch2jax.load(out)
    want = _reference_state(model)
    assert loaded.manifest["params"]["aliases"] == {}  # nothing tied in these models: every param once
    assert set(loaded.params) <= set(want)
    for name, value in loaded.params.items():
        got = np.asarray(value)
        assert got.dtype == want[name].dtype and got.tobytes() == want[name].tobytes(), name


def test_streamed_greedy_equals_transformers(streamed):
    _, _, model, out = streamed
    result = verify_vision_language(model, torch2jax.load(out), tokens=12)
    check_generation(result)
    assert len(result.rows) == 2 and all(len(theirs) == 12 for _, theirs in result.rows)


def test_mesh_load_generates_the_unsharded_tokens(streamed, tmp_path):
    """Every param is planned on the mesh: the language model's and the vision tower's projections split over the
    model axis by the causal-LM rules, what no rule covers (patch embeddings) replicated; the cache follows the batch."""
    name, _, _, out = streamed
    target = tmp_path / "probe.json"
    result = subprocess.run([sys.executable, str(PROBE), str(target), str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    probe = json.loads(target.read_text())
    assert probe["devices"] == 8
    report = probe["artifacts"][str(out)]
    assert report["kind"] == "VisionLanguageGenerator" and report["equal"]
    split, whole = VISION_PARAMS[name]
    specs = report["specs"]
    assert specs["model.language_model.layers.0.self_attn.q_proj.weight"] == "P('model', None)"
    assert specs[split] == "P('model', None)" and specs[whole] == "P()"
    assert report["cache_spec"].startswith("P('data'")
    assert report["decode_collectives"]["all-reduce"] > 0  # row-parallel products sum over the model axis


def _key_styles(name: str, source: Path, model, root: Path) -> dict[str, Path]:
    """The checkpoint under the key styles transformers loads: as save_pretrained writes it, under the model's own
    state_dict names (model.language_model.*, model.vision_tower.*, lm_head.*), and for the CLIP / SigLIP towers with
    the `vision_tower.vision_model.*` names of older checkpoints."""
    styles = {"saved": source}
    stored = Checkpoint.open(source)
    styles["module"] = _rewritten(source, root / "module", {n: t.detach().numpy() for n, t in model.state_dict().items()})
    if not name.startswith("qwen"):
        older = {n.replace("vision_tower.", "vision_tower.vision_model.", 1) if n.startswith("vision_tower.") else n:
                 stored.read(n) for n in stored.entries}
        styles["older"] = _rewritten(source, root / "older", older)
    if name == "qwen3_vl_moe":  # the experts' stacked weights with their last two axes exchanged, as the released
        # checkpoints store them (transformers' Transpose(1, 2, check_dims=True) takes either layout)
        swapped = {n: np.ascontiguousarray(np.swapaxes(stored.read(n), 1, 2)) if ".mlp.experts." in n else stored.read(n)
                   for n in stored.entries}
        styles["transposed"] = _rewritten(source, root / "transposed", swapped)
    return styles


def _rewritten(source: Path, out: Path, tensors: dict) -> Path:
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors*"))
    write(out / "model.safetensors", tensors)
    return out


@pytest.mark.parametrize("name", ["llava", "gemma3", "paligemma", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def test_every_key_style_maps_onto_the_same_params(name, tmp_path):
    """Each architecture's checkpoint, in each key style (transformers loads each to the same state), resolves every
    param of the fake-parameter model onto the tensor transformers loads there. No conversion: the mapping alone."""
    source = vlms.write(name, tmp_path)
    model = load_model(_auto_class(), source)
    want = _reference_state(model)
    for style, directory in _key_styles(name, source, model, tmp_path).items():
        if style != "saved":  # the variant is one transformers itself loads, to the same values
            again = _reference_state(load_model(_auto_class(), directory))
            assert all(again[n].tobytes() == want[n].tobytes() for n in want), style
        vlm, weights = fake_causal_lm(directory, vision=True)
        resolved = weights.check(vlm)
        deferred = {n: v for n, v in resolved.items() if isinstance(v, DeferredArray)}
        assert set(deferred) == {n for n, _ in vlm.named_parameters()}, style
        for param, value in deferred.items():
            assert value.read().tobytes() == want[param].tobytes(), f"{style}: {param} <- {value.source}"


def test_the_cli_streams_a_vlm_by_default(tmp_path, monkeypatch):
    """`torch2jax convert hf:DIR` builds an image-text-to-text model with fake params and hands the converter the
    checkpoint's WeightSource; --weights-in-memory loads it with transformers."""
    from click.testing import CliRunner
    from torch2jax.cli.main import main

    from torch2jax.hf import convert

    seen = []

    def convert_vision_language(vlm, *, weights=None, **options):
        seen.append(weights is not None)
        raise torch2jax.InputSpecError("stop here")

    monkeypatch.setattr(convert, "convert_vision_language", convert_vision_language)
    source = vlms.write("llava", tmp_path)
    for flags in ([], ["--weights-in-memory"]):
        result = CliRunner().invoke(main, ["convert", f"hf:{source}", "--max-cache-len", "16", "--out", str(tmp_path / "x"),
                                           *flags])
        assert result.exit_code == 2 and "stop here" in result.output
    assert seen == [True, False]


@pytest.mark.slow(reason="a streamed conversion through the console script, and its slice converted again to verify: "
                         "about a minute of CPU")
def test_cli_streams_and_verifies_a_slice_of_the_language_model(tmp_path):
    source = vlms.write("qwen2_vl", tmp_path)
    out = tmp_path / "vlm"
    assert "the first 1 of 2 layers (the vision tower, embeddings, norm and head included)" in cli_convert_streamed(source, out)
    model = load_model(_auto_class(), source)
    want = _reference_state(model)
    assert all(np.asarray(v).tobytes() == want[n].tobytes() for n, v in torch2jax.load(out).params.items())
