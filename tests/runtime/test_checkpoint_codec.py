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
