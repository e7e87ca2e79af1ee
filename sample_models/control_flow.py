"""Control flow that torch.export keeps: an RNN written with torch.scan, a data-dependent
branch with torch.cond (nested inside the scan body), and a refinement loop with while_loop.

    torch2jax convert sample_models/control_flow.py:GatedScanRNN --out out/rnn
"""

import torch
from torch import nn
from torch._higher_order_ops import scan, while_loop


class GatedScanRNN(nn.Module):
    """h_t = tanh(W x_t + U h_{t-1}); steps whose input is mostly negative take a damped path."""

    def __init__(self, features: int = 8, hidden: int = 16):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.rec = nn.Linear(hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, 4)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:  # xs: [time, batch, features]
        def step(h, x):
            def plain(h, x):
                return torch.tanh(self.inp(x) + self.rec(h))

            def damped(h, x):
                return 0.5 * h + 0.5 * torch.tanh(self.inp(x))

            h = torch.cond(x.mean() > 0, plain, damped, (h, x))
            return h, h.sum(-1)

        h0 = xs.new_zeros(xs.shape[1], self.rec.in_features)
        h, per_step = scan(step, h0, xs)
        return self.head(h), per_step


class Refine(nn.Module):
    """Doubles x until its norm passes a threshold: a loop whose trip count depends on the data."""

    def forward(self, x: torch.Tensor):
        def not_done(i, x):
            return x.norm() < 100.0

        def step(i, x):
            return i + 1, x * 2.0

        steps, out = while_loop(not_done, step, (torch.zeros((), dtype=torch.int64), x))
        return steps, out


def example_inputs():
    return (torch.randn(6, 3, 8),)


def dynamic_shapes():
    return {"xs": {0: "time", 1: "batch"}}
