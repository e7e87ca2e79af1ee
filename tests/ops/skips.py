"""Known gaps in the OpInfo sweep: (opinfo id, dtype or "*") -> reason. Shrinking this is progress.

One reason per entry, specific enough that the next person knows what to fix.
"""

SKIPS: dict[tuple[str, str], str] = {}

# --- elementwise, activations, type promotion -------------------------------------------------
SKIPS.update({})

# --- reductions, sorting, cumulative, random --------------------------------------------------
SKIPS.update({})

# --- shape, views, creation, indexing, scatter/gather, padding ---------------------------------
SKIPS.update({})

# --- linalg, convolution, pooling, upsampling, normalization, attention -----------------------
SKIPS.update({})
