"""Input specs as users write them on the command line (torch-free).

    x=float32[batch,3,224,224]        a named symbolic dim (example size 2) and static dims
    x=float32[batch=8,3,224,224]      the example size of a symbolic dim
    ids=int64[batch,seq=16](0..50)    integer values drawn from [0, 50)
    x=inputs/x.npy                    an array file (also for `torch2jax run`)

Dims that share a name are the same dim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputSpecError
from . import dtypes

DEFAULT_DIM_SIZE = 2
_SPEC = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<dtype>\w+)\[(?P<dims>[^\]]*)\](?:\((?P<low>-?\d+)\.\.(?P<high>-?\d+)\))?$")
_DIM = re.compile(r"^(?:(?P<int>\d+)|(?P<sym>[A-Za-z_]\w*)(?:=(?P<size>\d+))?)$")


@dataclass
class InputSpec:
    name: str
    dtype: str
    dims: list[int | str]
    sizes: dict[str, int] = field(default_factory=dict)  # example size of each symbolic dim
    low: int | None = None
    high: int | None = None

    def example_shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else sizes.get(d, DEFAULT_DIM_SIZE) for d in self.dims)

    def dynamic_dims(self) -> dict[int, str]:
        return {axis: d for axis, d in enumerate(self.dims) if isinstance(d, str)}


@dataclass
class FileInput:
    name: str
    path: Path


def parse(text: str) -> InputSpec | FileInput:
    """Parse one `--input` value, with an error that shows the accepted forms."""
    text = text.strip()
    name, sep, rhs = text.partition("=")
    if not sep or not name.isidentifier():
        raise InputSpecError(_usage(text, "it must start with NAME="))
    if rhs.endswith((".npy", ".npz")):
        return FileInput(name, Path(rhs))
    match = _SPEC.match(text.replace(" ", ""))
    if not match:
        raise InputSpecError(_usage(text, "expected NAME=DTYPE[DIMS] or NAME=FILE.npy"))
    dtype = match["dtype"]
    if dtype not in dtypes.SUPPORTED:
        raise InputSpecError(_usage(text, f"unknown dtype {dtype!r}; use one of {', '.join(dtypes.SUPPORTED)}"))
    dims: list[int | str] = []
    sizes: dict[str, int] = {}
    for raw in match["dims"].split(",") if match["dims"] else []:
        dim = _DIM.match(raw)
        if not dim:
            raise InputSpecError(_usage(text, f"bad dim {raw!r}: use a size (3), a name (batch) or name=size (batch=8)"))
        if dim["int"] is not None:
            dims.append(int(dim["int"]))
        else:
            dims.append(dim["sym"])
            if dim["size"] is not None:
                sizes[dim["sym"]] = int(dim["size"])
    low = high = None
    if match["low"] is not None:
        low, high = int(match["low"]), int(match["high"])
        if high <= low:
            raise InputSpecError(_usage(text, f"empty value range ({low}..{high})"))
    return InputSpec(match["name"], dtype, dims, sizes, low, high)


def merged_sizes(specs: list[InputSpec]) -> dict[str, int]:
    """One example size per dim name across all specs; conflicting sizes are an error."""
    sizes: dict[str, int] = {}
    for spec in specs:
        for name, size in spec.sizes.items():
            if sizes.setdefault(name, size) != size:
                raise InputSpecError(f"dim {name!r} is given two example sizes ({sizes[name]} and {size})")
    return sizes


def example_array(spec: InputSpec, sizes: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    """Random example values of the spec's dtype and shape (ints in [low, high), default [0, 10))."""
    shape = spec.example_shape(sizes)
    np_dtype = dtypes.numpy_dtype(spec.dtype)
    if spec.dtype == "bool":
        return rng.random(shape) < 0.5
    if np.issubdtype(np_dtype, np.integer):
        low = 0 if spec.low is None else spec.low
        high = 10 if spec.high is None else spec.high
        return rng.integers(low, high, size=shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def load_array(item: FileInput) -> np.ndarray:
    if not item.path.is_file():
        raise InputSpecError(f"input {item.name!r}: file {item.path} does not exist")
    try:
        data = np.load(item.path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise InputSpecError(f"input {item.name!r}: {item.path} is not a readable .npy/.npz file ({err})") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        if item.name in data.files:
            return data[item.name]
        if len(data.files) == 1:
            return data[data.files[0]]
        raise InputSpecError(f"input {item.name!r}: {item.path} holds {data.files}; name one of them as the input name")
    return data


def _usage(text: str, problem: str) -> str:
    return (
        f"bad --input {text!r}: {problem}.\n"
        "Accepted forms: x=float32[batch,3,224,224]  x=float32[batch=8,3,224,224]  ids=int64[batch,seq](0..50)  x=x.npy"
    )
