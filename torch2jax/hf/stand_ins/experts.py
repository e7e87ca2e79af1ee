"""Mixture-of-experts layers whose transformers code loops over the experts its tokens hit, written densely for
torch.export (registered with capture/trace_forwards.py; installed only while tracing): DBRX, LongCat-Flash, JetMoE,
NLLB-MoE, SwitchTransformers (whose routers also cast their classifier inside forward) and OpenAI's privacy filter.

`for e in hit.nonzero(): idx, tok = torch.where(mask[e]); ... index_add_(0, tok, ...)` gives every shape from the
routing, which torch.export cannot capture. The forms here run every expert on every token and weight each result
by the token's routing weight for that expert (0 where it was not routed there): the same sums in another order,
static shapes, and E/k times the expert FLOPs of the sparse loop. Classes decorated with transformers'
`use_experts_implementation` need none of this once `set_experts_implementation("batched_mm")` is called (as
torch2jax.hf does); the privacy filter's is registered because its own loop is what runs otherwise. Aria's text MoE
layer (its experts are such a class) is replaced only for a reshape torch.export cannot prove for a symbolic length.
"""

from __future__ import annotations

import functools

import torch

from ...capture import trace_forwards


def _routing_weights(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, experts: int) -> torch.Tensor:
    """(tokens, experts): each token's weight for each expert, 0 where it was not routed there."""
    flat_index = top_k_index.reshape(top_k_index.shape[0], -1)
    flat_weights = top_k_weights.reshape(flat_index.shape).to(torch.float32)
    dense = torch.zeros(flat_index.shape[0], experts, dtype=torch.float32, device=flat_weights.device)
    return dense.scatter_add(1, flat_index, flat_weights)


def dbrx_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' DbrxExperts.forward: w1/v1/w2 hold the experts' (ffn, hidden) blocks stacked."""
    batch = hidden_states.shape[0]
    x = hidden_states.reshape(-1, self.hidden_size)
    shape = (self.num_experts, self.ffn_hidden_size, self.hidden_size)
    w1, v1, w2 = (p.view(shape) for p in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
    gate = self.mlp.activation_fn(torch.einsum("th,efh->etf", x, w1))
    up = torch.einsum("th,efh->etf", x, v1)
    out = torch.einsum("etf,efh->eth", gate * up, w2)
    # one_hot(num_classes=E + 1) in transformers: an index of E is routed nowhere
    weights = _routing_weights(top_k_index, top_k_weights, self.num_experts + 1)[:, : self.num_experts]
    return torch.einsum("eth,te->th", out, weights.to(out.dtype)).view(batch, -1, self.hidden_size)


def longcat_flash_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' LongcatFlashExperts.forward: routed experts, then zero-compute experts that pass the token on."""
    weights = _routing_weights(top_k_index, top_k_weights, self.total_experts)
    routed = self.num_routed_experts if self.gate_up_proj is not None else 0
    out = torch.zeros_like(hidden_states)
    if routed:
        gate, up = torch.einsum("th,efh->etf", hidden_states, self.gate_up_proj[:routed]).chunk(2, dim=-1)
        states = torch.einsum("eti,ehi->eth", self.act_fn(gate) * up, self.down_proj)
        out = out + torch.einsum("eth,te->th", states, weights[:, :routed].to(states.dtype)).to(hidden_states.dtype)
    identity = weights[:, routed:].sum(-1, keepdim=True)  # the identity experts' weights, added up
    return out + (hidden_states * identity.to(hidden_states.dtype)).to(hidden_states.dtype)


def nllb_moe_experts(self, hidden_states: torch.Tensor, router_mask: torch.Tensor, router_probs: torch.Tensor) -> torch.Tensor:
    """transformers' NllbMoeExperts.forward. Its loop one-hot encodes `router_mask`'s values and weights expert e's
    output for token t by router_probs[t, j] wherever router_mask[t, j] == e: the same weights, scattered densely."""
    weights = _routing_weights(router_mask, router_probs, self.num_experts)
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        states = self[f"expert_{e}"](hidden_states) * weights[:, e, None].to(hidden_states.dtype)
        if self.moe_token_dropout > 0:
            states = self.token_dropout(states) if self.training else states * (1 - self.moe_token_dropout)
        out = out + states.to(hidden_states.dtype)
    return out


def nllb_moe_router(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> tuple:
    """transformers' NllbMoeTop2Router.forward without `self.classifier = self.classifier.to(dtype)`, which reassigns a
    submodule inside forward (torch.export refuses that): the classifier is applied in the router's dtype instead."""
    self.input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(self.dtype)
    weight = self.classifier.weight.to(self.dtype)
    bias = None if self.classifier.bias is None else self.classifier.bias.to(self.dtype)
    router_logits = torch.nn.functional.linear(hidden_states, weight, bias)
    top_1_mask, router_probs = self.route_tokens(router_logits, self.input_dtype, padding_mask)
    return top_1_mask, router_probs, router_logits


def switch_transformers_router(self, hidden_states: torch.Tensor) -> tuple:
    """transformers' SwitchTransformersTop1Router.forward without `self.classifier = self.classifier.to(dtype)` (as for
    NLLB-MoE): top-1 routing with each expert's capacity, as one-hot expert indices and the chosen probability."""
    self.input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(self.dtype)
    if self.training and self.jitter_noise > 0:
        hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
    weight = self.classifier.weight.to(self.dtype)
    bias = None if self.classifier.bias is None else self.classifier.bias.to(self.dtype)
    router_logits = torch.nn.functional.linear(hidden_states, weight, bias)
    router_probs = torch.nn.functional.softmax(router_logits, dim=-1, dtype=self.dtype).to(self.input_dtype)
    expert_index = torch.nn.functional.one_hot(torch.argmax(router_probs, dim=-1), num_classes=self.num_experts)
    expert_index = expert_index * (torch.cumsum(expert_index, dim=-2) <= self.expert_capacity)  # over capacity: dropped
    return expert_index, torch.max(router_probs, dim=-1).values.unsqueeze(-1), router_logits


def switch_transformers_experts(self, hidden_states: torch.Tensor, selected_experts: torch.Tensor,
                                routing_weights: torch.Tensor) -> torch.Tensor:
    """transformers' SwitchTransformersExperts.forward: `selected_experts` (tokens, 1, experts) is one-hot (all zeros
    for a token over capacity), `routing_weights` (tokens, 1) the chosen expert's probability."""
    weights = selected_experts[:, 0, :].to(routing_weights.dtype) * routing_weights
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        out = out + (self[f"expert_{e}"](hidden_states) * weights[:, e, None]).to(hidden_states.dtype)
    return out


def jetmoe_gating(self, hidden_states: torch.Tensor) -> tuple:
    """transformers' JetMoeTopKGating.forward with the tokens per expert kept a tensor (it calls `.tolist()`, whose
    values then size a split): the same sort of the (token, choice) rows by expert, and the same gates.

    JetMoE routes its attention heads on the token's normalized embedding, and the pad id's embedding row is zero
    (nn.Embedding's padding_idx), so a pad id given as a real token (generated, or in a prompt) ties every expert's
    score exactly. Which experts top-k then picks is the sort's own business: torch's CPU kernel picks others than
    XLA's (lowest index first), and the tokens after it differed. A token whose scores all tie takes the experts torch
    picks for such a row (measured here, a constant in the graph); partial ties of nonzero scores stay unspecified."""
    logits = self.layer(hidden_states).float()
    top_k_logits, top_k_indices = logits.topk(self.top_k, dim=1)
    tied_choice = torch.tensor([_tied_choice(logits.shape[1], self.top_k)], device=top_k_indices.device)
    all_tied = (logits == logits[:, :1]).all(dim=1, keepdim=True)
    top_k_indices = torch.where(all_tied, tied_choice, top_k_indices)
    top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(hidden_states)
    expert_size = torch.zeros_like(logits, dtype=torch.long).scatter(1, top_k_indices, 1).sum(0)
    _, index_sorted_experts = top_k_indices.flatten().sort(0)
    batch_index = index_sorted_experts.div(self.top_k, rounding_mode="trunc")
    batch_gates = top_k_gates.flatten()[index_sorted_experts]
    return index_sorted_experts, batch_index, batch_gates, expert_size, logits


@functools.cache
def _tied_choice(experts: int, k: int) -> list[int]:
    """The experts torch's own top-k picks from `experts` equal scores, run outside the trace (so not lowered)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.zeros(1, experts).topk(k, dim=1).indices[0].tolist()


def jetmoe_parallel_experts(self, inputs: torch.Tensor, expert_size: torch.Tensor) -> torch.Tensor:
    """transformers' JetMoeParallelExperts.forward over rows sorted by expert: each row through its expert's weight.
    The row's expert comes from the running count of rows per expert (jetmoe_gating's tensor); every expert runs on
    every row and each row keeps its own expert's product."""
    rows = torch.arange(inputs.shape[0], device=inputs.device)
    expert = (rows[:, None] >= expert_size.cumsum(0)[None, :]).sum(1).clamp(max=self.num_experts - 1)
    every = torch.einsum("ni,eoi->neo", inputs, self.weight)
    return every.gather(1, expert[:, None, None].expand(-1, 1, every.shape[-1])).squeeze(1)


def privacy_filter_experts(self, hidden_states: torch.Tensor, router_indices: torch.Tensor,
                           routing_weights: torch.Tensor) -> torch.Tensor:
    """transformers' OpenAIPrivacyFilterExperts.forward (GPT-OSS's experts, accumulated in float32): gate_up holds
    each expert's (hidden, 2 * ffn) block with its bias, the gate half first."""
    x = hidden_states.float()
    gate_up = torch.einsum("th,ehf->etf", x, self.gate_up_proj.float()) + self.gate_up_proj_bias.float()[:, None]
    gated = self._apply_gate(gate_up).float()
    out = torch.einsum("etf,efh->eth", gated, self.down_proj.float()) + self.down_proj_bias.float()[:, None]
    weights = _routing_weights(router_indices, routing_weights, self.num_experts + 1)[:, : self.num_experts]
    return torch.einsum("eth,te->th", out, weights).to(hidden_states.dtype)


def aria_text_moe_layer(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' AriaTextMoELayer.forward with the shared experts run on the layer's input itself. transformers
    views the flattened (batch * tokens, hidden) states back to (batch, tokens, hidden), and that view's contiguity
    check leaves the guard tokens * min(hidden, hidden * tokens) == hidden * tokens, which torch.export cannot prove
    for a symbolic token count ("Constraints violated (tokens)"), though it holds for every count >= 1."""
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    _, top_k_weights, top_k_index = self.router(flat)
    routed = self.experts(flat, top_k_index, top_k_weights).reshape(hidden_states.shape)
    return routed + self.shared_experts(hidden_states)


trace_forwards.register("transformers.models.aria.modeling_aria.AriaTextMoELayer", aria_text_moe_layer)
trace_forwards.register("transformers.models.dbrx.modeling_dbrx.DbrxExperts", dbrx_experts)
trace_forwards.register("transformers.models.openai_privacy_filter.modeling_openai_privacy_filter."
                        "OpenAIPrivacyFilterExperts", privacy_filter_experts)
trace_forwards.register("transformers.models.jetmoe.modeling_jetmoe.JetMoeTopKGating", jetmoe_gating)
trace_forwards.register("transformers.models.jetmoe.modeling_jetmoe.JetMoeParallelExperts", jetmoe_parallel_experts)
trace_forwards.register("transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeExperts", nllb_moe_experts)
trace_forwards.register("transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router", nllb_moe_router)
trace_forwards.register("transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts", longcat_flash_experts)
trace_forwards.register("transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersTop1Router",
                        switch_transformers_router)
trace_forwards.register("transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts",
                        switch_transformers_experts)
