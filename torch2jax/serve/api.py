"""An OpenAI-compatible HTTP API over the continuous-batching scheduler (Starlette; run by `torch2jax serve`).

    POST /v1/completions, /v1/chat/completions   (stream=true: server-sent events, `data: {json}` then `data: [DONE]`)
    GET  /v1/models, /health, /metrics            (/metrics: Prometheus text)

A request is checked before it queues and refused with OpenAI's error body ({"error": {"message", "type",
"param", "code"}}): 400 for a malformed body or bad values, 404 for an unknown model, 429 (Retry-After)
when every row is busy and the queue is full. A client that goes away mid-reply frees its row. The web
layer only translates: tokens, stop strings and rows are the scheduler's (serve/scheduler.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputSpecError, Torch2JaxError
from ..generate.text import ChatTemplate, TextStream
from .engine import Sampling
from .metrics import Metrics
from .scheduler import Event, QueueFull, Request, Scheduler

MAX_STOP = 4  # stop strings per request, as OpenAI allows
RETRY_AFTER_S = 1


class ApiError(Exception):
    """A request the API refuses, as OpenAI words it."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Service:
    """What the endpoints serve: one model's scheduler, tokenizer and chat template."""

    model_name: str
    scheduler: Scheduler
    tokenizer: Any
    chat_template: ChatTemplate | None
    metrics: Metrics
    created: int = 0

    @property
    def max_cache_len(self) -> int:
        return self.scheduler.engine.max_len


# -- reading a request body ------------------------------------------------------------------------
class Body:
    """A JSON object's fields, read with OpenAI's names and errors that name the field."""

    def __init__(self, data: Any):
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        self.data = data

    def get(self, name: str, kinds: tuple[type, ...], default: Any = None, rule: str = "") -> Any:
        value = self.data.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__.replace("str", "string").replace("int", "integer").replace("float", "number")
                                for k in kinds)
            raise ApiError(400, f"'{name}' must be {rule or names}, got {json.dumps(value)[:80]}", name)
        return value

    def number(self, name: str, default: float | None, low: float, high: float, rule: str) -> float | None:
        value = self.get(name, (int, float), default, rule)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise ApiError(400, f"'{name}' must be {rule}, got {value}", name)
        return value

    def integer(self, name: str, default: int | None, low: int, rule: str) -> int | None:
        value = self.get(name, (int,), default, rule)
        if value is not None and value < low:
            raise ApiError(400, f"'{name}' must be {rule}, got {value}", name)
        return value


def sampling_of(body: Body) -> Sampling:
    """OpenAI's sampling fields (temperature 0 = greedy; top_k is an extension, 0 = off)."""
    temperature = body.number("temperature", 1.0, 0.0, 2.0, "a number in [0, 2]")
    top_p = body.number("top_p", 1.0, 0.0, 1.0, "a number in (0, 1]")
    if top_p == 0:
        raise ApiError(400, "'top_p' must be a number in (0, 1], got 0", "top_p")
    top_k = body.integer("top_k", 0, 0, "an integer >= 0 (0 turns top-k off)")
    seed = body.get("seed", (int,), None, "an integer")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    try:
        return Sampling(float(temperature), int(top_k), float(top_p), seed)
    except Torch2JaxError as err:
        raise ApiError(400, str(err), "temperature") from None


def common(body: Body, service: Service) -> tuple:
    """Checks both endpoints share: model, n, stop, stream; returns (stop strings, stream, include_usage)."""
    model = body.get("model", (str,), service.model_name)
    if model != service.model_name:
        raise ApiError(404, f"The model '{model}' does not exist (this server serves '{service.model_name}')", "model",
                       "model_not_found")
    if body.get("n", (int,), 1) != 1:
        raise ApiError(400, "only n=1 is supported: send one request per completion", "n")
    for name in ("logprobs", "echo", "suffix", "tools", "functions", "response_format"):
        if body.data.get(name) not in (None, False, {"type": "text"}):
            raise ApiError(400, f"'{name}' is not supported by this server", name)
    if body.get("best_of", (int,), 1) != 1:
        raise ApiError(400, "only best_of=1 is supported", "best_of")
    stop = body.get("stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP} strings", "stop")
    stream = body.get("stream", (bool,), False)
    options = body.get("stream_options", (dict,), {})
    return stop, stream, bool(options.get("include_usage", False))


def max_tokens_of(body: Body, prompt: list[int], service: Service, default: int | None) -> int:
    """max_tokens (chat also takes max_completion_tokens); chat's default is what the cache has left."""
    value = body.integer("max_tokens", None, 1, "an integer >= 1")
    if value is None:
        value = body.integer("max_completion_tokens", None, 1, "an integer >= 1")
    if value is None:
        value = default if default is not None else max(service.max_cache_len - len(prompt), 1)
    return value


# -- the app ---------------------------------------------------------------------------------------
def create_app(service: Service, on_shutdown: Callable[[], None] | None = None) -> Any:
    """The Starlette application; the scheduler's loop runs from startup to shutdown."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    class EventStream(StreamingResponse):
        """Server-sent events; `on_close` runs however the stream ends (a client that left included)."""

        def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
            super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            self.on_close = on_close

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.on_close()

    def error_response(err: ApiError, endpoint: str) -> JSONResponse:
        service.metrics.request(endpoint, err.status)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 429 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    async def read_body(http: HttpRequest) -> Body:
        try:
            return Body(json.loads(await http.body()))
        except (ValueError, UnicodeDecodeError) as err:
            raise ApiError(400, f"the request body is not valid JSON: {err}") from None

    def submit(prompt: list[int], body: Body, stop: list[str], max_tokens: int) -> tuple[Request, asyncio.Queue]:
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        ignore_eos = body.get("ignore_eos", (bool,), False)  # an extension (as vLLM has it): run to max_tokens
        request = Request(prompt, max_tokens, lambda e: loop.call_soon_threadsafe(events.put_nowait, e), sampling_of(body),
                          TextStream(service.tokenizer, stop), end_tokens=() if ignore_eos else None)
        try:
            service.scheduler.submit(request)
        except QueueFull as err:
            raise ApiError(429, f"the server is busy ({err}): retry after {RETRY_AFTER_S}s", None, "queue_full",
                           "rate_limit_error") from None
        except InputSpecError as err:  # the prompt's fault unless it would fit with fewer tokens asked for
            fewer = "max_tokens=" in str(err) and len(prompt) < service.max_cache_len
            raise ApiError(400, str(err), "max_tokens" if fewer else "prompt") from None
        return request, events

    async def complete(http: HttpRequest, endpoint: str, chat: bool) -> Response:
        started = int(time.time())
        try:
            body = await read_body(http)
            stop, stream, include_usage = common(body, service)
            prompt = chat_prompt(body) if chat else completion_prompt(body)
            max_tokens = max_tokens_of(body, prompt, service, None if chat else 16)
            request, events = submit(prompt, body, stop, max_tokens)
        except ApiError as err:
            return error_response(err, endpoint)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        shape = ChatShape(ident, started, service.model_name) if chat else CompletionShape(ident, started, service.model_name)
        service.metrics.request(endpoint, 200)
        if stream:
            return EventStream(sse(events, shape, include_usage), request.cancel)
        text, last = [], None
        try:
            while last is None:
                try:
                    event = await asyncio.wait_for(events.get(), 1.0)
                except asyncio.TimeoutError:
                    if await http.is_disconnected():
                        return Response(status_code=499)
                    continue
                text.append(event.text)
                last = event if event.finish_reason else None
        finally:
            request.cancel()  # a no-op once it has ended; frees the row when the client left
        if last.finish_reason == "error":
            return JSONResponse(ApiError(500, f"generation failed: {last.error}", kind="server_error").body(), status_code=500)
        return JSONResponse(shape.whole("".join(text), last))

    def completion_prompt(body: Body) -> list[int]:
        prompt = body.get("prompt", (str, list), None)
        if prompt is None:
            raise ApiError(400, "'prompt' is required", "prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return service.tokenizer.encode(prompt).ids
        if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise ApiError(400, "'prompt' must be a string, a list of token ids, or a list of one of them (batches of "
                            "several prompts: send one request each)", "prompt")

    def chat_prompt(body: Body) -> list[int]:
        if service.chat_template is None:
            raise ApiError(400, f"'{service.model_name}' has no chat template (tokenizer_config.json has no chat_template; "
                                "start the server with --chat-template FILE), use /v1/completions", "messages")
        messages = body.get("messages", (list,), None)
        if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ApiError(400, "'messages' must be a non-empty list of objects with a 'role'", "messages")
        messages = [dict(m, content=flat_content(m.get("content"))) for m in messages]
        try:
            text = service.chat_template.render(messages, add_generation_prompt=True)
        except InputSpecError as err:
            raise ApiError(400, str(err), "messages") from None
        return service.tokenizer.encode(text, add_special_tokens=False).ids

    async def completions(http: HttpRequest) -> Response:
        return await complete(http, "/v1/completions", chat=False)

    async def chat_completions(http: HttpRequest) -> Response:
        return await complete(http, "/v1/chat/completions", chat=True)

    async def models(http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "torch2jax"}]})

    async def health(http: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", "model": service.model_name, **service.scheduler.stats(),
                             "torch_imported": "torch" in sys.modules})

    async def metrics(http: HttpRequest) -> Response:
        data, content_type = service.metrics.render()
        return Response(data, media_type=content_type)

    async def not_found(http: HttpRequest, exc: Exception) -> Response:
        return JSONResponse(ApiError(404, f"no route {http.url.path}", code="not_found").body(), status_code=404)

    async def not_allowed(http: HttpRequest, exc: Exception) -> Response:
        return JSONResponse(ApiError(405, f"{http.method} is not allowed on {http.url.path}").body(), status_code=405)

    async def server_error(http: HttpRequest, exc: Exception) -> Response:
        return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error").body(),
                            status_code=500)

    @asynccontextmanager
    async def lifespan(app):
        service.scheduler.start()
        try:
            yield
        finally:
            service.scheduler.stop()
            if on_shutdown is not None:
                on_shutdown()

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_allowed, Exception: server_error})


def flat_content(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    if content is None:
        return ""
    raise ApiError(400, "a message's 'content' must be a string or a list of text parts (this model reads text only)",
                   "messages")


async def sse(events: asyncio.Queue, shape: Any, include_usage: bool) -> AsyncIterator[str]:
    """`data: {chunk}` per event, then the usage chunk when asked for, then `data: [DONE]`."""
    for chunk in shape.opening():
        yield f"data: {json.dumps(chunk)}\n\n"
    while True:
        event: Event = await events.get()
        if event.finish_reason == "error":
            yield f"data: {json.dumps(ApiError(500, f'generation failed: {event.error}', kind='server_error').body())}\n\n"
            break
        if event.text or event.finish_reason:
            yield f"data: {json.dumps(shape.chunk(event.text, event.finish_reason))}\n\n"
        if event.finish_reason:
            if include_usage:
                yield f"data: {json.dumps(dict(shape.chunk('', None), choices=[], usage=usage(event)))}\n\n"
            break
    yield "data: [DONE]\n\n"


def usage(event: Event) -> dict:
    return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens}


@dataclass
class CompletionShape:
    """/v1/completions' response and chunks."""

    id: str
    created: int
    model: str

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def opening(self) -> list[dict]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        return {**self.head("text_completion"), "choices": [{"index": 0, "text": text, "logprobs": None,
                                                               "finish_reason": finish_reason}]}

    def whole(self, text: str, last: Event) -> dict:
        return {**self.chunk(text, last.finish_reason), "usage": usage(last)}


class ChatShape(CompletionShape):
    """/v1/chat/completions' response and chunks (the first chunk carries the role)."""

    def opening(self) -> list[dict]:
        return [{**self.head("chat.completion.chunk"), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                                    "logprobs": None, "finish_reason": None}]}]

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        delta = {"content": text} if text else {}
        return {**self.head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                    "finish_reason": finish_reason}]}

    def whole(self, text: str, last: Event) -> dict:
        return {**self.head("chat.completion"), "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                             "logprobs": None, "finish_reason": last.finish_reason}],
                "usage": usage(last)}


def build_service(artifact_dir: str | os.PathLike, *, max_batch: int | None = None, max_queue: int = 64, chunk: int = 256,
                  model_name: str | None = None, chat_template: str | os.PathLike | None = None, warm_up: str = "all",
                  progress: Callable[[int, int], None] | None = None, decode_block: int = 16) -> Service:
    """What `torch2jax serve` serves: the artifact loaded, what the server cannot serve refused (with the reason), its
    scheduler over `max_batch` rows (default: the artifact's), and its steps compiled before the first client: at
    every shape a request can need (`warm_up="all"`, reporting `progress(done, total)`), or a short prompt's only
    (`"short"`: a quicker start, and compilations later while clients wait). `decode_block`: decode steps per call
    while no request waits (serve/engine.py)."""
    from ..generate.artifacts import load
    from ..generate.generator import Generator
    from ..generate.seq2seq import Seq2SeqGenerator
    from ..generate.vision_language import VisionLanguageGenerator
    from .engine import BatchEngine

    if warm_up not in ("all", "short"):
        raise InputSpecError(f"warm_up must be 'all' or 'short', got {warm_up!r}")
    g = load(artifact_dir)
    if isinstance(g, Seq2SeqGenerator):
        raise InputSpecError(f"{artifact_dir} is an encoder-decoder (text2text-generation): `torch2jax serve` batches causal "
                             "LMs only, whose steps share one KV cache layout (see docs/limitations.md); use "
                             "Seq2SeqGenerator.generate in Python")
    if isinstance(g, VisionLanguageGenerator):
        raise InputSpecError(f"{artifact_dir} is a vision-language model (image-text-to-text): `torch2jax serve` does not "
                             "take images yet (see docs/limitations.md); use `torch2jax generate --image` or "
                             "VisionLanguageGenerator.generate in Python")
    if not isinstance(g, Generator):
        raise InputSpecError(f"{artifact_dir} is not a text-generation artifact (convert hf:DIR --task text-generation)")
    if "tokenizer.json" not in g.tokenizer_files:
        raise InputSpecError(f"{artifact_dir} has no tokenizer (its model directory had no tokenizer.json): the server "
                             "reads and writes text, so it needs one")
    rows = max_batch or g.spec.max_batch
    engine = BatchEngine(g, rows, chunk, decode_block)
    metrics = Metrics(rows)
    scheduler = Scheduler(engine, max_queue=max_queue)
    template = ChatTemplate.from_files(g.tokenizer_files.get("tokenizer_config.json"),
                                       Path(chat_template) if chat_template else None)
    if warm_up == "all":
        engine.compile_steps(progress)
    else:
        warm_up_short(scheduler)
    scheduler.metrics = metrics  # counted from the first client on
    name = model_name or Path(artifact_dir).resolve().name
    return Service(name, scheduler, g.tokenizer, template, metrics, created=int(time.time()))


def warm_up_short(scheduler: Scheduler) -> None:
    """Compile the prefill of a short prompt and the first decode step before the first client waits on them."""
    done = []
    scheduler.submit(Request([scheduler.engine.g.spec.pad_token_id], 2, lambda e: e.finish_reason and done.append(e),
                             end_tokens=()))
    for _ in range(8):
        if done:
            break
        scheduler.step()
    scheduler.max_rows_held = scheduler.steps = 0
