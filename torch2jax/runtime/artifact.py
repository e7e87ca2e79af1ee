"""The artifact directory: save (atomic) and load (verified, torch-free). See docs/format.md.

    manifest.json   what the artifact is: versions, signature, platforms, params tree, file hashes
    exported.bin    the serialized jax.export.Exported (StableHLO)
    graph.json      the portable graph, to re-lower without torch or the Exported
    params/         an Orbax checkpoint of the params pytree
    entries/<name>/ an entry-point artifact's functions (exported.bin, graph.json each) over the one params tree
    tokenizer/      an entry-point artifact's tokenizer files (a generator's)

Both kinds are read here, whole and with one read of the manifest (`read`); what the entries make (a model, a
generator) is the caller's. Nothing here is pickle or code: loading executes nothing from the artifact.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from ..errors import ArtifactError, GraphFormatError, ShardingError
from ..ir import dtypes, structure
from ..ir.graph import Graph
from ..lowering import interpreter, passes
from . import sharding as sharding_rules
from . import stablehlo
from .checkpoint import restore_params, start_saving_params
from .collector import existing_objects_frozen
from .model import Model
from .sharding import ShardingPlan

FORMAT = "torch2jax-artifact"
FORMAT_VERSION = 2  # the newest this torch2jax reads
MANIFEST = "manifest.json"
EXPORTED = "exported.bin"
GRAPH = "graph.json"
PARAMS = "params"
ENTRIES = "entries"
TOKENIZER = "tokenizer"
ONE_FUNCTION = ""  # the name of a plain artifact's one function among ArtifactContents.models
PLAIN_FORMAT_VERSION = 1  # one function: exported.bin and graph.json at the top
ENTRIES_FORMAT_VERSION = 2  # several entry points over one params tree: entries/<name>/{exported.bin,graph.json}


@existing_objects_frozen()
def save(
    model: Model,
    path: str | os.PathLike,
    *,
    force: bool = False,
    platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS,
    vjp_order: int = 1,
    source: str | None = None,
    exported: Any = None,
    check: Callable[[Path], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
    tokenizer_files: dict[str, Path] | None = None,
    extra: dict | None = None,
) -> Path:
    """Write `model` as an artifact directory at `path`, atomically.

    Refuses to replace an existing path unless `force=True`. Everything is written to a
    temporary sibling first and renamed into place only once complete and checked;
    `check(tmp_dir)` may inspect the finished artifact first (e.g. verify it) and raise to abort.
    `on_bytes(written, total)` is called after each batch of streamed weights. `tokenizer_files` and
    `extra` as for save_entries (an encoder's tokenizer and its `task` / `embedding` sections).
    """
    tokenizer_files = dict(tokenizer_files or {})
    for name in tokenizer_files:
        if not _plain_file_name(name):
            raise ArtifactError(f"tokenizer file {name!r} is not a plain file name")

    def write(tmp: Path) -> dict:
        nonlocal exported
        with _params_written_meanwhile(model.params, tmp / PARAMS, on_bytes):
            if exported is None:
                exported = stablehlo.export(model, platforms)
            serialized, order = _serialize(exported, vjp_order)
            (tmp / EXPORTED).write_bytes(serialized)
            (tmp / GRAPH).write_text(model.graph.dumps())
            if tokenizer_files:
                (tmp / TOKENIZER).mkdir()
            for name, src in tokenizer_files.items():
                shutil.copyfile(src, tmp / TOKENIZER / name)
        manifest = {**_manifest(model, exported, order, source), **(extra or {})}
        return {**manifest, TOKENIZER: sorted(tokenizer_files)} if tokenizer_files else manifest

    return write_atomically(path, write, force=force, check=check)


@existing_objects_frozen()
def save_entries(
    models: dict[str, Model],
    path: str | os.PathLike,
    *,
    extra: dict,
    tokenizer_files: dict[str, Path] | None = None,
    force: bool = False,
    platforms: Sequence[str] = stablehlo.DEFAULT_PLATFORMS,
    vjp_order: int = 1,
    source: str | None = None,
    check: Callable[[Path], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Path:
    """Write several entry points over one params tree (e.g. prefill and decode) as one artifact.

    Each entry's Exported and graph go to `entries/<name>/`; the params once; `tokenizer_files` (file name -> source
    path) are copied into `tokenizer/` and listed in the manifest's `tokenizer` section; `extra` (a generator's task
    and generation sections) is merged into the manifest. `on_bytes(written, total)` is called after each batch of
    streamed weights (progress on long saves).
    """
    tokenizer_files = dict(tokenizer_files or {})
    for name in tokenizer_files:
        if not _plain_file_name(name):
            raise ArtifactError(f"tokenizer file {name!r} is not a plain file name")
    names = list(models)
    params = models[names[0]].params
    if any(set(models[n].params) != set(params) for n in names[1:]):
        raise ArtifactError(f"entry points {names} do not share one params tree")

    def write(tmp: Path) -> dict:
        with _params_written_meanwhile(params, tmp / PARAMS, on_bytes):
            entries = {}
            for name, model in models.items():
                folder = tmp / ENTRIES / name
                folder.mkdir(parents=True)
                exported = stablehlo.export(model, platforms)
                serialized, order = _serialize(exported, vjp_order)
                (folder / EXPORTED).write_bytes(serialized)
                (folder / GRAPH).write_text(model.graph.dumps())
                entries[name] = _manifest(model, exported, order, source)
            if tokenizer_files:
                (tmp / TOKENIZER).mkdir()
            for name, src in tokenizer_files.items():
                shutil.copyfile(src, tmp / TOKENIZER / name)
        first = entries[names[0]]
        manifest = {key: first[key] for key in ("format", "created", "versions", "source", "x64", "platforms", "params")}
        manifest["format_version"] = ENTRIES_FORMAT_VERSION
        manifest["entries"] = {
            name: {key: e[key] for key in ("inputs", "outputs", "symbols", "mutated_buffers", "vjp_order")} for name, e in entries.items()
        }
        manifest["inputs"] = []  # a plain reader's required section; an entry-point artifact's inputs are per entry
        return {**manifest, **extra, TOKENIZER: sorted(tokenizer_files)}

    return write_atomically(path, write, force=force, check=check)


@contextmanager
def _params_written_meanwhile(params: dict, path: Path, on_bytes: Callable[[int, int], None] | None) -> Iterator[None]:
    """Orbax writes `params` in its background threads while the block serializes the rest; the block's own error,
    if any, is the one raised (the params are still waited for, so nothing writes into a removed folder)."""
    finish = start_saving_params(params, path, on_bytes)
    try:
        yield
    except BaseException:
        with suppress(Exception):
            finish()
        raise
    finish()


def write_atomically(path: str | os.PathLike, write: Callable[[Path], dict], *, force: bool, check: Callable[[Path], None] | None) -> Path:
    """Run `write(tmp)` in a temporary sibling (it returns the manifest), hash every file, rename into place."""
    out = Path(path)
    if out.exists() and not force:
        raise ArtifactError(f"{out} already exists; pass force=True (CLI: --force) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        manifest = write(tmp)
        manifest["files"] = file_hashes(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False))
        if check is not None:
            check(tmp)
        swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True)
class ArtifactContents:
    """What an artifact holds, read with one read of its manifest: its functions over one restored params tree (a
    plain artifact's one function under ONE_FUNCTION, an entry-point artifact's by entry name), the tokenizer files
    that came with them, and the sharding plan the params were restored by (None off a mesh)."""

    root: Path
    manifest: dict
    models: dict[str, Model]
    tokenizer_files: dict[str, Path]
    sharding: ShardingPlan | None = None

    @property
    def model(self) -> Model:
        """A plain artifact's one function."""
        require_one_function(self.root, self.manifest)
        return self.models[ONE_FUNCTION]


@existing_objects_frozen()
def read(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True, mesh: Mesh | None = None,
         sharding: str | Mapping[str, Any] = "auto", check: Callable[[Path, dict], None] | None = None) -> ArtifactContents:
    """Read an artifact of either kind whole: the manifest once (format version and, unless told not to, every file's
    hash checked), `check(root, manifest)` (which may refuse the artifact before anything is restored), the params
    restored onto the declared tree (on `mesh`: each shard onto its device, planned by `sharding`), and each function
    built from its Exported, or from its graph with `from_graph=True` (traceable JAX, any platform, independent of
    jax.export's compatibility window). Needs no torch."""
    if mesh is None and not (isinstance(sharding, str) and sharding == "auto"):
        raise ShardingError("sharding= needs mesh=: torch2jax.load(path, mesh=jax.make_mesh(...), sharding=...)")
    root, manifest = open_artifact(path, verify_hashes)
    if check is not None:
        check(root, manifest)
    functions = _function_folders(root, manifest)
    tree = param_tree(manifest)
    plan = None
    if mesh is not None:
        hints = manifest["params"].get("sharding_hints")
        plan = sharding_rules.plan(tree, sharding_rules.auto_mesh(mesh), sharding, hints if isinstance(hints, dict) else None)
    params = restore_params(root / PARAMS, tree, plan.shardings() if plan else None)
    models = {}
    for name, (folder, entry_manifest) in functions.items():
        models[name] = _entry(root, folder, entry_manifest, params, from_graph)
        models[name].sharding = plan
    return ArtifactContents(root, manifest, models, _tokenizer_files(root, manifest), plan)


def load(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True) -> Model:
    """A plain artifact's one function as a Model (`read` says how); an entry-point artifact is refused before its
    params are restored."""
    return read(path, from_graph=from_graph, verify_hashes=verify_hashes, check=require_one_function).model


def require_one_function(root: Path, manifest: dict) -> None:
    """Refuse an entry-point artifact where one function is expected."""
    if "entries" in manifest:
        entries = manifest["entries"]
        names = ", ".join(map(str, entries)) if isinstance(entries, dict) else "damaged"
        raise ArtifactError(f"{root} holds entry points ({names}), not one function; load it with torch2jax.load")


def _function_folders(root: Path, manifest: dict) -> dict[str, tuple[Path, dict]]:
    """{name: (its folder, the manifest as that function reads it)} of every function the artifact holds."""
    if "entries" not in manifest:
        return {ONE_FUNCTION: (root, manifest)}
    entries = manifest["entries"]
    if not isinstance(entries, dict) or not entries:
        raise ArtifactError(f"{root}: the manifest's entries section is empty or malformed; the artifact is damaged")
    folders = {}
    for name, entry in entries.items():
        if not isinstance(name, str) or not name.isidentifier() or not isinstance(entry, dict):
            raise ArtifactError(f"{root}: manifest lists an invalid entry point ({name!r}); the artifact is damaged")
        folders[name] = (root / ENTRIES / name, {**manifest, **entry})
    return folders


def _tokenizer_files(root: Path, manifest: dict) -> dict[str, Path]:
    names = manifest.get(TOKENIZER) or []
    if not isinstance(names, list):
        raise ArtifactError(f"{root}: the manifest's {TOKENIZER} section is not a list of file names; the artifact is damaged")
    for name in names:
        if not _plain_file_name(name):
            raise ArtifactError(f"{root}: manifest lists a tokenizer file {name!r} that is not a plain file name; the "
                                "artifact is damaged")
    return {name: root / TOKENIZER / name for name in names}


def _plain_file_name(name: Any) -> bool:
    """A file name without folders, so it stays inside the folder it is joined to."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\x00" not in name


def open_artifact(path: str | os.PathLike, verify_hashes: bool = True) -> tuple[Path, dict]:
    """The artifact's root and manifest, its format version and (unless told not to) every file's hash checked."""
    root = Path(path)
    manifest = read_manifest(root)
    if verify_hashes:
        check_files(root, manifest)
    return root, manifest


def _entry(root: Path, folder: Path, manifest: dict, params: dict, from_graph: bool) -> Model:
    """One function of the artifact: its graph, and its Exported unless rebuilding from the graph."""
    model = _function(root, folder, manifest, params, from_graph)
    quantization = manifest["params"].get("quantization")
    model.quantization = dict(quantization) if isinstance(quantization, dict) else {}
    return model


def _function(root: Path, folder: Path, manifest: dict, params: dict, from_graph: bool) -> Model:
    try:
        graph = Graph.loads((folder / GRAPH).read_bytes())
    except GraphFormatError as err:
        raise ArtifactError(f"{root}: {err}") from None
    if from_graph:
        return Model(interpreter.build(passes.optimize(graph)), params, graph, manifest, backend="graph")
    try:
        exported = jax.export.deserialize(bytearray((folder / EXPORTED).read_bytes()))
    except Exception as err:  # too old/new for this jax, or damaged: the graph still works
        warnings.warn(
            f"{folder / EXPORTED} could not be deserialized by jax {jax.__version__} ({type(err).__name__}: {err}); "
            "falling back to rebuilding the function from graph.json",
            stacklevel=3,
        )
        return Model(interpreter.build(passes.optimize(graph)), params, graph, manifest, backend="graph")
    return Model(stablehlo.exported_runner(exported, graph), params, graph, manifest, backend="exported")


def traceable(model: Model) -> Model:
    """`model` run from its portable graph: JAX primitives that every transformation takes (the deserialized StableHLO's
    call has no batching rule, so jax.vmap refuses it); `model` itself when it already runs its graph."""
    if model.backend == "graph":
        return model
    rebuilt = Model(interpreter.build(passes.optimize(model.graph)), model.params, model.graph, model.manifest)
    rebuilt.sharding, rebuilt.quantization = model.sharding, model.quantization
    return rebuilt


def _serialize(exported: Any, vjp_order: int) -> tuple[bytes, int]:
    """Serialize with the VJP when JAX can differentiate the function; otherwise without, loudly."""
    try:
        return stablehlo.serialize(exported, vjp_order), vjp_order
    except Exception as err:
        if vjp_order == 0:
            raise ArtifactError(f"serializing the StableHLO failed: {type(err).__name__}: {err}") from err
        warnings.warn(
            f"the model cannot be reverse-differentiated by JAX ({type(err).__name__}: {str(err).splitlines()[0]}); "
            "saving it without a VJP (manifest vjp_order = 0): the loaded model runs but jax.grad through it fails",
            stacklevel=3,
        )
        return stablehlo.serialize(exported, 0), 0


def read_manifest(root: Path) -> dict:
    """Parse and sanity-check manifest.json, with a clear error for anything that is not our artifact."""
    if not root.is_dir():
        raise ArtifactError(f"{root} is not a directory; expected a torch2jax artifact directory")
    path = root / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{root} is not a torch2jax artifact: it has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path} is not valid JSON ({err}); the artifact is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a torch2jax manifest (format is not {FORMAT!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise ArtifactError(f"{path} has no integer format_version")
    if version > FORMAT_VERSION:
        versions = manifest.get("versions")
        writer = versions.get("torch2jax") if isinstance(versions, dict) else None
        upgrade = f"pip install -U 'torch2jax-aot>={writer}'" if isinstance(writer, str) else "pip install -U torch2jax-aot"
        raise ArtifactError(
            f"{root} has artifact format version {version}, newer than this torch2jax ({_own_version()}) reads "
            f"(format version {FORMAT_VERSION} and older); torch2jax {writer or '(version not recorded)'} wrote it. "
            f"Upgrade: {upgrade}"
        )
    for key, kind in (("files", dict), ("params", dict), ("inputs", list)):
        if not isinstance(manifest.get(key), kind):
            raise ArtifactError(f"{path} is missing its {key!r} section; the artifact is damaged")
    return manifest


def check_files(root: Path, manifest: dict) -> None:
    """Every file the manifest lists exists, stays inside the artifact and has its recorded sha256."""
    base = root.resolve()
    for rel, digest in manifest["files"].items():
        if not isinstance(rel, str) or "\x00" in rel:
            raise ArtifactError(f"{root}: manifest lists an invalid file name ({rel!r}); the artifact is damaged")
        target = (root / rel).resolve()
        if base not in target.parents:
            raise ArtifactError(f"{root}: manifest lists a path outside the artifact ({rel!r}); refusing to load")
        if not target.is_file():
            raise ArtifactError(f"{root}: {rel} is missing; the artifact is incomplete, re-export it")
        if _sha256(target) != digest:
            raise ArtifactError(f"{root}: {rel} does not match its sha256 in the manifest; the file was changed or damaged")
    entries = manifest.get("entries")
    folders = [f"{ENTRIES}/{name}/" for name in entries] if isinstance(entries, dict) else [""]
    for required in (folder + name for folder in folders for name in (EXPORTED, GRAPH)):
        if required not in manifest["files"]:
            raise ArtifactError(f"{root}: the manifest does not list {required}; the artifact is damaged")
    params_dir = root / PARAMS
    if params_dir.exists():  # Orbax reads the whole folder: it must be ours, inside, and hold only listed files
        if params_dir.is_symlink() or base not in params_dir.resolve().parents:
            raise ArtifactError(f"{root}: {PARAMS} points outside the artifact; refusing to load")
        unlisted = [rel for rel in _files_under(root) if rel.startswith(PARAMS + os.sep) and rel not in manifest["files"]]
        if unlisted:
            raise ArtifactError(f"{root}: {unlisted[0]} is not listed in the manifest; the artifact was changed after saving")


def _example_path(graph) -> list[dict]:
    """graph.example_values as `inspect` shows them: each value or condition, with the model's line."""
    return [{key: info[key] for key in ("value", "condition", "at") if key in info} for info in graph.example_values.values()]


def _manifest(model: Model, exported: Any, vjp_order: int, source: str | None) -> dict:
    graph = model.graph
    tree = {name: {"dtype": dtypes.name_of(a.dtype), "shape": list(a.shape)} for name, a in model.params.items()}
    names = structure.leaf_paths(graph.out_spec)
    out_metas = [{"name": name, **_output_meta(graph, o)} for name, o in zip(names, graph.user_outputs)]
    return {
        "format": FORMAT,
        "format_version": PLAIN_FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "source": source,
        "x64": bool(jax.config.jax_enable_x64),
        "inputs": [
            {"name": i.name, "dtype": i.meta.dtype, "jax_dtype": dtypes.jax_dtype(i.meta.dtype).name, "shape": i.meta.shape,
             **({"fixed": i.value} if i.baked else {})}  # a tensor input fixed to its example value (refuses others)
            for i in graph.user_inputs
            if i.meta is not None
        ],
        "outputs": out_metas,
        "symbols": graph.symbols,
        "mutated_buffers": [o.target for o in graph.mutations],
        # what the model reads from its tensors, taken from the example inputs and checked on every call
        **({"example_path": _example_path(graph)} if graph.example_values else {}),
        "platforms": list(exported.platforms),
        "vjp_order": vjp_order,
        "params": {
            "count": int(sum(int(np.prod(a.shape)) for a in model.params.values())),
            "bytes": int(sum(a.size * a.dtype.itemsize for a in model.params.values())),
            "aliases": graph.aliases,
            "tree": tree,
            **({"sharding_hints": dict(model.sharding_hints)} if model.sharding_hints else {}),
            **({"quantization": dict(model.quantization)} if model.quantization else {}),
        },
    }


def _output_meta(graph: Graph, output) -> dict:
    ref = output.value.get("ref") if isinstance(output.value, dict) else None
    node = next((n for n in graph.nodes if n.name == ref), None)
    inp = next((i for i in graph.inputs if i.name == ref), None)
    meta = node.meta if node is not None else (inp.meta if inp is not None else None)
    if meta is None or not hasattr(meta, "dtype"):
        return {"dtype": None, "shape": None}
    taken = {key: info["value"] for key, info in graph.example_values.items() if "value" in info}
    return {"dtype": meta.dtype, "shape": [taken.get(d, d) if isinstance(d, str) else d for d in meta.shape]}


def _own_version() -> str:
    try:
        return metadata.version("torch2jax-aot")
    except metadata.PackageNotFoundError:
        return "not installed as a package"


def _versions() -> dict:
    out = {}
    for dist, key in (("torch2jax-aot", "torch2jax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("torch", "torch")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def param_tree(manifest: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """{param name: (shape, dtype name)} as the manifest declares them."""
    tree = manifest["params"].get("tree")
    if not isinstance(tree, dict):
        raise ArtifactError("manifest params.tree is missing; the artifact is damaged")
    try:
        return {name: (tuple(int(d) for d in spec["shape"]), str(spec["dtype"])) for name, spec in tree.items()}
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"manifest params.tree is malformed ({err})") from None


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename a finished temporary sibling onto `out`, the old `out` (if any) moved aside first and removed after:
    a reader never sees a half-written directory."""
    if out.exists():
        trash = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, trash)
        os.rename(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, out)


def file_hashes(root: Path) -> dict[str, str]:
    """{path relative to root: sha256} of every file under `root`: what a manifest lists."""
    return {rel: _sha256(root / rel) for rel in _files_under(root)}


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

