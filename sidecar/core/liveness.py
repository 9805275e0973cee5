"""Liveness rules of the soak monitor, pure: time and progress come in as arguments.

The trainer has *started* producing progress once the watched files hold more than zero bytes
(``bytes_total > 0``) and differ from what the attempt found there (``baseline``: a
resumed attempt shares the progress dir with the attempts before it, whose files must not count as
its own first progress); until then the startup timeout applies, measured from the start.
After that, what counts as progress is the ``signal``:

- ``any`` (default): any change: of ``bytes_total``, ``file_count`` or ``max_mtime``, so a
  trainer that rewrites a fixed-size file (``{"step": N}``) makes progress. It never accepts a
  trainer whose files do not change at all, and the console log stays excluded by the probe, so
  chatty logging cannot mask a hang.
- ``bytes`` (``SOAK_MONITOR__PROGRESS_SIGNAL=bytes``): only a change of ``bytes_total`` resets
  the stale timer (stricter: a touched or same-size rewritten file is not progress).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.samples import ProgressSample

KIND_STARTUP = Classification.STARTUP_TIMEOUT
KIND_STALE = Classification.STALE_PROGRESS


ProgressSignal = Literal["bytes", "any"]


def _signature(progress: ProgressSample, signal: ProgressSignal) -> tuple[int, int, float | None]:
    if signal == "bytes":
        return (progress.bytes_total, 0, None)
    return (progress.bytes_total, progress.file_count, progress.max_mtime)


class LivenessTracker:
    """Startup timeout until the first progress, stale-progress timeout after it."""

    def __init__(
        self,
        startup_timeout_s: float,
        stale_progress_s: float,
        started_monotonic: float,
        signal: ProgressSignal = "any",
        baseline: ProgressSample | None = None,
        *,
        phase_stale_s: Mapping[str, float] | None = None,
    ) -> None:
        self._signal: ProgressSignal = signal
        # What the progress dir held when the attempt started; None or empty: nothing to tell apart.
        self._baseline = (
            None if baseline is None or baseline.bytes_total <= 0 else _signature(baseline, signal)
        )
        self._startup_timeout_s = startup_timeout_s
        self._stale_progress_s = stale_progress_s
        # The stale timeout of each phase but train, as the trainer's last progress record names it.
        self._phase_stale_s = dict(phase_stale_s or {})
        self._started = started_monotonic
        self._last_signature: tuple[int, int, float | None] | None = None
        self._last_change: float | None = None

    def observe(self, progress: ProgressSample, now_monotonic: float) -> Finding | None:
        """Record one progress sample; the finding when a liveness rule fails, else None."""
        signature = _signature(progress, self._signal)
        begun = self._last_change is not None or signature != self._baseline
        if progress.bytes_total > 0 and begun:
            if self._last_change is None or signature != self._last_signature:
                self._last_change = now_monotonic
                self._last_signature = signature
            idle = now_monotonic - self._last_change
            phase = progress.phase or "train"
            timeout = self._phase_stale_s.get(phase, self._stale_progress_s)
            if idle > timeout:
                return Finding(KIND_STALE, _stale_reason(idle, phase, timeout), Source.SIDECAR)
        elif now_monotonic - self._started > self._startup_timeout_s:
            reason = f"training produced no progress artifact within {self._startup_timeout_s:.1f}s"
            return Finding(KIND_STARTUP, reason, Source.SIDECAR)
        return None

    def last_progress_age(self, now_monotonic: float) -> float | None:
        """Seconds since progress last changed; None before the first progress."""
        if self._last_change is None:
            return None
        return now_monotonic - self._last_change


def _stale_reason(idle: float, phase: str, timeout: float) -> str:
    """A stall in train names no phase; in any other, the phase and its own timeout."""
    if phase == "train":
        return f"training progress did not change for {idle:.1f}s"
    return (
        f"training progress did not change for {idle:.1f}s in phase {phase} (its stale timeout: {timeout:g}s)"
    )
