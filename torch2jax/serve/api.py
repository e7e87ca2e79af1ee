"""An OpenAI-compatible HTTP API over the continuous-batching scheduler (Starlette; run by `torch2jax serve`).

    POST /v1/completions, /v1/chat/completions   (stream=true: server-sent events, `data: {json}` then `data: [DONE]`)
    GET  /v1/models, /health, /metrics            (/metrics: Prometheus text)
    POST /v1/embeddings                           an encoder artifact's (serve/embeddings.py); 400 on an LM server

A request is checked before it queues and refused with OpenAI's error body ({"error": {"message", "type",
"param", "code"}}): 400 for a malformed body or bad values, 404 for an unknown model, 429 (Retry-After)
when every row is busy and the queue is full. The web layer only translates: the wire format is protocol.py, the
endpoints routes.py; tokens, stop strings and rows are the scheduler's (serve/scheduler.py). Here the service is
built from an artifact (and the LoRA adapters served beside it, `--lora NAME=DIR`) and the app assembled over it: a
text-generation artifact's over the scheduler, a feature-extraction (encoder) artifact's over serve/embeddings.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from ..errors import InputSpecError, Torch2JaxError
from ..generate.artifacts import load
from ..generate.generator import Generator
from ..generate.seq2seq import Seq2SeqGenerator
from ..generate.text import ChatTemplate
from ..generate.vision_language import VisionLanguageGenerator
from ..runtime.artifact import read_manifest
from . import embeddings
from .embeddings import EmbeddingService, build_embedding_service
from .engine import BatchEngine
from .metrics import Metrics
from .routes import EXCEPTION_HANDLERS, ROUTES, Service
from .scheduler import Request, Scheduler
from .seq2seq_engine import Seq2SeqBatchEngine

if TYPE_CHECKING:
    from ..finetune.side_path import RowAdapters


def create_app(service: Service | EmbeddingService, on_shutdown: Callable[[], None] | None = None,
               on_ready: Callable[[], None] | None = None,
               on_failure: Callable[[BaseException], None] | None = None) -> Starlette:
    """The Starlette application: routes.py's endpoints over `service`; the scheduler's loop runs from startup to
    shutdown (then `on_shutdown`). A service built with `defer_warm_up` compiles its steps on a thread from startup on,
    so the server listens (and /health answers 503) meanwhile; its loop starts after them (then `on_ready`, or
    `on_failure(error)` if the warm-up failed: Service.start). An EmbeddingService gets serve/embeddings.py's
    endpoints instead (an LM's /v1/embeddings answers 400, saying which artifact serves it)."""
    encoder = isinstance(service, EmbeddingService)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.start(on_ready, on_failure)
        try:
            yield
        finally:
            if encoder:
                service.stop()
            else:
                service.scheduler.stop()
            if on_shutdown is not None:
                on_shutdown()

    routes = embeddings.ROUTES if encoder else [*ROUTES, *embeddings.LM_ROUTES]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    app.state.service = service
    return app


COMPILATION_CACHE_BYTES = 4 << 30  # what the cache may hold on disk


def default_compilation_cache() -> Path:
    """Where `torch2jax serve` keeps compiled steps between runs: $XDG_CACHE_HOME/torch2jax/jax (~/.cache/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch2jax" / "jax"


def use_compilation_cache(directory: str | os.PathLike) -> None:
    """JAX's persistent compilation cache in `directory`, every compiled step kept (however quick to compile): a
    restarted server reads its steps instead of compiling them (17.3 s of warm-up -> 2.8 s for a small model). The cache
    is JAX's own, keyed by the program, the jax version and the device, so a stale entry is never used."""
    import jax
    from jax.experimental.compilation_cache.compilation_cache import reset_cache

    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)  # the least recently used go first
    # JAX opens its cache once, at the first compile: one set by JAX_COMPILATION_CACHE_DIR is already open by now
    # (importing the package compiles), and would keep every entry; reopened, the cache is `directory`
    reset_cache()


def no_compilation_cache() -> None:
    """JAX's persistent compilation cache off, also one JAX_COMPILATION_CACHE_DIR opened already (see
    use_compilation_cache): every step compiles at start-up and nothing is kept."""
    import jax
    from jax.experimental.compilation_cache.compilation_cache import reset_cache

    jax.config.update("jax_enable_compilation_cache", False)
    reset_cache()


def build_service(artifact_dir: str | os.PathLike, *, max_batch: int | None = None, max_queue: int = 64, chunk: int = 256,
                  model_name: str | None = None, chat_template: str | os.PathLike | None = None, warm_up: str = "all",
                  progress: Callable[[int, int], None] | None = None, decode_block: int = 16,
                  lora: Sequence[tuple[str, str | os.PathLike]] = (), defer_warm_up: bool = False,
                  pooling: str | None = None, normalize: bool | None = None, max_prefill_tokens: int | None = None,
                  prefix_cache_tokens: int | None = None,
                  allowed_local_media_path: str | os.PathLike | None = None) -> Service | EmbeddingService:
    """What `torch2jax serve` serves: the artifact loaded, what the server cannot serve refused (with the reason), its
    scheduler over `max_batch` rows (default: the artifact's), and its steps compiled before the first client: at
    every shape a request can need (`warm_up="all"`, reporting `progress(done, total)`), or a short prompt's only
    (`"short"`: a quicker start, and compilations later while clients wait). `decode_block`: decode steps per call
    while no request waits (serve/engine.py). `lora`: (name, PEFT adapter directory) pairs, each served as a model of
    its own name beside the base model, rows of any of them sharing the batch (load_adapters). `defer_warm_up`: return
    before compiling, leaving the warm-up to Service.start (create_app's startup), so a server listens while it runs.
    A feature-extraction (encoder) artifact makes an EmbeddingService instead (serve/embeddings.py: `max_batch` inputs
    per device call, `pooling` / `normalize` over the model's own sentence-transformers config); `pooling` and
    `normalize` are refused for any other artifact, `lora` and `chat_template` for an encoder.
    `max_prefill_tokens`: prompt tokens prefilled per step over a group's rows (default: `chunk`); `prefix_cache_tokens`:
    what the prefix cache holds (None: half the batch cache, rows x max cache length / 2; 0: no prefix caching).
    A vision-language artifact takes images in chat messages (data URIs; local paths only inside
    `allowed_local_media_path`, serve/media.py), its chat template the processor's."""
    if warm_up not in ("all", "short"):
        raise InputSpecError(f"warm_up must be 'all' or 'short', got {warm_up!r}")
    if read_manifest(Path(artifact_dir)).get("task") == embeddings.ENCODER_TASK:
        if lora or chat_template:
            raise InputSpecError(f"{artifact_dir} is an encoder (feature-extraction): it serves /v1/embeddings, so "
                                 f"{'--lora' if lora else '--chat-template'} does not apply")
        return build_embedding_service(artifact_dir, rows=max_batch, model_name=model_name, pooling=pooling,
                                       normalize=normalize, warm_up=warm_up, progress=progress, defer_warm_up=defer_warm_up)
    if pooling is not None or normalize is not None:
        raise InputSpecError(f"--pooling and --normalize apply to encoder artifacts (feature-extraction, served at "
                             f"/v1/embeddings); {artifact_dir} is not one")
    g = load(artifact_dir)
    if not isinstance(g, (Generator, Seq2SeqGenerator)):
        raise InputSpecError(f"{artifact_dir} is neither a text-generation artifact (convert hf:DIR --task text-generation "
                             "or text2text-generation) nor an encoder one for /v1/embeddings (convert hf:DIR --task "
                             "feature-extraction)")
    if "tokenizer.json" not in g.tokenizer_files:
        raise InputSpecError(f"{artifact_dir} has no tokenizer (its model directory had no tokenizer.json): the server "
                             "reads and writes text, so it needs one")
    name = model_name or Path(artifact_dir).resolve().name
    rows = max_batch or g.spec.max_batch
    if isinstance(g, Seq2SeqGenerator):
        given = [option for option, value in (("--lora", lora), ("--prefix-cache-tokens", prefix_cache_tokens),
                                              ("--max-prefill-tokens", max_prefill_tokens)) if value]
        if given:
            raise InputSpecError(f"{artifact_dir} is an encoder-decoder (text2text-generation), whose requests encode "
                                 f"their sources whole (docs/serve.md): {', '.join(given)} does not apply to it")
        names, dirs = [], []
        engine: BatchEngine = Seq2SeqBatchEngine(g, rows, decode_block)
    else:
        names, dirs, adapters = load_adapters(g, name, lora) if lora else ([], [], None)
        if prefix_cache_tokens is None:
            prefix_cache_tokens = rows * g.spec.max_cache_len // 2
        engine = BatchEngine(g, rows, chunk, decode_block, adapters=adapters, prefix_cache_tokens=prefix_cache_tokens,
                             prefill_tokens=max_prefill_tokens)
    metrics = Metrics(rows)
    scheduler = Scheduler(engine, max_queue=max_queue)
    template = ChatTemplate.from_files(g.tokenizer_files.get("tokenizer_config.json"),
                                       Path(chat_template) if chat_template else None)
    if isinstance(g, VisionLanguageGenerator) and not chat_template:
        template = processor_template(g) or template
    media_root = None
    if allowed_local_media_path is not None:
        media_root = Path(allowed_local_media_path)
        if not media_root.is_dir():
            raise InputSpecError(f"--allowed-local-media-path {media_root}: not a directory")

    def warm(report: Callable[[int, int], None]) -> None:
        def both(done: int, total: int) -> None:
            report(done, total)
            if progress is not None:
                progress(done, total)

        if warm_up == "all":
            engine.compile_steps(both)
        else:
            both(0, 1)
            warm_up_short(scheduler)
            both(1, 1)
        scheduler.metrics = metrics  # counted from the first client on

    service = Service(name, scheduler, g.tokenizer, template, metrics, created=int(time.time()), adapters=names,
                      adapter_dirs=dirs, warm_up=warm, media_root=media_root)
    if not defer_warm_up:
        service.warm_up_now()
    return service


def processor_template(g: VisionLanguageGenerator) -> ChatTemplate | None:
    """The processor's chat template (chat_template.jinja / .json, else the tokenizer's), None where there is none."""
    from ..generate import vision_processor

    try:
        return vision_processor.chat_template(g.tokenizer_files)
    except Torch2JaxError:
        return None


def load_adapters(g: Generator, model_name: str, lora: Sequence[tuple[str, str | os.PathLike]]
                  ) -> tuple[list[str], list[str], RowAdapters]:
    """The `--lora NAME=DIR` adapters read (finetune.load_adapter) and stacked over the generator's prefill and decode
    (finetune.row_adapters): (their names, their directories, the RowAdapters), adapter i being the engine's id i.
    InputSpecError, naming the adapter, for a name served twice or the base model's, a directory that is missing or not
    a PEFT LoRA adapter, and an adapter that does not fit the artifact's weights."""
    from ..finetune import load_adapter, row_adapters
    from ..finetune.lora import LoraError
    from ..lowering.lora_paths import LoraPathError

    names, dirs, loaded = [], [], []
    for name, directory in lora:
        option = f"--lora {name}={directory}"
        if not name:
            raise InputSpecError(f"{option}: the adapter needs a name (the `model` clients send), as --lora NAME=DIR")
        if name == model_name:
            raise InputSpecError(f"{option}: '{name}' is the base model's name; give the adapter another NAME (or serve "
                                 "the base model under another one with --model-name)")
        if name in names:
            raise InputSpecError(f"{option}: the name '{name}' is given to two adapters; each --lora needs a NAME of its own")
        path = Path(directory)
        if not path.is_dir():
            raise InputSpecError(f"{option}: {path} is not a directory; give the PEFT adapter directory (the one holding "
                                 "adapter_config.json, e.g. `torch2jax finetune`'s OUT/adapter)")
        try:
            loaded.append(load_adapter(path))
        except (LoraError, KeyError, ValueError) as err:  # KeyError / ValueError: a malformed adapter_config.json
            raise InputSpecError(f"{option}: not a LoRA adapter torch2jax can serve ({type(err).__name__}: {err})") from None
        names.append(name)
        dirs.append(str(path.resolve()))
    try:
        return names, dirs, row_adapters(g.entries(), loaded)
    except (LoraError, LoraPathError) as together:  # find which one does not fit, alone
        for name, directory, adapter in zip(names, dirs, loaded):
            try:
                row_adapters(g.entries(), [adapter])
            except (LoraError, LoraPathError) as err:
                reason = str(err).removeprefix("adapter 0: ")
                raise InputSpecError(f"--lora {name}={directory}: the adapter does not fit this artifact's weights ({reason}); "
                                     "was it trained on the model this artifact was converted from?") from None
        raise InputSpecError(f"--lora {', '.join(names)}: each adapter fits alone, but they cannot be served together "
                             f"({together}); serve them from separate servers") from None


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
