"""Python's cyclic garbage collector, kept off the objects that were alive before a long step.

A full collection walks every object alive, and a process with torch, transformers and JAX imported holds
millions: one costs about 0.25 s on these machines, and converting, exporting or saving a small model
triggers one or two (0.3-0.45 s of a 2 s conversion). Inside `existing_objects_frozen()` the objects alive
when it opened are frozen (gc.freeze: never scanned, never collected) and thawed when it closes; garbage
made inside is collected as usual, so memory behaves the same. Freezing and thawing move whole lists: no cost.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def existing_objects_frozen() -> Iterator[None]:
    """Freeze what is alive now for the block; a no-op where the process froze objects itself (a server that
    gc.freeze()s after loading keeps its own setting) or turned the collector off."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
