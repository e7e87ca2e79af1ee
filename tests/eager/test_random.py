"""Random ops on jax follow torch.manual_seed (JAX's stream) and differ from draw to draw."""

import torch


def draws():
    return [torch.randn(5, device="jax").cpu(), torch.rand(3, device="jax").cpu(),
            torch.randint(0, 100, (4,), device="jax").cpu(),
            torch.nn.functional.dropout(torch.ones(8, device="jax"), 0.5).cpu()]


def test_same_seed_same_numbers_and_each_draw_differs():
    torch.manual_seed(123)
    first = draws()
    torch.manual_seed(123)
    again = draws()
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(torch.randn(5, device="jax").cpu(), torch.randn(5, device="jax").cpu())
    torch.manual_seed(124)
    assert not torch.equal(draws()[0], first[0])


def test_random_values_have_the_right_distribution_and_dtype():
    torch.manual_seed(0)
    x = torch.rand(20000, device="jax")
    assert x.dtype == torch.float32 and 0 <= x.min().item() and x.max().item() < 1
    assert abs(x.mean().item() - 0.5) < 0.02
    n = torch.randn(20000, device="jax")
    assert abs(n.std().item() - 1) < 0.03
    ints = torch.randint(3, 7, (1000,), device="jax")
    assert ints.dtype == torch.int64 and ints.min().item() == 3 and ints.max().item() == 6
