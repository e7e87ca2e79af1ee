"""Full fine-tuning picks the weights torch would train: the model's parameters, not its buffers.

A converted model's params hold both (state_dict names), and a floating buffer (rotary `inv_freq`, Gemma's
`embed_scale`) looks like a weight: trained, it would get a gradient and a weight decay that torch never gives it.
The converted graph knows which placeholders were nn.Parameters, so the choice is read from it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..errors import Torch2JaxError


class FullFinetuneError(Torch2JaxError, TypeError):
    """Full fine-tuning asked of something that is not a converted model."""


def parameter_names(model: Any) -> list[str]:
    """The params entries that were floating nn.Parameters of the torch module, in params order; a tied weight once,
    under the name the params keep it by (lm_head.weight tied to model.embed_tokens.weight: the latter)."""
    graph = getattr(model, "graph", None)
    if graph is None:
        raise FullFinetuneError("full fine-tuning needs a converted model (torch2jax.convert or torch2jax.load): its graph says "
                        "which params were nn.Parameters and which were buffers")
    kept = {graph.aliases.get(i.target, i.target) for i in graph.inputs if i.kind == "parameter" and i.target}
    return [name for name, value in model.params.items()
            if name in kept and jnp.issubdtype(jnp.result_type(value), jnp.floating)]


def model_parameters(model: Any) -> dict[str, jax.Array]:
    """{name: value} of parameter_names(model): the trainable dict for full_train_step (train.py), so buffers and
    integer tensors stay as converted, as they do in a torch training loop."""
    return {name: model.params[name] for name in parameter_names(model)}
