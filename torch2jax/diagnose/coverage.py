"""Op coverage: the installed torch's core ATen opset against the registry (convert half).

Feeds docs/ops.md (scripts/gen_ops_doc.py) and the test that fails when a core op has neither
a lowering nor a documented reason in NOT_LOWERED.
"""

from __future__ import annotations

import torch

from ..ops import registered

# Core ops deliberately without a lowering: op -> why. Keep this short and honest.
NOT_LOWERED: dict[str, str] = {
    "aten.resize_.default": "in-place storage resize: functionalization removes it, so it never reaches an exported graph",
}


def core_aten_ops() -> list[str]:
    """Every overload tagged torch.Tag.core in the installed torch, as registry names.

    Walks the dispatcher's full op list: `dir(torch.ops.aten)` only shows packets already touched.
    """
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in getattr(op, "tags", ()):
            names.add(str(op))
    return sorted(names)


def coverage() -> dict[str, str]:
    """core op -> "lowered" | "not lowered: <reason>" | "missing"."""
    lowered = registered()
    status = {}
    for op in core_aten_ops():
        if op in lowered:
            status[op] = "lowered"
        elif op in NOT_LOWERED:
            status[op] = f"not lowered: {NOT_LOWERED[op]}"
        else:
            status[op] = "missing"
    return status
