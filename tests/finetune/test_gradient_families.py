"""LoRA and full fine-tuning gradients through converted models of more families equal torch autograd's: LoRA through
PEFT (Qwen2, Gemma with its tied head and scaled embeddings, Mixtral's mixture of experts, LLaVA's whole forward with
pixels), full fine-tuning through transformers' own `labels=` loss (Llama, GPT-2, Qwen2, Gemma, Mixtral); and targets
LoRA cannot adapt as PEFT does (a tied head, an embedding table) refused by name."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np
import peft
import pytest
import torch

import torch2jax
from tests.finetune.cases import lora_layers
from tests.generate.lms import build_lm
from torch2jax.finetune import LoraConfig, apply_fn, causal_lm_loss, init_lora, model_parameters, targeted_modules
from torch2jax.finetune.lora import LoraError

TOLERANCE = 1e-4  # relative, per tensor, float32
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# family -> LoRA targets. Mixtral: attention only -- its experts are 3-D stacks (transformers 5's fused
# MixtralExperts.gate_up_proj / down_proj), which PEFT reaches only through target_parameters (ParamWrapper) and
# LoraConfig here does not; its router is a plain parameter of MixtralTopKRouter, not an nn.Linear PEFT can wrap.
LORA_TARGETS = {"qwen2": ATTENTION, "gemma": ATTENTION + ("gate_proj", "up_proj", "down_proj"), "mixtral": ATTENTION,
                "llava": ("q_proj", "v_proj")}
FULL = ("llama", "gpt2", "qwen2", "gemma", "mixtral", "llava")


@dataclass
class Converted:
    lm: torch.nn.Module
    model: torch2jax.Model
    inputs: dict  # numpy, as the converted model takes them (input_ids first)
    labels: np.ndarray


def _labels(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[0, -8:-6] = -100  # a prompt not trained on
    return labels


@functools.cache
def converted(name: str) -> Converted:
    """The tiny model, converted once per session: batch 2, the second row left-padded by 3."""
    if name == "llava":  # CLIP tower, 16 image tokens a 32x32 image, a Llama text model
        from tests.hf.vlms import IMAGE, build

        lm, _ = build("llava")
        gen = torch.Generator().manual_seed(1)
        text = torch.randint(7, 128, (2, 11), generator=gen)
        ids = torch.cat([text[:, :3], torch.full((2, 16), IMAGE), text[:, 3:]], 1)
        ids[1, :3] = 0
        extra = {"pixel_values": torch.randn(2, 3, 32, 32, generator=gen)}
    else:
        lm = build_lm(name)
        ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
        ids[1, :3] = 0
        extra = {}
    lm.config.use_cache = False
    mask = (torch.arange(ids.shape[1]) >= torch.tensor([[0], [3]])).long()
    labels = _labels(ids, mask)
    if name == "llava":
        labels[ids == IMAGE] = -100
    model = torch2jax.convert(lm, (ids,), {"attention_mask": mask, **extra})
    inputs = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), **{k: v.numpy() for k, v in extra.items()}}
    return Converted(lm, model, inputs, labels.numpy())


def relative_error(ours, theirs) -> float:
    return float(np.linalg.norm(np.asarray(ours) - theirs) / np.linalg.norm(theirs))


def torch_inputs(c: Converted) -> dict:
    return {k: torch.from_numpy(v) for k, v in c.inputs.items()} | {"labels": torch.from_numpy(c.labels)}


def jax_loss(c: Converted, params: dict) -> jax.Array:
    inputs = dict(c.inputs)
    ids = inputs.pop("input_ids")
    return causal_lm_loss(c.model.apply(params, ids, **inputs)["logits"], c.labels)


# LLaVA with the slow tests: its language part trains against PEFT by default in test_finetune_cli.py
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n == "llava" else []) for n in sorted(LORA_TARGETS)])
def test_lora_gradients_equal_peft(name):
    c = converted(name)
    config = LoraConfig(rank=4, alpha=8.0, targets=LORA_TARGETS[name])
    lora = init_lora(c.model.params, config, jax.random.key(0))
    rng = np.random.default_rng(2)  # B nonzero, so A's gradient is not zero
    lora = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.05 if k.endswith("lora_B") else np.asarray(v)
            for k, v in lora.items()}
    fn = apply_fn(c.model, config)
    inputs = dict(c.inputs)
    ids = inputs.pop("input_ids")
    ours_loss, ours = jax.value_and_grad(
        lambda a: causal_lm_loss(fn(a, c.model.params, ids, **inputs)["logits"], c.labels))(lora)

    pm = peft.get_peft_model(c.lm, peft.LoraConfig(r=4, lora_alpha=8.0, target_modules=list(config.targets), lora_dropout=0.0))
    try:
        layers = lora_layers(pm)
        assert sorted(layers) == sorted(targeted_modules(c.model.params, config))
        with torch.no_grad():
            for module, layer in layers.items():
                layer.lora_A["default"].weight.copy_(torch.tensor(lora[module + ".lora_A"]))
                layer.lora_B["default"].weight.copy_(torch.tensor(lora[module + ".lora_B"]))
        out = pm(**torch_inputs(c))
        out.loss.backward()
        # a weight autograd never reached has no .grad: zeros
        theirs = {f"{m}.{half}": np.zeros(w.shape, np.float32) if w.grad is None else w.grad.numpy()
                  for m, layer in layers.items() for half in ("lora_A", "lora_B") for w in [getattr(layer, half)["default"].weight]}
    finally:
        pm.unload()  # the cached model back to its own layers

    np.testing.assert_allclose(float(ours_loss), out.loss.item(), rtol=1e-5)
    assert set(ours) == set(theirs)
    for key, grad in theirs.items():
        # LLaVA reads the tower's second-to-last layer (vision_feature_layer=-2): its last layer feeds nothing
        unused = name == "llava" and key.startswith("model.vision_tower.encoder.layers.1.")
        if unused:
            assert not np.any(grad) and not np.any(np.asarray(ours[key])), key
            continue
        assert np.abs(grad).max() > 0, f"{key}: a zero gradient proves nothing"
        assert relative_error(ours[key], grad) < TOLERANCE, f"{key}: {relative_error(ours[key], grad):.2e}"
    if name == "llava":  # the adapters on the vision tower and on the text model both got their gradient
        assert any(k.startswith("model.vision_tower.") and np.any(g) for k, g in theirs.items())
        assert any(k.startswith("model.language_model.") for k in theirs)


@pytest.mark.parametrize("name", FULL)
def test_full_gradients_equal_torch_autograd(name):
    c = converted(name)
    trainable = model_parameters(c.model)
    frozen = {k: v for k, v in c.model.params.items() if k not in trainable}
    ours_loss, ours = jax.value_and_grad(lambda t: jax_loss(c, {**frozen, **t}))(trainable)

    for p in c.lm.parameters():
        p.requires_grad_(True)  # PEFT (an earlier test) froze them
        p.grad = None
    out = c.lm(**torch_inputs(c))
    out.loss.backward()
    # every name, tied ones too: a tied weight is one tensor, its .grad the sum over its uses
    theirs = {n: p.grad for n, p in c.lm.named_parameters(remove_duplicate=False)}

    np.testing.assert_allclose(float(ours_loss), out.loss.item(), rtol=1e-5)
    # the trainable entries are torch's parameters, each tensor once, and no buffer (rotary inv_freq, embed_scale)
    assert len(trainable) == len(list(c.lm.parameters()))
    assert set(trainable) <= set(theirs)
    assert not set(trainable) & {n for n, _ in c.lm.named_buffers()}
    if name in ("gpt2", "gemma"):  # tied heads: the params keep the embedding's name, whose grad sums both uses
        assert set(c.model.graph.aliases) == {"lm_head.weight"} and "lm_head.weight" not in trainable
    for key, grad in ours.items():
        if name == "llava" and key.startswith(UNUSED_BY_LLAVA):  # the tower's features are its second-to-last layer's
            assert theirs[key] is None and not np.abs(np.asarray(grad)).max(), key  # torch: no gradient at all
            continue
        expected = theirs[key].numpy()
        if name == "llava" and key.startswith("model.vision_tower.") and key.endswith("k_proj.bias"):
            # no rotary positions in CLIP: a key bias adds the same to every key's score, which softmax ignores, so
            # both gradients are rounding noise
            assert np.abs(expected).max() < 1e-8 and np.abs(np.asarray(grad)).max() < 1e-8, key
            continue
        assert np.abs(expected).max() > 0, f"{key}: a zero gradient proves nothing"
        assert relative_error(grad, expected) < TOLERANCE, f"{key}: {relative_error(grad, expected):.2e}"


UNUSED_BY_LLAVA = ("model.vision_tower.encoder.layers.1.", "model.vision_tower.post_layernorm.")


def test_a_full_step_on_model_parameters_is_torchs_sgd_step():
    """full_train_step over model_parameters: one SGD step with weight decay moves each torch parameter as
    torch.optim.SGD does, and leaves the buffers (Gemma's embed_scale, rotary inv_freq) as converted."""
    import copy

    from torch2jax.finetune.train import full_train_step, optimizer

    c = converted("gemma")
    opt = optimizer("sgd", 0.1, weight_decay=0.01)
    trainable = model_parameters(c.model)
    batch = {k: c.inputs[k] for k in ("input_ids", "attention_mask")} | {"labels": c.labels}
    after, _, loss = full_train_step(c.model, opt)(trainable, opt.init(trainable), batch)
    assert set(after) == set(trainable)

    lm = copy.deepcopy(c.lm)
    for p in lm.parameters():
        p.requires_grad_(True)
    torch_opt = torch.optim.SGD(lm.parameters(), lr=0.1, weight_decay=0.01)
    out = lm(**torch_inputs(c))
    out.loss.backward()
    torch_opt.step()
    np.testing.assert_allclose(float(loss), out.loss.item(), rtol=1e-5)
    moved = dict(lm.named_parameters())
    for key, value in after.items():
        step_theirs = moved[key].detach().numpy() - np.asarray(trainable[key])
        step_ours = np.asarray(value) - np.asarray(trainable[key])
        assert relative_error(step_ours, step_theirs) < TOLERANCE, key

def test_peft_adapts_a_tied_head_alone():
    """Why a tied target is refused: PEFT (the installed one) wraps lm_head only and the input embedding stays as it
    was, which no delta merged into the one shared weight can reproduce."""
    lm = build_lm("gemma")
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        embedded = lm.get_input_embeddings()(ids)
    with pytest.warns(UserWarning, match="tie_word_embeddings"):
        pm = peft.get_peft_model(lm, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    layers = lora_layers(pm)
    assert sorted(layers) == ["lm_head"]
    with torch.no_grad():
        layers["lm_head"].lora_B["default"].weight.normal_()
        assert torch.equal(pm.get_input_embeddings()(ids), embedded)
        base = layers["lm_head"].base_layer(torch.ones(1, 64))
        assert not torch.allclose(layers["lm_head"](torch.ones(1, 64)), base)
    pm.unload()


@pytest.mark.parametrize(("name", "target", "why"), [
    ("gemma", "lm_head", "tied"),
    ("gemma", "embed_tokens", "tied"),
    ("gpt2", "wte", "tied"),
    ("llama", "embed_tokens", "embedding table"),
])
def test_tied_and_embedding_targets_are_refused_with_the_fix(name, target, why):
    c = converted(name)
    config = LoraConfig(rank=4, alpha=8.0, targets=(target,), fan_in_fan_out=name == "gpt2")
    with pytest.raises(LoraError, match=why) as error:
        apply_fn(c.model, config)
    assert "drop" in str(error.value).lower() and repr(target) in str(error.value)


def test_a_tied_head_or_expert_stack_that_init_cannot_find_says_why():
    """init_lora sees the params alone: a tied head is not in them under its own name, an expert stack is 3-D."""
    with pytest.raises(LoraError, match="tie_word_embeddings = False"):
        init_lora(converted("gemma").model.params, LoraConfig(rank=4, alpha=8, targets=("lm_head",)), jax.random.key(0))
    with pytest.raises(LoraError, match="3-D parameter.*target_parameters"):
        init_lora(converted("mixtral").model.params, LoraConfig(rank=4, alpha=8, targets=("gate_up_proj",)), jax.random.key(0))


@pytest.mark.parametrize("padding_idx", [0, 3, None])
def test_embedding_padding_row_gets_no_gradient(padding_idx):
    """torch's embedding backward skips the padding row (nn.Embedding(padding_idx=)); the lowering's gradient too."""
    table = torch.nn.Embedding(8, 4, padding_idx=padding_idx)
    ids = torch.tensor([[0, 3, 3, 5], [3, 0, 1, 1]])
    model = torch2jax.convert(table, (ids,))
    (table(ids) ** 2).sum().backward()
    ours = jax.grad(lambda p: (model.apply(p, ids.numpy()) ** 2).sum())(model.params)["weight"]
    np.testing.assert_allclose(np.asarray(ours), table.weight.grad.numpy(), rtol=1e-6)
    if padding_idx is not None:
        assert not np.any(np.asarray(ours)[padding_idx]) and np.any(np.asarray(ours))
