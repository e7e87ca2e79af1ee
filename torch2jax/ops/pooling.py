"""Pooling: max / avg / adaptive, as `lax.reduce_window` or strided slices where the windows are regular
(on CPU, every small max window: see `_max_channels_last`).

Every op fixes its number of spatial dims (n), so unbatched inputs (C, *spatial) work as torch's do.
Window geometry is static (shapes are known at trace time), so indices and counts are numpy constants.

Max-pool indices follow torch's kernels: the flat position, within each channel's spatial plane, of
the first maximum in row-major window order; a NaN beats every number, and the last NaN wins.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.errors import InconclusiveDimensionOperation

from .opmath import LOW_PRECISION
from .registry import lowers

_MAX_SLICED_OFFSETS = 16  # windows with more offsets stay reduce_window, the smaller program


def _ints(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(int(v) for v in (value * n if len(value) == 1 else value))


def _acc(x):
    return x.astype(jnp.float32) if x.dtype in LOW_PRECISION else x


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min


def _pool_out_size(size, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    span = size + 2 * p - eff
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside input or left pad
        out -= 1
    return out


def _geometry(x, n, kernel, stride, padding, dilation, ceil_mode):
    """Per spatial dim: (out, lo pad, hi pad) for reduce_window."""
    geo = []
    for size, k, s, p, d in zip(x.shape[-n:], kernel, stride, padding, dilation):
        try:
            out = _pool_out_size(size, k, s, p, d, ceil_mode)
            hi = max(0, (out - 1) * s + d * (k - 1) + 1 - size - p)
        except InconclusiveDimensionOperation:
            raise NotImplementedError(
                f"pooling over a symbolic spatial size ({size}): the windows' padding and counts depend on its value; "
                "export with static spatial sizes (a symbolic batch is fine)") from None
        geo.append((out, p, hi))
    return geo


def _window(x, n, kernel, stride, dilation, geo):
    lead = x.ndim - n
    return dict(
        window_dimensions=(1,) * lead + tuple(kernel),
        window_strides=(1,) * lead + tuple(stride),
        padding=((0, 0),) * lead + tuple((lo, hi) for _, lo, hi in geo),
        window_dilation=(1,) * lead + tuple(dilation),
    )


def _reduce_window(x, n, init, op, window):
    """`lax.reduce_window` over the last n dims, run channels-last when x is (N, C, *spatial).

    XLA CPU computes convolutions channels-last; a pool on the NCHW value makes it transpose the
    activations out of and back into that layout around the pool (resnet's stem: about 2 ms of 8).
    Moving C last here lets those transposes cancel. The window is the same, so the values are too.
    """
    if x.ndim != n + 2 or n < 2:
        return lax.reduce_window(x, init, op, **window)
    to_last = (0,) + tuple(range(2, x.ndim)) + (1,)
    back = (0, x.ndim - 1) + tuple(range(1, x.ndim - 1))
    window = {key: value[:1] + value[2:] + value[1:2] for key, value in window.items()}
    return lax.reduce_window(x.transpose(to_last), init, op, **window).transpose(back)


def _tiles_exactly(x, n, kernel, stride, padding, dilation, geo) -> bool:
    """Whether the windows tile the pooled dims exactly: kernel == stride, no padding or dilation,
    nothing left over."""
    return (
        tuple(kernel) == tuple(stride)
        and not any(padding)
        and all(d == 1 for d in dilation)
        and all(out * k == size for size, (out, _, _), k in zip(x.shape[-n:], geo, kernel))
    )


def _pool(x, n, init, op, kernel, stride, padding, dilation, geo):
    """op over each window, at torch's output size.

    Windows that tile the input exactly are combined as strided slices, one per offset in the window:
    a loop XLA fuses with the producer (after a 2x upsample the 4x larger input is then never written
    out, nor transposed channels-last for reduce_window; unet 0.70 of the reduce_window form).
    Dilated windows take the same path, since JAX has no gradient for a dilated max reduce_window.
    On CPU, max windows over (N, C, *spatial) take `_max_channels_last` instead, overlapping or not.
    """
    kernel, geo = _clipped_to_input(x, n, kernel, dilation, geo)
    nonempty = all(out > 0 for out, _, _ in geo)
    small = math.prod(kernel) <= _MAX_SLICED_OFFSETS and nonempty
    if small and (_tiles_exactly(x, n, kernel, stride, padding, dilation, geo) or any(d > 1 for d in dilation)):

        def default(x):
            return _strided_windows(x, n, init, op, kernel, stride, dilation, geo)
    else:

        def default(x):
            return _crop(_reduce_window(x, n, init, op, _window(x, n, kernel, stride, dilation, geo)), n, geo)

    separable = sum(kernel) <= _MAX_SLICED_OFFSETS and nonempty  # _max_channels_last slices k_1 + ... + k_n times
    if separable and op is lax.max and x.ndim == n + 2 and n >= 2 and all(isinstance(size, int) for size in x.shape[2:]):

        def channels_last(x):
            return _max_channels_last(x, n, init, kernel, stride, dilation, geo)

        return lax.platform_dependent(x, cpu=channels_last, default=default)  # a CPU-only detour
    return default(x)


def _clipped_to_input(x, n, kernel, dilation, geo):
    """A single window larger than the padded input (EfficientNet's AvgPool2d(2560, ceil_mode=True) over 8x8) reads
    what a window of the padded input's size reads; reduce_window would pad the input out to the whole window first
    (13x2560x2560x2560 values there, which XLA:CPU fails to allocate)."""
    kernel, geo = list(kernel), list(geo)
    for i, (size, k, d, (out, lo, _hi)) in enumerate(zip(x.shape[-n:], kernel, dilation, geo)):
        if out == 1 and d == 1 and isinstance(size, int) and k > size + 2 * lo:
            kernel[i], geo[i] = size + 2 * lo, (out, lo, lo)
    return tuple(kernel), geo


def _strided_windows(x, n, init, op, kernel, stride, dilation, geo):
    """op over the windows, combining one strided slice of the padded input per window offset."""
    lead = x.ndim - n
    if any(lo or hi for _, lo, hi in geo):
        x = lax.pad(x, jnp.asarray(init, x.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for _, lo, hi in geo])
    result = None
    for offset in np.ndindex(*kernel):
        first = tuple(o * d for o, d in zip(offset, dilation))
        stop = tuple(f + (out - 1) * s + 1 for f, (out, _, _), s in zip(first, geo, stride))
        term = lax.slice(x, (0,) * lead + first, x.shape[:lead] + stop, (1,) * lead + tuple(stride))
        result = term if result is None else (_first_max(result, term) if op is lax.max else op(result, term))
    return result


def _max_channels_last(x, n, init, kernel, stride, dilation, geo):
    """Max-pool of (N, C, *spatial) as strided slices of the channels-last input, one spatial dim at a time.

    XLA CPU's reduce_window is a slow loop whatever the layout (resnet's 3x3 stride-2 stem pool:
    about a fifth of the model, against 4% for onnxruntime's), and slices of the channels-first
    value make it transpose the conv's channels-last output. Measured on resnet (8x3x64x64,
    1 thread): 0.80 of the reduce_window form. One dim at a time takes k + k slices instead of
    k * k (as fast on resnet's 3x3, and a 3x3x3 window stays 9 slices). The last dim is reduced
    first so that ties, and NaNs, pick the element torch's kernel picks: the first maximum (the
    last NaN) in row-major order.
    """
    to_last = (0,) + tuple(range(2, n + 2)) + (1,)
    back = (0, n + 1) + tuple(range(1, n + 1))
    y = x.transpose(to_last)
    if any(lo or hi for _, lo, hi in geo):
        y = lax.pad(y, jnp.asarray(init, y.dtype), [(0, 0, 0)] + [(lo, hi, 0) for _, lo, hi in geo] + [(0, 0, 0)])
    for axis in reversed(range(1, n + 1)):
        k, s, d, (out, _, _) = kernel[axis - 1], stride[axis - 1], dilation[axis - 1], geo[axis - 1]
        best = None
        for offset in range(k):
            term = lax.slice_in_dim(y, offset * d, offset * d + s * (out - 1) + 1, s, axis)
            best = term if best is None else _first_max(best, term)
        y = best
    return y.transpose(back)


def _first_max(best, term):
    """The larger of two window offsets, keeping the earlier one on a tie and the later NaN: the
    gradient then reaches the one element torch's max-pool backward picks, not half of each."""
    wins = term > best
    if jnp.issubdtype(term.dtype, jnp.floating):
        wins = wins | jnp.isnan(term)
    return jnp.where(wins, term, best)


def _crop(y, n, geo):
    """reduce_window may produce a window more than torch keeps; cut to torch's output size."""
    index = (slice(None),) * (y.ndim - n) + tuple(slice(0, out) for out, _, _ in geo)
    return y[index]


# --- windows as static gathers (for argmax and irregular adaptive windows) ----------------------


def _regular_windows(size, out, k, s, p, d):
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _adaptive_windows(size, out):
    starts = (np.arange(out) * size) // out
    ends = -((-(np.arange(out) + 1) * size) // out)
    k = int((ends - starts).max())
    pos = starts[:, None] + np.arange(k)[None, :]
    return pos, pos < ends[:, None]


def _gather_last(x, pos, size):
    """x[..., size] -> x[..., out, K] at the (clipped) positions: static (out, K), or traced
    (N, C, out, K) positions that differ per plane (fractional pooling)."""
    if isinstance(pos, np.ndarray):
        return jnp.take(x, np.clip(pos, 0, size - 1), axis=-1)
    out, k = pos.shape[-2:]
    lead = pos.shape[:-2]
    flat = pos.reshape(lead + (1,) * (x.ndim - len(lead) - 1) + (out * k,))
    flat = jnp.broadcast_to(flat, x.shape[:-1] + (out * k,))
    return jnp.take_along_axis(x, flat, axis=-1).reshape(x.shape[:-1] + (out, k))


def _argmax_pool(x, windows):
    """Max values and torch-style flat indices over separable windows, one spatial dim at a time."""
    n = len(windows)
    spatial = x.shape[x.ndim - n :]
    values = x
    indices = jnp.broadcast_to(jnp.arange(math.prod(spatial), dtype=jnp.int32).reshape(spatial), x.shape)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    # last spatial dim first: the dim reduced last decides ties, and torch's order is row-major
    for i, (pos, valid) in reversed(list(enumerate(windows))):
        axis = x.ndim - n + i
        size = values.shape[axis]
        v = _gather_last(jnp.moveaxis(values, axis, -1), pos, size)
        ix = _gather_last(jnp.moveaxis(indices, axis, -1), pos, size)
        best = jnp.max(jnp.where(valid, v, _lowest(x.dtype)), axis=-1, keepdims=True)
        choice = jnp.argmax(valid & (v == best), axis=-1)  # first maximum
        if floating:
            nan = valid & jnp.isnan(v)
            last_nan = nan.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
            choice = jnp.where(nan.any(axis=-1), last_nan, choice)
        values = jnp.moveaxis(jnp.take_along_axis(v, choice[..., None], axis=-1)[..., 0], -1, axis)
        indices = jnp.moveaxis(jnp.take_along_axis(ix, choice[..., None], axis=-1)[..., 0], -1, axis)
    return values, indices


# --- max pooling ---------------------------------------------------------------------------------


def _max_values(x, n, kernel_size, stride, padding, dilation, ceil_mode):
    """The max over each window, and the window geometry (kernel, stride, padding, dilation, geo)."""
    kernel = _ints(kernel_size, n)
    stride = _ints(stride, n) if stride else kernel
    padding, dilation = _ints(padding, n), _ints(dilation, n)
    geo = _geometry(x, n, kernel, stride, padding, dilation, ceil_mode)
    values = _pool(x, n, np.array(_lowest(x.dtype), x.dtype), lax.max, kernel, stride, padding, dilation, geo)
    return values, (kernel, stride, padding, dilation, geo)


def _max_pool(x, n, kernel_size, stride, padding, dilation, ceil_mode):
    values, (kernel, stride, padding, dilation, geo) = _max_values(x, n, kernel_size, stride, padding, dilation, ceil_mode)
    windows = [
        _regular_windows(size, out, k, s, p, d)
        for size, (out, _, _), k, s, p, d in zip(x.shape[-n:], geo, kernel, stride, padding, dilation)
    ]
    _, indices = _argmax_pool(x, windows)
    return values, indices


@lowers("aten.max_pool1d_with_indices.default")
def max_pool1d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 1, kernel_size, stride, padding, dilation, ceil_mode)


@lowers("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowers("aten.max_pool3d_with_indices.default")
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowers("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default", ctx=True)
def max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = int(ctx.node.op.split(".")[1][-2])  # aten.max_pool2d.default -> 2
    return _max_values(x, n, kernel_size, stride, padding, dilation, ceil_mode)[0]


# --- average pooling -----------------------------------------------------------------------------


def _avg_pool(x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel = _ints(kernel_size, n)
    stride = _ints(stride, n) if stride else kernel
    padding = _ints(padding, n)
    ones = (1,) * n
    geo = _geometry(x, n, kernel, stride, padding, ones, ceil_mode)
    acc = _acc(x)
    total = _pool(acc, n, np.array(0, acc.dtype), lax.add, kernel, stride, padding, ones, geo)
    if divisor_override:
        if jnp.issubdtype(x.dtype, jnp.integer):
            return lax.div(total, jnp.asarray(divisor_override, total.dtype))
        return (total / divisor_override).astype(x.dtype)
    # divisor per window: with count_include_pad the explicit padding counts, the ceil_mode overhang never does
    divisor = np.ones((), np.int64)
    for size, (out, _, _), k, s, p in zip(x.shape[-n:], geo, kernel, stride, padding):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        divisor = divisor[..., None] * (end - start)
    if jnp.issubdtype(x.dtype, jnp.integer):
        # torch divides the integer sum, truncating toward zero (C division)
        return lax.div(total, jnp.broadcast_to(jnp.asarray(divisor, total.dtype), total.shape))
    return (total / jnp.asarray(divisor.astype(np.float32), acc.dtype)).astype(x.dtype)


@lowers("aten.avg_pool1d.default")
def avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@lowers("aten.avg_pool2d.default")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers("aten.avg_pool3d.default")
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


# --- adaptive pooling ----------------------------------------------------------------------------


def _adaptive_avg(x, n, output_size):
    out_sizes = _ints(output_size, n)
    acc = _acc(x)
    result = acc
    divisor = np.ones((), np.int64)
    for i, out in enumerate(out_sizes):
        axis = x.ndim - n + i
        size = x.shape[axis]
        moved = jnp.moveaxis(result, axis, -1)
        if size % out == 0:
            k = size // out
            summed = moved.reshape(moved.shape[:-1] + (out, k)).sum(axis=-1)
            counts = np.full(out, k)
        else:
            pos, valid = _adaptive_windows(size, out)
            summed = jnp.where(valid, _gather_last(moved, pos, size), 0).sum(axis=-1)
            counts = valid.sum(axis=-1)
        result = jnp.moveaxis(summed, -1, axis)
        divisor = divisor[..., None] * counts
    return (result / jnp.asarray(divisor.astype(np.float32), acc.dtype)).astype(x.dtype)


@lowers("aten.adaptive_avg_pool1d.default")
def adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg(x, 1, output_size)


@lowers("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@lowers("aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, 3, output_size)


def _adaptive_max(x, n, output_size):
    out_sizes = _ints(output_size, n)
    windows = [_adaptive_windows(size, out) for size, out in zip(x.shape[-n:], out_sizes)]
    return _argmax_pool(x, windows)


@lowers("aten.adaptive_max_pool1d.default")
def adaptive_max_pool1d(x, output_size):
    return _adaptive_max(x, 1, output_size)


@lowers("aten.adaptive_max_pool2d.default")
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2, output_size)


@lowers("aten.adaptive_max_pool3d.default")
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3, output_size)


# --- fractional max pooling ---------------------------------------------------------------------


def _fractional_starts(sample, size, out, k):
    """torch's window starts: int((i + u) * alpha) - int(u * alpha), alpha = (size - k) / (out - 1),
    computed in the input's dtype as torch's kernel does; the last window ends at the border."""
    last = jnp.full(sample.shape + (1,), size - k, jnp.int32)
    if out == 1:
        return last
    alpha = jnp.asarray(size - k, sample.dtype) / jnp.asarray(out - 1, sample.dtype)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    starts = ((i + sample[..., None]) * alpha).astype(jnp.int32) - (sample * alpha).astype(jnp.int32)[..., None]
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(x, n, kernel_size, output_size, random_samples):
    """Windows of `kernel_size` at pseudo-random starts drawn from `random_samples` (one u in [0, 1)
    per plane and dim, made by torch.rand in the graph); max and flat index as max pooling's."""
    batched = x.ndim == n + 2
    if not batched:
        x = x[None]
    kernel, outs = _ints(kernel_size, n), _ints(output_size, n)
    samples = random_samples.astype(x.dtype).reshape(x.shape[:2] + (n,))
    # torch's 2-d kernel reads u[0] for the width and u[1] for the height; the 3-d one u[0..2] for T, H, W
    order = [1, 0] if n == 2 else list(range(n))
    windows = []
    for i, (size, out, k) in enumerate(zip(x.shape[2:], outs, kernel)):
        starts = _fractional_starts(samples[..., order[i]], size, out, k)
        windows.append((starts[..., None] + jnp.arange(k, dtype=jnp.int32), np.ones((out, k), bool)))
    values, indices = _argmax_pool(x, windows)
    return (values, indices) if batched else (values[0], indices[0])


@lowers("aten.fractional_max_pool2d.default")
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, 2, kernel_size, output_size, random_samples)


@lowers("aten.fractional_max_pool3d.default")
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, 3, kernel_size, output_size, random_samples)
