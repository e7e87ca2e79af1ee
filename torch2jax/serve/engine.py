"""The device side of continuous batching: one KV cache of `rows` rows that requests join and leave.

The artifact's step writes each row's new tokens at that row's own cache slots (`write_at [B, T]`), so every row holds
its request's tokens from slot 0, token p at slot p (its position), whatever the other rows hold:

* a decode step writes each running row's next token at the slot after its own last one, and attends, for each row,
  to that row's own tokens only (`kv_valid`); nothing is ever moved, and a row that ends is free at once;
* a new request is prefilled (in chunks, left-padded with the others that start with it) into a scratch cache of its
  own, its real tokens written from slot 0 (a pad column writes at a slot past the row's real tokens, which later
  tokens overwrite), then its row is copied into the batch cache as it is;
* the step's attended span is the longest running row's length rounded up to a power of two (a dense step computes
  every row over one span: rows of any lengths share a batch, but a short row beside a long one pays the long one's
  span until it ends).

Artifacts converted before rows could write apart (their step takes one `write_at [T]` for every row) are refused with
the reason: convert them again.

A group's rows are prefilled in chunks of `chunk` tokens each, halved while the group's chunk would exceed the per-step
budget of prompt tokens (`prefill_tokens`, at least MIN_BUCKET per row): one prefill chunk runs between two decode steps
of the running rows, so the budget bounds how much a prompt arriving delays their next token.

With a prefix cache (serve/prefix_cache.py), the leading chunks whose tokens every member of a group finds cached are
not run: those members' cached blocks are copied into the scratch cache instead, and after the group's last chunk the
full blocks of its prompts that the cache lacks are kept for later requests.

A row never holds more than prompt + max_tokens - 1 tokens, which the scheduler's admission check keeps within the
cache.

While no request waits and none is being prefilled, decode steps run up to `decode_block` at a time in one
compiled loop, which ends on the device as soon as a row reaches its length or an end token (its row can then be
given to a new request): the host dispatches and reads tokens once per block instead of once per token.

With LoRA adapters (`adapters`, finetune.side_path.RowAdapters over the generator's entries) every row carries the
adapter its request chose (`adapter_ids`, BASE for none), and the prefill and decode steps run the entries' graphs with
the adapters beside the weights, each row through its own: rows of different adapters share a batch. Without adapters
the steps are the generator's own, unchanged.

With a vision-language artifact each request may bring the feature rows its prompt's image tokens take (its images,
encoded before it queued): a group's members' rows are concatenated (padded to a power of two) and every chunk gives
the step its columns' feature index; where a prompt's tokens attend to later ones (Gemma 3's image blocks, PaliGemma's
prefix) the group is prefilled in one chunk, and for the Qwen2-VL family each member's 3-D position offsets come from its
own images' grids and its decode positions continue from its own delta. Such artifacts have no prefix cache (an image
token's keys depend on its image, which block names do not hold).

Requests that ask for log-probabilities or OpenAI's presence / frequency penalties ("extras", Sampling.extras) make the
batch's steps run a variant that computes them on the device: the raw distribution's log_softmax and its TOP_LOGPROBS
most likely tokens (each request keeps the first k on the host), and the penalties from a [rows, vocab] count of each
row's generated tokens, carried from step to step (`seen`). A batch without such a request runs the steps without them.

Requests with structured output (OpenAI's `response_format`, serve/structured.py) have each of their tokens chosen among
the ones their grammar allows: the step takes an allowed-token bitmask [rows, ceil(vocab / 32)] int32 (bit j % 32 of word
j // 32 set: token j allowed; every bit set for the other rows), applied to the logits after the penalties and before
the choice. The host advances each grammar with the chosen token before the next mask exists, so a batch with such a row
decodes one step per call, in the extras variant with the mask (the log-probabilities stay those of the raw
distribution); batches without one run exactly the steps they ran before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..generate import sampling
from ..generate.generator import Generator, causal_lm_step
from ..generate.image_positions import image_index, rope_index
from ..generate.loop import DECODE_LOOP_OPTIONS, MIN_BUCKET, attended_span, bucket, decode_block, rows_apart
from ..generate.prompts import CLIENT, check_prompt
from ..ir import dtypes
from ..runtime.collector import return_freed_memory
from .prefix_cache import BLOCK_SIZE, PrefixCache

SEED_LIMIT = 2**31  # seeds are taken modulo this (jax.random.key of a non-negative int32)
TOP_LOGPROBS = 20  # the most likely tokens a step reports (OpenAI's largest top_logprobs); a request takes its first k
MAX_PENALTY = 2.0  # presence / frequency penalties lie in [-2, 2], as OpenAI allows
BASE = -1  # a row's adapter id for the base model alone (finetune.side_path.NO_ADAPTER)


@dataclass
class Sampling:
    """One request's token choice: greedy at temperature 0, else transformers' sampling with its own seed; OpenAI's
    presence and frequency penalties applied to the logits first (logits[j] -= c[j] * frequency + (c[j] > 0) * presence,
    c[j] the times token j was generated so far); `logprobs` (None: none) asks for each token's log-probability and the
    `logprobs` most likely tokens' (of the raw distribution: log_softmax of the model's logits, as vLLM reports them by
    default, before penalties, temperature and top-k/top-p)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature > 0:  # the same checks and messages as Generator.generate
            sampling.sampling_params(1, self.temperature, self.top_k, self.top_p)
        elif self.temperature < 0:
            raise InputSpecError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        self.seed = int(self.seed) % SEED_LIMIT
        if self.logprobs is not None and not 0 <= self.logprobs <= TOP_LOGPROBS:
            raise InputSpecError(f"logprobs must be None or an integer in [0, {TOP_LOGPROBS}], got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN fails too
                raise InputSpecError(f"{name} must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value!r}")

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def extras(self) -> bool:
        """Whether this request needs the step variant that reports log-probabilities and applies penalties."""
        return self.logprobs is not None or self.penalized


@dataclass
class Logprobs:
    """What a step variant with extras reports for every row (leading dims: [steps, rows] or [rows]): the chosen token's
    log-probability and the TOP_LOGPROBS most likely tokens (most likely first) with theirs, all of the raw distribution
    (log_softmax of the model's logits)."""

    chosen: np.ndarray  # [..., rows] float32
    top_ids: np.ndarray  # [..., rows, TOP_LOGPROBS] int32
    top: np.ndarray  # [..., rows, TOP_LOGPROBS] float32

    def at(self, *index: int, k: int = TOP_LOGPROBS) -> tuple[float, list[tuple[int, float]]]:
        """(the chosen token's log-probability, the k most likely (token, log-probability)) at one row (of one step)."""
        ids, top = self.top_ids[index][:k], self.top[index][:k]
        return float(self.chosen[index]), [(int(t), float(v)) for t, v in zip(ids, top)]


# one request of each step variant the scheduler can run: greedy or sampled, each without or with extras
# (log-probabilities and penalties)
VARIANTS = (Sampling(), Sampling(1.0), Sampling(logprobs=0, presence_penalty=0.5),
            Sampling(1.0, logprobs=0, presence_penalty=0.5))
# and of the variant with an allowed-token mask (structured output), which is the extras variant with the mask
MASKED_VARIANTS = (Sampling(), Sampling(1.0))


def mask_words(vocab_size: int) -> int:
    """The int32 words of one row's allowed-token bitmask: one bit per token."""
    return (vocab_size + 31) // 32


def allowed_bits(mask: jax.Array, vocab_size: int) -> jax.Array:
    """[rows, words] int32 bitmask -> [rows, vocab] bool: token j is allowed when bit j % 32 of word j // 32 is set."""
    j = jnp.arange(vocab_size, dtype=jnp.int32)
    return (jnp.right_shift(mask[:, j // 32], j % 32) & 1).astype(bool)


@dataclass
class Group:
    """Requests prefilled together: their left-padded prompts, the scratch cache and the chunk to run next."""

    rows: list[int]  # batch rows the members will take
    lengths: list[int]  # prompt lengths
    ids: np.ndarray  # [k, P] left-padded (k a power of two, pad rows beyond the members)
    mask: np.ndarray  # [k, P] bool
    bounds: list[int]  # chunk edges 0 = b0 < b1 < ... = P
    scratch: list[jax.Array]
    chunk: int = 0  # chunks done (with a prefix cache, chunks whose tokens every member found cached count as done)
    adapter_ids: np.ndarray | None = None  # [k] int32, each member's adapter (pad rows: BASE)
    prompts: list[list[int]] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)  # each member's prompt tokens copied from the prefix cache, not computed
    features: Any = None  # a vision-language artifact: the members' image feature rows (BatchEngine._image_inputs)
    image_index: np.ndarray | None = None  # [k, width]: the feature row each token takes (-1: a text token)
    rope_offsets: np.ndarray | None = None  # Qwen2-VL: [3, k, width] 3-D positions less the text positions
    deltas: np.ndarray | None = None  # Qwen2-VL: [k] each member's decode position delta (image_positions.rope_index)

    @property
    def done(self) -> bool:
        return self.chunk == len(self.bounds) - 1


class BatchEngine:
    """The batch cache and its jitted steps (decode, prefill chunk, join); host bookkeeping of each row's length."""

    def __init__(self, generator: Generator, rows: int, chunk: int = 256, decode_block: int = 16, adapters: Any = None,
                 prefix_cache_tokens: int = 0, prefill_tokens: int | None = None):
        if not rows_apart(generator.decode_model):
            raise InputSpecError("this artifact's step writes every row of a batch at the same cache slots: it was "
                                 "converted by an older torch2jax, before the server kept each row's cache apart. "
                                 "Convert it again to serve it (Generator.generate runs it as it is)")
        if chunk < MIN_BUCKET or chunk & (chunk - 1):
            raise InputSpecError(f"the prefill chunk must be a power of two >= {MIN_BUCKET}, got {chunk}")
        prefill_tokens = chunk if prefill_tokens is None else prefill_tokens
        if not isinstance(prefill_tokens, int) or prefill_tokens < MIN_BUCKET:
            raise InputSpecError(f"the prefill budget must be an integer >= {MIN_BUCKET} (prompt tokens per step, over a "
                                 f"group's rows), got {prefill_tokens!r}")
        self.prefill_tokens, self.chunk = prefill_tokens, chunk
        self._start_batch(generator, rows, decode_block, adapters)
        if self.vision is not None and adapters is not None:
            raise InputSpecError("LoRA adapters are served over text-generation artifacts only, not a vision-language one")
        self._join = jax.jit(self._join_rows, donate_argnums=(0,))
        if adapters is not None:
            self._prefill_rows = jax.jit(self._prefill_with_adapters, donate_argnums=(2,))
        # automatic prefix caching (serve/prefix_cache.py): attention caches on one device only
        if prefix_cache_tokens < 0:
            raise InputSpecError(f"the prefix cache holds a number of tokens >= 0 (0: none), got {prefix_cache_tokens}")
        if prefix_cache_tokens >= BLOCK_SIZE and PrefixCache.supports(generator) and generator.sharding is None \
                and self.vision is None:  # an image token's keys depend on its image, which the block names do not hold
            self.prefix = PrefixCache(generator, prefix_cache_tokens // BLOCK_SIZE)

    def _start_batch(self, generator: Any, rows: int, decode_block: int, adapters: Any = None) -> None:
        """The batch's state and the jitted steps every artifact kind's engine shares (decode loop, token choice)."""
        spec = generator.spec
        if not 1 <= rows <= spec.max_batch:
            raise InputSpecError(f"--max-batch {rows}: this artifact was converted for batches of 1 to {spec.max_batch} "
                                 "(convert again with a larger --max-batch)")
        if not isinstance(decode_block, int) or decode_block < 1:
            raise InputSpecError(f"the decode block must be an integer >= 1 (decode steps per call), got {decode_block!r}")
        self.g, self.rows, self.decode_block = generator, rows, decode_block
        self.max_len = spec.max_cache_len
        self.cache = generator.new_cache(rows)
        self.lengths = np.zeros(rows, np.int64)  # the tokens each running row holds (slots 0 .. length - 1)
        self.deltas = np.zeros(rows, np.int64)  # added to each row's decode positions (Qwen2-VL's rope delta; else 0)
        self.running = np.zeros(rows, bool)
        self.decode_steps = 0  # device decode steps (a block counts its steps)
        # finetune.side_path.RowAdapters (lora, steps, count) or None: the steps then are the generator's own
        self.adapters = adapters
        self.adapter_ids = np.full(rows, BASE, np.int32)  # each running row's adapter
        self.most_models = 0  # the most models (adapters and the base) among the rows of one decode step
        self._ids = generator.id_dtype
        self.vision = getattr(generator, "vision", None)  # a vision-language artifact's VisionSpec (image inputs)
        self.prefix: PrefixCache | None = None
        # with extras (a request asks for log-probabilities or penalties): how often each row generated each token so far,
        # allocated at the first such request; rows restart it when such a request joins them (count_from)
        self.seen: jax.Array | None = None
        self._top = min(TOP_LOGPROBS, spec.vocab_size)
        self._decode = jax.jit(self._decode_steps, donate_argnums=(1, 2), static_argnames=("span", "any_sample", "size"),
                               compiler_options=DECODE_LOOP_OPTIONS)
        self._eos = jnp.asarray(spec.eos_token_ids or (-1,), self._ids)
        self._pick_jit = jax.jit(self._pick, static_argnames=("any_sample", "extras"))
        self.mask_words = mask_words(spec.vocab_size)  # int32 words of a row's allowed-token mask (structured output)
        self._count_from = jax.jit(lambda seen, restart, first: jnp.where(
            restart[:, None], jax.nn.one_hot(first, seen.shape[1], dtype=seen.dtype), seen), donate_argnums=(0,))

    # -- prefill --------------------------------------------------------------------------------
    def start_group(self, rows: list[int], prompts: list[list[int]], max_tokens: list[int],
                    adapter_ids: list[int] | None = None, images: list[Any] | None = None,
                    grids: list[Any] | None = None) -> Group:
        """Lay out the prompts of the requests that start together: left-padded to a common width made of
        chunks of at most `chunk` tokens, the first one a power of two (so few widths are compiled). `adapter_ids`:
        each request's adapter (default: the base model's). `images`: with a vision-language artifact, each request's image
        feature rows (None: none; scheduler.Request.image_features), and for the Qwen2-VL family its images' grids
        (`grids`: Request.image_grids)."""
        k = min(1 << (len(rows) - 1).bit_length(), self.g.spec.max_batch)
        images = list(images or [None] * len(prompts))
        # the limit is what generate would allow the padded prompt (the same widths)
        longest, limit = max(len(p) for p in prompts), self.max_len - max(max_tokens)
        if self._whole_prompts(any(f is not None for f in images)):
            bounds = [0, bucket(longest, limit, MIN_BUCKET)]
        else:
            bounds = self._chunk_bounds(longest, limit, self.chunk_for(k))
        width = bounds[-1]
        ids = np.full((k, width), self.g.spec.pad_token_id, np.int64)
        mask = np.zeros((k, width), bool)
        for r, prompt in enumerate(prompts):
            ids[r, width - len(prompt):], mask[r, width - len(prompt):] = prompt, True
        chosen = np.full(k, BASE, np.int32)
        chosen[: len(prompts)] = BASE if adapter_ids is None else adapter_ids
        group = Group(rows, [len(p) for p in prompts], ids, mask, bounds, self.g.new_cache(k), adapter_ids=chosen,
                      prompts=[list(p) for p in prompts], cached=[0] * len(prompts))
        if self.vision is not None:
            group.features, group.image_index = self._image_inputs(ids, mask, images)
            if self.vision.rotary_3d:
                group.rope_offsets, group.deltas = self._rope_offsets(ids, mask, list(grids or [None] * len(prompts)))
        if self.prefix is not None:
            self._reuse_prefixes(group)
        return group

    def _whole_prompts(self, with_images: bool) -> bool:
        """Whether a group's prompts are prefilled in one chunk: where a prompt's tokens attend to later ones (PaliGemma's
        prefix, Gemma 3's image blocks), a chunk could not see the next."""
        return self.vision is not None and (self.vision.prefix_lm or (self.vision.bidirectional_images and with_images))

    def _image_inputs(self, ids: np.ndarray, mask: np.ndarray, images: list[Any]) -> tuple[jax.Array, np.ndarray]:
        """(the group's image feature rows, each member's in turn, padded to a power of two so few prefills compile; the
        feature row each [k, width] column's token takes, -1 for the text), as generate gives its prefill."""
        index = image_index(np.where(mask, ids, -1), self.vision.image_token_id)
        given = [f for f in images if f is not None]
        dtype = dtypes.jax_dtype(self.vision.feature_dtype)
        rows = jnp.concatenate([jnp.asarray(f, dtype) for f in given]) if given else \
            jnp.zeros((1, self.vision.feature_size), dtype)
        padded = 1 << (rows.shape[0] - 1).bit_length()
        return jnp.pad(rows, ((0, padded - rows.shape[0]), (0, 0))), index

    def _rope_offsets(self, ids: np.ndarray, mask: np.ndarray, grids: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Qwen2-VL's 3-D positions of each member's prompt (its own images' grids) less its text positions, [3, k,
        width], and each member's decode delta [k], as generate computes them for a prompt alone."""
        offsets, deltas = np.zeros((3, *ids.shape), np.int64), np.zeros(ids.shape[0], np.int64)
        text = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        for m, grid in enumerate(grids):
            rope, delta = rope_index(ids[m:m + 1], mask[m:m + 1], grid, self.vision.image_token_id,
                                     self.vision.spatial_merge_size)
            offsets[:, m] = np.where(mask[m], rope[:, 0] - text[m], 0)
            deltas[m] = delta[0]
        return offsets, deltas

    def _prefill_images(self, group: Group, lo: int, hi: int) -> tuple:
        """The step's image inputs for columns [lo, hi) of the group: none without a vision-language artifact, else
        (feature rows, image index), and the 3-D position offsets for the Qwen2-VL family."""
        if self.vision is None:
            return ()
        images = (group.features, jnp.asarray(group.image_index[:, lo:hi], self._ids))
        if group.rope_offsets is not None:
            images += (jnp.asarray(group.rope_offsets[:, :, lo:hi], self._ids),)
        return images

    def check_images(self, prompt: list[int], features: Any) -> None:
        """Refuse a request whose image tokens and image feature rows differ in number (before it queues)."""
        if self.vision is None:
            if features is not None:
                raise InputSpecError("this artifact takes no images: it is not a vision-language model")
            return
        tokens, given = prompt.count(self.vision.image_token_id), 0 if features is None else int(features.shape[0])
        if tokens != given:
            raise InputSpecError(f"the prompt holds {tokens} image tokens (id {self.vision.image_token_id}) and its images "
                                 f"make {given} feature rows: each image's token must be expanded as the model's processor "
                                 "expands it")

    def _reuse_prefixes(self, group: Group) -> None:
        """Skip the leading chunks whose tokens every member finds in the prefix cache: copy those members' cached
        blocks into the scratch cache instead (the chunks left keep the shapes step_shapes compiles)."""
        width, size = group.ids.shape[1], self.prefix.block_size
        found = [self.prefix.lookup(p, int(a)) for p, a in zip(group.prompts, group.adapter_ids)]
        firsts = [width - n for n in group.lengths]  # each member's token 0
        covered = min(first + len(blocks) * size for first, blocks in zip(firsts, found))
        skip = max(i for i, bound in enumerate(group.bounds[:-1]) if bound <= covered)
        start = group.bounds[skip]
        for m, (first, blocks) in enumerate(zip(firsts, found)):
            group.cached[m] = max(0, start - first)
            needed = -(-group.cached[m] // size)  # blocks before the first chunk that runs (its tokens are recomputed)
            if needed:  # the member's token 0 is at slot 0
                group.scratch = self.prefix.copy_in(group.scratch, m, blocks[:needed], 0)
        group.chunk = skip
        self.prefix.stats.queried += sum(group.lengths)
        self.prefix.stats.hits += sum(group.cached)

    def chunk_for(self, k: int) -> int:
        """Each row's chunk in a group of `k` rows: the prefill chunk, halved while the group's chunk would exceed the
        per-step budget of prompt tokens (but at least MIN_BUCKET), so a big group's prefill does not stall the running
        rows' next token for longer than a one-row chunk would."""
        chunk = self.chunk
        while chunk > MIN_BUCKET and chunk * k > self.prefill_tokens:
            chunk //= 2
        return chunk

    @staticmethod
    def _chunk_bounds(longest: int, limit: int, chunk: int) -> list[int]:
        """Chunk edges of a prompt of `longest` tokens padded to fit `limit`: a power-of-two first chunk where it fits,
        then whole chunks."""
        full = (longest - 1) // chunk  # whole chunks after the first
        first = bucket(longest - full * chunk, max(limit - full * chunk, 1), MIN_BUCKET)
        return [0, *range(first, first + full * chunk + 1, chunk)]

    def _chunk_shape(self, lo: int, hi: int) -> tuple[int, int]:
        """(tokens, attended span) of the chunk [lo, hi): the first attends to itself, as generate's prefill does;
        later ones to a power-of-two span (few compiles)."""
        return hi - lo, hi if lo == 0 else attended_span(hi, self.max_len)

    def prefill_chunk(self, group: Group) -> jax.Array | None:
        """Run the group's next chunk; after the last one, the logits of each row's last prompt token."""
        lo, hi = group.bounds[group.chunk], group.bounds[group.chunk + 1]
        _, span = self._chunk_shape(lo, hi)
        positions, write_at, valid = chunk_slots(group.mask, lo, hi, span)
        images = self._prefill_images(group, lo, hi)
        logits, group.scratch = self._prefill(
            group.scratch, jnp.asarray(group.ids[:, lo:hi], self._ids), jnp.asarray(positions, self._ids),
            jnp.asarray(write_at, self._ids), jnp.asarray(valid), group.adapter_ids, images)
        group.chunk += 1
        if not group.done:
            return None
        if self.prefix is not None:  # keep the blocks of these prompts for the requests that share them
            for m, (prompt, adapter) in enumerate(zip(group.prompts, group.adapter_ids)):
                self.prefix.store(group.scratch, m, prompt, int(adapter), 0)
        return logits

    def first_tokens(self, logits: jax.Array, settings: list[Sampling],
                     allowed: np.ndarray | None = None) -> tuple[np.ndarray, Logprobs | None]:
        """Each member's first new token from its prompt's logits (pad rows of the group get greedy picks), and the
        log-probabilities when a member asked for them (else None). No penalty applies yet: nothing was generated.
        `allowed`: None, or the [group rows, mask_words] allowed-token bitmask (structured output; the extras variant)."""
        k, extras = logits.shape[0], allowed is not None or any(s.extras for s in settings)
        out = self._pick_jit(logits, *self._sampling_arrays(settings, k), np.zeros(k, np.int32), None,
                             None if allowed is None else jnp.asarray(allowed, jnp.int32),
                             any_sample=any(s.temperature > 0 for s in settings), extras=extras)
        if not extras:
            return np.asarray(out), None
        tokens, (chosen, ids, top) = out
        return np.asarray(tokens), Logprobs(np.asarray(chosen), np.asarray(ids), np.asarray(top))

    def _new_seen(self) -> jax.Array:
        """Zero generated-token counts [rows, vocab], placed as the steps' outputs are (so a step called with new counts
        and one with counts a step returned are one compiled step)."""
        return self.g.carried(np.zeros((self.rows, self.g.spec.vocab_size), np.int32))

    def count_from(self, rows: list[int], first: list[int]) -> None:
        """Restart the generated-token counts of these rows (joined by requests with penalties) at their first token."""
        if not rows:
            return
        if self.seen is None:
            self.seen = self._new_seen()
        restart, tokens = np.zeros(self.rows, bool), np.zeros(self.rows, np.int32)
        restart[rows], tokens[rows] = True, first
        self.seen = self._count_from(self.seen, jnp.asarray(restart), jnp.asarray(tokens))

    def join(self, group: Group, members: list[int]) -> None:
        """Copy these members' rows of the scratch cache into the batch cache, as they are (their tokens from slot 0)."""
        if not members:
            return
        rows = np.full(group.ids.shape[0], self.rows, np.int32)  # pad rows land out of range and are dropped
        rows[members] = [group.rows[m] for m in members]
        self.cache = self._join(self.cache, group.scratch, jnp.asarray(rows))
        for m in members:
            self.lengths[group.rows[m]], self.running[group.rows[m]] = group.lengths[m], True
            self.deltas[group.rows[m]] = 0 if group.deltas is None else group.deltas[m]
            if group.adapter_ids is not None:
                self.adapter_ids[group.rows[m]] = group.adapter_ids[m]

    # -- decode ---------------------------------------------------------------------------------
    def decode(self, tokens: np.ndarray, settings: list[Sampling | None], counts: np.ndarray, left: np.ndarray | None = None,
               watch_eos: np.ndarray | None = None, block: int = 1,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, Logprobs | None]:
        """Up to `block` steps for every row: [steps, rows] tokens (free rows' entries are garbage), and their
        log-probabilities ([steps, rows] Logprobs) when a running row's request has extras (log-probabilities or
        penalties; else None). `counts`: each row's tokens so far; `left`: how many more each running row may take (the
        block ends once one has none left); `watch_eos`: rows whose end at one of the artifact's end tokens ends the
        block. The block also stays within the cache and one attended span, so each step attends to what a step alone
        would. Only a batch with extras runs the step variant that computes them, so other batches do not pay for
        them. `allowed`: None, or the [rows, mask_words] allowed-token bitmask of this step (structured output): one step
        then, in the extras variant (the host must advance the grammars before the next mask)."""
        lengths = self._step_lengths()
        longest = int(lengths.max())
        span = attended_span(longest + 1, self.max_len)
        count = 1 if allowed is not None else max(1, min(block, self.decode_block, self.max_len - longest,
                                                         span - longest))
        left = np.full(self.rows, count, np.int32) if left is None else np.where(self.running, left, count)
        watch = np.zeros(self.rows, bool) if watch_eos is None else watch_eos & self.running
        side = self._decode_side()
        extras = allowed is not None or any(s is not None and s.extras for s in settings)
        seen, penalties = None, None
        if extras:
            if self.seen is None:
                self.seen = self._new_seen()
            seen, self.seen = self.seen, None  # donated: a failed call must not leave a deleted array behind
            penalties = self._penalty_arrays(settings)
        out, ran, self.cache, seen, found = self._decode(
            self.g.params, self.cache, seen, jnp.asarray(tokens, self._ids), jnp.asarray(lengths, self._ids),
            jnp.asarray(np.where(self.running, self.deltas, 0), self._ids),
            *self._sampling_arrays(settings, self.rows),
            jnp.asarray(counts, jnp.int32), jnp.asarray(left, jnp.int32), jnp.asarray(watch), self._eos,
            jnp.asarray(count, jnp.int32), side, penalties, None if allowed is None else jnp.asarray(allowed, jnp.int32),
            span=span, any_sample=any(s is not None and s.temperature > 0 for s in settings), size=self.decode_block)
        self.seen = seen if extras else self.seen
        ran = int(ran)
        self.lengths[self.running] += ran
        self.decode_steps += ran
        logprobs = None if found is None else Logprobs(*(np.asarray(a)[:ran] for a in found))
        return np.asarray(out)[:ran], logprobs

    def _step_lengths(self) -> np.ndarray:
        """Each row's tokens as the next decode step sees them: a free row writes (and attends to) its slot 0."""
        return np.where(self.running, self.lengths, 0)

    def _decode_side(self) -> Any:
        """What the decode loop passes to every step beside the batch (`side` of _step_logits): the adapters and each
        row's adapter id, or None."""
        if self.adapters is None:
            return None
        self.most_models = max(self.most_models, len(set(self.adapter_ids[self.running].tolist())))
        return self._side(np.where(self.running, self.adapter_ids, BASE))

    def check_request(self, prompt: list[int], max_tokens: int) -> None:
        """Refuse a client's prompt and max_tokens that cannot run here (generate's prompt check, in a client's words)."""
        image_token = self.vision.image_token_id if self.vision is not None else None
        check_prompt(np.asarray([prompt]), None, self.g.spec, max_tokens, CLIENT, image_token)

    def reset(self) -> None:
        """Start over with an empty batch (after a failed step, whose cache may have been donated)."""
        self.cache = self.g.new_cache(self.rows)
        self.lengths[:], self.deltas[:], self.running[:], self.adapter_ids[:] = 0, 0, False, BASE
        self.seen = None

    def free(self, row: int) -> None:
        self.lengths[row], self.deltas[row], self.running[row], self.adapter_ids[row] = 0, 0, False, BASE

    # -- compiling ahead ------------------------------------------------------------------------
    def step_shapes(self) -> dict[str, list]:
        """Every shape the scheduler can call a step with, apart from prompts so close to the cache's end that their
        first chunk is not a power of two: group sizes, each group size's prefill chunks as (tokens, attended span),
        decode spans."""
        groups = sorted({min(1 << (n - 1).bit_length(), self.g.spec.max_batch) for n in range(1, self.rows + 1)})
        chunks = {}
        for k in groups:
            shapes = set()
            for longest in range(1, self.max_len):  # the most room a prompt can have: one new token
                bounds = [0, bucket(longest, self.max_len - 1, MIN_BUCKET)] if self._whole_prompts(False) else \
                    self._chunk_bounds(longest, self.max_len - 1, self.chunk_for(k))
                if bounds[1] >= MIN_BUCKET and bounds[1] & (bounds[1] - 1) == 0:  # else cut short by the cache's end
                    shapes.update(self._chunk_shape(lo, hi) for lo, hi in zip(bounds, bounds[1:]))
            chunks[k] = sorted(shapes)
        spans = sorted({attended_span(filled, self.max_len) for filled in range(1, self.max_len + 1)})
        return {"groups": groups, "chunks": chunks, "spans": spans}

    def compile_steps(self, progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> int:
        """Call each jitted step once at every shape of `step_shapes`, in each of its VARIANTS (greedy or sampled, without
        or with extras: log-probabilities and penalties; and MASKED_VARIANTS, with an allowed-token mask), so that no
        client waits on a compilation: which shapes a busy server meets depends on how requests happen to arrive together.
        The calls run on `workers` threads (XLA compiles without the GIL), each on caches of its own; the batch is left as
        it was. Returns how many calls it made (`progress(done, total)` after each)."""
        shapes, ids, g, rows = self.step_shapes(), self._ids, self.g, self.rows

        def prefill(k: int, width: int, span: int) -> tuple[jax.Array, list[jax.Array]]:
            slots = jnp.broadcast_to(jnp.arange(width, dtype=ids), (k, width))
            group = Group([], [], np.zeros((k, width), np.int64), np.ones((k, width), bool), [0, width], [])
            if self.vision is not None:
                group.features, group.image_index = self._image_inputs(group.ids, group.mask, [])
                if self.vision.rotary_3d:
                    group.rope_offsets = np.zeros((3, k, width), np.int64)
            images = self._prefill_images(group, 0, width)
            return jax.block_until_ready(self._prefill(g.new_cache(k), jnp.zeros((k, width), ids), slots, slots,
                                                       jnp.zeros((k, span), bool), np.full(k, BASE, np.int32), images))

        def first_and_join(k: int) -> None:  # a group's last chunk, its first tokens, its rows copied into the batch
            logits, scratch = prefill(k, MIN_BUCKET, MIN_BUCKET)
            for settings in VARIANTS:
                self.first_tokens(logits, [settings] * k)
            for settings in MASKED_VARIANTS:
                self.first_tokens(logits, [settings] * k, np.full((k, self.mask_words), -1, np.int32))
            jax.block_until_ready(self._join(g.new_cache(rows), scratch, jnp.full((k,), rows, jnp.int32)))

        calls = [lambda k=k: first_and_join(k) for k in shapes["groups"]]
        calls += [lambda k=k, w=w, s=s: prefill(k, w, s) for k in shapes["groups"] for w, s in shapes["chunks"][k]
                  if (w, s) != (MIN_BUCKET, MIN_BUCKET)]
        side = self._side(np.full(rows, BASE, np.int32))
        calls += [*self._decode_calls(shapes["spans"], lambda: side), self._compile_count_from]
        if self.prefix is not None:  # its copies, for each group size, one after the other (they replace the pool)
            calls.append(lambda: [jax.block_until_ready(self.prefix.warm_up(g.new_cache(k))) for k in shapes["groups"]])
        return self._compile(calls, progress, workers)

    def _decode_calls(self, spans: list[int], side: Callable[[], Any]) -> list[Callable[[], None]]:
        """compile_steps' calls of the decode loop at each span in every variant (`side()`: the loop's side input)."""
        g, rows, ids = self.g, self.rows, self._ids

        def decode(span: int, settings: Sampling, masked: bool = False) -> None:
            one = jnp.ones((rows,), jnp.int32)
            extras = settings.extras or masked
            seen = self._new_seen() if extras else None
            tokens, *_ = self._decode(g.params, g.new_cache(rows), seen, jnp.zeros((rows,), ids),
                                      jnp.full((rows,), span - 1, ids), jnp.zeros((rows,), ids),
                                      *self._sampling_arrays([settings] * rows, rows), one, one, jnp.zeros((rows,), bool),
                                      self._eos, jnp.asarray(1, jnp.int32), side(),
                                      self._penalty_arrays([settings] * rows) if extras else None,
                                      jnp.full((rows, self.mask_words), -1, jnp.int32) if masked else None, span=span,
                                      any_sample=settings.temperature > 0, size=self.decode_block)
            jax.block_until_ready(tokens)

        calls: list[Callable[[], None]] = [lambda s=s, v=v: decode(s, v) for s in spans for v in VARIANTS]
        return calls + [lambda s=s, v=v: decode(s, v, True) for s in spans for v in MASKED_VARIANTS]

    def _compile_count_from(self) -> None:
        """compile_steps' call of the penalties' count restart."""
        rows = self.rows
        jax.block_until_ready(self._count_from(self._new_seen(), jnp.zeros(rows, bool), jnp.zeros(rows, jnp.int32)))

    @staticmethod
    def _compile(calls: list[Callable[[], Any]], progress: Callable[[int, int], None] | None,
                 workers: int | None) -> int:
        """Run compile_steps' calls on `workers` threads (XLA compiles without the GIL), reporting progress."""
        with ThreadPoolExecutor(workers or min(4, os.cpu_count() or 1)) as pool:
            for done, future in enumerate(as_completed([pool.submit(call) for call in calls]), 1):
                future.result()
                return_freed_memory()  # each compilation's freed scratch, else kept by the C heap (runtime/collector.py)
                if progress is not None:
                    progress(done, len(calls))
        return len(calls)

    # -- adapters ---------------------------------------------------------------------------------
    def _prefill(self, cache: list[jax.Array], ids: jax.Array, positions: jax.Array, write_at: jax.Array, valid: jax.Array,
                 adapter_ids: np.ndarray | None, images: tuple = ()) -> tuple[jax.Array, list[jax.Array]]:
        """One compiled prefill step: the generator's own without adapters, else the entries' graph with each row's
        adapter beside the weights. `images`: a vision-language step's (feature rows, image index)."""
        if self.adapters is None:
            return self.g.prefill(cache, ids, positions, write_at, valid, *images)
        return self._prefill_rows(self.g.params, self.adapters.lora, cache, ids, positions, write_at, valid,
                                  jnp.asarray(adapter_ids, jnp.int32))

    def _side(self, adapter_ids: np.ndarray) -> tuple[dict, jax.Array] | None:
        """What the decode loop takes for the adapters: None without them (the step traced exactly as before), else
        (the stacked adapters, each row's adapter id)."""
        return None if self.adapters is None else (self.adapters.lora, jnp.asarray(adapter_ids, jnp.int32))

    def _prefill_with_adapters(self, params, lora, cache, ids, positions, write_at, valid, adapter_ids):
        logits, cache = self.adapters.steps["prefill"](params, lora, ids, positions, write_at, valid, list(cache),
                                                       adapter_ids=adapter_ids)
        return logits, list(cache)

    # -- jitted bodies --------------------------------------------------------------------------
    def _sampling_arrays(self, settings: list[Sampling | None], rows: int) -> tuple:
        greedy = Sampling()
        full = [s or greedy for s in settings] + [greedy] * (rows - len(settings))
        return (jnp.asarray([s.temperature if s.temperature > 0 else 1.0 for s in full], jnp.float32),
                jnp.asarray([s.top_k for s in full], jnp.int32), jnp.asarray([s.top_p for s in full], jnp.float32),
                jnp.asarray([s.temperature <= 0 for s in full]), jnp.asarray([s.seed for s in full], jnp.int32))

    @staticmethod
    def _penalty_arrays(settings: list[Sampling | None]) -> tuple[jax.Array, jax.Array]:
        """Each row's (presence, frequency) penalties, [rows] float32 each (0 for free rows)."""
        full = [s or Sampling() for s in settings]
        return (jnp.asarray([s.presence_penalty for s in full], jnp.float32),
                jnp.asarray([s.frequency_penalty for s in full], jnp.float32))

    def _pick(self, logits, temperature, top_k, top_p, greedy, seeds, counts, penalties, allowed=None, *, any_sample,
              extras=False):
        """Per row: greedy, or a draw with the row's own key folded with its token count, exactly as
        Generator.generate(rng=jax.random.key(seed)) draws for that row alone. `penalties`: None, or (seen [rows, V]
        token counts, presence [rows], frequency [rows]) subtracted from the logits first, as OpenAI defines them. With
        `extras`, also (the chosen tokens' log-probabilities [rows], the TOP_LOGPROBS most likely tokens [rows, K] and
        theirs [rows, K]), of the raw distribution: log_softmax of the model's logits, before penalties and sampling.
        `allowed`: None, or [rows, mask_words] bitmasks of the tokens each row may take (structured output), applied after
        the penalties: the other tokens' logits become -inf."""
        if extras:
            logits = logits.astype(jnp.float32)
            raw = jax.nn.log_softmax(logits, axis=-1)
        if penalties is not None:
            seen, presence, frequency = penalties
            logits = logits.astype(jnp.float32) - (seen.astype(jnp.float32) * frequency[:, None]
                                                   + (seen > 0).astype(jnp.float32) * presence[:, None])
        if allowed is not None:
            logits = jnp.where(allowed_bits(allowed, logits.shape[-1]), logits, -jnp.inf)
        keys = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(seeds, counts) if any_sample else None
        token = sampling.pick(logits, keys, temperature, top_k, top_p, do_sample=any_sample, key_per_row=True,
                              greedy_rows=greedy)
        if not extras:
            return token
        top, ids = jax.lax.top_k(raw, self._top)
        return token, (jnp.take_along_axis(raw, token[:, None], axis=1)[:, 0], ids.astype(jnp.int32), top)

    def _step_logits(self, params, cache, tokens, lengths, deltas, side, *, span):
        """One decode step of the model for every row, each row's token written at slot `lengths` (its position, plus
        the row's delta) and attending to the row's slots up to it: (logits [rows, V], cache)."""
        valid = jnp.arange(span)[None, :] <= lengths[:, None]
        at, positions = lengths[:, None], (lengths + deltas)[:, None]
        if side is None:
            return causal_lm_step(self.g.decode_model, params, tokens[:, None], positions, at, valid, cache,
                                  *self.g._decode_inputs(tokens.shape[0]))
        lora, adapter_ids = side
        logits, cache = self.adapters.steps["decode"](params, lora, tokens[:, None], positions, at, valid, list(cache),
                                                      adapter_ids=adapter_ids)
        return logits, list(cache)

    def _decode_steps(self, params, cache, seen, tokens, lengths, deltas, temperature, top_k, top_p, greedy, seeds,
                      counts, left, watch, eos, count, side, penalties, allowed, *, span, any_sample, size):
        """Up to `count` (<= `size`) decode steps in generate's compiled loop (loop.decode_block): ([size, rows] tokens,
        how many steps ran, cache, seen, logprobs). Step i is the step `decode` would run alone i steps later; the loop
        ends after the step where a row has no tokens left or a watched row emits an end token (a row's end frees it for
        a new request, where generate's rows wait for every row to end). `side`: None, or the adapters and each row's
        adapter id (_side). `seen`: None (the plain variant: seen and logprobs come back None), or each row's
        generated-token counts [rows, V], which `penalties` (presence, frequency: [rows] each) scale; each step adds its
        token, and reports the log-probabilities _pick computes ([size, rows] and [size, rows, K] buffers). `allowed`:
        None, or the [rows, mask_words] allowed-token bitmask (structured output, with extras; `count` is then 1)."""
        extras = seen is not None
        rows = tokens.shape[0]
        every = jnp.arange(rows)

        def step(i, token, state, ended):
            cache, seen, found = state
            logits, cache = self._step_logits(params, cache, token, lengths + i, deltas, side, span=span)
            picked = self._pick(logits, temperature, top_k, top_p, greedy, seeds, counts + i,
                                None if seen is None else (seen, *penalties), allowed, any_sample=any_sample,
                                extras=extras)
            if extras:
                token, now = picked
                seen = seen.at[every, token].add(1)
                found = tuple(buffer.at[i].set(value) for buffer, value in zip(found, now))
            else:
                token = picked
            return token, (cache, seen, found), ((left <= i + 1) | (watch & jnp.isin(token, eos))).any()

        found = None
        if extras:
            found = (jnp.zeros((size, rows), jnp.float32), jnp.zeros((size, rows, self._top), jnp.int32),
                     jnp.zeros((size, rows, self._top), jnp.float32))
        out, ran, _, (cache, seen, found), _ = decode_block(step, tokens, (cache, seen, found), jnp.zeros((), bool), count,
                                                            size)
        return out, ran, cache, seen, found

    @staticmethod
    def _join_rows(cache, scratch, rows):
        return [c.at[rows].set(s.astype(c.dtype), mode="drop") for c, s in zip(cache, scratch)]


def chunk_slots(mask: np.ndarray, lo: int, hi: int, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns [lo, hi) of a group's left-padded prompts [k, width] (`mask`: the real tokens) as the step takes them:
    (positions [k, T], write_at [k, T], kv_valid [k, span]). A real token is written at its position (the row's token 0
    at slot 0); a pad column at a slot past the row's real tokens so far, each its own, all below the chunk's width (so
    within `span`): it attends to its own slot (never to nothing: no NaN), and the row's later tokens overwrite it."""
    offsets = mask.shape[1] - mask.sum(axis=1)  # each row's first real column (pad rows: width)
    columns = np.arange(lo, hi)
    real = columns[None, :] >= offsets[:, None]
    filled = np.maximum(hi - offsets, 0)  # the row's real tokens once this chunk is written
    own = columns[None, :] - offsets[:, None]
    write_at = np.where(real, own, filled[:, None] + columns[None, :] - lo)
    valid = np.arange(span)[None, :] < filled[:, None]
    return np.where(real, own, 0), write_at, valid
