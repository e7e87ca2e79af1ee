"""The device side of serving an encoder-decoder (T5, BART, Marian, mBART...): cohorts of requests over one batch.

An encoder-decoder's decode step writes every row at one self-attention slot (`cache_position`: the decoder's step) and
reads the cross-attention keys and values `encode` made from the sources. So the rows of a batch start together: a
cohort of the waiting requests (as many as there are rows) is encoded in one call (sources right-padded to a
power-of-two bucket, as Seq2SeqGenerator.generate pads them), its rows run the decoder's start token at slot 0 (the
"prefill"), then decode together, each row leaving as its request ends (its length, an end token, a stop string); the
next cohort starts once every row of this one has ended. A request arriving meanwhile waits for that, where a causal
LM's batch (serve/engine.py) would take it at the next step.

The decode loop and the token choice are BatchEngine's: per-row sampling with the request's own seed, log-probabilities,
presence / frequency penalties and structured output's allowed-token masks all apply as they do for a causal LM. The
artifact's forced first token (`forced_bos_token_id`, mBART's and NLLB's target language) is the only token a row's first
choice allows. There is no prefix cache and no LoRA adapters: a request's decoder keys depend on its whole source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..generate.loop import MIN_BUCKET, attended_span, bucket, call_entry
from ..generate.prompts import CLIENT, PromptError, check_max_new_tokens, token_ids
from ..generate.seq2seq import Seq2SeqGenerator, right_pad
from .engine import MASKED_VARIANTS, VARIANTS, BatchEngine, Group, Logprobs, Sampling


class Seq2SeqBatchEngine(BatchEngine):
    """A Seq2SeqGenerator's batch: the cross-attention state of the running cohort beside the self-attention cache."""

    def __init__(self, generator: Seq2SeqGenerator, rows: int, decode_block: int = 16):
        if generator.spec.source_input != "input_ids":  # Whisper's input_features, an image encoder's pixel_values
            raise InputSpecError(f"this encoder-decoder reads {generator.spec.source_input}, not text, and the server "
                                 f"takes text; run Seq2SeqGenerator.generate({generator.spec.source_input}=...) in Python")
        self._start_batch(generator, rows, decode_block)
        self.cross: list[jax.Array] | None = None  # the running cohort's encoder outputs, per decoder layer
        self.source_mask: jax.Array | None = None  # [rows, source bucket] bool
        self._start = jax.jit(self._start_step, donate_argnums=(1,))
        forced = generator.spec.forced_bos_token_id
        self._forced_first = None if forced is None else int(forced)

    # -- what may run -------------------------------------------------------------------------------------------------
    def check_request(self, prompt: list[int], max_tokens: int) -> None:
        """A client's source must fit the encoder (max_source_len) and its max_tokens the decoder (max_cache_len)."""
        spec = self.g.spec
        token_ids(np.asarray([prompt]), 1, spec.vocab_size, "prompt", CLIENT)
        check_max_new_tokens(max_tokens, CLIENT)
        if len(prompt) > spec.max_source_len:
            raise PromptError(f"the prompt has {len(prompt)} tokens, more than this model's encoder takes "
                              f"({spec.max_source_len}): shorten the prompt", "ids")
        if max_tokens > spec.max_cache_len:
            raise PromptError(f"max_tokens={max_tokens} is more than this model's decoder holds ({spec.max_cache_len}): "
                              "ask for fewer tokens", "max_new_tokens")

    def check_images(self, prompt: list[int], features: Any) -> None:
        if features is not None:
            raise InputSpecError("this model takes text only: the request holds images")

    def can_admit(self) -> bool:
        """A new cohort starts once every row of the running one has ended (their decoder steps share one slot)."""
        return not self.running.any()

    # -- prefill: encode the cohort, run the start token ---------------------------------------------------------------
    def start_group(self, rows: list[int], prompts: list[list[int]], max_tokens: list[int],
                    adapter_ids: list[int] | None = None, images: list[Any] | None = None,
                    grids: list[Any] | None = None) -> Group:
        """The cohort's sources, right-padded over every row of the batch (rows without a request get a one-token
        source, so that no row attends to nothing)."""
        spec = self.g.spec
        sources = [[spec.pad_token_id]] * self.rows
        for row, prompt in zip(rows, prompts):
            sources[row] = prompt
        ids, mask = right_pad(sources, spec.pad_token_id)
        return Group(list(rows), [len(p) for p in prompts], ids, mask, [0, ids.shape[1]], [], prompts=list(prompts),
                     cached=[0] * len(prompts))

    def prefill_chunk(self, group: Group) -> jax.Array:
        """Encode the cohort and run its start tokens at slot 0: the logits of every row's first new token (the group's
        members first, in order, then the other rows)."""
        inputs = self.g._encoder_inputs(group.ids, group.mask, self.g.spec.pad_token_id)
        self.cross, self.source_mask = self._encode(*inputs)
        self.cache = None  # donated below; a failed call must not leave a deleted array behind
        logits, self.cache = self._start(self.g.params, self.g.new_cache(self.rows), self.cross, self.source_mask)
        group.chunk += 1
        order = np.asarray(group.rows + [r for r in range(self.rows) if r not in group.rows])
        return logits[order]

    def first_tokens(self, logits: jax.Array, settings: list[Sampling],
                     allowed: np.ndarray | None = None) -> tuple[np.ndarray, Logprobs | None]:
        if self._forced_first is not None:  # transformers' forced-BOS processor: only that token may come first
            logits = jnp.where(jnp.arange(logits.shape[-1]) == self._forced_first, logits, -jnp.inf)
        return super().first_tokens(logits, settings, allowed)

    def join(self, group: Group, members: list[int]) -> None:
        """The members whose request goes on decode from slot 1 (slot 0 holds the start token)."""
        for m in members:
            self.lengths[group.rows[m]], self.running[group.rows[m]] = 1, True

    # -- decode ---------------------------------------------------------------------------------------------------------
    def _step_lengths(self) -> np.ndarray:
        """Every row at the cohort's slot (the rows that ended go on computing, unread, until the cohort ends)."""
        return np.full(self.rows, int(self.lengths[self.running].max(initial=0)))

    def _decode_side(self) -> Any:
        return self.cross, self.source_mask

    def free(self, row: int) -> None:
        self.running[row] = False

    def reset(self) -> None:
        super().reset()
        self.cross = self.source_mask = None

    # -- jitted bodies ---------------------------------------------------------------------------------------------------
    def _encode(self, ids: jax.Array, mask: jax.Array) -> tuple[list[jax.Array], jax.Array]:
        """The sources' cross-attention state (the generator's own compiled encode) and which columns are real."""
        return self.g._encode(self.g.params, ids, mask), mask != 0

    def _start_step(self, params, cache, cross, source_mask):
        start = jnp.full((self.rows,), self.g.spec.decoder_start_token_id, self._ids)
        return self._step_logits(params, cache, start, jnp.zeros((self.rows,), self._ids), None, (cross, source_mask),
                                 span=attended_span(1, self.max_len))

    def _step_logits(self, params, cache, tokens, lengths, deltas, side, *, span):
        """One decoder step for every row at the cohort's slot `lengths[0]`, each row attending to its slots up to it and
        to its own source: (logits [rows, V], cache)."""
        cross, source_mask = side
        valid = jnp.arange(span)[None, :] <= lengths[:, None]
        logits, cache = call_entry(self.g.decode_model, params, tokens[:, None], lengths[:1], valid, source_mask,
                                   list(cache), list(cross))
        return logits, list(cache)

    # -- compiling ahead -------------------------------------------------------------------------------------------------
    def step_shapes(self) -> dict[str, list]:
        """The source buckets a cohort's encode meets and the decoder's attended spans (each decode step compiles per
        pair)."""
        spec = self.g.spec
        sources = [spec.max_source_len] if spec.fixed_source else \
            sorted({bucket(n, spec.max_source_len, MIN_BUCKET) for n in range(1, spec.max_source_len + 1)})
        spans = sorted({attended_span(filled, self.max_len) for filled in range(1, self.max_len + 1)})
        return {"sources": sources, "spans": spans}

    def compile_steps(self, progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> int:
        """Call each step once at every source bucket and span of `step_shapes`, in each variant (BatchEngine.compile_steps),
        so that no client waits on a compilation. Returns how many calls it made."""
        shapes, g, rows = self.step_shapes(), self.g, self.rows

        def encode(width: int) -> tuple:
            ids = np.full((rows, width), g.spec.pad_token_id, np.int64)
            return self._encode(*g._encoder_inputs(ids, np.ones((rows, width), bool), g.spec.pad_token_id))

        def start(width: int) -> None:
            cross, source_mask = encode(width)
            logits, _ = self._start(g.params, g.new_cache(rows), cross, source_mask)
            for settings in VARIANTS:
                self.first_tokens(logits, [settings] * rows)
            for settings in MASKED_VARIANTS:
                self.first_tokens(logits, [settings] * rows, np.full((rows, self.mask_words), -1, np.int32))

        calls: list[Callable[[], Any]] = [lambda w=w: start(w) for w in shapes["sources"]]
        for w in shapes["sources"]:
            calls += self._decode_calls(shapes["spans"], lambda w=w: encode(w))
        return self._compile([*calls, self._compile_count_from], progress, workers)
