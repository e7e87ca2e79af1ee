"""Prompt-lookup decoding, torch-free: greedy generation that drafts tokens by copying from the sequence itself and
verifies them in one step, with tokens identical to plain greedy generation.

    ids = g.generate(input_ids, max_new_tokens=64, prompt_lookup_num_tokens=10, max_matching_ngram_size=2)

transformers' PromptLookupCandidateGenerator in meaning: the draft is the (up to) `prompt_lookup_num_tokens` tokens
that follow the first earlier occurrence (left to right) of the sequence's last n tokens, n from
`max_matching_ngram_size` down to 1, over prompt + generated tokens; no occurrence, no draft. One verify step runs
[last token, draft...] through the model at once; the longest run of drafts equal to the model's own greedy tokens
is accepted, plus the model's token after it, so each step emits 1 to 1 + draft tokens. Rejected drafts' cache slots
are not marked valid and are overwritten by later steps.

The whole loop runs on the device: a jax.lax.while_loop searches the n-grams over a fixed-size history array,
verifies and accepts, for up to a block of tokens per host call (as loop.py's decode blocks do).

The artifact's prefill entry returns the last position's logits only, so the verify step is a variant of its graph
(`verify_graph`): the head after the final hidden states' last-row slice (lm head, soft-capping, ...) is repeated for
each of the step's positions, and the step returns [B, positions, V] logits. The same weights, the same attention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from ..ir.graph import Graph, GraphOutput, Node, TensorMeta, iter_refs
from ..lowering import interpreter, passes
from ..runtime.model import Model
from . import processors, sampling
from .loop import DECODE_LOOP_OPTIONS, MIN_BUCKET, Request, attended_span, call_entry, prompt_bucket, rows_apart, run_blocks

SLICE, CAT, UNSQUEEZE = "aten.slice.Tensor", "aten.cat.default", "aten.unsqueeze.default"
TOKENS_PER_CALL = 64  # new tokens one host call may emit at most (the while loop's verify steps stop there)


@dataclasses.dataclass(frozen=True)
class LookupStats:
    """What the last prompt-lookup call did: verify steps run, draft tokens proposed and accepted."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens per proposed one (0.0 when none was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0


def lookup_settings(num_tokens: Any, max_ngram: Any, *, do_sample: bool, num_beams: Any,
                    request: Request | None = None, forced_eos: Any = None, batch: int = 1,
                    cache_kinds: tuple[str, ...] = ()) -> tuple[int, int] | None:
    """(draft tokens, largest n-gram) when prompt lookup is asked for (`prompt_lookup_num_tokens`), else None; refuses
    what it cannot make exact: sampling, beam search, per-step logits processors, batches, recurrent state."""
    if num_tokens is None:
        if max_ngram is not None:
            raise InputSpecError("max_matching_ngram_size is a setting of prompt lookup: give prompt_lookup_num_tokens too")
        return None
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
        raise InputSpecError(f"prompt_lookup_num_tokens must be a positive int (the draft's length), got {num_tokens!r}")
    max_ngram = 2 if max_ngram is None else max_ngram  # transformers' default
    if isinstance(max_ngram, bool) or not isinstance(max_ngram, (int, np.integer)) or max_ngram < 1:
        raise InputSpecError(f"max_matching_ngram_size must be a positive int, got {max_ngram!r}")
    if do_sample:
        raise InputSpecError("prompt_lookup_num_tokens with do_sample=True: prompt lookup is greedy only here (its tokens "
                             "equal greedy generate's); pass do_sample=False, or leave prompt_lookup_num_tokens out")
    if num_beams is not None and num_beams != 1:
        raise InputSpecError(f"prompt_lookup_num_tokens with num_beams={num_beams}: prompt lookup decodes one greedy "
                             "sequence; leave one of them out")
    if "state" in cache_kinds:
        raise Torch2JaxError("prompt lookup needs a cache it can roll back, and this model keeps a recurrent state "
                             "(each step overwrites it, so rejected draft tokens cannot be undone): leave "
                             "prompt_lookup_num_tokens out")
    if batch != 1:
        raise InputSpecError(f"prompt_lookup_num_tokens takes one prompt (batch 1, as transformers' assisted generation), "
                             f"got {batch} rows: call generate once per prompt")
    if request is not None and request.processing.active:
        active = [f.name for f in dataclasses.fields(request.processing) if getattr(request.processing, f.name)]
        raise InputSpecError(f"prompt_lookup_num_tokens with logits processors ({', '.join(active)}, from the call or the "
                             "model's generation config): they are not applied to verified drafts here; leave them out "
                             "(pass their off values) or leave prompt_lookup_num_tokens out")
    if forced_eos is not None:
        raise InputSpecError(f"prompt_lookup_num_tokens with the generation config's forced_eos_token_id={forced_eos}: not "
                             "applied to verified drafts; leave prompt_lookup_num_tokens out")
    return int(num_tokens), int(max_ngram)


# -- the n-gram search -------------------------------------------------------------------------------------------------
def ngram_draft(history: jax.Array, length: jax.Array, *, num_tokens: int, max_ngram: int) -> tuple[jax.Array, jax.Array]:
    """[H] tokens of which the first `length` are the sequence -> ([num_tokens] draft, how many of it are real): the
    tokens after the first occurrence (left to right) of the last n tokens whose continuation is not empty, for the
    largest n in max_ngram..1 (and n < length) that has one; (zeros, 0) when none does. jnp ops only (a while loop's
    body), O(max_ngram * H) compares."""
    size = history.shape[0]
    padded = jnp.concatenate([history, jnp.zeros((max_ngram + num_tokens,), history.dtype)])
    index = jnp.arange(size)
    found, start = jnp.zeros((), bool), jnp.zeros((), jnp.int32)
    for n in range(1, max_ngram + 1):  # later (larger) n take precedence
        tail = jax.lax.dynamic_slice(padded, (length - n,), (n,))
        match = (index + n < length) & (n < length)  # a non-empty continuation, and an earlier occurrence
        for j in range(n):
            match &= padded[j:j + size] == tail[j]
        hit = match.any()
        start = jnp.where(hit, (jnp.argmax(match) + n).astype(jnp.int32), start)
        found = found | hit
    draft = jax.lax.dynamic_slice(padded, (start,), (num_tokens,))
    count = jnp.where(found, jnp.minimum(num_tokens, length - start), 0).astype(jnp.int32)
    return jnp.where(jnp.arange(num_tokens) < count, draft, 0), count


# -- the verify step: the prefill graph with its head repeated per position -------------------------------------------
def verify_graph(graph: Graph, width: int) -> Graph:
    """The prefill graph, returning [B, width] positions' logits instead of the last one's: every node between the
    final hidden states' last-row slice and the logits output (lm head, soft-capping, the float cast) is repeated once
    per earlier position, reading slice [i, i + 1), and the rows are concatenated. Valid for calls of exactly `width`
    tokens. Raises Torch2JaxError when the graph does not end in such a slice."""
    nodes = {node.name: node for node in graph.nodes}
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    user = graph.user_outputs
    out_refs = list(iter_refs(user[0].value)) if user else []
    if len(out_refs) != 1 or out_refs[0] not in nodes:
        raise Torch2JaxError("prompt lookup needs the prefill's logits as its first output; this artifact's differs")
    # the nodes the logits are computed from, and among them the last-row slice on the position axis
    ancestors, todo = set(), [out_refs[0]]
    while todo:
        name = todo.pop()
        if name in ancestors or name not in nodes:
            continue
        ancestors.add(name)
        todo.extend(iter_refs(nodes[name].args))
        todo.extend(iter_refs(nodes[name].kwargs))
    slices = [n for n in ancestors if nodes[n].op == SLICE and nodes[n].args[1:3] == [1, -1]]
    if len(slices) != 1:
        raise Torch2JaxError("prompt lookup needs a prefill graph that keeps its last position's hidden states (a slice "
                             f"[:, -1:] before the LM head); this artifact's has {len(slices)} such slices")
    cut = slices[0]
    head = {cut}
    for node in graph.nodes[order[cut] + 1:]:
        if node.name in ancestors and any(r in head for r in iter_refs([node.args, node.kwargs])):
            head.add(node.name)
    head_nodes = [node for node in graph.nodes if node.name in head]

    def rename(value: Any, suffix: str) -> Any:
        if isinstance(value, dict):
            if set(value) == {"ref"} and value["ref"] in head:
                return {"ref": value["ref"] + suffix}
            return {k: rename(v, suffix) for k, v in value.items()}
        if isinstance(value, list):
            return [rename(v, suffix) for v in value]
        return value

    added, rows = [], []
    for i in range(width):
        suffix = f"__row{i}"
        for node in head_nodes:
            args = rename(node.args, suffix)
            if node.name == cut:
                args = [args[0], 1, i, i + 1, *args[4:]]
            added.append(Node(node.name + suffix, node.op, args, rename(node.kwargs, suffix), node.meta, node.source))
        rows.append(Node(f"{out_refs[0]}__row{i}_unsqueezed", UNSQUEEZE, [{"ref": out_refs[0] + suffix}, 1], {}))
        added.append(rows[-1])
    meta = nodes[out_refs[0]].meta
    stacked_meta = TensorMeta(meta.dtype, [meta.shape[0], width, *meta.shape[1:]]) if isinstance(meta, TensorMeta) else None
    added.append(Node(f"{out_refs[0]}__rows", CAT, [[{"ref": r.name} for r in rows], 1], {}, stacked_meta))
    at = max(order[n] for n in head) + 1  # after the original head: everything the copies read is defined by then
    new_nodes = graph.nodes[:at] + added + graph.nodes[at:]
    first = graph.outputs.index(user[0])
    outputs = list(graph.outputs)
    outputs[first] = GraphOutput(user[0].kind, {"ref": f"{out_refs[0]}__rows"}, user[0].target)
    return dataclasses.replace(graph, nodes=new_nodes, outputs=outputs)


def verify_model(prefill: Model, width: int) -> Model:
    """The prefill entry as a verify step over exactly `width` tokens ([B, width, V] logits), same params."""
    if getattr(prefill, "graph", None) is None:  # an artifact run from StableHLO keeps its graph beside it (graph.json)
        raise Torch2JaxError("prompt lookup rewrites the prefill's graph, and this artifact's prefill has none")
    graph = verify_graph(prefill.graph, width)
    model = Model(interpreter.build(passes.optimize(graph)), prefill.params, graph, prefill.manifest)
    model.sharding = prefill.sharding
    return model


# -- the loop -------------------------------------------------------------------------------------------------------
class PromptLookup:
    """A Generator's prompt-lookup loop for one (draft tokens, n-gram size): its verify model and compiled block."""

    def __init__(self, generator: Any, num_tokens: int, max_ngram: int):
        self.generator, self.num_tokens, self.max_ngram = generator, num_tokens, max_ngram
        self.verify = verify_model(generator.prefill_model, num_tokens + 1)
        self._block = jax.jit(self._run_block, donate_argnums=(1,), static_argnames=("span", "size"),
                              compiler_options=DECODE_LOOP_OPTIONS)

    def steps(self, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, request: Request,
              report: Callable[[jax.Array], None]) -> Iterator[np.ndarray]:
        """Each new token as a [1] array, as the plain loop yields them; `report` gets the call's counts so far ([3]:
        verify steps, proposed and accepted drafts) after every block."""
        g, spec = self.generator, self.generator.spec
        batch, length = ids.shape
        width = prompt_bucket(length, spec.max_cache_len - max_new_tokens, MIN_BUCKET)
        padded_ids, positions, valid = g.padded_prompt(ids, mask, width, request.pad_id)
        real = ids[0][mask[0]].astype(np.int32)
        history = np.zeros((spec.max_cache_len + self.num_tokens + 2,), np.int32)  # the prompt, then each new token
        history[: real.size] = real
        state = {"cache": g.new_cache(batch), "valid": g.carried(valid), "history": g.carried(history, jnp.int32),
                 "length": g.carried(real.size, jnp.int32), "position": g.carried(positions[:, -1] + 1, g.id_dtype),
                 "counts": g.carried(np.zeros(3, np.int32), jnp.int32)}

        def first():
            logits, state["cache"] = g._prefill(
                g.params, state["cache"], jnp.asarray(padded_ids, g.id_dtype), jnp.asarray(positions, g.id_dtype),
                jnp.arange(width, dtype=g.id_dtype), jnp.asarray(valid[:, :width]))
            token, done, _ = g._first(logits, request.key, *request.sampling, jnp.zeros((batch,), bool),
                                      request.eos, request.pad, do_sample=False, processing=processors.NONE, extra=None)
            return token, done

        def advance(produced, token, done, count):
            slot = width + produced - 1  # the slot of the next verify step's first token (the last one emitted)
            span = attended_span(slot + 1, spec.max_cache_len)
            count = min(count, span - slot)
            (tokens, ran, token, state["cache"], state["valid"], done, state["position"], state["history"],
             state["length"], state["counts"]) = self._block(
                g.params, state["cache"], token, state["position"], jnp.asarray(slot, jnp.int32), state["valid"], done,
                state["history"], state["length"], request.eos, jnp.asarray(count, jnp.int32), state["counts"],
                span=span, size=TOKENS_PER_CALL)
            report(state["counts"])
            return tokens, ran, token, done

        return run_blocks(first, advance, max_new_tokens, TOKENS_PER_CALL)

    def _run_block(self, params, cache, token, position, slot, valid, done, history, length, eos, budget, counts, *,
                   span, size):
        """Verify steps until `budget` new tokens (<= `size`) are out or the row has ended: ([size] tokens, of which the
        first `ran` are new, ran, the last token, cache, valid, done, position, history, its length, counts). The
        history holds the sequence but for `token` (the last token, whose successor the block starts from), which the
        block appends first: so the host never updates it."""
        k, g = self.num_tokens, self.generator
        width = k + 1
        max_cache_len = g.spec.max_cache_len
        columns = jnp.arange(width, dtype=jnp.int32)
        slots = jnp.arange(valid.shape[1], dtype=jnp.int32)
        out = jnp.zeros((size + width,), token.dtype)

        def more(carry):
            return (carry[0] < budget) & ~carry[7].any()

        def body(carry):
            produced, token, position, cache, valid, history, length, done, out, counts = carry
            at = slot + produced
            draft, count = ngram_draft(history, length, num_tokens=k, max_ngram=self.max_ngram)
            count = jnp.clip(count, 0, budget - produced - 1)  # room for the drafts and the model's own token
            ids = jnp.concatenate([token.astype(draft.dtype), draft]).astype(token.dtype)[None]
            used = columns <= count
            write_at = jnp.where(used, at + columns, max_cache_len)  # unused columns: the spare slot, never attended
            attended = valid | ((slots >= at) & (slots <= at + count))[None]
            logits, cache = self._verify_step(params, ids, (position[:, None] + columns[None]).astype(position.dtype),
                                              write_at.astype(position.dtype), attended[:, :span], cache)
            picked = sampling.greedy(logits[0]).astype(token.dtype)  # [width]: the model's token after each column
            agree = (picked[:k] == draft.astype(token.dtype)) & (columns[:k] < count)
            accepted = jnp.sum(jnp.cumprod(agree.astype(jnp.int32)))
            ended = jnp.isin(picked, eos) & (columns <= accepted)
            emitted = jnp.where(ended.any(), jnp.argmax(ended) + 1, accepted + 1).astype(jnp.int32)
            valid = valid | ((slots >= at) & (slots < at + emitted))[None]
            out = jax.lax.dynamic_update_slice(out, picked, (produced,))
            history = jax.lax.dynamic_update_slice(history, picked.astype(history.dtype), (length,))
            token = jax.lax.dynamic_slice(picked, (emitted - 1,), (1,))
            counts = counts + jnp.stack([jnp.ones((), jnp.int32), count, emitted - 1])
            return (produced + emitted, token, position + emitted, cache, valid, history, length + emitted,
                    done | ended.any(), out, counts)

        history = jax.lax.dynamic_update_slice(history, token.astype(history.dtype), (length,))
        start = (jnp.zeros((), jnp.int32), token, position, list(cache), valid, history, length + 1, done, out, counts)
        ran, token, position, cache, valid, history, length, done, out, counts = jax.lax.while_loop(more, body, start)
        return out[:size, None], ran, token, cache, valid, done, position, history, length - 1, counts

    def _verify_step(self, params, ids, positions, write_at, valid, cache):
        """The verify model's call inside the loop: ([B, width, V] logits, the cache), the cache kept where it was
        placed on a mesh (as the generator's steps keep it)."""
        if rows_apart(self.verify):
            write_at = jnp.broadcast_to(write_at, ids.shape)
        logits, new_cache = call_entry(self.verify, params, ids, positions, write_at, valid, list(cache))
        if self.verify.sharding is not None:
            new_cache = [jax.lax.with_sharding_constraint(c, self.verify.sharding.cache_sharding(c.shape)) for c in new_cache]
        return logits, list(new_cache)
