"""Only the kept rows: a slice of the last positions (a causal LM's logits_to_keep) is pushed up the graph, so the
last layer computes its queries, attention output, projections and MLP at those positions alone, while its keys and
values (and everything a whole value feeds) stay whole. Values and gradients are torch's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax.lowering import last_rows, passes

from ..helpers import max_err


class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class Layer(nn.Module):
    """A pre-norm decoder layer as transformers writes Llama's: rotary q and k, attention with an explicit mask,
    a gated MLP; `keys` returns its keys too (what a cache would keep, at every position)."""

    def __init__(self, width: int, heads: int, layer_norm: bool):
        super().__init__()
        self.heads, self.fused = heads, layer_norm  # the layer-norm variant splits one gate-and-up product
        norm = (lambda: nn.LayerNorm(width)) if layer_norm else (lambda: RMSNorm(width))
        self.norm1, self.norm2 = norm(), norm()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=i == 0) for i in range(4))
        self.gate, self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.gate_up = nn.Linear(width, 4 * width)
        self.act = nn.GELU(approximate="tanh") if layer_norm else nn.SiLU()

    def forward(self, x, cos, sin, mask):
        b, s, w = x.shape
        h = self.norm1(x)

        def split(t):
            return t.view(b, s, self.heads, -1).transpose(1, 2)

        def rotate(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

        q, k, v = rotate(split(self.q(h))), rotate(split(self.k(h))), split(self.v(h))
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(out.transpose(1, 2).reshape(b, s, w))
        if self.fused:
            gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        else:
            gate, up = self.gate(self.norm2(x)), self.up(self.norm2(x))
        return x + self.down(self.act(gate) * up), k


class TinyLM(nn.Module):
    """forward(ids) -> (last position's logits, every layer's keys): the shape of a causal LM's prefill."""

    def __init__(self, layer_norm: bool = False, return_hidden: bool = False, causal_flag: bool = False):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.layers = nn.ModuleList(Layer(32, 4, layer_norm) for _ in range(2))
        self.norm = nn.LayerNorm(32) if layer_norm else RMSNorm(32)
        self.head = nn.Linear(32, 50, bias=False)
        self.return_hidden, self.causal_flag = return_hidden, causal_flag

    def forward(self, ids):
        x = self.embed(ids)
        s = ids.shape[1]
        angles = torch.arange(s, dtype=torch.float32)[:, None] * torch.arange(1, 5, dtype=torch.float32)[None]
        cos, sin = torch.cat([angles.cos()] * 2, -1)[None, None], torch.cat([angles.sin()] * 2, -1)[None, None]
        mask = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
        keys = []
        for layer in self.layers:
            x, k = self._causal(layer, x, cos, sin) if self.causal_flag else layer(x, cos, sin, mask)
            keys.append(k)
        x = self.norm(x)
        logits = self.head(x[:, -1:, :])
        return (logits, keys, x) if self.return_hidden else (logits, keys)

    @staticmethod
    def _causal(layer, x, cos, sin):
        """The layer with is_causal=True in place of the mask."""
        original = nn.functional.scaled_dot_product_attention

        def causal(q, k, v, attn_mask=None):
            return original(q, k, v, is_causal=True)

        nn.functional.scaled_dot_product_attention = causal
        try:
            return layer(x, cos, sin, None)
        finally:
            nn.functional.scaled_dot_product_attention = original


def _convert(module: nn.Module, batch: int = 2, length: int = 9, dynamic_batch: bool = False):
    ids = torch.randint(0, 50, (batch, length))
    dims = {1: "tokens", **({0: "batch"} if dynamic_batch else {})}
    return torch2jax.convert(module, (ids,), dynamic_shapes={"ids": dims})


def _kept_products(graph) -> list:
    """The Linear products computed at one position (the kept row) after the passes."""
    return [node for node in passes.optimize(graph).nodes if node.op == passes.LINEAR and node.meta.shape[-2] == 1]


def _check(module: nn.Module, model, shapes) -> None:
    with torch.no_grad():
        for batch, length in shapes:
            ids = torch.randint(0, 50, (batch, length))
            want = module(ids)
            got = model(ids.numpy())
            for g, w in zip(jax.tree.leaves(got), [t for t in jax.tree.leaves(want, is_leaf=torch.is_tensor)]):
                assert max_err(g, w) < 1e-5


@pytest.mark.parametrize("layer_norm", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_last_layer_computes_its_queries_and_mlp_at_the_kept_row_only(layer_norm):
    torch.manual_seed(0)
    module = TinyLM(layer_norm=layer_norm).eval()
    model = _convert(module)
    kept = sorted(node.args[1]["ref"] for node in _kept_products(model.graph))
    # the last layer's q, o, MLP and the head; its k and v (kept by the cache) stay whole, as does layer 0. The
    # layer-norm variant's MLP is one product split in two (a multi-output split, read by getitems)
    mlp = ("gate_up", "down") if layer_norm else ("gate", "up", "down")
    assert kept == sorted([f"p_layers_1_{name}_weight" for name in ("q", "o", *mlp)] + ["p_head_weight"])
    _check(module, model, [(2, 9), (2, 5), (2, 2)])


def test_symbolic_batch_and_gradients():
    torch.manual_seed(0)
    module = TinyLM().eval()
    model = _convert(module, dynamic_batch=True)
    assert len(_kept_products(model.graph)) == 6
    _check(module, model, [(4, 7), (1, 12)])
    ids = torch.randint(0, 50, (2, 6))
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, ids.numpy())[0] ** 2))(model.params)
    module.zero_grad()
    (module(ids)[0] ** 2).sum().backward()
    for name in ("layers.1.q.weight", "layers.1.k.weight", "layers.0.gate.weight", "norm.weight"):
        assert max_err(grads[name], dict(module.named_parameters())[name].grad) < 1e-4, name


def test_a_value_also_returned_whole_is_computed_whole():
    """The final norm's output is an output too: it is computed at every row, and the head reads its last row."""
    torch.manual_seed(0)
    module = TinyLM(return_hidden=True).eval()
    model = _convert(module)
    assert [node.args[1]["ref"] for node in _kept_products(model.graph)] == ["p_head_weight"]
    _check(module, model, [(2, 9), (2, 3)])


def test_causal_attention_without_a_mask_is_left_whole():
    """is_causal=True masks by position from the start: queries of the last rows alone would be masked as if first."""
    torch.manual_seed(0)
    module = TinyLM(causal_flag=True).eval()
    model = _convert(module)
    kept = {node.args[1]["ref"] for node in _kept_products(model.graph)}
    assert kept == {f"p_layers_1_{name}_weight" for name in ("o", "gate", "up", "down")} | {"p_head_weight"}
    _check(module, model, [(2, 9), (2, 4)])


def test_only_a_slice_of_the_last_rows_of_a_known_length_starts_it():
    """x[:, 2:] (not the last rows) changes nothing."""

    class Middle(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x)[:, 2:]

    torch.manual_seed(0)
    module = Middle()
    model = torch2jax.convert(module, (torch.randn(2, 6, 8),))
    optimized = passes.optimize(model.graph)
    assert last_rows.keep_last_rows(optimized) is optimized
    with torch.no_grad():
        x = torch.randn(2, 6, 8)
        assert max_err(model(x.numpy()), module(x)) < 1e-6


def test_a_static_length_one_prompt_is_left_alone():
    torch.manual_seed(0)
    module = TinyLM().eval()
    model = torch2jax.convert(module, (torch.randint(0, 50, (2, 1)),))
    assert not any("__rows" in node.name for node in passes.optimize(model.graph).nodes)
