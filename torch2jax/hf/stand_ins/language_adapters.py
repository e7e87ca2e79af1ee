"""X-MOD's per-language adapters, written with static shapes for torch.export.

transformers' XmodOutput.lang_adapter gathers each language's tokens with a boolean mask (`hidden_states[lang_ids ==
i]`), runs that language's adapter over them and scatters the result back: every shape there depends on the language
ids' values, which torch.export cannot capture ("data-dependent shape"). Its stand-in runs every adapter over every
token and keeps, per token, the output of its own language's adapter (`torch.where`): each adapter is two linear
layers and an activation applied token by token, so every kept value is the one transformers computes, at (languages)
times the adapters' FLOPs. A token whose language matches no adapter gets zeros, as in transformers.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards


def xmod_language_adapter(self: Any, lang_ids: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' XmodOutput.lang_adapter, every adapter run densely and selected by the token's language."""
    if not self.ln_before_adapter:
        residual = hidden_states
    if self.adapter_layer_norm is not None:
        hidden_states = self.adapter_layer_norm(hidden_states)
    elif self.adapter_reuse_layer_norm:
        hidden_states = self.LayerNorm(hidden_states)
    if self.ln_before_adapter:
        residual = hidden_states
    # lang_ids index hidden_states' leading dims ([batch], or [batch, tokens]): widen to broadcast over the rest
    languages = lang_ids.reshape(*lang_ids.shape, *[1] * (hidden_states.dim() - lang_ids.dim()))
    adapted = torch.zeros_like(hidden_states)
    for index, adapter in enumerate(self.adapter_modules.values()):
        adapted = torch.where(languages == index, adapter(hidden_states), adapted)
    return self.dropout(adapted) + residual


trace_forwards.register("transformers.models.xmod.modeling_xmod.XmodOutput", xmod_language_adapter,
                        method="lang_adapter")
