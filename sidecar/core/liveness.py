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

While the trainer's last progress record names a phase other than train, that phase's own stale
timeout applies, optionally calibrated from the attempt's history (``sidecar.core.phase_timeouts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.phase_timeouts import TRAIN, PhaseTimeout, PhaseTimeouts
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
        phase_calibration_factor: float | None = None,
    ) -> None:
        self._signal: ProgressSignal = signal
        # What the progress dir held when the attempt started; None or empty: nothing to tell apart.
        self._baseline = (
            None if baseline is None or baseline.bytes_total <= 0 else _signature(baseline, signal)
        )
        self._startup_timeout_s = startup_timeout_s
        # The stale timeout of each phase, as the trainer's last progress record names it.
        self._phases = PhaseTimeouts(stale_progress_s, phase_stale_s or {}, phase_calibration_factor)
        self._started = started_monotonic
        self._last_signature: tuple[int, int, float | None] | None = None
        self._last_change: float | None = None

    def observe(self, progress: ProgressSample, now_monotonic: float) -> Finding | None:
        """Record one progress sample; the finding when a liveness rule fails, else None."""
        signature = _signature(progress, self._signal)
        begun = self._last_change is not None or signature != self._baseline
        # Once progress has begun the stale rule holds; an emptied dir is no progress (a hung
        # trainer's trick, or an honest rewrite caught between truncate and write): the timer runs
        # on from the last change of files holding bytes.
        if progress.bytes_total > 0 and begun and signature != self._last_signature:
            self._last_change, self._last_signature = now_monotonic, signature
        if self._last_change is None:
            if now_monotonic - self._started > self._startup_timeout_s:
                reason = f"training produced no progress artifact within {self._startup_timeout_s:.1f}s"
                return Finding(KIND_STARTUP, reason, Source.SIDECAR)
            return None
        idle = now_monotonic - self._last_change
        phase = progress.phase or TRAIN
        self._phases.observe(phase, now_monotonic)
        if idle > self._phases.timeout_s(phase):
            return Finding(KIND_STALE, self._stale_reason(idle, phase), Source.SIDECAR)
        return None

    def last_progress_age(self, now_monotonic: float) -> float | None:
        """Seconds since progress last changed; None before the first progress."""
        if self._last_change is None:
            return None
        return now_monotonic - self._last_change

    def phase_timeouts(self) -> list[PhaseTimeout]:
        """Each phase's configured timeout, longest visit and calibrated timeout, so far."""
        return self._phases.stated()

    def _stale_reason(self, idle: float, phase: str) -> str:
        """A stall in train names no phase; in any other, the phase and the timeout in force."""
        if phase == TRAIN:
            return f"training progress did not change for {idle:.1f}s"
        why = self._phases.why(phase)
        return f"training progress did not change for {idle:.1f}s in phase {phase} ({why})"
