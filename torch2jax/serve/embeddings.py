"""`POST /v1/embeddings` over an encoder artifact (`torch2jax convert hf:DIR --task feature-extraction`), OpenAI's shape:

    POST /v1/embeddings   {"input": str | [str] | [int] | [[int]], "model", "encoding_format": "float" | "base64",
                           "dimensions", "user"} -> {"object": "list", "data": [{"object": "embedding", "index",
                           "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}
    GET  /v1/models, /health, /metrics             as an LM server answers them
    POST /v1/completions, /v1/chat/completions     400: an encoder serves embeddings

A request's inputs are tokenized (no truncation: an input longer than the model's positions is refused, naming it),
sorted by length and run as padded batches of at most `rows` rows; each batch is padded to a power-of-two row count and
a length bucket (8, 16, 32, ... up to the model's limit), so each (rows, length) shape compiles once. The pooling runs
in the same compiled call: the artifact's sentence-transformers pooling (mean, cls, last token, max, ...) and its
Normalize module, or mean pooling over the attention mask without normalization for a model without that config
(`--pooling`, `--normalize` choose). Concurrent requests take turns on one lock: one device call at a time.

An LM server mounts LM_ROUTES: /v1/embeddings answers 400 there, saying which artifact serves it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InputSpecError
from ..runtime import artifact
from ..runtime.model import Model
from .metrics import ServerMetrics
from .protocol import ApiError, json_object, validate
from .warm_up import WarmingUp

ENCODER_TASK = "feature-extraction"
DEFAULT_ROWS = 32  # rows per device call when --max-batch is not given
MIN_BUCKET = 8  # the shortest padded length
MAX_INPUTS = 2048  # inputs per request, as OpenAI allows
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weighted_mean", "last")  # sentence-transformers' order
POOLING_CHOICES = ("mean", "cls", "last")  # what `torch2jax serve --pooling` offers
PIPELINE_MODULES = ("Transformer", "Pooling", "Normalize")  # the sentence-transformers modules the server runs
ENCODER_ONLY = "this artifact is an encoder: it serves /v1/embeddings"
log = logging.getLogger("torch2jax.serve")


# -- the request ---------------------------------------------------------------------------------------
def _rule(rule: str, default: Any = None, **constraints: Any) -> Any:
    """A field with what it must be in words (protocol.refusal's 'must be ...')."""
    return Field(default, json_schema_extra={"rule": rule}, **constraints)


class EmbeddingRequest(BaseModel):
    """/v1/embeddings' body. Strict types (a number is not a string); unknown fields are ignored, as OpenAI does."""

    model_config = ConfigDict(strict=True, extra="ignore")

    input: str | list[str] | list[int] | list[list[int]] = _rule(
        f"a string, a list of strings, a list of token ids or a list of lists of token ids (at most {MAX_INPUTS} inputs)",
        ...)
    model: str | None = _rule("a string")
    encoding_format: Literal["float", "base64"] | None = _rule("'float' or 'base64'")
    dimensions: int | None = _rule("an integer >= 1", ge=1)
    user: str | None = _rule("a string")  # accepted and ignored

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("'input' must not be an empty list: send at least one string or list of token ids")
        if isinstance(value, list) and len(value) > MAX_INPUTS:
            raise ValueError(f"'input' has {len(value)} inputs; at most {MAX_INPUTS} per request (send several requests)")
        for index, item in enumerate(inputs_of(value)):
            if len(item) == 0:
                where = "'input'" if isinstance(value, str) or isinstance(value[0], int) else f"'input'[{index}]"
                raise ValueError(f"{where} is empty: an embedding needs at least one character or token")
        return value

    @property
    def inputs(self) -> list[str | list[int]]:
        """The inputs one by one: each a string or a list of token ids."""
        return inputs_of(self.input)

    @property
    def indexed(self) -> bool:
        """Whether `input` is a list of inputs (a refusal then names the input by its index)."""
        return not (isinstance(self.input, str) or isinstance(self.input[0], int))


def inputs_of(value: Any) -> list[str | list[int]]:
    """`input` as a list of inputs: a string or one list of token ids is one input."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    return list(value)


# -- pooling -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pooling:
    """How token states become one vector: the modes, concatenated in sentence-transformers' order, then normalized
    to unit length when `normalize`; `source` says where the choice came from."""

    modes: tuple[str, ...]
    normalize: bool
    source: str


def pooling_of(section: dict, pooling: str | None = None, normalize: bool | None = None) -> Pooling:
    """The artifact's pooling (its manifest's `embedding` section, from the model's sentence-transformers config), with
    `pooling` / `normalize` (the CLI's options) taking precedence; mean pooling without normalization when neither says.
    InputSpecError for a mode or a sentence-transformers module the server cannot run."""
    if pooling is not None and pooling not in POOLING_CHOICES:
        raise InputSpecError(f"pooling must be one of {', '.join(POOLING_CHOICES)}, got {pooling!r}")
    declared = section.get("pooling")
    modules = section.get("modules") or []
    other = [m for m in modules if m not in PIPELINE_MODULES]
    if other and pooling is None:
        raise InputSpecError(f"the model's sentence-transformers pipeline has modules the artifact does not hold "
                             f"({', '.join(map(str, other))}): its embeddings would not be the model's. Only Transformer, "
                             "Pooling and Normalize are served; choose --pooling to serve the encoder's pooled states anyway")
    if declared is not None and pooling is None:
        modes = tuple(declared)
        unknown = [m for m in modes if m not in POOLING_MODES]
        if unknown or not modes:
            raise InputSpecError(f"the model's sentence-transformers Pooling config asks for {unknown or 'no mode'}; the "
                                 f"server pools with {', '.join(POOLING_MODES)} (choose one with --pooling)")
        source = "the model's sentence-transformers config"
    else:
        modes, source = (pooling or "mean",), "--pooling" if pooling else "the default (no sentence-transformers config)"
    keep = section.get("normalize") if normalize is None else normalize
    return Pooling(modes, bool(keep), source)


def pool(hidden: jax.Array, mask: jax.Array, pooling: Pooling) -> jax.Array:
    """[rows, length, hidden] token states and their [rows, length] attention mask (real tokens first) -> [rows,
    hidden * modes] float32, as sentence-transformers' Pooling and Normalize compute them."""
    hidden = hidden.astype(jnp.float32)
    weights = mask.astype(jnp.float32)[..., None]
    count = jnp.maximum(weights.sum(axis=1), 1e-9)
    summed = (hidden * weights).sum(axis=1)
    parts = []
    for mode in pooling.modes:
        if mode == "cls":
            parts.append(hidden[:, 0])
        elif mode == "max":
            parts.append(jnp.where(weights > 0, hidden, -1e9).max(axis=1))
        elif mode == "mean":
            parts.append(summed / count)
        elif mode == "mean_sqrt_len":
            parts.append(summed / jnp.sqrt(count))
        elif mode == "weighted_mean":
            ramp = weights * jnp.arange(1, hidden.shape[1] + 1, dtype=jnp.float32)[None, :, None]
            parts.append((hidden * ramp).sum(axis=1) / jnp.maximum(ramp.sum(axis=1), 1e-9))
        else:  # last: the last real token (padding is on the right)
            last = jnp.maximum(mask.sum(axis=1).astype(jnp.int32) - 1, 0)
            parts.append(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
    vectors = jnp.concatenate(parts, axis=-1)
    if pooling.normalize:
        vectors = vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors


# -- the encoder ---------------------------------------------------------------------------------------
def buckets(limit: int, smallest: int = MIN_BUCKET) -> list[int]:
    """Powers of two from `smallest` below `limit`, then `limit` itself."""
    sizes, size = [], smallest
    while size < limit:
        sizes.append(size)
        size *= 2
    return [*sizes, limit]


class Encoder:
    """An encoder artifact's function with its pooling, run on padded batches: `embed(token lists)` -> float32
    vectors, one device call per batch of at most `rows` inputs, under one lock."""

    def __init__(self, model: Model, pooling: Pooling, limit: int, pad_token_id: int, vocab_size: int | None, rows: int):
        self.model, self.pooling, self.limit, self.pad, self.vocab, self.rows = model, pooling, limit, pad_token_id, vocab_size, rows
        self.dtypes = {i["name"]: np.dtype(i.get("jax_dtype") or i["dtype"]) for i in model.manifest["inputs"]}
        hidden = next((o["shape"][-1] for o in model.manifest.get("outputs", []) if o.get("name") == "last_hidden_state"), None)
        # the vectors' size: the hidden size once per pooling mode (None until the first call for an unnamed output)
        self.dimensions: int | None = hidden * len(pooling.modes) if isinstance(hidden, int) else None
        self.row_buckets = [1 << k for k in range(rows.bit_length()) if 1 << k < rows] + [rows]
        self.length_buckets = buckets(limit, min(MIN_BUCKET, limit))
        self.lock = threading.Lock()
        self.compiled: set[tuple[int, int]] = set()

        def forward(params: dict, ids: jax.Array, mask: jax.Array) -> jax.Array:
            kwargs = {"input_ids": ids}
            if "attention_mask" in self.dtypes:
                kwargs["attention_mask"] = mask.astype(self.dtypes["attention_mask"])
            if "token_type_ids" in self.dtypes:
                kwargs["token_type_ids"] = jnp.zeros_like(ids, dtype=self.dtypes["token_type_ids"])
            out = model.apply(params, **kwargs)
            hidden = out["last_hidden_state"] if isinstance(out, dict) else out[0]
            return pool(hidden, mask, pooling)

        self._forward = jax.jit(forward)

    def shapes(self, everything: bool) -> list[tuple[int, int]]:
        """The (rows, length) shapes a request can need (all of them, or the smallest one)."""
        if not everything:
            return [(self.row_buckets[0], self.length_buckets[0])]
        return [(r, n) for r in self.row_buckets for n in self.length_buckets]

    def compile(self, shapes: Sequence[tuple[int, int]], progress: Callable[[int, int], None]) -> None:
        """Run each shape once (so no request waits on its compilation), reporting progress(done, total)."""
        progress(0, len(shapes))
        for done, (rows, length) in enumerate(shapes, 1):
            with self.lock:
                self._run([[self.pad]] * rows, rows, length)
            progress(done, len(shapes))

    def check(self, inputs: Sequence[list[int]], indexed: bool = True) -> None:
        """ApiError (400, naming the input: by its index when `indexed`) for an input longer than the model's positions,
        one without tokens, or a token id outside its vocabulary."""
        for index, ids in enumerate(inputs):
            where = f"'input'[{index}]" if indexed else "'input'"
            if not ids:
                raise ApiError(400, f"{where} has no tokens once tokenized: an embedding needs at least one", "input")
            if len(ids) > self.limit:
                raise ApiError(400, f"{where} has {len(ids)} tokens; this model's maximum context length is {self.limit} "
                                    "tokens (its positions): shorten it or split it into several inputs", "input",
                               "context_length_exceeded")
            if self.vocab is not None and any(not 0 <= t < self.vocab for t in ids):
                bad = next(t for t in ids if not 0 <= t < self.vocab)
                raise ApiError(400, f"{where} has the token id {bad}, outside this model's vocabulary (0 to "
                                    f"{self.vocab - 1})", "input")

    def embed(self, inputs: Sequence[list[int]]) -> np.ndarray:
        """[inputs, dimensions] float32: the inputs sorted by length, run `rows` at a time, put back in order."""
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        vectors: list[np.ndarray] = [None] * len(inputs)  # type: ignore[list-item]
        with self.lock:
            for start in range(0, len(order), self.rows):
                chunk = order[start:start + self.rows]
                rows = next(r for r in self.row_buckets if r >= len(chunk))
                length = next(n for n in self.length_buckets if n >= max(len(inputs[i]) for i in chunk))
                out = self._run([inputs[i] for i in chunk], rows, length)
                for i, vector in zip(chunk, out):
                    vectors[i] = vector
        return np.stack(vectors)

    def _run(self, batch: list[list[int]], rows: int, length: int) -> np.ndarray:
        """One device call: `batch` right-padded to [rows, length] (rows beyond it are a lone pad token)."""
        ids = np.full((rows, length), self.pad, self.dtypes["input_ids"])
        mask = np.zeros((rows, length), np.int32)
        mask[len(batch):, 0] = 1  # filler rows attend to one token, so no row's softmax is over nothing
        for r, tokens in enumerate(batch):
            ids[r, :len(tokens)] = tokens
            mask[r, :len(tokens)] = 1
        out = np.asarray(self._forward(self.model.params, ids, mask))
        self.compiled.add((rows, length))
        self.dimensions = out.shape[-1]
        return out[:len(batch)]


# -- the service ---------------------------------------------------------------------------------------
class EmbeddingMetrics(ServerMetrics):
    """Requests by endpoint and code, inputs and tokens embedded, device calls and their time (prometheus_client)."""

    def __init__(self) -> None:
        super().__init__()
        from prometheus_client import Counter, Histogram

        registry = self.registry
        self.inputs = Counter("torch2jax_embedding_inputs", "Inputs embedded", registry=registry)
        self.prompt_tokens = Counter("torch2jax_prompt_tokens", "Tokens embedded (without padding)", registry=registry)
        self.seconds = Histogram("torch2jax_embedding_request_seconds", "From a request's tokens to its vectors",
                                 registry=registry)


@dataclass
class EmbeddingService(WarmingUp):
    """What an encoder server serves: the encoder, its tokenizer (None: token ids only) and the name clients use."""

    model_name: str
    encoder: Encoder
    tokenizer: Any
    metrics: EmbeddingMetrics
    created: int = 0

    def stop(self) -> None:
        """Nothing runs between requests: a request in flight ends with its device call."""

    def describe(self) -> str:
        """The startup line's details."""
        pooling = "+".join(self.encoder.pooling.modes) + (", normalized" if self.encoder.pooling.normalize else "")
        return (f"embeddings: {pooling} pooling ({self.encoder.pooling.source}), up to {self.encoder.limit} tokens an "
                f"input, {self.encoder.rows} rows a call")

    def check_model(self, model: Any) -> None:
        if isinstance(model, str) and model != self.model_name:
            raise ApiError(404, f"The model '{model}' does not exist (this server serves '{self.model_name}')", "model",
                           "model_not_found")

    def tokens(self, inputs: Sequence[str | list[int]]) -> list[list[int]]:
        """Each input's token ids: strings tokenized with the model's special tokens and no truncation, token ids as
        sent."""
        texts = [i for i, item in enumerate(inputs) if isinstance(item, str)]
        if texts and self.tokenizer is None:
            raise ApiError(400, f"'{self.model_name}' has no tokenizer (its model directory had no tokenizer.json): send "
                                "token ids as 'input'", "input")
        ids: list[list[int]] = [item if isinstance(item, list) else [] for item in inputs]  # type: ignore[misc]
        if texts:
            for i, encoding in zip(texts, self.tokenizer.encode_batch([inputs[i] for i in texts], add_special_tokens=True)):
                ids[i] = list(encoding.ids)
        return ids

    def embed(self, inputs: Sequence[str | list[int]], indexed: bool = True) -> tuple[np.ndarray, int]:
        """(the vectors, the tokens embedded); ApiError for an input the model cannot take (named by its index in a
        list when `indexed`)."""
        ids = self.tokens(inputs)
        self.encoder.check(ids, indexed)
        started = time.perf_counter()
        vectors = self.encoder.embed(ids)
        tokens = sum(map(len, ids))
        self.metrics.seconds.observe(time.perf_counter() - started)
        self.metrics.inputs.inc(len(ids))
        self.metrics.prompt_tokens.inc(tokens)
        return vectors, tokens


def build_embedding_service(artifact_dir: str | Path, *, rows: int | None = None, model_name: str | None = None,
                            pooling: str | None = None, normalize: bool | None = None, warm_up: str = "all",
                            progress: Callable[[int, int], None] | None = None,
                            defer_warm_up: bool = False) -> EmbeddingService:
    """An encoder artifact's embedding service (serve.api.build_service calls it for a feature-extraction artifact):
    its function and tokenizer read (torch-free), its pooling chosen (pooling_of), `rows` inputs per device call (default
    32), and its shapes compiled (every (rows, length) bucket with `warm_up="all"`, the smallest with `"short"`), now or,
    with `defer_warm_up`, when the server starts."""
    contents = artifact.read(artifact_dir, check=artifact.require_one_function)
    manifest, model = contents.manifest, contents.model
    section = manifest.get("embedding") if isinstance(manifest.get("embedding"), dict) else {}
    names = [i.get("name") for i in manifest["inputs"]]
    outputs = [o.get("name") for o in manifest.get("outputs", [])]
    if "input_ids" not in names or set(names) - {"input_ids", "attention_mask", "token_type_ids"}:
        raise InputSpecError(f"{artifact_dir}: the server embeds text, so the encoder must take input_ids (and "
                             f"attention_mask, token_type_ids); this one takes {', '.join(map(str, names))}")
    if outputs and "last_hidden_state" not in outputs:
        raise InputSpecError(f"{artifact_dir}: the encoder has no last_hidden_state output to pool (it returns "
                             f"{', '.join(map(str, outputs))})")
    if rows is not None and rows < 1:
        raise InputSpecError(f"max_batch must be at least 1, got {rows}")
    seq = manifest["inputs"][names.index("input_ids")]["shape"][-1]
    symbol_max = (manifest.get("symbols") or {}).get(seq, {}).get("max") if isinstance(seq, str) else seq
    limits = [n for n in (section.get("max_positions"), symbol_max) if isinstance(n, int) and n > 0]
    if not limits:
        raise InputSpecError(f"{artifact_dir}: the encoder's sequence length has no limit (no max_position_embeddings "
                             "and no maximum on its length dim); re-convert it with `torch2jax convert hf:DIR --task "
                             "feature-extraction`")
    chosen = pooling_of(section, pooling, normalize)
    tokenizer = None
    if "tokenizer.json" in contents.tokenizer_files:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(contents.tokenizer_files["tokenizer.json"]))
        tokenizer.no_truncation()  # an input too long is refused, not silently cut
        tokenizer.no_padding()
    pad = section.get("pad_token_id")
    if not isinstance(pad, int):
        padding = tokenizer.padding if tokenizer is not None else None
        pad = padding["pad_id"] if padding else 0
    vocab = section.get("vocab_size") if isinstance(section.get("vocab_size"), int) else None
    encoder = Encoder(model, chosen, min(limits), pad, vocab, rows or DEFAULT_ROWS)
    name = model_name or Path(artifact_dir).resolve().name

    def warm(report: Callable[[int, int], None]) -> None:
        def both(done: int, total: int) -> None:
            report(done, total)
            if progress is not None:
                progress(done, total)

        encoder.compile(encoder.shapes(warm_up == "all"), both)

    service = EmbeddingService(name, encoder, tokenizer, EmbeddingMetrics(), created=int(time.time()), warm_up=warm)
    if not defer_warm_up:
        service.warm_up_now()
    return service


# -- the endpoints -------------------------------------------------------------------------------------
async def embeddings(http: HttpRequest) -> Response:
    service: EmbeddingService = http.app.state.service
    endpoint = "/v1/embeddings"
    try:
        data = json_object(await http.body())
        service.check_model(data.get("model"))
        body: EmbeddingRequest = validate(data, EmbeddingRequest)  # type: ignore[arg-type, assignment]
        size = service.encoder.dimensions
        if body.dimensions is not None and body.dimensions != size:
            raise ApiError(400, f"'dimensions' {body.dimensions} is not supported: this model's embeddings have {size} "
                                "dimensions and it declares no shortened sizes; omit 'dimensions'", "dimensions")
        vectors, tokens = await asyncio.to_thread(service.embed, body.inputs, body.indexed)
    except ApiError as err:
        service.metrics.request(endpoint, err.status)
        return JSONResponse(err.body(), status_code=err.status)
    service.metrics.request(endpoint, 200)
    as_base64 = body.encoding_format == "base64"
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": service.model_name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def encoder_only(http: HttpRequest) -> Response:
    """/v1/completions and /v1/chat/completions on an encoder server."""
    service: EmbeddingService = http.app.state.service
    service.metrics.request(http.url.path, 400)
    return JSONResponse(ApiError(400, f"{ENCODER_ONLY} ('{service.model_name}' makes embeddings, not text)").body(),
                        status_code=400)


async def not_an_encoder(http: HttpRequest) -> Response:
    """/v1/embeddings on a text-generation server."""
    service = http.app.state.service
    service.metrics.request("/v1/embeddings", 400)
    message = (f"this artifact is a text-generation model: '{service.model_name}' serves /v1/completions and "
               "/v1/chat/completions, not /v1/embeddings (serve an encoder artifact for embeddings: `torch2jax convert "
               "hf:DIR --task feature-extraction`)")
    return JSONResponse(ApiError(400, message).body(), status_code=400)


async def models(http: HttpRequest) -> Response:
    service: EmbeddingService = http.app.state.service
    return JSONResponse({"object": "list", "data": [{"id": service.model_name, "object": "model",
                                                     "created": service.created, "owned_by": "torch2jax"}]})


async def health(http: HttpRequest) -> Response:
    """200 once the shapes are compiled (503 while they compile, or when that failed)."""
    service: EmbeddingService = http.app.state.service
    warming = service.warming(service.model_name)
    if warming is not None:
        return JSONResponse(warming, status_code=503)
    encoder = service.encoder
    return JSONResponse({"status": "ok", "model": service.model_name, "kind": "embedding", **service.progress(),
                         "shapes_compiled": len(encoder.compiled), "rows": encoder.rows, "max_input_tokens": encoder.limit,
                         "pooling": list(encoder.pooling.modes), "normalize": encoder.pooling.normalize,
                         "torch_imported": "torch" in sys.modules})


async def metrics(http: HttpRequest) -> Response:
    data, content_type = http.app.state.service.metrics.render()
    return Response(data, media_type=content_type)


ROUTES = [Route("/v1/embeddings", embeddings, methods=["POST"]),
          Route("/v1/completions", encoder_only, methods=["POST"]),
          Route("/v1/chat/completions", encoder_only, methods=["POST"]),
          Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]
LM_ROUTES = [Route("/v1/embeddings", not_an_encoder, methods=["POST"])]
