"""One of two processes forming one (2, 4) mesh over loopback, 4 simulated CPU devices each: load an
artifact sharded, call it, gather the output, and write what the test compares.

    python multihost_probe.py PROCESS_ID PORT FORWARD_ARTIFACT GENERATION_ARTIFACT OUT.npz
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()  # the tests' level kept

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import torch2jax  # noqa: E402

INPUT = (np.arange(32).reshape(4, 8) * 7 % 120 + 3).astype(np.int64)


def main() -> None:
    process_id, port, artifact, generation, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    model = torch2jax.load(artifact, mesh=mesh)
    q = model.params["model.layers.0.self_attn.q_proj.weight"]
    logits = multihost_utils.process_allgather(model(INPUT)["logits"], tiled=True)
    tokens = torch2jax.load(generation, mesh=mesh).generate(INPUT[:, :6], max_new_tokens=8)
    np.savez(out, logits=np.asarray(logits), tokens=tokens, processes=jax.process_count(), devices=len(jax.devices()),
             local_shards=len(q.addressable_shards), fully_addressable=q.is_fully_addressable,
             local_devices=sorted(d.id for d in jax.local_devices()),
             shard_devices=sorted(s.device.id for s in q.addressable_shards))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
