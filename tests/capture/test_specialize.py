"""Integer inputs whose values decide shapes (capture/specialize.py): fixed to their example values where torch.export
stops on them, baked into the artifact, and any other value refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.diagnose.verify import verify
from torch2jax.errors import ExamplePathError, InputSpecError, SignatureError


class Crops(torch.nn.Module):
    """Each image cropped to its own size, read from an integer input (as LLaVA-NeXT reads `image_sizes`)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 4)

    def forward(self, images, image_sizes):
        pooled = []
        for image, (h, w) in zip(images, image_sizes.tolist()):
            crop = image[:, :h, :w]
            if h > w:  # a branch on the input's values: torch.export stops here unless they are fixed
                crop = crop.transpose(1, 2)
            pooled.append(self.proj(crop.flatten(1).mean(-1)) * crop.shape[-1])
        return torch.stack(pooled)


class TokenBranch(torch.nn.Module):
    """The same kind of branch on a per-token input, which is never fixed on its own."""

    def forward(self, x, input_ids):
        if input_ids[0, 0] > 2:
            return x + 1
        return x - 1


def _crops():
    torch.manual_seed(0)
    images = torch.randn(2, 3, 6, 6)
    sizes = torch.tensor([[4, 6], [5, 3]])
    return Crops().eval(), images, sizes


def test_a_size_input_is_fixed_converts_round_trips_and_refuses_other_values(tmp_path):
    module, images, sizes = _crops()
    with pytest.warns(UserWarning, match=r"input 'image_sizes' is fixed to its example value \[\[4, 6\], \[5, 3\]\]"):
        model = torch2jax.convert(module, (images, sizes))
    torch2jax.save(model, tmp_path / "crops", platforms=("cpu",))
    loaded = torch2jax.load(tmp_path / "crops")
    report = verify(module, loaded, (images, sizes), {})
    assert report.passed, report.summary()
    assert any(run.label == "random inputs" and not run.skipped for run in report.runs)  # the sizes kept, images new
    assert "image_sizes: [[4, 6], [5, 3]] (fixed at conversion)" in loaded.signature
    manifest = json.loads((tmp_path / "crops" / "manifest.json").read_text())
    assert [i.get("fixed") for i in manifest["inputs"]] == [None, [[4, 6], [5, 3]]]  # what `inspect` shows
    refused = r"'image_sizes' was fixed to its example value \[\[4, 6\], \[5, 3\]\].*got \[\[4, 6\], \[3, 5\]\]"
    with pytest.raises(SignatureError, match=refused):
        loaded(images.numpy(), np.array([[4, 6], [3, 5]]))


def test_specialize_by_name_and_its_errors():
    module, images, sizes = _crops()
    progress = []
    model = torch2jax.convert(module, (images, sizes), specialize=["image_sizes"], progress=lambda *m: progress.append(m))
    np.testing.assert_allclose(np.asarray(model(images.numpy(), sizes.numpy())), module(images, sizes).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    assert any("'image_sizes' is fixed" in message for _stage, message in progress)
    with pytest.raises(InputSpecError, match="'sizes' is not an input of this call; its inputs are images, image_sizes"):
        torch2jax.convert(module, (images, sizes), specialize=["sizes"])


def test_a_per_token_input_is_not_fixed_and_the_branch_follows_the_example():
    """Fixing input_ids would fix the prompt: the conversion takes the example's side of the branch instead, checked
    at run time, and names the model's line when other ids take the other side."""
    x, ids = torch.randn(2, 3), torch.tensor([[3, 1, 2]])
    with pytest.warns(UserWarning, match=r"test_specialize.py|if input_ids\[0, 0\] > 2:"):
        model = torch2jax.convert(TokenBranch(), (x, ids))
    np.testing.assert_allclose(np.asarray(model(x.numpy(), np.array([[7, 0, 0]]))), (x + 1).numpy())  # other ids, same side
    with pytest.raises(ExamplePathError, match=r"if input_ids\[0, 0\] > 2:"):
        model(x.numpy(), np.array([[1, 1, 2]]))
    model = torch2jax.convert(TokenBranch(), (x, ids), specialize=["input_ids"])  # asked for by name, it is fixed
    np.testing.assert_allclose(np.asarray(model(x.numpy(), ids.numpy())), (x + 1).numpy())


class PatchGroups(torch.nn.Module):
    """Patches pooled per image by sizes read from a grid input, each patch then given its image's mean (as
    Qwen2-VL-style vision towers split by `cu_seqlens.tolist()` and index by `repeat_interleave` over the grid)."""

    def forward(self, patches, grid):
        lengths = grid[:, 0] * grid[:, 1]
        pooled = torch.stack([part.mean(0) for part in torch.split(patches, lengths.tolist())])
        image_of = torch.repeat_interleave(torch.arange(grid.shape[0]), lengths)
        return pooled[image_of] * 2


def test_values_computed_from_a_fixed_input_are_folded_before_decomposition(monkeypatch):
    """torch.export sees the fixed grid's values, but decomposition retraces without them: the repeat_interleave's
    size would be data-dependent again unless what the graph computes from the grid is lifted as constants (without
    them, the size would be taken from the example and checked on every call)."""
    from torch2jax.capture import specialize

    patches, grid = torch.randn(10, 3), torch.tensor([[2, 3], [1, 4]])
    model = torch2jax.convert(PatchGroups(), (patches, grid), specialize=["grid"])
    np.testing.assert_allclose(np.asarray(model(patches.numpy(), grid.numpy())),
                               PatchGroups()(patches, grid).numpy(), rtol=1e-6, atol=1e-6)
    assert model.graph.example_values == {}  # the size is a constant: nothing left to check at run time
    with pytest.raises(SignatureError, match="'grid' was fixed"):
        model(patches.numpy(), np.array([[1, 3], [1, 7]]))
    monkeypatch.setattr(specialize, "fold_constants", lambda ep: 0)
    with pytest.warns(UserWarning, match="repeat_interleave"):
        unfolded = torch2jax.convert(PatchGroups(), (patches, grid), specialize=["grid"])
    assert [info["value"] for info in unfolded.graph.example_values.values()] == [10]


class WrittenLater(torch.nn.Module):
    """A value computed from the fixed grid and then written in place by the data: not foldable."""

    def forward(self, patches, grid):
        lengths = grid[:, 0] * grid[:, 1]
        lengths.add_((patches.sum() > 1e9).long())  # in place, from the data: the graph must keep computing it
        return patches[: int(grid.sum())] * lengths.sum()


def test_a_folded_value_written_in_place_leaves_the_graph_whole():
    from torch2jax.capture import exporter, specialize

    patches, grid = torch.randn(10, 3), torch.tensor([[2, 3], [1, 4]])
    exported = exporter.export(WrittenLater(), (patches, grid), None, None, specialize=["grid"])
    before = str(exported.program.graph)
    assert specialize.fold_constants(exported.program) == 0
    assert str(exported.program.graph) == before
    model = torch2jax.convert(WrittenLater(), (patches, grid), specialize=["grid"])
    np.testing.assert_allclose(np.asarray(model(patches.numpy(), grid.numpy())),
                               WrittenLater()(patches, grid.clone()).numpy(), rtol=1e-6)


class StridedPad(torch.nn.Module):
    """A padding computed from integer buffers kept out of the state_dict (as EnCodec keeps its convs' stride and
    kernel size): a constant of the module, which torch.export traces as an unknown value unless told otherwise."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 2, 3)
        self.register_buffer("stride", torch.tensor(2), persistent=False)
        self.register_buffer("kernel", torch.tensor(3), persistent=False)

    def forward(self, x):
        frames = torch.ceil((x.shape[-1] - self.kernel) / self.stride).to(torch.int64) + 1
        extra = int((frames - 1) * self.stride + self.kernel - x.shape[-1])
        if extra > 0:  # a branch on a buffer's value
            x = torch.nn.functional.pad(x, (0, extra))
        return self.conv(x)


class CountingPad(StridedPad):
    """The same, with its buffer written in forward: state, not a constant, so never traced as one."""

    def forward(self, x):
        self.stride += 0
        return super().forward(x)


def test_constant_buffers_are_traced_as_constants_where_a_guard_reads_them():
    module = StridedPad().eval()
    x = torch.randn(2, 2, 8)
    model = torch2jax.convert(module, (x,))
    assert verify(module, model, (x,), {}).passed
    assert not model.graph.example_values, "the padding is a constant of the graph: nothing taken from the example"
    assert module.stride.item() == 2 and type(module.stride) is torch.Tensor, "the module keeps its own buffers"


def test_a_buffer_written_in_forward_is_not_traced_as_a_constant():
    """Its value is then taken from the example and checked on every call (capture/example_path.py)."""
    module = CountingPad().eval()
    with pytest.warns(UserWarning, match="reads 1 value"):
        model = torch2jax.convert(module, (torch.randn(2, 2, 8),))
    assert model.graph.example_values
    assert module.stride.item() == 2 and type(module.stride) is torch.Tensor
