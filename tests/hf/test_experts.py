"""The dense forms of expert loops (torch2jax/hf/stand_ins/experts.py) compute what transformers' own loops compute."""

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


def test_switch_transformers_dense_experts_equal_the_loop_with_capacity():
    """Top-1 routing with an expert capacity of 2 over 10 tokens: tokens over capacity get no expert, as in the loop."""
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers.modeling_switch_transformers import SwitchTransformersSparseMLP

    config = SwitchTransformersConfig(d_model=16, d_ff=24, num_experts=4, expert_capacity=2)
    torch.manual_seed(0)
    mlp = SwitchTransformersSparseMLP(config).eval()
    for param in mlp.parameters():
        torch.nn.init.normal_(param, std=0.3)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = mlp(x)
        with trace_forwards.installed(mlp) as replaced:
            got = mlp(x)
    assert sorted(replaced) == ["SwitchTransformersExperts", "SwitchTransformersTop1Router"]
    assert (want == 0).all(-1).any()  # some token was over capacity: the case the dense form must keep
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


_WRAPPED = """
import numpy as np, torch, torch2jax
from transformers import JetMoeConfig
from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoE

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.moe = JetMoeMoE(JetMoeConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2))

    def forward(self, x):
        return x + self.moe(self.norm(x))

torch.manual_seed(0)
block = Block().eval()
for param in block.moe.parameters():  # JetMoE leaves its weights uninitialized (torch.empty)
    torch.nn.init.normal_(param, std=0.2)
x = torch.randn(2, 6, 32)
model = torch2jax.convert(block, (x,))
np.testing.assert_allclose(np.asarray(model(x.numpy())), block(x).detach().numpy(), rtol=1e-5, atol=1e-5)
print("matched")
"""


def test_a_transformers_layer_inside_a_users_module_gets_its_stand_in():
    """torch2jax.convert registers the stand-ins whatever the top module is: here JetMoE's experts, whose own split
    by `.tolist()` torch.export cannot capture, inside a plain torch module, in a fresh process (this one has them
    registered already)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _WRAPPED], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "matched" in done.stdout, done.stderr[-2000:]


def test_privacy_filter_dense_experts_equal_the_loop():
    """OpenAI's privacy filter: GPT-OSS's experts accumulated in float32, biases on both products, a clamped gate."""
    from transformers.models.openai_privacy_filter.modeling_openai_privacy_filter import OpenAIPrivacyFilterExperts

    from benchmarks.hf_sweep import run

    config = run.build(run.load_configs()["openai_privacy_filter"], "OpenAIPrivacyFilterModel").config
    torch.manual_seed(0)
    experts = OpenAIPrivacyFilterExperts(config)
    for param in experts.parameters():
        torch.nn.init.normal_(param, std=0.2)
    tokens, k = 10, 2
    x = torch.randn(tokens, config.hidden_size)
    index = torch.stack([torch.randperm(experts.num_experts)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k).softmax(-1)
    want = experts(x, router_indices=index, routing_weights=weights)
    with trace_forwards.installed(experts) as replaced:
        got = experts(x, router_indices=index, routing_weights=weights)
    assert replaced == ["OpenAIPrivacyFilterExperts"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
