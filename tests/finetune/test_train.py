"""The LoRA training step: SGD and AdamW trajectories equal PEFT + torch.optim's step for step, gradient accumulation
equals the whole batch, and make_batch's labels and mask."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
import peft
import pytest
import torch

import torch2jax
from tests.finetune.cases import lora_layers, peft_config
from tests.generate.lms import build_lm
from torch2jax.finetune import LoraConfig, init_lora, lora_train_step, make_batch, optimizer
from torch2jax.finetune.lora import LoraError

MAX_LENGTH, PAD = 8, 0
# (prompt, completion): a prompt not trained on, a plain text row, one truncated to MAX_LENGTH, a short one padded;
# the two halves of the batch train on 10 and 8 tokens, so accumulation must weight by tokens, not by micro-batch
ROWS = [([5, 6, 7], [8, 9, 10, 11, 12]), ([], [20, 21, 22, 23, 24, 25]), ([30, 31, 32], [33]),
        ([40, 41, 42, 43], [44, 45, 46, 47, 48, 49])]
STEPS = 4


@dataclass
class Llama:
    lm: torch.nn.Module
    model: torch2jax.Model
    config: LoraConfig
    lora: dict  # init_lora's, B small random values so both A and B move
    batch: dict


@pytest.fixture(scope="module")
def llama() -> Llama:
    lm = build_lm("llama")
    lm.config.use_cache = False
    batch = make_batch(ROWS, MAX_LENGTH, PAD)
    ids, mask = torch.from_numpy(batch["input_ids"]).long(), torch.from_numpy(batch["attention_mask"]).long()
    model = torch2jax.convert(lm, (ids,), {"attention_mask": mask},
                              dynamic_shapes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}})
    config = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    lora = init_lora(model.params, config, jax.random.key(0))
    rng = np.random.default_rng(2)
    lora = {k: (rng.standard_normal(v.shape).astype(np.float32) * 0.05 if k.endswith("lora_B") else np.asarray(v))
            for k, v in lora.items()}
    return Llama(lm, model, config, lora, batch)


def relative_error(ours, theirs) -> float:
    return float(np.linalg.norm(np.asarray(ours) - theirs) / np.linalg.norm(theirs))


def torch_trajectory(llama: Llama, name: str, lr: float) -> tuple[list[float], dict]:
    """PEFT's adapters with llama.lora copied in, trained STEPS steps by torch.optim with torch's defaults."""
    pm = peft.get_peft_model(llama.lm, peft_config(llama.config)).eval()
    layers = lora_layers(pm)
    with torch.no_grad():
        for module, layer in layers.items():
            layer.lora_A["default"].weight.copy_(torch.tensor(llama.lora[module + ".lora_A"]))
            layer.lora_B["default"].weight.copy_(torch.tensor(llama.lora[module + ".lora_B"]))
    trained = [p for p in pm.parameters() if p.requires_grad]
    assert len(trained) == 2 * len(layers)  # the adapters alone
    opt = torch.optim.SGD(trained, lr=lr) if name == "sgd" else torch.optim.AdamW(trained, lr=lr)
    inputs = {k: torch.from_numpy(v).long() for k, v in llama.batch.items()}
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = pm(**inputs).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = {f"{module}.{half}": getattr(layer, half)["default"].weight.detach().numpy().copy()
             for module, layer in layers.items() for half in ("lora_A", "lora_B")}
    pm.unload()  # the module-scoped lm back to its own layers
    return losses, final


def jax_trajectory(llama: Llama, opt, accumulate: int = 1, steps: int = STEPS) -> tuple[list[float], dict]:
    step = lora_train_step(llama.model, llama.config, opt, accumulate=accumulate)
    lora, opt_state, losses = llama.lora, opt.init(llama.lora), []
    for _ in range(steps):
        lora, opt_state, loss = step(lora, opt_state, llama.batch)
        losses.append(float(loss))
    return losses, {k: np.asarray(v) for k, v in lora.items()}


@pytest.mark.parametrize(("name", "lr"), [("sgd", 0.1), ("adamw", 1e-2)])
def test_trajectory_equals_peft_and_torch_optim(llama, name, lr):
    theirs_losses, theirs = torch_trajectory(llama, name, lr)
    ours_losses, ours = jax_trajectory(llama, optimizer(name, lr))
    np.testing.assert_allclose(ours_losses, theirs_losses, rtol=1e-4)
    assert theirs_losses[-1] < theirs_losses[0]
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert relative_error(value - llama.lora[key], llama.lora[key]) > 1e-3, f"{key} did not move"
        assert relative_error(ours[key], value) < 1e-4, key


@pytest.mark.parametrize("accumulate", [2, 4])
def test_accumulation_equals_the_whole_batch(llama, accumulate):
    opt = optimizer("adamw", 1e-2)
    whole_losses, whole = jax_trajectory(llama, opt, steps=2)
    micro_losses, micro = jax_trajectory(llama, opt, accumulate=accumulate, steps=2)
    np.testing.assert_allclose(micro_losses, whole_losses, rtol=1e-5)
    for key, value in whole.items():
        assert relative_error(micro[key], value) < 1e-5, key


def test_accumulation_must_divide_the_rows(llama):
    with pytest.raises(LoraError, match="accumulate=3 does not divide the batch's 4 rows"):
        jax_trajectory(llama, optimizer("sgd", 0.1), accumulate=3, steps=1)
    with pytest.raises(LoraError, match="accumulate must be an integer >= 1"):
        lora_train_step(llama.model, llama.config, optimizer("sgd", 0.1), accumulate=0)


def test_make_batch_masks_the_prompt_and_the_padding():
    rows = [([5, 6], [7, 8]), ([], [9, 10, 11]), ([1, 2, 3], [4, 5, 6])]
    batch = make_batch(rows, max_length=5, pad_id=0)
    # by the specification: prompt + completion truncated to 5, right-padded with 0; mask 1 on tokens;
    # labels -100 on the prompt and the padding, the token elsewhere
    x = -100
    np.testing.assert_array_equal(batch["input_ids"], [[5, 6, 7, 8, 0], [9, 10, 11, 0, 0], [1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch["labels"], [[x, x, 7, 8, x], [9, 10, 11, x, x], [x, x, x, 4, 5]])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(v.shape == (3, 5) for v in batch.values())
    # a prompt longer than max_length leaves nothing to train on in that row
    np.testing.assert_array_equal(make_batch([([1, 2, 3], [4])], 2, pad_id=7)["labels"], [[x, x]])
    with pytest.raises(LoraError, match="row 0 has no tokens"):
        make_batch([([], [])], 4, pad_id=0)


def test_unknown_optimizer_names_the_choices():
    with pytest.raises(LoraError, match=r"optimizer 'rmsprop' is not supported: choose one of \['adamw', 'sgd'\]"):
        optimizer("rmsprop", 1e-3)


def test_adamw_defaults_are_torchs():
    """optax.adamw's own default decay is 1e-4; ours is torch's 0.01, with eps 1e-8 outside the square root."""
    param = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    opt = torch.optim.AdamW([param], lr=0.1)
    ours_opt = optimizer("adamw", 0.1)
    ours = {"p": np.array([0.5, -1.0, 2.0], np.float32)}
    state = ours_opt.init(ours)
    import optax

    for grad in ([1e-9, 3.0, -2e-8], [2e-9, -1.0, 1e-8]):
        param.grad = torch.tensor(grad)
        opt.step()
        updates, state = ours_opt.update({"p": np.array(grad, np.float32)}, state, ours)
        ours = optax.apply_updates(ours, updates)
        np.testing.assert_allclose(np.asarray(ours["p"]), param.detach().numpy(), rtol=1e-6)
