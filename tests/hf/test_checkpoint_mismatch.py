"""A checkpoint that does not hold every weight of its model is refused by the Python call as by the CLI: transformers
would fill a missing, misnamed or (told to go on) wrongly shaped tensor with a fresh random initialization, so the
artifact would silently hold random weights."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

import torch2jax
from torch2jax.errors import InputSpecError

from ..generate.lms import write_lm

UP = "model.layers.1.mlp.up_proj.weight"


def _missing(state):
    state.pop(UP)


def _misnamed(state):
    state["model.layers.1.mlp.upproj.weight"] = state.pop(UP)


def _wrong_shape(state):
    state[UP] = state[UP][:32].clone()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_lm("llama", tmp_path_factory.mktemp("mismatch"))


@pytest.mark.parametrize("edit, says", [
    (_missing, {False: f"1 param(s) have no tensor in the checkpoint: {UP}", True: f"1 param(s) have no tensor in the checkpoint: {UP}"}),
    (_misnamed, {False: "checkpoint tensors no param took: model.layers.1.mlp.upproj.weight",
                 True: "checkpoint tensors no param took: model.layers.1.mlp.upproj.weight"}),
    (_wrong_shape, {False: f"{UP}: the checkpoint has [32, 64], the model [128, 64]",
                    True: f"{UP}: the module has float32[128, 64], checkpoint tensor {UP} is float32[32, 64]"}),
])
@pytest.mark.parametrize("stream", [False, True], ids=["in-memory", "streamed"])
def test_convert_hf_refuses_a_checkpoint_without_every_weight(good, tmp_path, edit, says, stream):
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    state = load_file(str(broken / "model.safetensors"))
    edit(state)
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputSpecError) as caught:
        generator = torch2jax.convert_hf(broken, max_cache_len=16, max_batch=2, stream_weights=stream)
        torch2jax.save(generator, tmp_path / "out")  # a streamed conversion reads the weights only here
    assert says[stream] in str(caught.value)
    assert not (tmp_path / "out").exists()
