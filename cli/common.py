"""What every subcommand shares: exit codes a CI step can rely on, one-paragraph errors, progress lines."""

from __future__ import annotations

import functools
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
