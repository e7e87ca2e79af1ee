"""Run in a subprocess with 8 simulated CPU devices: load encoder-decoder artifacts unsharded and on a (2, 4) mesh,
generate for two right-padded sources, and report what tests/generate/test_seq2seq_mesh.py checks.

    python seq2seq_mesh_probe.py OUT.json ARTIFACT...
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()  # the tests' level kept

import jax  # noqa: E402
import numpy as np  # noqa: E402

import torch2jax  # noqa: E402
from torch2jax.generate.seq2seq import right_pad  # noqa: E402


def probe(path: str, mesh) -> dict:
    unsharded = torch2jax.load(path)
    rng = np.random.default_rng(0)
    ids, mask = right_pad([rng.integers(3, unsharded.spec.vocab_size, n).tolist() for n in (7, 4)],
                          unsharded.spec.pad_token_id)
    expected = unsharded.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    g = torch2jax.load(path, mesh=mesh)
    got = g.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[])
    return {"equal": bool((got == expected).all()), "tokens": got.tolist(),
            "specs": {name: str(p.sharding.spec) for name, p in g.params.items()},
            "cache_spec": str(g.new_cache(2)[0].sharding.spec)}


def main() -> None:
    target, *paths = sys.argv[1:]
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    result = {"devices": len(jax.devices()), "artifacts": {path: probe(path, mesh) for path in paths}}
    with open(target, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
