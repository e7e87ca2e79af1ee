"""save_merged: the merged params handed back as a Hugging Face model directory that transformers loads alone (no
missing or unexpected keys, tied embeddings re-tied), computing what the merged converted model and PEFT's
merge_and_unload of the same adapter compute."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers

import torch2jax
from tests.finetune.cases import TARGETS, peft_model
from tests.generate.lms import _COMMON, build_lm, write_tokenizer
from torch2jax.errors import Torch2JaxError
from torch2jax.finetune import LoraConfig, init_lora, merge, save_adapter, save_merged

# (architecture, tie_word_embeddings): GPT-2 ties its head and is Conv1D (fan_in_fan_out)
VARIANTS = {"llama-tied": ("llama", True), "llama-untied": ("llama", False), "gpt2": ("gpt2", True)}


def _lm(name: str, tie: bool) -> torch.nn.Module:
    if name == "gpt2":
        return build_lm("gpt2")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**_COMMON, "tie_word_embeddings": tie})).eval()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    """(its key in VARIANTS, source directory, its base LM, the converted model, LoraConfig, the adapter with random B, ids, mask)."""
    name, tie = VARIANTS[request.param]
    lm = _lm(name, tie)
    assert lm.config.tie_word_embeddings is tie
    source = tmp_path_factory.mktemp(request.param) / "base"
    lm.save_pretrained(source)
    write_tokenizer(source)
    lm.config.use_cache = False
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    model = torch2jax.convert(lm, (ids,), {"attention_mask": mask})
    assert ("lm_head.weight" in model.params) is not tie  # a tied head appears once in the params
    targets, fan_in_fan_out = TARGETS[name]
    config = LoraConfig(rank=4, alpha=8.0, targets=targets, fan_in_fan_out=fan_in_fan_out)
    rng = np.random.default_rng(2)
    lora = {k: rng.standard_normal(v.shape).astype(np.float32) * (0.05 if k.endswith("lora_B") else 1.0)
            for k, v in init_lora(model.params, config, jax.random.key(0)).items()}
    return request.param, source, lm, model, config, lora, ids, mask


def _logits(lm, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return lm(input_ids=ids, attention_mask=mask).logits.numpy()


def test_transformers_loads_the_merged_directory_and_it_equals_peft_merge_and_unload(variant, tmp_path):
    key, source, lm, model, config, lora, ids, mask = variant
    merged = merge(model.params, lora, config)
    out = save_merged(merged, source, tmp_path / "merged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no temporary sibling left
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text()) == json.loads((source / "config.json").read_text())

    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True, output_loading_info=True)
    loaded.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    if lm.config.tie_word_embeddings:
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    theirs = _logits(loaded, ids, mask)
    ours = np.asarray(model.apply(merged, ids.numpy(), attention_mask=mask.numpy())["logits"])
    kept = mask.numpy().astype(bool)  # padded positions' logits are not compared
    np.testing.assert_allclose(theirs[kept], ours[kept], rtol=1e-4, atol=1e-4)
    base = _logits(lm, ids, mask)
    assert np.abs(base[kept] - theirs[kept]).max() > 1e-3  # the adapter changes the logits: the comparison means something

    adapter = save_adapter(lora, config, tmp_path / "adapter")
    unloaded = peft_model(_lm(*VARIANTS[key]), adapter).merge_and_unload().eval()
    np.testing.assert_allclose(theirs[kept], _logits(unloaded, ids, mask)[kept], rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("variant", ["llama-tied"], indirect=True)
def test_bfloat16_params_and_the_dtype_cast(variant, tmp_path):
    key, source, lm, model, config, lora, ids, mask = variant
    merged = merge(model.params, lora, config)
    as_bf16 = {k: v.astype(jax.numpy.bfloat16) for k, v in merged.items()}
    for params, dtype in ((as_bf16, None), (merged, "bfloat16")):  # bf16 params as they are, or float32 ones cast
        out = save_merged(params, source, tmp_path / "bf16", dtype=dtype, force=True)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.bfloat16)
        name = "model.layers.0.self_attn.q_proj.weight"
        np.testing.assert_array_equal(loaded.state_dict()[name].float().numpy(), np.asarray(as_bf16[name], np.float32))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    out = save_merged(as_bf16, source, tmp_path / "f32", dtype="float32")
    from safetensors.numpy import load_file

    assert {str(v.dtype) for v in load_file(str(out / "model.safetensors")).values()} == {"float32"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("variant", ["llama-untied"], indirect=True)
def test_refuses_an_existing_directory_and_a_source_without_config(variant, tmp_path):
    key, source, lm, model, config, lora, ids, mask = variant
    out = save_merged(model.params, source, tmp_path / "merged")
    with pytest.raises(Torch2JaxError, match="already exists; pass force=True"):
        save_merged(model.params, source, out)
    save_merged(merge(model.params, lora, config), source, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]
    with pytest.raises(Torch2JaxError, match="has no config.json"):
        save_merged(model.params, tmp_path / "nowhere", tmp_path / "other")
    with pytest.raises(Torch2JaxError, match="lack .*lm_head.weight"):  # an untied head the params do not hold
        save_merged({k: v for k, v in model.params.items() if k != "lm_head.weight"}, source, tmp_path / "other")
    with pytest.raises(Torch2JaxError, match="dtype='int8'"):
        save_merged(model.params, source, tmp_path / "other", dtype="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]
