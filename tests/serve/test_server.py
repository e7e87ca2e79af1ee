"""`torch2jax serve` end to end: the real openai client against a server on 127.0.0.1 (a subprocess where importing
torch fails), every answer compared with Generator.generate on the same artifact, token for token."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import torch2jax

from ..generate.lms import EOS, write_lm, write_tokenizer
from ..helpers import CLI, ROOT, cli

CACHE, ROWS = 96, 4
TEMPLATE = ("{{ bos_token }} {% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{{ 'w10' if m['role'] == 'user' else 'w11' }} "
            "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w12{% endif %}")
START_S, REQUEST_S = 180, 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `torch2jax serve` process on a free loopback port, ready once /health answers 200 (it answers 503 while its
    steps compile: those answers are kept in `warming`)."""

    def __init__(self, command: list[str], artifact: Path, log: Path, *options: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.warming: list[dict] = []
        # a cache of compiled steps of its own: one shared with other runs would make a test's timing depend on them
        env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(log.parent / "cache"))
        self.process = subprocess.Popen([*command, "serve", str(artifact), "--port", str(self.port), *options], cwd=ROOT,
                                        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the server exited: {log.read_text()[-3000:]}"
            try:
                answer = httpx.get(f"{self.url}/health", timeout=2)
                if answer.status_code == 200:
                    return
                self.warming.append(answer.json())
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"the server did not answer within {START_S}s: {log.read_text()[-3000:]}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def post(self, path: str, body: dict | bytes) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.url}{path}", content=content, headers={"Content-Type": "application/json"}, timeout=REQUEST_S)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A tiny random-weight Llama with a word-level tokenizer (w3 ... w127) and a chat template, converted once."""
    root = tmp_path_factory.mktemp("serve")
    source = write_lm("llama", root)
    write_tokenizer(source)
    (source / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}))
    return torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS), root / "llm")


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    """The server under test, run where `import torch` fails (so it provably needs no torch). One decode step per
    call, so that a stream lasts long enough for a client to leave in the middle of it; the console-script server of
    test_full_queue_gets_429_and_sigterm_drains_then_exits_0 decodes in blocks (the default)."""
    command = [sys.executable, str(ROOT / "scripts" / "without_torch.py"), "-c", "from torch2jax.cli.main import main; main()"]
    s = Server(command, artifact, tmp_path_factory.mktemp("log") / "server.log", "--max-batch", str(ROWS), "--max-queue", "32",
               "--chunk", "16", "--decode-block", "1")
    yield s
    assert s.stop() == 0, s.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def reference(artifact):
    """What the artifact generates for one prompt alone (greedy, up to its end token), as token ids."""
    g = torch2jax.load(artifact)

    def alone(prompt: list[int], max_tokens: int) -> list[int]:
        new = g.generate(np.array([prompt]), max_new_tokens=max_tokens)[0, len(prompt):].tolist()
        return new[: new.index(EOS) + 1] if EOS in new else new

    alone.g = g
    return alone


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=REQUEST_S, max_retries=0)


def words(ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in ids)


def text_of(g, ids: list[int]) -> str:
    return g.tokenizer.decode([t for t in ids if t != EOS], skip_special_tokens=True)


def test_the_server_listens_while_it_warms_up(server):
    """`torch2jax serve` listens before its steps are compiled (a fresh compilation cache: the warm-up takes seconds):
    /health answered 503 with the warm-up's progress, then 200 with every call done."""
    assert server.warming, "the server answered only once warmed up"
    assert {w["status"] for w in server.warming} == {"warming up"} and all(w["model"] == "llm" for w in server.warming)
    assert [w["compiled"] for w in server.warming] == sorted(w["compiled"] for w in server.warming)
    health = server.health()
    assert health["status"] == "ok" and health["compiled"] == health["total"] > max(w["compiled"] for w in server.warming)


def test_completion_and_chat_at_temperature_0_equal_generate(client, reference):
    prompt = [5, 9, 33, 17]
    want = reference(prompt, 24)
    got = client.completions.create(model="llm", prompt=words(prompt), max_tokens=24, temperature=0)
    assert got.choices[0].text == text_of(reference.g, want)
    assert got.usage.prompt_tokens == 4 and got.usage.completion_tokens == len(want)
    assert got.choices[0].finish_reason == ("stop" if EOS in want else "length")

    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "system", "content": "w40 w41"}, {"role": "user", "content": "w42"}]
    rendered, _ = render_jinja_template([messages], chat_template=TEMPLATE, add_generation_prompt=True, bos_token="<s>",
                                        eos_token="</s>")
    chat = reference.g.tokenizer.encode(rendered[0], add_special_tokens=False).ids
    assert chat == [1, 11, 40, 41, 10, 42, 12]  # <s> w11 system w10 user w12
    want = reference(chat, 20)
    got = client.chat.completions.create(model="llm", max_tokens=20, temperature=0, messages=messages)
    assert got.choices[0].message.content == text_of(reference.g, want) and got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == len(chat) and got.usage.completion_tokens == len(want)


def test_streamed_chunks_concatenate_to_the_whole_reply(client):
    options = dict(model="llm", prompt="w8 w9", max_tokens=30, temperature=0.9, seed=7, extra_body={"top_k": 20})
    whole = client.completions.create(**options)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **options))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens and chunks[-2].choices[0].finish_reason
    messages = [{"role": "user", "content": "w50 w51"}]
    whole = client.chat.completions.create(model="llm", messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model="llm", messages=messages, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content


def test_stop_strings_end_the_reply_before_them(client, reference):
    prompt = [5, 9, 33, 17]
    text = text_of(reference.g, reference(prompt, 24))
    stop = text.split(" ")[3]  # the fourth word
    got = client.completions.create(model="llm", prompt=words(prompt), max_tokens=24, temperature=0, stop=[stop, "zzz"])
    assert got.choices[0].finish_reason == "stop" and got.choices[0].text == text[: text.index(stop)]


def test_16_concurrent_requests_each_equal_generate_alone(client, server, reference):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 128, int(n)).tolist() for n in rng.integers(1, 40, 16)]
    limits = [int(m) for m in rng.integers(1, 48, 16)]
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        answers[i] = client.completions.create(model="llm", prompt=prompts[i], max_tokens=limits[i], temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_S)
    assert sorted(answers) == list(range(16))
    for i in range(16):
        assert answers[i] == text_of(reference.g, reference(prompts[i], limits[i])), i
    health = server.health()
    assert health["max_rows_held"] == ROWS and health["rows_held"] == 0
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f"torch2jax_batch_rows_held_max {float(ROWS)}" in metrics and "torch2jax_time_to_first_token_seconds_count" in metrics


def test_a_shared_prefix_is_served_from_the_prefix_cache_with_the_same_reply(client, server, reference):
    """Two prompts starting with the same 48 tokens (three 16-token blocks): the second copies what the first computed
    (padded to 64 slots from slot 11, it runs the last 16-token chunk only: 48 - 11 = 37 tokens not computed) and replies
    what the artifact generates for it alone; the counters say so."""
    rng = np.random.default_rng(48)
    shared = rng.integers(3, 128, 48).tolist()
    prompts = [shared + rng.integers(3, 128, 4).tolist(), shared + rng.integers(3, 128, 5).tolist()]
    replies = [client.completions.create(model="llm", prompt=words(p), max_tokens=8, temperature=0) for p in prompts]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in replies] == [0, 37]
    for prompt, reply in zip(prompts, replies):
        assert reply.choices[0].text == text_of(reference.g, reference(prompt, 8))
    counters = server.health()["prefix_cache"]
    assert counters["hit_tokens"] >= 37 and counters["blocks_used"] >= 3
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "torch2jax_prefix_cache_hits_total" in metrics and "torch2jax_prefix_cache_queries_total" in metrics


def test_a_request_arriving_mid_reply_gets_its_first_token_before_the_long_one_ends(client, reference):
    assert EOS not in reference([5, 6], 90), "the long reply must not end early"
    times: dict[str, float] = {}

    def long() -> None:
        for _chunk in client.completions.create(model="llm", prompt="w5 w6", max_tokens=90, temperature=0, stream=True):
            times.setdefault("long_first", time.monotonic())
        times["long_end"] = time.monotonic()

    thread = threading.Thread(target=long)
    thread.start()
    deadline = time.monotonic() + REQUEST_S
    while "long_first" not in times and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in client.completions.create(model="llm", prompt="w6 w7", max_tokens=3, temperature=0, stream=True):
        times.setdefault("short_first", time.monotonic())
    thread.join(REQUEST_S)
    assert times["long_first"] < times["short_first"] < times["long_end"]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client):
    cases = [
        ({"model": "llm", "prompt": "w5 " * 100, "max_tokens": 10}, 400, "prompt", "more than this model's max_cache_len (96)"),
        ({"model": "llm", "prompt": "w5 " * 90, "max_tokens": 10}, 400, "max_tokens", "needs 100 cache slots"),
        ({"model": "gpt-4", "prompt": "w5"}, 404, "model", "The model 'gpt-4' does not exist"),
        ({"model": "llm", "prompt": "w5", "temperature": 3}, 400, "temperature", "must be a number in [0, 2]"),
        ({"model": "llm", "prompt": "w5", "top_p": 0}, 400, "top_p", "(0, 1]"),
        ({"model": "llm", "prompt": "w5", "top_k": -2}, 400, "top_k", "an integer >= 0"),
        ({"model": "llm", "prompt": "w5", "max_tokens": 0}, 400, "max_tokens", "an integer >= 1"),
        ({"model": "llm", "prompt": "w5", "n": 5}, 400, "n", "'n' must be at most 4"),
        ({"model": "llm", "prompt": [5, 900]}, 400, "prompt", "outside the vocabulary"),
        ({"model": "llm", "prompt": "w5", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
        ({"model": "llm", "prompt": "w5", "max_tokens": "many"}, 400, "max_tokens", "an integer >= 1"),
        ({"model": "llm", "prompt": "w5", "presence_penalty": 3.5}, 400, "presence_penalty", "a number in [-2, 2]"),
        ({"model": "llm", "prompt": "w5", "frequency_penalty": -2.5}, 400, "frequency_penalty", "a number in [-2, 2]"),
        ({"model": "llm", "prompt": "w5", "echo": True, "logprobs": 1}, 400, "logprobs", "'echo' together with 'logprobs'"),
        ({"model": "llm", "prompt": "w5", "top_logprobs": 2}, 400, "top_logprobs", "takes 'logprobs': N"),
    ]
    for body, status, param, message in cases:
        answer = server.post("/v1/completions", body)
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (status, param) and message in error["message"], (body, answer.text)
        assert set(error) == {"message", "type", "param", "code"}
    chat = server.post("/v1/chat/completions", {"model": "llm", "messages": [{"role": "tool", "content": "w5"}]})
    assert chat.status_code == 400 and "unknown role tool" in chat.json()["error"]["message"]
    for bad in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        answer = server.post("/v1/completions", bad)
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client.completions.create(model="other", prompt="w5", max_tokens=2)
    assert client.completions.create(model="llm", prompt="w5", max_tokens=2, temperature=0).usage.completion_tokens == 2
    models = client.models.list()
    assert [m.id for m in models.data] == ["llm"]


def test_a_client_leaving_mid_stream_frees_its_row(server):
    body = {"model": "llm", "prompt": "w5 w6", "max_tokens": 90, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=REQUEST_S) as answer:
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert server.health()["rows_held"] == 1
    deadline = time.monotonic() + 20
    while server.health()["rows_held"] and time.monotonic() < deadline:
        time.sleep(0.05)
    health = server.health()
    assert health["rows_held"] == 0 and health["torch_imported"] is False


def test_full_queue_gets_429_and_sigterm_drains_then_exits_0(artifact, reference, tmp_path):
    """One row, one queue place, run by the console script: a third request is refused with Retry-After; on
    SIGTERM the two in flight still finish whole, and the process exits 0. With `--warm-up short` the first
    request's later decode steps compile while it runs (no compilation cache), which keeps its row busy long after the
    others arrive."""
    s = Server([CLI], artifact, tmp_path / "server.log", "--max-batch", "1", "--max-queue", "1", "--drain-timeout", "60",
               "--warm-up", "short", "--no-compilation-cache")
    results: dict[int, httpx.Response] = {}

    def ask(i: int) -> None:
        results[i] = s.post("/v1/completions", {"model": "llm", "prompt": "w5 w6", "max_tokens": 80, "temperature": 0})

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for i, t in enumerate(threads):
            t.start()
            deadline = time.monotonic() + 20
            while s.health()["rows_held"] + s.health()["queue_depth"] < i + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        refused = s.post("/v1/completions", {"model": "llm", "prompt": "w5", "max_tokens": 2})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        s.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(REQUEST_S)
        assert s.process.wait(timeout=60) == 0, s.log.read_text()[-3000:]
    finally:
        s.stop()
    want = text_of(reference.g, reference([5, 6], 80))
    assert [results[i].json()["choices"][0]["text"] for i in range(2)] == [want, want]
    assert "draining" in s.log.read_text()


def test_serve_refuses_what_it_cannot_serve_at_startup(artifact, tmp_path):
    from ..generate.seq2seqs import write_seq2seq

    source = write_seq2seq("t5", tmp_path)
    write_tokenizer(source)
    t5 = torch2jax.save(torch2jax.convert_hf(f"hf:{source}", max_cache_len=16, max_batch=1, max_source_len=16),
                        tmp_path / "t5-artifact")
    refused = cli("serve", str(t5), "--max-prefill-tokens", "32", "--port", str(free_port()))
    assert refused.returncode == 2 and "is an encoder-decoder (text2text-generation)" in refused.stderr
    assert "--max-prefill-tokens does not apply" in refused.stderr and "Traceback" not in refused.stderr
    too_wide = cli("serve", str(artifact), "--max-batch", "9", "--port", str(free_port()))
    assert too_wide.returncode == 2 and "this artifact was converted for batches of 1 to 4" in too_wide.stderr


def _within(seconds: float, call, *args, **kwargs):
    """call(*args, **kwargs), failing after `seconds` instead of waiting on a loop thread that died."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=call(*args, **kwargs)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert "result" in box, f"no answer within {seconds} s (the baseline's loop thread died?)"
    return box["result"]


def test_the_serving_benchmarks_static_baseline_answers_as_generate_does(artifact):
    """benchmarks/serve.py's static baseline behind this HTTP layer takes what the layer hands a scheduler (a client
    request's choices as one list) and answers as the artifact generates; the benchmark's table lost its baseline row
    for a session when it did not (its loop thread died, every request waited)."""
    from starlette.testclient import TestClient

    from benchmarks.serve import StaticBatcher
    from torch2jax.serve.api import Service, create_app
    from torch2jax.serve.metrics import Metrics

    g = torch2jax.load(artifact)
    service = Service("llm", StaticBatcher(g, ROWS), g.tokenizer, None, Metrics(ROWS))
    prompts = [[5, 9, 17, 33], [40, 41]]
    client = TestClient(create_app(service))
    client.__enter__()  # left open when an answer never comes: closing would wait on it
    for prompt in prompts:
        answer = _within(60, client.post, "/v1/completions", json={
            "model": "llm", "prompt": words(prompt), "max_tokens": 6, "temperature": 0, "ignore_eos": True, "n": 2})
        assert answer.status_code == 200, answer.text
        want = g.generate(np.array([prompt]), max_new_tokens=6, eos_token_id=[])[0, len(prompt):].tolist()
        texts = [choice["text"] for choice in answer.json()["choices"]]
        assert texts == [g.tokenizer.decode(want)] * 2
    client.__exit__(None, None, None)
