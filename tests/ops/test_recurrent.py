"""One LSTM layer over a sequence (aten.mkldnn_rnn_layer, what torch's CPU decomposition of nn.LSTM calls), against
torch's own kernel: forward and reversed, with and without biases, batch-first or time-major."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch2jax.errors import LoweringError
from torch2jax.ops.recurrent import mkldnn_rnn_layer

pytestmark = pytest.mark.skipif(not torch._C._has_mkldnn, reason="torch built without mkldnn has no kernel to compare with")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("has_biases", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_layer_matches_torch(reverse, has_biases, batch_first):
    torch.manual_seed(0)
    steps, batch, features, hidden = 6, 3, 5, 4
    x = torch.randn(steps, batch, features)
    w_ih, w_hh = torch.randn(4 * hidden, features) * 0.5, torch.randn(4 * hidden, hidden) * 0.5
    b_ih, b_hh = (torch.randn(4 * hidden), torch.randn(4 * hidden)) if has_biases else (torch.zeros(4 * hidden),) * 2
    hx, cx = torch.randn(1, batch, hidden), torch.randn(1, batch, hidden)
    want = torch.ops.aten.mkldnn_rnn_layer(x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, [], 2, hidden, 1, has_biases,
                                           False, False, False)
    # torch's kernel itself corrupts memory when batch_first (its decomposition never asks for it): the same values,
    # batch-major, compared with its time-major result
    given = x.transpose(0, 1) if batch_first else x
    got = list(mkldnn_rnn_layer(*(t.numpy() for t in (given, w_ih, w_hh, b_ih, b_hh, hx, cx)), reverse, [], 2, hidden,
                                1, has_biases, False, batch_first, False))
    if batch_first:
        got[0] = np.swapaxes(np.asarray(got[0]), 0, 1)
    for w, g in zip(want[:3], got[:3]):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)


def test_other_recurrent_modes_are_refused_by_name():
    x = np.zeros((2, 1, 3), np.float32)
    with pytest.raises(LoweringError, match="single-direction LSTM"):
        mkldnn_rnn_layer(x, None, None, None, None, None, None, False, [], 1, 4, 1, True, False, False, False)
