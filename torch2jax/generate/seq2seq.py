"""Generation from a converted encoder-decoder (T5, BART, Whisper, VisionEncoderDecoderModel), torch-free.

    g = torch2jax.load("out/t5")                               # a Seq2SeqGenerator
    ids = g.generate(input_ids, attention_mask=mask, max_new_tokens=32)   # [B, 1 + new], from the start token
    ids = whisper.generate(input_features=features)            # [B, mel, frames] log-mel features
    ids = trocr.generate(pixel_values=pixels)                  # [B, C, H, W] images, processed (resized, normalized)
    ids = g.generate(input_ids, attention_mask=mask, num_beams=4)   # beam search, as transformers' (generate/beam.py)

`encode` runs once per call: the source (right-padded, as tokenizers pad for these models) to the
cross-attention keys and values of every decoder layer. `decode` then runs one token per row over the
self-attention cache (state: allocated here, donated to each step) and that cross state (read by every
step, never saved). The decoder starts from `decoder_start_token_id` at slot 0, so there is no decoder
prefill. Sources are right-padded further to a power-of-two bucket (one compiled encode per bucket), and
each step attends to the filled part of the self cache rounded up to a power of two, as for causal LMs.
The token pick, end/pad rules, logits processors and sampling are the causal LM's (generate/loop.py); the processors
see the decoder's sequence (its start token, then the new tokens), as transformers' do for an encoder-decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from ..ir import dtypes
from ..runtime.artifact import ArtifactContents
from ..runtime.model import Model
from . import beam, processors
from .generator import GenerationSpec
from .loop import (
    DECODE_LOOP_OPTIONS,
    MIN_BUCKET,
    NO_TOKEN,
    STEPS_PER_CALL,
    Request,
    TokenLoop,
    attended_span,
    bucket,
    call_entry,
    decode_block,
    finish,
    run_blocks,
)
from .prompts import check_new_tokens_fit_decoder, check_source


@dataclass(frozen=True)
class Seq2SeqSpec(GenerationSpec):
    """GenerationSpec (the decoder's self-attention cache and limits) plus the source side: the manifest's
    `generation` section of a text2text-generation artifact."""

    max_source_len: int
    decoder_start_token_id: int
    cross_shapes: tuple[tuple[int, int], ...]  # per cross tensor (heads, head_dim): [batch, heads, source, head_dim]
    forced_bos_token_id: int | None = None  # transformers' forced-BOS / forced-EOS processors (BART sets the latter)
    forced_eos_token_id: int | None = None
    source_input: str = "input_ids"  # what encode reads: "input_ids" (+ mask), "input_features" or "pixel_values"
    feature_shape: tuple[int, ...] | None = None  # per row, for features (Whisper: mel bins, frames) or pixels (C, H, W)
    fixed_source: bool = False  # encode takes ids of exactly max_source_len (an encoder that branches on the length)

    @property
    def takes_features(self) -> bool:
        return self.source_input == "input_features"

    @property
    def takes_pixels(self) -> bool:
        return self.source_input == "pixel_values"

    @property
    def fixed_shape_source(self) -> bool:
        """Features or pixels: one float array of `feature_shape` per row, no mask, the encoder's output length fixed."""
        return self.source_input in FIXED_SHAPE_SOURCES

    def to_json(self) -> dict:
        out = super().to_json()
        out.update({
            "max_source_len": self.max_source_len,
            "decoder_start_token_id": self.decoder_start_token_id,
            "forced_bos_token_id": self.forced_bos_token_id,
            "forced_eos_token_id": self.forced_eos_token_id,
            "cross": {"shapes": [["batch", h, "source", d] for h, d in self.cross_shapes], "dtype": self.cache_dtype,
                      "donated": False, "computed_by": "encode"},
            "encoder_input": {"name": self.source_input,
                              "shape": ["batch", *self.feature_shape] if self.fixed_shape_source else
                              ["batch", self.max_source_len if self.fixed_source else "source"]},
        })
        return out

    @staticmethod
    def from_json(data: Any) -> Seq2SeqSpec:
        base = GenerationSpec.from_json(data)
        try:
            optional = {name: None if data.get(name) is None else int(data[name])
                        for name in ("forced_bos_token_id", "forced_eos_token_id")}
            encoder_input = data.get("encoder_input") or {"name": "input_ids"}
            optional["source_input"] = str(encoder_input["name"])
            if optional["source_input"] in FIXED_SHAPE_SOURCES:
                optional["feature_shape"] = tuple(int(d) for d in encoder_input["shape"][1:])
            else:  # ["batch", "source"], or ["batch", N] for a source of fixed length
                optional["fixed_source"] = isinstance((encoder_input.get("shape") or [None, None])[1], int)
            return Seq2SeqSpec(
                **{f.name: getattr(base, f.name) for f in fields(GenerationSpec)},
                max_source_len=int(data["max_source_len"]),
                decoder_start_token_id=int(data["decoder_start_token_id"]),
                cross_shapes=tuple((int(shape[1]), int(shape[3])) for shape in data["cross"]["shapes"]),
                **optional,
            )
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise Torch2JaxError(f"the manifest's generation section is malformed ({type(err).__name__}: {err})") from None


FIXED_SHAPE_SOURCES = ("input_features", "pixel_values")


class Seq2SeqGenerator(TokenLoop):
    """An encoder-decoder's encode and decode functions over one params tree, with `generate`."""

    TASK = "text2text-generation"
    ENTRY_POINTS = ("encode", "decode")
    REPR_LIMITS = ("max_source_len", "max_cache_len", "max_batch")

    def __init__(self, encode: Model, decode: Model, spec: Seq2SeqSpec, manifest: dict | None = None,
                 tokenizer_files: dict[str, Path] | None = None, sharding: Any = None):
        self.encode_model, self.decode_model = encode, decode
        self.sharding = sharding  # on a mesh: params as placed there, the caches split by rows and heads
        self.spec = spec
        self.manifest = manifest
        self.tokenizer_files = dict(tokenizer_files or {})
        self._id_dtype = dtypes.jax_dtype("int64")
        self._encode = jax.jit(self._encode_step)
        self._decode = jax.jit(self._decode_steps, donate_argnums=(1, 4),
                               static_argnames=("do_sample", "span", "size", "processing"),
                               compiler_options=DECODE_LOOP_OPTIONS)
        self.steps_per_call = STEPS_PER_CALL  # decode steps per compiled call, as Generator's

    @classmethod
    def from_artifact(cls, contents: ArtifactContents) -> Seq2SeqGenerator:
        models = contents.models
        return cls(models["encode"], models["decode"], Seq2SeqSpec.from_json(contents.manifest.get("generation")),
                   contents.manifest, contents.tokenizer_files, sharding=contents.sharding)

    def entries(self) -> dict[str, Model]:
        """The entry points as the artifact stores them, by name."""
        return {"encode": self.encode_model, "decode": self.decode_model}

    def generate(
        self,
        input_ids: Any = None,
        attention_mask: Any = None,
        *,
        input_features: Any = None,
        pixel_values: Any = None,
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
    ) -> np.ndarray | Iterator[np.ndarray]:
        """[B, S] source ids (right-padded where `attention_mask` is 0) -> [B, 1 + new] decoder ids starting with
        decoder_start_token_id, as transformers' generate returns them for an encoder-decoder: a row that emits
        an end token is padded with `pad_token_id` after it, and generation stops once every row has ended.
        `stream=True` yields each step's [B] new tokens instead. Sampling parameters may be per row.
        A Whisper artifact takes `input_features` [B, mel, frames] instead (transformers' Whisper generate
        returns the same tokens without the start token); a VisionEncoderDecoderModel's (TrOCR, Donut) `pixel_values`
        [B, C, H, W] at the size it was converted for. The generation settings are the causal LM's
        (Generator.generate), over the decoder's sequence: its start token, then the new tokens; `num_beams` > 1 runs
        transformers' beam search as Generator.generate does ([B * num_return_sequences, 1 + new])."""
        if self.spec.takes_pixels:
            ids, mask = check_pixels(pixel_values, input_ids, input_features, self.spec), None
        elif pixel_values is not None:
            raise InputSpecError(f"this artifact's encoder reads {self.spec.source_input}, not pixel_values")
        else:
            ids, mask = check_source(input_ids, attention_mask, input_features, self.spec)
        check_new_tokens_fit_decoder(max_new_tokens, self.spec)
        start = np.full((ids.shape[0], 1), self.spec.decoder_start_token_id, np.int64)
        given = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     typical_p=typical_p, repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                     min_length=min_length, min_new_tokens=min_new_tokens, suppress_tokens=suppress_tokens,
                     begin_suppress_tokens=begin_suppress_tokens, bad_words_ids=bad_words_ids)
        # transformers' begin-suppression waits one token more where a forced BOS fills the first
        begin_at = 1 + (self.spec.forced_bos_token_id is not None)
        beams = beam.beam_settings(dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                                        num_return_sequences=num_return_sequences), self.spec.settings,
                                   do_sample=bool(do_sample if do_sample is not None else self.spec.settings.do_sample),
                                   stream=stream)
        if beams is not None:
            return self._beam_search(ids, mask, start, max_new_tokens, given, beams, eos_token_id, pad_token_id, begin_at)
        request = self._request(given, rng, eos_token_id, pad_token_id, prompt=start, begin_at=begin_at)
        return finish(start, self._steps(ids, mask, max_new_tokens, request), stream)

    # -- the loop ---------------------------------------------------------------------------
    def _encoder_inputs(self, ids: np.ndarray, mask: np.ndarray | None, pad: int = 0) -> tuple:
        """What encode takes: features or pixels cast to the model's dtype, or ids and mask right-padded to a length bucket (to
        max_source_len where the encoder was exported at that length)."""
        if self.spec.fixed_shape_source:
            return (jnp.asarray(ids, dtypes.jax_dtype(self.spec.cache_dtype)),)
        batch, length = ids.shape
        width = self.spec.max_source_len if self.spec.fixed_source else bucket(length, self.spec.max_source_len, MIN_BUCKET)
        padded_ids = np.full((batch, width), pad, np.int64)
        padded_ids[:, :length] = ids
        padded_mask = np.zeros((batch, width), np.int64)
        padded_mask[:, :length] = mask
        return jnp.asarray(padded_ids, self._id_dtype), jnp.asarray(padded_mask, self._id_dtype)

    def _steps(self, ids: np.ndarray, mask: np.ndarray | None, max_new_tokens: int, request: Request) -> Iterator[np.ndarray]:
        batch = ids.shape[0]
        inputs = self._encoder_inputs(ids, mask, request.pad_id)
        cross = self._encode(self.params, *inputs)
        key, do_sample, params = request.key, request.do_sample, request.sampling
        source_mask = jnp.ones((batch, cross[0].shape[2]), bool) if self.spec.fixed_shape_source else inputs[1] != 0
        state = {"cache": self.new_cache(batch), "valid": jnp.zeros((batch, self.spec.max_cache_len), bool),
                 "history": request.history}
        forced = self._forced(max_new_tokens)

        def block(slot: int, token: jax.Array, done: jax.Array, count: int) -> tuple:
            span = attended_span(slot + 1, self.spec.max_cache_len)
            tokens, ran, token, state["cache"], state["valid"], done, state["history"] = self._decode(
                self.params, state["cache"], cross, source_mask, state["valid"], token, jnp.asarray(slot, self._id_dtype), done,
                key, *params, request.eos, request.pad, *forced, jnp.asarray(min(count, span - slot), self._id_dtype),
                do_sample=do_sample, span=span, size=self.steps_per_call, processing=request.processing,
                extra=request.extra, history=state["history"],
            )
            return tokens, ran, token, done

        start = jnp.full((batch,), self.spec.decoder_start_token_id, self._id_dtype)
        return run_blocks(lambda: block(0, start, jnp.zeros((batch,), bool), 1)[2:], block, max_new_tokens, self.steps_per_call)

    def _forced(self, max_new_tokens: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """What transformers' forced-BOS (first new token) and forced-EOS (the last one) processors force, NO_TOKEN for
        none, and the last step's slot."""
        bos, eos = self.spec.forced_bos_token_id, self.spec.forced_eos_token_id
        return tuple(jnp.asarray(NO_TOKEN if t is None else t, self._id_dtype) for t in (bos, eos, max_new_tokens - 1))

    # -- beam search (generate/beam.py) -------------------------------------------------------------------------------
    def _beam_search(self, ids: np.ndarray, mask: np.ndarray | None, start: np.ndarray, max_new_tokens: int, given: dict,
                     beams: beam.Beams, eos_token_id: Any, pad_token_id: Any, begin_at: int) -> np.ndarray:
        """Beam search: one encode per source, its cross state repeated for its beams, then the decode blocks from the
        start token, each step's search and self-cache gathering inside the compiled loop."""
        batch = ids.shape[0]
        beam.check_rows(batch, beams, self.spec.max_batch)
        nb = beams.num_beams
        request = self._request(beam.expand_rows(given, batch, beams), None, eos_token_id, pad_token_id,
                                prompt=np.repeat(start, nb, axis=0), begin_at=begin_at, beams_applied=True)
        eos = np.asarray(request.eos).reshape(-1)
        inputs = self._encoder_inputs(ids, mask, request.pad_id)
        cross = self._encode(self.params, *inputs)
        source_mask = jnp.ones((batch, cross[0].shape[2]), bool) if self.spec.fixed_shape_source else inputs[1] != 0
        repeat, decode = self._beam_steps()
        cross, source_mask = repeat(cross, source_mask, nb=nb)
        tokens_width = beam.width_for(max_new_tokens)
        search = beam.initial_state(batch, beams, tokens_width, beam.fill_token(request.pad_id, tuple(eos.tolist())))
        penalty, max_new = beam.penalties(beams, tokens_width), jnp.asarray(max_new_tokens, jnp.int32)
        cache, valid = self.new_cache(batch * nb), jnp.zeros((batch * nb, self.spec.max_cache_len), bool)
        token, history = jnp.full((batch * nb,), self.spec.decoder_start_token_id, self._id_dtype), request.history
        forced = self._forced(max_new_tokens)
        produced, over = 0, False
        while produced < max_new_tokens and not bool(over):
            span = attended_span(produced + 1, self.spec.max_cache_len)
            count = min(self.steps_per_call, max_new_tokens - produced, span - produced)
            ran, token, cache, valid, history, search, over = decode(
                self.params, cache, cross, source_mask, valid, token, jnp.asarray(produced, self._id_dtype), history, search,
                penalty, request.eos, max_new, *forced, jnp.asarray(count, self._id_dtype), span=span,
                size=self.steps_per_call, processing=request.processing, extra=request.extra, rule=beams.rule)
            produced += int(ran)
        return beam.result(search, start, beams)

    def _beam_steps(self) -> tuple[Callable, Callable]:
        """The compiled repeat of the encoder's outputs for the beams, and the beam decode block, made once."""
        if "_beam_jitted" not in self.__dict__:
            repeat = jax.jit(lambda cross, mask, nb: ([jnp.repeat(c, nb, axis=0) for c in cross], jnp.repeat(mask, nb, axis=0)),
                             static_argnames=("nb",))
            block = jax.jit(self._beam_block, donate_argnums=(1,), static_argnames=("span", "size", "processing", "rule"),
                            compiler_options=DECODE_LOOP_OPTIONS)
            self.__dict__["_beam_jitted"] = (repeat, block)
        return self.__dict__["_beam_jitted"]

    def _beam_block(self, params, cache, cross, source_mask, valid, token, slot, history, search, penalty, eos, max_new,
                    forced_bos, forced_eos, last, count, *, span, size, processing, extra, rule):
        """Up to `count` beam-search decode steps from `slot` (the new tokens so far) in one compiled loop, ending once the
        search is over: (how many ran, the running beams' last tokens, cache, valid, history, search, whether over)."""

        def one(i, token, carry, over):
            cache, valid, history, search = carry
            at = slot + i
            valid = valid.at[:, at].set(True)
            logits, cache = call_entry(self.decode_model, params, token[:, None], at[None], valid[:, :span], source_mask,
                                       list(cache), list(cross))
            length = (at + 1).astype(jnp.int32)
            force = jnp.where(at == 0, forced_bos, NO_TOKEN)
            force = jnp.where((at == last) & (forced_eos != NO_TOKEN), forced_eos, force)
            scores = processors.apply(beam.log_probs(logits), processing, extra["arrays"], history, length, force=force)
            search, rows, new, ended = beam.step(search, scores, at, max_new, penalty, eos, rule=rule)
            cache = [jnp.take(c, rows, axis=0) for c in cache]
            history = processors.record(None if history is None else jnp.take(history, rows, axis=0), length, new)
            return new.astype(token.dtype), (cache, valid, history, search), ended[None]

        _, ran, token, (cache, valid, history, search), over = decode_block(
            one, token, (list(cache), valid, history, search), jnp.zeros((1,), bool), count, size)
        return ran, token, cache, valid, history, search, over[0]

    # -- jitted bodies ----------------------------------------------------------------------
    def _encode_step(self, params, *inputs):
        return list(call_entry(self.encode_model, params, *inputs))

    def _decode_step(self, params, cache, cross, source_mask, valid, token, slot, done, key, temperature, top_k, top_p, eos, pad,
                     force, *, do_sample, span, processing=processors.NONE, extra=None, history=None):
        valid = valid.at[:, slot].set(True)
        logits, cache = call_entry(self.decode_model, params, token[:, None], slot[None], valid[:, :span], source_mask,
                                   list(cache), list(cross))
        length = (slot + 1).astype(jnp.int32)  # the decoder's sequence so far: the start token and `slot` new ones
        token, done = self._pick(logits, key, temperature, top_k, top_p, done, eos, pad, do_sample=do_sample, force=force,
                                 processing=processing, extra=extra, history=history, length=length)
        return token, list(cache), valid, done, processors.record(history, length, token)

    def _decode_steps(self, params, cache, cross, source_mask, valid, token, slot, done, key, temperature, top_k, top_p, eos,
                      pad, forced_bos, forced_eos, last, count, *, do_sample, span, size, processing=processors.NONE,
                      extra=None, history=None):
        """Up to `count` (<= `size`) decode steps in one compiled loop, ending early once every row has: ([size, B]
        tokens, of which the first `ran` are new, then the last token, cache, valid, done and the processors' token
        history). Step i writes slot `slot + i` and samples with `fold_in(key, slot + i)`, as one step per call would."""

        def step(i, token, state, done):
            at = slot + i
            force = jnp.where(at == 0, forced_bos, NO_TOKEN)
            force = jnp.where((at == last) & (forced_eos != NO_TOKEN), forced_eos, force)
            token, cache, valid, done, history = self._decode_step(
                params, state[0], cross, source_mask, state[1], token, at, done, jax.random.fold_in(key, at), temperature,
                top_k, top_p, eos, pad, force, do_sample=do_sample, span=span, processing=processing, extra=extra,
                history=state[2])
            return token, (cache, valid, history), done

        tokens, ran, token, (cache, valid, history), done = decode_block(step, token, (list(cache), valid, history), done,
                                                                         count, size)
        return tokens, ran, token, cache, valid, done, history

    def _prompt_batch(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
        if self.spec.fixed_shape_source:
            what = "audio features" if self.spec.takes_features else "images"
            raise InputSpecError(f"this artifact's encoder reads {what} ({self.spec.source_input}), not token ids: call "
                                 f"generate({self.spec.source_input}=...)")
        ids, mask = right_pad(rows, self.spec.pad_token_id)
        return ids, mask, 1  # the decoder's output starts with its start token

    def _shown(self, prompt: list[int], generated: np.ndarray, new: list[int]) -> list[int]:
        return [int(generated[0]), *new]


def check_pixels(pixel_values: Any, input_ids: Any, input_features: Any, spec: Seq2SeqSpec) -> np.ndarray:
    """A VisionEncoderDecoderModel's images, checked against its Seq2SeqSpec: [B, C, H, W] floats (one [C, H, W] image
    a batch of one) at the size the encoder was exported for (its processor resizes to it)."""
    want = list(spec.feature_shape or ())
    if pixel_values is None or input_ids is not None or input_features is not None:
        raise InputSpecError(f"this artifact's encoder reads images: pass pixel_values [batch, {', '.join(map(str, want))}] "
                             "(as the model's image processor makes them), not input_ids or input_features")
    pixels = np.asarray(pixel_values)
    if pixels.ndim == len(want):
        pixels = pixels[None]
    if list(pixels.shape[1:]) != want or not np.issubdtype(pixels.dtype, np.floating):
        raise InputSpecError(f"pixel_values must be floats of shape [batch, {', '.join(map(str, want))}], got "
                             f"{pixels.dtype}{list(pixels.shape)} (resize the images to the model's image size)")
    if not 1 <= pixels.shape[0] <= spec.max_batch:
        raise InputSpecError(f"batch of {pixels.shape[0]} images: this artifact was converted for 1 to {spec.max_batch} "
                             "(convert again with a larger --max-batch, or split the batch)")
    return pixels


def right_pad(rows: list, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Sources of different lengths as one right-padded batch: (ids [B, S] int64, attention_mask [B, S] bool)."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_token_id, np.int64)
    mask = np.zeros((len(rows), width), bool)
    for r, row in enumerate(rows):
        ids[r, : len(row)], mask[r, : len(row)] = row, True
    return ids, mask
