"""Vision-language models (image-text-to-text): converted from tiny random-weight models with their processor,
compared with transformers' own generate on the same images (greedy, float32), the torch-free prompt building
and image preprocessing compared with the model's processor, and the artifact loaded where torch cannot be imported."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.generate.image_positions import image_index, patch_bicubic, patch_interpolation, patch_windows, rope_index
from torch2jax.hf.tasks import IMAGE_TEXT_TO_TEXT, default_task, task_of
from torch2jax.hf.verify import processor_token_types, transformers_greedy
from torch2jax.runtime.describe import describe

from ..helpers import cli, run_without_torch
from . import vlms

NEW = 32


# LLaVA runs in the default tier; every further architecture converts and compiles its own model again (about a
# minute of CPU each), so it runs with the slow tests
ARCHITECTURES = [name if name == "llava" else pytest.param(name, marks=pytest.mark.slow(
    reason="a second architecture converts and compiles its own model: about a minute of CPU")) for name in vlms.ARCHITECTURES]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def vlm(request, tmp_path_factory):
    """(name, model directory, the transformers model, the saved artifact, the artifact loaded), converted once per
    architecture (each load compiles its steps anew, so the tests share one)."""
    import transformers

    root = tmp_path_factory.mktemp(f"vlm-{request.param}")
    source = vlms.write(request.param, root)
    generator = torch2jax.convert_hf(f"hf:{source}", max_cache_len=96, max_batch=2)
    out = torch2jax.save(generator, root / "out")
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    return request.param, source, model, out, torch2jax.load(out)


def prompts(g, lengths=(6, 2), seed=0):
    """Prompts of random text around one image's expanded image tokens, as a processor writes them."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        words = rng.integers(vlms.FIRST_WORD, vlms.VOCAB, length).tolist()
        rows.append(words[:1] + [g.vision.image_token_id] * g.vision.tokens_per_image + words[1:])
    return rows


def test_the_task_comes_from_the_config(vlm):
    _, source, model, _, g = vlm
    assert default_task(model.config) == IMAGE_TEXT_TO_TEXT
    assert g.manifest["task"] == IMAGE_TEXT_TO_TEXT
    shown = "\n".join(describe(g.manifest, vlm[3]))
    assert "entry     encode_image" in shown and f"features of {g.vision.feature_size} per image" in shown
    assert "ForConditionalGeneration" in json.loads((source / "config.json").read_text())["architectures"][0]


def test_greedy_equals_transformers_and_a_batch_equals_each_alone(vlm):
    _, _, model, out, g = vlm
    rows = prompts(g)
    ids, mask = left_pad(rows, g.spec.pad_token_id)
    pixels = np.random.default_rng(1).standard_normal((2, *g.vision.pixel_shape)).astype(np.float32)
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=NEW, eos_token_id=[])
    theirs = transformers_greedy(model, ids, NEW, g.spec.pad_token_id, mask, pixel_values=torch.from_numpy(pixels),
                                 **processor_extras(model, ids, g))
    np.testing.assert_array_equal(ours, theirs)
    for r, row in enumerate(rows):
        alone = g.generate(np.asarray([row]), pixel_values=pixels[r:r + 1], max_new_tokens=NEW, eos_token_id=[])
        np.testing.assert_array_equal(alone[0, len(row):], ours[r, ids.shape[1]:])


def processor_extras(model, ids, g) -> dict:
    """What the processor adds for models that read it: token_type_ids (Gemma 3: 1 at image tokens; PaliGemma: 0)."""
    return processor_token_types(model, g.vision, ids)


def test_prefill_logits_equal_transformers_forward(vlm):
    """The prefill step's last logits against transformers' forward pass with the same image, to float32 rounding;
    for Gemma 3 that includes the image tokens attending to each other both ways, for PaliGemma the whole prompt
    (transformers' token_type_ids), which a causal mask alone would miss by far more than the tolerance."""
    _, _, model, _, g = vlm
    ids = np.asarray([prompts(g, (9,))[0]])
    pixels = np.random.default_rng(3).standard_normal((1, *g.vision.pixel_shape)).astype(np.float32)
    features = g.encode_images(pixels).reshape(-1, g.vision.feature_size)
    width = ids.shape[1]
    logits, _ = g._prefill(g.params, g.new_cache(1), jnp.asarray(ids), jnp.arange(width)[None], jnp.arange(width),
                           jnp.ones((1, width), bool), features, jnp.asarray(image_index(ids, g.vision.image_token_id)))
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                     **processor_extras(model, ids, g)).logits[0, -1].numpy()
        # causal attention alone: no token types (Gemma 3), or every token typed 1, the causal suffix (PaliGemma)
        suffix = {"token_type_ids": torch.ones(ids.shape, dtype=torch.long)} if g.vision.prefix_lm else {}
        causal = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels), **suffix).logits[0, -1].numpy()
    error = np.abs(np.asarray(logits[0]) - want).max()
    assert error < 1e-5
    bidirectional = g.vision.bidirectional_images or g.vision.prefix_lm  # then a causal mask alone would be caught
    assert bidirectional == (np.abs(causal - want).max() > 10 * error + 1e-5)


def test_image_positions_equal_transformers_placeholder_mask(vlm):
    _, _, model, out, g = vlm
    ids, _ = left_pad(prompts(g, (3, 7)), g.spec.pad_token_id)
    index = image_index(ids, g.vision.image_token_id)
    features = torch.zeros((2, g.vision.tokens_per_image, g.vision.feature_size))
    embeds = model.get_input_embeddings()(torch.from_numpy(ids))
    mask = model.model.get_placeholder_mask(torch.from_numpy(ids), embeds, features)[..., 0].numpy()
    np.testing.assert_array_equal(index >= 0, mask)
    # masked_scatter's order: the image tokens in row-major order take the feature rows in order
    np.testing.assert_array_equal(index[mask], np.arange(mask.sum()))


def processor_text(processor, prompt: str, images: int = 1) -> str:
    """One user turn of `images` images and `prompt` as the processor takes it: through its chat template, or
    (PaliGemma, which has none) the prompt alone, the processor adding the image tokens."""
    if processor.chat_template is None:
        return prompt
    messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": prompt}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


def test_prompt_and_pixels_equal_the_processor(vlm):
    """processor_inputs builds one user turn (chat template, the image's tokens expanded) and preprocesses the image
    as transformers' processor does, for images of different sizes and aspect ratios."""
    import transformers

    _, source, _, _, g = vlm
    processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=True)
    text = processor_text(processor, "w8 w9 w33")
    for image in vlms.images():
        want = processor(images=image, text=text, return_tensors="np")
        ids, pixels = g.processor_inputs("w8 w9 w33", image)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(pixels, want["pixel_values"])
    two = vlms.images()[:2]  # several images in one turn, in order
    want = processor(images=[two], text=processor_text(processor, "w8", images=2), return_tensors="np")  # one prompt's
    ids, pixels = g.processor_inputs("w8", two)
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(pixels, want["pixel_values"])


def test_loads_and_generates_without_torch(vlm, tmp_path):
    _, _, model, out, g = vlm
    ids, mask = left_pad(prompts(g), g.spec.pad_token_id)
    pixels = np.random.default_rng(2).standard_normal((2, *g.vision.pixel_shape)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", ids=ids, mask=mask, pixels=pixels)
    code = f"""
import numpy as np, sys
import torch2jax
g = torch2jax.load({str(out)!r})
assert type(g).__name__ == "VisionLanguageGenerator" and "torch" not in sys.modules
x = np.load({str(tmp_path / "inputs.npz")!r})
out = g.generate(x["ids"], attention_mask=x["mask"], pixel_values=x["pixels"], max_new_tokens=8, eos_token_id=[])
np.save({str(tmp_path / "out.npy")!r}, out)
"""
    result = run_without_torch(code)
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = transformers_greedy(model, ids, 8, g.spec.pad_token_id, mask, pixel_values=torch.from_numpy(pixels))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), theirs)


def test_refuses_what_it_cannot_do(vlm):
    g = vlm[4]
    row = prompts(g, (2,))[0]
    pixels = np.zeros((1, *g.vision.pixel_shape), np.float32)
    with pytest.raises(InputSpecError, match="video inputs are not supported"):
        g.generate(np.asarray([row]), pixel_values=pixels, pixel_values_videos=pixels)
    with pytest.raises(InputSpecError, match="image_grid_thw is for variable-resolution models"):
        g.generate(np.asarray([row]), pixel_values=pixels, image_grid_thw=np.asarray([[1, 2, 2]]))
    with pytest.raises(InputSpecError, match="image features and image tokens do not match"):
        g.generate(np.asarray([row[:-3] + row[-2:]]), pixel_values=pixels)
    with pytest.raises(InputSpecError, match="no pixel_values were given"):
        g.generate(np.asarray([row]))
    with pytest.raises(InputSpecError, match=r"pixel_values must be \[images, 3, "):
        g.generate(np.asarray([row]), pixel_values=np.zeros((1, 3, 8, 8), np.float32))


def test_text_only_prompt_equals_transformers(vlm):
    _, _, model, out, g = vlm
    ids = np.asarray([[5, 9, 33, 7]])
    ours = g.generate(ids, max_new_tokens=8, eos_token_id=[])
    np.testing.assert_array_equal(ours, transformers_greedy(model, ids, 8, g.spec.pad_token_id))


@pytest.mark.slow(reason="converts again through the console script (torch.export of the encoder and the step, and "
                         "verification against transformers): about a minute of CPU")
def test_cli_convert_and_generate_with_an_image(vlm, tmp_path):
    import transformers

    _, source, model, _, _ = vlm
    out = tmp_path / "cli"
    result = cli("convert", f"hf:{source}", "--max-cache-len", "96", "--max-batch", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout
    image = tmp_path / "picture.png"
    vlms.images()[0].save(image)
    shown = cli("generate", str(out), "--image", str(image), "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=True)
    inputs = processor(images=vlms.images()[0], text=processor_text(processor, "w8 w9"), return_tensors="pt")
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert shown.stdout.strip() == processor.tokenizer.decode(want[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    text = cli("generate", str(out), "--image", str(image), "--prompt", "a", "--prompt", "b")
    assert text.returncode == 2 and "one --prompt" in text.stderr
    second = tmp_path / "second.png"
    vlms.images()[1].save(second)
    shown = cli("generate", str(out), "--image", str(image), "--image", str(second), "--prompt", "w8", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    inputs = processor(images=[vlms.images()[:2]], text=processor_text(processor, "w8", images=2), return_tensors="pt")
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert shown.stdout.strip() == processor.tokenizer.decode(want[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def test_prompt_from_the_parts_equals_the_processor_files(vlm, tmp_path):
    """Without a processor_config.json: preprocessor_config.json and a tokenizer_config.json carrying the chat template
    give the same ids and pixels."""
    import copy

    import transformers

    _, source, _, _, g = vlm
    processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=True)
    if processor.chat_template is None:
        pytest.skip("this processor builds its prompt without a chat template")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor.image_processor.to_dict()))
    config = json.loads((source / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": processor.chat_template}))
    parts = copy.copy(g)
    parts.tokenizer_files = {"tokenizer.json": g.tokenizer_files["tokenizer.json"],
                             "preprocessor_config.json": tmp_path / "preprocessor_config.json",
                             "tokenizer_config.json": tmp_path / "tokenizer_config.json"}
    assert "processor_config.json" in g.tokenizer_files
    for image in vlms.images():
        for ours, want in zip(parts.processor_inputs("w8 w9", image), g.processor_inputs("w8 w9", image)):
            np.testing.assert_array_equal(ours, want)


# -- Qwen2-VL: variable resolution (flattened patches + image_grid_thw), 3-D rotary positions ---------------------------

@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(model directory, the transformers model, the saved artifact, the artifact loaded)."""
    import transformers

    root = tmp_path_factory.mktemp("vlm-qwen2_vl")
    source = vlms.write("qwen2_vl", root)
    generator = torch2jax.convert_hf(f"hf:{source}", max_cache_len=96, max_batch=2)
    out = torch2jax.save(generator, root / "out")
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    return source, model, out, torch2jax.load(out)


def qwen_prompts(grids, lengths, seed=0):
    """Prompts of random text around each grid's image tokens (vision start, grid_h*grid_w/4 image tokens, vision end)."""
    rng = np.random.default_rng(seed)
    rows = []
    for grid, length in zip(grids, lengths):
        words = rng.integers(vlms.FIRST_WORD, vlms.VOCAB, length).tolist()
        rows.append(words[:1] + [vlms.BOI] + [vlms.IMAGE] * (int(np.prod(grid)) // 4) + [vlms.EOI] + words[1:])
    return rows


def qwen_reference(model, ids, mask, pixels, grids, tokens=NEW):
    return transformers_greedy(model, ids, tokens, vlms.PAD, mask, pixel_values=torch.from_numpy(pixels),
                               image_grid_thw=torch.from_numpy(grids),
                               mm_token_type_ids=torch.from_numpy((ids == vlms.IMAGE).astype(np.int32)))


def check_qwen_batch(model, g, grids, pixels) -> tuple:
    """A left-padded batch of two prompts of different lengths, one image each (`grids`, `pixels` in order): NEW greedy
    tokens equal transformers' generate, and each row's equal its prompt alone; returns the batch's (ids, mask)."""
    rows = qwen_prompts(grids, (6, 2))
    ids, mask = left_pad(rows, vlms.PAD)
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=NEW, eos_token_id=[])
    np.testing.assert_array_equal(ours, qwen_reference(model, ids, mask, pixels, grids))
    start = 0
    for r, row in enumerate(rows):
        patches = int(grids[r].prod())
        alone = g.generate(np.asarray([row]), pixel_values=pixels[start:start + patches], image_grid_thw=grids[r:r + 1],
                           max_new_tokens=NEW, eos_token_id=[])
        np.testing.assert_array_equal(alone[0, len(row):], ours[r, ids.shape[1]:])
        start += patches
    return ids, mask


@pytest.mark.parametrize("name", ["qwen2_vl", "glm4v"])
def test_rope_index_equals_transformers(name):
    """The 3-D (temporal, height, width) positions and the decode deltas, computed in NumPy, against transformers'
    get_rope_index: left-padded rows, two images in one row, a text-only row (GLM-4V's counts from its processor's
    mm_token_type_ids, which give the same positions for images)."""
    model, _ = vlms.build(name)
    assert task_of(model.config, model) == IMAGE_TEXT_TO_TEXT  # a vision part and a text part: not text2text-generation
    grids = np.asarray([[1, 4, 6], [1, 6, 4], [1, 2, 8]])
    rng = np.random.default_rng(0)
    text = lambda n: rng.integers(vlms.FIRST_WORD, vlms.VOCAB, n).tolist()  # noqa: E731
    image = lambda g: [vlms.BOI] + [vlms.IMAGE] * (int(np.prod(g)) // 4) + [vlms.EOI]  # noqa: E731
    rows = [text(2) + image(grids[0]) + text(3) + image(grids[1]) + text(1), text(4), text(1) + image(grids[2]) + text(5)]
    ids, mask = left_pad(rows, vlms.PAD)
    ours, deltas = rope_index(ids, mask, grids, vlms.IMAGE, 2)
    want, want_deltas = model.model.get_rope_index(torch.from_numpy(ids), torch.from_numpy((ids == vlms.IMAGE).astype(np.int32)),
                                                   torch.from_numpy(grids), attention_mask=torch.from_numpy(mask).long())
    np.testing.assert_array_equal(ours, want.numpy())
    np.testing.assert_array_equal(deltas, want_deltas.numpy()[:, 0])


def test_qwen2_vl_greedy_equals_transformers_and_a_batch_equals_each_alone(qwen):
    """Two images of different grids in a left-padded batch of different prompt lengths: 32 greedy tokens equal
    transformers' generate (patch encoder, 3-D positions, decode positions continuing from the rope delta), and each
    row equals its prompt alone."""
    _, model, _, g = qwen
    grids = np.asarray([[1, 4, 6], [1, 6, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    ids, mask = check_qwen_batch(model, g, grids, pixels)
    with pytest.raises(InputSpecError, match="give image_grid_thw with pixel_values"):
        g.generate(ids, attention_mask=mask, pixel_values=pixels)
    with pytest.raises(InputSpecError, match="image features and image tokens do not match"):
        g.generate(ids, attention_mask=mask, pixel_values=pixels[:24], image_grid_thw=grids[:1])
    with pytest.raises(InputSpecError, match="video inputs are not supported"):
        g.generate(ids, pixel_values_videos=pixels)


def test_qwen2_vl_prompt_and_patches_equal_the_processor(qwen):
    """processor_inputs: the chat template, the image token expanded to grid_t*grid_h*grid_w/merge^2 tokens, and the
    patches and grid of Qwen2VLImageProcessorPil, for three images of different sizes and aspect ratios."""
    source, model, _, g = qwen
    _, parts = vlms.build("qwen2_vl")
    text = g.chat_template().render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w8 w9"}]}],
                                    add_generation_prompt=True)
    for image in vlms.images():
        want = parts([image], text)
        ids, pixels, grids = g.processor_inputs("w8 w9", image)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(pixels, want["pixel_values"])
        np.testing.assert_array_equal(grids, want["image_grid_thw"])
    two = g.chat_template().render([{"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "w8"}]}],
                                   add_generation_prompt=True)
    want = parts(vlms.images()[:2], two)
    for got, key in zip(g.processor_inputs("w8", vlms.images()[:2]), ("input_ids", "pixel_values", "image_grid_thw")):
        np.testing.assert_array_equal(got, want[key])
    assert (ids == vlms.IMAGE).sum() == int(np.prod(grids)) // 4


def test_qwen2_vl_loads_and_generates_without_torch(qwen, tmp_path):
    """The artifact loaded where torch cannot be imported: the image preprocessed, the prompt expanded and 8 greedy
    tokens generated, equal to transformers' generate on the same inputs."""
    _, model, out, g = qwen
    image = tmp_path / "picture.png"
    vlms.images()[1].save(image)
    code = f"""
import numpy as np, sys
import torch2jax
g = torch2jax.load({str(out)!r})
assert type(g).__name__ == "VisionLanguageGenerator" and "torch" not in sys.modules
ids, pixels, grids = g.processor_inputs("w8 w9", {str(image)!r})
out = g.generate(ids, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=8, eos_token_id=[])
np.savez({str(tmp_path / "out.npz")!r}, ids=ids, pixels=pixels, grids=grids, out=out)
"""
    result = run_without_torch(code)
    assert result.returncode == 0, result.stderr[-3000:]
    x = np.load(tmp_path / "out.npz")
    # the processor's attention_mask, as transformers needs it (its generate without one drifts from its own forward)
    mask = np.ones_like(x["ids"])
    np.testing.assert_array_equal(x["out"], qwen_reference(model, x["ids"], mask, x["pixels"], x["grids"], 8))
    assert "variable resolution" in "\n".join(describe(g.manifest, out))


@pytest.mark.slow(reason="converts again through the console script (torch.export of the encoder and the step, and "
                         "verification against transformers): about a minute of CPU")
def test_qwen2_vl_cli_convert_and_generate_with_an_image(qwen, tmp_path):
    """`convert` verifies against transformers with grids; `generate --image` expands the image token to the image's
    grid and equals transformers' generate on the same processor inputs."""
    source, model, _, _ = qwen
    out = tmp_path / "cli"
    result = cli("convert", f"hf:{source}", "--max-cache-len", "96", "--max-batch", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "greedy tokens equal to transformers' generate" in result.stdout
    image = tmp_path / "picture.png"
    vlms.images()[0].save(image)
    shown = cli("generate", str(out), "--image", str(image), "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    _, parts = vlms.build("qwen2_vl")
    g = torch2jax.load(out)
    ids, pixels, grids = g.processor_inputs("w8 w9", image)
    mask = np.ones_like(ids)
    want = transformers_greedy(model, ids, 8, vlms.PAD, mask, eos_token_id=vlms.EOS, pixel_values=torch.from_numpy(pixels),
                               image_grid_thw=torch.from_numpy(grids),
                               mm_token_type_ids=torch.from_numpy((ids == vlms.IMAGE).astype(np.int32)))
    assert shown.stdout.strip() == parts.tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True)


def test_qwen2_5_vl_windows_equal_transformers_window_index():
    """The window of each merged token, computed in NumPy, groups the tokens as transformers' get_vision_window_index
    does (its window order and cu_window_seqlens): grids whose merged sides are and are not multiples of the window."""
    from transformers.vision_utils import get_vision_window_index

    grids = np.asarray([[1, 6, 10], [1, 8, 4], [1, 2, 2], [1, 12, 6], [2, 4, 6]])  # the last: two frames, windows each
    order, bounds = get_vision_window_index(torch.from_numpy(grids), spatial_merge_size=2, window_size=32, patch_size=8)
    bounds = bounds.numpy() // 4  # patches -> merged tokens
    want = [sorted(order.numpy()[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    windows = patch_windows(grids, 2, 2)
    ours = [np.flatnonzero(windows == w).tolist() for w in np.unique(windows)]
    assert sorted(ours) == sorted(want) and len(windows) == int(grids.prod(1).sum()) // 4


def test_qwen3_vl_position_taps_equal_transformers():
    """The bilinear taps of Qwen3-VL's learned position table at each patch, computed in NumPy, equal transformers'
    get_vision_interpolation_indices_and_weights (the model's align_corners bilinear, merge-block order)."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    grids = np.asarray([[1, 6, 10], [1, 8, 4], [1, 2, 2], [1, 48, 30]])
    indices, weights = patch_interpolation(grids, 2, 48)
    want_indices, want_weights = get_vision_interpolation_indices_and_weights(
        torch.from_numpy(grids), num_grid_per_side=48, mode="bilinear", align_corners=True, spatial_merge_size=2)
    np.testing.assert_array_equal(indices, want_indices.numpy())
    np.testing.assert_array_equal(weights, want_weights.numpy())


# Qwen3-VL-MoE in the slow tier: Qwen3-VL's tower and deepstack path, before a mixture-of-experts text model the
# text-generation tests cover (~35 s on 2 cores)
@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", pytest.param("qwen3_vl_moe", marks=pytest.mark.slow)])
def qwen_family(request, tmp_path_factory):
    """(name, the transformers model, the artifact loaded) of a later Qwen-VL."""
    import transformers

    root = tmp_path_factory.mktemp(f"vlm-{request.param}")
    source = vlms.write(request.param, root)
    out = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=96, max_batch=2), root / "out")
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    return request.param, model, torch2jax.load(out)


def test_later_qwen_vl_features_and_greedy_equal_transformers(qwen_family):
    """Qwen2.5-VL's windowed vision blocks (windows of 2x2 merged tokens, the grids cut into whole and partial windows)
    and its full-attention block; Qwen3-VL's resampled position table and deepstack features (added to the image
    positions after the first text layers), and with a mixture-of-experts text model: the image features equal
    transformers', and 32 greedy tokens for a left-padded batch of two images of different grids equal transformers'
    generate and each row alone."""
    name, model, g = qwen_family
    assert (g.vision.window_size, g.vision.position_table) == ((2, 0) if name == "qwen2_5_vl" else (0, 4))
    if name.endswith("moe"):  # the experts are real (random), not left at zero by their init
        assert model.model.language_model.layers[0].mlp.experts.gate_up_proj.detach().abs().min() > 0
    grids = np.asarray([[1, 6, 10], [1, 8, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids))
    stacks = [torch.cat(list(feature)) for feature in getattr(want, "deepstack_features", None) or []]
    want = torch.cat([torch.cat(list(want.pooler_output)), *stacks], dim=-1).numpy()
    np.testing.assert_allclose(np.asarray(g.encode_patches(pixels, grids)), want, rtol=1e-5, atol=1e-5)
    check_qwen_batch(model, g, grids, pixels)


@pytest.mark.slow(reason="a further VLM family end to end: LLaVA, LLaVA-NeXT and Qwen2-VL cover the paths by default")
def test_internvl_greedy_prompt_and_tiles_equal_transformers(tmp_path):
    """InternVL (its vision tower, pixel shuffle and projector through get_image_features; each tile an image of the
    model): greedy tokens for two prompts, one left-padded, equal transformers' generate with the same pixel values;
    processor_inputs equals its processor's parts on three images (GotOcr2's crops: 3, 3 and 1 tiles, the image's
    tokens between its start and end tokens, 4 per tile); `generate --image` equals transformers' generate on them."""
    import transformers

    from torch2jax.hf.verify import check_generation, verify_vision_language

    source = vlms.write("internvl", tmp_path)
    out = tmp_path / "out"
    converted = cli("convert", f"hf:{source}", "--max-cache-len", "64", "--max-batch", "2", "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    g = torch2jax.load(out)
    assert (g.vision.tokens_per_image, g.vision.tile_wrap) == (4, ("<start_of_image>", "<end_of_image>"))
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    check_generation(verify_vision_language(model, g, tokens=NEW))
    _, parts = vlms.build("internvl")
    text = g.chat_template().render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w8 w9"}]}],
                                    add_generation_prompt=True)
    tiles = []
    for image in vlms.images():
        want = parts([image], text)
        ids, pixels = g.processor_inputs("w8 w9", image)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(pixels, want["pixel_values"])
        tiles.append(len(pixels))
    assert tiles == [3, 3, 1]
    two = g.chat_template().render([{"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "w8"}]}],
                                   add_generation_prompt=True)
    want = parts(vlms.images()[1:], two)  # two images in one turn: 3 and 1 tiles
    for got, key in zip(g.processor_inputs("w8", vlms.images()[1:]), ("input_ids", "pixel_values")):
        np.testing.assert_array_equal(got, want[key])
    image = tmp_path / "picture.png"
    vlms.images()[0].save(image)
    shown = cli("generate", str(out), "--image", str(image), "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    ids, pixels = g.processor_inputs("w8 w9", image)
    want = transformers_greedy(model, ids, 8, vlms.PAD, np.ones_like(ids), eos_token_id=vlms.EOS,
                               pixel_values=torch.from_numpy(pixels))
    assert shown.stdout.strip() == parts.tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.slow  # ~40 s end to end; the anyres grid and packing are checked against transformers below, by default
def test_llava_next_packing_prompt_and_greedy_equal_transformers(tmp_path):
    """LLaVA-NeXT ("anyres"): an image is its whole view and a grid of tiles, packed per image (the grid's map
    unpadded, a newline per row) by a torch-free row index. Packed features equal transformers' get_image_features for
    images of three sizes in one call; processor_inputs equals LlavaNextProcessor on three images and on two in one
    turn; greedy tokens for two prompts (one left-padded), a batch of two differently sized images against each alone,
    and `generate --image` equal transformers."""
    import transformers

    from torch2jax.generate.anyres import tiles_per_image
    from torch2jax.hf.verify import check_generation, verify_vision_language

    source = vlms.write("llava_next", tmp_path)
    out = tmp_path / "out"
    converted = cli("convert", f"hf:{source}", "--max-cache-len", "256", "--max-batch", "2", "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    g = torch2jax.load(out)
    assert (g.vision.tokens_per_image, g.vision.grid_pinpoints) == (16, ((32, 64), (64, 32), (64, 64)))
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    check_generation(verify_vision_language(model, g, tokens=NEW))
    _, processor = vlms.build("llava_next")

    def turn(count: int, text: str) -> str:
        content = [{"type": "image"}] * count + [{"type": "text", "text": text}]
        return g.chat_template().render([{"role": "user", "content": content}], add_generation_prompt=True)

    for image in vlms.images():
        want = processor(images=[image], text=turn(1, "w8 w9"), return_tensors="np")
        for got, key in zip(g.processor_inputs("w8 w9", image), ("input_ids", "pixel_values", "image_sizes")):
            np.testing.assert_array_equal(got, want[key])
    want = processor(images=vlms.images(), text=turn(3, "w8"), return_tensors="np")
    ids, pixels, sizes = g.processor_inputs("w8", vlms.images())
    for got, key in zip((ids, pixels, sizes), ("input_ids", "pixel_values", "image_sizes")):
        np.testing.assert_array_equal(got, want[key])
    assert [tiles_per_image(size, g.vision.grid_pinpoints, 32) for size in sizes] == [5, 5, 3]  # the third padded to 5
    with torch.no_grad():
        theirs = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(sizes)).pooler_output
    assert np.abs(np.asarray(g.encode_grids(pixels, sizes)) - torch.cat(theirs).numpy()).max() < 1e-5

    wide, tall = (g.processor_inputs(f"w{9 + i}", image) for i, image in enumerate(vlms.images()[:2]))
    batch, mask = left_pad([wide[0][0].tolist(), tall[0][0].tolist()], g.spec.pad_token_id)
    tiles = max(wide[1].shape[1], tall[1].shape[1])
    both = np.concatenate([np.pad(p, ((0, 0), (0, tiles - p.shape[1]), (0, 0), (0, 0), (0, 0))) for p in (wide[1], tall[1])])
    together = g.generate(batch, attention_mask=mask, pixel_values=both, image_sizes=np.concatenate([wide[2], tall[2]]),
                          max_new_tokens=8, eos_token_id=[])
    for row, (ids, pixels, sizes) in enumerate((wide, tall)):
        alone = g.generate(ids, pixel_values=pixels, image_sizes=sizes, max_new_tokens=8, eos_token_id=[])
        np.testing.assert_array_equal(together[row, batch.shape[1]:], alone[0, ids.shape[1]:])
    with pytest.raises(InputSpecError, match="image_sizes"):
        g.generate(ids, pixel_values=pixels, max_new_tokens=2)

    image = tmp_path / "picture.png"
    vlms.images()[1].save(image)
    shown = cli("generate", str(out), "--image", str(image), "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    ids, pixels, sizes = g.processor_inputs("w8 w9", image)
    want = transformers_greedy(model, ids, 8, vlms.PAD, np.ones_like(ids), eos_token_id=vlms.EOS,
                               pixel_values=torch.from_numpy(pixels), image_sizes=torch.from_numpy(sizes))
    assert shown.stdout.strip() == processor.tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("size", [(336, 336), (500, 300), (300, 500), (1000, 200), (37, 1200), (640, 480), (224, 224)])
def test_anyres_grid_and_packing_equal_transformers(size):
    """generate/anyres.py against transformers' own functions on LLaVA-NeXT's released grids: the best resolution, the
    tile grid, the packed rows (pack_image_features on a feature map of numbered rows) and the processor's count."""
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    from torch2jax.generate import anyres

    pins = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    assert anyres.best_resolution(size, pins) == select_best_resolution(size, pins)
    rows, columns = get_anyres_image_grid_shape(size, pins, 336)
    assert anyres.grid_shape(size, pins, 336) == (rows, columns)
    side, width = 24, 2
    tiles = 1 + rows * columns
    features = torch.arange(tiles * side * side * width, dtype=torch.float64).reshape(tiles, side * side, width)
    newline = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    grid = features[1:].view(rows, columns, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
    grid = unpad_image(grid, size)
    grid = torch.cat((grid, newline[:, None, None].expand(*grid.shape[:-1], 1)), dim=-1)
    want = torch.cat((features[0], grid.flatten(1, 2).transpose(0, 1)), 0).numpy()
    table = np.concatenate([features.reshape(-1, width).numpy(), newline[None].numpy()])
    index = anyres.packed_rows(size, pins, 336, side, 0, len(table) - 1)
    np.testing.assert_array_equal(table[index], want)
    assert anyres.tokens_per_image(size, pins, 336, side) == len(index)


@pytest.mark.slow(reason="a further VLM family end to end: LLaVA, LLaVA-NeXT and Qwen2-VL cover the paths by default")
def test_llava_onevision_shrunk_maps_multi_image_turns_and_greedy_equal_transformers(tmp_path):
    """LLaVA-OneVision: LLaVA-NeXT's packing with its grid maps shrunk bilinearly over anyres_max_N tiles (N = 1 here,
    so every grid is shrunk) and, in a turn of several images, each image its whole view alone. Packed features equal
    transformers' get_image_features for one image and for three in one turn (batch_num_images [3]); processor_inputs
    equals its processor's parts on both; greedy tokens for two prompts (one left-padded) and `generate --image` with
    two images equal transformers."""
    import transformers

    from torch2jax.hf.verify import check_generation, verify_vision_language

    source = vlms.write("llava_onevision", tmp_path)
    out = tmp_path / "out"
    converted = cli("convert", f"hf:{source}", "--max-cache-len", "256", "--max-batch", "2", "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    g = torch2jax.load(out)
    assert (g.vision.tokens_per_image, g.vision.max_grid_tiles) == (16, 1)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    check_generation(verify_vision_language(model, g, tokens=NEW))
    _, parts = vlms.build("llava_onevision")
    keys = ("input_ids", "pixel_values", "image_sizes", "batch_num_images")
    for images in ([vlms.images()[0]], vlms.images()):
        content = [{"type": "image"}] * len(images) + [{"type": "text", "text": "w8"}]
        want = parts(images, g.chat_template().render([{"role": "user", "content": content}], add_generation_prompt=True))
        got = g.processor_inputs("w8", images)
        for value, key in zip(got, keys):
            np.testing.assert_array_equal(value, want[key])
        _, pixels, sizes, counts = got
        with torch.no_grad():
            theirs = model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(sizes),
                                              batch_num_images=torch.from_numpy(counts)).pooler_output
        assert np.abs(np.asarray(g.encode_grids(pixels, sizes, counts)) - torch.cat(theirs).numpy()).max() < 1e-5
    assert pixels.shape[1] == 1, "three images in one turn: each its whole view alone"

    paths = []
    for i, image in enumerate(vlms.images()[:2]):
        paths += ["--image", str(tmp_path / f"picture{i}.png")]
        image.save(paths[-1])
    shown = cli("generate", str(out), *paths, "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    ids, pixels, sizes, counts = g.processor_inputs("w8 w9", [paths[1], paths[3]])
    want = transformers_greedy(model, ids, 8, vlms.PAD, np.ones_like(ids), eos_token_id=vlms.EOS,
                               pixel_values=torch.from_numpy(pixels), image_sizes=torch.from_numpy(sizes),
                               batch_num_images=torch.from_numpy(counts))
    assert shown.stdout.strip() == parts.tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True)


def test_the_check_names_the_cache_an_image_needs_instead_of_asking_for_negative_tokens():
    """A 64-token image in a 48-slot cache leaves no room for the check's text and new tokens: the check says which
    --max-cache-len would hold them (it asked generate for -21 new tokens before)."""
    from types import SimpleNamespace

    from torch2jax.errors import VerificationError
    from torch2jax.hf.verify import verify_vision_language

    vision = SimpleNamespace(spatial_merge_size=None, grid_pinpoints=None, tokens_per_image=64)
    generator = SimpleNamespace(vision=vision, spec=SimpleNamespace(max_cache_len=48))
    with pytest.raises(VerificationError, match="64 image tokens.*--max-cache-len 85 or more"):
        verify_vision_language(torch.nn.Module(), generator, tokens=12)


# -- LLaVA-shaped families: one fixed-size image, a fixed number of image tokens scattered at the image token ----------

# name -> tokens per image; VipLLaVA and BLIP-2 (a wrapped language model) by default, each further family converts and
# compiles its own model (~5 s each)
FIXED_SIZE = {"vipllava": 16, "aya_vision": 4, "cohere2_vision": 4, "got_ocr2": 64, "video_llava": 16, "deepseek_vl": 16,
              "janus": 16, "blip_2": 8}
DEFAULT_TIER = ("vipllava", "blip_2")
# the families whose processor writes more than the image tokens: processor_inputs refuses them
NOT_REPRODUCED = {"aya_vision": "AyaVisionProcessor", "cohere2_vision": "Cohere2VisionProcessor", "got_ocr2": "GotOcr2Processor"}


@pytest.mark.parametrize("name", [name if name in DEFAULT_TIER else pytest.param(name, marks=pytest.mark.slow(
    reason="a further fixed-size family converts and compiles its own model")) for name in FIXED_SIZE])
def test_fixed_size_family_greedy_equals_transformers(name):
    """VipLLaVA (two layers' features joined), Aya Vision and Command A Vision (pixel shuffle, a Cohere2 text model),
    GOT-OCR2 (a SAM-style tower), Video-LLaVA (images), DeepSeek-VL and Janus (the inner model's get_image_features),
    BLIP-2 (a Q-Former's queries, an OPT language model called as a whole causal LM):
    the image encoder's tokens per image, and 8 greedy tokens for a left-padded batch of two prompts with an image
    each equal transformers' generate. Families whose processor writes more than the image tokens refuse
    processor_inputs by name; Video-LLaVA refuses videos."""
    from torch2jax.errors import Torch2JaxError
    from torch2jax.hf.verify import check_generation, verify_vision_language

    model, _ = vlms.build(name)
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=FIXED_SIZE[name] + 16, max_batch=2)
    side = model.config.vision_config.image_size
    assert (g.vision.tokens_per_image, g.vision.pixel_shape, g.vision.image_token_id) == (FIXED_SIZE[name], (3, side, side),
                                                                                          vlms.IMAGE)
    check_generation(verify_vision_language(model, g, tokens=8))
    if name in NOT_REPRODUCED:
        with pytest.raises(Torch2JaxError, match=f"cannot build this model's prompts: {NOT_REPRODUCED[name]}"):
            g.processor_inputs("w8", vlms.images()[0])
    row = prompts(g, (2,))[0]
    pixels = np.zeros((1, *g.vision.pixel_shape), np.float32)
    with pytest.raises(InputSpecError, match="video inputs are not supported"):
        g.generate(np.asarray([row]), pixel_values=pixels, pixel_values_videos=pixels[None])


@pytest.mark.parametrize("name", ["deepseek_vl", pytest.param("vipllava", marks=pytest.mark.slow(
    reason="LLaVA's processor path, checked by default for LLaVA")), pytest.param("janus", marks=pytest.mark.slow(
    reason="DeepSeek-VL's image processor, checked by default"))])
def test_fixed_size_family_processor_and_saved_artifact_equal_transformers(name, tmp_path):
    """Converted from a directory with its processor, saved and loaded: processor_inputs equals the model's processor
    (VipLLaVA: LLaVA's, the CLIP image processor; DeepSeek-VL and Janus: the longest side resized, padded to a square
    of the mean color; Janus' image tokens between its begin and end tokens) on three images of different sizes and
    on two in one turn, and greedy tokens from those inputs equal transformers' generate."""
    import transformers

    source = vlms.write(name, tmp_path)
    out = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=64, max_batch=2), tmp_path / "out")
    g = torch2jax.load(out)
    processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=True)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    rgb = [image.convert("RGB") for image in vlms.images()]  # DeepSeek-VL's and Janus' processors do not convert
    for image in rgb:
        want = processor(images=image, text=processor_text(processor, "w8 w9 w33"), return_tensors="np")
        ids, pixels = g.processor_inputs("w8 w9 w33", image)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(pixels, want["pixel_values"])
    want = processor(images=rgb[:2], text=processor_text(processor, "w8", images=2), return_tensors="np")
    ids, pixels = g.processor_inputs("w8", rgb[:2])
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(pixels, want["pixel_values"])
    if name == "janus":
        assert ids[0].tolist().count(vlms.BOI) == ids[0].tolist().count(vlms.EOI) == 2
    ours = g.generate(ids, pixel_values=pixels, max_new_tokens=8, eos_token_id=[])
    np.testing.assert_array_equal(ours, transformers_greedy(model, ids, 8, g.spec.pad_token_id, np.ones_like(ids),
                                                            pixel_values=torch.from_numpy(pixels)))


# -- GLM-4V: Qwen2-VL's layout with its own tower (a bicubically resampled position table, a strided convolution over
# each merge block), rope index and image processor -------------------------------------------------------------------

def test_glm4v_position_taps_equal_transformers():
    """The bicubic taps of GLM-4V's position table, computed in NumPy, resample it as its Glm4vVisionEmbeddings does
    with grid_sample."""
    from transformers.models.glm4v.modeling_glm4v import Glm4vVisionEmbeddings
    from transformers.vision_utils import get_vision_position_ids

    model, _ = vlms.build("glm4v")
    embeddings = Glm4vVisionEmbeddings(model.config.vision_config)  # a 4x4 table
    torch.nn.init.normal_(embeddings.position_embedding.weight)
    grids = np.asarray([[1, 6, 10], [1, 8, 4], [1, 2, 2], [1, 48, 30]])
    positions = get_vision_position_ids(torch.from_numpy(grids), 2)
    with torch.no_grad():
        want = embeddings(torch.zeros(int(grids.prod(1).sum()), 32), torch.from_numpy(grids.prod(1)), torch.from_numpy(grids),
                          positions[:, 0], positions[:, 1]).numpy()
    indices, weights = patch_bicubic(grids, 2, 4)
    ours = (embeddings.position_embedding.weight.detach().numpy()[indices] * weights[:, :, None]).sum(1)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_glm4v_patches_equal_the_image_processor():
    """The patches and grids of Glm4vImageProcessorPil (its own smart_resize: area bounds over two frames, sides under
    one merged patch scaled up first), and of GLM-4.6V's and GLMGA's processors, which share it, for random images of
    sizes that take each of its branches."""
    import transformers as tf
    from PIL import Image

    from torch2jax.generate.image_processing import ImageProcessor

    _, parts = vlms.build("glm4v")
    settings = {key: value for key, value in parts.image_processor.to_dict().items() if key != "image_processor_type"}
    rng = np.random.default_rng(0)
    for processor in (parts.image_processor, tf.Glm46VImageProcessorPil(**settings), tf.GlmgaImageProcessorPil(**settings)):
        ours = ImageProcessor(processor.to_dict())
        for height, width in ((40, 70), (90, 50), (20, 24), (8, 40), (300, 200), (12, 12)):
            image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
            want = processor([image], return_tensors="np")
            pixels, grids = ours.patches([image])
            np.testing.assert_array_equal(grids, want["image_grid_thw"])
            np.testing.assert_allclose(pixels, want["pixel_values"], rtol=0, atol=1e-6)


@pytest.fixture(scope="module", params=["glm4v", pytest.param("glm4v_moe", marks=pytest.mark.slow(
    reason="GLM-4V's tower and rope before a mixture-of-experts text model, which the MoE causal-LM tests cover")),
    pytest.param("glm46v", marks=pytest.mark.slow(reason="GLM-4V's classes under another name: the same code path")),
    "glm_ocr"])
def glm_family(request, tmp_path_factory):
    """(name, the transformers model, the artifact converted, saved and loaded)."""
    import transformers

    root = tmp_path_factory.mktemp(f"vlm-{request.param}")
    source = vlms.write(request.param, root)
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    assert type(model).__name__ == vlms.GLM[request.param][3]
    generator = torch2jax.convert_hf(f"hf:{source}", max_cache_len=96, max_batch=2)
    return request.param, model, torch2jax.load(torch2jax.save(generator, root / "out"))


def test_glm4v_family_features_and_greedy_equal_transformers(glm_family):
    """The GLM-4V family (GLM-4.1V, GLM-4.5V's MoE, GLM-4.6V, GLM-OCR): the image features of three grids equal
    transformers'; the conversion's own check passes on the saved and loaded artifact; and a left-padded batch of two
    prompts holding three images of different sizes (two in one prompt) makes 16 greedy tokens equal to transformers'
    generate; processor_inputs equals the processor's parts."""
    from torch2jax.hf.verify import verify_vision_language

    name, model, g = glm_family
    assert g.vision.position_table == (0 if name == "glm_ocr" else 4) and g.vision.bicubic_table == (name != "glm_ocr")
    grids = np.asarray([[1, 6, 10], [1, 8, 4], [1, 4, 4]])
    pixels = np.random.default_rng(1).standard_normal((int(grids.prod(1).sum()), *g.vision.pixel_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids))
    want = torch.cat(list(want.pooler_output)).numpy()
    assert np.abs(want).max() > 0.1  # features large enough to sway the tokens (vlms.build scales the merger up)
    np.testing.assert_allclose(np.asarray(g.encode_patches(pixels, grids)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    check = verify_vision_language(model, g, tokens=12)
    assert check.ok, check.summary()

    rng = np.random.default_rng(2)
    text = lambda n: rng.integers(vlms.FIRST_WORD, vlms.VOCAB, n).tolist()  # noqa: E731
    image = lambda grid: [vlms.BOI] + [vlms.IMAGE] * (int(np.prod(grid)) // 4) + [vlms.EOI]  # noqa: E731
    ids, mask = left_pad([text(1) + image(grids[0]) + text(2) + image(grids[1]) + text(3), text(2) + image(grids[2]) + text(1)],
                         vlms.PAD)
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, max_new_tokens=16, eos_token_id=[])
    np.testing.assert_array_equal(ours, qwen_reference(model, ids, mask, pixels, grids, 16))

    _, parts = vlms.build(name)
    text = g.chat_template().render([{"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "w8"}]}],
                                    add_generation_prompt=True)
    want = parts(vlms.images()[:2], text)
    for got, key in zip(g.processor_inputs("w8", vlms.images()[:2]), ("input_ids", "pixel_values", "image_grid_thw")):
        np.testing.assert_array_equal(got, want[key])


# -- Idefics2/3, SmolVLM: pixel_values [prompts, images, C, H, W], all-zero images as padding -------------------------

# name -> tokens per image (a pixel-shuffled SigLIP-like tower; Idefics2: a perceiver resampler's latents)
IMAGE_BATCHES = {"idefics3": 4, "smolvlm": 4, "idefics2": 4}


@pytest.mark.parametrize("name", [name if name == "idefics3" else pytest.param(name, marks=pytest.mark.slow(
    reason="a further Idefics family converts and compiles its own model")) for name in IMAGE_BATCHES])
def test_image_batch_family_greedy_equals_transformers(name, tmp_path):
    """Idefics3, SmolVLM (pixel shuffle) and Idefics2 (perceiver resampler): the spec from the config, and 12 greedy
    tokens for a left-padded batch of two prompts, the first with two images and the second with one (its second an
    all-zero padding image, as the processors pad), equal transformers' generate with the same 5-D pixel_values, before
    and after save + load; other pixels give other tokens. processor_inputs refuses by name, a pixel_attention_mask
    that masks a real image's pixels is refused, a full one accepted."""
    from torch2jax.errors import Torch2JaxError

    model, _ = vlms.build(name)
    tokens = IMAGE_BATCHES[name]
    g = torch2jax.convert_hf(model, task="image-text-to-text", max_cache_len=2 * tokens + 24, max_batch=2)
    assert (g.vision.tokens_per_image, g.vision.pixel_shape, g.vision.image_token_id) == (tokens, (3, 32, 32), vlms.IMAGE)
    image = [vlms.IMAGE] * tokens
    rng = np.random.default_rng(0)
    words = rng.integers(vlms.FIRST_WORD, vlms.VOCAB, 8).tolist()
    ids, mask = left_pad([words[:1] + image + words[1:3] + image + words[3:4], words[4:5] + image + words[5:]], vlms.PAD)
    pixels = rng.standard_normal((2, 2, 3, 32, 32)).astype(np.float32)
    pixels[1, 1] = 0

    def greedy(generator, pixel_values, **extra):
        return generator.generate(ids, attention_mask=mask, pixel_values=pixel_values, max_new_tokens=12, **extra,
                                  eos_token_id=[])[:, ids.shape[1]:]

    ours = greedy(g, pixels)
    want = transformers_greedy(model, ids, 12, vlms.PAD, mask, pixel_values=torch.from_numpy(pixels))[:, ids.shape[1]:]
    np.testing.assert_array_equal(ours, want)
    full = np.ones((2, 2, 32, 32), np.int64)
    np.testing.assert_array_equal(greedy(torch2jax.load(torch2jax.save(g, tmp_path / "out")), pixels,
                                         pixel_attention_mask=full), want)
    other = pixels.copy()
    other[0, 1] = other[1, 0] = 0.5
    assert (greedy(g, other) != ours).any(), "the tiny model's tokens do not depend on the images"
    with pytest.raises(Torch2JaxError, match=f"cannot build this model's prompts: {type(model.model).__name__[:-5]}"):
        g.processor_inputs("w8", vlms.images()[0])
    full[0, 0, :, 16:] = 0
    with pytest.raises(InputSpecError, match="pixel_attention_mask masks pixels of a real image"):
        greedy(g, pixels, pixel_attention_mask=full)


# -- Mistral3, LightOnOCR: a Pixtral tower on each image at its own size (pixel_values padded, image_sizes) ------------

@pytest.fixture(scope="module", params=["mistral3", pytest.param("lighton_ocr", marks=pytest.mark.slow(
    reason="Mistral3's Pixtral tower before a Qwen3 text model: the same encoder path, checked for Mistral3 by default"))])
def pixtral(request, tmp_path_factory):
    """(name, the transformers model, the artifact converted from the model's directory with its processor)."""
    import transformers

    source = vlms.write(request.param, tmp_path_factory.mktemp(f"vlm-{request.param}"))
    model = transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()
    return request.param, model, torch2jax.convert_hf(f"hf:{source}", max_cache_len=64, max_batch=2)


def pixtral_images(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Three images padded into one [3, 3, 64, 48] batch (zeros beyond each, as the processor pads): 64x48 (4x3 tokens),
    37x40 (4x5 patches, the last column outside the 2x2 blocks) and 40x24 (5x3 patches: an odd row and column)."""
    sizes = np.asarray([[64, 48], [37, 40], [40, 24]])
    pixels = np.random.default_rng(seed).standard_normal((3, 3, 64, 48)).astype(np.float32)
    for image, (height, width) in zip(pixels, sizes):
        image[:, height:], image[:, :, width:] = 0, 0
    return pixels, sizes


def pixtral_greedy(g, model, pixels: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ours, transformers') 16 greedy tokens for a left-padded batch of two prompts, the first with the first two
    images, the second with the third."""
    rng = np.random.default_rng(2)
    text = lambda n: rng.integers(vlms.FIRST_WORD, vlms.VOCAB, n).tolist()  # noqa: E731
    image = lambda size: [vlms.IMAGE] * g.vision.native_tokens(size)  # noqa: E731
    ids, mask = left_pad([text(1) + image(sizes[0]) + text(2) + image(sizes[1]) + text(3), text(2) + image(sizes[2]) + text(1)],
                         vlms.PAD)
    ours = g.generate(ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes, max_new_tokens=16, eos_token_id=[])
    theirs = transformers_greedy(model, ids, 16, vlms.PAD, mask, pixel_values=torch.from_numpy(pixels),
                                 image_sizes=torch.from_numpy(sizes))
    return ours, theirs


def test_pixtral_features_and_greedy_equal_transformers(pixtral):
    """Mistral3 and LightOnOCR: the features of three images of different sizes (odd rows and columns of patches left
    out of the merge, as transformers' unfold leaves them) equal transformers' get_image_features; a left-padded batch
    of two prompts, the first with two images, the second with one of a third size, makes 16 greedy tokens equal to
    transformers' generate; other pixels give other tokens."""
    _, model, g = pixtral
    assert (g.vision.patch_size, g.vision.patch_merge, g.vision.tokens_per_image) == (8, 2, 0)
    pixels, sizes = pixtral_images()
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), image_sizes=torch.from_numpy(sizes))
    want = torch.cat(list(want.pooler_output)).numpy()
    assert want.shape == (12 + 4 + 2, 64) and np.abs(want).max() > 1  # vlms.build scales the projector up
    np.testing.assert_allclose(np.asarray(g.encode_native(pixels, sizes)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ours, theirs = pixtral_greedy(g, model, pixels, sizes)
    np.testing.assert_array_equal(ours, theirs)
    other, _ = pixtral_greedy(g, model, pixtral_images(seed=7)[0], sizes)
    assert (other != ours).any(axis=1).all(), "the tiny model's tokens do not depend on the images"


def test_pixtral_saved_artifact_passes_and_refuses_what_it_cannot_take(pixtral, tmp_path):
    """Saved and loaded: the padded batch's greedy tokens still equal transformers', and the generation sweep's check
    (two prompts, images of two sizes) passes; pixels without image_sizes, sizes beyond the pixels, an image under one
    merged patch and too few image tokens are refused, each naming the problem."""
    from torch2jax.hf.verify import check_image_sizes, verify_vision_language

    _, model, converted = pixtral
    g = torch2jax.load(torch2jax.save(converted, tmp_path / "out"))
    assert g.vision == converted.vision
    ours, theirs = pixtral_greedy(g, model, *pixtral_images())
    np.testing.assert_array_equal(ours, theirs)
    assert [g.vision.native_tokens(size) for size in check_image_sizes(g.vision)] == [16, 12]
    check = verify_vision_language(model, g, tokens=8)
    assert check.ok, check.summary()

    pixels, sizes = pixtral_images()
    ids = np.asarray([[vlms.FIRST_WORD] + [vlms.IMAGE] * 12])
    with pytest.raises(InputSpecError, match="at its own size: give image_sizes with pixel_values"):
        g.generate(ids, pixel_values=pixels[:1], max_new_tokens=1)
    with pytest.raises(InputSpecError, match="larger than pixel_values"):
        g.generate(ids, pixel_values=pixels[:1, :, :32], image_sizes=sizes[:1], max_new_tokens=1)
    with pytest.raises(InputSpecError, match="smaller than 16x16 pixels"):
        g.generate(ids, pixel_values=pixels[:1], image_sizes=[[64, 8]], max_new_tokens=1)
    with pytest.raises(InputSpecError, match="the images make 12 features, the prompts hold 11"):
        g.generate(ids[:, :-1], pixel_values=pixels[:1], image_sizes=sizes[:1], max_new_tokens=1)


def test_pixtral_prompt_equals_the_processor_and_generates_from_it(pixtral):
    """processor_inputs equals the processor's (Pixtral's image processor: each image resized to multiples of 16 within
    64, padded to the largest; Mistral3's ids with an image break token after each row of image tokens and an image end
    token last) for two images of different sizes in one turn, and 12 greedy tokens from it equal transformers'
    generate."""
    from torch2jax.generate.loop import until_end

    name, model, g = pixtral
    assert g.vision.image_rows == (("<start_of_image>", "<end_of_image>") if name == "mistral3" else None)
    _, parts = vlms.build(name)
    text = g.chat_template().render([{"role": "user", "content": [{"type": "image"}] * 2 + [{"type": "text", "text": "w8"}]}],
                                    add_generation_prompt=True)
    want = parts(vlms.images()[:2], text)
    got = g.processor_inputs("w8", vlms.images()[:2])
    for ours, key in zip(got, ("input_ids", "pixel_values", "image_sizes")):
        np.testing.assert_array_equal(ours, want[key])
    ids, pixels, sizes = got
    assert len({tuple(size) for size in sizes.tolist()}) == 2
    breaks = ids[0].tolist().count(vlms.BOI), ids[0].tolist().count(vlms.EOI)
    assert breaks == ((sum(size[0] // 16 for size in sizes.tolist()) - 2, 2) if name == "mistral3" else (0, 0))
    ours = g.generate(ids, pixel_values=pixels, image_sizes=sizes, max_new_tokens=12, eos_token_id=[])
    np.testing.assert_array_equal(ours, transformers_greedy(model, ids, 12, g.spec.pad_token_id, np.ones_like(ids),
                                                            pixel_values=torch.from_numpy(pixels),
                                                            image_sizes=torch.from_numpy(sizes)))
    [reply] = g.complete(["w8"], images=vlms.images()[:2], max_new_tokens=12)  # the reply alone, to its end token
    assert reply.ids == until_end(ours[0, ids.shape[1]:].tolist(), g.spec.eos_token_ids)


@pytest.mark.parametrize("patch", [None, 16])
def test_pixtral_images_equal_the_image_processor(patch):
    """Pixtral's image processor (each image shrunk to fit longest_edge, or height and width, its sides rounded up to
    the patch, the processor's patch or the config's; RGBA and grayscale converted; padded to the largest), torch-free,
    equals PixtralImageProcessorPil's pixel values and image sizes."""
    import transformers as tf
    from PIL import Image

    from torch2jax.generate.image_processing import ImageProcessor

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
              for height, width in ((40, 70), (90, 50), (20, 24), (8, 40), (300, 200), (64, 64))]
    images += [Image.fromarray(rng.integers(0, 256, (33, 47, 4), dtype=np.uint8), mode="RGBA"),
               Image.fromarray(rng.integers(0, 256, (33, 47), dtype=np.uint8), mode="L")]
    for settings in ({"size": {"longest_edge": 64}, "patch_size": 8}, {"size": {"height": 50, "width": 80}, "patch_size": 14}):
        processor = tf.PixtralImageProcessorPil(**settings)
        want = processor(images, return_tensors="np", **({"patch_size": patch} if patch else {}))
        pixels, sizes = ImageProcessor(processor.to_dict()).native(images, patch)
        np.testing.assert_array_equal(sizes, want["image_sizes"])
        np.testing.assert_allclose(pixels, want["pixel_values"], rtol=0, atol=1e-6)


def test_pixtral_processor_settings_are_read_or_refused(tmp_path):
    """The processor's settings come from processor_config.json (its processor needs torchvision to load): without it,
    or with a patch size times merge other than the model's, processor_inputs refuses, saying why."""
    from torch2jax.errors import Torch2JaxError
    from torch2jax.generate.vision_processor import check_reproduced
    from torch2jax.generate.vision_spec import VisionSpec
    from torch2jax.hf.steps.vision_language import with_processor_text

    vision = VisionSpec(vlms.IMAGE, 0, 64, "float32", (3, 64, 64), 128, processor_unsupported="none read", patch_size=8,
                        patch_merge=2)
    (tmp_path / "preprocessor_config.json").write_text("{}")
    assert with_processor_text(vision, tmp_path) == vision
    config = {"processor_class": "PixtralProcessor", "patch_size": 8, "spatial_merge_size": 2, "image_token": "[IMG]"}
    (tmp_path / "processor_config.json").write_text(json.dumps(config))
    read = with_processor_text(vision, tmp_path)
    assert (read.processor_unsupported, read.image_rows, read.image_placeholder) == (None, ("[IMG_BREAK]", "[IMG_END]"),
                                                                                     "[IMG]")
    (tmp_path / "processor_config.json").write_text(json.dumps({**config, "spatial_merge_size": 1}))
    with pytest.raises(Torch2JaxError, match="PixtralProcessor writes an image token per 8x8 pixels"):
        check_reproduced(with_processor_text(vision, tmp_path))


def test_pixtral_check_keeps_a_real_configs_image_small():
    """The conversion check's two images for a real Pixtral config (nominal 1540 pixels, 14-pixel patches merged 2x2:
    55x55 tokens) are at most 8x8 merged patches, the second a row of them shorter."""
    from torch2jax.generate.vision_spec import VisionSpec
    from torch2jax.hf.verify import check_image_sizes, image_tokens

    vision = VisionSpec(10, 0, 5120, "bfloat16", (3, 1540, 1540), 4096, patch_size=14, patch_merge=2)
    assert check_image_sizes(vision) == [(224, 224), (196, 224)] and image_tokens(vision) == 64



@pytest.mark.parametrize(("name", "cause"), [("InstructBlipForConditionalGeneration", "qformer_input_ids"),
                                             ("MllamaForConditionalGeneration", "cross-attention layers"),
                                             ("IdeficsForVisionText2Text", "gated cross-attention"),
                                             ("BlipForConditionalGeneration", "cross-attends to the image features")])
def test_models_of_another_design_are_refused_naming_why(name, cause):
    from torch2jax.hf.steps.vision_language import convert_vision_language

    vlm = type(name, (torch.nn.Module,), {"config": None})()
    with pytest.raises(InputSpecError, match=f"{name}'s images are not supported: .*{cause}"):
        convert_vision_language(vlm)
