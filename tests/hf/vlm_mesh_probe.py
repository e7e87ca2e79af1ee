"""Run in a subprocess with 8 simulated CPU devices: load vision-language artifacts unsharded and on a (2, 4) mesh,
generate for two prompts (one left-padded) with an image each, and report what the tests check.

    python vlm_mesh_probe.py OUT.json ARTIFACT...
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()  # the tests' level kept

import jax  # noqa: E402
import numpy as np  # noqa: E402

import torch2jax  # noqa: E402
from torch2jax.generate.generator import left_pad  # noqa: E402


def inputs(g) -> tuple:
    """(ids, mask, generate's image arguments): random words around each prompt's image tokens, random pixels."""
    vision, rng = g.vision, np.random.default_rng(0)
    merge = vision.spatial_merge_size
    per_image = 4 if merge else vision.tokens_per_image  # variable resolution: a 2x2-token image
    rows = []
    for length in (5, 2):
        words = rng.integers(7, g.spec.vocab_size, length).tolist()
        rows.append(words[:1] + [vision.image_token_id] * per_image + words[1:])
    ids, mask = left_pad(rows, g.spec.pad_token_id)
    if merge:
        images = {"image_grid_thw": np.asarray([[1, 2 * merge, 2 * merge]] * 2),
                  "pixel_values": rng.standard_normal((2 * per_image * merge * merge, *vision.pixel_shape)).astype(np.float32)}
    else:
        images = {"pixel_values": rng.standard_normal((2, *vision.pixel_shape)).astype(np.float32)}
    return ids, mask, images


def probe(path: str, mesh) -> dict:
    unsharded = torch2jax.load(path)
    ids, mask, images = inputs(unsharded)
    expected = unsharded.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[], **images)
    g = torch2jax.load(path, mesh=mesh)
    got = g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[], **images)
    return {"equal": bool((got == expected).all()), "kind": type(g).__name__,
            "specs": {name: str(p.sharding.spec) for name, p in g.params.items()},
            "cache_spec": str(g.new_cache(2)[0].sharding.spec),
            "decode_collectives": g.sharding_report().collectives}


def main() -> None:
    target, *paths = sys.argv[1:]
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    result = {"devices": len(jax.devices()), "artifacts": {path: probe(path, mesh) for path in paths}}
    with open(target, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
