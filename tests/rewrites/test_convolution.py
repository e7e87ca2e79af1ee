"""Convolution lowerings that exist for speed keep torch's values and gradients: channels padded onto
XLA CPU's fast path, 1x1 convs as a dot over channels, patch embeddings as a dot over each patch, grouped
convs as taps or one conv per group, strided transposed convs as one conv per output phase, and an eval-mode
batch norm folded into its conv."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax.lowering import interpreter, passes
from torch2jax.ops.conv import _cpu_channel_padding, _cpu_grouped_route, _cpu_patches, _cpu_pointwise, convolution

from ..helpers import as_jax, max_err


def assert_conv_and_grads_match(f, x: torch.Tensor, w: torch.Tensor, want: torch.Tensor) -> None:
    """f(x, w) under jit, and its input and weight gradients of sum(out**2), against torch's, at
    float32 rounding of each one's scale."""
    got = jax.jit(f)(as_jax(x), as_jax(w))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-5 * float(want.abs().max())
    gx, gw = jax.grad(lambda xj, wj: jnp.sum(f(xj, wj) ** 2), argnums=(0, 1))(as_jax(x), as_jax(w))
    (want**2).sum().backward()
    for got_grad, want_grad in ((gx, x.grad), (gw, w.grad)):
        assert max_err(got_grad, want_grad) < 1e-5 * float(want_grad.abs().max())


# --- convolution: channels padded onto XLA CPU's fast path ---


@pytest.mark.parametrize("cin, cout", [(3, 32), (5, 32), (7, 32), (3, 16), (8, 16), (16, 16), (4, 12)])
@pytest.mark.parametrize("kernel, stride, padding, dilation", [(7, 2, 3, 1), (3, 1, 1, 1), (3, 2, 0, 2), (1, 1, 0, 1)])
def test_conv_padded_channels_match_torch(cin, cout, kernel, stride, padding, dilation):
    torch.manual_seed(0)
    x = torch.randn(2, cin, 20, 20, requires_grad=True)
    w = torch.randn(cout, cin, kernel, kernel, requires_grad=True)
    b = torch.randn(cout)
    want = torch.nn.functional.conv2d(x, w, b, stride, padding, dilation)

    def f(xj, wj):
        return convolution(xj, wj, as_jax(b), [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], 1)

    got = f(as_jax(x), as_jax(w))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-4
    # the zero channels must not leak into the gradients (shapes and values as torch's)
    gx, gw = jax.grad(lambda xj, wj: jnp.sum(f(xj, wj) ** 2), argnums=(0, 1))(as_jax(x), as_jax(w))
    (want**2).sum().backward()
    assert gx.shape == tuple(x.shape) and gw.shape == tuple(w.shape)
    # against the gradient's scale: an element that cancels to near zero still carries the rounding of
    # the hundreds of large products it sums (the order differs with XLA's threading); a leak is O(scale)
    for got_grad, want_grad in ((gx, x.grad), (gw, w.grad)):
        assert max_err(got_grad, want_grad) < 1e-5 * float(want_grad.abs().max())


# --- 1x1 convolution: a dot over channels on CPU ---

POINTWISE = [  # (input shape, out channels, stride)
    ((2, 32, 9, 10), 8, 1),
    ((2, 8, 9, 10), 32, 1),
    ((2, 128, 5, 5), 256, 2),  # a ResNet's downsampling shortcut
    ((2, 12, 10, 11), 24, (3, 2)),
    ((2, 16, 13), 8, 2),
    ((2, 8, 4, 5, 6), 4, 1),
]


def unpadded_conv_case(xs: tuple, cout: int, kernel: tuple, stride: tuple) -> tuple:
    """(x, w, torch's biased conv of them, the same conv through `convolution`) for an unpadded conv."""
    n = len(xs) - 2
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[n]
    torch.manual_seed(0)
    x = torch.randn(*xs, requires_grad=True)
    w = torch.randn(cout, xs[1], *kernel, requires_grad=True)
    b = torch.randn(cout)

    def f(xj, wj):
        return convolution(xj, wj, as_jax(b), list(stride), [0] * n, [1] * n, False, [0] * n, 1)

    return x, w, conv(x, w, b, stride), f


@pytest.mark.parametrize("case", POINTWISE, ids=[str(c) for c in POINTWISE])
def test_pointwise_conv_is_a_dot_matching_torch(case):
    xs, cout, stride = case
    n = len(xs) - 2
    x, w, want, f = unpadded_conv_case(xs, cout, (1,) * n, stride if isinstance(stride, tuple) else (stride,) * n)
    assert_conv_and_grads_match(f, x, w, want)
    compiled = jax.jit(f).lower(as_jax(x), as_jax(w)).compile().as_text()
    assert "convolution(" not in compiled and " dot(" in compiled, "a dot over channels, not a conv"


def test_pointwise_conv_choices():
    def dot(cin, cout=16, padding=0, groups=1, dtype=jnp.float32, kernel=1):
        x, w = jnp.zeros((1, cin, 8, 8), dtype), jnp.zeros((cout, cin // groups, kernel, kernel), dtype)
        return _cpu_pointwise(x, w, (1, 1), (padding, padding), groups)

    assert dot(32) and dot(8) and dot(4) and dot(12)
    assert not dot(3) and not dot(6), "few input channels: the conv (channels padded) is faster"
    assert not dot(32, padding=1), "a padded 1x1 conv stays a conv"
    assert not dot(32, groups=2)
    assert not dot(32, kernel=3)
    assert not dot(32, dtype=jnp.bfloat16), "measured on float32 only"


# --- patch embedding (stride = kernel, no padding): one dot over each patch's values on CPU ---

PATCHES = [  # (input shape, out channels, kernel)
    ((2, 3, 32, 32), 64, (8, 8)),  # a ViT's patch embedding
    ((2, 3, 30, 37), 96, (7, 9)),  # rows and columns past the last whole patch, dropped as the conv drops them
    ((3, 3, 2, 6, 6), 64, (2, 6, 6)),  # Qwen2-VL's 3-d patch embedding: one output position per patch
    ((2, 4, 24), 64, (4,)),
]


@pytest.mark.parametrize("case", PATCHES, ids=[str(c) for c in PATCHES])
def test_patch_conv_is_a_dot_matching_torch(case):
    xs, cout, kernel = case
    x, w, want, f = unpadded_conv_case(xs, cout, kernel, kernel)
    assert_conv_and_grads_match(f, x, w, want)
    compiled = jax.jit(f).lower(as_jax(x), as_jax(w)).compile().as_text()
    assert "convolution(" not in compiled, "a dot over each patch, not a conv"


def test_patch_conv_choices():
    def dot(cout=64, stride=4, padding=0, dilation=1, groups=1, dtype=jnp.float32):
        x, w = jnp.zeros((1, 4, 16, 16), dtype), jnp.zeros((cout, 4 // groups, 4, 4), dtype)
        return _cpu_patches(x, w, (stride, stride), (padding, padding), (dilation, dilation), groups)

    assert dot()
    assert not dot(stride=2), "overlapping windows stay a conv"
    assert not dot(padding=1) and not dot(dilation=2) and not dot(groups=2)
    assert not dot(cout=32), "few filters: the conv is as fast"
    assert not dot(dtype=jnp.bfloat16), "measured on float32 only"


# --- grouped convolution: taps (written out or looped) and one conv per group on CPU ---

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
        return convolution(xj, wj, as_jax(b), [stride] * n, [padding] * n, [dilation] * n, False, [0] * n, groups)

    assert_conv_and_grads_match(f, x, w, want)
    # bfloat16: accumulated in float32 and rounded once, as torch does
    xb, wb, bb = (t.detach().bfloat16() for t in (x, w, b))
    want_b = conv(xb, wb, bb, stride, padding, dilation, groups).float()
    got_b = convolution(as_jax(xb.float()).astype(jnp.bfloat16), as_jax(wb.float()).astype(jnp.bfloat16),
                        as_jax(bb.float()).astype(jnp.bfloat16), [stride] * n, [padding] * n, [dilation] * n, False, [0] * n, groups)
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


def _op_counts(text: str) -> dict[str, int]:
    import collections
    import re

    return collections.Counter(re.findall(r"stablehlo\.(\w+)", text))


def test_grouped_taps_are_in_the_program_once_and_not_in_its_derivative():
    """A 7x7 depthwise conv's 49 taps, unrolled for XLA CPU, appear once in the exported program (the
    conditional's other branch is the plain conv), and its VJP, which jax.export serializes with every
    artifact, differentiates the plain conv: no pad per tap (the transpose of each tap's slice). Before,
    the taps were there twice and their derivative made a tiny ConvNeXt's vjp export take most of a minute."""
    def depthwise(x, w):
        return convolution(x, w, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 8)

    batch = jax.export.symbolic_shape("batch")[0]
    specs = (jax.ShapeDtypeStruct((batch, 8, 12, 12), jnp.float32), jax.ShapeDtypeStruct((8, 1, 7, 7), jnp.float32))
    exported = jax.export.export(jax.jit(depthwise), platforms=("cpu", "cuda"))(*specs)
    forward = _op_counts(exported.mlir_module())
    assert 49 <= forward["real_dynamic_slice"] < 2 * 49, forward  # one per tap (the batch is symbolic)
    backward = _op_counts(exported.vjp().mlir_module())
    assert backward["pad"] + backward["dynamic_pad"] < 49, backward
    x, w = torch.randn(3, 8, 12, 12, requires_grad=True), torch.randn(8, 1, 7, 7, requires_grad=True)
    assert_conv_and_grads_match(exported.call, x, w, torch.nn.functional.conv2d(x, w, padding=3, groups=8))


def test_grouped_conv_derivatives_in_both_modes():
    """The taps' derivative is the plain conv's (custom_jvp): forward mode works too and agrees with reverse."""
    x, w = jax.random.normal(jax.random.key(0), (2, 8, 9, 9)), jax.random.normal(jax.random.key(1), (8, 1, 3, 3))
    tx, tw = jax.random.normal(jax.random.key(2), x.shape), jax.random.normal(jax.random.key(3), w.shape)

    def depthwise(x, w):
        return convolution(x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 8)

    _, forward_mode = jax.jvp(depthwise, (x, w), (tx, tw))
    out, pullback = jax.vjp(depthwise, x, w)
    cotangent = jax.random.normal(jax.random.key(4), out.shape)
    gx, gw = pullback(cotangent)
    # <J t, c> == <t, J^T c>
    np.testing.assert_allclose(float(jnp.vdot(forward_mode, cotangent)), float(jnp.vdot(tx, gx) + jnp.vdot(tw, gw)), rtol=1e-5)


def _convnext(depths, hidden_sizes):
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_channels=3, hidden_sizes=hidden_sizes, depths=depths, num_stages=len(depths), image_size=32,
                            num_labels=10)
    return ConvNextForImageClassification(config), torch.randn(2, 3, 32, 32)


def _cvt(depth):
    from transformers import CvtConfig, CvtForImageClassification

    # transformers' CvtModelTester sizes (tests/models/cvt/test_modeling_cvt.py)
    config = CvtConfig(num_channels=3, embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=depth, patch_sizes=[7, 3, 3],
                       patch_stride=[4, 2, 2], patch_padding=[2, 1, 1], stride_kv=[2, 2, 2], cls_token=[False, False, True],
                       attention_drop_rate=[0.0, 0.0, 0.0], layer_norm_eps=1e-12, num_labels=2)
    return CvtForImageClassification(config), torch.randn(2, 3, 64, 64)


DEPTHWISE_MODELS = {  # models whose depthwise convs take the taps route; saved for every default platform
    "convnext": lambda: _convnext([1, 1], [10, 20]),
    # stage i needs more than i layers (transformers indexes its drop-path rates so); 40 s on 2 busy cores
    "cvt": pytest.param(lambda: _cvt([1, 2, 3]), marks=pytest.mark.slow),
    # transformers' ConvNextModelTester and CvtModelTester configs, whose save took minutes before
    "convnext-tester": pytest.param(lambda: _convnext([2, 2, 3, 2], [10, 20, 30, 40]), marks=pytest.mark.slow),
    "cvt-tester": pytest.param(lambda: _cvt([1, 2, 10]), marks=pytest.mark.slow),
}


@pytest.mark.parametrize("build", DEPTHWISE_MODELS.values(), ids=DEPTHWISE_MODELS.keys())
def test_depthwise_conv_models_match_torch_after_save_and_load(build, tmp_path):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    module, x = build()
    module.eval()
    model = torch2jax.convert(module, (x,), dynamic_shapes={"pixel_values": {0: "batch"}})
    torch2jax.save(model, tmp_path / "art")
    loaded = torch2jax.load(tmp_path / "art")
    for batch in (x, torch.randn(3, *x.shape[1:])):
        with torch.no_grad():
            want = module(batch).logits
        out = loaded(batch.numpy())
        got = out["logits"] if isinstance(out, dict) else out.logits
        assert max_err(got, want) < 1e-5 * max(1.0, float(want.abs().max()))


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
    got = convolution(as_jax(x), as_jax(w), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert max_err(got, torch.nn.functional.conv2d(x, w, padding=1)) < 1e-4
    x, w = torch.randn(2, 9, 9, 9), torch.randn(24, 3, 3, 3)  # 3 groups of 3 channels
    got = convolution(as_jax(x), as_jax(w), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 3)
    assert max_err(got, torch.nn.functional.conv2d(x, w, groups=3)) < 1e-4


# --- strided transposed convolution: one ordinary conv per output phase on CPU ---

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
        return convolution(xj, wj, as_jax(b), [stride] * n, [padding] * n, [dilation] * n, True, [output_padding] * n, groups)

    assert_conv_and_grads_match(f, x, w, want)


def test_strided_transposed_conv_runs_no_dilated_input_on_cpu():
    x, w = jnp.ones((1, 8, 5, 5)), jnp.ones((8, 4, 4, 4))
    compiled = jax.jit(lambda x, w: convolution(x, w, None, [2, 2], [1, 1], [1, 1], True, [0, 0], 1)).lower(x, w).compile().as_text()
    assert compiled.count("convolution(") == 4, "one conv per output phase"
    assert "lhs_dilate" not in compiled, "no conv over an input with zeros inserted"


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
