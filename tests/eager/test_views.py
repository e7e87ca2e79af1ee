"""In-place ops through views change the base exactly as on CPU (views share storage)."""

import numpy as np
import pytest
import torch

import torch2jax.eager as te

VIEW_WRITES = {
    "view_add": lambda x, y: x.view(-1).add_(1),
    "t_mul": lambda x, y: x.t().mul_(2),
    "slice_fill": lambda x, y: x[:, 1:].fill_(5),
    "chunk_copy": lambda x, y: x.chunk(3)[1].copy_(y),
    "diagonal_fill": lambda x, y: x.diagonal().fill_(1),
    "setitem_column": lambda x, y: x.__setitem__((slice(None), 0), 3.0),
    "select_add": lambda x, y: x[1].add_(10),
    "unsqueeze_select_sub": lambda x, y: x.unsqueeze(0)[0, :, 2].sub_(1),
    "strided_slice_mul": lambda x, y: x[::2, 1::2].mul_(-1),
    "view_of_view_zero": lambda x, y: x.view(2, 6)[1].view(3, 2)[:, 1].zero_(),
}


@pytest.mark.parametrize("write", VIEW_WRITES.values(), ids=VIEW_WRITES)
def test_in_place_through_a_view_changes_the_base_as_on_cpu(write):
    base = torch.arange(12.0).reshape(3, 4)
    y = torch.full((1, 4), 7.0)
    on_cpu, on_jax = base.clone(), base.to("jax")
    write(on_cpu, y)
    write(on_jax, y.to("jax"))
    assert on_jax.device.type == "jax"
    torch.testing.assert_close(on_jax.cpu(), on_cpu, rtol=0, atol=0)
    assert not torch.equal(on_cpu, base), "the write changed nothing: the case tests nothing"


def test_views_share_storage_and_report_torch_strides():
    x = torch.arange(12.0, device="jax").reshape(3, 4)
    t = x.t()
    assert t.stride() == (1, 4) and t.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert x[:, 1:].storage_offset() == 1
    t.add_(1)  # through the transpose
    torch.testing.assert_close(x.cpu(), torch.arange(12.0).reshape(3, 4) + 1)


def test_view_of_incompatible_strides_is_torchs_error():
    x = torch.arange(12.0, device="jax").reshape(3, 4).t()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        x.view(12)
    torch.testing.assert_close(x.reshape(12).cpu(), torch.arange(12.0).reshape(3, 4).t().reshape(12))


def test_autograd_through_an_in_place_view_write_matches_cpu():
    def run(device):
        w = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
        y = w * 2
        y[:, 1].mul_(3)
        (y ** 2).sum().backward()
        return y.detach().cpu(), w.grad.cpu()

    for got, want in zip(run("jax"), run("cpu")):
        torch.testing.assert_close(got, want)


def test_a_view_read_outside_the_device_then_inside_gives_the_same_values():
    """te.jax_view reads a broadcast view with x64 off, the device's kernels with it on: the same jitted gather
    serves both (it once mixed int32 and int64 index arithmetic and failed on the second)."""
    x = torch.randn(3, 1)
    on_jax = x.to("jax")
    np.testing.assert_array_equal(np.asarray(te.jax_view(torch.broadcast_to(on_jax, (3, 4)))), torch.broadcast_to(x, (3, 4)).numpy())
    torch.testing.assert_close(torch.expand_copy(on_jax, (3, 4)).cpu(), torch.expand_copy(x, (3, 4)))
