"""Ctrl-C and SIGTERM: an external cancellation while the trainer runs, noted once concluding."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


class Cancelled(BaseException):
    """SIGTERM to the sidecar: treated like Ctrl-C (external cancellation)."""


def raise_cancelled(signum: int, _frame: object) -> None:
    raise Cancelled(signal.Signals(signum).name)


@contextlib.contextmanager
def cancellation_on_sigterm() -> Iterator[None]:
    """SIGTERM (pod deletion, kill) becomes an external cancellation, like Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, raise_cancelled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class DeferredSignals:
    """From ``defer()`` until ``restore()``, SIGINT and SIGTERM are noted instead of raised: the
    artifact comes first. Only the main thread can change signal handlers; elsewhere a no-op."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] | None = None

    def defer(self) -> None:
        if self._saved is not None or threading.current_thread() is not threading.main_thread():
            return

        def note(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            print(f"soak-sidecar: {name} while concluding: writing the artifact first", file=sys.stderr)

        self._saved = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        for signum, handler in (saved or {}).items():
            if handler is not None:
                signal.signal(signum, handler)
