"""The HTTP endpoints, each a small handler over the Service its app holds (`app.state.service`):

    POST /v1/completions, /v1/chat/completions   parse (protocol.py), queue on the scheduler, answer whole or as
                                                 server-sent events (`data: {json}` then `data: [DONE]`)
    GET  /v1/models, /health, /metrics

and the routing errors (404, 405, 500), all in OpenAI's error shape. A client that goes away mid-reply frees its row.
/health answers 503 while the steps compile (the server listens during its warm-up) and 200 once they are ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import InputSpecError, Torch2JaxError
from ..generate.text import ChatTemplate, TextStream
from ..generate.vision_processor import expand_images
from .engine import BASE
from .media import read_image
from .metrics import Metrics
from .protocol import (
    ApiError,
    ChatCompletionRequest,
    ChatShape,
    Choice,
    CompletionRequest,
    CompletionShape,
    GenerationRequest,
    TokenTexts,
    finish_reason,
    image_urls,
    json_object,
    usage,
    validate,
)
from .scheduler import Event, QueueFull, Request, Scheduler
from .structured import Constraint, Grammars, StructuredOutputError
from .tools import ToolCall, ToolParser, grammar, parser, resolve, template_messages
from .warm_up import WarmingUp

RETRY_AFTER_S = 1
log = logging.getLogger("torch2jax.serve")


@dataclass
class Service(WarmingUp):
    """What the endpoints serve: one model's scheduler, tokenizer and chat template; with LoRA adapters, their names
    (clients choose one as the `model`) and directories, in the order of the engine's adapter ids."""

    model_name: str
    scheduler: Scheduler
    tokenizer: Any
    chat_template: ChatTemplate | None
    metrics: Metrics
    created: int = 0
    adapters: list[str] = field(default_factory=list)
    adapter_dirs: list[str] = field(default_factory=list)
    tool_parser: str = "auto"  # the format tool calls are read in (serve/tools.py): "auto" reads the chat template
    media_root: Path | None = None  # the directory local image paths may name (--allowed-local-media-path; None: none)
    _grammars: Grammars | None = field(default=None, repr=False)

    def serve(self) -> None:
        self.scheduler.start()

    def grammars(self) -> Grammars:
        """The grammar engine over this model's tokenizer (structured output), made on first use."""
        if self._grammars is None:
            spec = self.scheduler.engine.g.spec
            self._grammars = Grammars(self.tokenizer, spec.vocab_size, spec.eos_token_ids)
        return self._grammars

    def tool_format(self) -> str:
        """The format this model writes tool calls in: `tool_parser`, or detected from the chat template."""
        return resolve(self.tool_parser, self.chat_template.source if self.chat_template is not None else None)

    @property
    def vision(self) -> Any:
        """A vision-language artifact's VisionSpec (chat messages may hold images), else None (also for a service
        without a scheduler: rendering alone)."""
        return getattr(getattr(self.scheduler, "engine", None), "vision", None)

    @property
    def max_cache_len(self) -> int:
        return self.scheduler.engine.max_len

    @property
    def served(self) -> list[str]:
        """Every name a request's `model` may be: the base model's, then the adapters'."""
        return [self.model_name, *self.adapters]

    def adapter_of(self, model: Any) -> int:
        """The engine's adapter id for a request's `model` (absent or the base model's name: BASE), or the 404 for
        a model this server does not serve."""
        if not isinstance(model, str) or model == self.model_name:
            return BASE
        if model in self.adapters:
            return self.adapters.index(model)
        names = ", ".join(f"'{name}'" for name in self.served)
        raise ApiError(404, f"The model '{model}' does not exist (this server serves {names})", "model", "model_not_found")


async def completions(http: HttpRequest) -> Response:
    return await _complete(http, "/v1/completions", CompletionRequest)


async def chat_completions(http: HttpRequest) -> Response:
    return await _complete(http, "/v1/chat/completions", ChatCompletionRequest)


async def models(http: HttpRequest) -> Response:
    """The base model, then each adapter with the model it runs on (`parent`) and its directory (`root`), as vLLM
    lists its LoRA modules."""
    service: Service = http.app.state.service
    base = {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "torch2jax"}
    adapters = [dict(base, id=name, parent=service.model_name, root=root)
                for name, root in zip(service.adapters, service.adapter_dirs)]
    return JSONResponse({"object": "list", "data": [base, *adapters]})


async def health(http: HttpRequest) -> Response:
    """200 and the batch's counters once the compiled steps are ready; 503 while they compile ("warming up", with how
    many of the warm-up's calls are done) or when the warm-up failed."""
    service: Service = http.app.state.service
    warming = service.warming(service.model_name)
    if warming is not None:
        return JSONResponse(warming, status_code=503)
    return JSONResponse({"status": "ok", "model": service.model_name, **service.progress(), **service.scheduler.stats(),
                         "torch_imported": "torch" in sys.modules})


async def metrics(http: HttpRequest) -> Response:
    data, content_type = http.app.state.service.metrics.render()
    return Response(data, media_type=content_type)


async def not_found(http: HttpRequest, exc: Exception) -> Response:
    return JSONResponse(ApiError(404, f"no route {http.url.path}", code="not_found").body(), status_code=404)


async def not_allowed(http: HttpRequest, exc: Exception) -> Response:
    return JSONResponse(ApiError(405, f"{http.method} is not allowed on {http.url.path}").body(), status_code=405)


async def server_error(http: HttpRequest, exc: Exception) -> Response:
    return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error").body(),
                        status_code=500)


ROUTES = [Route("/v1/completions", completions, methods=["POST"]),
          Route("/v1/chat/completions", chat_completions, methods=["POST"]),
          Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]
EXCEPTION_HANDLERS = {404: not_found, 405: not_allowed, Exception: server_error}


# -- a completion, whole or streamed ---------------------------------------------------------------
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


async def _complete(http: HttpRequest, endpoint: str, kind: type[GenerationRequest]) -> Response:
    service: Service = http.app.state.service
    started = int(time.time())
    chat = kind is ChatCompletionRequest
    try:
        data = json_object(await http.body())
        adapter = service.adapter_of(data.get("model"))  # before the fields: another model's request is not ours to judge
        body = validate(data, kind)
        _check_choices(body.choices, service)
        prompt, images = await asyncio.to_thread(_chat_prompt, body, service) if chat else \
            (_completion_prompt(body, service), None)
        max_tokens = body.max_new_tokens(max(service.max_cache_len - len(prompt), 1) if chat else 16)
        constraints = await _constraints(service, body)
        requests, events = _submit(service, prompt, body, max_tokens, adapter, constraints, images)
    except ApiError as err:
        return _error_response(err, endpoint, service)
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    model = service.served[adapter + 1]  # the name the request chose (the base model's when it named none)
    shape = (ChatShape if chat else CompletionShape)(ident, started, model, body.top_logprobs_wanted)
    echo = _echo(body, prompt, service) if not chat and body.echo else ""
    service.metrics.request(endpoint, 200)
    service.metrics.model_request(model)

    def cancel() -> None:
        for request in requests:
            request.cancel()

    readers = _tool_readers(body, service) if chat else None
    if body.stream:
        return EventStream(_sse(events, shape, len(requests), echo, service.tokenizer, body.include_usage, readers),
                           cancel)
    choices = [Choice(i, TokenTexts(service.tokenizer), [echo], []) for i in range(len(requests))]
    ended = 0
    try:
        while ended < len(choices):
            try:
                index, event = await asyncio.wait_for(events.get(), 1.0)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    return Response(status_code=499)
                continue
            if event.finish_reason == "error":
                return JSONResponse(ApiError(500, f"generation failed: {event.error}", kind="server_error").body(),
                                    status_code=500)
            choice = choices[index]
            choice.text.append(event.text)
            if shape.top is not None:
                choice.entries += choice.texts.entries(event.logprobs)
            if event.finish_reason:
                choice.last, ended = event, ended + 1
    finally:
        cancel()  # a no-op once they have ended; frees the rows when the client left (or a choice failed)
    if readers is not None:
        for choice in choices:
            reader = readers()
            pieces = reader.feed("".join(choice.text)) + reader.finish()
            choice.text = [p for p in pieces if isinstance(p, str)]
            choice.calls = [p.openai() for p in pieces if isinstance(p, ToolCall)]
    return JSONResponse(shape.whole(choices))


async def _constraints(service: Service, body: GenerationRequest) -> list[Constraint] | None:
    """One grammar constraint per choice for a request with structured output (None without): built off the event loop
    (the first one reads the tokenizer, a schema may take a while to compile); a 400 naming `response_format` when the
    schema or the model's tokenizer cannot be used."""
    forced = body.forced_functions if isinstance(body, ChatCompletionRequest) else None
    if forced is not None:  # tool_choice "required" or a named function: the reply is a call, in the model's format
        # "required" may call several functions unless parallel_tool_calls is false; a named function is called once
        lark = grammar(service.tool_format(), forced, body.tool_mode == "required" and body.parallel_tool_calls is not False)
        names = ", ".join(f"'{f['name']}'" for f in forced)
        build = lambda: service.grammars().lark_constraints(lark, body.choices, f"'tools' (the call of {names})")  # noqa: E731
    elif body.structured is not None:
        build = lambda: service.grammars().constraints(body.structured, body.choices)  # noqa: E731
    else:
        return None
    try:
        return await asyncio.to_thread(build)
    except StructuredOutputError as err:
        raise ApiError(400, str(err), err.param) from None


def _check_choices(n: int, service: Service) -> None:
    """Refuse `n` choices the batch cannot hold at once (each choice is a row of its own, queued together)."""
    rows, queue = service.scheduler.engine.rows, service.scheduler.max_queue
    if n > min(rows, queue):
        limit = f"decodes {rows} rows at once" + (f" and queues {queue} requests" if queue < rows else "")
        raise ApiError(400, f"'n' must be at most {min(rows, queue)}: each choice takes a row of its own and this server "
                            f"{limit} (send several requests for more choices)", "n")


def _echo(body: CompletionRequest, prompt: list[int], service: Service) -> str:
    """The prompt's text, for `echo`: the prompt as sent, or token ids decoded (special tokens kept)."""
    return body.prompt if isinstance(body.prompt, str) else service.tokenizer.decode(prompt, skip_special_tokens=False)


def _completion_prompt(body: CompletionRequest, service: Service) -> list[int]:
    prompt = body.prompt
    return service.tokenizer.encode(prompt).ids if isinstance(prompt, str) else list(prompt)


def _chat_prompt(body: ChatCompletionRequest, service: Service) -> tuple[list[int], tuple | None]:
    """(the prompt ids of a chat request, its images as (the feature rows they make, the Qwen2-VL family's grids or
    None), or None without images): with images, the template's
    placeholders expanded and the images encoded as the model's processor and generate do (off the event loop: the
    caller runs this in a thread)."""
    urls = image_urls(body.messages)
    if not urls:
        return service.tokenizer.encode(chat_text(body, service), add_special_tokens=False).ids, None
    vision = service.vision
    if vision is None:
        raise ApiError(400, f"'{service.model_name}' reads text only: image_url parts need a vision-language artifact "
                            "(converted with --task image-text-to-text)", "messages")
    g = service.scheduler.engine.g
    try:
        images = [read_image(url, service.media_root) for url in urls]
        ids, pixels, *grids = expand_images(vision, g.tokenizer_files, g.tokenizer, chat_text(body, service), images)
        if vision.spatial_merge_size:  # the Qwen2-VL family: patches and their grids
            sizes = dict(image_grid_thw=grids[0])
        else:
            sizes = dict(image_sizes=grids[0], batch_num_images=grids[1] if len(grids) > 1 else None) if grids else {}
        features = g.image_features(int((ids == vision.image_token_id).sum()), pixels, **sizes)
    except Torch2JaxError as err:  # InputSpecError included
        raise ApiError(400, str(err), "messages") from None
    return ids[0].tolist(), (features, sizes.get("image_grid_thw"))


def chat_text(body: ChatCompletionRequest, service: Service) -> str:
    """The prompt text of a chat request: its messages (tool call arguments as objects) and tools, rendered with the
    chat template as transformers' apply_chat_template renders them. Tools need a template that reads them."""
    template = service.chat_template
    if template is None:
        raise ApiError(400, f"'{service.model_name}' has no chat template (tokenizer_config.json has no chat_template; "
                            "start the server with --chat-template FILE), use /v1/completions", "messages")
    if body.tools and not template.renders_tools:
        raise ApiError(400, f"'tools' cannot be used with '{service.model_name}': its chat template does not render tools "
                            "(it never reads `tools`), so the model would not see them; start the server with "
                            "--chat-template FILE, a template that writes the tools into the prompt", "tools")
    messages = template_messages(body.messages)
    if service.vision is not None:  # a processor's template reads every content as parts, an image as {"type": "image"}
        messages = [dict(m, content=image_parts(m["content"])) if "content" in m else m for m in messages]
    try:
        return template.render(messages, add_generation_prompt=True, tools=body.tools)
    except InputSpecError as err:
        raise ApiError(400, str(err), "messages") from None


def image_parts(content: Any) -> list[dict]:
    """A message's content as a processor's chat template reads it: parts, each image a {"type": "image"}."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "image"} if p["type"] == "image" else p for p in content]


def _tool_readers(body: ChatCompletionRequest, service: Service) -> Callable[[], ToolParser] | None:
    """A maker of one choice's tool call reader, for a request whose reply is read for calls (None otherwise)."""
    if not body.reads_tool_calls:
        return None
    kind, names = service.tool_format(), body.function_names
    return lambda: parser(kind, names)


def _submit(service: Service, prompt: list[int], body: GenerationRequest, max_tokens: int, adapter: int = BASE,
            constraints: list[Constraint] | None = None, images: tuple | None = None) -> tuple[list[Request], asyncio.Queue]:
    """Queue the request's choices on the scheduler, each a request of its own over the same prompt (on the engine's
    adapter `adapter`, with its grammar constraint when given, with its images: (feature rows, Qwen2-VL grids or None),
    as _chat_prompt gives them), all together or none;
    their events come back on this event loop's queue as (choice, event)."""
    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def listener(index: int) -> Callable[[Event], None]:
        return lambda e: loop.call_soon_threadsafe(events.put_nowait, (index, e))

    settings = [body.sampling(i) for i in range(body.choices)]
    requests = [Request(prompt, max_tokens, listener(i), s, TextStream(service.tokenizer, body.stop_strings),
                        end_tokens=() if body.ignore_eos else None, adapter=adapter,
                        constraint=None if constraints is None else constraints[i],
                        image_features=None if images is None else images[0],
                        image_grids=None if images is None else images[1])
                for i, s in enumerate(settings)]
    try:
        service.scheduler.submit(requests)
    except QueueFull as err:
        raise ApiError(429, f"the server is busy ({err}): retry after {RETRY_AFTER_S}s", None, "queue_full",
                       "rate_limit_error") from None
    except InputSpecError as err:  # the prompt's fault unless it would fit with fewer tokens asked for
        fewer = getattr(err, "argument", None) == "max_new_tokens"
        raise ApiError(400, str(err), "max_tokens" if fewer else "prompt") from None
    return requests, events


def _error_response(err: ApiError, endpoint: str, service: Service) -> JSONResponse:
    service.metrics.request(endpoint, err.status)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 429 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def _sse(events: asyncio.Queue, shape: CompletionShape, n: int, echo: str, tokenizer: Any,
               include_usage: bool, readers: Callable[[], ToolParser] | None = None) -> AsyncIterator[str]:
    """Each choice's opening chunks, then `data: {chunk}` per event (of whichever choice), then the usage chunk when
    asked for, then `data: [DONE]`. With tool call `readers`, each choice's text goes through its reader: content as it
    is safe to send, each call whole in one delta once it closes, finish_reason "tool_calls" when the choice called any."""
    for index in range(n):
        for chunk in shape.opening(index, echo):
            yield f"data: {json.dumps(chunk)}\n\n"
    texts = [TokenTexts(tokenizer) for _ in range(n)]
    reading = [readers() for _ in range(n)] if readers is not None else None
    last: list[Event] = []
    while len(last) < n:
        index, event = await events.get()
        if event.finish_reason == "error":
            yield f"data: {json.dumps(ApiError(500, f'generation failed: {event.error}', kind='server_error').body())}\n\n"
            break
        entries = texts[index].entries(event.logprobs) if shape.top is not None else []
        text, reason, calls = (event.text, event.finish_reason, None) if reading is None else _read_calls(reading[index], event)
        if text or calls or reason or entries:  # an event whose text a reader holds back still carries its log-probabilities
            yield f"data: {json.dumps(shape.chunk(index, text, reason, entries, *([] if calls is None else [calls])))}\n\n"
        if event.finish_reason:
            last.append(event)
    if include_usage and len(last) == n:
        yield f"data: {json.dumps(dict(shape.chunk(0, '', None, []), choices=[], usage=usage(last)))}\n\n"
    yield "data: [DONE]\n\n"


def _read_calls(reader: ToolParser, event: Event) -> tuple[str, str | None, list[dict]]:
    """(the content, the finish reason, the whole tool calls) that one event's text completes through a choice's
    tool call reader."""
    pieces = reader.feed(event.text) + (reader.finish() if event.finish_reason else [])
    text = "".join(p for p in pieces if isinstance(p, str))
    first = reader.calls - sum(isinstance(p, ToolCall) for p in pieces)
    calls = [p.openai(first + k) for k, p in enumerate(p for p in pieces if isinstance(p, ToolCall))]
    return text, finish_reason(event.finish_reason, reader.calls > 0) if event.finish_reason else None, calls
