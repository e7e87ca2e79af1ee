"""The one place where torch dtype names map to numpy / JAX dtypes.

The portable graph and the manifest name dtypes by torch's short names (`float32`,
`bfloat16`, `int64`, `bool`, ...). JAX runs 64-bit types only with x64 enabled; without
it `jax_dtype` gives the canonical 32-bit type and `is_narrowed` says so, so the change
is visible (recorded in the manifest) rather than silent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_NUMPY_BY_NAME: dict[str, np.dtype] = {
    "float64": np.dtype("float64"),
    "float32": np.dtype("float32"),
    "float16": np.dtype("float16"),
    "bfloat16": np.dtype(jnp.bfloat16),
    "complex64": np.dtype("complex64"),
    "complex128": np.dtype("complex128"),
    "int64": np.dtype("int64"),
    "int32": np.dtype("int32"),
    "int16": np.dtype("int16"),
    "int8": np.dtype("int8"),
    "uint8": np.dtype("uint8"),
    "uint16": np.dtype("uint16"),
    "uint32": np.dtype("uint32"),
    "uint64": np.dtype("uint64"),
    "bool": np.dtype("bool"),
    "float8_e4m3fn": np.dtype(jnp.float8_e4m3fn),
    "float8_e5m2": np.dtype(jnp.float8_e5m2),
}

SUPPORTED = tuple(_NUMPY_BY_NAME)


def numpy_dtype(name: str) -> np.dtype:
    """The exact numpy dtype for a torch dtype name (no 64-bit narrowing)."""
    try:
        return _NUMPY_BY_NAME[name]
    except KeyError:
        raise TypeError(f"dtype {name!r} has no JAX equivalent; supported: {', '.join(SUPPORTED)}") from None


def jax_dtype(name: str) -> np.dtype:
    """The dtype JAX will actually use for `name` under the current x64 setting."""
    return np.dtype(jax.dtypes.canonicalize_dtype(numpy_dtype(name)))


def is_narrowed(name: str) -> bool:
    """True when JAX stores `name` in a narrower type (64-bit types without x64)."""
    return jax_dtype(name) != numpy_dtype(name)


def name_of(dtype) -> str:
    """The torch-style short name of a numpy / JAX dtype."""
    dt = np.dtype(dtype)
    for name, candidate in _NUMPY_BY_NAME.items():
        if candidate == dt:
            return name
    raise TypeError(f"dtype {dt} has no torch equivalent")


def is_floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def is_integer(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer)


def is_bool(dtype) -> bool:
    return np.dtype(dtype) == np.dtype(bool)
