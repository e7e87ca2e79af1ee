"""Text generation over a converted causal LM's two entry points, torch-free.

    g = torch2jax.load("out/llm")                              # a Generator
    ids = g.generate(input_ids, attention_mask=mask, max_new_tokens=32)
    ids = g.generate(input_ids, do_sample=True, temperature=0.8, top_p=0.9, rng=jax.random.key(0))
    ids = g.generate(input_ids, repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=5)
    ids = g.generate(input_ids, num_beams=4, length_penalty=1.0)   # beam search, as transformers' (generate/beam.py)
    for step in g.generate(input_ids, stream=True): ...        # one [B] array of new tokens per step
    texts = g.generate_text(["The capital of France is"], max_new_tokens=32)   # what `torch2jax generate` prints

`prefill` runs the whole (left-padded) prompt and fills the KV cache; `decode` runs one token per row.
The cache is state: allocated here for each call, passed to every step and donated, so XLA updates
it in place. Each row's positions come from its attention mask, and the cache slots it may attend
to are tracked in `kv_valid`, so a left-padded batch gives each row what the row alone would get.
Prompts are left-padded further to a length bucket (four per octave: loop.prompt_bucket), so prompts of
nearby lengths share one compiled prefill; each step attends only to the filled part of the cache, rounded
up to a power of two (one compiled decode step per such span). Decode steps run `steps_per_call` at a time inside one
compiled loop, which stops on the device once every row has ended: the host dispatches and reads tokens once per
block instead of once per token, which on a GPU is most of a small model's step time. The checkpoint's generation
config (its sampling settings and logits processors, generate/processors.py) is the artifact's default for every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import Torch2JaxError
from ..ir import dtypes
from ..runtime.artifact import ArtifactContents
from ..runtime.model import Model
from ..runtime.sharding import ShardingPlan
from . import beam, processors, prompt_lookup, sampling
from .loop import (
    DECODE_LOOP_OPTIONS,
    MIN_BUCKET,
    NO_TOKEN,
    STEPS_PER_CALL,
    Request,
    TokenLoop,
    attended_span,
    call_entry,
    decode_block,
    finish,
    prompt_bucket,
    rows_apart,
    run_blocks,
)
from .prompts import check_prompt


@dataclass(frozen=True)
class GenerationSpec:
    """What generation needs beyond the two functions; stored as the manifest's `generation` section."""

    max_cache_len: int
    max_batch: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    cache_shapes: tuple[tuple[int, ...], ...]  # per cache tensor, without the batch dim
    cache_dtype: str
    # the checkpoint's generation config: each generate call's defaults (keyword-only, so subclasses add fields freely)
    settings: processors.GenerationSettings = field(default=processors.GenerationSettings(), kw_only=True)
    # per cache tensor: "kv" (attention slots, written at write_at) or "state" (a recurrent layer's fixed-size state,
    # overwritten by each step), and its dtype; empty: every tensor "kv" of `cache_dtype` (what older artifacts hold)
    cache_kinds: tuple[str, ...] = field(default=(), kw_only=True)
    cache_dtypes: tuple[str, ...] = field(default=(), kw_only=True)

    def tensor_dtypes(self) -> tuple[str, ...]:
        """Each cache tensor's dtype."""
        return self.cache_dtypes or (self.cache_dtype,) * len(self.cache_shapes)

    def to_json(self) -> dict:
        return {
            "max_cache_len": self.max_cache_len,
            "max_batch": self.max_batch,
            "vocab_size": self.vocab_size,
            "eos_token_ids": list(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "cache": {"shapes": [["batch", *s] for s in self.cache_shapes], "dtype": self.cache_dtype, "donated": True,
                      **({"kinds": list(self.cache_kinds)} if self.cache_kinds else {}),
                      **({"dtypes": list(self.cache_dtypes)} if self.cache_dtypes else {})},
            "settings": self.settings.to_json(),
        }

    @staticmethod
    def from_json(data: Any) -> GenerationSpec:
        try:
            cache = data["cache"]
            return GenerationSpec(
                max_cache_len=int(data["max_cache_len"]),
                max_batch=int(data["max_batch"]),
                vocab_size=int(data["vocab_size"]),
                eos_token_ids=tuple(int(t) for t in data["eos_token_ids"]),
                pad_token_id=int(data["pad_token_id"]),
                cache_shapes=tuple(tuple(int(d) for d in shape[1:]) for shape in cache["shapes"]),
                cache_dtype=str(cache["dtype"]),
                settings=processors.GenerationSettings.from_json(data.get("settings")),
                cache_kinds=tuple(str(k) for k in cache.get("kinds", ())),
                cache_dtypes=tuple(str(d) for d in cache.get("dtypes", ())),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise Torch2JaxError(f"the manifest's generation section is malformed ({type(err).__name__}: {err})") from None


class Generator(TokenLoop):
    """A causal LM's prefill and decode functions over one params tree, with `generate`."""

    TASK = "text-generation"
    ENTRY_POINTS = ("prefill", "decode")
    OWN_SETTINGS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")  # prompt-lookup decoding (prompt_lookup.py)

    def __init__(self, prefill: Model, decode: Model, spec: GenerationSpec, manifest: dict | None = None,
                 tokenizer_files: dict[str, Path] | None = None, sharding: ShardingPlan | None = None):
        self.prefill_model, self.decode_model = prefill, decode
        self.sharding = sharding  # on a mesh: params as placed there, the cache split by rows and kv heads
        self.spec = spec
        self.manifest = manifest
        self.tokenizer_files = dict(tokenizer_files or {})  # file name -> path (tokenizer.json, ...)
        self._id_dtype = dtypes.jax_dtype("int64")
        self._prefill = jax.jit(self._prefill_step, donate_argnums=(1,))
        self._decode = jax.jit(self._decode_steps, donate_argnums=(1, 5),
                               static_argnames=("do_sample", "span", "size", "processing"),
                               compiler_options=DECODE_LOOP_OPTIONS)
        self.steps_per_call = STEPS_PER_CALL
        self._first = jax.jit(self._pick_first, static_argnames=("do_sample", "processing"))

    @classmethod
    def from_artifact(cls, contents: ArtifactContents) -> Generator:
        models = contents.models
        return cls(models["prefill"], models["decode"], GenerationSpec.from_json(contents.manifest.get("generation")),
                   contents.manifest, contents.tokenizer_files, sharding=contents.sharding)

    def entries(self) -> dict[str, Model]:
        """The entry points as the artifact stores them, by name."""
        return {"prefill": self.prefill_model, "decode": self.decode_model}

    def prefill(self, cache: list[jax.Array], ids: jax.Array, positions: jax.Array, write_at: jax.Array, valid: jax.Array,
                *extra: Any) -> tuple[jax.Array, list[jax.Array]]:
        """One compiled prefill step over `cache` (donated), as `generate` runs it first: (the ids' last-position logits,
        the cache with their keys and values written at slots `write_at`). The server's engine fills a cache in
        chunks with it."""
        return self._prefill(self.params, cache, ids, positions, write_at, valid, *extra)

    def sharding_report(self) -> Any:
        """Params' specs and bytes per device on the mesh, and the collectives of one compiled decode step."""
        if self.sharding is None:
            raise Torch2JaxError("this generator is not on a mesh: load it with torch2jax.load(path, mesh=mesh)")
        batch = self.sharding.mesh.shape.get(self.sharding.data_axis, 1) if self.sharding.data_axis else 1
        batch = min(batch, self.spec.max_batch)
        ids = jnp.zeros((batch,), self._id_dtype)
        done, valid = jnp.zeros((batch,), bool), jnp.zeros((batch, self.spec.max_cache_len), bool)
        temperature, top_k, top_p = sampling.sampling_params(batch)
        zero = jnp.asarray(0, self._id_dtype)
        lowered = self._decode.lower(self.params, self.new_cache(batch), ids, ids, zero, valid, done, jax.random.key(0),
                                     temperature, top_k, top_p, ids[:1], ids[0], zero, zero, do_sample=False,
                                     span=attended_span(1, self.spec.max_cache_len), size=self.steps_per_call)
        return self.sharding.report(lowered.compile().as_text())

    def generate(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        *,
        max_new_tokens: int = 32,
        do_sample: bool | None = None,
        temperature: Any = None,
        top_k: Any = None,
        top_p: Any = None,
        rng: jax.Array | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        stream: bool = False,
        min_p: Any = None,
        typical_p: Any = None,
        repetition_penalty: Any = None,
        no_repeat_ngram_size: int | None = None,
        min_length: int | None = None,
        min_new_tokens: Any = None,
        suppress_tokens: Sequence[int] | None = None,
        begin_suppress_tokens: Sequence[int] | None = None,
        bad_words_ids: Sequence[Sequence[int]] | None = None,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
        num_return_sequences: int | None = None,
        prompt_lookup_num_tokens: int | None = None,
        max_matching_ngram_size: int | None = None,
    ) -> np.ndarray | Iterator[np.ndarray]:
        """[B, L] prompt ids (left-padded when `attention_mask` marks pads with 0) -> [B, L + new] ids, as
        transformers' generate returns them: a row that emits an end token is padded with `pad_token_id`
        after it, and generation stops early once every row has ended. `stream=True` yields each step's
        [B] new tokens instead. The generation settings (sampling, and the logits processors in transformers' names
        and meaning, docs/api.md) default to the checkpoint's generation config as the artifact stores it; the sampling
        ones, repetition_penalty, min_p, typical_p and min_new_tokens may be per-row sequences. `num_beams` > 1 runs
        transformers' beam search (with length_penalty, early_stopping True / False / "never", num_return_sequences:
        then [B * num_return_sequences, L + new], each prompt's best sequences in turn); it needs
        B * num_beams <= max_batch and takes neither do_sample=True nor stream=True. `prompt_lookup_num_tokens` (with
        `max_matching_ngram_size`, default 2) decodes greedily with drafts copied from the sequence itself, verified
        several tokens per step: the same tokens as plain greedy generate, sooner where the output repeats the prompt
        (generate/prompt_lookup.py; batch 1, no logits processors)."""
        ids, mask = check_prompt(input_ids, attention_mask, self.spec, max_new_tokens)
        given = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     typical_p=typical_p, repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                     min_length=min_length, min_new_tokens=min_new_tokens, suppress_tokens=suppress_tokens,
                     begin_suppress_tokens=begin_suppress_tokens, bad_words_ids=bad_words_ids)
        beams = beam.beam_settings(dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                                        num_return_sequences=num_return_sequences), self.spec.settings,
                                   do_sample=bool(do_sample if do_sample is not None else self.spec.settings.do_sample),
                                   stream=stream)
        if prompt_lookup_num_tokens is not None or max_matching_ngram_size is not None:
            return self._prompt_lookup(ids, mask, max_new_tokens, given, rng, eos_token_id, pad_token_id, stream,
                                       num_beams if num_beams is not None else self.spec.settings.num_beams,
                                       prompt_lookup_num_tokens, max_matching_ngram_size)
        if beams is not None:
            return self._beam_search(ids, mask, max_new_tokens, given, beams, eos_token_id, pad_token_id)
        request = self._request(given, rng, eos_token_id, pad_token_id, prompt=ids, counted_from=np.argmax(mask, axis=1))
        return finish(ids, self._steps(ids, mask, max_new_tokens, request), stream)

    # -- prompt lookup (generate/prompt_lookup.py) ---------------------------------------------------------------------
    @property
    def prompt_lookup_stats(self) -> prompt_lookup.LookupStats:
        """The last prompt-lookup generate call's verify steps, proposed and accepted draft tokens."""
        counts = self.__dict__.get("_lookup_counts")
        return prompt_lookup.LookupStats(*(int(c) for c in np.asarray(counts))) if counts is not None else prompt_lookup.LookupStats()

    def _prompt_lookup(self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, given: dict, rng: Any,
                       eos_token_id: Any, pad_token_id: Any, stream: bool, num_beams: Any, num_tokens: Any,
                       max_ngram: Any) -> np.ndarray | Iterator[np.ndarray]:
        settings = dict(do_sample=bool(given["do_sample"] if given["do_sample"] is not None else self.spec.settings.do_sample),
                        num_beams=num_beams, batch=ids.shape[0], cache_kinds=self.spec.cache_kinds,
                        forced_eos=getattr(self.spec.settings, "forced_eos_token_id", None))
        prompt_lookup.lookup_settings(num_tokens, max_ngram, **settings)  # refused before the request is resolved
        request = self._request(given, rng, eos_token_id, pad_token_id, prompt=ids, counted_from=np.argmax(mask, axis=1))
        k, n = prompt_lookup.lookup_settings(num_tokens, max_ngram, request=request, **settings)
        loops = self.__dict__.setdefault("_lookup_loops", {})
        if (k, n) not in loops:
            loops[k, n] = prompt_lookup.PromptLookup(self, k, n)
        self.__dict__["_lookup_counts"] = None
        steps = loops[k, n].steps(ids, mask, max_new_tokens, request, lambda c: self.__dict__.__setitem__("_lookup_counts", c))
        return finish(ids, steps, stream)

    def padded_prompt(self, ids: np.ndarray, mask: np.ndarray, width: int, pad_id: int) -> tuple:
        """The prompt padded to `width` as the loop prefills it (pad_prompt)."""
        return pad_prompt(ids, mask, width, pad_id, self.spec.max_cache_len)

    # -- the loop ---------------------------------------------------------------------------
    def _steps(self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, request: Request,
               prefill_inputs: Any = None, position_delta: Any = None, unbucketed: int = 0) -> Iterator[np.ndarray]:
        """`prefill_inputs(width)`: further inputs of the prefill step once the prompt is padded to `width` (images);
        `position_delta` [B]: added to each row's decode positions (Qwen2-VL's rope deltas); `unbucketed`: tokens
        every row holds that the length bucket leaves out (a fixed count of image tokens: only the text is padded)."""
        batch, length = ids.shape
        limit = self.spec.max_cache_len - max_new_tokens
        width = unbucketed + prompt_bucket(length - unbucketed, limit - unbucketed, MIN_BUCKET)
        padded_ids, positions, valid = pad_prompt(ids, mask, width, request.pad_id, self.spec.max_cache_len)
        key, do_sample, params = request.key, request.do_sample, request.sampling
        first_position = positions[:, -1] + 1 + (0 if position_delta is None else np.asarray(position_delta))
        state = {"cache": self.new_cache(batch), "valid": self.carried(valid),
                 "position": self.carried(first_position, self._id_dtype), "history": request.history}
        processing = dict(processing=request.processing, extra=request.extra)
        forced_eos = getattr(self.spec.settings, "forced_eos_token_id", None)
        if forced_eos is not None:  # transformers forces it as the last new token (ForcedEOSTokenLogitsProcessor)
            processing["forced"] = (jnp.asarray(forced_eos, self._id_dtype), jnp.asarray(max_new_tokens - 1, self._id_dtype))

        def first():
            logits, state["cache"] = self._prefill(
                self.params, state["cache"], jnp.asarray(padded_ids, self._id_dtype), jnp.asarray(positions, self._id_dtype),
                jnp.arange(width, dtype=self._id_dtype), jnp.asarray(valid[:, :width]),
                *(prefill_inputs(width) if prefill_inputs is not None else ()),
            )
            token, done, state["history"] = self._first(logits, jax.random.fold_in(key, 0), *params, jnp.zeros((batch,), bool),
                                                        request.eos, request.pad, do_sample=do_sample, history=state["history"],
                                                        **processing)
            return token, done

        def advance(produced, token, done, count):
            slot = width + produced - 1  # the slot of the first step's input token
            count = min(count, attended_span(slot + 1, self.spec.max_cache_len) - slot)  # one span per call
            tokens, ran, token, state["cache"], state["valid"], done, state["position"], state["history"] = self._decode(
                self.params, state["cache"], token, state["position"], jnp.asarray(slot, self._id_dtype), state["valid"], done,
                key, *params, request.eos, request.pad, jnp.asarray(produced, self._id_dtype), jnp.asarray(count, self._id_dtype),
                do_sample=do_sample, span=attended_span(slot + 1, self.spec.max_cache_len), size=self.steps_per_call,
                history=state["history"], **processing,
            )
            return tokens, ran, token, done

        return run_blocks(first, advance, max_new_tokens, self.steps_per_call)

    # -- beam search (generate/beam.py) -------------------------------------------------------------------------------
    def _beam_search(self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, given: dict, beams: beam.Beams,
                     eos_token_id: Any, pad_token_id: Any) -> np.ndarray:
        """Beam search over the prompts: one prefill per prompt, its cache rows repeated for its beams, then the decode
        blocks, each step's search and cache-row gathering inside the compiled loop."""
        batch, length = ids.shape
        beam.check_rows(batch, beams, self.spec.max_batch)
        nb = beams.num_beams
        counted_from = np.argmax(mask, axis=1)
        request = self._request(beam.expand_rows(given, batch, beams), None, eos_token_id, pad_token_id,
                                prompt=np.repeat(ids, nb, axis=0), counted_from=np.repeat(counted_from, nb),
                                beams_applied=True)
        eos = np.asarray(request.eos).reshape(-1)
        width = prompt_bucket(length, self.spec.max_cache_len - max_new_tokens, MIN_BUCKET)
        padded_ids, positions, valid = pad_prompt(ids, mask, width, request.pad_id, self.spec.max_cache_len)
        logits, cache = self._prefill(self.params, self.new_cache(batch), jnp.asarray(padded_ids, self._id_dtype),
                                      jnp.asarray(positions, self._id_dtype), jnp.arange(width, dtype=self._id_dtype),
                                      jnp.asarray(valid[:, :width]))
        tokens_width = beam.width_for(max_new_tokens)
        search = beam.initial_state(batch, beams, tokens_width, beam.fill_token(request.pad_id, tuple(eos.tolist())))
        penalty, max_new = beam.penalties(beams, tokens_width), jnp.asarray(max_new_tokens, jnp.int32)
        first, decode = self._beam_steps()
        processing = dict(processing=request.processing, extra=request.extra, rule=beams.rule)
        token, cache, history, search, over = first(logits, cache, request.history, search, penalty, request.eos, max_new,
                                                    **processing)
        valid = self.carried(np.repeat(valid, nb, axis=0))
        position = self.carried(np.repeat(positions[:, -1] + 1, nb), self._id_dtype)
        produced = 1
        while produced < max_new_tokens and not bool(over):
            slot = width + produced - 1
            span = attended_span(slot + 1, self.spec.max_cache_len)
            count = min(self.steps_per_call, max_new_tokens - produced, span - slot)
            ran, token, cache, valid, history, search, over, position = decode(
                self.params, cache, token, position, jnp.asarray(slot, self._id_dtype), valid, history, search, penalty,
                request.eos, max_new, jnp.asarray(produced, self._id_dtype), jnp.asarray(count, self._id_dtype),
                span=span, size=self.steps_per_call, **processing)
            produced += int(ran)
        return beam.result(search, ids, beams)

    def _beam_steps(self) -> tuple[Callable, Callable]:
        """The compiled first beam step (after the prefill) and decode block, made once per generator."""
        if "_beam_jitted" not in self.__dict__:
            self.__dict__["_beam_jitted"] = (
                jax.jit(self._beam_first, static_argnames=("processing", "rule")),
                jax.jit(self._beam_block, donate_argnums=(1,), static_argnames=("span", "size", "processing", "rule"),
                        compiler_options=DECODE_LOOP_OPTIONS))
        return self.__dict__["_beam_jitted"]

    def _beam_first(self, logits, cache, history, search, penalty, eos, max_new, *, processing, extra, rule):
        """The first new token's search over the prefill's [B, V] logits: every beam of a prompt starts from its row."""
        nb = search["scores"].shape[1]  # the beams per prompt
        cache = [jnp.repeat(c, nb, axis=0) for c in cache]
        length = extra["start"]
        scores = processors.apply(beam.log_probs(jnp.repeat(logits, nb, axis=0)), processing, extra["arrays"], history, length)
        search, rows, token, over = beam.step(search, scores, jnp.zeros((), jnp.int32), max_new, penalty, eos, rule=rule)
        cache = [jnp.take(c, rows, axis=0) for c in cache]
        history = processors.record(None if history is None else jnp.take(history, rows, axis=0), length, token)
        return token.astype(self._id_dtype), cache, history, search, over

    def _beam_block(self, params, cache, token, position, slot, valid, history, search, penalty, eos, max_new, first, count,
                    *, span, size, processing, extra, rule):
        """Up to `count` beam-search decode steps in one compiled loop, ending once the search is over: (how many ran,
        the running beams' last tokens, cache, valid, history, search state, whether it is over, positions)."""

        def one(i, token, carry, over):
            cache, valid, history, search = carry
            at = first + i
            valid = valid.at[:, slot + i].set(True)
            logits, cache = causal_lm_step(self.decode_model, params, token[:, None], (position + i)[:, None],
                                           (slot + i)[None], valid[:, :span], cache, *self._decode_inputs(token.shape[0]))
            length = extra["start"] + at.astype(jnp.int32)
            scores = processors.apply(beam.log_probs(logits), processing, extra["arrays"], history, length)
            search, rows, new, ended = beam.step(search, scores, at, max_new, penalty, eos, rule=rule)
            cache = [jnp.take(c, rows, axis=0) for c in cache]
            history = processors.record(None if history is None else jnp.take(history, rows, axis=0), length, new)
            return new.astype(token.dtype), (cache, valid, history, search), ended[None]

        _, ran, token, (cache, valid, history, search), over = decode_block(
            one, token, (list(cache), valid, history, search), jnp.zeros((1,), bool), count, size)
        return ran, token, cache, valid, history, search, over[0], position + ran

    # -- jitted bodies ----------------------------------------------------------------------
    def _prefill_step(self, params, cache, ids, positions, write_at, valid, *extra):
        return causal_lm_step(self.prefill_model, params, ids, positions, write_at, valid, cache, *extra)

    def _decode_inputs(self, batch: int) -> tuple:
        """Inputs the decode step takes after the cache (none for a causal LM)."""
        return ()

    def _pick_first(self, logits, key, temperature, top_k, top_p, done, eos, pad, *, do_sample,
                    processing=processors.NONE, extra=None, history=None, forced=None):
        """The prefill's token (the first new one), with the processors over the prompt: (token, done, history).
        `forced`: (the forced end token, the index of the last new token), or None (forced_eos_at)."""
        length = None if extra is None else extra["start"]
        token, done = self._pick(logits, key, temperature, top_k, top_p, done, eos, pad, do_sample=do_sample,
                                 processing=processing, extra=extra, history=history, length=length,
                                 force=forced_eos_at(forced, 0))
        return token, done, processors.record(history, length, token)

    def _decode_step(self, params, cache, token, position, slot, valid, done, key, temperature, top_k, top_p, eos, pad, *,
                     do_sample, span, processing=processors.NONE, extra=None, history=None, length=None, force=None):
        valid = valid.at[:, slot].set(True)
        logits, cache = causal_lm_step(self.decode_model, params, token[:, None], position[:, None], slot[None], valid[:, :span], cache,
                              *self._decode_inputs(token.shape[0]))
        token, done = self._pick(logits, key, temperature, top_k, top_p, done, eos, pad, do_sample=do_sample,
                                 processing=processing, extra=extra, history=history, length=length, force=force)
        return token, cache, valid, done

    def _decode_steps(self, params, cache, token, position, slot, valid, done, key, temperature, top_k, top_p, eos, pad,
                      first, count, *, do_sample, span, size, processing=processors.NONE, extra=None, history=None,
                      forced=None):
        """Up to `count` (<= `size`) decode steps in one compiled loop, ending early once every row has: ([size, B]
        tokens, of which the first `ran` are new, then the last token, cache, valid, done, position and the processors'
        token history). Step i writes slot `slot + i` and samples with key `fold_in(key, first + i)`, as one step per
        call would; its processors see the prompt and the `first + i` tokens before it."""

        def step(i, token, state, done):
            cache, valid, history = state
            length = None if extra is None else extra["start"] + (first + i).astype(jnp.int32)
            token, cache, valid, done = self._decode_step(
                params, cache, token, position + i, slot + i, valid, done, jax.random.fold_in(key, first + i),
                temperature, top_k, top_p, eos, pad, do_sample=do_sample, span=span, processing=processing, extra=extra,
                history=history, length=length, force=forced_eos_at(forced, first + i))
            return token, (cache, valid, processors.record(history, length, token)), done

        tokens, ran, token, (cache, valid, history), done = decode_block(step, token, (cache, valid, history), done, count, size)
        return tokens, ran, token, cache, valid, done, position + ran, history

    def _prompt_batch(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
        ids, mask = left_pad(rows, self.spec.pad_token_id)
        return ids, mask, ids.shape[1]

    def _shown(self, prompt: list[int], generated: np.ndarray, new: list[int]) -> list[int]:
        return prompt + new


def pad_prompt(ids: np.ndarray, mask: np.ndarray, width: int, pad_id: int, max_cache_len: int) -> tuple:
    """A [B, L] left-padded prompt padded further on the left to `width` (its length bucket): (ids, each token's position
    from the row's first real token, the [B, max_cache_len] slots holding a real token)."""
    batch, length = ids.shape
    padded_ids = np.full((batch, width), pad_id, np.int64)
    padded_ids[:, width - length:] = ids
    valid = np.zeros((batch, max_cache_len), bool)
    valid[:, width - length:width] = mask
    positions = np.maximum(np.cumsum(valid[:, :width], axis=1) - 1, 0)
    return padded_ids, positions, valid


def left_pad(rows: list, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts of different lengths as one left-padded batch: (ids [B, L] int64, attention_mask [B, L] bool)."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_token_id, np.int64)
    mask = np.zeros((len(rows), width), bool)
    for r, row in enumerate(rows):
        ids[r, width - len(row):], mask[r, width - len(row):] = row, True
    return ids, mask


def causal_lm_step(model: Model, params: dict, ids: jax.Array, positions: jax.Array, write_at: jax.Array, valid: jax.Array,
                   cache: list[jax.Array], *extra: Any) -> tuple[jax.Array, list[jax.Array]]:
    """One call of a causal LM's step (prefill or decode) inside a jitted function: (last-position logits, new cache);
    on a mesh the new cache stays where the old one was placed, so donating it reuses its buffers. `write_at` is [T]
    (every row writes the same slots) or [B, T] (each row its own: only for a step whose rows write apart)."""
    if rows_apart(model):
        write_at = jnp.broadcast_to(write_at, ids.shape)
    elif write_at.ndim == 2:
        raise Torch2JaxError("this artifact's step writes every row at the same cache slots (it was converted before "
                             "rows could write apart): convert it again to run rows at their own slots")
    logits, new_cache = call_entry(model, params, ids, positions, write_at, valid, list(cache), *extra)
    if model.sharding is not None:  # the cache stays where it was placed, so donation reuses its buffers
        new_cache = [jax.lax.with_sharding_constraint(c, model.sharding.cache_sharding(c.shape)) for c in new_cache]
    return logits, list(new_cache)


def forced_eos_at(forced: tuple[jax.Array, jax.Array] | None, index: Any) -> jax.Array | None:
    """The token forced as new token `index` (0-based): the forced end token at the last one, NO_TOKEN before it;
    None where the generation config forces none."""
    if forced is None:
        return None
    token, last = forced
    return jnp.where(index == last, token, jnp.asarray(NO_TOKEN, token.dtype))
