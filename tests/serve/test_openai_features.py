"""The per-request OpenAI fields of `torch2jax serve` (logprobs, presence / frequency penalties, n, echo), each against
a reference computed apart from the server: log-probabilities and penalized greedy tokens from transformers' own logits
of the same weights (torch: the model itself), choices against requests of one choice. The app runs in process (httpx
over ASGI, nothing listens), one scheduler loop for the module; replies are read whole and streamed."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.serve.api import build_service, create_app

from ..generate.lms import EOS, load_lm, write_lm, write_tokenizer

CACHE, ROWS = 32, 4
TEMPLATE = "{{ bos_token }}{% for m in messages %} w10 {{ m['content'] }}{% endfor %}{% if add_generation_prompt %} w12{% endif %}"
PROMPT = [5, 9, 33, 17]
MESSAGES = [{"role": "user", "content": "w42 w43"}]
TOL = 1e-4  # float32 log-probabilities, jax against torch over the same weights


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the service, its scheduler loop running; transformers' model of the same weights), a tiny random-weight Llama
    with a word-level tokenizer (w3 ... w127) and a chat template."""
    root = tmp_path_factory.mktemp("openai_features")
    source = write_lm("llama", root)
    write_tokenizer(source)
    (source / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "chat_template": TEMPLATE}))
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS), root / "llm")
    service = build_service(artifact, warm_up="short", chunk=16, decode_block=4)
    service.scheduler.start()
    yield service, load_lm(source)
    service.scheduler.stop()


def post(service, path: str, *bodies: dict) -> list[httpx.Response]:
    """Post the bodies at once (they share the batch) and wait for every answer."""

    async def run():
        app = create_app(service)  # no lifespan under ASGITransport: the module's scheduler loop serves it
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served", timeout=120) as c:
            return await asyncio.gather(*(c.post(path, json=body) for body in bodies))

    return asyncio.run(run())


def chunks(answer: httpx.Response) -> list[dict]:
    """A streamed answer's JSON chunks (it must end with [DONE])."""
    assert answer.status_code == 200, answer.text
    data = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def raw_logprobs(lm, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """transformers' log_softmax of the logits that chose each of `tokens` after `prompt`: [len(tokens), vocab]."""
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: len(prompt) + len(tokens) - 1]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def penalized_greedy(lm, prompt: list[int], new: int, presence: float, frequency: float) -> list[int]:
    """Greedy tokens with OpenAI's penalties applied by hand to transformers' logits: logits[j] -= c[j] * frequency +
    (c[j] > 0) * presence, c[j] the times token j was generated so far; up to the end token."""
    out: list[int] = []
    for _ in range(new):
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([prompt + out])).logits[0, -1].numpy().astype(np.float32)
        c = np.bincount(np.array(out, np.int64), minlength=logits.shape[0]).astype(np.float32)
        out.append(int(np.argmax(logits - (c * np.float32(frequency) + (c > 0) * np.float32(presence)))))
        if out[-1] == EOS:
            break
    return out


def token_id(service, text: str) -> int:
    """The id of a token as a logprob entry writes it (the word-level tokenizer's tokens follow a space)."""
    found = service.tokenizer.token_to_id(text.strip())
    assert found is not None, text
    return found


def words(ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in ids)


def chat_prompt(service) -> list[int]:
    return service.tokenizer.encode(service.chat_template.render(MESSAGES, add_generation_prompt=True),
                                    add_special_tokens=False).ids


def assert_same_entries(got: list[dict], want: list[dict]) -> None:
    """The same tokens (and most likely tokens) with the same log-probabilities, up to float32 rounding (a row of the
    batch may round a last bit apart from another row)."""
    assert [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in got] == \
        [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in want]
    np.testing.assert_allclose([[e["logprob"]] + [t["logprob"] for t in e["top_logprobs"]] for e in got],
                               [[e["logprob"]] + [t["logprob"] for t in e["top_logprobs"]] for e in want], atol=TOL)


def check_chat_logprobs(service, lm, content: list[dict], prompt: list[int], top: int) -> list[int]:
    """Each entry's token and log-probability, and its `top` most likely, equal transformers' log_softmax; the tokens."""
    tokens = [token_id(service, e["token"]) for e in content]
    want = raw_logprobs(lm, prompt, tokens)
    for step, (entry, token) in enumerate(zip(content, tokens)):
        assert entry["logprob"] == pytest.approx(want[step, token], abs=TOL), step
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == top
        best = np.argsort(-want[step], kind="stable")[:top]
        assert [token_id(service, t["token"]) for t in entry["top_logprobs"]] == best.tolist(), step
        np.testing.assert_allclose([t["logprob"] for t in entry["top_logprobs"]], want[step, best], atol=TOL)
    return tokens


def test_chat_logprobs_are_the_raw_log_softmax_whole_and_streamed(served):
    """Greedy and sampled at temperature 1.7 (the log-probabilities are the model's own, before temperature: vLLM's
    default), top_logprobs 5 and 0; streamed chunks carry the same entries as the whole reply."""
    service, lm = served
    prompt = chat_prompt(service)
    greedy = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    hot = dict(greedy, temperature=1.7, seed=11, top_logprobs=0)
    whole, sampled, streamed = post(service, "/v1/chat/completions", greedy, hot, dict(greedy, stream=True))
    reply = whole.json()["choices"][0]
    tokens = check_chat_logprobs(service, lm, reply["logprobs"]["content"], prompt, 5)
    assert whole.json()["usage"]["completion_tokens"] == len(tokens)
    assert "".join(e["token"] for e in reply["logprobs"]["content"] if e["token"] != " </s>") == reply["message"]["content"]
    hot_content = sampled.json()["choices"][0]["logprobs"]["content"]
    hot_tokens = check_chat_logprobs(service, lm, hot_content, prompt, 0)
    assert hot_tokens != tokens  # sampled: another reply, and its tokens' raw log-probabilities all the same
    parts = chunks(streamed)
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for p in parts for e in (p["choices"][0]["logprobs"] or {"content": []})["content"]]
    assert_same_entries(content, reply["logprobs"]["content"])
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in parts) == reply["message"]["content"]
    plain = post(service, "/v1/chat/completions", dict(greedy, logprobs=False, top_logprobs=None))[0].json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"] == reply["message"]


def test_completions_legacy_logprobs_whole_and_streamed(served):
    """`logprobs: 3`: tokens, token_logprobs, top_logprobs (the 3 most likely and the chosen token), text_offset into the
    choice's text."""
    service, lm = served
    body = {"prompt": words(PROMPT), "max_tokens": 8, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    whole, streamed = post(service, "/v1/completions", body, dict(body, stream=True))
    choice = whole.json()["choices"][0]
    found = choice["logprobs"]
    tokens = [token_id(service, t) for t in found["tokens"]]
    want = raw_logprobs(lm, PROMPT, tokens)
    assert len(tokens) == 8 and "".join(found["tokens"]) == choice["text"]
    np.testing.assert_allclose(found["token_logprobs"], want[np.arange(8), tokens], atol=TOL)
    for step, (token, top) in enumerate(zip(found["tokens"], found["top_logprobs"])):
        best = np.argsort(-want[step], kind="stable")[:3]
        assert set(top) == {*(f" w{t}" if step else f"w{t}" for t in best), token}, (step, top)
        for text, value in top.items():
            assert value == pytest.approx(want[step, token_id(service, text)], abs=TOL)
        assert choice["text"][found["text_offset"][step]:].startswith(token)
    parts = chunks(streamed)
    assert "".join(p["choices"][0]["text"] for p in parts) == choice["text"]
    streamed = {key: [v for p in parts for v in p["choices"][0]["logprobs"][key]] for key in found}
    assert streamed["tokens"] == found["tokens"] and streamed["text_offset"] == found["text_offset"]
    np.testing.assert_allclose(streamed["token_logprobs"], found["token_logprobs"], atol=TOL)
    assert [sorted(top) for top in streamed["top_logprobs"]] == [sorted(top) for top in found["top_logprobs"]]


def test_presence_and_frequency_penalties_equal_applying_them_by_hand(served):
    """Penalized greedy requests (positive and negative penalties), batched beside an unpenalized one, each equal to
    greedy decoding with OpenAI's formula applied to transformers' logits; the next request in a row starts its counts
    anew. Without the penalties the replies differ (the random model repeats itself), so the penalties are applied."""
    service, lm = served
    cases = [(PROMPT, 1.5, 0.0), ([40, 41, 42], 0.0, 0.8), (PROMPT, -0.5, 1.2), ([7, 8], 0.0, 0.0)]
    bodies = [{"prompt": words(p), "max_tokens": 16, "temperature": 0, "presence_penalty": pp, "frequency_penalty": fp}
              for p, pp, fp in cases]
    want = [penalized_greedy(lm, prompt, 16, pp, fp) for prompt, pp, fp in cases]
    for round_ in range(2):  # the second round reuses the rows the first one left
        answers = post(service, "/v1/completions", *bodies) if round_ == 0 else \
            post(service, "/v1/completions", *(dict(b, stream=True) for b in bodies))
        for case, tokens, answer in zip(cases, want, answers):
            text = answer.json()["choices"][0]["text"] if round_ == 0 else \
                "".join(p["choices"][0]["text"] for p in chunks(answer))
            assert text == words([t for t in tokens if t != EOS]), (case, round_)
    for (prompt, pp, fp), tokens in zip(cases[:3], want):
        assert tokens != penalized_greedy(lm, prompt, 16, 0.0, 0.0), (pp, fp)


def test_n_choices_each_a_row_whole_and_streamed(served):
    """n=3 greedy: three equal choices; n=2 sampled with a seed: choice i is the n=1 reply with seed + i; streamed
    choices reassemble to the whole ones; usage counts the prompt once and every choice's tokens; n > rows is refused."""
    service, _ = served
    greedy = {"prompt": words(PROMPT), "max_tokens": 6, "temperature": 0, "n": 3}
    hot = {"prompt": words(PROMPT), "max_tokens": 6, "temperature": 1.2, "seed": 5, "n": 2, "logprobs": 1}
    many, sampled, one_5, one_6, streamed = post(service, "/v1/completions", greedy, hot, dict(hot, n=1),
                                                 dict(hot, n=1, seed=6), dict(hot, stream=True))
    choices = many.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and len({c["text"] for c in choices}) == 1
    alone = post(service, "/v1/completions", dict(greedy, n=1))[0].json()
    assert choices[0]["text"] == alone["choices"][0]["text"]
    assert many.json()["usage"]["prompt_tokens"] == 4
    assert many.json()["usage"]["completion_tokens"] == 3 * alone["usage"]["completion_tokens"]
    pair = sampled.json()["choices"]
    assert [c["text"] for c in pair] == [one_5.json()["choices"][0]["text"], one_6.json()["choices"][0]["text"]]
    assert pair[0]["text"] != pair[1]["text"] and pair[1]["logprobs"]["tokens"] == one_6.json()["choices"][0]["logprobs"]["tokens"]
    parts = chunks(streamed)
    for c in pair:
        assert "".join(p["choices"][0]["text"] for p in parts if p["choices"][0]["index"] == c["index"]) == c["text"]
    assert sorted(p["choices"][0]["index"] for p in parts if p["choices"][0]["finish_reason"]) == [0, 1]
    chat = post(service, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "n": 2,
                                                  "stream": True, "stream_options": {"include_usage": True}})[0]
    parts = chunks(chat)
    assert [p["choices"][0]["delta"].get("role") for p in parts[:2]] == ["assistant", "assistant"]
    texts = ["".join(p["choices"][0]["delta"].get("content", "") for p in parts if p["choices"] and p["choices"][0]["index"] == i)
             for i in range(2)]
    assert texts[0] == texts[1] and parts[-1]["usage"]["completion_tokens"] == 2 * len(texts[0].split())
    refused = post(service, "/v1/completions", dict(greedy, n=ROWS + 1))[0]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    assert f"'n' must be at most {ROWS}" in refused.json()["error"]["message"]


def test_echo_puts_the_prompt_before_the_completion(served):
    service, _ = served
    body = {"prompt": words(PROMPT), "max_tokens": 5, "temperature": 0}
    plain, echoed, streamed, ids = post(service, "/v1/completions", body, dict(body, echo=True),
                                        dict(body, echo=True, stream=True), dict(body, echo=True, prompt=PROMPT))
    completion = plain.json()["choices"][0]["text"]
    assert echoed.json()["choices"][0]["text"] == words(PROMPT) + completion
    assert "".join(p["choices"][0]["text"] for p in chunks(streamed)) == words(PROMPT) + completion
    assert ids.json()["choices"][0]["text"] == words(PROMPT) + completion  # token ids: the prompt decoded


def test_bad_values_of_the_new_fields_are_refused_naming_them(served):
    service, _ = served
    cases = [
        ("/v1/completions", {"prompt": "w5", "echo": True, "logprobs": 2}, "logprobs", "'echo' together with 'logprobs'"),
        ("/v1/completions", {"prompt": "w5", "logprobs": 6}, "logprobs", "an integer in [0, 5]"),
        ("/v1/completions", {"prompt": "w5", "logprobs": True}, "logprobs", "an integer in [0, 5]"),
        ("/v1/completions", {"prompt": "w5", "top_logprobs": 2}, "top_logprobs", "takes 'logprobs': N"),
        ("/v1/completions", {"prompt": "w5", "n": 0}, "n", "an integer >= 1"),
        ("/v1/completions", {"prompt": "w5", "n": 2, "best_of": 3}, "best_of", "'best_of' must be 1 or 'n'"),
        ("/v1/completions", {"prompt": "w5", "presence_penalty": 2.5}, "presence_penalty", "a number in [-2, 2]"),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
         "an integer in [0, 20]"),
        ("/v1/chat/completions", {"messages": MESSAGES, "echo": True}, "echo", "a /v1/completions field"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}, "messages",
         "reads text only: image_url parts need a vision-language artifact"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages",
         "a list of text and image_url parts"),
    ]
    answers = post(service, cases[0][0], *(body for path, body, _, _ in cases if path == "/v1/completions"))
    answers += post(service, "/v1/chat/completions", *(body for path, body, _, _ in cases if path != "/v1/completions"))
    for (_, body, param, message), answer in zip(cases, answers):
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (400, param) and message in error["message"], (body, error)


def test_the_openai_client_reads_every_new_field(served):
    """The `openai` package's own types over the replies (its field names are OpenAI's): chat logprobs whole and
    streamed, legacy completion logprobs, n choices."""
    from openai import AsyncOpenAI

    service, _ = served

    async def run():
        app = create_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served/v1", timeout=120) as h:
            client = AsyncOpenAI(base_url="http://served/v1", api_key="unused", http_client=h, max_retries=0)
            chat = await client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=4, temperature=0,
                                                        logprobs=True, top_logprobs=2, n=2)
            stream = await client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=4, temperature=0,
                                                          logprobs=True, top_logprobs=2, stream=True)
            streamed = [chunk async for chunk in stream]
            legacy = await client.completions.create(model="llm", prompt=words(PROMPT), max_tokens=4, temperature=0,
                                                     logprobs=2, presence_penalty=0.5, frequency_penalty=0.5)
            return chat, streamed, legacy

    chat, streamed, legacy = asyncio.run(run())
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content == chat.choices[1].message.content
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens // 2 and all(len(e.top_logprobs) == 2 for e in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    assert [e.token for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content] == \
        [e.token for e in content]
    found = legacy.choices[0].logprobs
    assert len(found.tokens) == len(found.token_logprobs) == len(found.top_logprobs) == len(found.text_offset) == 4
    assert "".join(found.tokens) == legacy.choices[0].text
