"""Automatic prefix caching: the keys and values of prompts' full blocks kept on the device, so a request whose prompt
starts with tokens an earlier prompt had (a system prompt, few-shot examples) copies them instead of computing them.

A prompt is cut into blocks of `block_size` tokens; block i is named by a hash chain over the adapter and every token up
to the end of block i (sha256 of the parent's name and the block's tokens), so a name stands for the whole prefix, not
for the block's tokens alone. Keys and values at a position depend only on the tokens up to it (causal attention, the
row's own positions from 0), so a block computed in one request is exactly what another request with the same prefix
would compute. The pool holds `blocks` blocks per cache tensor ([heads, blocks * block_size, dim] per layer's keys or
values, one row's layout with block-sized slots); names map to pool blocks in least-recently-used order, and a full pool
evicts the least recently used block.

The engine (serve/engine.py) asks `lookup` how many leading tokens of each prompt are cached (never the last token: its
logits are the first new token's), copies them into a group's scratch cache with `copy_in`, and after the group's
prefill stores the blocks the pool lacks with `store`. Recurrent states (a state-space layer's) hold no per-token
slots, so an artifact with them has no prefix cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..ir import dtypes

BLOCK_SIZE = 16  # tokens per block, as vLLM's default


@dataclass
class PrefixStats:
    """Prompt tokens looked up and prompt tokens served from the cache (not computed), since the start."""

    queried: int = 0
    hits: int = 0


class PrefixCache:
    """The pool of cached blocks on the device and the table of their names (module docstring)."""

    def __init__(self, generator, blocks: int, block_size: int = BLOCK_SIZE):
        spec = generator.spec
        self.block_size, self.blocks, self.max_len = block_size, blocks, spec.max_cache_len
        types = spec.tensor_dtypes()
        # each cache tensor [batch, heads, slots, dim] -> a pool [heads, blocks * block_size, dim]
        self.pool = [jnp.zeros((shape[0], blocks * block_size, *shape[2:]), dtypes.jax_dtype(dtype))
                     for shape, dtype in zip(spec.cache_shapes, types)]
        self.table: OrderedDict[bytes, int] = OrderedDict()  # name -> pool block, least recently used first
        self.free = list(range(blocks - 1, -1, -1))
        self.stats = PrefixStats()
        self._copy_in = jax.jit(_copy_in, donate_argnums=(0,))
        self._store = jax.jit(_store, donate_argnums=(0,))

    @staticmethod
    def supports(generator) -> bool:
        """Whether an artifact's cache can be cached by prefix: attention caches only ([batch, heads, slots, dim])."""
        return "state" not in generator.spec.cache_kinds and all(len(shape) == 3 for shape in generator.spec.cache_shapes)

    def names(self, prompt: list[int], adapter: int, limit: int) -> list[bytes]:
        """The names of the prompt's full blocks among its first `limit` tokens."""
        names, parent = [], hashlib.sha256(f"adapter {adapter}".encode()).digest()
        for start in range(0, limit - self.block_size + 1, self.block_size):
            block = np.asarray(prompt[start:start + self.block_size], np.int64).tobytes()
            parent = hashlib.sha256(parent + block).digest()
            names.append(parent)
        return names

    def lookup(self, prompt: list[int], adapter: int) -> list[int]:
        """The pool blocks holding the prompt's longest cached prefix (block by block, never its last token); touched
        as most recently used."""
        found = []
        for name in self.names(prompt, adapter, len(prompt) - 1):
            block = self.table.get(name)
            if block is None:
                break
            self.table.move_to_end(name)
            found.append(block)
        return found

    def copy_in(self, scratch: list[jax.Array], row: int, blocks: list[int], first_slot: int) -> list[jax.Array]:
        """Write these pool blocks into row `row` of a group's scratch cache, from slot `first_slot` on."""
        sources, slots = self._slot_maps(blocks, first_slot)
        return self._copy_in(scratch, self.pool, jnp.asarray(row, jnp.int32), jnp.asarray(sources), jnp.asarray(slots))

    def store(self, scratch: list[jax.Array], row: int, prompt: list[int], adapter: int, first_slot: int) -> None:
        """Keep the full blocks of a prefilled prompt (row `row` of the scratch cache, its token 0 at `first_slot`) that
        the pool lacks, evicting the least recently used blocks for them."""
        names = self.names(prompt, adapter, len(prompt))
        chosen, at = [], []
        for index, name in enumerate(names):
            if name in self.table:
                self.table.move_to_end(name)
                continue
            block = self._take(protect=len(chosen))
            if block is None:
                break
            self.table[name] = block
            chosen.append(block)
            at.append(index)
        if not chosen:
            return
        slots = np.full(self.max_len, self.max_len, np.int32)  # scratch slot read for each pool slot written
        dest = np.full(self.max_len, self.blocks * self.block_size, np.int32)  # out of range: dropped
        for n, (block, index) in enumerate(zip(chosen, at)):
            span = slice(n * self.block_size, (n + 1) * self.block_size)
            slots[span] = first_slot + index * self.block_size + np.arange(self.block_size)
            dest[span] = block * self.block_size + np.arange(self.block_size)
        self.pool = self._store(self.pool, scratch, jnp.asarray(row, jnp.int32), jnp.asarray(slots), jnp.asarray(dest))

    def _take(self, protect: int) -> int | None:
        """A free pool block, evicting the least recently used name when none is free; None when every block is one of
        the `protect` most recently taken (the blocks this store is filling)."""
        if self.free:
            return self.free.pop()
        if len(self.table) <= protect:
            return None
        _, block = self.table.popitem(last=False)
        return block

    def _slot_maps(self, blocks: list[int], first_slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(pool slot read, scratch slot written) for each of max_len copies; unused copies write out of range."""
        sources = np.zeros(self.max_len, np.int32)
        slots = np.full(self.max_len, self.max_len, np.int32)
        for n, block in enumerate(blocks):
            span = slice(n * self.block_size, (n + 1) * self.block_size)
            sources[span] = block * self.block_size + np.arange(self.block_size)
            slots[span] = first_slot + n * self.block_size + np.arange(self.block_size)
        return sources, slots

    def warm_up(self, scratch: list[jax.Array]) -> list[jax.Array]:
        """Compile both copies (on a throwaway scratch cache, which comes back), touching no block."""
        nothing = np.full(self.max_len, self.max_len, np.int32)
        scratch = self._copy_in(scratch, self.pool, jnp.asarray(0, jnp.int32), jnp.zeros(self.max_len, jnp.int32),
                                jnp.asarray(nothing))
        self.pool = self._store(self.pool, scratch, jnp.asarray(0, jnp.int32), jnp.asarray(nothing),
                                jnp.full(self.max_len, self.blocks * self.block_size, jnp.int32))
        return scratch


def _copy_in(scratch, pool, row, sources, slots):
    # s[row, :, slots] is [copies, heads, dim]: the two array indices, apart, put their dimension first
    return [s.at[row, :, slots].set(jnp.swapaxes(p[:, sources], 0, 1).astype(s.dtype), mode="drop")
            for s, p in zip(scratch, pool)]


def _store(pool, scratch, row, slots, dest):
    return [p.at[:, dest].set(s[row][:, jnp.minimum(slots, s.shape[2] - 1)].astype(p.dtype), mode="drop")
            for p, s in zip(pool, scratch)]
