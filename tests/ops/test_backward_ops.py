"""The core opset's backward ops, converted and compared with torch running the same aten op."""

from __future__ import annotations

import pytest
import torch

from .opinfo_harness import CallFn, Prepared, convert_sample, run_and_compare

aten = torch.ops.aten


def _check(fn, *tensors):
    module = CallFn(fn)
    with torch.no_grad():
        expected = module(*tensors)
    prepared = Prepared(module, tensors, expected)
    run_and_compare(prepared, convert_sample(prepared))


def _layer_norm_case():
    x, w, b = torch.randn(2, 5, 8), torch.randn(8), torch.randn(8)
    _, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
    return lambda g, x, m, r, w, b: aten.native_layer_norm_backward(g, x, [8], m, r, w, b, [True, True, True]), (
        torch.randn(2, 5, 8), x, mean, rstd, w, b)


def _group_norm_case():
    x, w, b = torch.randn(2, 6, 4, 4), torch.randn(6), torch.randn(6)
    _, mean, rstd = aten.native_group_norm(x, w, b, 2, 6, 16, 3, 1e-5)
    return lambda g, x, m, r, w: aten.native_group_norm_backward(g, x, m, r, w, 2, 6, 16, 3, [True, True, True]), (
        torch.randn(2, 6, 4, 4), x, mean, rstd, w)


def _conv_case():
    x, w = torch.randn(2, 4, 7, 7), torch.randn(6, 2, 3, 3)
    g = torch.randn(2, 6, 4, 4)
    return lambda g, x, w: aten.convolution_backward(g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]), (
        g, x, w)


def _avg_pool_case():
    x = torch.randn(2, 3, 7, 7)
    return lambda g, x: aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], True, False, None), (torch.randn(2, 3, 4, 4), x)


def _adaptive_case():
    return lambda g, x: aten._adaptive_avg_pool2d_backward(g, x), (torch.randn(2, 3, 2, 3), torch.randn(2, 3, 6, 9))


def _max_pool_case():
    x = torch.randn(2, 3, 6, 6)
    _, indices = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    return lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i), (
        torch.randn(2, 3, 3, 3), x, indices)


def _cpu_attention_case():
    """CPU SDPA's backward (what torch.compile's training graphs hold), causal, with a scale. (Its forward
    is decomposed by export; tests/eager/test_compile.py checks that one through the compile backend.)"""
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=0.3)
    return lambda g, q, k, v, o, lse: aten._scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k, v, o, lse, 0.0, True, scale=0.3), (torch.randn(2, 3, 5, 8), q, k, v, out, lse)


@pytest.mark.parametrize("case", [_layer_norm_case, _group_norm_case, _conv_case, _avg_pool_case, _adaptive_case, _max_pool_case,
                                  _cpu_attention_case],
                         ids=lambda c: c.__name__.strip("_").removesuffix("_case"))
def test_backward_op_matches_torch(case):
    torch.manual_seed(0)
    fn, tensors = case()
    _check(fn, *tensors)
