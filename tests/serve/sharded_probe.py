"""Run in a subprocess with 8 simulated CPU devices: load artifacts on a (2, 4) mesh and report what the
tests check (errors against the unsharded load, how params are split, collectives, error messages).

    python sharded_probe.py OUT.json FWD_ARTIFACT... -- GEN_ARTIFACT...
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()  # the tests' level kept

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import torch2jax  # noqa: E402

Q = "model.layers.0.self_attn.q_proj.weight"


def forward(path: str, mesh) -> dict:
    x = np.random.default_rng(0).integers(3, 128, (4, 8)).astype(np.int64)
    reference = np.asarray(torch2jax.load(path)(x)["logits"])
    out = {}
    for from_graph in (True, False):  # the rebuilt graph, then the deserialized StableHLO, which the rest inspects
        m = torch2jax.load(path, mesh=mesh, from_graph=from_graph)
        y = m(x)["logits"]
        out["graph" if from_graph else "exported"] = float(np.abs(np.asarray(y) - reference).max())
    q = m.params[Q]
    report = m.sharding_report()
    out.update(
        q_replicated=bool(q.sharding.is_fully_replicated),
        q_shard_bytes=int(q.addressable_shards[0].data.nbytes), q_bytes=int(q.nbytes),
        output_spec=str(y.sharding.spec),
        per_device=report.bytes_per_device, total=report.total_bytes,
        collectives=report.collectives, report=str(report),
    )
    return out


def generation(path: str, mesh) -> dict:
    ids = np.random.default_rng(1).integers(3, 128, (4, 6)).astype(np.int64)
    mask = np.ones_like(ids, bool)
    mask[1, :2] = False  # a left-padded row
    expected = torch2jax.load(path).generate(ids, attention_mask=mask, max_new_tokens=10)
    g = torch2jax.load(path, mesh=mesh)
    got = g.generate(ids, attention_mask=mask, max_new_tokens=10)
    cache = g.new_cache(4)[0]
    return {"equal": bool((got == expected).all()), "cache_spec": str(cache.sharding.spec),
            "decode_collectives": g.sharding_report().collectives,
            "q_replicated": bool(g.params[Q].sharding.is_fully_replicated)}


def errors(path: str, mesh) -> dict:
    three = jax.sharding.Mesh(np.array(jax.devices()[:6]).reshape(2, 3), ("data", "model"))  # 64 is not a multiple of 3
    cases = {
        "not_divisible": (three, {"*.q_proj.weight": P("model", None)}),
        "rank": (mesh, {"*.norm.weight": P("model", None)}),
        "axis": (mesh, {"*.q_proj.weight": P("tensor", None)}),
        "not_a_rule": (mesh, {"*.q_proj.weight": "model"}),
    }
    out = {}
    for name, (where, rules) in cases.items():
        try:
            torch2jax.load(path, mesh=where, sharding=rules)
            out[name] = "no error"
        except torch2jax.ShardingError as err:
            out[name] = str(err)
    auto = torch2jax.load(path, mesh=three)  # the auto rule does not divide: that param stays whole, and says why
    out["auto_on_three"] = {"q_replicated": bool(auto.params[Q].sharding.is_fully_replicated),
                            "report": str(auto.sharding_report())}
    rules = {"*.q_proj.weight": P(None, "model"), "model.embed_tokens.weight": P(None, "model")}
    m = torch2jax.load(path, mesh=mesh, sharding=rules)
    out["override_collectives"] = m.sharding_report().collectives
    out["override"] = {name: str(m.params[name].sharding.spec) for name in (Q, "model.embed_tokens.weight",
                                                                              "model.layers.0.self_attn.k_proj.weight")}
    out["replicated"] = all(p.sharding.is_fully_replicated for p in
                            torch2jax.load(path, mesh=mesh, sharding="replicated").params.values())
    return out


def main() -> None:
    target, *paths = sys.argv[1:]
    split = paths.index("--")
    forwards, gens = paths[:split], paths[split + 1:]
    mesh = jax.make_mesh((2, 4), ("data", "model"))  # jax's default: explicit axes (load makes them automatic)
    result = {"devices": len(jax.devices())}
    result["forward"] = {os.path.basename(p): forward(p, mesh) for p in forwards}
    result["generate"] = {os.path.basename(p): generation(p, mesh) for p in gens}
    result["errors"] = errors(forwards[0], mesh)
    with open(target, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
