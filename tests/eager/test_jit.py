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


def bn_mlp():
    # no bias before batch norm: it cancels it, and Adam would amplify its rounding-noise gradient
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Dropout(0.0), torch.nn.Linear(16, 4))


def mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_jit_train_step_matches_cpu_training(optimizer):
    torch.manual_seed(0)
    net = bn_mlp()
    on_jax = copy.deepcopy(net).to("jax")
    if optimizer == "sgd":
        opt_cpu, opt_jax = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (net, on_jax))
    else:  # the step counter lives on the device only with capturable=True
        opt_cpu = torch.optim.AdamW(net.parameters(), lr=0.01)
        opt_jax = torch.optim.AdamW(on_jax.parameters(), lr=0.01, capturable=True)
    step = te.jit_train_step(on_jax, opt_jax, mse)
    for _ in range(3):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        opt_cpu.zero_grad()
        loss = mse(net, x, y)
        loss.backward()
        opt_cpu.step()
        got = step(x.to("jax"), y.to("jax"))
        torch.testing.assert_close(got.cpu(), loss.detach(), rtol=1e-5, atol=1e-6)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(on_jax.state_dict()[name].cpu(), value, rtol=1e-5, atol=1e-6)


def test_jit_train_step_refuses_optimizer_state_off_the_device():
    net = bn_mlp().to("jax")
    step = te.jit_train_step(net, torch.optim.AdamW(net.parameters(), lr=0.01), mse)
    x, y = torch.randn(5, 8).to("jax"), torch.randn(5, 4).to("jax")
    before = {name: value.cpu() for name, value in net.state_dict().items()}
    with pytest.raises(ValueError, match="capturable=True"):
        step(x, y)  # the first step creates the state, with its step counter on the CPU
    for name, value in net.state_dict().items():  # nothing half-done: the model is as it was, and usable
        torch.testing.assert_close(value.cpu(), before[name])
    assert all(p.grad is None for p in net.parameters())
    mse(net, x, y).backward()


def test_reading_a_value_inside_a_compiled_forward_says_why_it_cannot():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(RuntimeError, match="not known while JAX traces"):
        te.jit(Branchy().to("jax"))(torch.ones(3, device="jax"))
