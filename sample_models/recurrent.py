"""A sequence tagger: embedding, a 2-layer bidirectional LSTM, a GRU and a linear head.

torch.export unrolls the recurrence over time, so the sequence length is static; the batch stays symbolic.

    torch2jax convert sample_models/recurrent.py:LSTMTagger --out out/tagger
"""

import torch
from torch import nn


class LSTMTagger(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16, hidden: int = 32, gru_hidden: int = 16, tags: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, gru_hidden, batch_first=True)
        self.out = nn.Linear(gru_hidden, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(ids))
        h, _ = self.gru(h)
        return self.out(h)


def example_inputs():
    return (torch.randint(0, 50, (2, 7)),)


def dynamic_shapes():
    return {"ids": {0: "batch"}}
