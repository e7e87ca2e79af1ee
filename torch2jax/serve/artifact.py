"""A Generator as an artifact: the prefill and decode entry points over one params checkpoint, the
generation section of the manifest (cache layout, special tokens, limits) and the tokenizer files."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ArtifactError
from ..runtime import artifact, stablehlo
from .generator import GenerationSpec, Generator
from .sharding import ShardingPlan

TASK = "text-generation"
TOKENIZER = "tokenizer"
ENTRY_POINTS = ("prefill", "decode")


def save_generator(
    generator: Generator,
    path: str | os.PathLike,
    *,
    force: bool = False,
    platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS,
    source: str | None = None,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write `generator` atomically; the KV cache is described, never saved (load allocates it)."""
    files = {f"{TOKENIZER}/{name}": src for name, src in generator.tokenizer_files.items()}
    extra = {"task": TASK, "generation": generator.spec.to_json(), "tokenizer": sorted(generator.tokenizer_files)}
    models = {"prefill": generator.prefill_model, "decode": generator.decode_model}
    # vjp_order=0: the steps are for serving; differentiating through a KV-cache update is not a use case
    return artifact.save_entries(models, path, extra=extra, files=files, force=force, platforms=platforms,
                                 vjp_order=0, source=source, check=check)


def load_generator(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True,
                   plan: ShardingPlan | None = None) -> Generator:
    """The Generator of a text-generation artifact; with a `plan`, params restored sharded on its mesh."""
    models, manifest = artifact.load_entries(path, from_graph=from_graph, verify_hashes=verify_hashes,
                                             shardings=plan.shardings() if plan else None)
    for model in models.values():
        model.sharding = plan
    missing = [name for name in ENTRY_POINTS if name not in models]
    if missing:
        raise ArtifactError(f"{path}: a {TASK} artifact needs entry points {list(ENTRY_POINTS)}; missing {missing}")
    spec = GenerationSpec.from_json(manifest.get("generation"))
    names = manifest.get("tokenizer") or []
    tokenizer_files = {name: Path(path) / TOKENIZER / name for name in names if isinstance(name, str)}
    return Generator(models["prefill"], models["decode"], spec, manifest, tokenizer_files, sharding=plan)
