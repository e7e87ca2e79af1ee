"""Recurrent layers: one LSTM layer over a whole sequence (`mkldnn_rnn_layer`).

On CPU, torch's decomposition of `nn.LSTM` (decompositions.lstm_impl) calls `aten.mkldnn_rnn_layer` once per layer
and direction, the sequence time-major; the other recurrent decompositions (GRU, RNN, LSTM elsewhere) unroll the
time steps into ordinary ops. Here the time loop is one `lax.scan`, the input projection one matrix product over all
steps ahead of it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from .registry import lowers

_LSTM = 2  # ideep's rnn_kind for LSTM, the only mode torch's decomposition passes


@lowers("aten.mkldnn_rnn_layer.default")
def mkldnn_rnn_layer(x, weight_ih, weight_hh, bias_ih, bias_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
                     num_layers, has_biases, bidirectional, batch_first, train):
    """(output, h_n, c_n, workspace) of one LSTM layer and direction: gates in torch's order (input, forget, cell,
    output); `reverse` runs the steps last to first and keeps each output at its own step."""
    if mode != _LSTM or batch_sizes or num_layers != 1 or bidirectional:
        raise LoweringError(f"mkldnn_rnn_layer: only a single-direction LSTM layer is lowered (mode {mode}, "
                            f"{num_layers} layers, bidirectional={bidirectional}, packed={bool(batch_sizes)})")
    steps = jnp.swapaxes(x, 0, 1) if batch_first else x  # [T, B, I]
    projected = steps @ weight_ih.T
    if has_biases:  # both biases are per step and constant: added once, ahead of the loop
        projected = projected + (bias_ih + bias_hh)

    def step(carry, inputs):
        h, c = carry
        gates = inputs + h @ weight_hh.T
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), out = lax.scan(step, (hx[0], cx[0]), projected, reverse=bool(reverse))
    if batch_first:
        out = jnp.swapaxes(out, 0, 1)
    return out, h[None], c[None], jnp.zeros((0,), jnp.uint8)
