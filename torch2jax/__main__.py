"""`python -m torch2jax ...` runs the `torch2jax` command line.

Installed, the command line is the subpackage torch2jax.cli (pyproject.toml maps the checkout's top-level
cli/ onto that name). From a checkout on PYTHONPATH nothing maps it, so the cli/ folder beside the package is
registered under the same name first: both ways run the same code.
"""

import importlib.util
import sys
from pathlib import Path


def _command_line_from_checkout() -> None:
    """Register the checkout's cli/ as torch2jax.cli when no installed torch2jax.cli exists."""
    if importlib.util.find_spec("torch2jax.cli") is not None:
        return
    folder = Path(__file__).resolve().parent.parent / "cli"
    spec = importlib.util.spec_from_file_location("torch2jax.cli", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise SystemExit("torch2jax: the command line (torch2jax.cli) is not installed and no cli/ folder lies beside "
                         "the package; install it with `pip install 'torch2jax-aot'`")
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch2jax.cli"] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    _command_line_from_checkout()
    from torch2jax.cli.main import main

    main(prog_name="torch2jax")
