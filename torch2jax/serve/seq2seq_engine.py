"""The device side of serving an encoder-decoder (T5, BART, Marian, mBART...): continuous batching over one batch.

Each row of the batch holds its own request: its decoder tokens in its own self-attention cache row from slot 0 (the
start token at slot 0, new token i at slot i), and the cross-attention keys and values its source made, in the batch's
cross arrays [rows, heads, width, head_dim] with a source mask [rows, width]. A decode step runs every row at its own
slot: the artifact's decode entry (traced with one slot for all rows, `write_at` [1]) is mapped over the rows with
jax.vmap, each row a batch of one, so a row's step is the step generate runs for it alone, whatever the other rows
hold. (The entry runs from its graph here, runtime/artifact.traceable: the StableHLO's call does not map.)

Requests join at any step, as a causal LM's (serve/engine.py): a group of waiting requests is encoded in one call
(sources right-padded to a power-of-two bucket, as Seq2SeqGenerator.generate pads them), its rows run the decoder's
start token at slot 0 on a scratch cache, and their rows of the scratch cache and of the encoder's output
are copied into the batch's. A row that ends is free at once.

`width` is the widest running source's bucket: the cross arrays widen (zero keys, masked out) when a longer source
joins and narrow when it leaves, so a step attends to no more source columns than its rows need. A free row keeps its
last request's source (or the initial all-visible zeros): its mask always has column 0 set (sources are right-padded),
so no row ever attends to nothing.

The decode loop and the token choice are BatchEngine's: per-row sampling with the request's own seed, log-probabilities,
presence / frequency penalties and structured output's allowed-token masks all apply as they do for a causal LM. The
artifact's forced first token (`forced_bos_token_id`, mBART's and NLLB's target language) is the only token a row's first
choice allows. There is no prefix cache and no LoRA adapters: a request's decoder keys depend on its whole source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..generate.loop import MIN_BUCKET, attended_span, bucket, call_entry
from ..generate.prompts import CLIENT, PromptError, check_max_new_tokens, token_ids
from ..generate.seq2seq import Seq2SeqGenerator, right_pad
from ..ir import dtypes
from ..runtime.artifact import traceable
from .engine import MASKED_VARIANTS, VARIANTS, BatchEngine, Group, Logprobs, Sampling


@dataclass
class SourceGroup(Group):
    """Requests that start together: their right-padded sources, and once encoded, their cross state and scratch cache."""

    cross: list[jax.Array] | None = None  # [k, heads, group width, head_dim] per decoder layer's keys and values
    source_mask: jax.Array | None = None  # [k, group width] bool


class Seq2SeqBatchEngine(BatchEngine):
    """A Seq2SeqGenerator's batch: each row's cross-attention state beside its self-attention cache row."""

    def __init__(self, generator: Seq2SeqGenerator, rows: int, decode_block: int = 16):
        if generator.spec.source_input != "input_ids":  # Whisper's input_features, an image encoder's pixel_values
            raise InputSpecError(f"this encoder-decoder reads {generator.spec.source_input}, not text, and the server "
                                 f"takes text; run Seq2SeqGenerator.generate({generator.spec.source_input}=...) in Python")
        if generator.sharding is not None:
            raise InputSpecError("an encoder-decoder is served from one device: load the artifact without a mesh")
        self._start_batch(generator, rows, decode_block)
        self.decode_model = traceable(generator.decode_model)  # mapped over the rows (_step_logits)
        self.source_lengths = np.zeros(rows, np.int64)  # each running row's source tokens
        self.cross, self.source_mask = self._empty_cross(self._width_for(1))
        self._start = jax.jit(self._start_step)
        self._join = jax.jit(self._join_rows, donate_argnums=(0,))
        self._join_cross = jax.jit(self._join_cross_rows, donate_argnums=(0, 1))
        self._fit = jax.jit(self._fit_width, static_argnames=("width",))
        forced = generator.spec.forced_bos_token_id
        self._forced_first = None if forced is None else int(forced)

    @property
    def width(self) -> int:
        """The source columns the batch's cross arrays hold."""
        return int(self.source_mask.shape[1])

    def _width_for(self, length: int) -> int:
        """The source bucket of `length` tokens (the encoder's own length where it was exported at one)."""
        spec = self.g.spec
        return spec.max_source_len if spec.fixed_source else bucket(length, spec.max_source_len, MIN_BUCKET)

    def _empty_cross(self, width: int) -> tuple[list[jax.Array], jax.Array]:
        """Zero cross keys and values for every row, every column visible (a free row attends to something), placed as
        the steps' outputs are (BatchEngine's cache is)."""
        dtype = dtypes.jax_dtype(self.g.spec.cache_dtype)
        cross = [self.g.carried(jnp.zeros((self.rows, heads, width, dim), dtype)) for heads, dim in self.g.spec.cross_shapes]
        return cross, self.g.carried(jnp.ones((self.rows, width), bool))

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

    # -- prefill: encode the group, run its start tokens ---------------------------------------------------------------
    def start_group(self, rows: list[int], prompts: list[list[int]], max_tokens: list[int],
                    adapter_ids: list[int] | None = None, images: list[Any] | None = None,
                    grids: list[Any] | None = None) -> Group:
        """The members' sources right-padded over a power-of-two number of rows (pad rows get a one-token source, so
        that no row attends to nothing)."""
        k = min(1 << (len(rows) - 1).bit_length(), self.g.spec.max_batch)
        sources = [list(p) for p in prompts] + [[self.g.spec.pad_token_id]] * (k - len(prompts))
        ids, mask = right_pad(sources, self.g.spec.pad_token_id)
        return SourceGroup(list(rows), [len(p) for p in prompts], ids, mask, [0, ids.shape[1]], [],
                           prompts=[list(p) for p in prompts], cached=[0] * len(prompts))

    def prefill_chunk(self, group: Group) -> jax.Array:
        """Encode the group's sources and run its start tokens at slot 0 on a scratch cache: the logits of each member's
        first new token (then the pad rows')."""
        group.cross, group.source_mask = self._encode_group(group.ids, group.mask)
        logits, group.scratch = self._start(self.g.params, self.g.new_cache(group.ids.shape[0]), group.cross,
                                            group.source_mask)
        group.chunk += 1
        return logits

    def _encode_group(self, ids: np.ndarray, mask: np.ndarray) -> tuple[list[jax.Array], jax.Array]:
        """The sources' cross-attention state (the generator's own compiled encode) and which columns are real."""
        inputs = self.g._encoder_inputs(ids, mask, self.g.spec.pad_token_id)
        return self.g._encode(self.g.params, *inputs), inputs[1] != 0

    def first_tokens(self, logits: jax.Array, settings: list[Sampling],
                     allowed: np.ndarray | None = None) -> tuple[np.ndarray, Logprobs | None]:
        if self._forced_first is not None:  # transformers' forced-BOS processor: only that token may come first
            logits = jnp.where(jnp.arange(logits.shape[-1]) == self._forced_first, logits, -jnp.inf)
        return super().first_tokens(logits, settings, allowed)

    def join(self, group: Group, members: list[int]) -> None:
        """Copy these members' rows of the scratch cache and of their cross state into the batch; they decode from slot
        1 (slot 0 holds the start token)."""
        if not members:
            return
        rows = np.full(group.ids.shape[0], self.rows, np.int32)  # pad rows land out of range and are dropped
        rows[members] = [group.rows[m] for m in members]
        self.cache = self._join(self.cache, group.scratch, jnp.asarray(rows))
        self._set_width(max(self.width, int(group.source_mask.shape[1])))
        self.cross, self.source_mask = self._join_cross(self.cross, self.source_mask, group.cross, group.source_mask,
                                                        jnp.asarray(rows))
        for m in members:
            row = group.rows[m]
            self.lengths[row], self.running[row], self.source_lengths[row] = 1, True, group.lengths[m]

    def _set_width(self, width: int) -> None:
        """Widen or narrow the batch's cross arrays to `width` source columns."""
        if width != self.width:
            self.cross, self.source_mask = self._fit(self.cross, self.source_mask, width=width)

    # -- decode ---------------------------------------------------------------------------------------------------------
    def _decode_side(self) -> Any:
        """The cross state, narrowed first to the widest running source's bucket."""
        if self.running.any():
            self._set_width(self._width_for(int(self.source_lengths[self.running].max())))
        return self.cross, self.source_mask

    def free(self, row: int) -> None:
        super().free(row)
        self.source_lengths[row] = 0

    def reset(self) -> None:
        super().reset()
        self.source_lengths[:] = 0
        self.cross, self.source_mask = self._empty_cross(self._width_for(1))

    # -- jitted bodies ---------------------------------------------------------------------------------------------------
    def _start_step(self, params, cache, cross, source_mask):
        """Every row's start token at slot 0 (one slot for the whole group: the decode entry as generate calls it)."""
        rows = source_mask.shape[0]
        start = jnp.full((rows, 1), self.g.spec.decoder_start_token_id, self._ids)
        span = attended_span(1, self.max_len)
        valid = jnp.arange(span)[None, :] < jnp.ones((rows, 1), self._ids)
        logits, cache = call_entry(self.g.decode_model, params, start, jnp.zeros((1,), self._ids), valid, source_mask,
                                   list(cache), list(cross))
        return logits, list(cache)

    def _step_logits(self, params, cache, tokens, lengths, deltas, side, *, span):
        """One decoder step for every row at its own slot `lengths[row]`, attending to its slots up to it and to its own
        source: the decode entry mapped over the rows, each a batch of one. (logits [rows, V], cache)."""
        cross, source_mask = side
        valid = jnp.arange(span)[None, :] <= lengths[:, None]

        def row(token, at, valid, source_mask, cache, cross):
            logits, cache = call_entry(self.decode_model, params, token[None, None], at[None], valid[None],
                                       source_mask[None], [c[None] for c in cache], [c[None] for c in cross])
            return logits[0], [c[0] for c in cache]

        return jax.vmap(row)(tokens, lengths, valid, source_mask, list(cache), list(cross))

    @classmethod
    def _join_cross_rows(cls, cross, source_mask, group_cross, group_mask, rows):
        """The group's cross state (padded to the batch's width, which is at least its own) copied into `rows`."""
        group_cross, group_mask = cls._fit_width(group_cross, group_mask, width=source_mask.shape[1])
        return ([c.at[rows].set(g.astype(c.dtype), mode="drop") for c, g in zip(cross, group_cross)],
                source_mask.at[rows].set(group_mask, mode="drop"))

    @staticmethod
    def _fit_width(cross, source_mask, *, width):
        """Cross arrays and mask cut or padded (zero keys and values, masked out) to `width` source columns."""
        have = source_mask.shape[1]
        if width <= have:
            return [c[:, :, :width] for c in cross], source_mask[:, :width]
        pad = width - have
        return ([jnp.pad(c, ((0, 0), (0, 0), (0, pad), (0, 0))) for c in cross],
                jnp.pad(source_mask, ((0, 0), (0, pad))))

    # -- compiling ahead -------------------------------------------------------------------------------------------------
    def step_shapes(self) -> dict[str, list]:
        """The group sizes, the source buckets a group's encode meets (the batch's widths too) and the decoder's attended
        spans (each decode step compiles per width and span)."""
        spec = self.g.spec
        groups = sorted({min(1 << (n - 1).bit_length(), spec.max_batch) for n in range(1, self.rows + 1)})
        sources = sorted({self._width_for(n) for n in range(1, spec.max_source_len + 1)})
        spans = sorted({attended_span(filled, self.max_len) for filled in range(1, self.max_len + 1)})
        return {"groups": groups, "sources": sources, "spans": spans}

    def compile_steps(self, progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> int:
        """Call each step once at every shape of `step_shapes`, in each variant (BatchEngine.compile_steps), so that no
        client waits on a compilation: a group's encode, start and join at every (group size, source bucket), its cross
        state's join into a batch of every width at least its own, the batch's width changes between any two buckets, and
        the decode loop at every (width, span). Returns how many calls it made."""
        shapes, g, rows = self.step_shapes(), self.g, self.rows
        pad = g.spec.pad_token_id

        def start(k: int, width: int) -> None:
            ids, mask = np.full((k, width), pad, np.int64), np.ones((k, width), bool)
            cross, source_mask = self._encode_group(ids, mask)
            logits, scratch = self._start(g.params, g.new_cache(k), cross, source_mask)
            for settings in VARIANTS:
                self.first_tokens(logits, [settings] * k)
            for settings in MASKED_VARIANTS:
                self.first_tokens(logits, [settings] * k, np.full((k, self.mask_words), -1, np.int32))
            out = jnp.full((k,), rows, jnp.int32)
            jax.block_until_ready(self._join(g.new_cache(rows), scratch, out))
            for wider in [w for w in shapes["sources"] if w >= width]:
                jax.block_until_ready(self._join_cross(*self._empty_cross(wider), cross, source_mask, out))

        def widths(have: int) -> None:
            cross, mask = self._empty_cross(have)
            jax.block_until_ready([self._fit(cross, mask, width=w) for w in shapes["sources"] if w != have])

        calls: list[Callable[[], Any]] = [lambda k=k, w=w: start(k, w) for k in shapes["groups"] for w in shapes["sources"]]
        calls += [lambda w=w: widths(w) for w in shapes["sources"]]
        for w in shapes["sources"]:
            calls += self._decode_calls(shapes["spans"], lambda w=w: self._empty_cross(w))
        return self._compile([*calls, self._compile_count_from], progress, workers)
