"""jax.grad through a converted model matches torch.autograd, for params and for float inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax

from .helpers import max_err


def _loss_jax(out):
    leaves = [leaf for leaf in jax.tree.leaves(out) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return sum(jnp.sum(jnp.sin(leaf) * leaf) for leaf in leaves)


def _loss_torch(out):
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.sin() * t).sum() for t in leaves)


def _floating(params: dict) -> dict:
    """The trainable part: buffers such as BatchNorm's int num_batches_tracked have no gradient."""
    return {k: v for k, v in params.items() if jnp.issubdtype(v.dtype, jnp.floating)}


def _check_grads(module, model, args, rel=1e-4):
    float_inputs = [i for i, a in enumerate(args) if a.is_floating_point()]

    def loss(trainable, *xs):
        return _loss_jax(model.apply({**model.params, **trainable}, *xs))

    argnums = (0, *[i + 1 for i in float_inputs])
    grads = jax.grad(loss, argnums=argnums)(_floating(model.params), *[a.numpy() for a in args])
    torch_args = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    module.zero_grad()
    _loss_torch(module(*torch_args)).backward()
    for name, param in module.named_parameters():
        if name not in grads[0]:
            continue  # a tied alias: its gradient sits under the name that is kept
        scale = max(float(param.grad.abs().max()), 1e-3)
        assert max_err(grads[0][name], param.grad) <= rel * scale + 1e-6, name
    for grad, index in zip(grads[1:], float_inputs):
        scale = max(float(torch_args[index].grad.abs().max()), 1e-3)
        assert max_err(grad, torch_args[index].grad) <= rel * scale + 1e-6


@pytest.mark.parametrize("name", ["mlp", "cnn", "tiny_gpt"])
def test_sample_model_grads_match_torch(converted, name):
    module, args, model = converted(name)
    _check_grads(module, model, args)


def test_transformers_gpt2_grads_match_torch():
    from .models.zoo import gpt2

    torch.manual_seed(0)
    case = gpt2()
    module = case.module.eval()
    model = torch2jax.convert(module, case.args, case.kwargs)
    _check_grads(module, model, case.args)


def test_grads_through_the_loaded_artifact_match_the_in_memory_model(saved, converted):
    _, args, model = converted("cnn")
    loaded = torch2jax.load(saved("cnn"))
    x = args[0].numpy()
    g_mem = jax.grad(lambda p: _loss_jax(model.apply({**model.params, **p}, x)))(_floating(model.params))
    g_art = jax.grad(lambda p: _loss_jax(loaded.apply({**loaded.params, **p}, x)))(_floating(loaded.params))
    for name in g_mem:
        np.testing.assert_allclose(g_art[name], g_mem[name], rtol=1e-5, atol=1e-6)
