"""Autograd and torch.optim on the jax device: 3 steps match the same steps on CPU."""

import copy

import pytest
import torch

OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), "adamw": lambda p: torch.optim.AdamW(p, lr=0.01)}


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), (torch.randn(5, 8),)


def conv_bn():
    # no conv bias: batch norm cancels it, its gradient is rounding noise that Adam would amplify
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    )
    return net, (torch.randn(4, 3, 8, 8),)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attn_implementation="eager")
    return LlamaForCausalLM(config), (torch.randint(0, 64, (2, 6)),)


def loss_of(model, inputs):
    out = model(*inputs)
    out = out.logits if hasattr(out, "logits") else out
    return (out.float() ** 2).mean()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("build", [mlp, conv_bn, llama], ids=["mlp", "conv_bn", "llama"])
def test_three_training_steps_match_cpu(build, optimizer):
    torch.manual_seed(0)
    model, inputs = build()
    on_cpu, on_jax = copy.deepcopy(model), copy.deepcopy(model).to("jax")
    jax_inputs = tuple(x.to("jax") for x in inputs)
    opt_cpu, opt_jax = OPTIMIZERS[optimizer](on_cpu.parameters()), OPTIMIZERS[optimizer](on_jax.parameters())
    for _ in range(3):
        for net, opt, xs in ((on_cpu, opt_cpu, inputs), (on_jax, opt_jax, jax_inputs)):
            opt.zero_grad()
            loss = loss_of(net, xs)
            loss.backward()
            opt.step()
    cpu_state, jax_state = on_cpu.state_dict(), on_jax.state_dict()
    assert all(v.device.type == "jax" for v in jax_state.values())
    # atol 1e-5 is 1e-3 of an AdamW step (lr 0.01): Adam divides by sqrt(v), so an element whose
    # gradient is near zero moves by a step whose size depends on float32 rounding of that gradient
    for name, value in cpu_state.items():
        torch.testing.assert_close(jax_state[name].cpu(), value, rtol=1e-5, atol=1e-5)
    for a, b in zip(on_cpu.parameters(), on_jax.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-6)
