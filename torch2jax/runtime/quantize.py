"""Weight-only quantization of a converted model: the weights of its matrix products held as int8 or int4.

Decoding a language model at small batch reads every weight once per token, so its speed is bound by the
bytes of weights. `quantize_model` rewrites the portable graph so that each such weight's placeholder
becomes two params, the quantized values and their scales, and a node that turns them back into the
weight (ops/quantized.py); every consumer reads that node as it read the placeholder, so the graph,
its `graph.json` and the StableHLO all hold the quantized form, and the artifact stores int8 / int4.

    int8   symmetric, one scale per output row: q = round(w / s), s = max|w_row| / 127
    int4   symmetric, one scale per group of `group_size` input columns: s = max|w_group| / 7,
           q in [-8, 7], two per byte: the low nibbles hold the first h columns (h = group_size *
           ceil(groups / 2)), the high nibbles the rest, so unpacking is elementwise (ops/quantized.py)
    int8-dynamic  the int8 weights, and each row of a Linear's input quantized the same way when it is
           multiplied (one scale per row, max|x_row| / 127): int8 x int8 products accumulated in int32, which
           x86 and GPU units run natively, so no float copy of the weight is made (ops/quantized.py)

Quantized are the 2-d params read only as the weight of a matrix product (how nn.Linear reaches the
graph: `mm` / `addmm` of the weight transposed): a decoder's projections and its LM head. Embeddings,
norms, biases and a head tied to the embedding keep the model's dtype. A param whose values are read
later (a DeferredArray, streamed from safetensors) is quantized as it is read, once for both parts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np

from ..errors import ExportError, InputSpecError
from ..ir import dtypes
from ..ir.graph import Graph, GraphInput, Node, TensorMeta, iter_refs
from ..lowering import interpreter, passes
from .checkpoint import DeferredArray, is_deferred
from .model import Model
from .sharding import SCALE_SUFFIX

SCHEMES = ("int8", "int4", "int8-dynamic")
DEFAULT_GROUP_SIZE = 64
INT4_PACKING = "halves"  # the manifest's name for int4's byte layout (see the module docstring)
_DEQUANTIZE = {"int8": "torch2jax.dequantize_int8.default", "int4": "torch2jax.dequantize_int4_halves.default",
               "int8-dynamic": "torch2jax.dynamic_int8_weight.default"}
_PERMUTE = "aten.permute.default"
_PRODUCTS = {"aten.mm.default": 1, "aten.addmm.default": 2, "aten.bmm.default": 1}  # op -> its weight operand
# a transposed weight broadcast over a batch on its way to a bmm (a Linear on a 3-d input with a symbolic batch)
_BROADCASTS = ("aten.expand.default", "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def quantize_model(model: Model, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> Model:
    """`model` with the weights of its matrix products quantized (see the module docstring); the manifest's
    params section says which, how, and the bytes before and after (`Model.quantization`)."""
    check_scheme(scheme, group_size)
    stored = getattr(model, "quantization", {}).get("stored_by") == "checkpoint"
    if stored:
        raise InputSpecError(f"this checkpoint's weights are stored quantized ({', '.join(model.quantization['formats'])}) and "
                             f"convert in that form: convert it without quantize={scheme!r}")
    graph = model.graph
    chosen = [inp for inp in matmul_weights(graph) if _fits(inp, scheme, group_size)]
    if not chosen:
        raise InputSpecError(f"{scheme} quantization found no matrix-product weights to quantize in this model "
                             "(2-d params read only as the weight of a matmul, e.g. nn.Linear's)")
    new_graph, params = _rewrite(graph, model.params, chosen, scheme, group_size)
    quantized = Model(interpreter.build(passes.optimize(new_graph)), params, new_graph)
    quantized.sharding_hints = dict(model.sharding_hints)
    quantized.timings = getattr(model, "timings", {})
    quantized.quantization = {
        "scheme": scheme,
        **({"group_size": group_size, "packing": INT4_PACKING} if scheme == "int4" else {}),
        "params": [inp.target for inp in chosen],
        "bytes_before": _nbytes(model.params),
        "bytes_after": _nbytes(params),
    }
    return quantized


def share_quantized_params(graph: Graph, quantized: Model) -> Graph:
    """`graph`, another entry point over the params of `quantized` that reads none of its quantized weights (a
    vision-language model's image encoder), with its placeholders of those weights replaced by the quantized pair
    (values and scales), so that its graph.json describes the params it is given."""
    names = set(quantized.quantization["params"])
    placeholders = {inp.name: inp.target for inp in graph.inputs if inp.target in names}
    read = {ref for node in graph.nodes for ref in iter_refs([node.args, node.kwargs])}
    read |= {ref for out in graph.outputs for ref in iter_refs(out.value)}
    shared = sorted(target for name, target in placeholders.items() if name in read)
    if shared:
        raise ExportError(f"{len(shared)} quantized weights are also read by another entry point, which would then "
                          f"read them quantized: {', '.join(shared[:5])}")
    pairs = {n for name in names for n in (name, name + SCALE_SUFFIX)}
    kept = [inp for inp in graph.inputs if inp.name not in placeholders]
    return dataclasses.replace(graph, inputs=kept + [inp for inp in quantized.graph.inputs if inp.target in pairs])


def quantize_entry_points(models: list[Model], scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> list[Model]:
    """Entry points over one params dict (an encoder-decoder's encode and decode), each one's matmul weights
    quantized as quantize_model does, in one params dict again; every graph's placeholders describe the quantized
    params, and each model's `quantization` covers them all. A weight read by two entry points is refused."""
    done: list[Model] = []
    for model in models:  # each quantized over the params the ones before it left, its placeholders of those updated
        graph = passes.drop_dead_nodes(model.graph)  # only what an entry point computes counts as its reads
        for earlier in done:
            graph = share_quantized_params(graph, earlier)
        entry = Model(model._run, done[-1].params if done else model.params, graph)
        entry.sharding_hints, entry.timings = model.sharding_hints, getattr(model, "timings", {})
        done.append(quantize_model(entry, scheme, group_size))
    final = done[-1].params
    merged = {**done[0].quantization, "params": [name for model in done for name in model.quantization["params"]],
              "bytes_after": _nbytes(final)}
    result = []
    for index, model in enumerate(done):  # and of the ones after it
        graph = model.graph
        for later in done[index + 1:]:
            graph = share_quantized_params(graph, later)
        entry = Model(model._run, final, graph)
        entry.sharding_hints, entry.timings, entry.quantization = model.sharding_hints, model.timings, merged
        result.append(entry)
    return result


def check_scheme(scheme: str | None, group_size: int) -> None:
    if scheme not in SCHEMES:
        raise InputSpecError(f"quantize must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme == "int4" and (not isinstance(group_size, int) or group_size < 2 or group_size % 2):
        raise InputSpecError(f"group_size must be an even integer >= 2 (got {group_size!r})")


def matmul_weights(graph: Graph) -> list[GraphInput]:
    """The floating 2-d params whose every use is a 2-d transpose read only as a matmul's weight operand."""
    uses: dict[str, list[tuple[Node, int]]] = {}
    for node in graph.nodes:
        for position, arg in enumerate(node.args):
            for ref in iter_refs(arg):
                uses.setdefault(ref, []).append((node, position))
    read_elsewhere = Counter(ref for out in graph.outputs for ref in iter_refs(out.value))
    tied = set(graph.aliases.values())
    found = []
    for inp in graph.inputs:
        meta = inp.meta
        if (inp.kind != "parameter" or meta is None or len(meta.shape) != 2 or not meta.is_static
                or not dtypes.is_floating(dtypes.numpy_dtype(meta.dtype)) or inp.target in tied or read_elsewhere[inp.name]):
            continue
        readers = uses.get(inp.name, [])
        if readers and all(_transposed_into_product(node, position, uses, read_elsewhere) for node, position in readers):
            found.append(inp)
    return found


def _transposed_into_product(node: Node, position: int, uses: dict, read_elsewhere: Counter) -> bool:
    if node.op != _PERMUTE or position != 0 or [d % 2 for d in node.args[1]] != [1, 0]:
        return False
    return _into_product(node, uses, read_elsewhere)


def _into_product(node: Node, uses: dict, read_elsewhere: Counter) -> bool:
    """Every reader of `node` takes it as a matmul's weight operand, directly or broadcast over a batch first."""
    readers = uses.get(node.name, [])
    if not readers or read_elsewhere[node.name]:
        return False
    return all(_PRODUCTS.get(user.op) == where or (user.op in _BROADCASTS and where == 0 and _into_product(user, uses, read_elsewhere))
               for user, where in readers)


def _fits(inp: GraphInput, scheme: str, group_size: int) -> bool:
    return scheme != "int4" or inp.meta.shape[1] % group_size == 0


def weight_format(scheme: str) -> str:
    """How the weights of `scheme` are stored: int8-dynamic keeps int8's (only the product differs)."""
    return "int8" if scheme == "int8-dynamic" else scheme


def _rewrite(graph: Graph, params: dict, chosen: list[GraphInput], scheme: str, group_size: int) -> tuple[Graph, dict]:
    by_name = {inp.name: inp for inp in chosen}
    inputs, nodes, new_params = [], [], {}
    for inp in graph.inputs:
        if inp.name not in by_name:
            inputs.append(inp)
            continue
        rows, cols = inp.meta.shape
        values = GraphInput(f"{inp.name}_q", "parameter", _values_meta(scheme, rows, cols, group_size), inp.target)
        scale = GraphInput(f"{inp.name}{SCALE_SUFFIX}", "parameter", _scale_meta(scheme, rows, cols, group_size),
                           inp.target + SCALE_SUFFIX)
        inputs += [values, scale]
        args = [{"ref": values.name}, {"ref": scale.name}] + ([group_size] if scheme == "int4" else [])
        nodes.append(Node(inp.name, _DEQUANTIZE[scheme], [*args, {"dtype": inp.meta.dtype}], {}, inp.meta))
    for name, value in params.items():
        inp = next((i for i in chosen if i.target == name), None)
        if inp is None:
            new_params[name] = value
            continue
        new_params[name], new_params[name + SCALE_SUFFIX] = _quantized_pair(value, weight_format(scheme), group_size, name)
    return dataclasses.replace(graph, inputs=inputs, nodes=nodes + list(graph.nodes)), new_params


def _values_meta(scheme: str, rows: int, cols: int, group_size: int) -> TensorMeta:
    return TensorMeta("uint8", [rows, int4_half(cols, group_size)]) if scheme == "int4" else TensorMeta("int8", [rows, cols])


def int4_half(cols: int, group_size: int) -> int:
    """The columns in the low nibbles of an int4 weight: the first half of its groups, rounded up (the bytes' width)."""
    return group_size * -(-(cols // group_size) // 2)


def _scale_meta(scheme: str, rows: int, cols: int, group_size: int) -> TensorMeta:
    return TensorMeta("float32", [rows, cols // group_size] if scheme == "int4" else [rows])


def quantize_array(weight: np.ndarray, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(quantized values, float32 scales) of a [out, in] weight (see the module docstring)."""
    w = np.asarray(weight, np.float32)
    if scheme == "int8":
        scale = np.abs(w).max(axis=1) / 127
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        return np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8), scale
    rows, cols = w.shape
    grouped = w.reshape(rows, cols // group_size, group_size)
    scale = np.abs(grouped).max(axis=2) / 7
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(grouped / scale[:, :, None]), -8, 7).astype(np.int8).reshape(rows, cols)
    half = int4_half(cols, group_size)
    high = np.zeros((rows, half), np.int8)  # the high half is a group shorter when the groups are odd in number
    high[:, : cols - half] = q[:, half:]
    packed = (q[:, :half] & 0xF) | ((high & 0xF) << 4)
    return packed.astype(np.uint8), scale


def dequantize_array(values: np.ndarray, scale: np.ndarray, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> np.ndarray:
    """The float32 weight quantized values stand for (what the artifact computes with), in NumPy."""
    if scheme == "int8":
        return values.astype(np.float32) * scale[:, None]
    low, high = (values & 0xF).astype(np.int8), (values >> 4).astype(np.int8)
    rows, cols = values.shape[0], scale.shape[1] * group_size
    q = np.concatenate([np.where(low > 7, low - 16, low), np.where(high > 7, high - 16, high)], axis=1)[:, :cols]
    return (q.reshape(rows, -1, group_size).astype(np.float32) * scale[:, :, None]).reshape(rows, cols)


def _quantized_pair(value: Any, scheme: str, group_size: int, name: str) -> tuple[Any, Any]:
    if not is_deferred(value):
        import jax.numpy as jnp

        values, scale = quantize_array(np.asarray(value), scheme, group_size)
        return jnp.asarray(values), jnp.asarray(scale)
    rows, cols = value.shape
    pair = _ReadOnce(value, scheme, group_size)
    values_shape = (rows, cols) if scheme == "int8" else (rows, int4_half(cols, group_size))
    scale_shape = (rows,) if scheme == "int8" else (rows, cols // group_size)
    label = f"{value.source} ({scheme})"
    return (DeferredArray(values_shape, np.int8 if scheme == "int8" else np.uint8, lambda: pair.take(0), label),
            DeferredArray(scale_shape, np.float32, lambda: pair.take(1), f"{label} scales"))


class _ReadOnce:
    """A streamed weight quantized when either part is first read; each part is handed out once, then dropped, so
    the weight is read from its file once and nothing stays in memory after both parts are written."""

    def __init__(self, source: DeferredArray, scheme: str, group_size: int):
        self.source, self.scheme, self.group_size = source, scheme, group_size
        self.parts: dict[int, np.ndarray] = {}

    def take(self, index: int) -> np.ndarray:
        if index not in self.parts:  # the first read (or a second save): read and quantize the weight
            values, scale = quantize_array(self.source.read(), self.scheme, self.group_size)
            self.parts = {0: values, 1: scale}
        return self.parts.pop(index)


def _nbytes(params: dict) -> int:
    return int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in params.values()))


# -- weights a checkpoint stores quantized (hf/prequantized.py reads them) ---------------------------------------------
# Their stored tensors become the artifact's params as they are; a node of one of these ops makes the weight from them.
STORED_LAYOUTS = {"blocks": "torch2jax.dequantize_blocks.default", "packed-int": "torch2jax.dequantize_packed_int.default",
                  "packed-int-permuted": "torch2jax.dequantize_packed_int_permuted.default"}
ZERO_POINT_SUFFIX = "_zero_point"
COLUMNS_SUFFIX = "_columns"


@dataclasses.dataclass
class StoredWeight:
    """A weight stored quantized by the checkpoint's own tool: its parts (read later, as they are stored) and how they
    make the [out, in] weight, in NumPy (`dequantize`) and in the function (ops/quantized.py, by `layout`).

        blocks      float values (float8) times one scale per block of `args` = (block rows, block cols); a block
                    as wide as the weight is a scale per row, one as large as it a scale per tensor
        packed-int  32 / bits unsigned values per int32 word (the lowest bits first), offset by 2^(bits - 1), `args` =
                    (bits, group_size, columns): w = (q - zero_point) * scale per group of columns; the zero points
                    packed alike down the rows
        packed-int-permuted  packed-int whose stored column j is the weight's column `columns[j]` (GPTQ's activation
                    order: columns quantized in their groups' order); the product reads x's columns in that order"""

    layout: str
    shape: tuple[int, int]  # the weight's [out, in]
    values: DeferredArray
    scale: DeferredArray
    args: tuple[int, ...]
    zero_point: DeferredArray | None = None
    description: str = ""  # the format, for the manifest (e.g. "fp8 blocks of 128x128")
    columns: DeferredArray | None = None  # packed-int-permuted: the weight's column each stored column is

    def parts(self) -> dict[str, DeferredArray]:
        """The stored params by suffix of the weight's name ("" is the values)."""
        found = {"": self.values, SCALE_SUFFIX: self.scale}
        if self.zero_point is not None:
            found[ZERO_POINT_SUFFIX] = self.zero_point
        if self.columns is not None:
            found[COLUMNS_SUFFIX] = self.columns
        return found

    def dequantize(self) -> np.ndarray:
        """The float32 weight, read and dequantized in NumPy (the same arithmetic as the function's)."""
        zero = self.zero_point.read() if self.zero_point is not None else None
        columns = self.columns.read() if self.columns is not None else None
        return dequantize_stored(self.layout, self.values.read(), self.scale.read(), self.args, self.shape, zero, columns)


def dequantize_stored(layout: str, values: np.ndarray, scale: np.ndarray, args: tuple, shape: tuple[int, int],
                      zero_point: np.ndarray | None = None, columns: np.ndarray | None = None) -> np.ndarray:
    """A stored weight's float32 values (see StoredWeight), in NumPy."""
    if layout == "packed-int-permuted":
        stored = dequantize_stored("packed-int", values, scale, args, shape, zero_point)
        return stored[:, np.argsort(columns)]
    rows, cols = shape
    if layout == "blocks":
        block_rows, block_cols = args
        grid = scale.astype(np.float32).reshape(-(-rows // block_rows), -(-cols // block_cols))
        full = np.repeat(np.repeat(grid, block_rows, axis=0), block_cols, axis=1)[:rows, :cols]
        return values.astype(np.float32) * full
    bits, group_size, _ = args
    q = unpack_int32(values, bits, cols).astype(np.float32)
    per_group = scale.astype(np.float32).reshape(rows, -1)
    if zero_point is not None:
        q = q.reshape(rows, -1, group_size) - unpack_int32(zero_point.T, bits, rows).T.reshape(rows, -1)[:, :, None]
    return (q.reshape(rows, -1, group_size) * per_group[:, :, None]).reshape(rows, cols)


def unpack_int32(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """[n, words] int32 of 32 / bits values each (the lowest bits first, offset by 2^(bits - 1)) -> [n, count] int32."""
    words = packed.view(np.uint32)
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    values = (words[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count].astype(np.int32) - (1 << (bits - 1))


def adopt_stored(model: Model) -> Model:
    """`model` with each weight its checkpoint stores quantized (a param whose DeferredArray carries a `stored`
    StoredWeight) kept in that form: the placeholder becomes the stored parts and a node that dequantizes them, as
    quantize_model does for its own schemes. A stored weight read other than as a matmul's weight stays a float param
    (read dequantized). The manifest's quantization section says so (`stored_by: checkpoint`)."""
    stored = {name: value.stored for name, value in model.params.items() if getattr(value, "stored", None) is not None}
    if not stored:
        return model
    chosen = [inp for inp in matmul_weights(model.graph) if inp.target in stored]
    if not chosen:
        return model
    by_name = {inp.name: inp for inp in chosen}
    inputs, nodes = [], []
    for inp in model.graph.inputs:
        if inp.name not in by_name:
            inputs.append(inp)
            continue
        weight = stored[inp.target]
        refs = {}
        for suffix, part in weight.parts().items():
            placeholder = GraphInput(f"{inp.name}{suffix or '_q'}", "parameter", TensorMeta(dtypes.name_of(part.dtype), list(part.shape)),
                                     inp.target + suffix)
            inputs.append(placeholder)
            refs[suffix] = {"ref": placeholder.name}
        # packed-int always has the zero-point slot (None: symmetric), and the permuted form its columns after it, so
        # a fused Linear's bias comes last
        tail = {"blocks": [], "packed-int": [refs.get(ZERO_POINT_SUFFIX)],
                "packed-int-permuted": [refs.get(ZERO_POINT_SUFFIX), refs.get(COLUMNS_SUFFIX)]}[weight.layout]
        nodes.append(Node(inp.name, STORED_LAYOUTS[weight.layout],
                          [refs[""], refs[SCALE_SUFFIX], *weight.args, {"dtype": inp.meta.dtype}, *tail], {}, inp.meta))
    params = {}
    for name, value in model.params.items():
        if name in stored and any(inp.target == name for inp in chosen):
            params.update({name + suffix: part for suffix, part in stored[name].parts().items()})
        else:
            params[name] = value
    graph = dataclasses.replace(model.graph, inputs=inputs, nodes=nodes + list(model.graph.nodes))
    adopted = Model(interpreter.build(passes.optimize(graph)), params, graph)
    adopted.sharding_hints = dict(model.sharding_hints)
    adopted.timings = getattr(model, "timings", {})
    names = [inp.target for inp in chosen]
    adopted.quantization = {
        "scheme": "checkpoint",
        "stored_by": "checkpoint",
        "formats": sorted({stored[name].description for name in names}),
        "params": names,
        "bytes_before": _nbytes({**model.params}),
        "bytes_after": _nbytes(params),
    }
    return adopted
