"""A generator as an artifact: its entry points (prefill and decode for a causal LM, encode and decode for an
encoder-decoder) over one params checkpoint, the generation section of the manifest (cache layout, special
tokens, limits) and the tokenizer files."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ArtifactError, ShardingError
from ..runtime import artifact, stablehlo
from ..runtime.sharding import ShardingPlan
from .generator import GenerationSpec, Generator
from .loop import TokenLoop
from .seq2seq import Seq2SeqGenerator, Seq2SeqSpec
from .vision_language import VisionLanguageGenerator, VisionSpec

TOKENIZER = "tokenizer"
GENERATORS = {Generator.TASK: Generator, Seq2SeqGenerator.TASK: Seq2SeqGenerator,  # the manifest's task -> its class
              VisionLanguageGenerator.TASK: VisionLanguageGenerator}


def save_generator(
    generator: TokenLoop,
    path: str | os.PathLike,
    *,
    force: bool = False,
    platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS,
    source: str | None = None,
    check: Callable[[Path], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Path:
    """Write `generator` atomically; its state (KV cache, cross-attention keys/values) is described, never saved.
    `on_bytes(written, total)` reports streamed weights as they are written."""
    files = {f"{TOKENIZER}/{name}": src for name, src in generator.tokenizer_files.items()}
    extra = {"task": generator.TASK, "generation": generator.spec.to_json(), "tokenizer": sorted(generator.tokenizer_files)}
    if isinstance(generator, VisionLanguageGenerator):
        extra["vision"] = generator.vision.to_json()
    # vjp_order=0: the steps are for serving; differentiating through a KV-cache update is not a use case
    return artifact.save_entries(generator.entries(), path, extra=extra, files=files, force=force, platforms=platforms,
                                 vjp_order=0, source=source, check=check, on_bytes=on_bytes)


def load_generator(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True,
                   plan: ShardingPlan | None = None) -> TokenLoop:
    """The generator of a text-generation, text2text-generation or image-text-to-text artifact; with a `plan` (causal
    LMs and vision-language models), params restored sharded on its mesh."""
    root, manifest = artifact.open_artifact(path, verify_hashes=False)
    task = manifest.get("task")
    kind = GENERATORS.get(task)
    if kind is None:
        raise ArtifactError(f"{path} is not a generation artifact (task {task!r}); load it with torch2jax.load")
    if plan is not None and kind is Seq2SeqGenerator:
        raise ShardingError(f"loading a {task} artifact on a mesh is not supported yet: load it without mesh=")
    models, manifest = artifact.load_entries(path, from_graph=from_graph, verify_hashes=verify_hashes,
                                             shardings=plan.shardings() if plan else None)
    for model in models.values():
        model.sharding = plan
    missing = [name for name in kind.ENTRY_POINTS if name not in models]
    if missing:
        raise ArtifactError(f"{path}: a {task} artifact needs entry points {list(kind.ENTRY_POINTS)}; missing {missing}")
    names = manifest.get("tokenizer") or []
    tokenizer_files = {name: Path(path) / TOKENIZER / name for name in names if isinstance(name, str)}
    if kind is VisionLanguageGenerator:
        return VisionLanguageGenerator(models["encode_image"], models["prefill"], models["decode"],
                                       GenerationSpec.from_json(manifest.get("generation")),
                                       VisionSpec.from_json(manifest.get("vision")), manifest, tokenizer_files, sharding=plan)
    first, second = (models[name] for name in kind.ENTRY_POINTS)
    if kind is Seq2SeqGenerator:
        return Seq2SeqGenerator(first, second, Seq2SeqSpec.from_json(manifest.get("generation")), manifest, tokenizer_files)
    return Generator(first, second, GenerationSpec.from_json(manifest.get("generation")), manifest, tokenizer_files, sharding=plan)
