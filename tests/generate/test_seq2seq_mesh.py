"""An encoder-decoder artifact loads on a mesh (`torch2jax.load(path, mesh=...)`, 8 simulated devices in a subprocess):
its params split by the same rules as a causal LM's, the caches by rows and heads, and it generates the tokens it
generates unsharded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch2jax

from .seq2seqs import write_seq2seq

PROBE = Path(__file__).with_name("seq2seq_mesh_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def test_bart_on_a_mesh_generates_what_it_generates_unsharded(tmp_path):
    g = torch2jax.convert_hf(str(write_seq2seq("bart", tmp_path)), max_cache_len=16, max_batch=2, max_source_len=16)
    artifact = torch2jax.save(g, tmp_path / "bart-artifact")
    out = tmp_path / "probe.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, str(PROBE), str(out), str(artifact)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["devices"] == 8
    bart = result["artifacts"][str(artifact)]
    assert bart["equal"], bart["tokens"]
    assert bart["cache_spec"] == "P('data', 'model', None, None)"  # rows over data, heads over model
    specs = bart["specs"]
    assert "model" in specs["model.encoder.layers.0.self_attn.q_proj.weight"]  # split over the model axis
    assert "model" in specs["model.decoder.layers.0.encoder_attn.k_proj.weight"]
