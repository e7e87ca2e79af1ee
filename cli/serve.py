"""`torch2jax serve`: an OpenAI-compatible HTTP server with continuous batching over a text-generation artifact.

Torch-free: it imports the runtime and serve halves only (tests/serve/test_server.py runs it where importing
torch fails). The service itself is torch2jax.serve.api.build_service.
"""

from __future__ import annotations

import logging
import signal
import time

import click

from torch2jax.errors import Torch2JaxError

from .common import handles_errors, needs_extra


@click.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, help="Port to listen on.")
@click.option("--max-batch", type=int, help="Rows decoded together (default: the artifact's --max-batch); an "
              "encoder's inputs per device call (default 32).")
@click.option("--max-queue", default=64, show_default=True, help="Requests that may wait for a row; beyond it, HTTP 429.")
@click.option("--chunk", default=256, show_default=True, help="Prefill chunk in tokens (a power of two): longer prompts are "
              "prefilled one chunk per step, between decode steps of the running requests.")
@click.option("--max-prefill-tokens", type=click.IntRange(min=16),
              help="Prompt tokens prefilled per step, over the rows of a group of requests starting together (each row's "
              "chunk is halved until they fit, down to 16 tokens): bounds how long a prompt arriving delays the running "
              "requests' next token  [default: --chunk].")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="Keep the keys and values of prompts' full 16-token blocks, so a request whose prompt starts as an "
              "earlier one did copies them instead of computing them (usage.prompt_tokens_details.cached_tokens).")
@click.option("--prefix-cache-tokens", type=click.IntRange(min=16),
              help="Prompt tokens the prefix cache holds on the device, least recently used first out  [default: half "
              "the batch cache: max-batch x the artifact's max cache length / 2].")
@click.option("--model-name", help="The model id clients name (default: the artifact directory's name).")
@click.option("--chat-template", type=click.Path(dir_okay=False, exists=True),
              help="A Jinja chat template file (default: tokenizer_config.json's chat_template).")
@click.option("--tool-parser", type=click.Choice(["auto", "hermes", "llama3_json"]), default="auto", show_default=True,
              help="How tool calls are read from replies (and written, when a request forces one): hermes "
              "(<tool_call>{json}</tool_call> blocks: Hermes, Qwen), llama3_json (the reply is {\"name\", \"parameters\"} "
              "objects separated by ';': Llama 3.1); auto: hermes when the chat template mentions <tool_call>, else "
              "llama3_json.")
@click.option("--drain-timeout", default=30.0, show_default=True,
              help="On SIGTERM/SIGINT: seconds to let requests in flight finish before exiting.")
@click.option("--warm-up", type=click.Choice(["all", "short"]), default="all", show_default=True,
              help="Compile the steps at every shape a request can need before serving (all: no client waits on a "
              "compilation, which on a busy server would stall every running request; takes longer), or for a short "
              "prompt only (short). The server listens meanwhile: /health answers 503 until the steps are ready, and "
              "requests wait in the queue.")
@click.option("--decode-block", default=16, show_default=True, type=click.IntRange(min=1),
              help="Decode steps per device call while no request waits (ended early on the device when a row finishes): "
              "fewer dispatches and token reads, which on a GPU is most of a small model's step; 1 = a step per call.")
@click.option("--lora", "lora", multiple=True, metavar="NAME=DIR", callback=lambda ctx, param, value: _named_dirs(value),
              help="Serve a PEFT LoRA adapter directory (e.g. `torch2jax finetune`'s OUT/adapter) as the model NAME, beside "
              "the base model; repeat for more. A request's `model` chooses: the base model's name or an adapter's, and "
              "rows of different adapters share a batch.")
@click.option("--pooling", type=click.Choice(["mean", "cls", "last"]),
              help="Encoder artifacts (/v1/embeddings): how token states become one vector (mean over the attention "
              "mask, the first token's, the last real token's) [default: the model's sentence-transformers config, "
              "else mean].")
@click.option("--normalize/--no-normalize", default=None,
              help="Encoder artifacts: scale each embedding to unit length [default: as the model's sentence-transformers "
              "config says (a Normalize module), else not].")
@click.option("--compilation-cache", type=click.Path(file_okay=False),
              help="Keep the compiled steps here between runs, so a restart reads them instead of compiling "
                   "[default: $XDG_CACHE_HOME/torch2jax/jax, i.e. ~/.cache/torch2jax/jax].")
@click.option("--no-compilation-cache", is_flag=True,
              help="Compile every step at start-up, keeping nothing (JAX's persistent cache off, also one set by "
                   "JAX_COMPILATION_CACHE_DIR).")
@click.option("--allowed-local-media-path", type=click.Path(file_okay=False, exists=True),
              help="A vision-language artifact: chat image_url parts may name image files inside this directory "
                   "(file:// or a path); without it only inline data: URIs are read.")
@click.option("--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@handles_errors
def serve(artifact_dir, host, port, max_batch, max_queue, chunk, max_prefill_tokens, prefix_caching, prefix_cache_tokens,
          model_name, chat_template, tool_parser, drain_timeout, warm_up,
          decode_block, lora, compilation_cache, no_compilation_cache, allowed_local_media_path, log_level, pooling,
          normalize):
    """Serve a text-generation artifact over HTTP, OpenAI-style: /v1/completions, /v1/chat/completions
    (streaming with stream=true), /v1/models, /health and /metrics (Prometheus). Needs no torch. An encoder artifact
    (convert hf:DIR --task feature-extraction) serves /v1/embeddings instead; a vision-language one (--task
    image-text-to-text) takes images in chat messages (image_url parts with data: URIs); an encoder-decoder (--task
    text2text-generation: T5, BART) serves /v1/completions, with continuous batching too.

    \b
    Example:
      torch2jax serve out/llm --port 8000 --max-batch 8
      curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
           -d '{"model": "llm", "prompt": "Hello", "max_tokens": 16, "temperature": 0}'
      torch2jax serve out/llm --lora sql=runs/sql/adapter --lora chat=runs/chat/adapter   # models sql and chat too
      torch2jax serve out/minilm --port 8001   # an encoder: POST /v1/embeddings {"input": ["a", "b"]}
    """
    needs_extra("serve", "uvicorn", "starlette", "pydantic", "jinja2", "tokenizers", "prometheus_client")
    if lora:
        needs_extra("finetune", "safetensors")  # reads the adapters' weights
    import uvicorn

    from torch2jax.serve.api import build_service, create_app, default_compilation_cache, use_compilation_cache
    from torch2jax.serve.api import no_compilation_cache as disable_compilation_cache
    from torch2jax.serve.embeddings import EmbeddingService

    if no_compilation_cache:
        disable_compilation_cache()
    else:
        use_compilation_cache(compilation_cache or default_compilation_cache())
    started = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if done == total or time.perf_counter() - last[0] > 5:
            last[0] = time.perf_counter()
            click.echo(f"[serve] compiling the steps: {done}/{total}", err=True)

    service = build_service(artifact_dir, max_batch=max_batch, max_queue=max_queue, chunk=chunk,
                            max_prefill_tokens=max_prefill_tokens,
                            prefix_cache_tokens=(prefix_cache_tokens if prefix_caching else 0), model_name=model_name,
                            chat_template=chat_template, warm_up=warm_up, progress=progress,
                            decode_block=decode_block, lora=lora, defer_warm_up=True, pooling=pooling, normalize=normalize,
                            allowed_local_media_path=allowed_local_media_path)
    service.tool_parser = tool_parser
    click.echo(f"[serve] loaded in {time.perf_counter() - started:.1f}s; compiling the steps while listening "
               "(/health: 503 until they are ready)", err=True)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    failed: list[BaseException] = []

    def ready() -> None:
        click.echo(f"[serve] warmed up in {time.perf_counter() - started:.1f}s: ready", err=True)

    def failure(err: BaseException) -> None:  # a server that cannot compile its steps must not linger unready
        failed.append(err)
        server.should_exit = True

    class Server(uvicorn.Server):
        """uvicorn's server, except that a drained shutdown on SIGTERM exits 0 rather than re-raising the signal."""

        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and not self.should_exit:
                click.echo(f"[serve] SIGTERM: draining requests in flight (at most {drain_timeout:g}s)", err=True)
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    config = uvicorn.Config(create_app(service, on_ready=ready, on_failure=failure), host=host, port=port,
                            log_level=log_level, access_log=log_level == "debug", timeout_graceful_shutdown=drain_timeout,
                            lifespan="on")
    if isinstance(service, EmbeddingService):
        click.echo(f"[serve] {service.model_name} on http://{host}:{port} ({service.describe()})", err=True)
    else:
        adapters = f", adapters {', '.join(service.adapters)}" if service.adapters else ""
        click.echo(f"[serve] {service.model_name} on http://{host}:{port} ({service.scheduler.engine.rows} rows, "
                   f"max_cache_len {service.max_cache_len}{adapters})", err=True)
    server = Server(config)
    server.run()
    if failed:
        raise Torch2JaxError(f"the warm-up failed, so the server stopped: {type(failed[0]).__name__}: {failed[0]}")
    click.echo("[serve] stopped", err=True)


def _named_dirs(values: tuple[str, ...]) -> list[tuple[str, str]]:
    """--lora NAME=DIR values as (name, dir) pairs; names are checked where the base model's is known (build_service)."""
    pairs = []
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not name or not directory:
            raise click.BadParameter(f"{value!r} is not NAME=DIR: give the adapter's model name, '=', then its PEFT adapter "
                                     "directory, e.g. --lora sql=runs/sql/adapter", param_hint="--lora")
        pairs.append((name, directory))
    return pairs
