"""Safetensors checkpoints read tensor by tensor, never a whole file in memory.

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte range
of the data section) and the raw data. A sharded checkpoint has `model.safetensors.index.json`
mapping each name to its file. `safetensors.safe_open` reads and checks the header (the tensors
tile the data section in order, which ends at the end of the file), so each tensor's byte range
follows from the tensors before it; reading one tensor reads that range into a fresh aligned
array, so memory stays one tensor at a time. bfloat16 and float8 come from ml_dtypes (numpy has
none). Writing stays here too: safetensors' own writers take every tensor in memory at once.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ..errors import InputSpecError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
CODES = {dtype: code for code, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, dtype, shape and absolute byte range."""

    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class Checkpoint:
    """The tensors of one safetensors file or a sharded set; `read(name)` reads one tensor."""

    def __init__(self, entries: dict[str, TensorEntry]):
        self.entries = entries

    @staticmethod
    def open(path: str | Path) -> Checkpoint:
        """A .safetensors file, an index.json, or a directory holding either."""
        path = Path(path)
        if path.is_dir():
            if (path / INDEX).is_file():
                path = path / INDEX
            elif (path / SINGLE).is_file():
                path = path / SINGLE
            else:
                raise InputSpecError(f"{path} holds neither {SINGLE} nor {INDEX}: the weights are streamed from safetensors files")
        if not path.is_file():
            raise InputSpecError(f"weights file {path} does not exist")
        if path.name.endswith(".index.json"):
            return Checkpoint(_read_index(path))
        if path.suffix != ".safetensors":
            raise InputSpecError(f"{path}: streamed weights are read from .safetensors files (or a {INDEX})")
        return Checkpoint(read_header(path))

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def read(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        out = aligned_empty(entry.shape, entry.dtype)
        with open(entry.file, "rb") as f:
            f.seek(entry.start)
            got = f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
        if got != entry.nbytes:
            raise InputSpecError(f"{entry.file}: tensor {name} is truncated ({got} of {entry.nbytes} bytes)")
        return out


_ALIGNMENT = 64  # XLA:CPU adopts a host buffer this aligned without copying it


def mapped(entry: TensorEntry) -> np.ndarray:
    """A copy-on-write memory map of one tensor: file-backed pages, read as touched, no copy in anonymous memory."""
    return np.memmap(entry.file, dtype=entry.dtype, mode="c", offset=entry.start, shape=entry.shape)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose data starts on a 64-byte boundary (one copy of a weight, not two)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors one file holds, from its header alone (safetensors reads and checks it; no data is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            views = [(name, f.get_slice(name)) for name in f.offset_keys()]
            layout = [(name, view.get_dtype(), tuple(int(d) for d in view.get_shape())) for name, view in views]
    except SafetensorError as err:
        reason = str(err).removeprefix("Error while deserializing header: ")
        raise InputSpecError(f"{path} is not a safetensors file or is damaged ({reason})") from None
    unreadable = next(((name, code) for name, code, _shape in layout if code not in DTYPES), None)
    if unreadable is not None:
        raise InputSpecError(f"{path}: tensor {unreadable[0]} has dtype {unreadable[1]}, which torch2jax cannot read")
    sizes = [int(np.prod(shape)) * DTYPES[code].itemsize for _name, code, shape in layout]
    start = path.stat().st_size - sum(sizes)  # the data section: the tensors back to back in offset order, to the end
    entries = {}
    for (name, code, shape), nbytes in zip(layout, sizes):
        entries[name] = TensorEntry(path, DTYPES[code], shape, start, start + nbytes)
        start += nbytes
    return entries


def _read_index(path: Path) -> dict[str, TensorEntry]:
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise InputSpecError(f"{path} is not a safetensors index (no weight_map: {err})") from None
    entries: dict[str, TensorEntry] = {}
    for file in sorted(set(weight_map.values())):
        shard = path.parent / file
        if not shard.is_file():
            raise InputSpecError(f"{path} lists {file}, which does not exist")
        entries.update(read_header(shard))
    missing = [name for name in weight_map if name not in entries]
    if missing:
        raise InputSpecError(f"{path} lists tensors its files do not hold: {', '.join(missing[:10])}")
    return entries


def write(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write a safetensors file from numpy arrays (tests and benchmarks write checkpoints with it)."""
    write_streamed(path, {name: (a.dtype, a.shape) for name, a in tensors.items()}, tensors.__getitem__)


def write_streamed(path: Path, layout: dict[str, tuple[np.dtype, tuple[int, ...]]], make) -> None:
    """Write a safetensors file whose tensors `make(name)` produces one at a time (the writer stays small)."""
    header, offset = {}, 0
    for name, (dtype, shape) in layout.items():
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": CODES[np.dtype(dtype)], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, (dtype, shape) in layout.items():
            array = np.ascontiguousarray(make(name), dtype=dtype)
            if array.shape != tuple(shape):
                raise ValueError(f"{name}: made shape {array.shape}, declared {tuple(shape)}")
            f.write(memoryview(array.reshape(-1).view(np.uint8)))
