"""te.jit: a module's forward as one jax.jit-compiled function, matching torch on CPU."""

import copy

import pytest
import torch

import torch2jax.eager as te


def conv_bn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4),
    )


def test_forward_and_buffer_updates_match_cpu_call_after_call():
    torch.manual_seed(0)
    net = conv_bn()
    on_jax = copy.deepcopy(net).to("jax")
    forward = te.jit(on_jax)
    for _ in range(2):  # the second call runs the compiled program
        x = torch.randn(2, 3, 8, 8)
        want = net(x)
        got = forward(x.to("jax"))
        assert got.device.type == "jax"
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(on_jax.state_dict()[name].cpu(), value, rtol=1e-5, atol=1e-6)


def test_llama_forward_matches_cpu():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    want = model(ids).logits
    forward = te.jit(copy.deepcopy(model).to("jax"))
    torch.testing.assert_close(forward(ids.to("jax")).logits.cpu(), want.detach(), rtol=1e-4, atol=1e-5)


def test_dropout_differs_per_call_and_follows_the_seed():
    forward = te.jit(torch.nn.Dropout(0.5).to("jax"))
    x = torch.ones(64, device="jax")
    torch.manual_seed(1)
    first, second = forward(x).cpu(), forward(x).cpu()
    assert not torch.equal(first, second)
    torch.manual_seed(1)
    torch.testing.assert_close(forward(x).cpu(), first, rtol=0, atol=0)


def test_a_module_on_cpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"model.to\('jax'\)"):
        te.jit(torch.nn.Linear(2, 2))
