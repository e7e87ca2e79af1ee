"""Convolution, kept whole: `lax.conv_general_dilated` (pooling lives in pooling.py).

Low-precision inputs accumulate in float32 (`preferred_element_type`) and the bias is added before
the single rounding back, as torch's kernels do.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .fusion_barrier import apart
from .opmath import LOW_PRECISION
from .registry import lowers


def _tuple(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(int(v) for v in (value * n if len(value) == 1 else value))


def _dimension_numbers(n):
    if not 1 <= n <= 3:
        raise NotImplementedError(f"{n}-d convolution is not supported")
    spatial = "DHW"[-n:]
    return (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")


@lowers("aten.convolution.default")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    unbatched = x.ndim == n + 1
    if unbatched:
        x = x[None]
    stride, padding, dilation = _tuple(stride, n), _tuple(padding, n), _tuple(dilation, n)
    dtype = jnp.result_type(x, weight)
    acc = jnp.float32 if dtype in LOW_PRECISION else None
    if not transposed:

        def conv(x, weight, groups=groups):
            return lax.conv_general_dilated(
                x,
                weight,
                window_strides=stride,
                padding=[(p, p) for p in padding],
                rhs_dilation=dilation,
                dimension_numbers=_dimension_numbers(n),
                feature_group_count=groups,
                preferred_element_type=acc,
            )

        extra = _cpu_channel_padding(x, weight, stride, dilation)
        route = _cpu_grouped_route(weight, groups) if groups > 1 else None
        if _cpu_pointwise(x, weight, stride, padding, groups):

            def pointwise(x, weight):
                return _pointwise_dot(x, weight, stride, acc)

            out = lax.platform_dependent(x, weight, cpu=pointwise, default=conv)
        elif _cpu_patches(x, weight, stride, padding, dilation, groups):

            def patches(x, weight):
                return _patch_dot(x, weight, acc)

            out = lax.platform_dependent(x, weight, cpu=patches, default=conv)
        elif extra:  # a CPU-only detour: other platforms run the plain conv

            def padded(x, weight):
                return conv(*_pad_channels(x, weight, *extra))[:, : weight.shape[0]]

            out = lax.platform_dependent(x, weight, cpu=padded, default=conv)
        elif route:

            def grouped(x, weight):
                if route == "taps":
                    return _grouped_taps(x, weight, stride, padding, dilation, groups, acc, lambda: conv(x, weight))
                parts = zip(jnp.split(x, groups, axis=1), jnp.split(weight, groups, axis=0))
                return jnp.concatenate([conv(a, b, groups=1) for a, b in parts], axis=1)

            if route == "taps":
                out = _cpu_detour(grouped, conv, x, weight)
            else:
                out = lax.platform_dependent(x, weight, cpu=grouped, default=conv)
        else:
            out = conv(x, weight)
    else:
        out = _conv_transpose(x, weight, stride, padding, dilation, _tuple(output_padding, n), groups, acc)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * n)
    out = out.astype(dtype)
    return out[0] if unbatched else out


def _cpu_detour(cpu, plain, x, weight):
    """`cpu(x, weight)` on CPU and `plain(x, weight)` elsewhere, whose derivative is plain's on every
    platform: the conv's own transpose rules (two convs), not the derivative of the detour.

    The taps route unrolls one slice, product and sum per kernel tap (49 for a 7x7 depthwise conv),
    each a handful of shape ops when the batch is symbolic; differentiated, every tap grows a pad, a
    product and a reduction more, so the VJP jax.export serializes with an artifact grew about 3x the
    forward and took most of a ConvNeXt's save (a 50-s vjp export for a tiny one). The plain conv's
    derivative is also the faster one on XLA CPU for these convs (see docs/architecture.md).
    """

    @jax.custom_jvp
    def detour(x, weight):
        return lax.platform_dependent(x, weight, cpu=cpu, default=plain)

    @detour.defjvp
    def detour_jvp(primals, tangents):
        return detour(*primals), jax.jvp(plain, primals, tangents)[1]

    return detour(x, weight)


def _cpu_pointwise(x, weight, stride, padding, groups: int) -> bool:
    """Whether a float32 1x1 conv runs on CPU as a dot over channels (`_pointwise_dot`).

    XLA CPU transposes a conv's weight to (*k, in, out) on every call and runs small convs on
    slower kernels; a dot reads the (out, in) weight as it is. Measured at 1 thread: 0.4-0.95 of
    the conv's time for resnet's 1x1 convs (8x128x4x4 -> 256, stride 2: 57 -> 23 us), 0.10 for
    1x512x7x7 -> 2048; resnet as a whole 0.92. With 3 or 6 input channels the dot is slower
    (8x3x64x64 -> 16: 2.3x), so those stay convs.
    """
    if any(k != 1 for k in weight.shape[2:]) or any(padding) or groups != 1 or weight.shape[1] != x.shape[1]:
        return False
    if x.dtype != jnp.float32 or weight.dtype != jnp.float32:
        return False  # measured on float32 only
    if any(s != 1 for s in stride) and not all(isinstance(size, int) for size in x.shape[2:]):
        return False
    cin = weight.shape[1]
    return cin >= 8 or cin % 4 == 0


def _pointwise_dot(x, weight, stride, acc):
    """A 1x1 conv of (N, C, *spatial): the strided input contracted with the (out, in) weight over C."""
    if any(s != 1 for s in stride):
        x = x[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]
    out = lax.dot_general(x, weight.reshape(weight.shape[:2]), (((1,), (1,)), ((), ())), preferred_element_type=acc)
    return jnp.moveaxis(out, -1, 1)  # (N, *spatial, out) -> (N, out, *spatial)


def _cpu_patches(x, weight, stride, padding, dilation, groups: int) -> bool:
    """Whether a float32 conv that cuts its input into non-overlapping patches (stride = kernel, no padding or
    dilation: a ViT's patch embedding) runs on CPU as one dot over each patch's values (`_patch_dot`).

    XLA CPU transposes the conv's weight, and pads 3 input channels to 4, on every call. Measured at 1 thread
    (jaxlib 0.10), conv -> dot: CLIP's 1x3x224x224 -> 384 in 16x16 patches 1.30 -> 0.61 ms, 8x3x224x224 -> 768
    26.8 -> 8.8 ms, SigLIP's 1x3x384x384 -> 1152 in 14x14 8.3 -> 4.7 ms, Qwen2-VL's 3-d 1024x3x2x14x14 -> 1280
    21.4 -> 14.1 ms; a small 2x3x64x64 -> 32 in 8x8 0.031 -> 0.034 ms, so those (under 64 filters) stay convs."""
    kernel = tuple(weight.shape[2:])
    if groups != 1 or any(padding) or any(d != 1 for d in dilation) or tuple(stride) != kernel or math.prod(kernel) < 2:
        return False
    if x.dtype != jnp.float32 or weight.dtype != jnp.float32 or weight.shape[1] != x.shape[1] or weight.shape[0] < 64:
        return False
    return all(isinstance(size, int) for size in x.shape[2:])


def _patch_dot(x, weight, acc):
    """A conv with stride = kernel and no padding, of (N, C, *spatial): each patch's (C, *kernel) values contracted
    with the (out, C * kernel) weight; the rows and columns past the last whole patch are dropped, as the conv does."""
    kernel, n = weight.shape[2:], weight.ndim - 2
    out = [size // k for size, k in zip(x.shape[2:], kernel)]
    x = x[(slice(None), slice(None), *(slice(0, o * k) for o, k in zip(out, kernel)))]
    x = x.reshape(x.shape[:2] + tuple(d for o, k in zip(out, kernel) for d in (o, k)))  # (N, C, o1, k1, o2, k2, ...)
    order = (0, *(2 + 2 * i for i in range(n)), 1, *(3 + 2 * i for i in range(n)))  # (N, o..., C, k...)
    patches = x.transpose(order).reshape(x.shape[0], *out, -1)
    y = lax.dot_general(patches, weight.reshape(weight.shape[0], -1), (((n + 1,), (1,)), ((), ())), preferred_element_type=acc)
    return jnp.moveaxis(y, -1, 1)  # (N, *out, filters) -> (N, filters, *out)


def _cpu_channel_padding(x, weight, stride, dilation) -> tuple[int, int] | None:
    """Zero channels (input, output) to add so XLA CPU runs a 2-d float32 conv on its fast path.

    XLA CPU (jaxlib 0.10) runs a 2-d float32 conv through YNNPACK when a side has more than 16
    channels and through a generic kernel otherwise, which is 2-5x slower: a small stride-1 conv
    (a CNN's 3 -> 16 stem) is widened to 32 output channels and sliced back (8x3x64x64: 5.3 ->
    2.7 ms; 8x8x32x32 -> 16: 1.22 -> 1.01 ms). YNNPACK is itself 3-7x slower with 3, 5 or 7 input
    channels than with a multiple of 4 (resnet's 7x7 stem: 8.5 -> 1.9 ms). None: leave it.
    """
    if weight.ndim != 4 or x.dtype != jnp.float32 or weight.dtype != jnp.float32 or weight.shape[1] != x.shape[1]:
        return None  # not 2-d float32, or grouped
    cin, cout = x.shape[1], weight.shape[0]
    if max(cin, cout) > 16:  # already on YNNPACK
        return (-cin % 4, 0) if cin in (3, 5, 7) else None
    if any(s != 1 for s in stride) or any(d != 1 for d in dilation):
        return None  # widening measured on stride-1 convs only
    return (-cin % 4, 32 - cout)


def _pad_channels(x, weight, add_in: int, add_out: int):
    """Zero input channels in both operands (they add exact zeros) and zero output filters (sliced off)."""
    x = jnp.pad(x, ((0, 0), (0, add_in), (0, 0), (0, 0)))
    return x, jnp.pad(weight, ((0, add_out), (0, add_in), (0, 0), (0, 0)))


# Grouped convs on XLA CPU (jaxlib 0.10) take a generic kernel 3-50x slower than torch's (a ConvNeXt
# depthwise 7x7 on 8x32x16x16: 14 ms against torch's 0.26 ms). Measured alternatives, CPU only:
_TAPS_MAX = 64  # input channels per group x kernel taps up to which the shifted-product sum wins
_SPLIT_MIN = 16  # channels per group from which one plain conv per group wins (groups=2, 128 each: 42 -> 19 ms)


def _cpu_grouped_route(weight, groups: int) -> str | None:
    """How a grouped conv runs on CPU: "taps" (_grouped_taps), "split" (a conv per group), or None (as is)."""
    per_group, taps = weight.shape[1], math.prod(weight.shape[2:])
    if per_group * taps <= _TAPS_MAX:
        return "taps"
    if per_group >= _SPLIT_MIN and groups <= 64:  # a conv per group in the program: keep their number bounded
        return "split"
    return None


def _grouped_taps(x, weight, stride, padding, dilation, groups: int, acc, plain):
    """A grouped conv as a sum, over kernel taps and each group's input channels, of a shifted and
    strided slice of the input channel times that tap's weight for every output channel.

    The sum is written out and computed apart (fusion_barrier.apart): left to fusion, XLA would compute
    it again inside each consumer (a norm's mean, variance and output). Measured on XLA CPU, with a
    LayerNorm after: depthwise 7x7 on 8x32x16x16 2.7 ms as a loop over kernel rows, 0.76 computed
    apart (torch 0.77); 3x3 on 8x64x32x32 6.7 ms fused, 1.5 apart. Fused wins only before a cheap
    elementwise op (ReLU after that 3x3: 0.88 against 1.11 ms), which a lowering cannot see.

    The conditional's other branch, taken only when the input holds a NaN, is `plain()` (the grouped
    conv as XLA runs it, equal up to rounding): one copy of the unrolled taps in the program, not two.
    """
    n = weight.ndim - 2
    out_ch, per_group = weight.shape[0], weight.shape[1]
    dtype = acc or jnp.result_type(x, weight)
    kernel = weight.shape[2:]

    def taps_sum():
        padded = jnp.pad(x.astype(dtype), [(0, 0), (0, 0)] + [(p, p) for p in padding])
        w = weight.astype(dtype)
        spatial = padded.shape[2:]
        sizes = [(size - d * (k - 1) - 1) // s + 1 for size, k, d, s in zip(spatial, kernel, dilation, stride)]
        # input channel c of every group, repeated for the group's outputs: (N, out_ch, *S) each
        grouped = padded.reshape((padded.shape[0], groups, per_group) + spatial)
        out = None
        for c in range(per_group):
            source = jnp.repeat(grouped[:, :, c], out_ch // groups, axis=1)
            for tap in itertools.product(*(range(k) for k in kernel)):
                starts = [t * d for t, d in zip(tap, dilation)]
                limits = [start + s * (size - 1) + 1 for start, s, size in zip(starts, stride, sizes)]
                piece = lax.slice(source, (0, 0, *starts), (*source.shape[:2], *limits), (1, 1, *stride))
                term = piece * w[(slice(None), c, *tap)].reshape((1, out_ch) + (1,) * n)
                out = term if out is None else out + term
        return out

    return apart(taps_sum, [x, weight], instead=plain)


def _conv_transpose(x, weight, stride, padding, dilation, output_padding, groups, acc):
    """Transposed conv as a dilated conv of the input with the flipped, regrouped kernel."""
    n = weight.ndim - 2
    in_ch, out_per_group = weight.shape[0], weight.shape[1]
    # torch weight: (in, out/groups, *k) -> (out, in/groups, *k), flipped spatially
    w = weight.reshape((groups, in_ch // groups, out_per_group) + weight.shape[2:])
    w = jnp.swapaxes(w, 1, 2).reshape((groups * out_per_group, in_ch // groups) + weight.shape[2:])
    w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
    pads = []
    for k, p, d, extra in zip(weight.shape[2:], padding, dilation, output_padding):
        edge = d * (k - 1) - p
        pads.append((edge, edge + extra))

    def dilated(x, w):
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=(1,) * n,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(n),
            feature_group_count=groups,
            preferred_element_type=acc,
        )

    if all(s == 1 for s in stride) or not all(isinstance(size, int) for size in x.shape[2:]):
        return dilated(x, w)

    def phases(x, w):
        return _conv_transpose_phases(x, w, stride, pads, dilation, groups, acc)

    return lax.platform_dependent(x, w, cpu=phases, default=dilated)


def _conv_transpose_phases(x, w, stride, pads, dilation, groups, acc):
    """The stride-s dilated conv above, computed as s**n ordinary convs of the undilated input, one
    per output phase (the outputs at s*m + r), interleaved.

    Output position s*m + r only meets the kernel taps that land on real (not inserted zero) input
    rows, an evenly spaced subset, so each phase is a plain conv with that subset of the kernel.
    XLA CPU runs lhs-dilated convs on a generic kernel that multiplies the inserted zeros too
    (8x64x32x32 -> 32, 4x4, stride 2: 17.6 ms against torch's 12.8); the phase convs take its fast
    path and do 1/s**n of the multiplies.
    """
    n = w.ndim - 2
    sizes_in = x.shape[2:]
    sizes_out = [(size - 1) * s + 1 + lo + hi - d * (k - 1)
                 for size, s, (lo, hi), d, k in zip(sizes_in, stride, pads, dilation, w.shape[2:])]
    rows = [-(-size // s) for size, s in zip(sizes_out, stride)]  # outputs per phase, before cropping
    out_ch = w.shape[0]
    parts = []  # in itertools.product's order: row-major over the phases
    for phase in itertools.product(*(range(s) for s in stride)):
        source, kernel, padding, phase_dilation = x, w, [], []
        for axis, (r, s, (lo, _), d, k, size, m) in enumerate(zip(phase, stride, pads, dilation, w.shape[2:], sizes_in, rows)):
            taps = [t for t in range(k) if (r + d * t - lo) % s == 0]
            first, last = ((r + d * t - lo) // s for t in (taps[0], taps[-1])) if taps else (size, size)
            # phase output j reads input rows j + first .. j + last: pad where that leaves the input,
            # crop (rather than pad negatively, which JAX's conv gradient mishandles) where it skips rows
            start, stop = max(first, 0), min(m - 1 + last, size - 1) + 1
            if stop <= start:  # no tap ever lands on an input row: this phase is all zeros
                source = None
                break
            step = taps[1] - taps[0] if len(taps) > 1 else s  # one tap: any spacing, dilation 1
            kernel = lax.slice_in_dim(kernel, taps[0], taps[-1] + 1, step, axis=2 + axis)
            source = lax.slice_in_dim(source, start, stop, axis=2 + axis)
            padding.append((start - first, m - 1 + last - (stop - 1)))
            phase_dilation.append(d * step // s)
        if source is None:
            parts.append(jnp.zeros((x.shape[0], out_ch, *rows), acc or jnp.result_type(x, w)))
            continue
        parts.append(lax.conv_general_dilated(
            source, kernel, window_strides=(1,) * n, padding=padding, rhs_dilation=phase_dilation,
            dimension_numbers=_dimension_numbers(n), feature_group_count=groups, preferred_element_type=acc))
    out = _interleave(parts, stride, rows)
    return out[(slice(None), slice(None), *(slice(0, size) for size in sizes_out))]


def _interleave(parts, stride, rows):
    """parts[phase] (phases in row-major order) of shape (N, C, *rows) -> (N, C, *(rows * stride)),
    the part of phase r along a dim giving that dim's positions s*m + r."""
    n = len(stride)
    stacked = jnp.stack(parts, axis=2).reshape(parts[0].shape[:2] + tuple(stride) + tuple(rows))
    # (N, C, s_1..s_n, m_1..m_n) -> (N, C, m_1, s_1, ..., m_n, s_n)
    order = [0, 1] + [axis for i in range(n) for axis in (2 + n + i, 2 + i)]
    return stacked.transpose(order).reshape(parts[0].shape[:2] + tuple(m * s for m, s in zip(rows, stride)))


@lowers("aten.col2im.default")
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    """nn.functional.fold: sum each column back onto the (padded) image at its patch position."""
    kernel, dil, pad, st = (_tuple(v, 2) for v in (kernel_size, dilation, padding, stride))
    out_h, out_w = (int(v) for v in output_size)
    unbatched = x.ndim == 2
    if unbatched:
        x = x[None]
    blocks = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, d, p, s in zip((out_h, out_w), kernel, dil, pad, st)]
    n, c = x.shape[0], x.shape[1] // (kernel[0] * kernel[1])
    cols = x.reshape(n, c, kernel[0], kernel[1], blocks[0], blocks[1])
    canvas = jnp.zeros((n, c, out_h + 2 * pad[0], out_w + 2 * pad[1]), x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            top, left = i * dil[0], j * dil[1]
            rows = slice(top, top + st[0] * (blocks[0] - 1) + 1, st[0])
            columns = slice(left, left + st[1] * (blocks[1] - 1) + 1, st[1])
            canvas = canvas.at[:, :, rows, columns].add(cols[:, :, i, j])
    out = canvas[:, :, pad[0] : pad[0] + out_h, pad[1] : pad[1] + out_w]
    return out[0] if unbatched else out


@lowers("torch2jax.conv_batch_norm.default")
def conv_batch_norm(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                    bn_weight, bn_bias, running_mean, running_var, momentum, eps):
    """aten.convolution followed by eval-mode batch norm, folded (see torch2jax/lowering/passes.py).

    scale = bn_weight / sqrt(var + eps) multiplies the conv's output channels, so it multiplies the
    weights instead; the bias becomes (bias - mean) * scale + bn_bias. Outputs as the norm's.
    """
    if jnp.result_type(x, weight) in LOW_PRECISION:  # folding would round the weights differently from torch
        from .normalization import batch_norm_inference

        out = convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        return batch_norm_inference(out, bn_weight, bn_bias, running_mean, running_var, momentum, eps)
    acc = weight.dtype
    scale = lax.rsqrt(running_var.astype(acc) + eps)
    if bn_weight is not None:
        scale = scale * bn_weight.astype(acc)
    shift = -running_mean.astype(acc) * scale if bias is None else (bias.astype(acc) - running_mean.astype(acc)) * scale
    if bn_bias is not None:
        shift = shift + bn_bias.astype(acc)
    folded = (weight.astype(acc) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
    out = convolution(x, folded, shift, stride, padding, dilation, transposed, output_padding, groups)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty
