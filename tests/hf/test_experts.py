"""The dense forms of expert loops (torch2jax/hf/experts.py) compute what transformers' own loops compute."""

from __future__ import annotations

import torch

from torch2jax.capture import trace_forwards
from torch2jax.hf import stand_ins  # noqa: F401 - registers them


def test_jetmoe_dense_experts_equal_the_split_loop():
    from transformers import JetMoeConfig
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoA, JetMoeMoE

    config = JetMoeConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                          kv_channels=8, num_key_value_heads=2)
    torch.manual_seed(0)
    moe, moa = JetMoeMoE(config), JetMoeMoA(config)
    for module in (moe, moa):
        for param in module.parameters():
            torch.nn.init.normal_(param, std=0.2)
    x = torch.randn(3, 5, 32)
    want = moe(x)
    mapped, _, topology = moa.map(x)
    want_moa = moa.reduce(mapped, topology)
    with trace_forwards.installed(moe) as replaced, trace_forwards.installed(moa):
        got = moe(x)
        mapped, _, topology = moa.map(x)
        got_moa = moa.reduce(mapped, topology)
    assert replaced == ["JetMoeParallelExperts", "JetMoeTopKGating"]
    assert isinstance(topology[3], torch.Tensor)  # the tokens per expert stay a tensor while traced
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_moa, want_moa, rtol=1e-5, atol=1e-5)
    assert isinstance(moe(x), torch.Tensor) and "forward" not in moe.router.__dict__  # its own forward again
