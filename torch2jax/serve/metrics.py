"""The server's Prometheus metrics (prometheus_client, one registry per server), fed by the scheduler's loop."""

from __future__ import annotations

from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """What every server counts: HTTP requests by endpoint and status code, in a registry of its own."""

    def __init__(self):
        try:
            from prometheus_client import CollectorRegistry, Counter
        except ImportError:
            from ..errors import Torch2JaxError

            raise Torch2JaxError("the server's metrics need prometheus_client: pip install 'torch2jax-aot[serve]'") from None
        self.registry = CollectorRegistry()
        self.requests = Counter("torch2jax_requests", "HTTP requests by endpoint and status code", ["endpoint", "code"],
                                registry=self.registry)

    def request(self, endpoint: str, code: int) -> Any:
        self.requests.labels(endpoint, str(code)).inc()

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Metrics(ServerMetrics):
    """Requests, tokens in and out, time to first token, inter-token latency, batch occupancy and queue depth."""

    def __init__(self, rows: int):
        super().__init__()
        from prometheus_client import Counter, Gauge, Histogram

        registry = self.registry
        self.model_requests = Counter("torch2jax_model_requests", "Requests accepted, by the model they chose (the base "
                                      "model's name or a LoRA adapter's)", ["model"], registry=registry)
        self.finished = Counter("torch2jax_generations", "Generations that ended, by finish reason", ["finish_reason"],
                                registry=registry)
        self.prompt_tokens = Counter("torch2jax_prompt_tokens", "Prompt tokens admitted into the batch", registry=registry)
        self.completion_tokens = Counter("torch2jax_completion_tokens", "Tokens generated", registry=registry)
        self.ttft = Histogram("torch2jax_time_to_first_token_seconds", "From submission to the first new token",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("torch2jax_inter_token_latency_seconds", "Between consecutive tokens of one request",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.occupancy = Histogram("torch2jax_batch_occupancy", "Running rows per decode step",
                                   buckets=tuple(range(1, rows + 1)), registry=registry)
        self.rows_running = Gauge("torch2jax_batch_rows_running", "Rows decoding now", registry=registry)
        self.rows_max = Gauge("torch2jax_batch_rows", "Rows in the batch (--max-batch)", registry=registry)
        self.rows_held_max = Gauge("torch2jax_batch_rows_held_max", "The most rows ever held at once (prefilling or running)",
                                   registry=registry)
        self.prefix_queries = Counter("torch2jax_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=registry)
        self.prefix_hits = Counter("torch2jax_prefix_cache_hits", "Prompt tokens served from the prefix cache (not "
                                   "computed); the hit rate is hits / queries", registry=registry)
        self.queue = Gauge("torch2jax_queue_depth", "Requests waiting for a row", registry=registry)
        self.rows_max.set(rows)

    def observe_admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)

    def observe_prefix(self, queried: int, hits: int) -> None:
        self.prefix_queries.inc(queried)
        self.prefix_hits.inc(hits)

    def observe_token(self, seconds: float, first: bool) -> None:
        self.completion_tokens.inc()
        (self.ttft if first else self.itl).observe(seconds)

    def observe_finished(self, reason: str, completion_tokens: int) -> None:
        self.finished.labels(reason).inc()

    def observe_batch(self, running: int, queued: int, rows_held_max: int | None = None) -> None:
        if running:
            self.occupancy.observe(running)
        self.rows_running.set(running)
        self.queue.set(queued)
        if rows_held_max is not None:
            self.rows_held_max.set(rows_held_max)

    def model_request(self, model: str) -> None:
        self.model_requests.labels(model).inc()
