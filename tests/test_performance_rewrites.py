"""The lowerings and graph passes that exist for speed keep torch's numbers (and grads) exactly.

Each rewrite takes a path that the generic OpInfo samples rarely reach: the conv channel
padding, channels-last pooling, conv + batch-norm folding, and attention's safe softmax and GQA.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax import interpreter, passes
from torch2jax.ops.attention import scaled_dot_product_attention
from torch2jax.ops.conv import _cpu_channel_padding, convolution
from torch2jax.ops.pooling import avg_pool2d, max_pool2d_with_indices

from .helpers import max_err


def _j(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(t.detach().numpy())


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
    np.testing.assert_allclose(np.asarray(gx), x.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(gw), w.grad.numpy(), rtol=1e-4, atol=1e-3)


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
