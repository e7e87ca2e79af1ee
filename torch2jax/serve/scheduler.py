"""Continuous batching, torch-free and independent of any web layer: requests join a running batch at the
next step and leave it the moment they end.

    scheduler = Scheduler(BatchEngine(generator, rows=8), max_queue=64)
    scheduler.start()                                    # the device loop, on its own thread
    scheduler.submit(Request(prompt_ids, max_tokens=32, on_event=print))

Each iteration of the loop (one thread owns the device state, serve/engine.py):
  1. drops cancelled requests (a client that went away), from the queue or from their row;
  2. when rows are free and nothing is being prefilled, takes the queued requests that fit (first come,
     first served) as one prefill group, holding a row for each;
  3. runs one prefill chunk of that group; after its last chunk each member gets its first token and
     joins the batch (or ends at once);
  4. runs one decode step for the running rows (a block of them while nothing waits or is being prefilled,
     serve/engine.py), and frees each row whose request ended: its length, an end token, a stop string, or
     cancellation.
So a long prompt is prefilled one chunk per step while the running rows keep decoding, and `submit`
refuses (QueueFull) rather than queueing without bound.

A request with structured output carries a Constraint (serve/structured.py): before each of its tokens (the first one
included) the loop writes its row's allowed-token mask, and after it feeds the token to the constraint, so while such a
row runs every decode call is one step. Its reply ends ("stop") when its grammar is complete.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from ..generate.text import TextStream
from .engine import BASE, BatchEngine, Group, Logprobs, Sampling
from .structured import StructuredOutputError

log = logging.getLogger("torch2jax.serve")
_ids = itertools.count()


class QueueFull(Torch2JaxError):
    """Every row is busy and the queue is at its bound: come back later."""


@dataclass
class TokenLogprob:
    """One generated token's log-probability (of the raw distribution, serve/engine.py's Sampling) and the most likely
    tokens' (as many as the request asked for, most likely first), with where the token's text starts in the reply's
    text (the reply decoded so far, before a stop string cuts it)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    offset: int


@dataclass
class Event:
    """What a request hears from the loop: new tokens with the text they complete (and their log-probabilities when the
    request asked for them), then once `finish_reason` ("stop", "length", or "error" with `error` set)."""

    tokens: list[int]
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (serve/prefix_cache.py), on the last event


@dataclass(eq=False)
class Request:
    """One generation request: prompt ids, limits, token choice, and where its events go (called on the loop's
    thread, so hand them over to your own thread there)."""

    prompt: list[int]
    max_tokens: int
    on_event: Callable[[Event], None]
    sampling: Sampling = field(default_factory=Sampling)
    text: TextStream | None = None  # detokenizes and applies stop strings
    end_tokens: tuple[int, ...] | None = None  # None: the artifact's end tokens
    adapter: int = BASE  # the engine's adapter this request runs with (its index; BASE: the base model)
    constraint: Any = None  # structured output: a serve/structured.py Constraint choosing which tokens may come next
    # a vision-language artifact: the feature rows [image tokens, feature_size] the prompt's image tokens take, in order
    # (VisionLanguageGenerator.image_features of its images); None: a prompt without images
    image_features: Any = None
    image_grids: Any = None  # the Qwen2-VL family: its images' [images, 3] grids (their 3-D positions), as the processor gives
    id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    last_token_at: float | None = None
    cached_tokens: int = 0  # prompt tokens copied from the prefix cache instead of computed

    def cancel(self) -> None:
        """Give up on this request (its client left): its row is freed at the loop's next iteration."""
        self.cancelled = True


class Scheduler:
    """The request queue and the batch's rows, over a BatchEngine; see the module docstring for the loop."""

    def __init__(self, engine: BatchEngine, *, max_queue: int = 64, metrics: Any = None):
        self.engine, self.max_queue, self.metrics = engine, max_queue, metrics
        self.waiting: deque[Request] = deque()
        self.slots: list[Request | None] = [None] * engine.rows  # the request holding each row (prefilling or running)
        self.group: Group | None = None
        self.group_members: list[Request] = []
        self.last = np.zeros(engine.rows, np.int64)  # each running row's last token (the next step's input)
        self.max_rows_held = 0
        self.steps = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the caller's side ----------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        """Refuse what cannot run, before it queues: generate's prompt check, in a client's words."""
        self.engine.check_request(request.prompt, request.max_tokens)
        count = 0 if self.engine.adapters is None else self.engine.adapters.count
        if request.adapter != BASE and not 0 <= request.adapter < count:
            raise InputSpecError(f"adapter {request.adapter}: this engine holds {count} adapters (0 to {count - 1}, or "
                                 f"{BASE} for the base model)")
        self.engine.check_images(request.prompt, request.image_features)

    def submit(self, request: Request | list[Request]) -> None:
        """Queue a request, or several together (the choices of one client request: all of them or none; raises
        InputSpecError for one that cannot run, QueueFull when the queue has no room for them all)."""
        requests = request if isinstance(request, list) else [request]
        for one in requests:
            self.validate(one)
        with self._cond:
            if self._stop:
                raise QueueFull("the server is shutting down")
            if len(self.waiting) + len(requests) > self.max_queue:
                raise QueueFull(f"all {self.engine.rows} rows are busy and {len(self.waiting)} requests are queued")
            self.waiting.extend(requests)
            self._cond.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="torch2jax-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop; requests still in it hear an error."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def rows_held(self) -> int:
        return sum(s is not None for s in self.slots)

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def stats(self) -> dict:
        stats = {"rows": self.engine.rows, "rows_held": self.rows_held, "max_rows_held": self.max_rows_held,
                 "queue_depth": self.queue_depth, "steps": self.steps, "decode_steps": self.engine.decode_steps}
        if self.engine.adapters is not None:  # how many models (adapters and the base) have shared one decode step
            stats["max_models_per_step"] = self.engine.most_models
        prefix = self.engine.prefix
        if prefix is not None:
            stats["prefix_cache"] = {"blocks": prefix.blocks, "blocks_used": len(prefix.table),
                                     "block_size": prefix.block_size, "queried_tokens": prefix.stats.queried,
                                     "hit_tokens": prefix.stats.hits}
        return stats

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._busy():
                    self._cond.wait(0.5)
                if self._stop:
                    break
            try:
                self.step()
            except Exception as err:  # a failed step must not end the loop: fail what was in it, start clean
                log.exception("a step of the batch failed")
                self._fail_all(f"{type(err).__name__}: {err}")
        self._fail_all("the server is shutting down")

    def _busy(self) -> bool:
        return bool(self.waiting) or self.group is not None or self.engine.running.any()

    def step(self) -> None:
        """One iteration: cancellations, admission, one prefill chunk, one decode step."""
        self.steps += 1
        self._drop_cancelled()
        if self.group is None:
            self._admit()
        if self.group is not None:
            self._prefill()
        running = np.flatnonzero(self.engine.running)
        if running.size:
            settings = [s.sampling if s is not None and self.engine.running[r] else None for r, s in enumerate(self.slots)]
            counts = np.array([len(s.tokens) if s is not None else 0 for s in self.slots], np.int32)
            left = np.array([s.max_tokens - len(s.tokens) if s is not None else 0 for s in self.slots], np.int32)
            watch = np.array([s is not None and s.end_tokens is None for s in self.slots])
            admitting = bool(self.waiting)
            block = self.engine.decode_block if self.group is None and not admitting else 1
            constrained = [self.slots[r] if self.engine.running[r] else None for r in range(self.engine.rows)]
            allowed = self._allowed(constrained)
            steps, logprobs = self.engine.decode(self.last, settings, counts, left, watch, block, allowed)
            for step, tokens in enumerate(steps):
                for row in running:
                    if self.slots[row] is not None and self.engine.running[row]:
                        self._emit(self.slots[row], int(tokens[row]), row, logprobs=logprobs, at=(step, row))
        if self.metrics is not None:
            self.metrics.observe_batch(int(self.engine.running.sum()), self.queue_depth, self.max_rows_held)

    def _drop_cancelled(self) -> None:
        with self._cond:
            for request in [r for r in self.waiting if r.cancelled]:
                self.waiting.remove(request)
        for row, request in enumerate(self.slots):
            if request is not None and request.cancelled and self.engine.running[row]:
                self._release(row)

    def _admit(self) -> None:
        free = [row for row, s in enumerate(self.slots) if s is None]
        with self._cond:
            members = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        if not members:
            return
        rows = free[: len(members)]
        for row, request in zip(rows, members):
            self.slots[row] = request
        self.max_rows_held = max(self.max_rows_held, self.rows_held)
        self.group_members = members
        self.group = self.engine.start_group(rows, [r.prompt for r in members], [r.max_tokens for r in members],
                                             [r.adapter for r in members], [r.image_features for r in members],
                                             [r.image_grids for r in members])
        for request, cached in zip(members, self.group.cached):
            request.cached_tokens = cached
        if self.metrics is not None:
            self.metrics.observe_admitted(sum(len(r.prompt) for r in members))
            if self.engine.prefix is not None:
                self.metrics.observe_prefix(sum(len(r.prompt) for r in members), sum(self.group.cached))

    def _prefill(self) -> None:
        group, members = self.group, self.group_members
        logits = self.engine.prefill_chunk(group)
        if logits is None:
            return
        allowed = self._allowed(members + [None] * (logits.shape[0] - len(members)))
        first, logprobs = self.engine.first_tokens(logits, [r.sampling for r in members], allowed)
        self.group, self.group_members = None, []
        joining = []
        for m, (row, request) in enumerate(zip(group.rows, members)):
            if request.cancelled:
                self.slots[row] = None
            elif not self._emit(request, int(first[m]), row, running=False, logprobs=logprobs, at=(m,)):
                joining.append(m)
                self.last[row] = int(first[m])
        self.engine.join(group, joining)
        penalized = [m for m in joining if members[m].sampling.penalized]  # their counts start at their first token
        self.engine.count_from([group.rows[m] for m in penalized], [int(first[m]) for m in penalized])

    def _allowed(self, requests: list[Request | None]) -> np.ndarray | None:
        """The allowed-token bitmask of each of these rows' next token ([len(requests), mask_words] int32: the grammar's
        for a request with a constraint, every token for the others), or None when none has a constraint."""
        if not any(r is not None and r.constraint is not None for r in requests):
            return None
        masks = np.full((len(requests), self.engine.mask_words), -1, np.int32)
        for i, request in enumerate(requests):
            if request is not None and request.constraint is not None:
                request.constraint.fill(masks[i])
        return masks

    def _emit(self, request: Request, token: int, row: int, running: bool = True, logprobs: Logprobs | None = None,
              at: tuple[int, ...] = ()) -> bool:
        """Hand one new token to its request (with its log-probabilities, `logprobs` at `at`, when the request asked for
        them); True when the request ended (its row is then free)."""
        now = time.perf_counter()
        if self.metrics is not None:
            self.metrics.observe_token(now - (request.last_token_at or request.submitted), first=not request.tokens)
        request.last_token_at = now
        request.tokens.append(token)
        self.last[row] = token
        found = []
        if logprobs is not None and request.sampling.logprobs is not None:
            offset = len(request.text.decoded) if request.text is not None else 0
            found = [TokenLogprob(token, *logprobs.at(*at, k=request.sampling.logprobs), offset)]
        ends = self.engine.g.spec.eos_token_ids if request.end_tokens is None else request.end_tokens
        if request.constraint is not None:  # the grammar allows the end token only where the reply may end
            ends = (*ends, *self.engine.g.spec.eos_token_ids)
        reason, text, error = None, "", None
        if token in ends:
            reason = "stop"
        else:
            if request.text is not None:
                text, stopped = request.text.push(token)
                reason = "stop" if stopped else None
            if request.constraint is not None:
                try:
                    if request.constraint.advance(token):
                        reason = reason or "stop"  # the grammar is complete: only the end token could follow
                except StructuredOutputError as err:
                    reason, error = "error", str(err)
            if reason is None and len(request.tokens) >= request.max_tokens:
                reason = "length"
        if reason is not None and request.text is not None:
            text += request.text.flush()  # the tail held back for a stop string that never came
        if reason is None:
            self._deliver(request, Event([token], text, logprobs=found))
            return False
        self._deliver(request, Event([token], text, reason, len(request.prompt), len(request.tokens), error=error,
                                     logprobs=found, cached_tokens=request.cached_tokens))
        if running:
            self._release(row)
        else:
            self.slots[row] = None
        return True

    def _release(self, row: int) -> None:
        self.slots[row] = None
        self.engine.free(row)

    def _deliver(self, request: Request, event: Event) -> None:
        if event.finish_reason is not None and self.metrics is not None:
            self.metrics.observe_finished(event.finish_reason, event.completion_tokens)
        try:
            request.on_event(event)
        except Exception:  # a listener's failure is its own; the batch goes on
            log.exception("a request's event handler failed")

    def _fail_all(self, message: str) -> None:
        with self._cond:
            waiting, self.waiting = list(self.waiting), deque()
        held = [r for r in self.slots if r is not None]
        self.slots = [None] * self.engine.rows
        self.group, self.group_members = None, []
        self.engine.reset()
        for request in waiting + held:
            self._deliver(request, Event([], "", "error", len(request.prompt), len(request.tokens), error=message))
