"""Any artifact, whatever it holds: `torch2jax.save` and `torch2jax.load` pick the model or the generator its
manifest names. runtime/artifact.py reads and writes the directory (both kinds, the manifest read once); here a
generator gives what it stores (its entry points, its manifest sections, its tokenizer files) and is built again, by
its kind, from what runtime read."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jax.sharding import Mesh

from ..errors import ArtifactError
from ..runtime import artifact, stablehlo
from ..runtime.model import Model
from .generator import Generator
from .loop import TokenLoop
from .seq2seq import Seq2SeqGenerator
from .vision_language import VisionLanguageGenerator

GENERATORS: dict[str, type[TokenLoop]] = {kind.TASK: kind for kind in (Generator, Seq2SeqGenerator, VisionLanguageGenerator)}


def save(model: Model | TokenLoop, path: str | os.PathLike, *, force: bool = False,
         platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS, vjp_order: int = 1, source: str | None = None,
         check: Callable[[Path], None] | None = None, on_bytes: Callable[[int, int], None] | None = None) -> Path:
    """Write a model or a generator as an artifact directory, atomically (see torch2jax.save); a generator's
    steps are exported without vjp (`vjp_order` applies to models)."""
    options = dict(force=force, platforms=platforms, source=source, check=check, on_bytes=on_bytes)
    if isinstance(model, TokenLoop):
        return save_generator(model, path, **options)
    return artifact.save(model, path, vjp_order=vjp_order, **options)


def load(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True, mesh: Mesh | None = None,
         sharding: str | Mapping[str, Any] = "auto") -> Model | TokenLoop:
    """The model or generator an artifact holds, its params sharded on `mesh` when given (see torch2jax.load)."""
    contents = artifact.read(path, from_graph=from_graph, verify_hashes=verify_hashes, mesh=mesh, sharding=sharding,
                             check=_loadable(generation_only=False))
    kind = GENERATORS.get(contents.manifest.get("task"))
    return contents.model if kind is None else kind.from_artifact(contents)


def save_generator(generator: TokenLoop, path: str | os.PathLike, *, force: bool = False,
                   platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS, source: str | None = None,
                   check: Callable[[Path], None] | None = None, on_bytes: Callable[[int, int], None] | None = None) -> Path:
    """Write `generator` atomically; its state (KV cache, cross-attention keys/values) is described, never saved.
    `on_bytes(written, total)` reports streamed weights as they are written."""
    # vjp_order=0: the steps are for serving; differentiating through a KV-cache update is not a use case
    return artifact.save_entries(generator.entries(), path, extra=generator.manifest_sections(),
                                 tokenizer_files=generator.tokenizer_files, force=force, platforms=platforms, vjp_order=0,
                                 source=source, check=check, on_bytes=on_bytes)


def load_generator(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True) -> TokenLoop:
    """The generator of a text-generation, text2text-generation or image-text-to-text artifact (any other artifact is
    refused before its params are restored)."""
    contents = artifact.read(path, from_graph=from_graph, verify_hashes=verify_hashes,
                             check=_loadable(generation_only=True))
    return GENERATORS[contents.manifest["task"]].from_artifact(contents)


def _loadable(generation_only: bool) -> Callable[[Path, dict], None]:
    """What refuses an artifact from its manifest alone, before its params are restored: a generator kind without
    its entry points; anything else than a generator where one is asked for. (Every generator kind loads on a mesh.)"""

    def check(root: Path, manifest: dict) -> None:
        task = manifest.get("task")
        kind = GENERATORS.get(task)
        if kind is None:
            if generation_only:
                raise ArtifactError(f"{root} is not a generation artifact (task {task!r}); load it with torch2jax.load")
            artifact.require_one_function(root, manifest)
            return
        entries = manifest.get("entries")
        missing = [name for name in kind.ENTRY_POINTS if not isinstance(entries, dict) or name not in entries]
        if missing:
            raise ArtifactError(f"{root}: a {task} artifact needs entry points {list(kind.ENTRY_POINTS)}; missing {missing}")

    return check
