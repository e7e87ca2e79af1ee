"""Params are written uncompressed (zstd cost more time than it saved space), and checkpoints written with zstd,
as artifacts were before, still load."""

from __future__ import annotations

import json

import jax
import numpy as np
import orbax.checkpoint as ocp

from torch2jax.runtime import checkpoint


def _params() -> dict:
    rng = np.random.default_rng(0)
    return {"layer.weight": jax.device_put(rng.standard_normal((64, 32), dtype=np.float32)),
            "layer.bias": jax.device_put(np.arange(32, dtype=np.int32))}


def _tree(params: dict) -> dict:
    return {name: (value.shape, str(value.dtype)) for name, value in params.items()}


def test_params_are_written_without_compression(tmp_path):
    params = _params()
    checkpoint.save_params(params, tmp_path / "params")
    metadata = [json.loads(path.read_text()) for path in (tmp_path / "params").rglob(".zarray")]
    assert len(metadata) == 2 and all(m["compressor"] is None for m in metadata)
    restored = checkpoint.restore_params(tmp_path / "params", _tree(params))
    for name, value in params.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))


def test_a_zstd_checkpoint_still_loads(tmp_path):
    params = _params()
    with ocp.Checkpointer(ocp.StandardCheckpointHandler(use_ocdbt=False)) as checkpointer:
        checkpointer.save((tmp_path / "params").resolve(), args=ocp.args.StandardSave(params))
    metadata = [json.loads(path.read_text()) for path in (tmp_path / "params").rglob(".zarray")]
    assert metadata and all((m["compressor"] or {}).get("id") == "zstd" for m in metadata)
    restored = checkpoint.restore_params(tmp_path / "params", _tree(params))
    for name, value in params.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))


def _chunk_files(root) -> int:
    return sum(1 for path in root.rglob("*") if path.is_file() and not path.name.startswith(".") and path.name[0].isdigit())


def test_a_dim_with_a_large_prime_factor_is_not_cut_into_tiny_chunks(tmp_path):
    """167842 = 2 x 83921 rows: at an 8 MiB target Orbax, which cuts dims only at their divisors, wrote two rows per
    chunk (84 K files for 21 MB). In memory and streamed, the chunks are now at least 1 MiB: two of them."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((167842, 32), dtype=np.float32)
    checkpoint.save_params({"embed.weight": jax.device_put(table)}, tmp_path / "memory")
    streamed = {"embed.weight": checkpoint.DeferredArray(table.shape, table.dtype, lambda: table.copy())}
    checkpoint.save_streamed_params(streamed, tmp_path / "streamed")
    for root in (tmp_path / "memory", tmp_path / "streamed"):
        assert 1 <= _chunk_files(root) <= 4, root.name
        restored = checkpoint.restore_params(root, {"embed.weight": ((167842, 32), "float32")})
        np.testing.assert_array_equal(np.asarray(restored["embed.weight"]), table)
