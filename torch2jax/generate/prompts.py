"""What a prompt may be, checked once for every caller before anything runs: Generator.generate and
VisionLanguageGenerator.generate (prompts), Seq2SeqGenerator.generate (sources, or audio features) and the server's
scheduler (one client's prompt) refuse the same things, each in the words its caller knows (`Wording`: the names of
its arguments, and whether converting again is a remedy open to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputSpecError


class PromptError(InputSpecError):
    """A refused prompt that says which argument is at fault ("ids" or "max_new_tokens"), so that a server can name
    its client's field without reading the message."""

    def __init__(self, message: str, argument: str):
        super().__init__(message)
        self.argument = argument


@dataclass(frozen=True)
class Wording:
    """The names a check's errors use."""

    ids: str  # the token ids
    max_new_tokens: str  # the count of tokens to generate
    holder: str  # whose limits they are
    cache_remedy: str  # what to do about a prompt that does not fit the cache


# a Python caller of generate, who can convert the model again with larger limits
CALLER = Wording("input_ids", "max_new_tokens", "this artifact",
                 "shorten the prompt, ask for fewer tokens, or convert again with a larger --max-cache-len")
# a client of `torch2jax serve`, who cannot
CLIENT = Wording("the prompt", "max_tokens", "this model", "shorten the prompt or ask for fewer tokens")


def check_prompt(input_ids: Any, attention_mask: Any, spec: Any, max_new_tokens: Any,
                 wording: Wording = CALLER, image_token: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A causal LM's prompts, checked against its GenerationSpec (`spec`): (ids [B, L], mask [B, L] bool). They must be integer
    ids inside the vocabulary, at most max_batch rows, left-padded where `attention_mask` marks pads (every row's last
    token real), and leave room in the cache for `max_new_tokens`. A vision-language model's `image_token` may lie past
    the text vocabulary: its step embeds that id as token 0 (the image's feature replaces it)."""
    ids = token_ids(input_ids, spec.max_batch, spec.vocab_size, "prompt", wording, image_token)
    check_max_new_tokens(max_new_tokens, wording)
    length = ids.shape[1]
    if length + max_new_tokens > spec.max_cache_len:
        raise PromptError(
            f"a prompt of {length} tokens plus {wording.max_new_tokens}={max_new_tokens} needs {length + max_new_tokens} "
            f"cache slots, more than {wording.holder}'s max_cache_len ({spec.max_cache_len}): {wording.cache_remedy}",
            "max_new_tokens" if length < spec.max_cache_len else "ids",
        )
    mask = attention_mask_of(attention_mask, ids)
    if not mask[:, -1].all() or (np.diff(mask.astype(np.int8), axis=1) < 0).any():
        raise InputSpecError(
            "attention_mask has padding after a prompt's tokens: pad prompts on the left "
            "(tokenizer.padding_side = 'left'), so every row's last token is real"
        )
    return ids, mask


def check_source(input_ids: Any, attention_mask: Any, input_features: Any, spec: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """An encoder-decoder's sources, checked against its Seq2SeqSpec: token ids (ids [B, S], mask [B, S] bool, padded on
    either side where `attention_mask` is 0, each with a real token, none longer than max_source_len), or for an audio
    encoder (Whisper) its [B, mel, frames] float features (features, None)."""
    if spec.takes_features:
        want = list(spec.feature_shape or ())
        if input_ids is not None or input_features is None:
            raise InputSpecError(f"this artifact's encoder reads audio features: pass input_features [batch, {want[0]}, "
                                 f"{want[1]}] (log-mel frames, as the model's feature extractor makes them), not input_ids")
        return _features(input_features, want, spec.max_batch), None
    if input_features is not None or input_ids is None:
        raise InputSpecError("this artifact's encoder reads token ids: pass input_ids [batch, length] (and attention_mask)")
    ids = token_ids(input_ids, spec.max_batch, spec.vocab_size, "source")
    if ids.shape[1] > spec.max_source_len:
        raise InputSpecError(f"a source of {ids.shape[1]} tokens is longer than this artifact's max_source_len "
                             f"({spec.max_source_len}): shorten it or convert again with a larger --max-source-len")
    mask = attention_mask_of(attention_mask, ids)
    if not mask.any(axis=1).all():
        raise InputSpecError("attention_mask marks every token of a source as padding: each source needs a token")
    return ids, mask


def _features(input_features: Any, want: list[int], max_batch: int) -> np.ndarray:
    features = np.asarray(input_features)
    if features.ndim == 2:
        features = features[None]
    if list(features.shape[1:]) != want or not np.issubdtype(features.dtype, np.floating):
        raise InputSpecError(f"input_features must be floats of shape [batch, {want[0]}, {want[1]}], got "
                             f"{features.dtype}{list(features.shape)} (pad or cut the audio to the model's frame count)")
    if not 1 <= features.shape[0] <= max_batch:
        raise InputSpecError(f"batch of {features.shape[0]} sources: this artifact was converted for 1 to {max_batch} "
                             "(convert again with a larger --max-batch, or split the batch)")
    return features


def check_new_tokens_fit_decoder(max_new_tokens: Any, spec: Any) -> None:
    """An encoder-decoder's decoder starts from its start token: `max_new_tokens` must fit its self-attention cache."""
    check_max_new_tokens(max_new_tokens)
    if max_new_tokens > spec.max_cache_len:
        raise InputSpecError(
            f"max_new_tokens={max_new_tokens} is more than this artifact's max_cache_len ({spec.max_cache_len}), "
            "the decoder's length: ask for fewer tokens or convert again with a larger --max-cache-len"
        )


def check_max_new_tokens(max_new_tokens: Any, wording: Wording = CALLER) -> None:
    """How many tokens to generate: an integer >= 1."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise PromptError(f"{wording.max_new_tokens} must be an integer >= 1 (got {max_new_tokens!r})", "max_new_tokens")


def token_ids(input_ids: Any, max_batch: int, vocab_size: int, row: str, wording: Wording = CALLER,
              image_token: int | None = None) -> np.ndarray:
    """[B, L] integer ids (one row may come as [L]) of 1 to `max_batch` rows of `row`s, not empty, inside the
    vocabulary (or `image_token`, check_prompt's)."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise PromptError(f"{wording.ids} must be integer token ids of shape [batch, length], got {ids.dtype}{list(ids.shape)}", "ids")
    batch, length = ids.shape
    if not 1 <= batch <= max_batch:
        raise PromptError(f"batch of {batch} {row}s: this artifact was converted for 1 to {max_batch} "
                          "(convert again with a larger --max-batch, or split the batch)", "ids")
    if length == 0:
        raise PromptError(f"{wording.ids} is empty: give at least one {row} token", "ids")
    text = ids if image_token is None else ids[ids != image_token]
    if text.size and (text.min() < 0 or text.max() >= vocab_size):
        raise PromptError(f"{wording.ids} holds ids outside the vocabulary [0, {vocab_size})", "ids")
    return ids


def attention_mask_of(attention_mask: Any, ids: np.ndarray) -> np.ndarray:
    """[B, L] bool: which tokens are real (all, without a mask); its shape must be the ids'."""
    mask = np.ones_like(ids, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool).reshape(ids.shape[0], -1)
    if mask.shape != ids.shape:
        raise InputSpecError(f"attention_mask has shape {list(mask.shape)}, input_ids {list(ids.shape)}: they must match")
    return mask
