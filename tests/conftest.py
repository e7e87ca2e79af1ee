"""Shared fixtures: the sample models, converted once per session."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# One JAX persistent compilation cache for the session: the xdist workers inherit it from the controller, as do the
# subprocesses tests start (the CLI, servers, torch-free runs), so a program compiled once (the same tiny model's steps
# after a save and load, each CLI call on one artifact) is read back, not compiled again. Results are the same: the cache
# is keyed by the program, the jax version and the device. A directory set by the caller is kept as it is.
_OWN_JAX_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_JAX_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch2jax-tests-jax-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# Tests compile many small programs and run each a few times: LLVM's optimization of the generated code costs more
# compile time than it saves at run time there (17-22% less wall time on the serving and generation files). It is left
# at level 0; XLA's own HLO passes (fusion, simplification) still run, so the programs are the ones users run. Appended
# to the caller's XLA_FLAGS (a test that sets its own for a subprocess, the simulated devices, replaces them).
_FAST_COMPILE = "--xla_backend_optimization_level=0"
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()


def pytest_unconfigure(config):
    """The session's compilation cache goes with the process that made it (the controller, or pytest without xdist)."""
    if _OWN_JAX_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def load_sample(name: str):
    """Import sample_models/<name>.py as a module."""
    path = ROOT / "sample_models" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"sample_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SAMPLES = {"mlp": "MLP", "cnn": "make_model", "tiny_gpt": "TinyGPT"}


@pytest.fixture(scope="session")
def converted():
    """name -> (torch module, example args, converted Model), each converted once."""
    import torch

    import torch2jax

    cache = {}

    def get(name: str):
        if name not in cache:
            sample = load_sample(name)
            torch.manual_seed(0)
            module = getattr(sample, SAMPLES[name])().eval()
            args = sample.example_inputs()
            model = torch2jax.convert(module, args, dynamic_shapes=sample.dynamic_shapes())
            cache[name] = (module, args, model)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def saved(converted, tmp_path_factory):
    """name -> artifact directory of the converted sample, saved once."""
    import torch2jax

    cache = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp("artifacts") / name
            torch2jax.save(converted(name)[2], out, source=f"sample_models/{name}.py")
            cache[name] = out
        return cache[name]

    return get
