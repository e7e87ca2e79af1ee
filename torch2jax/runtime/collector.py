"""Python's cyclic garbage collector, kept off the objects that were alive before a long step.

A full collection walks every object alive, and a process with torch, transformers and JAX imported holds
millions: one costs about 0.25 s on these machines, and converting, exporting or saving a small model
triggers one or two (0.3-0.45 s of a 2 s conversion). Inside `existing_objects_frozen()` the objects alive
when it opened are frozen (gc.freeze: never scanned, never collected) and thawed when it closes; garbage
made inside is collected as usual, so memory behaves the same. Freezing and thawing move whole lists: no cost.

`return_freed_memory()` hands the C heap's free pages back to the system. XLA's compilations allocate and free
hundreds of megabytes each, and glibc's allocator keeps freed memory in its arenas: a server compiling its steps at 70
shapes over a 56M-parameter model grew to 13 GB resident while its live arrays held 0.5 GB, enough that two such
servers on a 24 GB machine were killed for memory; trimming after each compilation kept it at the arrays' size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Give the C heap's free memory back to the system (malloc_trim(0)); a no-op without glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
