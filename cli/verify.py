"""`torch2jax verify`: an artifact against PyTorch running the target on the same inputs."""

from __future__ import annotations

from pathlib import Path

import click

from .common import handles_errors


@click.command()
@click.argument("artifact_dir", type=click.Path(file_okay=False))
@click.argument("target")
@click.option("--weights", type=click.Path(dir_okay=False), help="state_dict to load into TARGET before comparing.")
@click.option("--input", "inputs", multiple=True, metavar="SPEC", help="Inputs as for convert (default: example_inputs()).")
@click.option("--seed", default=0, show_default=True)
@click.option("--report", "report_file", type=click.Path(dir_okay=False),
              help="Write a markdown report (per-output errors, timings, op counts, environment), pass or fail.")
@handles_errors
def verify(artifact_dir, target, weights, inputs, seed, report_file):
    """Compare an artifact with PyTorch running TARGET on the same inputs.

    \b
    Example:
      torch2jax verify out/gpt sample_models/tiny_gpt.py:TinyGPT --report verify.md

    Inputs: the example inputs, random inputs of the same shapes, and a second size of every
    symbolic dim. Exit status 3 when an output differs beyond its dtype's tolerance.
    """
    from torch2jax.pipeline.verify import verify_artifact

    try:
        report = verify_artifact(artifact_dir, target, inputs=inputs, weights=weights, seed=seed, report=report_file)
    finally:
        if report_file and Path(report_file).is_file():
            click.echo(f"report: {report_file}", err=True)
    click.echo(report.summary())
    click.echo(f"ok: max abs error {report.max_abs:.3g}")
