"""Artifacts shared by the serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torch2jax
from tests.generate.lms import load_lm, write_lm

SHARDED_ARCHITECTURES = ("llama", "mixtral")


def convert_forward(hf_dir: Path, out: Path) -> Path:
    """The LM's plain forward pass (logits for every position) as an artifact with symbolic batch and length."""
    lm = load_lm(hf_dir)
    lm.config.use_cache = False
    if hasattr(lm, "set_experts_implementation"):
        lm.set_experts_implementation("batched_mm")  # the exportable form of the experts
    ids = torch.randint(3, 128, (2, 8))
    jm = torch2jax.convert(lm, (ids,), dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}})
    return torch2jax.save(jm, out)


@pytest.fixture(scope="session")
def sharded_lms(tmp_path_factory) -> tuple[list[str], list[str]]:
    """(forward artifacts, generation artifacts) of tiny random-weight Llama and Mixtral, for the mesh tests."""
    root = tmp_path_factory.mktemp("sharded_lms")
    forwards, gens = [], []
    for name in SHARDED_ARCHITECTURES:
        hf_dir = write_lm(name, root / "hf")
        forwards.append(str(convert_forward(hf_dir, root / f"{name}_forward")))
        gens.append(str(torch2jax.save(torch2jax.convert_hf(hf_dir, max_cache_len=32, max_batch=4), root / f"{name}_generate")))
    # int4 in halves: a row-parallel device slice of the bytes holds two separate column ranges (runtime/quantize.py)
    int4 = torch2jax.convert_hf(root / "hf" / "llama", max_cache_len=32, max_batch=4, quantize="int4", group_size=16)
    gens.append(str(torch2jax.save(int4, root / "llama_int4_generate")))
    return forwards, gens
