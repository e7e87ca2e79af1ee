"""Serving an encoder-decoder (serve/seq2seq_engine.py): requests join the batch while others decode, each row at its
own decoder slots, and each gets what Seq2SeqGenerator.generate gives it alone (greedy and sampled with their own
seeds), and over HTTP with the openai client a completion's text and log-probabilities equal transformers' own on the
same weights."""

from __future__ import annotations

import asyncio
import json

import httpx
import jax
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.serve.api import build_service, create_app
from torch2jax.serve.engine import Sampling
from torch2jax.serve.scheduler import Request, Scheduler
from torch2jax.serve.seq2seq_engine import Seq2SeqBatchEngine

from ..generate.lms import write_tokenizer
from ..generate.seq2seqs import EOS, write_seq2seq
from .test_scheduler import AnyToken, run

CACHE, SOURCE, ROWS = 16, 32, 4
TOL = 1e-4  # float32 log-probabilities, jax against torch over the same weights


@pytest.fixture(scope="module", params=["t5", pytest.param("bart", marks=pytest.mark.slow)])
def served(request, tmp_path_factory):
    """(the service over a tiny random-weight encoder-decoder with a word-level tokenizer, its scheduler loop not
    started; the model's directory). BART forces its end token last in generate, which the server does not."""
    root = tmp_path_factory.mktemp("seq2seq_serving")
    source = write_seq2seq(request.param, root, weight_scale=0.3)  # each token depends on the source and its past
    write_tokenizer(source)
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS,
                                                   max_source_len=SOURCE), root / "artifact")
    service = build_service(artifact, warm_up="short", decode_block=4)
    return service, source


def alone(g, request: Request) -> list[int]:
    s = request.sampling
    options = dict(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, rng=jax.random.key(s.seed)) \
        if s.temperature > 0 else {}
    # one token more than asked: BART's forced end token takes generate's last
    out = g.generate(np.array([request.prompt]), max_new_tokens=request.max_tokens + 1, eos_token_id=[], **options)
    return out[0, 1:1 + request.max_tokens].tolist()


def test_requests_arriving_while_others_decode_join_at_once_and_each_get_what_they_get_alone(served):
    """9 requests (sources 1-31 tokens, replies 1-15 tokens, greedy and sampled) arriving over 7 steps into 4 rows: a
    request takes a row as soon as one is free, while the others decode at their own slots (some request's first token
    comes while one admitted before it is still running), and each request's tokens equal generate's for it alone."""
    service, _ = served
    scheduler = Scheduler(service.scheduler.engine, max_queue=16)
    rng = np.random.default_rng(3)
    batch, steps = [], {}
    for i in range(9):
        settings = Sampling(float(rng.uniform(0.5, 1.5)), int(rng.integers(0, 20)), float(rng.uniform(0.6, 1.0)),
                            seed=i) if i % 2 else Sampling()
        batch.append(Request(rng.integers(3, 128, int(rng.integers(1, SOURCE))).tolist(), int(rng.integers(1, CACHE)),
                             lambda e, i=i: steps.setdefault(i, []).append(scheduler.steps), settings, end_tokens=()))
    run(scheduler, {0: batch[:3], 1: batch[3:5], 3: batch[5:7], 6: batch[7:]})
    g = scheduler.engine.g
    for r in batch:
        assert r.tokens == alone(g, r), (len(r.prompt), r.max_tokens, r.sampling)
    assert scheduler.max_rows_held == ROWS and not scheduler.engine.running.any()
    first, last = {i: min(s) for i, s in steps.items()}, {i: max(s) for i, s in steps.items()}
    assert any(first[a] < first[b] < last[a] for a in steps for b in steps), steps  # joined mid-decoding
    assert scheduler.engine.decode_steps > 0 and scheduler.engine.width == 2 * 16  # the widest bucket met
    short = Request([5, 6], 3, lambda e: None, end_tokens=())
    run(scheduler, {0: [short]})
    assert scheduler.engine.width == 16 and short.tokens == alone(g, short)  # narrowed to what its rows need


def test_after_compile_steps_a_mixed_load_compiles_nothing(served, tmp_path):
    """The server's warm-up: after compile_steps, groups of every size and source bucket joining a batch of every width,
    greedy, sampled, with log-probabilities and penalties and with an allowed-token mask, run without a compilation (a
    new engine over the artifact saved and loaded, as `serve` has it)."""
    service, _ = served
    g = torch2jax.load(torch2jax.save(service.scheduler.engine.g, tmp_path / "artifact"))
    engine = Seq2SeqBatchEngine(g, ROWS, decode_block=4)
    assert engine.step_shapes() == {"groups": [1, 2, 4], "sources": [16, 32], "spans": [16]}
    # a start and join per (group size, source bucket), the width changes from each bucket, the decode variants per
    # (bucket, span), the penalties' count restart
    assert engine.compile_steps(workers=2) == 3 * 2 + 2 + 2 * (4 + 2) + 1
    steps = [g._encode, engine._start, engine._pick_jit, engine._decode, engine._count_from, engine._join,
             engine._join_cross, engine._fit]
    compiled = [f._cache_size() for f in steps]
    rng = np.random.default_rng(5)
    kinds = [lambda i: Sampling(0.8, seed=i), lambda i: Sampling(), lambda i: Sampling(logprobs=2, frequency_penalty=0.5),
             lambda i: Sampling(0.8, seed=i, logprobs=0, presence_penalty=-1.0)]
    load = [Request(rng.integers(3, 128, int(rng.integers(1, SOURCE))).tolist(), int(rng.integers(1, CACHE + 1)),
                    lambda e: None, kinds[i % 4](i), end_tokens=()) for i in range(10)]
    load[2].constraint = load[7].constraint = AnyToken()  # masked first-token picks and decode steps
    scheduler = Scheduler(engine)
    run(scheduler, {0: load[:1], 1: load[1:3], 4: load[3:8], 9: load[8:]})
    assert [f._cache_size() for f in steps] == compiled


def test_what_does_not_fit_is_refused_naming_it(served):
    service, _ = served
    scheduler = Scheduler(service.scheduler.engine)
    with pytest.raises(InputSpecError, match="more than this model's encoder takes"):
        scheduler.submit(Request(list(range(3, 3 + SOURCE + 1)), 4, lambda e: None))
    with pytest.raises(InputSpecError, match=r"max_tokens=17 is more than this model's decoder holds \(16\)"):
        scheduler.submit(Request([5, 6], CACHE + 1, lambda e: None))
    with pytest.raises(InputSpecError, match="takes text only"):
        scheduler.submit(Request([5, 6], 2, lambda e: None, image_features=np.zeros((1, 4))))


def transformers_logits(model, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """transformers' decoder logits for each of `tokens` after the start token, teacher-forced: [len, vocab]."""
    start = model.config.decoder_start_token_id
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([[start, *tokens[:-1]]])).logits[0].numpy()


def penalized_greedy(model, prompt: list[int], new: int, presence: float, frequency: float) -> list[int]:
    """Greedy tokens with OpenAI's penalties applied by hand to transformers' logits (logits[j] -= c[j] * frequency +
    (c[j] > 0) * presence, c[j] the times token j was generated so far), up to the end token."""
    out: list[int] = []
    for _ in range(new):
        logits = transformers_logits(model, prompt, [*out, 0])[-1].astype(np.float32)
        c = np.bincount(np.array(out, np.int64), minlength=logits.shape[0]).astype(np.float32)
        out.append(int(np.argmax(logits - (c * np.float32(frequency) + (c > 0) * np.float32(presence)))))
        if out[-1] == EOS:
            break
    return out


def test_the_openai_client_gets_generates_text_transformers_logprobs_and_penalties(served):
    """/v1/completions through the openai package: two prompts at once at temperature 0 give generate's tokens as
    text, with each token's log-probability and the top 2 equal to transformers' log_softmax; a third with presence and
    frequency penalties gives transformers' greedy tokens penalized by hand; chat is refused with a 400 naming what is
    missing (the model has no chat template)."""
    import transformers
    from openai import AsyncOpenAI, BadRequestError

    service, source = served
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(source, local_files_only=True).eval()
    g = service.scheduler.engine.g
    prompts = ["w5 w9 w33 w17", "w40 w41"]
    service.scheduler.start()
    try:
        async def ask():
            app = create_app(service)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served/v1",
                                         timeout=120) as h:
                client = AsyncOpenAI(base_url="http://served/v1", api_key="unused", http_client=h, max_retries=0)
                answers = await asyncio.gather(*(client.completions.create(
                    model="artifact", prompt=p, max_tokens=6, temperature=0, logprobs=2) for p in prompts),
                    client.completions.create(model="artifact", prompt=prompts[0], max_tokens=8, temperature=0,
                                              presence_penalty=1.5, frequency_penalty=1.0))
                try:
                    await client.chat.completions.create(model="artifact", max_tokens=2,
                                                         messages=[{"role": "user", "content": "w5"}])
                    refused = None
                except BadRequestError as err:
                    refused = err
                return answers, refused

        answers, refused = asyncio.run(ask())
    finally:
        service.scheduler.stop()
    penalized = answers.pop()
    want = penalized_greedy(model, g.tokenizer.encode(prompts[0]).ids, 8, 1.5, 1.0)
    assert penalized.choices[0].text == g.tokenizer.decode(want, skip_special_tokens=True), want
    assert want != penalized_greedy(model, g.tokenizer.encode(prompts[0]).ids, 8, 0.0, 0.0)  # the penalties count
    for text, answer in zip(prompts, answers):
        ids = g.tokenizer.encode(text).ids
        want = g.generate(np.array([ids]), max_new_tokens=7, eos_token_id=[EOS])[0, 1:7].tolist()
        want = want[: want.index(EOS) + 1] if EOS in want else want
        choice = answer.choices[0]
        assert choice.text == g.tokenizer.decode(want, skip_special_tokens=True), (choice.text, want)
        found = choice.logprobs
        reference = torch.log_softmax(torch.tensor(transformers_logits(model, ids, want)).double(), -1).numpy()
        assert len(found.token_logprobs) == len(want)
        np.testing.assert_allclose(found.token_logprobs, reference[np.arange(len(want)), want], atol=TOL)
        for row, top in enumerate(found.top_logprobs):
            np.testing.assert_allclose(sorted(top.values(), reverse=True), np.sort(reference[row])[::-1][:2], atol=TOL)
    assert refused is not None and "chat template" in json.dumps(refused.body)
