"""LoRA beside the weights instead of merged into them: QLoRA on a quantized base, and per-row adapters for serving.

`lora_apply(model, config)` (lora.py; apply_fn uses it on a quantized model) runs the converted graph with a side path
after each targeted product (lowering/lora_paths.py): the base product as converted (float, or int8 / int4 over the
stored quantized weight) plus scale * (x @ A.T) @ B.T. The base weights are never rebuilt as floats with the delta in
them, so the adapters train on a quantized base, and `jax.grad` over the adapters alone leaves the base frozen.

`row_adapters(entries, adapters)` does the same for a generator's entry points (prefill, decode) with several adapters
stacked, each row of a batch choosing its own by `adapter_ids` (-1: none), for a server holding one base model and many
adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir import structure
from ..lowering import passes
from ..lowering.lora_paths import ADAPTER_IDS, LoraTarget
from ..runtime.model import Model
from .lora import (
    LoraConfig,
    LoraError,
    check_pair,
    init_lora,
    lora_graph,
    lora_sites,
    modules_of,
    side_model,
    targeted_modules,
)

NO_ADAPTER = -1  # an adapter_ids entry for a row that runs the base model alone


def lora_sizes(model: Any, config: LoraConfig) -> dict[str, tuple[int, int]]:
    """{module: (in, out)} of every module the config targets, read from the products of the model's graph: a
    quantized weight's stored shape does not say them (int4 packs two columns per byte)."""
    modules = targeted_modules(model.params, config)
    sites = lora_sites(passes.optimize(model.graph), modules)
    return {module: (sites[module][0].fan_in, sites[module][0].fan_out) for module in modules}


def init_adapter(model: Any, config: LoraConfig, rng: jax.Array) -> dict[str, jax.Array]:
    """init_lora's PEFT init for a converted model whose targeted weights may be stored quantized (the sizes from the
    graph, lora_sizes)."""
    return init_lora(model.params, config, rng, sizes=lora_sizes(model, config))


@dataclasses.dataclass(frozen=True)
class RowAdapters:
    """Several adapters over one generator's entry points, chosen per row.

    lora: the adapters stacked, {module.lora_A: [n, R, in], module.lora_B: [n, out, R]} (R the largest rank; each
      adapter's alpha / r folded into its B, a module it does not adapt all zeros), to pass to every step.
    steps: {entry name: fn(params, lora, *args, adapter_ids, **kwargs)}, pure and traceable: the entry called as the
      generator calls it (generate/loop.call_entry), row b with adapter adapter_ids[b] (int32 [batch], -1 none).
    models: the entries with their side paths, as Models whose graphs take `adapter_ids` as a keyword input."""

    lora: dict[str, jax.Array]
    steps: dict[str, Callable[..., Any]]
    models: dict[str, Model]

    @property
    def count(self) -> int:
        return int(next(iter(self.lora.values())).shape[0])


def row_adapters(entries: Mapping[str, Model], adapters: Sequence[tuple[Mapping[str, Any], LoraConfig]]) -> RowAdapters:
    """Per-row adapters for a loaded generator's entry points (`generator.entries()`: prefill and decode of a causal
    LM): `adapters` a list of (lora, config) as finetune.load_adapter gives them, adapter i being adapter_ids == i.
    The side paths go into each entry's graph (graph.json), so a generator converted in memory or loaded either way
    (from its StableHLO or with from_graph=True) works; the steps run the graph, not the StableHLO. LoraError for an
    adapter that does not fit the entries' weights."""
    if not adapters:
        raise LoraError("row_adapters needs at least one adapter")
    modules = sorted({module for lora, _ in adapters for module in modules_of(dict(lora))})
    layouts = {}
    for module in modules:
        flags = {config.fan_in_fan_out for lora, config in adapters if f"{module}.lora_A" in lora}
        if len(flags) > 1:
            raise LoraError(f"the adapters disagree on fan_in_fan_out for {module}: each must say how the base stores it")
        layouts[module] = flags.pop()
    rank = max(config.rank for _, config in adapters)
    models, steps, sizes = {}, {}, None
    for name, entry in entries.items():
        graph = passes.optimize(entry.graph)
        found = lora_sites(graph, modules)
        entry_sizes = {module: (site[0].fan_in, site[0].fan_out) for module, site in found.items()}
        if sizes is not None and entry_sizes != sizes:
            raise LoraError(f"entry point {name!r} reads the adapted weights at other sizes than the others")
        sizes = entry_sizes
        targets = {module: LoraTarget(rank, 1.0, layouts[module]) for module in modules}
        models[name] = side_model(entry, lora_graph(graph, targets, per_row=len(adapters)))
        steps[name] = _row_step(models[name], len(adapters))
    return RowAdapters(stack_adapters(adapters, sizes, rank), steps, models)


def stack_adapters(adapters: Sequence[tuple[Mapping[str, Any], LoraConfig]], sizes: Mapping[str, tuple[int, int]],
                   rank: int) -> dict[str, jax.Array]:
    """The adapters as one stack per module (see RowAdapters.lora): zero-padded to `rank`, their scales in B."""
    stacked = {}
    for module, (fan_in, fan_out) in sizes.items():
        a_all = np.zeros((len(adapters), rank, fan_in), np.float32)
        b_all = np.zeros((len(adapters), fan_out, rank), np.float32)
        for i, (lora, config) in enumerate(adapters):
            if f"{module}.lora_A" not in lora:
                continue
            a, b = np.asarray(lora[f"{module}.lora_A"], np.float32), np.asarray(lora[f"{module}.lora_B"], np.float32)
            check_pair(module, a, b, fan_in, fan_out, config.rank, f"adapter {i}: ")
            a_all[i, : config.rank] = a
            b_all[i, :, : config.rank] = config.scaling * b
        stacked[f"{module}.lora_A"], stacked[f"{module}.lora_B"] = jnp.asarray(a_all), jnp.asarray(b_all)
    return stacked


def _row_step(model: Model, count: int) -> Callable[..., Any]:
    def step(params: dict, lora: dict, *args: Any, adapter_ids: Any, **kwargs: Any) -> Any:
        ids = jnp.asarray(adapter_ids, jnp.int32)
        leaves = structure.flatten((args, {**kwargs, ADAPTER_IDS: ids}), model.graph.in_spec, "inputs")
        batch = next((jnp.shape(leaf)[0] for leaf in leaves if jnp.ndim(leaf)), None)
        if ids.ndim != 1 or (isinstance(batch, int) and ids.shape[0] != batch):
            raise LoraError(f"adapter_ids must be one adapter index per row, int32 [{batch}] (-1: no adapter), "
                            f"got shape {list(ids.shape)}")
        if not isinstance(ids, jax.core.Tracer) and ids.size and (int(ids.min()) < NO_ADAPTER or int(ids.max()) >= count):
            raise LoraError(f"adapter_ids {np.asarray(ids).tolist()}: each must be an adapter's index, 0 to {count - 1}, "
                            f"or {NO_ADAPTER} for none (under jit an index out of range is not caught)")
        outputs, _ = model._run({**params, **lora}, leaves, None)
        return structure.unflatten(model.graph.out_spec, outputs)

    return step


