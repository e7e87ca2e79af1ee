"""Causal LMs whose transformers forward does not fit the causal-LM step's one cache of attention layers, written from
slot 0 one slot per token (hf/steps/causal_lm.py): over the step's cache their stand-ins refuse with the model's own
reason, which torch.export's failure further on ("The size of tensor a (s70) must match ...", "Could not guard on
data-dependent expression Eq(u0, N)") does not name. Without the step's cache (a plain conversion) each model's own
forward runs. An encoder-decoder whose decoder is refused here is refused before its steps are measured
(refuse_seq2seq), where its decoder would fail on the step's masks with a message that does not name the cause."""

from __future__ import annotations

from typing import Any

import torch

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


def xlm_model(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' XLMModel.forward, refused over the step's cache."""
    if _over_step_cache(args, kwargs):
        raise ExportError(
            "XLM generates as a masked LM, not as a causal decoder: transformers' XLMWithLMHeadModel appends its mask "
            f"token (config.mask_token_id={self.config.mask_token_id}) to the ids at every step and drops the "
            "attention mask, and XLMModel runs only the ids past its cache, so each new token is predicted from a mask "
            "token at the next position over the earlier steps' mask tokens, never from the tokens generated (and, "
            f"with config.causal={self.causal}, over the batch's padding). The step's cache holds each generated "
            "token instead, so XLMWithLMHeadModel cannot generate yet. Its forward converts: "
            "torch2jax.convert(model, args).")
    return type(self).forward(self, *args, **kwargs)


_PROPHETNET_DECODER = f"{_MODELS}.prophetnet.modeling_prophetnet.ProphetNetDecoder"


def _prophetnet_reason(model_name: str) -> str:
    return (
        "ProphetNet predicts each token from the first of its n-gram streams, whose self-attention (ProphetNetNgramSelfAttention) "
        "reads the main stream's cached keys with the stream's own, through relative-position buckets and masks "
        "it builds two ways: on the first call from the call's tokens (causal and padding masks, from a 2-D mask "
        "only), on later calls from the cache's length with no mask at all (every cached slot attended, a batch's "
        "left padding included). The step's fixed cache holds slots not written yet and gives one 4-D mask for "
        f"every call, and torch2jax has no stand-in for that attention over it, so {model_name} cannot generate "
        "yet. Its forward converts: torch2jax.convert(model, args).")


def prophetnet_decoder(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' ProphetNetDecoder.forward, refused over the step's cache (or the step's 4-D mask)."""
    mask = kwargs.get("attention_mask")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if _over_step_cache((getattr(cache, "self_attention_cache", cache),), {}) or (
            isinstance(mask, torch.Tensor) and mask.dim() == 4):
        raise ExportError(_prophetnet_reason("ProphetNet's decoder"))
    return type(self).forward(self, *args, **kwargs)


def refuse_seq2seq(lm: torch.nn.Module) -> None:
    """Refuse an encoder-decoder whose decoder has no stand-in for the decode step (ProphetNet's), before its steps
    are run: measuring them hands the decoder the step's masks, which it fails on without naming why."""
    if any(f"{type(m).__module__}.{type(m).__qualname__}" == _PROPHETNET_DECODER for m in lm.modules()):
        raise ExportError(_prophetnet_reason(type(lm).__name__))


trace_forwards.register(f"{_MODELS}.xlm.modeling_xlm.XLMModel", xlm_model)
trace_forwards.register(_PROPHETNET_DECODER, prophetnet_decoder)
trace_forwards.register(f"{_MODELS}.cpmant.modeling_cpmant.CpmAntModel", cpmant_model)
trace_forwards.register(f"{_MODELS}.blt.modeling_blt.BltModel", blt_model)
