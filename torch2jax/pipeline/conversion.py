"""What a conversion to an artifact wrote and checked, and the callbacks that report its progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ProgressFn = Callable[[str, str], None]  # (stage, message), as each stage starts
BytesFn = Callable[[int, int], None]  # (written, total) bytes of weights, after each streamed batch


@dataclass
class Conversion:
    """What `convert_target` wrote, and what it checked."""

    path: Path
    nbytes: int  # the artifact directory's size on disk
    description: str  # the model's signature, or the generator
    streamed: bool  # the weights went from the safetensors files into the artifact, never all in memory
    checks: list[str] = field(default_factory=list)  # what verification compared, and how close it came

    def summary(self) -> str:
        streamed = ", weights streamed from the safetensors files" if self.streamed else ""
        lines = [f"wrote {self.path} ({self.nbytes / 1e6:.2f} MB{streamed}) {self.description}", *self.checks]
        return "\n".join(lines)
