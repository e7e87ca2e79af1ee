"""LoRA on a converted model's params: low-rank pairs (A, B) beside the frozen weights, merged as W + (alpha/r) B @ A.

The adapters are a dict of their own, keyed like PEFT's modules (`model.layers.0.self_attn.q_proj.lora_A`), so
`jax.grad` over them leaves the base params untouched and the pair maps one to one onto a PEFT adapter file
(peft_format.py). The init is PEFT's default: A as torch's kaiming_uniform_(a=sqrt(5)), B zeros, so the adapted
model starts as the base model.

Where the weights cannot take a delta (a base converted with `quantize=`: QLoRA), `lora_apply` runs the adapters
beside them instead, as a side path of the converted graph (lowering/lora_paths.py); apply_fn switches to it there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..errors import Torch2JaxError
from ..lowering import interpreter, passes
from ..lowering.lora_paths import (
    LoraPathError,
    LoraTarget,
    product_sites,
    recompute_quantized_products,
    with_lora_paths,
)
from ..runtime.model import Model


class LoraError(Torch2JaxError, ValueError):
    """A LoRA configuration or adapter that cannot apply to these params."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Which weights get an adapter and its size, with PEFT's meaning for each field.

    rank: r, the inner size of B @ A. alpha: lora_alpha; the update is scaled by alpha / rank.
    targets: module-name suffixes, as PEFT's target_modules: a module named `t` or ending in `.t` is adapted.
    fan_in_fan_out: True where the targeted weights are stored [in, out] (transformers' Conv1D: GPT-2, GPT-BigCode);
      the delta B @ A is [out, in] and is transposed onto them. Weights' shapes cannot tell (a square one looks alike),
      so the caller says; PEFT's LoraConfig has the same flag and the adapter file records it.
    dropout: lora_dropout; only 0.0 for now (a dropout on the adapter's input needs a key per step).
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]
    fan_in_fan_out: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.targets, str):
            object.__setattr__(self, "targets", (self.targets,))
        object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise LoraError(f"LoraConfig.rank must be an integer >= 1, got {self.rank!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise LoraError(f"LoraConfig.targets must name at least one module suffix (e.g. ('q_proj', 'v_proj')), got {self.targets!r}")
        if self.dropout != 0.0:
            raise LoraError(f"LoraConfig.dropout={self.dropout!r} is not supported yet: only 0.0 (no dropout on the adapter input)")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _matches(module: str, target: str) -> bool:
    return module == target or module.endswith("." + target)


def targeted_modules(params: dict, config: LoraConfig) -> list[str]:
    """The module names (state_dict names less `.weight`) whose 2-D weight the config adapts, in params order.

    Raises LoraError naming each target that matches no 2-D weight, and the weight names it could have meant."""
    modules = [name[: -len(".weight")] for name, value in params.items() if name.endswith(".weight") and jnp.ndim(value) == 2]
    found = [m for m in modules if any(_matches(m, t) for t in config.targets)]
    missing = [t for t in config.targets if not any(_matches(m, t) for m in modules)]
    if missing:
        leaves = sorted({m.rpartition(".")[2] for m in modules})
        raise LoraError(f"LoRA target(s) {missing} match no 2-D `.weight` in the params; the modules with one end in {leaves}"
                        + "".join(_why_not(params, t) for t in missing))
    return found


def _why_not(params: dict, target: str) -> str:
    """A hint for a target that names something, just not a 2-D `.weight`: a tied head, a fused expert stack."""
    others = [n for n, v in params.items() if _matches(n, target) and jnp.ndim(v) != 2]
    if others:
        return (f". {others[0]!r} is a {jnp.ndim(params[others[0]])}-D parameter, not a Linear's weight: LoRA here adapts "
                "2-D `.weight`s only (PEFT reaches a fused expert stack with target_parameters, which this does not "
                "support yet); target the attention or dense MLP projections instead")
    if target.rpartition(".")[2] in ("lm_head", "embed_out", "output"):
        return (f". A head tied to the input embeddings (tie_word_embeddings) is held once, under the embedding's name, "
                f"and LoRA on a tied weight is not supported: drop {target!r} from the targets, or untie it in torch "
                "before converting (lm.lm_head.weight = torch.nn.Parameter(lm.lm_head.weight.clone()); "
                "lm.config.tie_word_embeddings = False)")
    return ""


def check_targets(graph: Any, config: LoraConfig) -> None:
    """LoraError where a target is a weight this LoRA cannot adapt as PEFT does, found from the converted graph:

    - a tied weight (lm_head tied to embed_tokens): the params hold it once, so merging a delta into it would change
      every use, while PEFT adapts the one module it wraps (lm_head's output) and leaves the other as it was;
    - an embedding table (a weight `aten.embedding` looks rows up in): PEFT gives nn.Embedding its own adapter
      (lora_embedding_A [r, vocab] zeros, lora_embedding_B [dim, r] normal, the delta (B @ A).T) which this does not
      write or read.
    Each message names the fix: drop the target, or untie in torch before converting."""
    kept = {i.name: graph.aliases.get(i.target, i.target) for i in graph.inputs if i.target}
    embeddings = {kept[n.args[0]["ref"]] for n in graph.nodes
                  if n.op.startswith("aten.embedding.") and n.args and isinstance(n.args[0], dict) and n.args[0].get("ref") in kept}
    tied: dict[str, list[str]] = {}
    for alias, name in graph.aliases.items():
        tied.setdefault(name, [name]).append(alias)
    problems = []
    for target in config.targets:
        for name in sorted(set(kept.values()) | set(graph.aliases)):
            if not name.endswith(".weight") or not _matches(name[: -len(".weight")], target):
                continue
            group = tied.get(graph.aliases.get(name, name))
            if group:
                problems.append(f"{target!r} matches {name}, one weight with {sorted(set(group) - {name})} (tied): the "
                                "params hold it once, so an adapter would change every use, while PEFT adapts only the "
                                f"module it wraps. Drop {target!r} from the targets, or untie in torch before converting "
                                "(e.g. lm.lm_head.weight = torch.nn.Parameter(lm.lm_head.weight.clone()); "
                                "lm.config.tie_word_embeddings = False)")
            elif name in embeddings:
                problems.append(f"{target!r} matches {name}, an embedding table: PEFT adapts nn.Embedding with "
                                "lora_embedding_A/B (swapped shapes, its own init), which is not supported here; drop "
                                f"{target!r} from the targets")
    if problems:
        raise LoraError("LoRA cannot adapt these targets as PEFT does: " + "; ".join(problems))


def _in_out(weight: Any, config: LoraConfig) -> tuple[int, int]:
    rows, cols = weight.shape
    return (rows, cols) if config.fan_in_fan_out else (cols, rows)


def init_lora(params: dict, config: LoraConfig, rng: jax.Array,
              sizes: dict[str, tuple[int, int]] | None = None) -> dict[str, jax.Array]:
    """PEFT's default init for every targeted weight: `{module}.lora_A` [r, in] uniform as torch's
    kaiming_uniform_(a=sqrt(5)) (bound 1/sqrt(in)), `{module}.lora_B` [out, r] zeros. float32, as PEFT keeps adapters.

    sizes: {module: (in, out)} where the params cannot tell (weights stored quantized: side_path.init_adapter)."""
    lora = {}
    a = math.sqrt(5)
    for i, module in enumerate(targeted_modules(params, config)):
        if sizes is not None and module in sizes:
            fan_in, fan_out = sizes[module]
        else:
            _check_float(params, module + ".weight", "in / out sizes: use torch2jax.finetune.init_adapter(model, config, rng)")
            fan_in, fan_out = _in_out(params[module + ".weight"], config)
        gain = math.sqrt(2.0 / (1 + a**2))
        bound = math.sqrt(3.0) * gain / math.sqrt(fan_in)
        lora[module + ".lora_A"] = jax.random.uniform(jax.random.fold_in(rng, i), (config.rank, fan_in), jnp.float32, -bound, bound)
        lora[module + ".lora_B"] = jnp.zeros((fan_out, config.rank), jnp.float32)
    return lora


def modules_of(lora: dict) -> list[str]:
    """The module names an adapter dict holds a pair for; LoraError where a half is missing."""
    modules = sorted({k.rpartition(".")[0] for k in lora})
    bad = [k for k in lora if not k.endswith((".lora_A", ".lora_B"))]
    unpaired = [m for m in modules if f"{m}.lora_A" not in lora or f"{m}.lora_B" not in lora]
    if bad or unpaired:
        raise LoraError(f"not a LoRA adapter dict: keys {bad} are neither .lora_A nor .lora_B; modules {unpaired} lack a half")
    return modules


def merge(params: dict, lora: dict, config: LoraConfig) -> dict:
    """params with W + (alpha/r) B @ A for every adapted module (transposed under fan_in_fan_out), in W's dtype.

    Pure and traceable: differentiate through it with respect to `lora`."""
    merged = dict(params)
    for module in modules_of(lora):
        name = module + ".weight"
        if name not in params:
            raise LoraError(f"the adapter has a pair for {module!r} but the params have no {name!r}")
        _check_float(params, name, "float weight to merge a delta into: train and run the adapter beside it, on the side "
                     "path (torch2jax.finetune.lora_apply, which apply_fn uses on a quantized model)")
        weight, a, b = params[name], lora[module + ".lora_A"], lora[module + ".lora_B"]
        fan_in, fan_out = _in_out(weight, config)
        if a.shape != (config.rank, fan_in) or b.shape != (fan_out, config.rank):
            raise LoraError(f"{module}: lora_A {a.shape} / lora_B {b.shape} do not fit the weight {weight.shape} at rank "
                            f"{config.rank} (expected A {(config.rank, fan_in)}, B {(fan_out, config.rank)}"
                            f"{', fan_in_fan_out' if config.fan_in_fan_out else ''})")
        delta = config.scaling * (b.astype(jnp.float32) @ a.astype(jnp.float32))
        if config.fan_in_fan_out:
            delta = delta.T
        merged[name] = (weight.astype(jnp.float32) + delta).astype(weight.dtype)
    return merged


def _check_float(params: dict, name: str, what: str) -> None:
    """LoraError for a weight stored quantized (runtime/quantize.py): its stored values are not the weight."""
    value = params.get(name)
    if value is not None and not jnp.issubdtype(value.dtype, jnp.floating):
        raise LoraError(f"{name} is stored quantized ({value.dtype}), so it has no {what}")


def apply_fn(model: Any, config: LoraConfig) -> Callable[..., Any]:
    """fn(lora, params, *inputs, **kwargs) = model.apply(merge(params, lora, config), *inputs, **kwargs): the
    adapters first, so `jax.grad(loss(fn(...)))` differentiates them alone and the base params stay frozen. On a model
    converted with `quantize=` (QLoRA) the weights cannot take a delta: the adapters run beside them instead
    (lora_apply, the same function of the adapters).

    Refuses (LoraError, check_targets) targets that are tied weights or embedding tables."""
    if getattr(model, "quantization", None):
        return lora_apply(model, config)
    graph = getattr(model, "graph", None)
    if graph is not None:
        check_targets(graph, config)

    def fn(lora: dict, params: dict, *inputs: Any, **kwargs: Any) -> Any:
        return model.apply(merge(params, lora, config), *inputs, **kwargs)

    return fn


def lora_apply(model: Any, config: LoraConfig) -> Callable[..., Any]:
    """fn(lora, params, *inputs, **kwargs): `model.apply(params, ...)` with each targeted product's LoRA side path,
    the adapters first, so `jax.grad` over them differentiates them alone. `params` is the base (model.params), float
    or quantized; the same logits as apply_fn's merge on a float base. A quantized product's dequantized weight is
    remade in the backward pass rather than kept from the forward one (recompute_quantized_products), so a step holds
    no float copy of the base.

    Refuses (LoraError) tied weights and embedding tables (check_targets), and a target whose weight some op other than
    a matrix product reads."""
    check_targets(model.graph, config)
    modules = targeted_modules(model.params, config)
    target = LoraTarget(config.rank, config.scaling, config.fan_in_fan_out)
    graph = passes.optimize(model.graph)
    sizes = {module: (site[0].fan_in, site[0].fan_out) for module, site in lora_sites(graph, modules).items()}
    # after the side paths are placed (they find the quantized products by their own ops)
    side = side_model(model, recompute_quantized_products(lora_graph(graph, {module: target for module in modules})))

    def fn(lora: dict, params: dict, *inputs: Any, **kwargs: Any) -> Any:
        check_pairs(lora, sizes, config.rank)
        return side.apply({**params, **lora}, *inputs, **kwargs)

    return fn


def lora_sites(graph: Any, modules: list[str]) -> dict:
    """lora_paths.product_sites, its errors as LoraError."""
    try:
        return product_sites(graph, modules)
    except LoraPathError as err:
        raise LoraError(str(err)) from None


def lora_graph(graph: Any, targets: dict[str, LoraTarget], per_row: int | None = None) -> Any:
    """lora_paths.with_lora_paths, its errors as LoraError."""
    try:
        return with_lora_paths(graph, targets, per_row)
    except LoraPathError as err:
        raise LoraError(str(err)) from None


def side_model(model: Any, graph: Any) -> Model:
    """A Model running `graph` (the side paths added; already optimized) over the base model's params."""
    side = Model(interpreter.build(graph), model.params, graph)
    side.quantization = dict(getattr(model, "quantization", {}) or {})
    return side


def check_pairs(lora: dict, sizes: dict[str, tuple[int, int]], rank: int) -> None:
    if set(modules_of(lora)) != set(sizes):
        raise LoraError(f"the adapter's modules {sorted(modules_of(lora))} are not the config's targets {sorted(sizes)}")
    for module, (fan_in, fan_out) in sizes.items():
        check_pair(module, lora[f"{module}.lora_A"], lora[f"{module}.lora_B"], fan_in, fan_out, rank)


def check_pair(module: str, a: Any, b: Any, fan_in: int, fan_out: int, rank: int, label: str = "") -> None:
    if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
        raise LoraError(f"{label}{module}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the weight "
                        f"({fan_in} -> {fan_out}) at rank {rank} (expected A {(rank, fan_in)}, B {(fan_out, rank)})")
