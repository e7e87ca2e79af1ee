"""`torch2jax run`: call an artifact on .npy/.npz inputs and write its outputs."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .common import handles_errors


@click.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="NAME=FILE",
              help="Input array, repeatable: x=x.npy (or an .npz holding NAME).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Where to write the outputs (.npz).")
@click.option("--from-graph", is_flag=True, help="Rebuild the function from graph.json instead of the StableHLO.")
@click.option("--seed", default=0, show_default=True, help="PRNG seed for models with random ops (train-mode dropout).")
@handles_errors
def run(artifact_dir, inputs, out_file, from_graph, seed):
    """Call an artifact on .npy/.npz inputs and write its outputs to an .npz file.

    \b
    Example:
      torch2jax run out/mlp --input x=x.npy --out y.npz
    """
    import numpy as np

    import torch2jax
    from torch2jax.errors import InputSpecError
    from torch2jax.ir import input_specs as specs

    model = torch2jax.load(artifact_dir, from_graph=from_graph)
    arrays = {}
    for text in inputs:
        item = specs.parse(text)
        if not isinstance(item, specs.FileInput):
            raise InputSpecError(f"--input {text!r}: run takes array files, e.g. x=x.npy")
        arrays[item.name] = specs.load_array(item)
    names = [i["name"] for i in model.manifest["inputs"]]
    missing = [n for n in names if n not in arrays]
    unknown = [n for n in arrays if n not in names]
    if missing or unknown:
        raise InputSpecError(f"the artifact takes inputs {names}; missing {missing}, unknown {unknown}")
    rng = None
    if model.needs_rng:
        import jax

        rng = jax.random.key(seed)
    outputs = model.call_flat([arrays[n] for n in names], rng)
    flat = _flatten_outputs(outputs)
    out = Path(out_file)
    tmp = out.with_name(f".{out.name}.tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in flat.items()})
    os.replace(tmp, out)
    for key, value in flat.items():
        click.echo(f"{key}: {np.asarray(value).dtype}{list(np.shape(value))}")
    click.echo(f"wrote {out}")


def _flatten_outputs(value, prefix: str = "output") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten_outputs(item, f"{key}" if prefix == "output" else f"{prefix}.{key}"))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten_outputs(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}
