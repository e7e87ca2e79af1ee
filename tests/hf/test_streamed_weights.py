"""Converting an hf: directory without materializing its weights: the params are fake while exporting and the
safetensors tensors are streamed into the checkpoint. The saved params must equal, bit for bit, what the
in-memory conversion saves (transformers' from_pretrained state), whatever the checkpoint's naming."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.capture.checkpoint_files import Checkpoint, write
from torch2jax.capture.fake_params import is_fake
from torch2jax.errors import InputSpecError
from torch2jax.hf.options import GenerationOptions
from torch2jax.hf.source import load_generation_model, resolve_source
from torch2jax.hf.streamed import fake_causal_lm
from torch2jax.hf.verify_slice import verify_streamed

from ..generate.lms import load_lm, write_lm
from ..helpers import cli, cli_convert_streamed


def _streamed(source, out):
    torch2jax.save(torch2jax.convert_hf(source, max_cache_len=16, max_batch=2, stream_weights=True), out)
    return torch2jax.load(out)


def _assert_bitwise(loaded: dict, want: dict) -> None:
    assert set(loaded) == set(want)
    for name, value in want.items():
        got = np.asarray(loaded[name])
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name


def _transformers_params(lm, aliases: dict) -> dict:
    """What the in-memory conversion saves: from_pretrained's tensors (tied ones once), as JAX carries them."""
    from torch2jax.capture.torch_arrays import to_jax

    state = {**lm.state_dict(), **dict(lm.named_buffers())}
    return {name: np.asarray(to_jax(t)) for name, t in state.items() if name not in aliases}


def test_llama_streamed_equals_in_memory(tmp_path):
    source = write_lm("llama", tmp_path)
    torch2jax.save(torch2jax.convert_hf(source, max_cache_len=16, max_batch=2), tmp_path / "in-memory")
    lm, _ = fake_causal_lm(source)
    assert all(is_fake(p) for p in lm.parameters()) and not any(is_fake(b) for b in lm.buffers())
    in_memory = torch2jax.load(tmp_path / "in-memory").params
    streamed = _streamed(source, tmp_path / "streamed")
    _assert_bitwise(streamed.params, {k: np.asarray(v) for k, v in in_memory.items()})


@pytest.mark.parametrize("name", ["mixtral", "gemma"])
def test_renamed_fused_and_tied_weights(tmp_path, name):
    """Mixtral: the file has transformers' legacy per-expert names, fused into stacked experts while streaming.
    Gemma: lm_head is tied to the embedding, absent from the file and kept once."""
    source = write_lm(name, tmp_path)
    stored = Checkpoint.open(source).entries
    if name == "mixtral":
        assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in stored
    else:
        assert "lm_head.weight" not in stored
    g = _streamed(source, tmp_path / "out")
    aliases = g.manifest["params"]["aliases"]
    assert (aliases == {"lm_head.weight": "model.embed_tokens.weight"}) == (name == "gemma")
    _assert_bitwise(g.params, _transformers_params(load_lm(source), aliases))


def test_bfloat16_sharded_checkpoint(tmp_path):
    source = tmp_path / "llama-bf16"
    torch.manual_seed(0)
    load_lm(write_lm("llama", tmp_path), torch.bfloat16).save_pretrained(source, max_shard_size="40KB")
    index = json.loads((source / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    g = _streamed(source, tmp_path / "out")
    reference = load_lm(source, torch.bfloat16)
    _assert_bitwise(g.params, _transformers_params(reference, {}))
    assert np.asarray(g.params["model.norm.weight"]).dtype.name == "bfloat16"


def _edited(tmp_path, change) -> str:
    """The llama directory with its safetensors file rewritten by `change(tensors)`."""
    source = write_lm("llama", tmp_path)
    checkpoint = Checkpoint.open(source)
    tensors = {name: checkpoint.read(name) for name in checkpoint.entries}
    change(tensors)
    (source / "model.safetensors").unlink()
    write(source / "model.safetensors", tensors)
    return str(source)


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "no tensor in the checkpoint: model.layers.1.mlp.up_proj.weight"),
    (lambda t: t.update({"model.layers.1.mlp.upp_proj.weight": t.pop("model.layers.1.mlp.up_proj.weight")}),
     "checkpoint tensors no param took: model.layers.1.mlp.upp_proj.weight"),
    (lambda t: t.update({"model.norm.weight": np.ones(8, np.float32)}),
     "model.norm.weight: the module has float32[64], checkpoint tensor model.norm.weight is float32[8]"),
    (lambda t: t.update({"model.norm.weight": t["model.norm.weight"].astype(np.float16)}),
     "model.norm.weight: the module has float32[64], checkpoint tensor model.norm.weight is float16[64]"),
])
def test_a_wrong_checkpoint_names_the_tensor_and_writes_nothing(tmp_path, change, expected):
    source = _edited(tmp_path, change)
    with pytest.raises(InputSpecError, match="the checkpoint does not match the model") as err:
        torch2jax.convert_hf(source, max_cache_len=16, max_batch=2, stream_weights=True)
    assert expected in str(err.value)
    if "no tensor" not in expected:
        return  # the console script's exit code and message: once
    out = tmp_path / "out"
    result = cli("convert", f"hf:{source}", "--max-cache-len", "16", "--max-batch", "2", "--out", str(out))
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_cli_streams_by_default_and_says_what_it_verified(tmp_path):
    source = write_lm("llama", tmp_path)
    out = tmp_path / "llm"
    cli_convert_streamed(source, out)
    _assert_bitwise(torch2jax.load(out).params, _transformers_params(load_lm(source), {}))
    whole = verify_streamed(load_generation_model(resolve_source(source)), out, GenerationOptions(), layers=2, tokens=4)
    assert whole.startswith("verified against transformers (the whole model, 2 layers)")


@pytest.mark.slow  # the console script on a 10-layer model (~95 s); repetition is checked in Python in tests/hf/test_layer_repeat.py
def test_a_deep_model_converts_by_repetition_and_its_slice_is_verified_the_same_way(tmp_path):
    source = write_lm("llama", tmp_path, layers=10)
    out = tmp_path / "llm"
    result = cli("convert", f"hf:{source}", "--max-cache-len", "32", "--max-batch", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "torch.export of 3 of the 10 layers" in result.stderr and "[repeat]" in result.stderr
    assert "the first 5 of 10 layers" in result.stdout and "(its middle layers repeated, as for the whole model)" in result.stdout
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout


def test_trace_all_layers_reaches_the_step_capture(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from torch2jax.cli.main import main

    from torch2jax.hf.steps import causal_lm as decoder

    seen = []

    def capture_step(lm, layout, max_batch, timer, repeat=True):
        seen.append(repeat)
        raise InputSpecError("stop here")

    monkeypatch.setattr(decoder, "capture_step", capture_step)
    source = write_lm("llama", tmp_path)
    for flags in ([], ["--trace-all-layers"], ["--trace-all-layers", "--weights-in-memory"]):
        result = CliRunner().invoke(main, ["convert", f"hf:{source}", "--max-cache-len", "16", "--out", str(tmp_path / "x"), *flags])
        assert result.exit_code == 2 and "stop here" in result.output
    assert seen == [True, False, False]


@pytest.mark.slow  # a second streamed conversion (~60 s); streaming is verified in float32 above
def test_a_streamed_conversion_to_bfloat16_is_verified_against_transformers_in_bfloat16(tmp_path):
    """--dtype with streamed weights: the fake-parameter model is cast without torch's `.to` (which cannot swap a fake
    parameter) and the files' tensors are converted as they are read."""
    source = write_lm("llama", tmp_path)
    out = tmp_path / "bf16"
    # --seed 1: seed 0's prompts meet a near-tie at the 4th token (float32 top-2 logits 0.3148 / 0.3143, equal in
    # bfloat16), where our bfloat16 picks float32's token and transformers' bfloat16 the other one
    result = cli("convert", f"hf:{source}", "--dtype", "bfloat16", "--max-cache-len", "32", "--max-batch", "2",
                 "--platforms", "cpu", "--seed", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "weights streamed from the safetensors files" in result.stdout
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate (bfloat16: the first 8 must be)" in result.stdout
    tree = json.loads((out / "manifest.json").read_text())["params"]["tree"]
    assert {spec["dtype"] for spec in tree.values()} == {"bfloat16"}
