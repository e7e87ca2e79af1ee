"""Load an artifact and run it once, torch-free; print one JSON line as soon as the first output is ready.

    python scripts/without_torch.py benchmarks/load_probe.py ARTIFACT_DIR INPUTS.npz

The parent times process start to that line; the line itself splits the time spent in this process.
"""

import json
import sys
import time

start = time.perf_counter()
import jax  # noqa: E402
import numpy as np  # noqa: E402

import torch2jax  # noqa: E402

imported = time.perf_counter()
model = torch2jax.load(sys.argv[1])
loaded = time.perf_counter()
inputs = dict(np.load(sys.argv[2]))
jax.block_until_ready(model(**inputs))
done = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported, "first_call_s": done - loaded,
                  "torch_imported": "torch" in sys.modules}), flush=True)
