"""Checkpoints another tool stored quantized, converted as they are stored: no float copy on disk or in the artifact.

config.json's `quantization_config` names the format. Each format here finds, among a checkpoint's tensors, the
weights it stores quantized and the tensors that make each one (values, scales, zero points), as a
runtime/quantize.StoredWeight: the artifact keeps those tensors as they are and dequantizes them in the function, next
to the product that reads the weight (ops/quantized.py), as it does its own int8 / int4.

    fp8 (transformers' FineGrainedFP8, as DeepSeek-V3 and Qwen3-FP8 publish): `W.weight` float8_e4m3fn and
        `W.weight_scale_inv` float32, one per block of `weight_block_size` (128 x 128): w = q * scale of its block
    compressed-tensors float-quantized: `W.weight` float8_e4m3fn and `W.weight_scale`, per output channel ([out, 1]),
        per tensor ([1]), per group of columns or per block (`block_structure`)
    compressed-tensors pack-quantized: `W.weight_packed` int32 (32 / bits values a word, the lowest bits first, offset
        by 2^(bits - 1)), `W.weight_scale` [out, in / group] (per channel: [out, 1]), `W.weight_shape`, and where
        asymmetric `W.weight_zero_point` packed alike down the rows: w = (q - zero_point) * scale

Other methods (GPTQ, AWQ, bitsandbytes, ...) are refused, naming the formats that convert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..capture.checkpoint_files import Checkpoint
from ..errors import InputSpecError
from ..runtime.checkpoint import DeferredArray
from ..runtime.quantize import StoredWeight

CONVERTED = ("fp8 (block-scaled float8, transformers' FineGrainedFP8Config)",
             "compressed-tensors pack-quantized (2, 4 or 8 bits, symmetric or with zero points, per group or channel)",
             "compressed-tensors float-quantized (float8 per channel, tensor, group or block)")
PACKED_BITS = (2, 4, 8)  # values that tile an int32 word (other widths straddle words)


def _float8() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.float8_e4m3fn)


def method_of(config: Any) -> str | None:
    """The config's quantization method (`quant_method`), None for a float checkpoint."""
    quantization = _quantization(config)
    if not quantization:
        return None
    method = quantization.get("quant_method")
    return str(getattr(method, "value", method) or "an unnamed method")


def check_convertible(config: Any, directory: Any) -> None:
    """Refuse a checkpoint whose quantization torch2jax cannot keep as it is stored, saying which formats convert."""
    if method_of(config) is None:
        return
    try:
        checkpoint_format(config)
    except _Unsupported as why:
        raise InputSpecError(
            f"{directory} holds weights quantized with {why} (config.json's quantization_config), which torch2jax cannot "
            f"read. Pre-quantized checkpoints that convert as they are stored: {'; '.join(CONVERTED)}. Otherwise "
            "convert the unquantized checkpoint, with --quantize int8 or int4 to store it quantized") from None


class _Unsupported(Exception):
    """The method and why, for check_convertible's message."""


@dataclass(frozen=True)
class WeightArgs:
    """How one kind of weight is quantized (a compressed-tensors config group's `weights`, or fp8's blocks)."""

    kind: str  # "float" (float8 values) or "int" (packed integers)
    bits: int
    strategy: str  # "block", "channel", "tensor", "group"
    group_size: int | None = None
    block: tuple[int, int] | None = None
    symmetric: bool = True


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint's quantization: per weight, from its tensors (`stored_weights`)."""

    method: str  # "fp8" or "compressed-tensors"
    args: WeightArgs

    def stored_weights(self, checkpoint: Checkpoint) -> tuple[dict[str, StoredWeight], set[str]]:
        """({checkpoint name of each quantized weight (`W.weight`): its StoredWeight}, the names of the tensors they
        take, which no param reads directly)."""
        entries = checkpoint.entries
        ordered = next((name for name in entries if name.endswith(".weight_g_idx")), None)
        if ordered is not None:
            raise InputSpecError(f"{ordered}: weights quantized in activation order (a group index per column) do not "
                                 "convert yet")
        stored, taken = {}, set()
        for name in entries:
            if self.method == "fp8" and name.endswith(".weight_scale_inv"):
                base = name.removesuffix("_scale_inv")
                stored[base] = self._fp8_blocks(checkpoint, base, name)
                taken.update((base, name))
            elif self.method == "compressed-tensors" and name.endswith(".weight_packed"):
                base = name.removesuffix("_packed")
                stored[base], parts = self._packed(checkpoint, base)
                taken.update(parts)
            elif (self.method == "compressed-tensors" and name.endswith(".weight_scale")
                  and getattr(entries.get(name.removesuffix("_scale")), "dtype", None) == _float8()):
                base = name.removesuffix("_scale")
                stored[base] = self._float_scaled(checkpoint, base, name)
                taken.update((base, name))
        return stored, taken

    def _fp8_blocks(self, checkpoint: Checkpoint, weight: str, scale: str) -> StoredWeight:
        entry = checkpoint.entries.get(weight)
        if entry is None or entry.dtype != _float8() or len(entry.shape) != 2:
            raise InputSpecError(f"{scale} has no float8_e4m3fn [out, in] weight {weight} beside it: is this an fp8 checkpoint?")
        block = self.args.block or (128, 128)
        _check_grid(checkpoint, scale, entry.shape, block)
        return StoredWeight("blocks", entry.shape, _part(checkpoint, weight), _part(checkpoint, scale), block,
                            description=f"fp8 blocks of {block[0]}x{block[1]}")

    def _float_scaled(self, checkpoint: Checkpoint, weight: str, scale: str) -> StoredWeight:
        rows, cols = checkpoint.entries[weight].shape
        strategy = self.args.strategy
        block = {"channel": (1, cols), "tensor": (rows, cols), "group": (1, self.args.group_size or 0)}.get(strategy, self.args.block)
        if block is None or not all(block):
            raise InputSpecError(f"{weight}: float-quantized weights per {strategy} do not convert (per channel, tensor, "
                                 "group or block do)")
        _check_grid(checkpoint, scale, (rows, cols), block)
        return StoredWeight("blocks", (rows, cols), _part(checkpoint, weight), _part(checkpoint, scale), tuple(block),
                            description=f"float8 per {strategy}")

    def _packed(self, checkpoint: Checkpoint, weight: str) -> tuple[StoredWeight, set[str]]:
        names = {part: f"{weight}{part}" for part in ("_packed", "_scale", "_shape", "_zero_point")}
        entries = checkpoint.entries
        if names["_scale"] not in entries or names["_shape"] not in entries:
            raise InputSpecError(f"{names['_packed']} has no {names['_scale']} or {names['_shape']} beside it")
        rows, cols = (int(v) for v in checkpoint.read(names["_shape"]))
        args = self.args
        if args.bits not in PACKED_BITS:
            bits = ", ".join(map(str, PACKED_BITS))
            raise InputSpecError(f"{weight}: {args.bits}-bit pack-quantized weights do not convert ({bits} bits do)")
        group = cols if args.strategy == "channel" else args.group_size
        if args.strategy not in ("channel", "group") or not group or cols % group:
            raise InputSpecError(f"{weight}: pack-quantized weights per {args.strategy} (group size {group}) of a weight "
                                 f"{cols} columns wide do not convert (per channel, or groups that divide the columns, do)")
        packed, scale = entries[names["_packed"]], entries[names["_scale"]]
        words = -(-cols * args.bits // 32)
        if packed.dtype != np.int32 or packed.shape != (rows, words) or int(np.prod(scale.shape)) != rows * cols // group:
            raise InputSpecError(f"{weight}: the packed tensors' shapes ({list(packed.shape)}, scales {list(scale.shape)}) do "
                                 f"not fit a {rows}x{cols} weight of {args.bits}-bit values in groups of {group}")
        zero = None
        if not args.symmetric:
            if names["_zero_point"] not in entries:
                raise InputSpecError(f"{weight} is quantized asymmetric but {names['_zero_point']} is missing")
            zero = _part(checkpoint, names["_zero_point"])
        stored = StoredWeight("packed-int", (rows, cols), _part(checkpoint, names["_packed"]), _part(checkpoint, names["_scale"]),
                              (args.bits, group, cols), zero,
                              f"int{args.bits} packed per {args.strategy}{'' if args.symmetric else ' with zero points'}")
        return stored, set(names.values()) & set(entries)


def checkpoint_format(config: Any) -> CheckpointFormat | None:
    """The config's quantization as a CheckpointFormat (None for a float checkpoint); raises _Unsupported naming the
    method (and what of it) for one that does not convert."""
    method = method_of(config)
    if method is None:
        return None
    quantization = _quantization(config)
    if method == "fp8":
        block = quantization.get("weight_block_size")
        if block is None or len(block) != 2:
            raise _Unsupported("fp8 without a weight_block_size (per-tensor fp8 scales)")
        if quantization.get("activation_scheme", "dynamic") != "dynamic":
            raise _Unsupported(f"fp8 with {quantization.get('activation_scheme')} activation scales")
        return CheckpointFormat("fp8", WeightArgs("float", 8, "block", block=(int(block[0]), int(block[1]))))
    if method == "compressed-tensors":
        return CheckpointFormat("compressed-tensors", _compressed_tensors_args(quantization))
    raise _Unsupported(method)


def _compressed_tensors_args(quantization: dict) -> WeightArgs:
    """The one weight quantization of a compressed-tensors config (its config groups alike), weight-only."""
    fmt = quantization.get("format")
    if fmt not in ("pack-quantized", "float-quantized"):
        raise _Unsupported(f"compressed-tensors in the {fmt} format (pack-quantized and float-quantized convert)")
    groups = list((quantization.get("config_groups") or {}).values())
    if not groups:
        raise _Unsupported("compressed-tensors without config_groups")
    kinds = {repr(sorted((group.get("weights") or {}).items())) for group in groups}
    if len(kinds) > 1:
        raise _Unsupported("compressed-tensors with config groups quantized differently (mixed precision)")
    if any(group.get("input_activations") or group.get("output_activations") for group in groups):
        raise _Unsupported("compressed-tensors with quantized activations (only weight-only schemes convert)")
    weights = groups[0].get("weights") or {}
    kind, bits = weights.get("type"), int(weights.get("num_bits") or 0)
    if (fmt, kind) not in (("pack-quantized", "int"), ("float-quantized", "float")) or (kind == "float" and bits != 8):
        raise _Unsupported(f"compressed-tensors {fmt} with {bits}-bit {kind} weights")
    if weights.get("actorder") not in (None, "static", "weight"):  # activation order: group indices per column
        raise _Unsupported(f"compressed-tensors with actorder {weights.get('actorder')!r} (a g_idx per column)")
    block = weights.get("block_structure")
    return WeightArgs(kind, bits, str(weights.get("strategy")), weights.get("group_size"),
                      tuple(int(b) for b in block) if block else None, bool(weights.get("symmetric", True)))


def _quantization(config: Any) -> dict:
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return {}
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict() if hasattr(quantization, "to_dict") else vars(quantization)
    return dict(quantization)


def _part(checkpoint: Checkpoint, name: str) -> DeferredArray:
    entry = checkpoint.entries[name]
    return DeferredArray(entry.shape, entry.dtype, lambda: checkpoint.read(name), f"checkpoint tensor {name}")


def _check_grid(checkpoint: Checkpoint, scale: str, shape: tuple[int, ...], block: tuple[int, int]) -> None:
    grid = (-(-shape[0] // block[0])) * (-(-shape[1] // block[1]))
    entry = checkpoint.entries[scale]
    floating = np.issubdtype(entry.dtype, np.floating) or entry.dtype.kind == "V"  # bfloat16 is a "V" kind
    if int(np.prod(entry.shape)) != grid or not floating:
        raise InputSpecError(f"{scale} holds {entry.dtype}{list(entry.shape)}: a [{shape[0]}, {shape[1]}] weight in blocks of "
                             f"{block[0]}x{block[1]} has {grid} scales")
