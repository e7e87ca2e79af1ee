"""The warm-up every kind of service runs before it serves: its steps compiled at the shapes it will meet, on a
thread of their own, while the server already listens and /health answers 503 with the progress."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("torch2jax.serve")


@dataclass(kw_only=True)
class WarmingUp:
    """A service's warm-up still to run (build_service(..., defer_warm_up=True)): called with a progress(done, total)
    callback; `compiled` / `total` its progress, `warm_up_error` why it failed. `serve()` starts serving once it ran."""

    warm_up: Callable[[Callable[[int, int], None]], None] | None = None
    compiled: int = 0
    total: int = 0
    warm_up_error: str | None = None

    @property
    def ready(self) -> bool:
        """Whether the compiled steps are ready (the warm-up, if any, has run)."""
        return self.warm_up is None

    def progress(self) -> dict:
        """What /health says of the warm-up: its calls done and in all."""
        return {"compiled": self.compiled, "total": self.total}

    def warming(self, model_name: str) -> dict | None:
        """/health's 503 body while the warm-up runs or after it failed (with the error); None once ready."""
        if self.ready:
            return None
        failed = {} if self.warm_up_error is None else {"error": self.warm_up_error}
        status = "warming up" if self.warm_up_error is None else "warm-up failed"
        return {"status": status, "model": model_name, **self.progress(), **failed}

    def serve(self) -> None:
        """Start serving (the scheduler's loop, for a service that has one)."""

    def start(self, on_ready: Callable[[], None] | None = None,
              on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Start serving at once, or, with a warm-up still to run, on a thread that runs it first (requests that arrive
        meanwhile wait); then `on_ready()`, or `on_failure(error)` when the warm-up failed (nothing is served then:
        /health keeps answering 503 with the error)."""
        if self.warm_up is None:
            self.serve()
            if on_ready is not None:
                on_ready()
            return

        def run() -> None:
            try:
                self.warm_up(self._progress)
            except BaseException as err:  # noqa: BLE001 - reported, and the server told to stop
                log.exception("the warm-up failed")
                self.warm_up_error = f"{type(err).__name__}: {err}"
                if on_failure is not None:
                    on_failure(err)
                return
            self.warm_up = None
            self.serve()
            if on_ready is not None:
                on_ready()

        threading.Thread(target=run, name="torch2jax-warm-up", daemon=True).start()

    def warm_up_now(self) -> None:
        """Run the pending warm-up on this thread (build_service without defer_warm_up)."""
        if self.warm_up is not None:
            self.warm_up(self._progress)
            self.warm_up = None

    def _progress(self, done: int, total: int) -> None:
        self.compiled, self.total = done, total
