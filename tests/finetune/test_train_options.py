"""Training options: activation checkpointing changes memory, not values; bfloat16 compute keeps float32 master weights
(an update too small for bfloat16 is not rounded away) and its gradients follow torch's bfloat16 model; on a mesh of 8
devices (data 2 x model 4) the LoRA steps equal one device's with the projections split as load(mesh=) splits them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import torch

import torch2jax
from tests.generate.lms import build_lm
from tests.helpers import ROOT
from torch2jax.finetune import (
    LoraConfig,
    causal_lm_loss,
    full_train_step,
    init_lora,
    lora_train_step,
    make_batch,
    model_parameters,
    optimizer,
)
from torch2jax.finetune.train import master_weights

ROWS = [([5, 6, 7], [8, 9, 10, 11, 2]), ([], [12, 13, 14, 15, 16, 17, 2]), ([20], [21, 22, 2]), ([], [30, 31, 32, 2])]


def converted(dtype: str | None = None):
    lm = build_lm("llama")
    lm.config.use_cache = False
    batch = make_batch(ROWS, 10, 0)
    ids, mask = (torch.from_numpy(batch[k].astype(np.int64)) for k in ("input_ids", "attention_mask"))
    return lm, torch2jax.convert(lm, (ids,), {"attention_mask": mask}, dtype=dtype), batch


def test_remat_gives_the_same_steps():
    _, model, batch = converted()
    config = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    opt = optimizer("adamw", 1e-2)
    runs = []
    for remat in (False, True):
        lora = init_lora(model.params, config, jax.random.key(0))
        state = opt.init(lora)
        step, losses = lora_train_step(model, config, opt, remat=remat), []
        for _ in range(3):
            lora, state, loss = step(lora, state, batch)
            losses.append(float(loss))
        runs.append((losses, lora))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)
    for name in runs[0][1]:
        np.testing.assert_allclose(runs[0][1][name], runs[1][1][name], rtol=1e-5, atol=1e-7)
    full = model_parameters(model)
    plain, rematted = full_train_step(model, opt), full_train_step(model, opt, remat=True)
    a = plain(full, opt.init(full), batch)
    b = rematted(full, opt.init(full), batch)
    np.testing.assert_allclose(float(a[2]), float(b[2]), rtol=1e-6)


def test_bfloat16_compute_keeps_float32_master_weights():
    lm, model, batch = converted("bfloat16")
    assert model.params["model.layers.0.self_attn.q_proj.weight"].dtype == jnp.bfloat16
    masters = master_weights(model_parameters(model))
    assert all(v.dtype == jnp.float32 for v in masters.values())
    lr = 1e-6  # far below bfloat16's resolution for weights of ~0.02: a bfloat16 weight would not move
    step = full_train_step(model, optimizer("sgd", lr))
    trained, _, loss = step(masters, optimizer("sgd", lr).init(masters), batch)
    name = "model.layers.0.mlp.down_proj.weight"
    moved = np.asarray(trained[name]) != np.asarray(masters[name])
    assert moved.mean() > 0.5, "the float32 masters keep updates bfloat16 rounds away"

    # the gradient of the bfloat16 forward, against torch's bfloat16 model on the same batch
    torch_lm = lm.to(torch.bfloat16)
    out = torch_lm(**{k: torch.from_numpy(batch[k].astype(np.int64)) for k in ("input_ids", "attention_mask", "labels")})
    out.loss.backward()
    np.testing.assert_allclose(float(loss), out.loss.float().item(), rtol=2e-2)
    ours = jax.grad(lambda w: causal_lm_loss(model.apply({**model.params, name: w.astype(jnp.bfloat16)}, batch["input_ids"],
                                                         attention_mask=batch["attention_mask"])["logits"], batch["labels"]))(
        masters[name])
    theirs = dict(torch_lm.named_parameters())[name].grad.float().numpy()
    assert np.linalg.norm(np.asarray(ours) - theirs) / np.linalg.norm(theirs) < 0.05


MESH_SCRIPT = """
import numpy as np, jax, torch
from jax.sharding import AxisType, PartitionSpec as P
import torch2jax
from tests.generate.lms import build_lm
from torch2jax.finetune import LoraConfig, init_lora, lora_train_step, make_batch, optimizer
from torch2jax.finetune.mesh import place_on_mesh, shard_batch

rows = {rows!r}
lm = build_lm("llama"); lm.config.use_cache = False
batch = make_batch(rows, 10, 0)
ids, mask = (torch.from_numpy(batch[k].astype(np.int64)) for k in ("input_ids", "attention_mask"))
config = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
opt = optimizer("adamw", 1e-2)

def train(model, batch):
    lora = init_lora(model.params, config, jax.random.key(0)); state = opt.init(lora)
    step, losses = lora_train_step(model, config, opt), []
    for _ in range(3):
        lora, state, loss = step(lora, state, batch)
        losses.append(float(loss))
    return losses, lora

single = train(torch2jax.convert(lm, (ids,), {{"attention_mask": mask}}), batch)
model = torch2jax.convert(lm, (ids,), {{"attention_mask": mask}})
mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
plan = place_on_mesh(model, mesh)
assert model.params["model.layers.0.self_attn.q_proj.weight"].sharding.spec == P("model", None)
assert model.params["model.layers.0.self_attn.o_proj.weight"].sharding.spec == P(None, "model")
sharded = train(model, shard_batch(batch, mesh))
np.testing.assert_allclose(sharded[0], single[0], rtol=1e-5)
for name in single[1]:
    np.testing.assert_allclose(np.asarray(sharded[1][name]), np.asarray(single[1][name]), rtol=1e-4, atol=1e-6)
print("losses", sharded[0], "per device", plan.report().bytes_per_device, "of", plan.report().total_bytes)
"""


def test_lora_on_a_mesh_equals_one_device():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    env = {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(MESH_SCRIPT.format(rows=ROWS))], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "losses" in result.stdout
