"""Op coverage: the installed torch's core ATen opset against the registry (convert half).

Feeds docs/ops.md (scripts/gen_ops_doc.py) and the test that fails when a core op has neither
a lowering nor a documented reason in NOT_LOWERED.
"""

from __future__ import annotations

import torch

from .registry import registered

# Core ops deliberately without a lowering: op -> why. Keep this short and honest.
NOT_LOWERED: dict[str, str] = {
    "aten.nonzero.default": "output shape depends on the data; JAX needs static shapes (nonzero_static is lowered)",
}


def core_aten_ops() -> list[str]:
    """Every overload tagged torch.Tag.core in the installed torch, as registry names."""
    names = []
    for packet_name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, packet_name, None)
        overloads = getattr(packet, "overloads", None)
        if not callable(overloads):
            continue
        for overload in overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in getattr(op, "tags", ()):
                names.append(str(op))
    return sorted(set(names))


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
