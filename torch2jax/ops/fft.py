"""FFTs of the core opset. torch's `normalization` code: 0 = unscaled, 1 = 1/sqrt(n), 2 = 1/n."""

from __future__ import annotations

import jax.numpy as jnp

from .registry import lowers

# numpy's `norm` names which direction carries the scale: map torch's codes for each direction
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@lowers("aten._fft_r2c.default")
def fft_r2c(x, dim, normalization, onesided):
    out = jnp.fft.fftn(x, axes=tuple(dim), norm=_FORWARD_NORM[normalization])
    if onesided:
        last = dim[-1]
        out = jnp.take(out, jnp.arange(x.shape[last] // 2 + 1), axis=last)
    return out


@lowers("aten._fft_c2r.default")
def fft_c2r(x, dim, normalization, last_dim_size):
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(x, s=sizes, axes=tuple(dim), norm=_INVERSE_NORM[normalization])


@lowers("aten._fft_c2c.default")
def fft_c2c(x, dim, normalization, forward):
    norms = _FORWARD_NORM if forward else _INVERSE_NORM
    fn = jnp.fft.fftn if forward else jnp.fft.ifftn
    return fn(x, axes=tuple(dim), norm=norms[normalization])


@lowers("aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default", "aten.resolve_conj.default")
def conj(x):
    """Complex conjugate (a value, not torch's lazy conjugate bit); real inputs are unchanged."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x
