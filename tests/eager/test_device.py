"""The jax device as a torch device: factories, transfers, printing, errors, the JAX views."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax.eager as te


def test_factories_create_tensors_on_jax_with_torchs_dtypes():
    assert torch.randn(4, 8, device="jax").device.type == "jax"
    torch.testing.assert_close(torch.zeros(2, 3, device="jax").cpu(), torch.zeros(2, 3))
    torch.testing.assert_close(torch.ones(2, 3, device="jax").cpu(), torch.ones(2, 3))
    arange = torch.arange(5, device="jax")
    assert arange.dtype == torch.int64
    torch.testing.assert_close(arange.cpu(), torch.arange(5))
    torch.testing.assert_close(torch.arange(0, 1, 0.25, device="jax").cpu(), torch.arange(0, 1, 0.25))
    empty = torch.empty(3, 2, device="jax")
    assert empty.shape == (3, 2) and empty.dtype == torch.float32
    torch.testing.assert_close(torch.full((2,), 1.5, device="jax").cpu(), torch.full((2,), 1.5))


def test_elementwise_matmul_and_reductions_match_cpu():
    x = torch.randn(4, 8)
    on_jax = x.to("jax")
    torch.testing.assert_close(((on_jax @ on_jax.T).relu()).cpu(), (x @ x.T).relu())
    torch.testing.assert_close(on_jax.sum(1).cpu(), x.sum(1))
    torch.testing.assert_close(on_jax.amax(0).cpu(), x.amax(0))
    torch.testing.assert_close((on_jax * 2 + 1).exp().mean().cpu(), (x * 2 + 1).exp().mean())
    assert (on_jax > 0).dtype == torch.bool


def test_item_print_cpu_and_numpy_behave_as_for_a_device():
    x = torch.tensor([[1.5, -2.0]]).to("jax")
    assert x.sum().item() == -0.5
    assert "device='jax:0'" in repr(x) and "1.5000" in repr(x)
    assert isinstance(x.cpu(), torch.Tensor) and x.cpu().device.type == "cpu"
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        x.numpy()
    np.testing.assert_array_equal(x.cpu().numpy(), np.array([[1.5, -2.0]], np.float32))


def test_mixed_devices_give_torchs_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="jax") + torch.ones(3)


def test_a_cpu_scalar_tensor_mixes_as_torch_allows():
    torch.testing.assert_close((torch.ones(3, device="jax") * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_int64_stays_int64():
    big = torch.tensor([2**40 + 1, -(2**35)], dtype=torch.int64)
    on_jax = big.to("jax")
    assert on_jax.dtype == torch.int64 and te.jax_view(on_jax).dtype == jnp.int64
    torch.testing.assert_close((on_jax * 3).cpu(), big * 3)
    assert (on_jax + 1).sum().item() == int((big + 1).sum())


def test_jax_view_and_torch_view_round_trip():
    array = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    tensor = te.torch_view(array)
    assert tensor.device.type == "jax" and tensor.shape == (2, 3)
    assert te.jax_view(tensor) is array  # no copy
    assert isinstance(te.jax_view(tensor.t()), jax.Array)
    np.testing.assert_array_equal(np.asarray(te.jax_view(tensor.t())), np.asarray(array).T)
    with pytest.raises(TypeError, match="jax device"):
        te.jax_view(torch.ones(2))


def test_an_op_without_lowering_or_decomposition_names_itself():
    from torch2jax.eager.kernels import UnsupportedOnJaxDevice
    from torch2jax.ops import lookup

    op = torch.ops.aten._logcumsumexp.default
    assert lookup(str(op)) is None and op not in torch._decomp.decomposition_table
    with pytest.raises(UnsupportedOnJaxDevice, match="aten::_logcumsumexp"):
        torch.logcumsumexp(torch.tensor([1.0, 2.0]).to("jax"), 0)


def test_data_dependent_shapes_run_eagerly():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 1.5]])
    on_jax = x.to("jax")
    torch.testing.assert_close(torch.nonzero(on_jax).cpu(), torch.nonzero(x))
    torch.testing.assert_close(on_jax[on_jax > 1].cpu(), x[x > 1])
    torch.testing.assert_close(torch.masked_select(on_jax, on_jax > 0).cpu(), torch.masked_select(x, x > 0))
    for got, want in zip(torch.unique(on_jax, return_counts=True, return_inverse=True),
                         torch.unique(x, return_counts=True, return_inverse=True)):
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("unique", [torch.unique, torch.unique_consecutive], ids=["unique", "unique_consecutive"])
def test_unique_along_a_dim_of_an_empty_tensor_is_torchs(unique):
    """Along the empty dim: empty results (OpInfo's samples of a [5, 0, 5] input); along another: torch's error."""
    x = torch.randn(5, 0, 5)
    for got, want in zip(unique(x.to("jax"), dim=1, return_inverse=True, return_counts=True),
                         unique(x, dim=1, return_inverse=True, return_counts=True)):
        torch.testing.assert_close(got.cpu(), want)
    for device in ("cpu", "jax"):
        with pytest.raises(RuntimeError, match="There are 0 sized dimensions, and they aren't selected"):
            unique(x.to(device), dim=2)


REPEATS = torch.tensor([2, 0, 3, 1])
LABELS = torch.tensor([3, 0, 3, 5, 1, 3])
SIZED_FROM_VALUES = {
    # Qwen2-VL's cu_seqlens: each grid's h*w repeated t times, then a cumulative sum
    "repeats only": lambda: torch.repeat_interleave(REPEATS),
    "repeats int32": lambda: torch.repeat_interleave(REPEATS.int()),
    "repeats with output_size": lambda: torch.repeat_interleave(REPEATS, output_size=6),
    "repeats empty": lambda: torch.repeat_interleave(REPEATS[:0]),
    "rows": lambda: torch.repeat_interleave(torch.arange(12.0).view(4, 3), REPEATS, dim=0),
    "columns, output_size": lambda: torch.repeat_interleave(torch.arange(12).view(3, 4), REPEATS, dim=1, output_size=6),
    "flattened": lambda: torch.repeat_interleave(torch.arange(4.0).view(2, 2), REPEATS),
    "cu_seqlens": lambda: torch.repeat_interleave(torch.tensor([[1, 4, 6], [2, 2, 2]]).prod(-1)[:, None].mul(1) * 1,
                                                   torch.tensor([1, 2])).cumsum(0, dtype=torch.int32),
    # MoE routing: tokens per expert
    "bincount": lambda: torch.bincount(LABELS),
    "bincount uint8": lambda: torch.bincount(LABELS.to(torch.uint8)),
    "bincount minlength": lambda: torch.bincount(LABELS, minlength=9),
    "bincount minlength below max": lambda: torch.bincount(LABELS, minlength=2),
    "bincount empty": lambda: torch.bincount(LABELS[:0], minlength=3),
    "bincount empty weighted": lambda: torch.bincount(LABELS[:0], torch.ones(0), minlength=2),
    "bincount float32 weights": lambda: torch.bincount(LABELS, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.7])),
    "bincount float64 weights": lambda: torch.bincount(LABELS, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.7], dtype=torch.float64), 7),
    "bincount int weights": lambda: torch.bincount(LABELS, torch.tensor([1, 2, 3, 4, 5, 6])),
    "bincount bfloat16 weights": lambda: torch.bincount(LABELS, torch.full((6,), 0.3, dtype=torch.bfloat16)),
}


@pytest.mark.parametrize("case", SIZED_FROM_VALUES)
def test_repeat_interleave_and_bincount_are_sized_from_the_values(case):
    """The result's size is read from the values (no output_size needed), its dtype and values torch's CPU ones."""
    build = SIZED_FROM_VALUES[case]
    want = build()
    with _all_tensors_on("jax"):
        got = build()
    assert got.device.type == "jax"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


BAD_VALUES = {
    "negative repeats": (lambda t: torch.repeat_interleave(t(torch.tensor([1, -1]))), RuntimeError, "can not be negative"),
    "2-d repeats": (lambda t: torch.repeat_interleave(t(torch.tensor([[1]]))), RuntimeError, "only accept 1D"),
    "float repeats": (lambda t: torch.repeat_interleave(t(torch.tensor([1.0]))), NotImplementedError, "repeat_interleave"),
    "wrong output_size": (lambda t: torch.repeat_interleave(t(torch.tensor([1, 2])), output_size=4), RuntimeError,
                          "allocated size does not match"),
    "negative value": (lambda t: torch.bincount(t(torch.tensor([0, -1]))), RuntimeError, "non-negative"),
    "2-d input": (lambda t: torch.bincount(t(torch.tensor([[0]]))), RuntimeError, "1-d non-negative"),
    "float input": (lambda t: torch.bincount(t(torch.tensor([0.0]))), NotImplementedError, "bincount"),
    "weights too short": (lambda t: torch.bincount(t(torch.tensor([0, 1])), t(torch.ones(1))), RuntimeError,
                          "same length"),
    "negative minlength": (lambda t: torch.bincount(t(torch.tensor([0])), minlength=-1), RuntimeError, "minlength"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_repeat_interleave_and_bincount_check_the_values_as_torch_does(case):
    build, error, message = BAD_VALUES[case]
    with pytest.raises(error, match=message):
        build(lambda t: t)
    with pytest.raises(error, match=message):
        build(lambda t: t.to("jax"))


class _all_tensors_on:
    """Every tensor the SIZED_FROM_VALUES cases build (from REPEATS, LABELS, factories) on `device`."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        global REPEATS, LABELS
        self.saved = REPEATS, LABELS
        REPEATS, LABELS = REPEATS.to(self.device), LABELS.to(self.device)
        self.mode = torch.device(self.device)
        self.mode.__enter__()

    def __exit__(self, *exc):
        global REPEATS, LABELS
        self.mode.__exit__(*exc)
        REPEATS, LABELS = self.saved


def test_importing_changes_nothing_and_enable_keeps_inductor_and_accelerator_healthy():
    code = """
import torch, torch2jax, torch2jax.eager as te
assert torch._C._get_privateuse1_backend_name() == "privateuseone", "import renamed the device"
te.enable()
assert torch._C._get_privateuse1_backend_name() == "jax"
f = torch.compile(lambda x: (x.sin() + 1).sum(), backend="inductor")
x = torch.randn(8)
torch.testing.assert_close(f(x), (x.sin() + 1).sum())
assert torch.accelerator.is_available() in (True, False)
print("ok", torch.accelerator.device_count())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


def test_deepcopy_copies_values_keeps_aliasing_and_shares_nothing():
    import copy

    model = torch.nn.Linear(3, 2).to("jax")
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "jax" and clone.weight.is_leaf and clone.weight.requires_grad
    torch.testing.assert_close(clone.weight.cpu(), model.weight.cpu())
    with torch.no_grad():
        clone.weight.add_(1)
    torch.testing.assert_close(clone.weight.cpu(), model.weight.cpu() + 1)
    base = torch.arange(6.0, device="jax")
    copied_base, copied_view = copy.deepcopy((base, base[2:]))
    copied_view.fill_(0)  # the copies alias each other as the originals do
    torch.testing.assert_close(copied_base.cpu(), torch.tensor([0.0, 1, 0, 0, 0, 0]))
    torch.testing.assert_close(base.cpu(), torch.arange(6.0))


def test_python_scalars_promote_as_in_torch_one_after_another():
    # 1, 1.0 and True are equal python keys: the cached meta answer must still tell them apart
    x = torch.tensor([1, 2])
    on_jax = x.to("jax")
    for scalar in (1, 1.0, True, 2.5, 1):
        got, want = on_jax + scalar, x + scalar
        assert got.dtype == want.dtype, scalar
        torch.testing.assert_close(got.cpu(), want)


def test_enable_after_a_backward_pass_says_to_enable_first():
    """torch's autograd engine sets up its devices at the process's first backward: later, jax tensors could
    not be differentiated, so enable() says so at once rather than torch asserting inside loss.backward()."""
    code = """
import torch, torch2jax.eager as te
w = torch.ones(2, requires_grad=True)
(w * 2).sum().backward()
try:
    te.enable()
except RuntimeError as err:
    print(err)
print((torch.ones(2, device="jax") * 3).cpu().tolist())  # forward ops still work
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "was called after this process ran a backward pass" in done.stdout
    assert "Call te.enable() at the start of the program" in done.stdout
    assert "[3.0, 3.0]" in done.stdout
