"""Training on a mesh: the model's params placed by the sharding rules `torch2jax.load(mesh=)` uses (tensor
parallelism on the `model` axis), each batch split by rows on the `data` axis. The jitted step needs nothing else:
XLA partitions it from where its inputs live, and the adapters and optimizer state follow the values they update."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..runtime.sharding import DATA, ShardingPlan, plan


def place_on_mesh(model: Any, mesh: Mesh, sharding: Any = "auto") -> ShardingPlan:
    """Move `model.params` onto `mesh` as `sharding` says ("auto": Megatron-style splits of the projections on the
    `model` axis, the rest replicated; or your rules, as load(mesh=, sharding=) takes them) and return the plan
    (`plan.report()` lists each param's spec and bytes per device)."""
    tree = {name: (tuple(np.shape(value)), str(jax.numpy.result_type(value))) for name, value in model.params.items()}
    placed = plan(tree, mesh, sharding)
    shardings = placed.shardings()
    model.params = {name: jax.device_put(value, shardings[name]) for name, value in model.params.items()}
    return placed


def shard_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Each [rows, ...] array of a batch with its rows on the mesh's `data` axis (whole where there is no such axis,
    or it does not divide the rows)."""
    out = {}
    for name, value in batch.items():
        rows = np.shape(value)[0]
        axis = DATA if DATA in mesh.axis_names and rows % mesh.shape[DATA] == 0 else None
        out[name] = jax.device_put(value, NamedSharding(mesh, PartitionSpec(axis)))
    return out
