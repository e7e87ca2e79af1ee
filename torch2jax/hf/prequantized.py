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
    GPTQ (gptq, the v1 and v2 formats): `W.qweight` int32 [in * bits / 32, out], values packed down the input dim,
        the lowest bits first; `W.qzeros` int32 [groups, out * bits / 32] packed along the output dim (v1 stores each
        zero point minus one); `W.scales` [groups, out]; `W.g_idx` [in]: w = (q - zero) * scale of the column's group
        (in activation order, desc_act, a column's group is not its position's: the columns are stored sorted by group,
        and the product reads x's columns in that order: runtime/quantize's packed-int-permuted)
    AWQ (awq, the gemm layout AutoAWQ writes): `W.qweight` int32 [in, out * bits / 32] packed along the output dim in
        the order 0 2 4 6 1 3 5 7 within a word; `W.qzeros` [groups, out * bits / 32] alike; `W.scales` [groups, out]

GPTQ and AWQ weights become the pack-quantized layout as they are read (the same bits in another order: no value
changes, nothing gets larger). Other methods (bitsandbytes, HQQ, ...) are refused, naming the formats that convert.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..capture.checkpoint_files import Checkpoint
from ..errors import InputSpecError
from ..runtime.checkpoint import DeferredArray
from ..runtime.quantize import StoredWeight

CONVERTED = ("fp8 (block-scaled float8, transformers' FineGrainedFP8Config)",
             "compressed-tensors pack-quantized (2, 4 or 8 bits, symmetric or with zero points, per group or channel)",
             "compressed-tensors float-quantized (float8 per channel, tensor, group or block)",
             "GPTQ (2, 4 or 8 bits, per group or channel, the gptq and gptq_v2 formats, in activation order or not)",
             "AWQ (4 bits, the gemm layout)")
PACKED_BITS = (2, 4, 8)  # values that tile an int32 word (other widths straddle words)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column each 4-bit field of an AWQ word holds, lowest bits first


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
    zero_offset: int = 0  # added to each stored zero point (GPTQ's v1 format stores them minus one)


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint's quantization: per weight, from its tensors (`stored_weights`)."""

    method: str  # "fp8", "compressed-tensors", "gptq" or "awq"
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
            elif self.method in ("gptq", "awq") and name.endswith(".qweight"):
                module = name.removesuffix(".qweight")
                stored[f"{module}.weight"], parts = self._gptq_or_awq(checkpoint, module)
                taken.update(parts)
        return stored, taken

    def _gptq_or_awq(self, checkpoint: Checkpoint, module: str) -> tuple[StoredWeight, set[str]]:
        """`module`'s qweight / qzeros / scales (/ g_idx) as a packed-int StoredWeight (read and repacked lazily)."""
        names = {part: f"{module}.{part}" for part in ("qweight", "qzeros", "scales", "g_idx")}
        entries = checkpoint.entries
        missing = [names[part] for part in ("qzeros", "scales") if names[part] not in entries]
        if missing:
            raise InputSpecError(f"{names['qweight']} has no {' or '.join(missing)} beside it")
        bits, method = self.args.bits, self.method
        per_word = 32 // bits
        qweight, scales = entries[names["qweight"]], entries[names["scales"]]
        if method == "gptq":
            rows, cols = int(qweight.shape[1]), int(qweight.shape[0]) * per_word  # [out, in]
        else:
            cols, rows = int(qweight.shape[0]), int(qweight.shape[1]) * per_word
        group = self.args.group_size if self.args.group_size and self.args.group_size > 0 else cols
        groups = -(-cols // group)
        if qweight.dtype != np.int32 or cols % group or tuple(scales.shape) != (groups, rows) or \
                tuple(entries[names["qzeros"]].shape) != (groups, rows // per_word):
            raise InputSpecError(f"{module}: the {method.upper()} tensors' shapes (qweight {list(qweight.shape)}, scales "
                                 f"{list(scales.shape)}, qzeros {list(entries[names['qzeros']].shape)}) do not fit "
                                 f"{bits}-bit values in groups of {group}")
        columns = None  # activation order (desc_act): the stored columns' order that makes each group contiguous
        if names["g_idx"] in entries:
            order = checkpoint.read(names["g_idx"]).astype(np.int64)
            if order.shape != (cols,):
                raise InputSpecError(f"{names['g_idx']} holds {list(order.shape)} group indices for {cols} columns")
            if not np.array_equal(order, np.arange(cols) // group):
                columns = np.argsort(order, kind="stable").astype(np.int32)
                if not np.array_equal(order[columns], np.arange(cols) // group):
                    raise InputSpecError(f"{names['g_idx']}: its groups are not {group} columns each, which GPTQ's "
                                         "activation order gives; this checkpoint's layout is not one torch2jax reads")
        read = checkpoint.read
        offset = self.args.zero_offset

        def values() -> np.ndarray:  # [out, in / per_word]: the input dim packed, as pack-quantized has it
            q = read(names["qweight"])
            unsigned = _unpack_rows(q.T, bits) if method == "gptq" else _unpack_rows(q, bits, AWQ_ORDER).T
            return _pack_rows(unsigned if columns is None else unsigned[:, columns], bits)

        def zero_points() -> np.ndarray:  # [out / per_word, groups]: packed down the output dim
            zeros = _unpack_rows(read(names["qzeros"]), bits, AWQ_ORDER if method == "awq" else None) + offset
            if zeros.max(initial=0) >= 1 << bits:
                raise InputSpecError(f"{names['qzeros']} holds a zero point of {int(zeros.max())}, past {bits} bits (a "
                                     "GPTQ v1 checkpoint whose stored zero wrapped around): re-quantize or export it in "
                                     "the gptq_v2 format")
            return _pack_rows(zeros, bits).T.copy()

        def scale() -> np.ndarray:
            return read(names["scales"]).T.copy()

        stored = StoredWeight(
            "packed-int" if columns is None else "packed-int-permuted", (rows, cols),
            DeferredArray((rows, cols // per_word), np.int32, values, f"{names['qweight']} repacked"),
            DeferredArray((rows, groups), scales.dtype, scale, f"{names['scales']} transposed"),
            (bits, group, cols),
            DeferredArray((rows // per_word, groups), np.int32, zero_points, f"{names['qzeros']} repacked"),
            f"{method.upper()} int{bits} per {'group' if group < cols else 'channel'} with zero points"
            + ("" if columns is None else " in activation order"),
            columns=None if columns is None else DeferredArray((cols,), np.int32, lambda: columns, f"{names['g_idx']} order"))
        return stored, set(names.values()) & set(entries)

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
    if method in ("gptq", "awq"):
        return CheckpointFormat(method, _gptq_or_awq_args(method, quantization))
    raise _Unsupported(method)


NOT_LOADED_BY_TRANSFORMERS = ("gptq", "awq")  # transformers needs GPTQModel (a CUDA build) to load these


def dequantized_reference(auto_class: Any, directory: Any, config: Any) -> Any:
    """The float model of a GPTQ or AWQ checkpoint, which transformers loads only through GPTQModel: built from the config
    (no quantization_config) with every stored weight dequantized in NumPy by its StoredWeight and every other tensor
    as stored. A verification reference for the graph; the unpacking itself is tested against peer converters."""
    import torch

    from ..capture.checkpoint_files import Checkpoint

    checkpoint = Checkpoint.open(directory)
    stored, taken = checkpoint_format(config).stored_weights(checkpoint)
    plain = copy.deepcopy(config)
    plain.quantization_config = None
    del plain.quantization_config
    scales = next((w.scale.dtype for w in stored.values()), np.dtype(np.float32))
    model = auto_class.from_config(plain, dtype=torch.float16 if scales == np.float16 else None)
    state = {name: torch.from_numpy(weight.dequantize()) for name, weight in stored.items()}
    state.update({name: torch.from_numpy(checkpoint.read(name).copy()) for name in checkpoint.entries if name not in taken})
    own = model.state_dict()
    missing = [name for name in own if name not in state and not _tied(model, name)]
    if missing:
        raise InputSpecError(f"{directory}: the checkpoint has no {', '.join(missing[:5])} for the reference model")
    model.load_state_dict({name: value.to(own[name].dtype) for name, value in state.items() if name in own}, strict=False)
    model.tie_weights()
    return model.eval()


def _tied(model: Any, name: str) -> bool:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return name in tied


def _gptq_or_awq_args(method: str, quantization: dict) -> WeightArgs:
    """The weights of a GPTQ or AWQ config: bits, group size, and the stored zero points' offset."""
    bits = int(quantization.get("bits") or quantization.get("w_bit") or 0)
    group = int(quantization.get("group_size") or quantization.get("q_group_size") or -1)
    fmt = str(quantization.get("format") or quantization.get("checkpoint_format") or quantization.get("version")
              or ("gptq" if method == "gptq" else "gemm")).lower()
    if method == "awq":
        if fmt != "gemm":
            raise _Unsupported(f"AWQ in the {fmt} layout (the gemm layout converts)")
        if bits != 4:
            raise _Unsupported(f"AWQ with {bits}-bit weights (4 bits convert)")
        if quantization.get("zero_point") is False:
            raise _Unsupported("AWQ without zero points")
        return WeightArgs("int", bits, "group", group, symmetric=False)
    if fmt not in ("gptq", "gptq_v2"):
        raise _Unsupported(f"GPTQ in the {fmt} format (the gptq and gptq_v2 formats convert)")
    if bits not in PACKED_BITS:
        raise _Unsupported(f"GPTQ with {bits}-bit weights ({', '.join(map(str, PACKED_BITS))} bits convert)")
    return WeightArgs("int", bits, "group", group, symmetric=False, zero_offset=1 if fmt == "gptq" else 0)


def _unpack_rows(packed: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """[n, words] int32 -> [n, words * 32 / bits] unsigned values; field i of a word (the lowest bits first) is value
    `order[i]` of its run (in order when None)."""
    per_word = 32 // bits
    fields = (packed.view(np.uint32)[:, :, None] >> np.arange(0, 32, bits, dtype=np.uint32)) & np.uint32((1 << bits) - 1)
    if order is not None:
        fields = fields[:, :, np.argsort(order)]
    return fields.reshape(packed.shape[0], packed.shape[1] * per_word).astype(np.int64)


def _pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """[n, count] unsigned values (count a multiple of 32 / bits) -> [n, count * bits / 32] int32, the lowest bits
    first: pack-quantized's layout (whose values are offset by 2^(bits - 1), so an unsigned value is stored as it is)."""
    per_word = 32 // bits
    fields = values.astype(np.uint32).reshape(values.shape[0], -1, per_word) << np.arange(0, 32, bits, dtype=np.uint32)
    return np.bitwise_or.reduce(fields, axis=2).view(np.int32)


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
