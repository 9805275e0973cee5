"""Ctrl-C and the other stop signals: an external cancellation while the trainer runs, noted once
concluding. A sidecar killed by a signal would leave no artifact and no verdict."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

# Signals whose default action ends the process: each becomes an external cancellation (exit 17).
CANCELLING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class Cancelled(BaseException):
    """A stop signal to the sidecar: treated like Ctrl-C (external cancellation)."""


def raise_cancelled(signum: int, _frame: object) -> None:
    raise Cancelled(signal.Signals(signum).name)


@contextlib.contextmanager
def cancellation_on_signals() -> Iterator[None]:
    """SIGTERM (pod deletion, kill), SIGHUP (a closed terminal), SIGQUIT and SIGUSR1/2 become an
    external cancellation, like Ctrl-C (SIGINT). The sidecar sets these itself rather than keep
    what it inherited: Ctrl-C counts even when it was started as a background job (which starts
    with SIGINT ignored). The one inherited choice kept is an ignored SIGHUP: ``nohup`` asked
    that a closed terminal not stop the soak."""
    handled = [s for s in CANCELLING_SIGNALS if not (s == signal.SIGHUP and _ignored(s))]
    previous = {signum: signal.signal(signum, raise_cancelled) for signum in handled}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be restored from here
                signal.signal(signum, handler)


def _ignored(signum: int) -> bool:
    return signal.getsignal(signum) == signal.SIG_IGN


def ignore_stop_signals() -> None:
    """Once the verdict is decided: a late signal must not turn its exit code into a traceback or a
    death by signal, up to the process exit (interpreter shutdown included)."""
    for signum in (signal.SIGINT, *CANCELLING_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)


class DeferredSignals:
    """From ``defer()`` until ``restore()``, SIGINT and the stop signals are noted instead of raised: the
    artifact comes first. Only the main thread can change signal handlers; elsewhere a no-op."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] | None = None
        self.noted = 0  # signals noted while deferred: somebody asked again to stop

    def defer(self) -> None:
        if self._saved is not None or threading.current_thread() is not threading.main_thread():
            return

        def note(signum: int, _frame: object) -> None:
            self.noted += 1
            name = signal.Signals(signum).name
            print(f"soak-sidecar: {name} while concluding: writing the artifact first", file=sys.stderr)

        self._saved = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, *CANCELLING_SIGNALS)}

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        for signum, handler in (saved or {}).items():
            if handler is not None:
                signal.signal(signum, handler)
