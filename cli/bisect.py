"""`torch2jax bisect`: run torch and JAX node by node and name the first node whose output departs."""

from __future__ import annotations

import click

from .common import EXIT_MISMATCH, fail, handles_errors


@click.command()
@click.argument("target")
@click.option("--input", "inputs", multiple=True, metavar="SPEC", help="Inputs as for convert (default: example_inputs()).")
@click.option("--weights", type=click.Path(dir_okay=False), help="state_dict to load into TARGET.")
@click.option("--lowerings", multiple=True, type=click.Path(dir_okay=False, exists=True), help="Custom-op lowerings to import.")
@click.option("--seed", default=0, show_default=True)
@handles_errors
def bisect(target, inputs, weights, lowerings, seed):
    """Run torch and JAX node by node and name the first node whose output departs.

    \b
    Example:
      torch2jax bisect sample_models/tiny_gpt.py:TinyGPT
    Exit status 3 when a node diverges, 0 when every node matches.
    """
    from torch2jax.diagnose.bisect import bisect as run_bisect
    from torch2jax.pipeline.targets import import_lowerings, resolve_target

    for path in lowerings:
        import_lowerings(path)
    resolved = resolve_target(target, inputs, weights, seed=seed)
    divergence, checked = run_bisect(resolved.module, resolved.args, resolved.kwargs)
    if divergence is None:
        click.echo(f"ok: all {checked} compared nodes match torch within tolerance")
        return
    fail(str(divergence), EXIT_MISMATCH)
