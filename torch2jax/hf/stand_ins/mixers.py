"""The registry of recurrent mixers a generation artifact can hold: each transformers mixer class whose cache is a
fixed-size state (Mamba's conv and SSM states, a gated delta net's conv and recurrent states, a short convolution's
window, ...) names the tensors one row of that state needs and the stand-in forward that runs the mixer over them.

Under the converted step (hf/steps/recurrent.py) a state layer's cache entry is given as tensors (`states`, in the
order the mixer's `states` function lists them) with which of the step's tokens are real (`keep` [B, T]); the stand-in
reads `step_state(cache, layer_idx)`, runs the mixer as one scan over the tokens starting from those states (prompt,
prompt chunk and decode token are the same graph), leaves the states unchanged at tokens that are not real (left
padding), and sets the new states on the entry (`entry.states = [...]`) for the step to return. Outside the step
(no such entry) the stand-in runs the mixer's own forward.

Each family's stand-ins live in their own module and register here: state_space.py (Mamba, Mamba2, Bamba),
mamba_kin.py (FalconMamba, Jamba, Zamba, Zamba2), mamba2_kin.py (Granite 4, Nemotron-H, Falcon-H1), rg_lru.py
(RecurrentGemma), gated_delta.py (Qwen3.5, Qwen3-Next, OLMo-hybrid, Kimi-Linear), short_conv.py (LFM2), rwkv.py (RWKV),
xlstm.py (xLSTM), zaya.py (ZAYA), minimax.py (MiniMax) and linear_attention.py (LaraMini; Inkling, Inkling2 and
Inkling2-Loop, whose decoder layers are the mixers: four short-convolution windows beside each attention layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...capture import trace_forwards

STATE_ATTRIBUTE = "torch2jax_step_state"  # set on the step's own cache layers (hf/steps/recurrent.py)
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Mixer:
    """One mixer class: its family's name (errors and docs say it) and what one row of its state is."""

    kind: str
    # mixer module -> per state tensor of one row: (shape, dtype); dtype None means the model's dtype
    states: Callable[[torch.nn.Module], tuple[tuple[Shape, torch.dtype | None], ...]]
    # mixer module -> the index of the decoder layer whose cache entry it owns
    layer_index: Callable[[torch.nn.Module], int] = lambda mixer: int(mixer.layer_idx)
    # None: the LM takes a transformers Cache whose layers hold the step's entries. Else the keyword the LM's forward
    # takes its own recurrent state by (RWKV's `state`): the step passes its Cache of entries there, and every layer's
    # cache is this mixer's states
    state_keyword: str | None = None
    # the Cache subclass the LM's forward insists on ("module.QualName", MiniMax's MiniMaxCache), or None for any
    cache_class: str | None = None
    # mixer module -> the indices of later cache layers that also hold its state, one per pass where the model runs
    # the layer again (Inkling2-Loop's loop passes, laid out after the model's own layers)
    later_layers: Callable[[torch.nn.Module], tuple[int, ...]] = lambda mixer: ()


MIXERS: dict[str, Mixer] = {}  # qualified class name -> Mixer


def register(class_name: str, mixer: Mixer, forward: Callable) -> None:
    """`class_name` (module.qualname) keeps its state in the step's cache, and `forward` runs it there."""
    MIXERS[class_name] = mixer
    trace_forwards.register(class_name, forward)


def qualified(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def mixer_of(module: torch.nn.Module) -> Mixer | None:
    return MIXERS.get(qualified(module))


def kinds() -> list[str]:
    """The registered families, for messages."""
    return sorted({mixer.kind for mixer in MIXERS.values()})


def step_state(cache: Any, layer_idx: int) -> Any:
    """The step's state entry of layer `layer_idx` (with `states` and `keep`), or None outside the converted step."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers) or not getattr(layers[layer_idx], STATE_ATTRIBUTE, False):
        return None
    return layers[layer_idx]


def conv_state_shape(conv: torch.nn.Conv1d) -> Shape:
    """A depthwise causal convolution's state of one row: its last kernel - 1 inputs per channel."""
    return (int(conv.in_channels), int(conv.kernel_size[0]) - 1)


def causal_conv(x: torch.Tensor, state: torch.Tensor, conv: torch.nn.Conv1d, activation: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal convolution of x [B, C, T] continuing from `state` [B, C, K - 1]: (activated output
    [B, C, T], the new state: the last K - 1 inputs). `activation` None leaves the output as it is."""
    from transformers.activations import ACT2FN

    kept = state.shape[-1]
    full = torch.cat([state.to(x.dtype), x], dim=-1)
    out = F.conv1d(full.to(conv.weight.dtype), conv.weight, conv.bias, groups=x.shape[1])
    new_state = full[:, :, full.shape[-1] - kept:]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(x.dtype), new_state.to(state.dtype)
