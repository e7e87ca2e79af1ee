"""Stage 2 (convert half): the exported program decomposed to the core ATen opset, minus the ops kept whole.

Node by node where the program allows it (node_decompose.py), else by torch's retrace of the whole program
(`run_decompositions`); torch's list of CompositeImplicitAutograd ops is kept between calls, since torch makes it
afresh for every table and every decomposition. The compile backend decomposes with the same table.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ExportError
from . import node_decompose
from .export_errors import first_paragraph

# Ops torch2jax lowers better whole than decomposed (design: keep high-level ops whole).
KEEP_WHOLE = (
    "aten.scaled_dot_product_attention.default",
)


def decompose(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Decompose to the core ATen opset, keeping KEEP_WHOLE ops as they are: node by node where the program
    allows it (node_decompose.py), else by torch's retrace of the whole program."""
    try:
        with warnings.catch_warnings(), _cia_ops_remembered():
            warnings.simplefilter("ignore", FutureWarning)
            table = decompositions()
            try:
                by_node = node_decompose.decompose_nodes(ep, table, _decomposed_by_retrace(table))
            except Exception:  # noqa: BLE001 - torch internals it leans on moved: the retrace is the reference
                by_node = None
            return by_node if by_node is not None else ep.run_decompositions(table)
    except Exception as err:
        raise ExportError(f"torch could not decompose the exported program to core ATen: {first_paragraph(err)}") from err


def _decomposed_by_retrace(table) -> Callable[[Any], bool]:
    """Which ops run_decompositions(table) replaces: those in the table, the CompositeImplicitAutograd ops torch
    does not offer to keep (reshape, dropout, to, ...), which decompose whenever they are traced, and those with a
    python kernel at autograd (native_batch_norm, the upsamplings), which the retrace's python dispatcher runs."""
    from torch._C import DispatchKey
    from torch.export import decomp_utils

    keepable = decomp_utils._collect_all_valid_cia_ops()  # remembered inside _cia_ops_remembered
    python_kernels = {DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd}

    def decomposed(op: Any) -> bool:
        if op in table:
            return True
        return isinstance(op, torch._ops.OpOverload) and op not in keepable and (
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
            or not python_kernels.isdisjoint(op.py_kernels))

    return decomposed


_CIA_MODULES = ("torch.export.exported_program", "torch.export.decomp_utils")
_cia_memo: dict[str, Any] = {}


@contextlib.contextmanager
def _cia_ops_remembered():
    """torch lists every CompositeImplicitAutograd op afresh each time it builds a decomposition table or decomposes
    (for each op namespace it walks all of the dispatcher's registrations again): a third of a small model's
    decomposition. While this is open the list is kept, and made again when the namespaces or the number of
    CompositeImplicitAutograd registrations change (a custom op registered since)."""
    import importlib

    from torch._export import utils as export_utils

    modules = [importlib.import_module(name) for name in _CIA_MODULES]
    if not all(hasattr(module, "_collect_all_valid_cia_ops") for module in modules):  # another torch: leave it be
        yield
        return
    collect = export_utils._collect_all_valid_cia_ops

    def state() -> tuple:
        return tuple(torch.ops._dir), len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))

    def remembered() -> set:
        if _cia_memo.get("key") != state():
            _cia_memo["ops"] = frozenset(collect())
            _cia_memo["key"] = state()  # after: listing the ops makes torch.ops load their namespaces
        return set(_cia_memo["ops"])

    previous = [module._collect_all_valid_cia_ops for module in modules]  # ours again when nested
    for module in modules:
        module._collect_all_valid_cia_ops = remembered
    try:
        yield
    finally:
        for module, before in zip(modules, previous):
            module._collect_all_valid_cia_ops = before


def subclass_param_names(ep: torch.export.ExportedProgram) -> dict[str, str]:
    """Readable names for the inner tensors of tensor-subclass params (torchao's quantized weights): decomposition
    unwraps `lin.weight` into `lin.parametrizations.weight.original0..N`; these become `lin.weight.qdata`,
    `lin.weight.scale`, ... after the subclass's own `__tensor_flatten__` attribute names."""
    renames = {}
    for name, value in ep.state_dict.items():
        flatten = getattr(value, "__tensor_flatten__", None)
        if flatten is None or type(value) in (torch.Tensor, torch.nn.Parameter):
            continue
        inner = flatten()[0]
        if any(hasattr(getattr(value, attr), "__tensor_flatten__") and type(getattr(value, attr)) is not torch.Tensor
               for attr in inner):
            continue  # nested subclasses flatten further; torch's numbering is kept for them
        prefix, _, leaf = name.rpartition(".")
        base = f"{prefix}.parametrizations.{leaf}" if prefix else f"parametrizations.{leaf}"
        renames.update({f"{base}.original{i}": f"{name}.{attr}" for i, attr in enumerate(inner)})
    return renames


def decompositions() -> dict:
    """torch's core ATen decomposition table less KEEP_WHOLE: what export and the compile backend decompose."""
    with _cia_ops_remembered():
        table = torch.export.default_decompositions()
    for name in KEEP_WHOLE:
        namespace, op, overload = name.split(".")
        table.pop(getattr(getattr(getattr(torch.ops, namespace), op), overload), None)
    return table
