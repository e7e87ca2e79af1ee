"""Serving a vision-language artifact (serve/engine.py with image inputs): every request, with images or without,
gets the tokens VisionLanguageGenerator.generate gives it alone, whatever joins its batch: LLaVA (image tokens
cut across prefill chunks), Gemma 3 (an image's tokens attend both ways: prompts prefilled whole) and PaliGemma (the
whole prompt attends both ways)."""

from __future__ import annotations

import numpy as np
import pytest

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.serve.engine import BatchEngine
from torch2jax.serve.scheduler import Request, Scheduler

from ..hf import vlms
from .test_scheduler import run

CACHE, ROWS, NEW = 96, 4, 6


# LLaVA's image rows by default; Gemma 3's and PaliGemma's whole-prompt prefills (bidirectional image blocks, a prefix
# LM) in the slow tier, ~1 min each on 2 cores (make test-slow)
@pytest.fixture(scope="module", params=["llava", pytest.param("gemma3", marks=pytest.mark.slow),
                                        pytest.param("paligemma", marks=pytest.mark.slow)])
def vlm(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"serve-vlm-{request.param}")
    source = vlms.write(request.param, root)
    return torch2jax.load(torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS),
                                         root / "out"))


def image_requests(g, count: int, seed: int) -> list[tuple[Request, np.ndarray | None]]:
    """`count` requests, every third one text only, the others one image among 1-12 words of text; (request, pixels)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        words = rng.integers(vlms.FIRST_WORD, vlms.VOCAB, int(rng.integers(1, 13))).tolist()
        if i % 3 == 2:
            out.append((Request(words, NEW, lambda e: None, end_tokens=()), None))
            continue
        prompt = words[:1] + [g.vision.image_token_id] * g.vision.tokens_per_image + words[1:]
        pixels = rng.standard_normal((1, *g.vision.pixel_shape)).astype(np.float32)
        features = g.image_features(g.vision.tokens_per_image, pixels)
        out.append((Request(prompt, NEW, lambda e: None, end_tokens=(), image_features=features), pixels))
    return out


def test_requests_with_and_without_images_each_get_what_they_get_alone(vlm):
    g = vlm
    engine = BatchEngine(g, ROWS, chunk=16)
    assert engine.prefix is None  # an image token's keys depend on its image, which block names do not hold
    engine.compile_steps(workers=2)  # the text-only shapes, and decode with the step's image inputs
    scheduler = Scheduler(engine, max_queue=16)
    load = image_requests(g, 6, seed=0)
    run(scheduler, {0: [r for r, _ in load[:4]], 3: [r for r, _ in load[4:]]})  # two join as the first ones run
    for request, pixels in load:
        alone = g.generate(np.asarray([request.prompt]), pixel_values=pixels, max_new_tokens=NEW, eos_token_id=[])
        assert request.tokens == alone[0, len(request.prompt):].tolist(), (len(request.prompt), pixels is not None)
    assert scheduler.max_rows_held == ROWS


def test_image_tokens_and_features_must_agree(vlm):
    g = vlm
    scheduler = Scheduler(BatchEngine(g, 2), max_queue=4)
    (request, _), = image_requests(g, 1, seed=1)
    with pytest.raises(InputSpecError, match=f"holds {g.vision.tokens_per_image} image tokens .* make 0 feature rows"):
        scheduler.submit(Request(request.prompt, 2, lambda e: None))
    with pytest.raises(InputSpecError, match="holds 0 image tokens"):
        scheduler.submit(Request([9, 10], 2, lambda e: None, image_features=request.image_features))
    assert not scheduler.waiting


def data_uri(image) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def llava_service(tmp_path_factory):
    from torch2jax.serve.api import build_service

    root = tmp_path_factory.mktemp("serve-vlm-http")
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{vlms.write('llava', root)}", max_cache_len=CACHE, max_batch=ROWS),
                              root / "out")
    service = build_service(artifact, warm_up="short", chunk=16, decode_block=4)
    service.scheduler.start()
    yield service, torch2jax.load(artifact)
    service.scheduler.stop()


def test_chat_with_an_image_equals_generate_with_it_alone(llava_service, tmp_path):
    """Chat messages with image_url parts (a data URI; a file inside --allowed-local-media-path) reply what
    generate_text gives the same text and image alone; a text-only chat shares the batch."""
    from .test_openai_features import post

    service, g = llava_service
    wide, tall, _ = vlms.images()
    (tmp_path / "tall.png").write_bytes(b"")
    tall.save(tmp_path / "tall.png")
    service.media_root = tmp_path
    try:
        bodies = [{"model": "out", "max_tokens": NEW, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w20 w21 w22"}]}]}
            for url in (data_uri(wide), "file://" + str(tmp_path / "tall.png"), "tall.png")]
        text_only = {"model": "out", "max_tokens": NEW, "temperature": 0,
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "w30 w31"}]}]}
        answers = post(service, "/v1/chat/completions", *bodies, text_only)
        outside = dict(bodies[0], messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "../elsewhere.png"}}, {"type": "text", "text": "w20"}]}])
        refused, = post(service, "/v1/chat/completions", outside)
        assert refused.status_code == 400 and "outside the directory" in refused.json()["error"]["message"]
    finally:
        service.media_root = None
    for answer, image in zip(answers, (wide, tall, tall)):
        assert answer.status_code == 200, answer.text
        want = g.complete(["w20 w21 w22"], images=[image], max_new_tokens=NEW)[0]
        reply = answer.json()
        assert reply["choices"][0]["message"]["content"] == want.text
        assert reply["usage"]["completion_tokens"] == want.new_tokens
    assert answers[3].status_code == 200, answers[3].text


@pytest.mark.parametrize("url, says", [
    ("https://example.com/cat.png", "does not fetch image URLs"),
    ("data:image/png;base64,not base64!", "not valid base64"),
    ("data:image/png,raw", "must be base64"),
    ("data:image/png;base64,aGVsbG8=", "could not be read"),
    ("cat.png", "--allowed-local-media-path"),
])
def test_an_image_the_server_cannot_read_is_a_400_naming_messages(llava_service, url, says):
    from .test_openai_features import post

    service, _ = llava_service
    body = {"model": "out", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w20"}]}]}
    answer, = post(service, "/v1/chat/completions", body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages", answer.text
    assert says in answer.json()["error"]["message"]


def test_qwen2_vl_requests_keep_their_own_3d_positions(tmp_path_factory):
    """The Qwen2-VL family: each request's 3-D rotary positions come from its own images' grids, and its decode positions
    continue from its own delta, whatever shares the batch: images of different sizes (grids) and a text-only request
    each equal generate alone."""
    root = tmp_path_factory.mktemp("serve-qwen2-vl")
    g = torch2jax.convert_hf(f"hf:{vlms.write('qwen2_vl', root)}", max_cache_len=CACHE, max_batch=ROWS)
    scheduler = Scheduler(BatchEngine(g, ROWS, chunk=16), max_queue=8)
    load = []
    for i, image in enumerate(vlms.images()):
        ids, pixels, grids = g.processor_inputs(f"w{20 + i} w21", image)
        features = g.image_features(int((ids == g.vision.image_token_id).sum()), pixels, image_grid_thw=grids)
        request = Request(ids[0].tolist(), NEW, lambda e: None, end_tokens=(), image_features=features, image_grids=grids)
        load.append((request, dict(pixel_values=pixels, image_grid_thw=grids)))
    load.append((Request([9, 10, 11], NEW, lambda e: None, end_tokens=()), {}))
    run(scheduler, {0: [r for r, _ in load[:2]], 2: [r for r, _ in load[2:]]})
    for request, images in load:
        alone = g.generate(np.asarray([request.prompt]), max_new_tokens=NEW, eos_token_id=[], **images)
        assert request.tokens == alone[0, len(request.prompt):].tolist(), images.get("image_grid_thw")
