"""Checking a converted causal LM against transformers' own greedy generate, as `convert` checks a forward pass.

Two prompts of random token ids, one left-padded to the other's length, run through both; every
generated token must be equal (float32). A bfloat16 conversion is compared with transformers in
bfloat16 on its first tokens only (see `BFLOAT16_TOKENS`): later tokens may part at a near-tie.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import VerificationError

BFLOAT16_TOKENS = 8


@dataclass
class GenerationCheck:
    tokens: int
    rows: list[tuple[list[int], list[int]]]  # (ours, transformers') new tokens per row

    def summary(self) -> str:
        lines = []
        for row, (ours, theirs) in enumerate(self.rows):
            same = _common_prefix(ours, theirs)
            lines.append(f"  row {row}: {same} of {self.tokens} greedy tokens equal to transformers' generate")
        return "\n".join(lines)

    @property
    def ok(self) -> bool:
        return all(_common_prefix(ours, theirs) >= self.tokens for ours, theirs in self.rows)


def verify_generation(lm: torch.nn.Module, generator, tokens: int = 16, seed: int = 0) -> GenerationCheck:
    """Greedy-generate `tokens` tokens for two prompts (one left-padded) with both; no end token stops either."""
    lengths = (7, 4)
    if max(lengths) + tokens > generator.spec.max_cache_len:
        tokens = generator.spec.max_cache_len - max(lengths)
    rng = np.random.default_rng(seed)
    vocab = generator.spec.vocab_size
    pad = generator.spec.pad_token_id
    ids = np.full((2, max(lengths)), pad, np.int64)
    mask = np.zeros_like(ids, bool)
    for row, length in enumerate(lengths):
        ids[row, max(lengths) - length:] = rng.integers(0, vocab, length)
        mask[row, max(lengths) - length:] = True
    batch = min(2, generator.spec.max_batch)
    ours = generator.generate(ids[:batch], attention_mask=mask[:batch], max_new_tokens=tokens, eos_token_id=[])
    saved = lm.generation_config.eos_token_id
    lm.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            theirs = lm.generate(torch.from_numpy(ids[:batch]), attention_mask=torch.from_numpy(mask[:batch]).long(),
                                 max_new_tokens=tokens, do_sample=False, pad_token_id=pad).numpy()
    finally:
        lm.generation_config.eos_token_id = saved
    width = ids.shape[1]
    rows = [(ours[r, width:].tolist(), theirs[r, width:].tolist()) for r in range(batch)]
    compared = tokens if generator.spec.cache_dtype != "bfloat16" else min(tokens, BFLOAT16_TOKENS)
    return GenerationCheck(compared, rows)


def check_generation(result: GenerationCheck) -> None:
    if not result.ok:
        raise VerificationError(
            "generation differs from transformers' greedy generate:\n" + result.summary()
            + "\n(ours vs transformers, new tokens per row: "
            + "; ".join(f"{o[:result.tokens]} vs {t[:result.tokens]}" for o, t in result.rows) + ")"
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
