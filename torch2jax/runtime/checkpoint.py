"""The artifact's params/ folder: an Orbax checkpoint of the params pytree, written and restored.

Params may be arrays, or `DeferredArray`s known by shape and dtype whose values are read only when
they are written: a streamed conversion (capture/weight_source.py) holds no weights, so saving reads
and writes them in batches of bounded bytes and peak memory does not grow with the model. Restoring
targets the tree the manifest declares, each param onto its sharding when given.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..errors import ArtifactError, Torch2JaxError
from ..ir import dtypes


class DeferredArray:
    """shape + dtype now, values from `read()` later (a fresh numpy array each call)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, read: Callable[[], np.ndarray], source: str = ""):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._read = read
        self.source = source  # where the values come from, for messages

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def read(self) -> np.ndarray:
        values = self._read()
        if values.shape != self.shape or values.dtype != self.dtype:
            raise Torch2JaxError(f"{self.source} gave {values.dtype}{list(values.shape)}, expected {self.dtype}{list(self.shape)}")
        return values

    def __array__(self, *args, **kwargs):
        raise Torch2JaxError(
            "this param's weights were not loaded: the conversion streamed them from the checkpoint files and they are "
            "written when the model is saved. Save it (torch2jax.save) and torch2jax.load the artifact to run it"
        )

    def __repr__(self) -> str:
        return f"DeferredArray({self.dtype}{list(self.shape)} from {self.source})"


def is_deferred(value: object) -> bool:
    return isinstance(value, DeferredArray)


_CHUNK_BYTES = 8 << 20
_MIN_MEAN_CHUNK_BYTES = 1 << 20


def chunk_byte_size(shape: tuple[int, ...], dtype: Any) -> int:
    """The chunk_byte_size to give Orbax for one param: _CHUNK_BYTES, doubled while its chunks would be under 1 MiB.
    Orbax only cuts a dim at its divisors, so a dim with a large prime factor falls to tiny chunks: a 167842 x 32
    table (167842 = 2 x 83921) to two rows per chunk, 84 K files and 26 s to write 21 MB. Doubling lets the cut land
    on the next divisor up, one chunk at worst."""
    try:
        from orbax.checkpoint._src.arrays import subchunking
    except ImportError:  # Orbax moved its chunking helper: its own choice, as before this guard existed
        return _CHUNK_BYTES
    dtype = np.dtype(dtype)
    total = max(1, math.prod(shape)) * dtype.itemsize
    target = _CHUNK_BYTES
    while target < total:
        chunk = subchunking.choose_chunk_shape(shape, shape, dtype, target)
        if math.prod(chunk) * dtype.itemsize >= _MIN_MEAN_CHUNK_BYTES:
            break
        target *= 2
    return target


class _DropLogRecords(logging.Filter):
    """Drops log records containing `text` (a library's notice that says nothing to our users)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def save_params(params: dict, path: Path, on_bytes: Callable[[int, int], None] | None = None) -> None:
    """Write `params` to an Orbax checkpoint at `path`. Zero-size params (a constant torch.export lifted with no
    elements) are not written: Orbax refuses them, and their shape in the manifest is all they hold."""
    start_saving_params(params, path, on_bytes)()


def start_saving_params(params: dict, path: Path, on_bytes: Callable[[int, int], None] | None = None) -> Callable[[], None]:
    """Begin writing `params` as `save_params` does and return `finish()`, which waits until they are on disk.

    In-memory params are written by Orbax's background threads, so the caller can do other work meanwhile (an
    artifact's save serializes the StableHLO and its VJP); streamed params (read from files on demand) are
    written before this returns, in bounded batches."""
    params = {name: value for name, value in params.items() if _nbytes(value) > 0}
    if not params:
        return lambda: None  # nothing to checkpoint (Orbax rejects empty trees)
    if any(is_deferred(value) for value in params.values()):
        save_streamed_params(params, path, on_bytes=on_bytes)
        return lambda: None
    import orbax.checkpoint as ocp

    # One zarr array per param, written in 8 MiB chunks, instead of Orbax's default OCDBT store:
    # OCDBT holds every compressed chunk in memory until it commits (1x the weights on top of the
    # params during save), chunked plain zarr streams them (0.2x). Restore reads either layout.
    # Uncompressed, as the streamed save writes: zstd saves 7% of 1 GB of float32 weights and makes saving
    # 2-4x slower and loading 1.2-2x slower (side by side on two shared cores).
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_compression=False)
    save_args = {name: ocp.SaveArgs(chunk_byte_size=chunk_byte_size(tuple(value.shape), value.dtype))
                 for name, value in params.items()}
    quiet = _DropLogRecords("Skipping merge of OCDBT checkpoints")  # Orbax tries the merge for any layout
    absl_log = logging.getLogger("absl")
    absl_log.addFilter(quiet)
    checkpointer = ocp.AsyncCheckpointer(handler)

    def finish(wait: bool = True) -> None:
        try:
            if wait:
                checkpointer.wait_until_finished()  # saving is async: a CLI must not exit before it lands
        except Exception as err:
            raise ArtifactError(f"saving the params checkpoint failed: {type(err).__name__}: {err}") from err
        finally:
            checkpointer.close()
            absl_log.removeFilter(quiet)
        if wait and (not path.is_dir() or not any(path.iterdir())):
            raise ArtifactError(f"saving the params checkpoint to {path} left no files")

    try:
        checkpointer.save(path.resolve(), args=ocp.args.PyTreeSave(params, save_args=save_args))
    except Exception as err:
        finish(wait=False)
        raise ArtifactError(f"saving the params checkpoint failed: {type(err).__name__}: {err}") from err
    return finish


# -- saving streamed params (save path only) ----------------------------------------------------------

# read and written per Orbax call: bounds memory; fewer calls keep them fast (each gets slower with the keys already
# saved). Measured on a 2 GB bf16 Llama, save growth / seconds: 64 MiB 0.22 GiB / 6.5 s, 128 MiB 0.20 / 4.9 s,
# 256 MiB 0.33 / 5.8 s (with the freed memory returned after each batch)
STREAM_BATCH_BYTES = 128 << 20


def save_streamed_params(params: dict, path: Path, batch_bytes: int | None = None,
                          on_bytes: Callable[[int, int], None] | None = None) -> None:
    """Write params whose values are read on demand (DeferredArray) in batches of at most `batch_bytes`
    (a larger single param is a batch of its own), with Orbax's partial save: only one batch is in memory.
    `on_bytes(written, total)` is called after each batch.

    The result is the same checkpoint layout `_save_params` writes (one chunked zarr array per param,
    no OCDBT), so `load` reads both alike. Orbax's partial save nests the tree in a `state/` item; it is
    moved to `path` once finalized.
    """
    from orbax.checkpoint import v1 as ocp
    from orbax.checkpoint.experimental.v1 import partial

    staging = path.parent / f"{path.name}-partial"  # no leading dot: Orbax globs its pending folders with `*`

    def writing(chunk_bytes: int) -> Any:
        context = ocp.Context()
        context.array.saving.use_ocdbt = False
        context.array.saving.storage_options.chunk_byte_size = chunk_bytes  # per batch: see chunk_byte_size
        # uncompressed: zstd on two shared cores made writing 1.6x slower than the disk (13.7 s vs 8.7 s for 2 GB of
        # bfloat16); weights barely compress, and the zarr metadata records the codec, so load reads either
        context.array.saving.use_compression = False
        context.memory.deepcopy_host_arrays = False  # each batch is read fresh and dropped after its save
        return context

    quiet = _DropLogRecords("Skipping merge of OCDBT checkpoints")
    absl_log = logging.getLogger("absl")
    absl_log.addFilter(quiet)
    total, written = sum(_nbytes(value) for value in params.values()), 0
    try:
        for batch in _batches(params, batch_bytes or STREAM_BATCH_BYTES):
            arrays = {name: jax.device_put(value.read() if is_deferred(value) else value) for name, value in batch.items()}
            with writing(max(chunk_byte_size(tuple(value.shape), value.dtype) for value in batch.values())):
                partial.save(staging.resolve(), arrays)
            del arrays
            _return_freed_memory()
            written += sum(_nbytes(value) for value in batch.values())
            if on_bytes is not None:
                on_bytes(written, total)
        with writing(_CHUNK_BYTES):
            partial.finalize(staging.resolve())
        os.rename(staging / "state", path)
    except Torch2JaxError:
        raise
    except Exception as err:
        raise ArtifactError(f"saving the params checkpoint failed: {type(err).__name__}: {err}") from err
    finally:
        absl_log.removeFilter(quiet)
        for leftover in (staging, staging.parent / f"{staging.name}.partial_save"):
            shutil.rmtree(leftover, ignore_errors=True)


def _return_freed_memory() -> None:
    """Hand memory freed by the last batch back to the OS. Batches are freed in pieces, by Orbax's writer threads
    too, and glibc keeps such memory in its arenas: without this, what a 2 GB conversion holds grows by 0.15 GiB
    over the batches (peak RSS during the save 0.53 GiB over the start, against 0.38 with it). glibc only; a no-op
    elsewhere."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _batches(params: dict, batch_bytes: int):
    """Params grouped in order into batches of at most `batch_bytes` (by dtype size x count)."""
    batch: dict = {}
    size = 0
    for name, value in params.items():
        nbytes = _nbytes(value)
        if batch and size + nbytes > batch_bytes:
            yield batch
            batch, size = {}, 0
        batch[name] = value
        size += nbytes
    if batch:
        yield batch


def _nbytes(value: Any) -> int:
    return int(np.prod(value.shape)) * np.dtype(value.dtype).itemsize




def restore_params(path: Path, tree: dict[str, tuple[tuple[int, ...], str]], shardings: dict[str, Any] | None = None) -> dict:
    """Restore onto the tree the manifest declares (never an untargeted restore), each param onto its
    sharding when given (every process then reads only the shards its own devices hold), else onto the
    default device: params restored as host arrays would be copied to the device on every call (on a GPU,
    every weight over PCIe for each decode step)."""
    import orbax.checkpoint as ocp

    shardings = shardings or {}
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    try:
        wanted = {
            name: jax.ShapeDtypeStruct(shape, dtypes.jax_dtype(dtype), sharding=shardings.get(name) or default)
            for name, (shape, dtype) in tree.items()
        }
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"manifest params.tree is malformed ({err})") from None
    target = {name: spec for name, spec in wanted.items() if spec.size > 0}
    restored = {}
    if target:
        try:
            with ocp.StandardCheckpointer() as checkpointer:
                restored = dict(checkpointer.restore(path.resolve(), target))
        except Exception as err:
            raise ArtifactError(f"restoring params from {path} failed: {type(err).__name__}: {err}") from err
    # zero-size params were not written (save_params): made here from their shape, in the manifest's order
    return {name: restored[name] if name in restored else _empty(spec) for name, spec in wanted.items()}


def _empty(spec: jax.ShapeDtypeStruct) -> jax.Array:
    value = jax.numpy.zeros(spec.shape, spec.dtype)
    return jax.device_put(value, spec.sharding) if spec.sharding is not None else value
