"""The Omni thinkers' (Qwen2.5-Omni, Qwen3-Omni-MoE) multimodal rotary positions for text and images, computed in NumPy
as their own `get_rope_index` computes them, and the refusal of what they take besides images (audio, video).

Their rope index is not Qwen2-VL's run-of-image-tokens one (image_positions.rope_index): a row's images are counted
as its vision-start tokens followed by an image token, and each counted image is found by a search from where the last
one ended (Qwen2.5-Omni: the next image token, the token before it its "start"; Qwen3-Omni: the next vision-start
token), its grid's tokens (t * h * w / merge^2, not the run's length) taking 3-D positions, the token after them its
"end". For the processor's prompts (<vision start> image tokens <vision end>) that is Qwen2-VL's positions; for
others it is not (image tokens after no vision-start token take text positions), so it is ported as it is, and a
prompt on which transformers' own index fails is refused. A prompt of text alone takes the mask's running positions,
each padding position 1, and a delta from their largest (1 for a one-token row beside longer ones).

Audio and video are not converted (the thinker's text and image path only): a prompt holding an audio, audio-start or
video token, or a call with audio or video inputs, is refused."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import InputSpecError

VARIANTS = ("qwen2_5_omni", "qwen3_omni")
# generate's inputs for the audio encoder and for videos, which the converted thinker does not take
AUDIO_VIDEO_INPUTS = ("input_features", "feature_attention_mask", "audio_feature_lengths", "use_audio_in_video",
                      "video_grid_thw", "video_second_per_grid")


@dataclass(frozen=True)
class OmniTokens:
    """What an Omni thinker's rope index reads from its config besides the image token and the merge: the manifest's
    vision section's `omni`."""

    variant: str  # "qwen2_5_omni": each image found by the next image token; "qwen3_omni": by the next vision start
    vision_start_token_id: int
    video_token_id: int
    audio_token_id: int
    audio_start_token_id: int
    position_id_per_seconds: int  # an image's frames' temporal step (images have one frame: no effect on positions)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: Any) -> OmniTokens | None:
        """None for a section without one; TypeError / KeyError / ValueError for a malformed one."""
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("variant") not in VARIANTS:
            raise ValueError(f"omni must name a variant of {VARIANTS}, got {data!r}")
        names = ("vision_start_token_id", "video_token_id", "audio_token_id", "audio_start_token_id",
                 "position_id_per_seconds")
        return OmniTokens(str(data["variant"]), *(int(data[name]) for name in names))


def refuse_audio_video(inputs: dict) -> None:
    """InputSpecError naming the audio or video inputs given to generate (the converted thinker takes text and
    images)."""
    given = sorted(name for name in AUDIO_VIDEO_INPUTS if inputs.get(name) is not None)
    if given:
        raise InputSpecError(f"audio and video inputs are not supported ({', '.join(given)}): this artifact is the "
                             "model's text and image path (input_ids, pixel_values, image_grid_thw)")


def omni_rope_index(ids: np.ndarray, mask: np.ndarray, grids: np.ndarray | None, image_token_id: int, merge: int,
                    omni: OmniTokens) -> tuple[np.ndarray, np.ndarray]:
    """An Omni thinker's `get_rope_index` for text and images: ([3, B, L] int64 positions, deltas [B]); see the module
    docstring. InputSpecError for a prompt holding audio or video tokens, and where transformers' own index fails."""
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    for token, what in ((omni.audio_token_id, "audio"), (omni.audio_start_token_id, "audio start"),
                        (omni.video_token_id, "video")):
        found = np.argwhere(mask & (ids == token))
        if found.size:
            row, column = (int(v) for v in found[0])
            raise InputSpecError(f"the prompt holds the {what} token (id {token}; row {row}, position {column}): audio "
                                 "and video are not supported, this artifact is the model's text and image path; give "
                                 "a prompt of text and images")
    if grids is None:  # transformers' text-only positions: padding at 1, the delta from the largest
        text = np.where(mask, np.cumsum(mask, axis=1) - 1, 1).astype(np.int64)
        return np.broadcast_to(text, (3, *ids.shape)).copy(), text.max(axis=1) + 1 - mask.sum(axis=1)
    grids = np.asarray(grids, np.int64).reshape(-1, 3).tolist()
    positions = np.full((3, *ids.shape), 1 if omni.variant == "qwen2_5_omni" else 0, np.int64)
    deltas = np.zeros(ids.shape[0], np.int64)
    used = 0  # grids are taken in order across the batch, one per counted image
    for b in range(ids.shape[0]):
        row = ids[b][mask[b]].tolist()
        parts, used = _row_positions(row, grids, used, image_token_id, merge, omni, b)
        positions[:, b, mask[b]] = parts
        deltas[b] = parts.max() + 1 - len(row) if parts.size else 0
    return positions, deltas


def _row_positions(row: list[int], grids: list[list[int]], used: int, image_token_id: int, merge: int,
                   omni: OmniTokens, b: int) -> tuple[np.ndarray, int]:
    """One row's [3, len(row)] positions and the grids used after it: transformers' loop over the row's counted
    images (vision start then image token), each found by its search from `st`."""
    start_token = omni.vision_start_token_id
    starts = [i for i, token in enumerate(row) if token == start_token]
    if starts and starts[-1] == len(row) - 1:
        raise _failing(b, "it ends with a vision start token (transformers' rope index reads the token after it)")
    images = sum(row[i + 1] == image_token_id for i in starts)
    parts: list[np.ndarray] = []

    def following() -> int:  # transformers' st_idx: the last block's largest position + 1
        return int(parts[-1].max()) + 1 if parts else 0

    def text(count: int) -> None:
        if count:
            parts.append(np.broadcast_to(np.arange(count) + following(), (3, count)))

    st = 0
    for _ in range(images):
        if omni.variant == "qwen2_5_omni":  # the next image token; the token before it is its start
            try:
                found = row.index(image_token_id, st)
            except ValueError:
                raise _failing(b, "an image counted by its vision start token has no image token after the last "
                                  "image") from None
            if found - st - 1 < 0:
                raise _failing(b, "an image's tokens begin the row or follow the previous image's end token "
                                  "directly, with no start token before them")
            text(found - st - 1)
            text(1)
            first = found
        else:  # the next vision start token, an image token after it
            try:
                found = row.index(start_token, st)
            except ValueError:
                raise _failing(b, "an image counted by its vision start token is not found after the last "
                                  "image") from None
            if row[found + 1] != image_token_id:
                raise _failing(b, f"its vision start token at {found} is not followed by an image token")
            text(found - st)
            text(1)
            first = found + 1
        if used >= len(grids):
            raise InputSpecError(f"the prompts hold more images (vision start, image token) than image_grid_thw's "
                                 f"{len(grids)}")
        t, h, w = grids[used]
        used += 1
        frames = np.arange(t) * omni.position_id_per_seconds
        tt, hh, ww = np.meshgrid(frames, np.arange(h // merge), np.arange(w // merge), indexing="ij")
        block = np.stack([tt, hh, ww]).reshape(3, -1) + following()
        length = t * h * w // (merge * merge)
        if block.shape[1] != length:
            raise InputSpecError(f"image_grid_thw {[t, h, w]}: h and w must be multiples of the merge {merge}")
        parts.append(block)
        text(1)  # the token after the grid's tokens: its end
        st = first + length + 1
    if st < len(row):
        text(len(row) - st)
    out = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)
    if out.shape[1] != len(row):
        raise _failing(b, f"its images' grids take {out.shape[1]} positions for its {len(row)} tokens (an image's "
                          "tokens run past the prompt, or fewer than its grid's)")
    return out.astype(np.int64), used


def _failing(b: int, why: str) -> InputSpecError:
    return InputSpecError(f"prompt row {b}: the model's rope index (transformers' get_rope_index) fails on it: {why}. "
                          "Write each image as the processor does: <vision start>, its image tokens, <vision end>")
