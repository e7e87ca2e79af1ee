"""`torch2jax inspect`: an artifact's manifest, signature and params, and optionally its sharding plan on a mesh."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import handles_errors


@click.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the raw manifest.")
@click.option("--mesh", metavar="AXIS=N,...", help="Also plan the params on this device mesh (e.g. data=2,model=4) and "
              "report each param's spec, bytes per device and the collectives of the compiled call. On a CPU-only "
              "machine the devices are simulated.")
@click.option("--sharding", default="auto", show_default=True, metavar="auto|replicated|RULES.json",
              help="With --mesh: the sharding rules; a JSON file maps name patterns to axis lists, "
              'e.g. {"*.q_proj.weight": ["model", null]}.')
@handles_errors
def inspect(artifact_dir, as_json, mesh, sharding):
    """Show an artifact's manifest, signature and params summary.

    \b
    Examples:
      torch2jax inspect out/gpt
      torch2jax inspect out/llm --mesh data=2,model=4
    """
    from torch2jax.runtime.artifact import read_manifest
    from torch2jax.runtime.describe import describe

    manifest = read_manifest(Path(artifact_dir))
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    axes, rules = (_parse_mesh(mesh), _read_rules(sharding)) if mesh else (None, None)
    click.echo("\n".join(describe(manifest, artifact_dir)))
    if axes:
        _print_sharding(artifact_dir, axes, rules)


def _parse_mesh(text: str) -> dict[str, int]:
    axes = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name.strip().isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise click.BadParameter(f"{part!r}: give the mesh as AXIS=N pairs, e.g. data=2,model=4", param_hint="--mesh")
        axes[name.strip()] = int(size)
    return axes


def _read_rules(sharding: str) -> object:
    if sharding in ("auto", "replicated"):
        return sharding
    try:
        rules = json.loads(Path(sharding).read_text())
    except (OSError, ValueError) as err:
        raise click.BadParameter(f"{sharding}: not 'auto', 'replicated' or a readable JSON file of rules ({err})",
                                 param_hint="--sharding") from None
    if not isinstance(rules, dict):
        raise click.BadParameter(f"{sharding}: the rules file must hold a JSON object {{pattern: [axis or null, ...]}}",
                                 param_hint="--sharding")
    return {pattern: None if axes is None else tuple(axes) for pattern, axes in rules.items()}


def _print_sharding(artifact_dir: str, axes: dict[str, int], rules: object) -> None:
    import math

    import jax

    import torch2jax

    needed = math.prod(axes.values())
    try:
        jax.config.update("jax_num_cpu_devices", max(needed, 1))  # only takes effect before jax starts its CPU backend
    except RuntimeError:
        pass
    devices = jax.devices()
    if len(devices) < needed:
        raise click.ClickException(f"the mesh {axes} needs {needed} devices; this machine has {len(devices)} "
                                   f"{devices[0].platform} devices")
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices[:needed])
    click.echo("")
    click.echo(torch2jax.load(artifact_dir, mesh=mesh, sharding=rules).sharding_report())
