"""transformers' own load-time renames and fusions of checkpoint tensors, as the weight source's rules.

transformers renames and fuses some weights when it loads a checkpoint (Mixtral's per-expert `w1`/`w3`/`w2`
become stacked `gate_up_proj`/`down_proj`); streaming the weights must apply the same rules, tensor by tensor.
"""

from __future__ import annotations

import re
from typing import Any

from ..capture.weight_source import Fuse, Rename
from ..errors import InputSpecError


def transformers_rules(model: Any) -> tuple[tuple[Rename, ...], tuple[Fuse, ...]]:
    """transformers' own load-time conversions for this model, as renames and fuses.

    Only the operations streaming reproduces are taken (renaming, stacking a module list, concatenation, then a
    transpose);
    a model whose rules need another one fails here, naming it, rather than loading wrong weights.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import Concatenate, MergeModulelist, Transpose, WeightConverter, WeightRenaming
    except ImportError:
        return (), ()
    renames, fuses = [], []
    for rule in get_model_conversion_mapping(model, add_legacy=True) or []:
        sources = list(getattr(rule, "_original_source_patterns", rule.source_patterns))
        targets = list(getattr(rule, "_original_target_patterns", rule.target_patterns))
        if isinstance(rule, WeightRenaming):
            # the replacement as transformers writes it (rule.target_patterns: a PrefixChange's `\.` unescaped)
            renames += [_scoped(Rename(source, rule.target_patterns[0]), getattr(rule, "scope_prefix", None),
                                getattr(rule, "base_model_prefix", None) or "") for source in sources]
        elif isinstance(rule, WeightConverter):
            stack = concat = swap = None
            if_needed = False
            for op in rule.operations:
                if isinstance(op, MergeModulelist) and stack is None and swap is None:
                    stack = op.dim
                elif isinstance(op, Concatenate) and concat is None and swap is None:
                    concat = op.dim
                elif isinstance(op, Transpose) and swap is None:  # last: the fused result's axes exchanged
                    swap, if_needed = (op.dim0, op.dim1), bool(getattr(op, "check_dims", False))
                else:
                    raise InputSpecError(
                        f"{type(model).__name__}'s checkpoint conversion uses {type(op).__name__} ({sources} -> {targets}), "
                        "which streamed weights do not reproduce: convert with --weights-in-memory"
                    )
            if len(targets) != 1:
                raise InputSpecError(f"{type(model).__name__}'s checkpoint conversion {sources} -> {targets} splits a tensor, "
                                     "which streamed weights do not reproduce: convert with --weights-in-memory")
            fuses.append(Fuse(tuple(sources), targets[0], stack, concat, swap, if_needed))
    return tuple(renames), tuple(fuses)


def _scoped(rename: Rename, scope: str | None, base: str) -> Rename:
    """A sub-model's rename applies under its prefix only (transformers' `scope_prefix`), as transformers matches it:
    a name under `base.scope.` (the base model's prefix, e.g. `model.`) or else under `scope.` has that prefix set
    aside, the rename is matched on the rest (no other way), and the prefix put back. CLIPModel holds CLIPTextModel's
    `^text_model\\.(.+)` -> `\\1`, meant for `text_model.text_model.*` keys, not for `text_model.*`; Qwen2-VL's
    Qwen2VLModel (scope "", under base `model`) adds `language_model.` to `model.*` names that lack it, not to `model.visual.*`."""
    if scope is None or not rename.pattern.startswith("^"):
        return rename  # unanchored renames (LayerNorm.gamma -> LayerNorm.weight) match anywhere, as before
    under = f"{scope}." if scope else ""
    longest = f"{base}.{under}" if base else under
    prefix = re.escape(longest) if longest == under else f"{re.escape(longest)}|(?!{re.escape(longest)}){re.escape(under)}"
    shifted = re.sub(r"\\(\d+)", lambda m: f"\\g<{int(m.group(1)) + 1}>", rename.replacement)  # group 1 is the prefix
    return Rename(f"^({prefix})" + rename.pattern[1:], "\\g<1>" + shifted)
