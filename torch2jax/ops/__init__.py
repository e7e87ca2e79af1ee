"""Op lowerings, one module per op family. Importing this package registers them all."""

from . import (  # noqa: F401
    activations,
    attention,
    backward,
    control_flow,
    conv,
    elementwise,
    fft,
    histogram,
    indexing,
    linalg,
    linalg_decomp,
    normalization,
    pooling,
    prims,
    random,
    reductions,
    shape,
    sorting,
    special,
    upsample,
)
