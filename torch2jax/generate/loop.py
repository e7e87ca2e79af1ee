"""What every generator shares, torch-free: the request's settings, picking each step's token with
transformers' end/pad rules, the stop rule, the result's shape, and text in, text out (`generate_text`).

A causal LM (generate/generator.py) and an encoder-decoder (generate/seq2seq.py) differ in how they reach each
step's logits; from the logits on they behave alike: the generation config's logits processors
(generate/processors.py: the artifact's defaults, overridable per call), greedy or sampled (generate/sampling.py), a
row that has emitted an end token gets `pad_token_id` from then on, and the loop stops once every row has ended or
`max_new_tokens` are out. The compiled loop of decode steps (`decode_block`) is also the server's
(serve/engine.py), over its shared batch cache.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from ..ir import dtypes, structure
from ..runtime.artifact import ArtifactContents
from ..runtime.model import Model
from . import beam, processors, sampling
from .processors import Processing

NO_TOKEN = -1  # `force` when no token is forced
MIN_BUCKET = 16  # the shortest prompt / source length a step is compiled for
MIN_SPAN = 64  # the fewest cache slots a decode step attends to
STEPS_PER_CALL = 16  # decode steps per compiled call (a generator's `steps_per_call`)
# XLA options of the compiled decode loops. Loop-invariant code motion would hoist the weights' conversions
# (bfloat16 -> float32, int8 dequantization) out of the loop, making a float32 copy of every weight per call that
# each step then reads: on this CPU bfloat16 decode fell from 98 to 5 tok/s at one step per call, 129 to 37 at 16.
DECODE_LOOP_OPTIONS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


@dataclass(frozen=True)
class Request:
    """One generate call's settings as the jitted steps take them."""

    do_sample: bool
    sampling: tuple[jax.Array, jax.Array, jax.Array]  # per-row temperature, top_k, top_p
    key: jax.Array
    eos: jax.Array  # the end token ids
    pad: jax.Array
    pad_id: int  # pad, on the host (reading `pad` back would wait for the device)
    processing: Processing = processors.NONE  # which logits processors run (static)
    extra: Any = None  # what they and the min-p / typical-p warpers read: {"arrays", "warpers", "start"}
    history: jax.Array | None = None  # [B, max_cache_len] int32: the prompt, then each new token (when a processor reads it)


@dataclass(frozen=True)
class Completion:
    """One prompt's result as `torch2jax generate` prints it."""

    ids: list[int]  # a causal LM: the prompt, then its new tokens; an encoder-decoder: its start token, then its new
    # tokens; a reply to images: the new tokens alone. Each up to and including the first end token.
    new_tokens: int  # how many of `ids` were generated
    text: str | None = None  # `ids` decoded without special tokens, for a text prompt


class TokenLoop:
    """The base of the generators: settings, the token pick, the loop; subclasses supply the steps."""

    TASK: str  # the manifest's task of this kind of generator
    ENTRY_POINTS: tuple[str, ...]  # the artifact's entry points it is built from
    spec: Any
    sharding: Any = None
    REPR_LIMITS: tuple[str, ...] = ("max_cache_len", "max_batch")  # the spec's limits __repr__ shows
    OWN_SETTINGS: tuple[str, ...] = ()  # generate's settings of this kind of generator only, which `complete` passes on
    tokenizer_files: dict[str, Path]
    _id_dtype: Any  # token ids' dtype (int64, or int32 without x64), set by the subclass

    @classmethod
    def from_artifact(cls, contents: ArtifactContents) -> TokenLoop:
        """The generator of an artifact runtime/artifact.read has read (its entry points, sections and tokenizer files)."""
        raise NotImplementedError

    def manifest_sections(self) -> dict:
        """What the artifact's manifest says of this generator beyond its entry points: its task and generation spec."""
        return {"task": self.TASK, "generation": self.spec.to_json()}

    @property
    def id_dtype(self) -> Any:
        """The dtype of token ids the steps take and return (int64, or int32 without JAX's x64)."""
        return self._id_dtype

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (`tokenizers.Tokenizer`, torch-free), when tokenizer.json came with the model."""
        path = self.tokenizer_files.get("tokenizer.json")
        if path is None:
            raise Torch2JaxError("this model has no tokenizer (no tokenizer.json in its directory): pass token ids instead")
        read = self.__dict__.get("_tokenizer_read")  # (path, tokenizer): read once per file, not on every access
        if read is not None and read[0] == path:
            return read[1]
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise Torch2JaxError("reading the tokenizer needs the tokenizers package: pip install 'torch2jax-aot[text]'") from None
        tokenizer = Tokenizer.from_file(str(path))
        self.__dict__["_tokenizer_read"] = (path, tokenizer)
        return tokenizer

    def entries(self) -> dict[str, Model]:
        """The entry points as the artifact stores them, by name (the first one's params are the generator's)."""
        raise NotImplementedError

    @property
    def params(self) -> dict:
        return next(iter(self.entries().values())).params

    def __repr__(self) -> str:
        count = sum(int(np.prod(np.shape(p))) for p in self.params.values())
        limits = "".join(f" {name}={getattr(self.spec, name)}" for name in self.REPR_LIMITS)
        return f"<torch2jax.{type(self).__name__} params={count:,}{limits} vocab={self.spec.vocab_size}>"

    # -- text in, text out: what `torch2jax generate` prints ------------------------------------------------------
    def generate_text(self, prompts: Sequence[str], *, images: Sequence[Any] = (), max_new_tokens: int = 32,
                      rng: jax.Array | None = None, **settings: Any) -> list[str]:
        """Each prompt generated on, as text: what `torch2jax generate --prompt` prints. The prompts are tokenized
        with the model's tokenizer (the `tokenizers` package) and run as one batch; each row is cut after its first
        end token and decoded without special tokens. A causal LM gives each prompt with its continuation, an
        encoder-decoder its output; with `images` (an image-text-to-text model: paths or PIL images, in order, and
        one prompt) the reply alone. `settings`: generate's generation settings (do_sample, temperature, top_k, top_p,
        min_p, typical_p, repetition_penalty, no_repeat_ngram_size, min_length, min_new_tokens, suppress_tokens,
        begin_suppress_tokens, bad_words_ids; num_beams, length_penalty, early_stopping, num_return_sequences for beam
        search; a causal LM's prompt_lookup_num_tokens and max_matching_ngram_size), the artifact's defaults where not
        given."""
        return [c.text for c in self.complete(prompts, images=images, max_new_tokens=max_new_tokens, rng=rng, **settings)]

    def complete(self, prompts: Sequence[str] | Sequence[Sequence[int]], *, images: Sequence[Any] = (),
                 max_new_tokens: int = 32, rng: jax.Array | None = None, **settings: Any) -> list[Completion]:
        """`generate_text` for texts or token id lists (`torch2jax generate --ids`), one Completion per prompt (with
        num_return_sequences, that many per prompt, in turn): its ids (and text, for a text prompt) as printed, and how
        many tokens it generated."""
        known = processors.SETTING_NAMES + beam.BEAM_NAMES + self.OWN_SETTINGS
        unknown = set(settings) - set(known)
        if unknown:
            raise InputSpecError(f"unknown generation settings {sorted(unknown)}; known: {', '.join(known)}")
        options = dict(max_new_tokens=max_new_tokens, rng=rng, **settings)
        if isinstance(prompts, str):
            raise InputSpecError("give the prompts as a list (one text per row), not one string")
        if len(images):
            return [self._reply_to_images(prompts, list(images), options)]
        texts = [isinstance(p, str) for p in prompts]
        if not texts or (any(texts) and not all(texts)):
            raise InputSpecError("give at least one prompt, all as texts or all as token id lists")
        tokenizer = self.tokenizer if all(texts) else None
        rows = [tokenizer.encode(p).ids for p in prompts] if tokenizer is not None else [[int(t) for t in p] for p in prompts]
        if any(not row for row in rows):
            raise InputSpecError("a prompt has no tokens")
        ids, mask, first_new = self._prompt_batch(rows)
        out = self.generate(ids, attention_mask=mask, **options)
        per_prompt = out.shape[0] // len(rows)  # num_return_sequences, each prompt's rows in turn
        completions = []
        for r, generated in enumerate(out):
            row = rows[r // per_prompt]
            new = until_end([int(t) for t in generated[first_new:]], self.spec.eos_token_ids)
            shown = self._shown(row, generated, new)
            completions.append(Completion(shown, len(new), tokenizer.decode(shown) if tokenizer is not None else None))
        return completions

    def _prompt_batch(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
        """Prompts of different lengths as one padded batch for `generate`: (ids, mask, the column of the first new token)."""
        raise NotImplementedError

    def _shown(self, prompt: list[int], generated: np.ndarray, new: list[int]) -> list[int]:
        """A row's ids as `complete` gives them, from its prompt, its row of `generate`'s output and its new tokens."""
        raise NotImplementedError

    def _reply_to_images(self, prompts: Sequence[Any], images: Sequence[Any], options: dict) -> Completion:
        raise InputSpecError(f"a {self.TASK} model takes no images: images need an image-text-to-text artifact")

    def new_cache(self, batch: int) -> list[jax.Array]:
        """A zeroed self-attention KV cache for `batch` rows (slots not yet written are masked, so reuse needs no
        zeroing); on a mesh, split by rows and kv heads. Placed on its device like the params (committed), so that a
        step called with a new cache and one with a cache a step returned are the same compiled step."""
        makers = self.__dict__.setdefault("_cache_makers", {})
        if batch not in makers:
            makers[batch] = self._cache_maker(batch)
        return makers[batch]()

    def _cache_maker(self, batch: int) -> Callable[[], list[jax.Array]]:
        """The cache's zeros made in one compiled call (one call per array took 1.1 ms for 16 arrays, where a small
        model's prefill takes 60)."""
        types = [dtypes.jax_dtype(d) for d in self.spec.tensor_dtypes()]  # a recurrent state's may differ (float32)
        shapes = [(batch, *shape) for shape in self.spec.cache_shapes]
        if self.sharding is None:
            places = [jax.sharding.SingleDeviceSharding(jax.devices()[0])] * len(shapes)
        else:
            places = [self.sharding.cache_sharding(shape) for shape in shapes]
        return jax.jit(lambda: [jnp.zeros(shape, dtype) for shape, dtype in zip(shapes, types)], out_shardings=places)

    def carried(self, value: Any, dtype: Any = None) -> jax.Array:
        """A loop-carried input's first value, placed as the steps' outputs are (committed, like `new_cache`), so
        that the first step and the later ones are one compiled step."""
        return jnp.asarray(value, dtype) if self.sharding is not None else jax.device_put(jnp.asarray(value, dtype), jax.devices()[0])

    def _request(self, given: dict, rng: jax.Array | None, eos_token_id: int | list[int] | None, pad_token_id: int | None,
                 *, prompt: np.ndarray, counted_from: np.ndarray | None = None, begin_at: int | None = None,
                 beams_applied: bool = False) -> Request:
        """Validate the call's generation settings (`given`: name -> value, None for the artifact's default) and resolve
        the end/pad tokens (the artifact's unless given). `prompt` [B, L]: the sequence before the first new token (a
        causal LM's prompt as given, an encoder-decoder's start token), which the processors' history starts with;
        `counted_from` [B]: each row's left padding, which repetition_penalty skips; `begin_at`: the length at which
        begin_suppress_tokens applies (default L). `beams_applied`: the caller runs beam search where asked (generate/
        beam.py); a generator that does not refuses beam settings given and warns for the artifact's."""
        batch, length = prompt.shape
        asked = [f"{name}={given[name]!r}" for name in ("num_beams", "num_return_sequences")
                 if given.get(name) is not None and given[name] != 1]
        if asked and not beams_applied:
            raise InputSpecError(f"{', '.join(asked)}: beam search is not supported by {self.TASK} generation; "
                                 "leave these settings out (one sequence per prompt, greedy or sampled)")
        given = {name: v for name, v in given.items() if name not in beam.BEAM_NAMES}
        eos = self.spec.eos_token_ids if eos_token_id is None else tuple(np.atleast_1d(eos_token_id).astype(int).tolist())
        pad = self.spec.pad_token_id if pad_token_id is None else int(pad_token_id)
        defaults = getattr(self.spec, "settings", processors.GenerationSettings())
        defaults.warn_not_applied(stacklevel=4)
        if not beams_applied and (defaults.num_beams or 1) > 1:
            warnings.warn(f"the model's generation config sets num_beams={defaults.num_beams}, which {self.TASK} generation "
                          "does not apply (it decodes one sequence per prompt): its tokens can differ from transformers' "
                          "generate", UserWarning, stacklevel=3)
        resolved = processors.resolve(given, defaults, batch, self.spec.vocab_size, eos, length,
                                      np.zeros(batch, np.int64) if counted_from is None else counted_from,
                                      length if begin_at is None else begin_at)
        do_sample = resolved.do_sample
        params = (sampling.sampling_params(batch, resolved.temperature, resolved.top_k, resolved.top_p) if do_sample
                  else sampling.sampling_params(batch))
        if do_sample and rng is None:
            rng = jax.random.key(int.from_bytes(os.urandom(4), "little"))  # pass rng= for reproducible samples
        history = None
        if resolved.processing.history:
            full = np.zeros((batch, max(self.spec.max_cache_len, length + 1)), np.int32)
            full[:, :length] = prompt
            history = self.carried(full, jnp.int32)
        extra = {"arrays": resolved.arrays, "warpers": resolved.warpers if do_sample else {},
                 "start": jnp.asarray(length, jnp.int32)}
        return Request(do_sample, params, jax.random.key(0) if rng is None else rng,
                       jnp.asarray(eos, self._id_dtype), jnp.asarray(pad, self._id_dtype), pad,
                       resolved.processing, extra, history)

    def _pick(self, logits, key, temperature, top_k, top_p, done, eos, pad, *, do_sample, force=None,
              processing: Processing = processors.NONE, extra=None, history=None, length=None):
        """[B] tokens from [B, V] logits, and which rows have ended. The logits processors of `processing` run first, on
        the sequence's `length` tokens so far (`history`); `force` (a token id, or NO_TOKEN) replaces every row's
        choice, as transformers' forced-BOS/EOS processors do; a row that has ended gets `pad`."""
        warpers = {}
        if extra is not None:
            logits = processors.apply(logits, processing, extra["arrays"], history, length)
            warpers = extra["warpers"]
        token = sampling.pick(logits, key, temperature, top_k, top_p, do_sample=do_sample, **warpers).astype(self._id_dtype)
        if force is not None:
            token = jnp.where(force != NO_TOKEN, force.astype(self._id_dtype), token)
        token = jnp.where(done, pad, token)
        done = done | jnp.isin(token, eos)
        if self.sharding is not None:  # whole on every device: each process (one per host) reads the tokens
            token, done = (jax.lax.with_sharding_constraint(v, self.sharding.replicated()) for v in (token, done))
        return token, done


def until_end(tokens: list[int], end_tokens: Sequence[int]) -> list[int]:
    """`tokens` up to and including the first end token."""
    ended = next((i for i, t in enumerate(tokens) if t in end_tokens), None)
    return tokens if ended is None else tokens[: ended + 1]


def run_blocks(first: Callable[[], tuple], advance: Callable[[int, jax.Array, jax.Array, int], tuple],
               max_new_tokens: int, block: int) -> Iterator[np.ndarray]:
    """Yield each step's [B] tokens: `first()` -> (token, done); `advance(produced, token, done, count)` runs up to
    `count` decode steps on the device -> ([block, B] tokens, how many ran, the last token, done). Stops after
    `max_new_tokens` or once every row has ended."""
    token, done = first()
    yield np.asarray(token)
    produced = 1
    while produced < max_new_tokens and not np.asarray(done).all():
        tokens, ran, token, done = advance(produced, token, done, min(block, max_new_tokens - produced))
        ran = int(ran)
        yield from np.asarray(tokens)[:ran]
        produced += ran


def decode_block(step: Callable, token: jax.Array, state: Any, done: jax.Array, count: jax.Array, size: int) -> tuple:
    """Up to `count` (<= `size`) calls of `step(i, token, state, done) -> (token, state, done)` in one compiled loop,
    ending once `done` is all True (generate: [B], every row has ended; the server's batch: one flag, a row has ended
    and its place can be given to a new request): ([size, B] tokens, of which the first `ran` are new, ran, token,
    state, done)."""

    def more(carry):
        return (carry[0] < count) & ~carry[3].all()

    def body(carry):
        i, token, state, done, tokens = carry
        token, state, done = step(i, token, state, done)
        return i + 1, token, state, done, tokens.at[i].set(token)

    tokens = jnp.zeros((size, *token.shape), token.dtype)
    ran, token, state, done, tokens = jax.lax.while_loop(more, body, (jnp.zeros((), count.dtype), token, state, done, tokens))
    return tokens, ran, token, state, done


def finish(prefix: np.ndarray, steps: Iterator[np.ndarray], stream: bool) -> np.ndarray | Iterator[np.ndarray]:
    """The steps themselves when streaming, else [B, prefix + new] ids."""
    if stream:
        return steps
    new = list(steps)
    return np.concatenate([prefix, np.stack(new, axis=1).astype(prefix.dtype)], axis=1) if new else prefix


def call_entry(model: Model, params: dict, *args: Any) -> Any:
    """One entry point of the artifact called inside a jitted step: positional args in, its outputs' structure out."""
    leaves = structure.flatten((args, {}), model.graph.in_spec, "inputs")
    if model.sharding is not None:
        leaves = model.sharding.constrain_inputs(model.graph, leaves)
    outputs, _ = model._run(params, leaves, None)
    return structure.unflatten(model.graph.out_spec, outputs)


def rows_apart(model: Model) -> bool:
    """Whether a causal LM's step takes each row's own cache slots (`write_at` [B, T], hf/steps/causal_lm.py), so rows
    of a batch may hold their tokens at different slots (the server's per-row cache); older artifacts' steps take one
    [T] for every row."""
    inputs = model.graph.user_inputs
    return len(inputs) > 2 and inputs[2].meta is not None and len(inputs[2].meta.shape) == 2


def bucket(length: int, limit: int, smallest: int) -> int:
    """The length a step is compiled for: the next power of two (at least `smallest`) that fits `limit`, else `length`."""
    size = max(smallest, 1 << (length - 1).bit_length())
    return size if size <= limit else length


PROMPT_BUCKETS_PER_OCTAVE = 4


def prompt_bucket(length: int, limit: int, smallest: int) -> int:
    """The width a prompt is left-padded to for `generate`'s prefill: the next of 4 sizes per octave (1.25, 1.5, 1.75
    and 2 times a power of two; at least `smallest`) that fits `limit`, else `length`. Padding costs at most a quarter
    of the prompt's prefill, where a power of two costs up to all of it (a 576-token image's prompt padded to 1024),
    for up to four compiled prefills per octave of prompt lengths, each compiled when first met."""
    if length <= smallest:
        size = smallest
    else:
        half = 1 << ((length - 1).bit_length() - 1)  # the power of two below length
        step = max(half // PROMPT_BUCKETS_PER_OCTAVE, 1)
        size = half + -(-(length - half) // step) * step
    return size if size <= limit else length


def attended_span(filled: int, max_cache_len: int) -> int:
    """How much of the cache a decode step attends to: the filled slots rounded up to a power of two (at least
    MIN_SPAN), so a step costs O(tokens so far) and there are only log2(max_cache_len) compiled decode steps."""
    return min(max_cache_len, max(MIN_SPAN, 1 << (filled - 1).bit_length()))
