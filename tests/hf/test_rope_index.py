"""The Qwen2-VL family's multimodal rotary positions written for torch.export (torch2jax/hf/stand_ins/rope_index.py): the same
positions as each model's own get_rope_index, and a converted Qwen2.5-VL that takes any placement of its image tokens."""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from torch2jax.hf.stand_ins import rope_index

TEXT, IMAGE, VIDEO = rope_index.TEXT, rope_index.IMAGE, rope_index.VIDEO


def _row(runs: list[tuple[int, int]], length: int, left_pad: int = 0) -> tuple[list[int], list[int]]:
    types_ = [kind for kind, count in runs for _ in range(count)]
    right = length - left_pad - len(types_)
    return [TEXT] * left_pad + types_ + [TEXT] * right, [0] * left_pad + [1] * len(types_) + [0] * right


def _layouts(variant: rope_index.Variant, merge: int, temporal: int):
    """Batches of token types and masks with their grids: images and a two-frame video in one row, a left-padded row
    with one image, a right-padded text-only row, two images in one row."""
    image_grid = torch.tensor([[1, 2 * merge, 3 * merge], [1, 4 * merge, 2 * merge], [1, merge, merge]])
    video_grid = torch.tensor([[2 * temporal, 2 * merge, 2 * merge]])
    video_runs = [(VIDEO, 4), (TEXT, 1), (VIDEO, 4)] if variant.split_video_frames else [(VIDEO, 8)]
    rows = [
        _row([(TEXT, 3), (IMAGE, 6), (TEXT, 2), *video_runs, (TEXT, 2)], 28),
        _row([(TEXT, 2), (IMAGE, 8), (TEXT, 4)], 28, left_pad=5),
        _row([(TEXT, 7)], 28),
        _row([(IMAGE, 1), (TEXT, 2)], 28, left_pad=1),
    ]
    token_types = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows])
    return token_types, mask, image_grid, video_grid


@pytest.mark.parametrize("name", list(rope_index.VARIANTS))
def test_positions_equal_the_models_own_get_rope_index(name):
    from transformers import AutoConfig

    module_name, class_name = name.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"transformers.models.{module_name}"), class_name)
    assert rope_index._takes_token_types(cls), f"{name}: get_rope_index no longer takes mm_token_type_ids"
    config = AutoConfig.for_model(module_name.split(".")[0])
    variant = rope_index.VARIANTS[name]
    merge = config.vision_config.spatial_merge_size
    temporal = config.vision_config.temporal_merge_size if variant.temporal_merge else 1
    token_types, mask, image_grid, video_grid = _layouts(variant, merge, temporal)
    ids = torch.randint(0, 50, token_types.shape)
    extra = {"second_per_grid_ts": torch.tensor([0.5])} if variant.seconds_per_grid else {}

    theirs_self = types.SimpleNamespace(config=config)
    theirs_self.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, theirs_self)
    want = cls.get_rope_index(theirs_self, ids, token_types, image_grid_thw=image_grid, video_grid_thw=video_grid.clone(),
                              attention_mask=mask, **extra)
    ours_self = type(class_name, (), {"__module__": cls.__module__})()  # a stand-in instance of the same class name
    ours_self.config = config
    got = rope_index.get_rope_index(ours_self, ids, token_types, image_grid_thw=image_grid,
                                    video_grid_thw=video_grid.clone(), attention_mask=mask, **extra)
    assert got[0].dtype == want[0].dtype and got[1].shape == want[1].shape
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def _qwen2_5_vl():
    """A tiny Qwen2.5-VL: window attention over windows of 2x2 merged tokens in its first block, full in its second."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    text = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, use_cache=False,
                rope_parameters={"type": "mrope", "mrope_section": [2, 1, 1], "rope_theta": 10000, "rope_type": "default"})
    vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=40, num_heads=4, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=4, video_token_id=5,
                              vision_start_token_id=3)
    torch.manual_seed(0)
    return Qwen2_5_VLModel(config).eval()


def _prompt(starts: list[int], pads: list[int], length: int = 24) -> dict[str, torch.Tensor]:
    """One 6x6-patch image (9 merged tokens, windows of 2x2 of them) per row, its tokens from `starts[row]`,
    `pads[row]` left padding."""
    ids = torch.randint(6, 99, (len(starts), length))
    token_types = torch.zeros_like(ids)
    mask = torch.ones_like(ids)
    for row, (start, pad) in enumerate(zip(starts, pads)):
        ids[row, start - 1] = 3
        ids[row, start:start + 9] = 4
        token_types[row, start:start + 9] = IMAGE
        mask[row, :pad] = 0
    pixels = torch.rand(len(starts) * 36, 3 * 2 * 14 * 14)
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": token_types, "pixel_values": pixels,
            "image_grid_thw": torch.tensor([[1, 6, 6]] * len(starts))}


def test_converted_qwen2_5_vl_takes_image_tokens_anywhere_in_the_prompt():
    """Its rotary positions are computed from the token types in the graph (rope_index.py); its window order from the
    fixed grid, outside the trace (vision_grids.py), and folded to constants (capture/specialize.py)."""
    import torch2jax
    from torch2jax.diagnose.verify import verify

    model = _qwen2_5_vl()
    torch.manual_seed(1)
    with pytest.warns(UserWarning, match="'image_grid_thw' is fixed"):
        converted = torch2jax.convert(model, (), _prompt(starts=[4, 9], pads=[0, 2]))
    for starts, pads in (([4, 9], [0, 2]), ([14, 2], [3, 0]), ([2, 13], [0, 5])):
        report = verify(model, converted, (), _prompt(starts, pads))
        assert report.passed, f"image tokens at {starts}, padding {pads}: {report.summary()}"
