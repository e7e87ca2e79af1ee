"""Causal LMs whose transformers forward does not fit the causal-LM step's one cache of attention layers, written from
slot 0 one slot per token (hf/steps/causal_lm.py): over the step's cache their stand-ins refuse with the model's own
reason, which torch.export's failure further on ("The size of tensor a (s70) must match ...", "Could not guard on
data-dependent expression Eq(u0, N)") does not name. Without the step's cache (a plain conversion) each model's own
forward runs."""

from __future__ import annotations

from typing import Any

from ...capture import trace_forwards
from ...errors import ExportError
from ..steps.kv_cache import step_layer

_MODELS = "transformers.models"


def _over_step_cache(args: tuple, kwargs: dict) -> bool:
    """Whether the forward was called with the converted step's cache (its layers are the step's own)."""
    return any(step_layer(value, 0) is not None for value in (*args, *kwargs.values()))


def cpmant_model(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' CpmAntModel.forward, refused over the step's cache."""
    if _over_step_cache(args, kwargs):
        raise ExportError(
            f"CPM-Ant prepends its {self.prompt_length} prompt tokens to every call's input_ids, which hold the whole "
            "sequence at each step (its forward cuts the cached part off itself and masks padding by counting the "
            "nonzero ids), and its prompt attends to every token, later ones included: its cache holds those prompt "
            "slots before the text, which the step's cache (one slot per token, from slot 0) has no room for, so "
            "CpmAntForCausalLM cannot generate yet.")
    return type(self).forward(self, *args, **kwargs)


def blt_model(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' BltModel.forward, refused over the step's cache."""
    if _over_step_cache(args, kwargs):
        raise ExportError(
            "BLT caches two stacks of attention layers (its local encoder's in the self-attention cache, its local "
            "decoder's in the cross-attention cache of an EncoderDecoderCache it builds around the cache it is given) "
            "and runs its global transformer over the patches of each call alone, without a cache: the step's cache "
            "holds one stack, so the decoder's layers would attend to the call's tokens only and BltForCausalLM "
            "cannot generate yet.")
    return type(self).forward(self, *args, **kwargs)


trace_forwards.register(f"{_MODELS}.cpmant.modeling_cpmant.CpmAntModel", cpmant_model)
trace_forwards.register(f"{_MODELS}.blt.modeling_blt.BltModel", blt_model)
