"""Random ops: each draws from an explicit PRNG key (LoweringContext.rng), never hidden state."""

from __future__ import annotations

# The set the interpreter checks to decide whether a graph needs a key.
RANDOM_OPS: frozenset[str] = frozenset()
