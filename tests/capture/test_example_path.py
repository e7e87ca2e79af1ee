"""Models that read values from their tensors to decide a shape or a branch convert along the example inputs' path,
and the converted model refuses inputs that take another (capture/example_path.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import ExamplePathError
from torch2jax.ir.graph import Graph


class Branch(torch.nn.Module):
    """A branch on a tensor's value, as in `if is_global_attn:`."""

    def forward(self, x, mask):
        if mask.any():
            return x * 2 + mask.sum()
        return x - 1


class Selected(torch.nn.Module):
    """Rows selected by a mask (a data-dependent count), reduced and returned."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x, mask):
        rows = self.proj(x[mask])
        return rows.softmax(-1).cumsum(0), torch.nonzero(mask)


class ReadSize(torch.nn.Module):
    """A size read with .item(): the number of leading columns to keep."""

    def forward(self, x, count):
        return x[:, : count.item()] * 3


class FloatBranch(torch.nn.Module):
    """A branch on a float read with .item(): no value is fixed, the condition itself is checked."""

    def forward(self, x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1


def _convert(module, *inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = torch2jax.convert(module, inputs)
    return model, [str(w.message) for w in caught]


def _close(model, module, *inputs):
    got = model(*[np.asarray(i) for i in inputs])
    with torch.no_grad():
        want = module(*inputs)
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_branch_on_values_follows_the_example_and_refuses_the_other_side():
    module = Branch()
    x = torch.randn(3, 4)
    model, said = _convert(module, x, torch.tensor([False, True, False]))
    assert any("refuses inputs that give another" in s for s in said)  # the user is told
    _close(model, module, torch.randn(3, 4), torch.tensor([True, True, False]))  # same side of the branch
    with pytest.raises(ExamplePathError, match="example gave 1") as err:
        model(np.ones((3, 4), np.float32), np.zeros(3, bool))
    assert "mask.any()" in str(err.value)  # names the model's line


def test_a_count_of_selected_rows_is_the_examples_and_checked():
    module = Selected().eval()
    mask = torch.tensor([True, False, True, True, False])
    model, _ = _convert(module, torch.randn(5, 4), mask)
    assert {info["value"] for info in model.graph.example_values.values()} == {3}
    _close(model, module, torch.randn(5, 4), torch.tensor([False, True, True, False, True]))  # other rows, same count
    with pytest.raises(ExamplePathError):
        model(np.ones((5, 4), np.float32), np.ones(5, bool))


def test_a_size_read_with_item_is_the_examples_and_checked():
    module = ReadSize()
    model, _ = _convert(module, torch.randn(2, 6), torch.tensor(4))
    _close(model, module, torch.randn(2, 6), torch.tensor(4))
    with pytest.raises(ExamplePathError, match="example gave 4"):
        model(np.ones((2, 6), np.float32), np.asarray(5))


def test_the_checks_survive_save_and_load(tmp_path):
    module = Selected().eval()
    mask = torch.tensor([True, False, True, True, False])
    model, _ = _convert(module, torch.randn(5, 4), mask)
    torch2jax.save(model, tmp_path / "art")
    loaded = torch2jax.load(tmp_path / "art")
    assert loaded.graph.example_values == model.graph.example_values
    _close(loaded, module, torch.randn(5, 4), torch.tensor([True, True, False, False, True]))
    with pytest.raises(ExamplePathError):
        loaded(np.ones((5, 4), np.float32), np.zeros(5, bool))


def test_graphs_with_example_values_are_a_newer_format():
    """An older reader would run such a graph without its checks: it must refuse it instead."""
    model, _ = _convert(ReadSize(), torch.randn(2, 6), torch.tensor(4))
    data = model.graph.to_json()
    assert data["format_version"] == 2 and data["example_values"]
    assert Graph.from_json(data).example_values == model.graph.example_values
    plain = torch2jax.convert(torch.nn.Linear(2, 2), (torch.randn(1, 2),)).graph.to_json()
    assert plain["format_version"] == 1 and "example_values" not in plain


def test_a_branch_on_a_float_checks_the_condition_not_the_value():
    module = FloatBranch()
    model, _ = _convert(module, torch.ones(3))
    (entry,) = model.graph.example_values.values()
    assert "value" not in entry and "> 0" in entry["condition"]
    _close(model, module, torch.tensor([5.0, -1.0, 0.5]))  # another sum, the same side
    with pytest.raises(ExamplePathError, match=r"(?s)satisfied .*x.sum\(\).item\(\) > 0"):
        model(np.full(3, -1.0, np.float32))


class Distinct(torch.nn.Module):
    def forward(self, x):
        return torch.unique(x, return_counts=True)


def test_a_count_of_distinct_values_is_the_examples_and_checked():
    module = Distinct()
    model, _ = _convert(module, torch.tensor([3, 1, 3, 2]))
    _close(model, module, torch.tensor([5, 5, 0, 7]))  # three distinct values, as in the example
    with pytest.raises(ExamplePathError, match="example gave 3"):
        model(np.array([1, 1, 1, 1]))


def test_inspect_shows_what_was_taken_from_the_example(tmp_path):
    from click.testing import CliRunner
    from torch2jax.cli.main import main

    model, _ = _convert(ReadSize(), torch.randn(2, 6), torch.tensor(4))
    torch2jax.save(model, tmp_path / "art")
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "art")])
    assert shown.exit_code == 0, shown.output
    assert "converted along the example inputs' path" in shown.output and "output: float32[2, 4]" in shown.output
    assert "4 at return x[:, : count.item()] * 3" in shown.output


def test_the_cli_converts_along_the_example_and_says_so(tmp_path):
    from click.testing import CliRunner
    from torch2jax.cli.main import main

    source = tmp_path / "branchy.py"
    source.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x, mask):\n"
                      "        return x[mask].sum(0) * 2\n")
    result = CliRunner().invoke(main, ["convert", f"{source}:M", "--input", "x=float32[6,3]", "--input", "mask=bool[6]",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "refuses inputs that give another" in result.output and "x[mask]" in result.output
    assert "converted along the example inputs' path" in CliRunner().invoke(main, ["inspect", str(tmp_path / "out")]).output


def test_under_the_callers_jit_the_checks_are_a_value_to_act_on():
    import jax

    module = Selected().eval()
    model, _ = _convert(module, torch.randn(5, 4), torch.tensor([True, False, True, True, False]))

    @jax.jit
    def run(params, x, mask):
        return model.apply(params, x, mask), model.example_checks(params, x, mask)

    x = np.ones((5, 4), np.float32)
    (_, ok) = run(model.params, x, np.array([True, True, True, False, False]))
    assert ok.dtype == bool and ok.all()
    (_, ok) = run(model.params, x, np.ones(5, bool))
    assert not ok.all()
    plain = torch2jax.convert(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert plain.example_checks(plain.params, np.ones((1, 2), np.float32)).shape == (0,)


_MODEL_FILE = '''import torch


class FileBranch(torch.nn.Module):
    """A branch on a tensor's value, in a model file of its own."""

    def forward(self, x, mask):
        if mask.any():
            return x * 2
        return x - 1
'''


def test_the_error_names_the_models_file_and_line_and_torch_cond(tmp_path):
    """Where the model's source is a file, the refusal says where in it the value is read, and how to convert both
    branches instead (torch.cond)."""
    import importlib.util

    path = tmp_path / "branch_in_a_file.py"
    path.write_text(_MODEL_FILE)
    line = _MODEL_FILE.splitlines().index("        if mask.any():") + 1
    spec = importlib.util.spec_from_file_location("branch_in_a_file", path)
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    model, said = _convert(source.FileBranch(), torch.randn(3, 4), torch.tensor([False, True, False]))
    (entry,) = model.graph.example_values.values()
    assert (entry["file"], entry["line"], entry["at"]) == (str(path), line, "if mask.any():")
    assert any(f"branch_in_a_file.py:{line}: if mask.any():" in s for s in said)  # the conversion's notice too
    with pytest.raises(ExamplePathError) as err:
        model(np.ones((3, 4), np.float32), np.zeros(3, bool))
    message = str(err.value)
    assert f"at {path}:{line}: if mask.any():" in message
    assert "torch.cond" in message


def test_graphs_saved_without_file_and_line_still_load_and_name_the_code_line():
    """The file and line are optional in the artifact: a graph from before they were recorded loads, and its
    refusal names the code line as it did."""
    model, _ = _convert(Branch(), torch.randn(3, 4), torch.tensor([False, True, False]))
    data = model.graph.to_json()
    data["example_values"] = {key: {k: v for k, v in info.items() if k not in ("file", "line")}
                              for key, info in data["example_values"].items()}
    old = Graph.from_json(data)
    (entry,) = old.example_values.values()
    assert "file" not in entry and entry["at"] == "if mask.any():"
    message = str(ExamplePathError(old.example_values, [False]))
    assert "example gave 1" in message and "at if mask.any():" in message and "torch.cond" in message
