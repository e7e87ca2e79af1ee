"""Indexing, gather and scatter ops. Negative indices count from the end, as in torch."""

from __future__ import annotations

import jax.numpy as jnp

from ..registry import lowers


def _wrap(index, size):
    return jnp.where(index < 0, index + size, index)


@lowers("aten.embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowers("aten.index_select.default")
def index_select(x, dim, index):
    return jnp.take(x, _wrap(index, x.shape[dim]), axis=dim)


@lowers("aten.index.Tensor")
def index(x, indices):
    """Advanced indexing with a list of optional index tensors (None keeps a dim whole)."""
    key = tuple(
        slice(None) if i is None else (i if i.dtype == jnp.bool_ else _wrap(i, x.shape[d])) for d, i in enumerate(indices)
    )
    return x[key]


@lowers("aten.gather.default")
def gather(x, dim, index, sparse_grad=False):
    return jnp.take_along_axis(x, _wrap(index, x.shape[dim]), axis=dim)
