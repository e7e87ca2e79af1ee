"""The lowerings and graph passes that exist for speed keep torch's numbers (and grads) exactly.

Each rewrite takes a path that the generic OpInfo samples rarely reach: the conv channel
padding, grouped convs as taps or one conv per group, channels-last pooling, conv + batch-norm
folding, and attention's safe softmax and GQA.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax import interpreter, passes, registry
from torch2jax.ops.attention import scaled_dot_product_attention
from torch2jax.ops.conv import _cpu_channel_padding, _cpu_grouped_route, convolution
from torch2jax.ops.linalg import LINEAR_WEIGHT_FIRST_ROWS
from torch2jax.ops.pooling import avg_pool2d, max_pool2d_with_indices

from .helpers import max_err


def _j(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(t.detach().numpy())


def _assert_conv_and_grads_match(f, x: torch.Tensor, w: torch.Tensor, want: torch.Tensor) -> None:
    """f(x, w) under jit, and its input and weight gradients of sum(out**2), against torch's, at
    float32 rounding of each one's scale."""
    got = jax.jit(f)(_j(x), _j(w))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-5 * float(want.abs().max())
    gx, gw = jax.grad(lambda xj, wj: jnp.sum(f(xj, wj) ** 2), argnums=(0, 1))(_j(x), _j(w))
    (want**2).sum().backward()
    for got_grad, want_grad in ((gx, x.grad), (gw, w.grad)):
        assert max_err(got_grad, want_grad) < 1e-5 * float(want_grad.abs().max())


# --- convolution: channels padded onto XLA CPU's fast path ---------------------------------------


@pytest.mark.parametrize("cin, cout", [(3, 32), (5, 32), (7, 32), (3, 16), (8, 16), (16, 16), (4, 12)])
@pytest.mark.parametrize("kernel, stride, padding, dilation", [(7, 2, 3, 1), (3, 1, 1, 1), (3, 2, 0, 2), (1, 1, 0, 1)])
def test_conv_padded_channels_match_torch(cin, cout, kernel, stride, padding, dilation):
    torch.manual_seed(0)
    x = torch.randn(2, cin, 20, 20, requires_grad=True)
    w = torch.randn(cout, cin, kernel, kernel, requires_grad=True)
    b = torch.randn(cout)
    want = torch.nn.functional.conv2d(x, w, b, stride, padding, dilation)

    def f(xj, wj):
        return convolution(xj, wj, _j(b), [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], 1)

    got = f(_j(x), _j(w))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-4
    # the zero channels must not leak into the gradients (shapes and values as torch's)
    gx, gw = jax.grad(lambda xj, wj: jnp.sum(f(xj, wj) ** 2), argnums=(0, 1))(_j(x), _j(w))
    (want**2).sum().backward()
    assert gx.shape == tuple(x.shape) and gw.shape == tuple(w.shape)
    # against the gradient's scale: an element that cancels to near zero still carries the rounding of
    # the hundreds of large products it sums (the order differs with XLA's threading); a leak is O(scale)
    for got_grad, want_grad in ((gx, x.grad), (gw, w.grad)):
        assert max_err(got_grad, want_grad) < 1e-5 * float(want_grad.abs().max())


# --- grouped convolution: taps (written out or looped) and one conv per group on CPU ---------------

GROUPED = {  # (input shape, weight shape, groups, stride, padding, dilation): route
    "depthwise 7x7 (loop)": ((2, 8, 11, 13), (8, 1, 7, 7), 8, 1, 3, 1),
    "depthwise 3x3 (written out)": ((2, 8, 11, 13), (8, 1, 3, 3), 8, 1, 1, 1),
    "channel multiplier 2": ((2, 8, 11, 13), (16, 1, 3, 3), 8, 1, 1, 1),
    "strided": ((2, 8, 11, 13), (8, 1, 3, 3), 8, 2, 1, 1),
    "dilated, no padding": ((2, 8, 11, 13), (8, 1, 3, 5), 8, 1, 0, 2),
    "1-d, 31 taps (loop)": ((2, 12, 40), (12, 1, 31), 12, 1, 15, 1),
    "3-d depthwise": ((2, 4, 5, 6, 7), (4, 1, 3, 3, 3), 4, 1, 1, 1),
    "4 channels per group (loop)": ((2, 16, 9, 9), (32, 4, 3, 3), 4, 1, 1, 1),
    "one conv per group": ((2, 64, 9, 9), (64, 32, 3, 3), 2, 1, 1, 1),
    "1-d, one conv per group": ((2, 64, 40), (64, 16, 16), 4, 1, 8, 1),
}


@pytest.mark.parametrize("case", list(GROUPED))
def test_grouped_conv_matches_torch(case):
    xs, ws, groups, stride, padding, dilation = GROUPED[case]
    n = len(xs) - 2
    torch.manual_seed(0)
    x, w, b = torch.randn(*xs, requires_grad=True), torch.randn(*ws, requires_grad=True), torch.randn(ws[0])
    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[n - 1]
    want = conv(x, w, b, stride, padding, dilation, groups)

    def f(xj, wj):
        return convolution(xj, wj, _j(b), [stride] * n, [padding] * n, [dilation] * n, False, [0] * n, groups)

    _assert_conv_and_grads_match(f, x, w, want)
    # bfloat16: accumulated in float32 and rounded once, as torch does
    xb, wb, bb = (t.detach().bfloat16() for t in (x, w, b))
    want_b = conv(xb, wb, bb, stride, padding, dilation, groups).float()
    got_b = convolution(_j(xb.float()).astype(jnp.bfloat16), _j(wb.float()).astype(jnp.bfloat16),
                        _j(bb.float()).astype(jnp.bfloat16), [stride] * n, [padding] * n, [dilation] * n, False, [0] * n, groups)
    assert got_b.dtype == jnp.bfloat16
    assert max_err(got_b.astype(jnp.float32), want_b) <= 2 ** -7 * float(want_b.abs().max())


def test_grouped_conv_routes():
    def route(ws, groups):
        return _cpu_grouped_route(jnp.zeros(ws), groups)

    assert route((32, 1, 7, 7), 32) == "taps", "depthwise: XLA CPU's grouped conv is 10-50x slower"
    assert route((128, 4, 3, 3), 32) == "taps"
    assert route((256, 128, 3, 3), 2) == "split", "wide groups: one YNNPACK conv each"
    assert route((64, 8, 3, 3), 8) is None, "8 channels x 9 taps: neither measured faster"


def test_grouped_taps_are_summed_once_before_a_norm():
    """The taps' sum is computed apart, not again inside each of a LayerNorm's reductions."""
    x, w = jnp.ones((2, 32, 9, 9)), jnp.ones((32, 1, 7, 7))

    def conv_then_norm(x, w):
        y = convolution(x, w, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 32)
        mean = y.mean(1, keepdims=True)
        return (y - mean) / jnp.sqrt(((y - mean) ** 2).mean(1, keepdims=True) + 1e-6)

    compiled = jax.jit(conv_then_norm).lower(x, w).compile().as_text()
    assert " conditional(" in compiled, "the sum runs in a computation of its own"


def test_grouped_conv_with_symbolic_spatial_dims_round_trips(tmp_path):
    module = nn.Conv2d(8, 8, 7, padding=3, groups=8).eval()
    model = torch2jax.convert(module, (torch.randn(2, 8, 12, 12),), dynamic_shapes={"input": {0: "batch", 2: "h", 3: "w"}})
    torch2jax.save(model, tmp_path / "art")
    loaded = torch2jax.load(tmp_path / "art")
    for shape in [(3, 8, 9, 10), (1, 8, 16, 5)]:
        x = torch.randn(*shape)
        assert max_err(loaded(x.numpy()), module(x)) < 1e-5


def test_conv_channel_padding_choices():
    def extra(cin, cout, stride=1, dtype=jnp.float32):
        x, w = jnp.zeros((1, cin, 8, 8), dtype), jnp.zeros((cout, cin, 3, 3), dtype)
        return _cpu_channel_padding(x, w, (stride, stride), (1, 1))

    assert extra(3, 64) == (1, 0), "odd input channels on YNNPACK: to a multiple of 4"
    assert extra(32, 64) is None, "already fast"
    assert extra(3, 16) == (1, 16), "a small conv: widened to 32 outputs, onto YNNPACK"
    assert extra(16, 16) == (0, 16)
    assert extra(3, 16, stride=2) is None, "widening measured on stride 1 only"
    assert extra(3, 16, dtype=jnp.bfloat16) is None


def test_conv_grouped_and_unbatched_are_not_padded():
    torch.manual_seed(0)
    x, w = torch.randn(3, 9, 9), torch.randn(24, 3, 3, 3)  # unbatched, 3 channels
    got = convolution(_j(x), _j(w), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert max_err(got, torch.nn.functional.conv2d(x, w, padding=1)) < 1e-4
    x, w = torch.randn(2, 9, 9, 9), torch.randn(24, 3, 3, 3)  # 3 groups of 3 channels
    got = convolution(_j(x), _j(w), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 3)
    assert max_err(got, torch.nn.functional.conv2d(x, w, groups=3)) < 1e-4


# --- strided transposed convolution: one ordinary conv per output phase on CPU --------------------

TRANSPOSED = [  # (spatial dims, stride, kernel, padding, dilation, output_padding, groups)
    (2, 2, 4, 1, 1, 0, 1),  # a UNet's upsampling conv
    (2, 2, 3, 1, 1, 1, 1),
    (2, 2, 2, 0, 1, 0, 1),  # kernel == stride: one tap per phase
    (2, 3, 5, 2, 1, 2, 2),
    (2, 2, 1, 0, 1, 1, 1),  # phases without any tap
    (2, 2, 3, 4, 1, 0, 1),  # padding past the kernel: phases crop the input
    (2, 2, 3, 1, 2, 1, 1),  # dilation that shares a factor with the stride
    (2, 3, 3, 1, 2, 0, 1),
    (1, 2, 4, 1, 1, 1, 2),
    (3, 2, 3, 1, 1, 1, 1),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=[str(c) for c in TRANSPOSED])
def test_strided_transposed_conv_matches_torch(case):
    n, stride, kernel, padding, dilation, output_padding, groups = case
    conv = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
            3: torch.nn.functional.conv_transpose3d}[n]
    torch.manual_seed(0)
    x = torch.randn(2, 4, *[7, 6, 5][:n], requires_grad=True)
    w = torch.randn(4, 6 // groups, *[kernel] * n, requires_grad=True)
    b = torch.randn(6)
    want = conv(x, w, b, stride, padding, output_padding, groups, dilation)

    def f(xj, wj):
        return convolution(xj, wj, _j(b), [stride] * n, [padding] * n, [dilation] * n, True, [output_padding] * n, groups)

    _assert_conv_and_grads_match(f, x, w, want)


def test_strided_transposed_conv_runs_no_dilated_input_on_cpu():
    x, w = jnp.ones((1, 8, 5, 5)), jnp.ones((8, 4, 4, 4))
    compiled = jax.jit(lambda x, w: convolution(x, w, None, [2, 2], [1, 1], [1, 1], True, [0, 0], 1)).lower(x, w).compile().as_text()
    assert compiled.count("convolution(") == 4, "one conv per output phase"
    assert "lhs_dilate" not in compiled, "no conv over an input with zeros inserted"


# --- upsampling by a whole factor, as interleaved slices ------------------------------------------

# (input spatial shape, interpolate kwargs, whether every spatial dim is a whole-factor upsample). The
# graph keeps nearest and bilinear 2-d whole; torch's decompositions take the other modes to aten.index.
UPSAMPLE = [
    ((6, 5), dict(scale_factor=2, mode="nearest"), True),
    ((6, 5), dict(size=(18, 10), mode="nearest"), True),
    ((6, 5), dict(scale_factor=2, mode="bilinear"), True),
    ((6, 5), dict(scale_factor=3, mode="bilinear"), True),
    ((6, 5), dict(size=(24, 20), mode="bilinear"), True),
    ((1, 5), dict(scale_factor=2, mode="bilinear"), True),
    ((6, 5), dict(scale_factor=2, mode="bilinear", align_corners=True), True),
    ((6, 5), dict(size=(9, 7), mode="bilinear"), False),
    ((6, 5), dict(scale_factor=1.5, mode="nearest"), False),
    ((6, 5), dict(size=(3, 10), mode="bilinear"), False),
]


class Interpolate(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return torch.nn.functional.interpolate(x, **self.kwargs)


@pytest.mark.parametrize("spatial, kwargs, sliced", UPSAMPLE, ids=[f"{s}-{k}" for s, k, _ in UPSAMPLE])
def test_upsample_matches_torch_and_whole_factors_need_no_gather(spatial, kwargs, sliced):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial, requires_grad=True)
    module = Interpolate(**kwargs)
    want = module(x)
    jm = torch2jax.convert(module, (x.detach(),))
    got = jax.jit(jm.apply)(jm.params, _j(x))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-6 * float(want.abs().max())
    grad = jax.grad(lambda xj: jnp.sum(jm.apply(jm.params, xj) ** 3))(_j(x))
    (want**3).sum().backward()
    assert max_err(grad, x.grad) < 1e-5 * float(x.grad.abs().max())
    hlo = jax.jit(jm.apply).lower(jm.params, _j(x)).as_text()
    if sliced:
        assert "gather" not in hlo, "a whole-factor upsample reads shifted slices, not a gather"
    else:
        assert "gather" in hlo, "other sizes keep the general (gather) form"


# --- pooling, run channels-last -------------------------------------------------------------------


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [(3, 2, 1, False), (2, 2, 0, True), (3, 2, 0, True)])
def test_pooling_channels_last_matches_torch(kernel, stride, padding, ceil_mode):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 11, 13)
    values, indices = max_pool2d_with_indices(_j(x), [kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], ceil_mode)
    want_values, want_indices = torch.nn.functional.max_pool2d(x, kernel, stride, padding, 1, ceil_mode, return_indices=True)
    assert max_err(values, want_values) == 0
    np.testing.assert_array_equal(np.asarray(indices), want_indices.numpy())
    for include in (True, False):
        got = avg_pool2d(_j(x), [kernel] * 2, [stride] * 2, [padding] * 2, ceil_mode, include)
        want = torch.nn.functional.avg_pool2d(x, kernel, stride, padding, ceil_mode, include)
        assert max_err(got, want) < 1e-6


class Pools(nn.Module):
    def __init__(self, kernel, stride, ceil_mode=False):
        super().__init__()
        self.args = dict(kernel_size=kernel, stride=stride, ceil_mode=ceil_mode)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, **self.args), torch.nn.functional.avg_pool2d(x, **self.args)


TILED_POOLS = [  # (spatial, kernel, stride, ceil_mode, tiles exactly)
    ((8, 6), 2, 2, False, True),
    ((9, 6), 3, 3, True, True),
    ((8, 12), (2, 4), (2, 4), False, True),
    ((9, 6), 2, 2, False, False),  # a row left over
    ((9, 7), 2, 2, True, False),  # ceil_mode's partial windows
    ((8, 8), 3, 2, False, False),  # overlapping windows
]


@pytest.mark.parametrize("spatial, kernel, stride, ceil_mode, tiles", TILED_POOLS)
def test_pools_over_exact_tiles_are_strided_slices(spatial, kernel, stride, ceil_mode, tiles):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial).mul(2).round().requires_grad_()  # ties: the gradient goes where torch's does
    module = Pools(kernel, stride, ceil_mode)
    want = module(x)
    jm = torch2jax.convert(module, (x.detach(),))
    got = jax.jit(jm.apply)(jm.params, _j(x))
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape)
        assert max_err(g, w) < 1e-6
    grad = jax.grad(lambda xj: sum(jnp.sum(y**3 + y) for y in jm.apply(jm.params, xj)))(_j(x))
    sum((y**3 + y).sum() for y in want).backward()
    assert max_err(grad, x.grad) < 1e-5 * float(x.grad.abs().max())
    hlo = jax.jit(jm.apply).lower(jm.params, _j(x)).as_text()
    windows = hlo.count("reduce_window")
    if tiles:
        assert windows == 0, "windows that tile the input exactly are strided slices, not reduce_window"
    else:
        assert windows > 0


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [(2, 2, 0, False), (3, 1, 1, False), (3, 2, 1, True)])
def test_dilated_max_pool_matches_torch_with_gradients(kernel, stride, padding, ceil_mode):
    # JAX has no gradient for a dilated max reduce_window: these windows are strided slices
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 10).mul(2).round().requires_grad_()  # with ties
    x.data[0, 0, 0, 0] = float("nan")
    want = torch.nn.functional.max_pool2d(x, kernel, stride, padding, dilation=2, ceil_mode=ceil_mode)
    values, _ = max_pool2d_with_indices(_j(x), [kernel] * 2, [stride] * 2, [padding] * 2, [2, 2], ceil_mode)
    np.testing.assert_array_equal(np.asarray(values), want.detach().numpy())  # NaN where torch has it
    pooled = lambda xj: max_pool2d_with_indices(xj, [kernel] * 2, [stride] * 2, [padding] * 2, [2, 2], ceil_mode)[0]  # noqa: E731
    grad = jax.grad(lambda xj: jnp.sum(jnp.nan_to_num(pooled(xj)) ** 3 + pooled(xj)))(_j(x))
    (torch.nan_to_num(want) ** 3 + want).sum().backward()
    np.testing.assert_allclose(np.asarray(grad), x.grad.numpy(), rtol=1e-5)


# --- conv + eval-mode batch norm folding ----------------------------------------------------------


class ConvBN(nn.Module):
    def __init__(self, shared: bool = False, bias: bool = True, affine: bool = True):
        super().__init__()
        self.shared = shared
        self.conv1 = nn.Conv2d(3, 24, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(24, affine=affine)
        self.conv2 = nn.Conv2d(24, 32, 3, stride=2, bias=bias)
        self.bn2 = nn.BatchNorm2d(32, affine=affine)

    def forward(self, x):
        y = self.conv1(x)
        z = torch.relu(self.bn1(y))
        if self.shared:  # the raw conv output is used again: that conv must not be folded
            z = z + y
        return self.bn2(self.conv2(z))


def _trained(module: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)
    return module.eval()


def _folded_count(graph) -> int:
    return sum(node.op == passes.CONV_BATCH_NORM for node in passes.optimize(graph).nodes)


@pytest.mark.parametrize("shared, bias, affine, folds", [(False, True, True, 2), (True, True, True, 1), (False, False, False, 2)])
def test_conv_batch_norm_fold_matches_torch(shared, bias, affine, folds):
    torch.manual_seed(0)
    module = _trained(ConvBN(shared, bias, affine))
    x = torch.randn(2, 3, 16, 16)
    model = torch2jax.convert(module, (x,))
    assert _folded_count(model.graph) == folds
    assert not any(node.op == passes.CONV_BATCH_NORM for node in model.graph.nodes), "the saved graph stays plain ATen"
    assert set(model.params) == set(module.state_dict()), "params keep their state_dict names"
    with torch.no_grad():
        want = module(x)
    assert max_err(model(x.numpy()), want) < 1e-5


def test_conv_batch_norm_fold_keeps_gradients():
    """Fine-tuning through the folded function: grads for every conv and norm param as unfolded."""
    torch.manual_seed(0)
    module = _trained(ConvBN())
    x = torch.randn(2, 3, 16, 16)
    model = torch2jax.convert(module, (x,))
    unfolded = interpreter.build(model.graph)
    folded = interpreter.build(passes.optimize(model.graph))
    leaves = [jnp.asarray(x.numpy())]

    floats = {k: v for k, v in model.params.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    others = {k: v for k, v in model.params.items() if k not in floats}  # num_batches_tracked

    def loss(run):
        return lambda params: jnp.sum(run({**params, **others}, leaves)[0][0] ** 2)

    want = jax.grad(loss(unfolded))(floats)
    got = jax.grad(loss(folded))(floats)
    for name in ("conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.bias"):
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-4, atol=1e-4, err_msg=name)


def test_conv_batch_norm_fold_bfloat16_rounds_as_torch():
    """In bfloat16 the norm is not folded into the weights (that would round them differently)."""
    torch.manual_seed(0)
    module = _trained(ConvBN())
    x = torch.randn(2, 3, 16, 16)
    model = torch2jax.convert(module, (x,), dtype="bfloat16")
    with torch.no_grad():
        want = module.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    got = np.asarray(model(jnp.asarray(x.numpy(), jnp.bfloat16)), np.float32)
    np.testing.assert_allclose(got, want.numpy(), rtol=1.6e-2, atol=1e-2)


# --- attention -----------------------------------------------------------------------------------


def _sdpa_both(q, k, v, **kw):
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    jkw = {key: _j(val) if isinstance(val, torch.Tensor) else val for key, val in kw.items()}
    return scaled_dot_product_attention(None, _j(q), _j(k), _j(v), **jkw), want


def test_attention_fully_masked_rows_give_zeros():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    mask = torch.rand(2, 1, 5, 6) > 0.3
    mask[0, 0, 2] = False  # one query sees no key
    got, want = _sdpa_both(q, k, v, attn_mask=mask)
    assert max_err(got, want) < 1e-5
    assert float(jnp.abs(got[0, :, 2]).max()) == 0
    float_mask = torch.zeros(2, 1, 5, 6).masked_fill(~mask, float("-inf"))
    got, want = _sdpa_both(q, k, v, attn_mask=float_mask)
    assert max_err(got, want) < 1e-5 and not bool(jnp.isnan(got).any())


@pytest.mark.parametrize("lq, lk", [(4, 7), (7, 4), (5, 5)])
def test_attention_causal_top_left_and_scale(lq, lk):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, lq, 8), torch.randn(2, 2, lk, 8), torch.randn(2, 2, lk, 8)
    got, want = _sdpa_both(q, k, v, is_causal=True, scale=0.3)
    assert max_err(got, want) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa_matches_torch(causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    mask = None if causal else torch.randn(2, 1, 5, 5)
    got, want = _sdpa_both(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    assert got.shape == (2, 8, 5, 16)
    assert max_err(got, want) < 1e-5
    grads = jax.grad(lambda q_, k_: jnp.sum(scaled_dot_product_attention(None, q_, k_, _j(v), is_causal=causal, enable_gqa=True)),
                     argnums=(0, 1))(_j(q), _j(k))
    assert grads[0].shape == q.shape and grads[1].shape == k.shape and all(bool(jnp.isfinite(g).all()) for g in grads)


# --- bmm of a weight broadcast over the batch: one matmul -------------------------------------------


class SequenceProjection(nn.Module):
    """x @ w.T over a whole (steps, batch, features) sequence in the form torch's decomposition gives
    an LSTM's input projection, next to a bmm of a 3-d operand expanded from size 1 (left alone)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 6))
        self.batched = nn.Parameter(torch.randn(1, 6, 5))

    def forward(self, x):
        shared = torch.bmm(x, self.w.t().expand(x.shape[0], 6, 12))
        per_step = torch.bmm(x, self.batched.expand(x.shape[0], 6, 5))
        return shared, per_step


def test_bmm_of_a_broadcast_weight_becomes_one_matmul():
    torch.manual_seed(0)
    module = SequenceProjection()
    x = torch.randn(7, 3, 6)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "steps"}})
    optimized = passes.optimize(model.graph)
    assert sum(node.op == passes.MATMUL for node in optimized.nodes) == 1, "the 2-d weight's bmm is rewritten"
    assert sum(node.op == passes.BMM for node in optimized.nodes) == 1, "a 3-d operand expanded from size 1 is left alone"
    with torch.no_grad():
        for steps in (7, 4):
            x = torch.randn(steps, 3, 6)
            for got, want in zip(model(x.numpy()), module(x)):
                assert max_err(got, want) < 1e-5
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, x.numpy())[0] ** 2))(model.params)
    (module(x)[0] ** 2).sum().backward()
    assert max_err(grads["w"], module.w.grad) < 1e-4


def test_lstm_matches_torch():
    torch.manual_seed(0)
    module = nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
    x = torch.randn(3, 5, 6)
    model = torch2jax.convert(module, (x,))
    assert any(node.op == passes.BMM for node in model.graph.nodes), "torch's decomposition expands the weights"
    optimized = passes.optimize(model.graph)
    assert not any(node.op == passes.BMM for node in optimized.nodes), "no copies of the weights"
    read = [node.args[1]["ref"] for node in optimized.nodes if node.op == passes.LINEAR]
    assert sum(ref.startswith("p_weight_hh") for ref in read) == 20, "w_hh at each of 5 steps per layer and direction"
    transposed = [node.args[0].get("ref", "") for node in optimized.nodes if node.op == passes.PERMUTE]
    assert not any(ref.startswith("p_weight_hh") for ref in transposed), "w_hh is read as stored at every step"
    with torch.no_grad():
        want, (h, c) = module(x)
    got, (gh, gc) = model(x.numpy())
    assert max(max_err(got, want), max_err(gh, h), max_err(gc, c)) < 1e-5


def test_bmm_rewrite_keeps_a_view_that_something_else_reads():
    class SharedView(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4))

        def forward(self, x):
            expanded = self.w.expand(x.shape[0], 6, 4).reshape(x.shape[0], 6, 4)
            return torch.bmm(x, expanded), expanded.sum()

    torch.manual_seed(0)
    module = SharedView()
    x = torch.randn(3, 5, 6)
    model = torch2jax.convert(module, (x,))
    optimized = passes.optimize(model.graph)
    names = {node.name for node in optimized.nodes} | {i.name for i in optimized.inputs}
    for node in optimized.nodes:
        refs = [a["ref"] for a in node.args if isinstance(a, dict) and "ref" in a]
        assert all(ref in names for ref in refs), f"{node.name} reads a dropped node"
    with torch.no_grad():
        for got, want in zip(model(x.numpy()), module(x)):
            assert max_err(got, want) < 1e-5


class Recurrence(nn.Module):
    """h <- tanh(x_t + h @ w.T), unrolled: a new transpose of w at every step, as torch's RNN
    decomposition writes it; `head` is transposed for one matmul and `probe` also read elsewhere."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.head = nn.Parameter(torch.randn(3, dim))
        self.probe = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x):
        h = torch.zeros(x.shape[1], x.shape[2])
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] + h @ self.w.t())
        seen = self.probe.t()
        return h @ self.head.t(), (h @ seen) @ seen + seen.sum()


def test_recurrent_matmuls_read_the_weight_as_stored(tmp_path):
    torch.manual_seed(0)
    module = Recurrence()
    x = torch.randn(5, 4, 8)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {1: "batch"}})
    optimized = passes.optimize(model.graph)
    read = sorted(node.args[1]["ref"] for node in optimized.nodes if node.op == passes.LINEAR)
    assert read == ["p_head"] + ["p_probe"] * 2 + ["p_w"] * 5
    transposed = [node.args[0]["ref"] for node in optimized.nodes if node.op == passes.PERMUTE]
    assert transposed == ["p_probe"], "probe's transpose is also summed; no other transpose is left"
    with torch.no_grad():
        for batch in (4, 2):
            x = torch.randn(5, batch, 8)
            assert all(max_err(got, want) < 1e-5 for got, want in zip(model(x.numpy()), module(x)))
    hlo = jax.jit(model.apply).lower(model.params, x.numpy()).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert len(dots) == 8 and all(re.search(r"= f32\[[38],2\]", line) for line in dots), (
        f"at 2 rows every dot puts the weight first (features x batch): {dots}")
    grads = jax.grad(lambda p: sum(jnp.sum(o ** 2) for o in model.apply(p, x.numpy())))(model.params)
    sum((o ** 2).sum() for o in module(x)).backward()
    for name in ("w", "head", "probe"):  # float32 rounding at the gradient's scale (probe's reach 200)
        want = dict(module.named_parameters())[name].grad
        assert max_err(grads[name], want) < 1e-6 * float(want.abs().max())
    torch2jax.save(model, tmp_path / "recurrence")
    loaded = torch2jax.load(tmp_path / "recurrence")
    x = torch.randn(5, 3, 8)
    with torch.no_grad():
        assert all(max_err(got, want) < 1e-5 for got, want in zip(loaded(x.numpy()), module(x)))


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 40)
        self.proj = nn.Linear(40, 16, bias=False)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)))


@pytest.mark.parametrize("rows", [1, 8, LINEAR_WEIGHT_FIRST_ROWS, LINEAR_WEIGHT_FIRST_ROWS + 1, 200])
def test_linear_puts_the_weight_first_at_few_rows(rows):
    torch.manual_seed(0)
    module = Dense()
    x = torch.randn(rows, 24, requires_grad=True)
    model = torch2jax.convert(module, (x.detach(),))
    ops = [node.op for node in passes.optimize(model.graph).nodes]
    assert ops == [passes.LINEAR, "aten.relu.default", passes.LINEAR], "no transpose, mm or addmm left"
    got = jax.jit(model.apply)(model.params, _j(x))
    want = module(x)
    assert max_err(got, want) < 1e-5
    loss = lambda p, xj: jnp.sum(jnp.sin(model.apply(p, xj)))  # noqa: E731
    grads, grad_x = jax.grad(loss, argnums=(0, 1))(model.params, _j(x))
    torch.sin(want).sum().backward()
    assert max_err(grad_x, x.grad) < 1e-5
    for name, param in module.named_parameters():  # float32 rounding at the scale of a sum over rows
        assert max_err(grads[name], param.grad) < 1e-6 * float(param.grad.abs().max()), name
    if rows == 1:
        return  # a one-row product is a matrix-vector product either way round: no operand order to check
    hlo = jax.jit(model.apply).lower(model.params, _j(x)).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    first = [line for line in dots if re.search(rf"= f32\[(40|16),{rows}\]", line)]
    assert len(dots) == 2 and len(first) == (2 if rows <= LINEAR_WEIGHT_FIRST_ROWS else 0), dots


def test_linear_rows_symbolic_in_the_artifact(tmp_path):
    """With the rows symbolic, the operand order is a conditional on them, settled when the loaded
    artifact is compiled for actual shapes; batched (vmap) and scaled addmm calls keep torch's values."""
    torch.manual_seed(0)
    module = Dense()
    x = torch.randn(8, 24)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "rows"}})
    torch2jax.save(model, tmp_path / "dense")
    loaded = torch2jax.load(tmp_path / "dense")
    with torch.no_grad():
        for rows in (3, 100):
            x = torch.randn(rows, 24)
            assert max_err(loaded(x.numpy()), module(x)) < 1e-5
        stacked = torch.randn(3, 5, 24)
        batched = jax.vmap(model.apply, in_axes=(None, 0))(model.params, stacked.numpy())
        assert max_err(batched, module(stacked)) < 1e-5
    hlo = jax.jit(loaded.apply).lower(loaded.params, np.zeros((6, 24), np.float32)).compile().as_text()
    assert "conditional" not in hlo
    assert len(re.findall(r"= f32\[(?:40|16),6\]\S* dot\(", hlo)) == 2, hlo


def test_scaled_addmm_of_a_transpose_stays_addmm():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 4))
            self.b = nn.Parameter(torch.randn(5))

        def forward(self, x):
            return torch.addmm(self.b, x, self.w.t(), beta=0.5, alpha=2.0)

    module = Scaled()
    x = torch.randn(3, 4)
    model = torch2jax.convert(module, (x,))
    ops = [node.op for node in passes.optimize(model.graph).nodes]
    assert passes.LINEAR not in ops and passes.ADDMM in ops
    with torch.no_grad():
        assert max_err(model(x.numpy()), module(x)) < 1e-5


class ConvBNHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("op, module, x", [
    ("aten.addmm.default", Dense(), torch.randn(8, 24)),  # linear_products
    ("aten.convolution.default", ConvBNHead(), torch.randn(2, 3, 8, 8)),  # fold_conv_batch_norm
    ("aten.bmm.default", nn.LSTM(6, 8, batch_first=True), torch.randn(3, 5, 6)),  # shared_matmul_operand
])
def test_passes_leave_ops_whose_lowering_the_user_replaced(op, module, x):
    original = registry.lookup(op)
    calls = []

    def recording(*args, **kwargs):
        calls.append(op)
        return original.fn(*args, **kwargs)

    torch2jax.register_lowering(op, recording, ctx=original.ctx, replace=True)
    try:
        module = module.eval()
        model = torch2jax.convert(module, (x,))
        got = model(x.numpy())
    finally:
        torch2jax.register_lowering(op, original.fn, ctx=original.ctx, replace=True)
    assert calls, f"a pass bypassed the user's lowering of {op}"
    assert registry.lookup(op).module == original.module
    with torch.no_grad():
        assert max_err(jax.tree.leaves(got)[0], jax.tree.leaves(module(x))[0]) < 1e-5


# --- mixture of experts: gathered expert weights computed densely ---------------------------------


class GatheredExperts(nn.Module):
    """A router picks top-2 of `experts` expert matrices per token; each token's matrices are
    gathered and applied with bmm, as transformers' exportable batched_mm experts do."""

    def __init__(self, experts: int, dim: int = 8, hidden: int = 12):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.up = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)

    def forward(self, x):
        weights, ids = torch.topk(self.router(x).softmax(-1), 2)
        ids = ids.reshape(-1)
        rows = x.repeat_interleave(2, dim=0)
        h = torch.bmm(self.up[ids], rows.unsqueeze(-1)).squeeze(-1).relu()  # experts on the left
        out = torch.bmm(h.unsqueeze(1), self.down[ids]).squeeze(1)  # and on the right
        return (out * weights.reshape(-1, 1)).view(x.shape[0], 2, -1).sum(1)


@pytest.mark.parametrize("experts, rewritten", [(4, 2), (passes.DENSE_EXPERTS_MAX + 1, 0)])
def test_gathered_expert_bmm_is_computed_densely(experts, rewritten):
    torch.manual_seed(0)
    module = GatheredExperts(experts)
    x = torch.randn(10, 8)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "tokens"}})
    optimized = passes.optimize(model.graph)
    assert sum(node.op == passes.EXPERT_BMM for node in optimized.nodes) == rewritten
    assert sum(node.op == passes.BMM for node in optimized.nodes) == 2 - rewritten
    assert not any(node.op == passes.INDEX for node in optimized.nodes) or not rewritten, "the gathers are gone"
    with torch.no_grad():
        for tokens in (10, 3):
            x = torch.randn(tokens, 8)
            assert max_err(model(x.numpy()), module(x)) < 1e-5
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, x.numpy()) ** 2))(model.params)
    (module(x) ** 2).sum().backward()
    for name in ("up", "down", "router.weight"):
        assert max_err(grads[name], dict(module.named_parameters())[name].grad) < 1e-5


def test_gathered_expert_bmm_bfloat16_rounds_as_torch():
    torch.manual_seed(0)
    module = GatheredExperts(4).to(torch.bfloat16)
    x = torch.randn(16, 8, dtype=torch.bfloat16)
    model = torch2jax.convert(module, (x,))
    assert any(node.op == passes.EXPERT_BMM for node in passes.optimize(model.graph).nodes)
    with torch.no_grad():
        want = module(x).float()
    got = np.asarray(model(jnp.asarray(x.float().numpy(), jnp.bfloat16)), np.float32)
    assert max_err(got, want) <= 2 ** -7 * float(want.abs().max())


# --- expensive elementwise values that a consumer broadcasts: computed once ------------------------


class RotaryTables(nn.Module):
    """cos/sin of a (seq, dim) angle table broadcast into per-head products, as in Llama's RoPE, and
    a per-position bias looked up in a table (T5's relative bias); tanh of the input itself is only
    used at its own size."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, dim, 2) / dim))
        self.bias = nn.Embedding(16, dim)

    def forward(self, q, positions):
        angles = positions[:, None].float() * self.inv_freq[None]
        angles = torch.cat([angles, angles], -1)
        cos, sin = angles.cos() * 0.5, angles.sin()
        half = q.shape[-1] // 2
        rotated = torch.cat([-q[..., half:], q[..., :half]], -1)
        return q * cos[None, None] + rotated * sin[None, None] + q.tanh() + self.bias(positions)[None, None]


def test_broadcast_costly_ops_are_computed_once(tmp_path):
    torch.manual_seed(0)
    module = RotaryTables()
    q, positions = torch.randn(2, 3, 5, 8), torch.arange(5)
    dims = {"q": {0: "batch", 2: "seq"}, "positions": {0: "seq"}}
    model = torch2jax.convert(module, (q, positions), dynamic_shapes=dims)
    wrapped = [node.args[0] for node in passes.optimize(model.graph).nodes if node.op == passes.COMPUTED_ONCE]
    assert sorted(wrapped) == ["aten.cos.default", "aten.embedding.default", "aten.sin.default"], "tanh(q) is not"
    with torch.no_grad():
        want = module(q, positions)
    assert max_err(model(q.numpy(), positions.numpy()), want) < 1e-5
    hlo = jax.jit(model.apply).lower(model.params, q.numpy(), positions.numpy()).compile().as_text()
    cos_shapes = {line.split(" = ")[1].split("{")[0] for line in hlo.splitlines() if " cosine(" in line}
    assert cos_shapes and all(shape.count(",") < 3 for shape in cos_shapes), f"cos of the table, not per product: {cos_shapes}"
    grad = jax.grad(lambda x: jnp.sum(model(x, positions.numpy()) ** 2))(jnp.asarray(q.numpy()))
    q_ = q.clone().requires_grad_()
    (module(q_, positions) ** 2).sum().backward()
    assert max_err(grad, q_.grad) < 1e-4
    param_grads = jax.grad(lambda p: jnp.sum(model.apply(p, q.numpy(), positions.numpy()) ** 2))(model.params)
    assert max_err(param_grads["bias.weight"], module.bias.weight.grad) < 1e-4, "the table's grads pass the conditional"
    batched_positions = torch.stack([positions, positions.flip(0)])  # vmap batches the conditional's predicate
    got = jax.vmap(lambda p: model.apply(model.params, q.numpy(), p))(batched_positions.numpy())
    with torch.no_grad():
        assert max_err(got, torch.stack([module(q, p) for p in batched_positions])) < 1e-5
    torch2jax.save(model, tmp_path / "rope")
    loaded = torch2jax.load(tmp_path / "rope")
    q2, p2 = torch.randn(3, 3, 7, 8), torch.arange(7)
    with torch.no_grad():
        assert max_err(loaded(q2.numpy(), p2.numpy()), module(q2, p2)) < 1e-5


def test_computed_once_leaves_a_replacement_lowering_that_needs_context(monkeypatch):
    from torch2jax import registry

    with_context = registry.Lowering("aten.cos.default", lambda ctx, x: jnp.cos(x), True, "test")
    monkeypatch.setitem(registry._REGISTRY, "aten.cos.default", with_context)
    torch.manual_seed(0)
    module = RotaryTables()
    q, positions = torch.randn(2, 3, 5, 8), torch.arange(5)
    model = torch2jax.convert(module, (q, positions))
    wrapped = [node.args[0] for node in passes.optimize(model.graph).nodes if node.op == passes.COMPUTED_ONCE]
    assert "aten.cos.default" not in wrapped and "aten.sin.default" in wrapped
    with torch.no_grad():
        assert max_err(model(q.numpy(), positions.numpy()), module(q, positions)) < 1e-5
