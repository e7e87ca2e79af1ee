"""Importing this registers every trace-time stand-in for transformers code that torch.export cannot capture as
written (capture/trace_forwards.py): expert loops (experts.py) and the Qwen2-VL family's rotary positions
(rope_index.py)."""

from . import experts, rope_index  # noqa: F401 - registered on import
