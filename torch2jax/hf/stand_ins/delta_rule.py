"""The gated delta rule's triangular solve kept whole while tracing (Qwen3-Next, Qwen3.5, OLMo-hybrid, ...).

transformers' `torch_chunk_gated_delta_rule` solves a unit lower-triangular system per chunk with
`torch.linalg.solve_triangular`, except under torch.export, where it inverts the system row by row in a Python loop
of chunk-size steps, since some export targets lack the solver. The converter lowers the solver
(ops/linalg_decomp.py); the loop, about 60 small in-place updates per layer, made several hundred XLA kernels and
most of these models' compile time. While tracing, these functions take their solver branch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ...capture import trace_forwards

MODELS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "lara_mini", "qwen4_exp")


def solving_triangular(module_name: str) -> Callable[[Callable], Callable]:
    """A wrap for the module's delta rule: run with the module's `is_torchdynamo_exporting` answering False, which
    only picks the solver branch (the one use of that check in these modules). The module's own globals are patched
    (the function itself may be a hub-kernel wrapper, whose globals are another module's)."""

    def wrap(own: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            scope = sys.modules[module_name].__dict__
            exporting = scope.get("is_torchdynamo_exporting")
            scope["is_torchdynamo_exporting"] = lambda: False
            try:
                return own(*args, **kwargs)
            finally:
                scope["is_torchdynamo_exporting"] = exporting

        return run

    return wrap


for _model in MODELS:
    _module = f"transformers.models.{_model}.modeling_{_model}"
    trace_forwards.register_function(f"{_module}.torch_chunk_gated_delta_rule", solving_triangular(_module))
