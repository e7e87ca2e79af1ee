"""Importing this registers every trace-time stand-in for transformers code that torch.export cannot capture as
written (capture/trace_forwards.py): expert loops (experts.py), the Qwen2-VL family's rotary positions
(rope_index.py), the vision helpers over fixed image grids (vision_grids.py), the gated delta rule's triangular
solve (delta_rule.py), GPT-Neo's causal table read by cache slot (local_attention.py), BLOOM's ALiBi positions
from the step's mask (alibi.py) and the positions of BART-like decoders, which count from the cache's length, given
by the step (positions.py), and recurrent mixers over the step's explicit state: their registry (mixers.py), Mamba and Mamba2
(state_space.py)."""

from . import alibi, delta_rule, experts, local_attention, mixers, positions, rope_index, state_space, vision_grids  # noqa: F401 - registered on import
