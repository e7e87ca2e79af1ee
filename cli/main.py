"""`torch2jax` console script: one module per subcommand, each a thin layer over a library call.

Exit codes: 0 ok; 1 conversion or artifact error; 2 bad usage or input spec; 3 numerics differ
from PyTorch beyond tolerance. Errors are one paragraph on stderr, never a raw traceback.
"""

from __future__ import annotations

import click

from . import bisect, convert, finetune, generate, inspect, run, serve, verify


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torch2jax-aot", prog_name="torch2jax")
def main() -> None:
    """Export PyTorch models to JAX: StableHLO + Orbax weights, loadable without PyTorch.

    \b
    torch2jax convert sample_models/mlp.py:MLP --out out/mlp
    torch2jax inspect out/mlp
    torch2jax run out/mlp --input x=x.npy --out y.npz
    """


for command in (convert.convert, inspect.inspect, run.run, generate.generate, serve.serve, finetune.finetune, verify.verify,
                bisect.bisect):
    main.add_command(command)

