"""What every subcommand shares: exit codes a CI step can rely on, one-paragraph errors, progress lines."""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

import click

EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 1, 2, 3


def fail(message: str, code: int = EXIT_ERROR) -> None:
    click.secho("error: ", fg="red", bold=True, err=True, nl=False)
    click.echo(message, err=True)
    sys.exit(code)


# the optional packages a subcommand may need -> the extra of torch2jax-aot that installs them
EXTRAS = {"torch": "convert", "safetensors": "convert", "tokenizers": "text", "PIL": "vision", "starlette": "serve",
          "uvicorn": "serve", "pydantic": "serve", "jinja2": "serve", "prometheus_client": "serve",
          "optax": "finetune"}


def needs_extra(extra: str, *modules: str) -> None:
    """Exit with one paragraph naming `pip install 'torch2jax-aot[extra]'` when a package the subcommand needs is not
    installed: before any work, instead of a ModuleNotFoundError traceback later."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        fail(_not_installed(missing, extra), EXIT_ERROR)


def _not_installed(packages: list[str], extra: str) -> str:
    command = click.get_current_context(silent=True)
    what = f"`{command.command_path}`" if command is not None else "this command"
    return (f"{what} needs {', '.join(packages)}, which {'is' if len(packages) == 1 else 'are'} not installed: "
            f"pip install 'torch2jax-aot[{extra}]'")


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn torch2jax's own errors into a one-paragraph message and an exit code a CI step can use."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from torch2jax.errors import InputSpecError, SignatureError, Torch2JaxError, VerificationError

        try:
            return fn(*args, **kwargs)
        except VerificationError as err:
            fail(str(err), EXIT_MISMATCH)
        except (InputSpecError, SignatureError) as err:
            fail(str(err), EXIT_USAGE)
        except Torch2JaxError as err:
            fail(str(err), EXIT_ERROR)
        except ModuleNotFoundError as err:  # an optional package a library call imports only when it needs it
            package = (err.name or "").partition(".")[0]
            if package not in EXTRAS:
                raise
            fail(_not_installed([package], EXTRAS[package]), EXIT_ERROR)

    return wrapper


class Progress:
    """Step lines with timings on stderr: `[export] torch.export ... 0.84s`."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.start: float | None = None
        self.label = ""

    def __call__(self, stage: str, message: str) -> None:
        self.done()
        self.label = f"[{stage}] {message}"
        self.start = time.perf_counter()
        if not self.quiet:
            click.echo(f"{self.label} ...", err=True, nl=False)

    def done(self) -> None:
        if self.start is not None and not self.quiet:
            click.echo(f" {time.perf_counter() - self.start:.2f}s", err=True)
        self.start = None

    def bytes_written(self, written: int, total: int) -> None:
        """How far a long write is, redrawn in place on a terminal; a log gets the step's time only."""
        if self.quiet or self.start is None or not click.get_text_stream("stderr").isatty():
            return
        click.echo(f"\r{self.label} ... {written / 1e9:.2f} / {total / 1e9:.2f} GB", err=True, nl=False)
