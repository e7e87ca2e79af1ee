"""`torch.compile(model, backend="torch2jax")`: dynamo's graphs run as jitted JAX functions.

The backend is aot_autograd with torch2jax's core-ATen decomposition table (the one export uses):
the forward, the backward and the inference graphs it produces each become a `JaxGraph`, so
`loss.backward()` and `torch.optim` work as with any backend, and buffer mutations (BatchNorm's
running statistics) come back as outputs that aot_autograd copies into the buffers. Ops without a
lowering run in torch between JAX parts of the graph (partition.py), with a warning.

Registered as a `torch_dynamo_backends` entry point (pyproject.toml), so no import is needed once
the package is installed; `backend` itself can also be passed: `torch.compile(m, backend=backend)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.fx

from ..capture import decomposition
from .jax_graph import JaxGraph
from .partition import partitioned, torch_only_nodes, warn_in_torch

# CPU SDPA's kernel, which torch's decomposition table would spell out as matmuls and a softmax
KEEP_WHOLE = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The dynamo backend: dynamo's graph -> aot_autograd's forward/backward graphs -> JAX."""
    return _aot_backend()(gm, example_inputs)


@functools.cache
def _aot_backend():
    from torch._dynamo.backends.common import aot_autograd

    table = dict(decomposition.decompositions().items())
    for op in KEEP_WHOLE:  # lowered whole: XLA sees one attention, and its backward is the VJP of it
        table.pop(op, None)
    return aot_autograd(fw_compiler=compile_forward, bw_compiler=compile_graph, inference_compiler=compile_forward,
                        decompositions=table)


def compile_forward(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """A forward or inference graph: its placeholders are the flat inputs, params and buffers marked static."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    return compile_graph(gm, example_inputs, frozenset(getattr(metadata, "static_input_indices", None) or ()))


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, state: frozenset[int] = frozenset()) -> Callable:
    """One aot_autograd graph as a boxed callable (aot_autograd passes a list it lets us clear); `state`:
    the placeholder positions holding params and buffers (JaxGraph)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    in_torch = torch_only_nodes(gm)
    with unset_fake_temporarily():  # aot_autograd compiles under its fake mode; the graph's constants are real
        if in_torch:
            warn_in_torch(in_torch)
            run = _torch_around_jax(partitioned(gm))
        else:
            run = JaxGraph(gm, state)

    def call(values: list) -> list:
        results = run(values)
        values.clear()
        return results

    call._boxed_call = True
    return call


def _torch_around_jax(gm: torch.fx.GraphModule) -> Callable[[list], list]:
    def run(values: list) -> list:
        out = gm(*values)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return run
