"""Automatic prefix caching (serve/prefix_cache.py, serve/engine.py): requests whose prompts share a prefix with an
earlier prompt copy its cached blocks instead of computing them, and get exactly the tokens they get generated alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import torch2jax
from torch2jax.serve.engine import BatchEngine
from torch2jax.serve.prefix_cache import BLOCK_SIZE, PrefixCache
from torch2jax.serve.scheduler import Request, Scheduler

from ..generate.lms import write_lm
from .test_scheduler import alone, run

CACHE, ROWS, CHUNK = 128, 4, 16


@pytest.fixture(scope="module")
def g(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    return torch2jax.convert_hf(f"hf:{write_lm('llama', root)}", max_cache_len=CACHE, max_batch=ROWS)


def counted_prefills(engine: BatchEngine) -> list[tuple[int, int]]:
    """Record the (tokens, attended span) of every prefill chunk the engine runs."""
    shapes, prefill = [], engine._prefill

    def spy(cache, ids, positions, write_at, valid, *rest):
        shapes.append((ids.shape[1], valid.shape[1]))
        return prefill(cache, ids, positions, write_at, valid, *rest)

    engine._prefill = spy
    return shapes


def test_shared_prefixes_are_copied_not_computed_and_every_reply_equals_generating_alone(g):
    """A first request leaves its prompt's three full blocks in the pool; two requests starting with the same 48 tokens
    then run one prefill chunk instead of four (the chunks before every member's cached tokens are skipped, and the
    chunk run has a shape warm-up compiles); a group with an unrelated prompt skips nothing its member needs. Every
    reply equals the request generated alone, and the usage counts what was copied."""
    engine = BatchEngine(g, ROWS, chunk=CHUNK, prefix_cache_tokens=256)
    shapes = counted_prefills(engine)
    scheduler = Scheduler(engine)
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, 128, 48).tolist()
    finals = {}  # the last event of each request, by its id

    def request(prompt: list[int], tokens: int) -> Request:
        made = Request(prompt, tokens, lambda e: e.finish_reason and finals.__setitem__(made.id, e), end_tokens=())
        return made

    first = request(prefix + rng.integers(3, 128, 5).tolist(), 6)
    run(scheduler, {0: [first]})
    assert first.cached_tokens == 0 and len(shapes) == 4 and len(engine.prefix.table) == 3
    shared = []
    for n in (4, 2):
        shared.append(request(prefix + rng.integers(3, 128, n).tolist(), 7))
    shapes.clear()
    run(scheduler, {0: shared})
    # both prompts padded to 64 (chunks [0, 16, 32, 48, 64]); every member has its tokens before slot 48 cached
    assert shapes == [(CHUNK, 64)], shapes
    assert [r.cached_tokens for r in shared] == [48 - 12, 48 - 14]
    assert [finals[r.id].cached_tokens for r in shared] == [36, 34]
    other = request(rng.integers(3, 128, 30).tolist(), 5)
    late = request(prefix + rng.integers(3, 128, 9).tolist(), 5)
    run(scheduler, {0: [other, late]})
    # padded to 64: the unrelated prompt starts at slot 34, so the chunks from 32 on run; the late one's first 25 tokens
    # (from slot 7) are copied
    assert other.cached_tokens == 0 and late.cached_tokens == 32 - 7
    for r in [first, *shared, other, late]:
        assert r.tokens == alone(g, r), (len(r.prompt), r.cached_tokens)
    stats = scheduler.stats()["prefix_cache"]
    assert stats["hit_tokens"] == 36 + 34 + 25
    assert stats["queried_tokens"] == sum(len(r.prompt) for r in [first, *shared, other, late])
    steps = engine.step_shapes()["chunks"][2]
    assert all(shape in steps for shape in shapes), (shapes, steps)


def test_blocks_round_trip_adapters_have_their_own_names_and_the_least_recently_used_go_first(g):
    cache = PrefixCache(g, blocks=3)
    scratch = [jax.random.normal(jax.random.key(i), (2, *shape)) for i, shape in enumerate(g.spec.cache_shapes)]
    prompt = list(range(3, 3 + 2 * BLOCK_SIZE + 1))
    cache.store(scratch, 1, prompt, adapter=-1, first_slot=5)
    blocks = cache.lookup(prompt, adapter=-1)
    assert len(blocks) == 2 and cache.lookup(prompt, adapter=0) == []
    assert cache.lookup(prompt[: 2 * BLOCK_SIZE], adapter=-1) == blocks[:1]  # never the last token's block
    fresh = [jnp.zeros_like(s) for s in scratch]
    copied = cache.copy_in(fresh, 0, blocks, first_slot=9)
    for before, after in zip(scratch, copied):
        np.testing.assert_array_equal(after[0, :, 9:9 + 2 * BLOCK_SIZE], before[1, :, 5:5 + 2 * BLOCK_SIZE])
        assert not np.asarray(after[0, :, :9]).any() and not np.asarray(after[1]).any()
    # a third block is free; a second prompt of two blocks takes it and evicts the least recently used one
    other = list(range(50, 50 + 2 * BLOCK_SIZE + 1))
    cache.lookup(prompt, adapter=-1)  # the first prompt's blocks are the most recently used ...
    cache.store(scratch, 0, other, adapter=-1, first_slot=0)
    assert len(cache.lookup(other, adapter=-1)) == 2
    assert cache.lookup(prompt, adapter=-1) == []  # ... until the second prompt's were used since: its first block went
    assert len(cache.table) == 3 and not cache.free
