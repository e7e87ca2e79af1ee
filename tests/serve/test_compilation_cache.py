"""A restarted server reads its compiled steps from JAX's persistent cache (`torch2jax serve --compilation-cache`):
the first start writes an entry per step, a second start over the same artifact finds every step there and writes
none, also where JAX_COMPILATION_CACHE_DIR names another cache. Each start runs in its own process (the cache is
process-wide JAX configuration)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch2jax

from ..generate.lms import write_lm, write_tokenizer
from ..helpers import ROOT

START = """
import sys
from torch2jax.serve.api import build_service, use_compilation_cache
use_compilation_cache(sys.argv[1])
build_service(sys.argv[2], warm_up="all", chunk=16)
"""


def entries(cache) -> set[str]:
    return {p.name for p in cache.rglob("*") if p.is_file()}


def test_a_second_start_compiles_nothing_new(tmp_path):
    source = write_lm("llama", tmp_path)
    write_tokenizer(source)
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=32, max_batch=2), tmp_path / "llm")
    cache = tmp_path / "cache"
    # a cache set outside (JAX opens it at the package's first compile) does not take the steps: the server's does
    outside = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "outside"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    seen = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", START, str(cache), str(artifact)], capture_output=True, text=True,
                             cwd=ROOT, timeout=600, env={**os.environ, **outside})
        assert run.returncode == 0, run.stderr[-3000:]
        seen.append(entries(cache))
    assert len(seen[0]) >= 4, "every step the warm-up compiles is kept"
    assert seen[1] == seen[0], "the second start found every step in the cache"
