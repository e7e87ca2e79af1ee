"""An FX node as the portable graph and its error messages name it: the op's registry key (`aten.add.Tensor`) and
the line of the user's code that made it. Shared by fx.py, data_dependent_shapes.py and eager's partitioner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def op_name(target: Any) -> str:
    """The registry key of an FX call target: `aten.add.Tensor`, `operator.getitem`, `torch.sym_max`..."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return f"operator.{target.__name__}"
    if module == "math":
        return f"math.{target.__name__}"
    if module.startswith("torch"):
        return f"torch.{target.__name__}"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


def user_frame(stack_trace: str | None) -> str | None:
    """The innermost frame outside torch itself and its code line: where the user wrote the op."""
    if not stack_trace:
        return None
    lines = [line for line in stack_trace.strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
    outside_torch = [i for i in frames if _TORCH_DIR not in lines[i]]
    chosen = (outside_torch or frames or [len(lines) - 1])[-1]
    return "\n".join(x.strip() for x in lines[chosen : chosen + 2])


_TORCH_DIR = str(Path(torch.__file__).parent) + "/"
