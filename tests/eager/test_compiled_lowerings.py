"""On the jax device a lowering runs as one compiled call per argument signature, and eagerly where it reads values."""

import torch

from torch2jax.eager import compiled_lowerings as compiled


def _signatures(op_name: str) -> dict:
    return {sig: fn for sig, fn in compiled._COMPILED.items() if sig[0] == op_name}


def test_a_lowering_compiles_once_per_signature():
    x = torch.randn(5, 7)
    on_jax = x.to("jax")
    before = len(_signatures("aten.hardtanh.default"))
    for _ in range(3):
        torch.testing.assert_close(torch.nn.functional.hardtanh(on_jax, -0.5, 0.5).cpu(), torch.nn.functional.hardtanh(x, -0.5, 0.5))
    assert len(_signatures("aten.hardtanh.default")) == before + 1  # three calls, one compiled function
    torch.testing.assert_close(torch.nn.functional.hardtanh(on_jax, -0.25, 0.25).cpu(), torch.nn.functional.hardtanh(x, -0.25, 0.25))
    assert len(_signatures("aten.hardtanh.default")) == before + 2  # other bounds are another signature
    assert all(fn is not None for fn in _signatures("aten.hardtanh.default").values())


def test_a_lowering_that_reads_values_runs_eagerly():
    x = torch.randn(6)
    keep = x > 0
    got = x.to("jax")[keep.to("jax")]  # boolean indexing: the result's size is a value
    torch.testing.assert_close(got.cpu(), x[keep])
    eager = [sig for sig, fn in compiled._COMPILED.items() if fn is None]
    assert any(sig[0] == "aten.index.Tensor" for sig in eager)


def test_an_integer_and_a_boolean_index_are_two_signatures(monkeypatch):
    """The arrays' dtypes are part of the signature (issue 55): a boolean index after an integer one does not run
    the integer index's compiled function, it gets its own entry, which runs eagerly."""
    monkeypatch.setattr(compiled, "_COMPILED", {})
    monkeypatch.setattr(compiled, "_VARIANTS", {})
    x = torch.randn(6)
    on_jax = x.to("jax")
    index, keep = torch.tensor([0, 2]), x > 0
    torch.testing.assert_close(on_jax[index.to("jax")].cpu(), x[index])
    torch.testing.assert_close(on_jax[keep.to("jax")].cpu(), x[keep])
    torch.testing.assert_close(on_jax[index.to("jax")].cpu(), x[index])
    entries = list(_signatures("aten.index.Tensor").values())
    assert sorted(fn is None for fn in entries) == [False, True]  # the integer index compiled, the boolean one eager


def test_an_op_called_with_ever_new_values_stops_compiling(monkeypatch):
    monkeypatch.setattr(compiled, "MAX_VARIANTS", 3)
    x = torch.randn(4, 5)
    on_jax = x.to("jax")
    before = len(_signatures("aten.hardtanh.default"))
    for i in range(6):
        bound = 0.1 * (i + 7)
        torch.testing.assert_close(torch.nn.functional.hardtanh(on_jax, -bound, bound).cpu(),
                                   torch.nn.functional.hardtanh(x, -bound, bound))
    assert len(_signatures("aten.hardtanh.default")) - before <= 3
