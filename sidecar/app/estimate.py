"""The finish against the deadline, from the trainer's structured progress records (sidecar.core.eta):
kept in the artifact, shown in the status line and on /metrics, and said once when, at the recent
rate, the run would pass the deadline's soft stop."""

from __future__ import annotations

import sys

from sidecar.app.values import Going
from sidecar.core.artifact import SampleRecorder
from sidecar.core.artifact.models import ProgressInfo
from sidecar.core.eta import StepRate, StepTimes, eta_s, finish_note
from sidecar.core.phase_timeouts import PhaseTimeout
from sidecar.core.samples import ProgressSample
from sidecar.core.trends import LeakTrend

# The step-time trend is a pairwise fit over up to 256 points: once every this many seconds.
TREND_EVERY_S = 30.0


class FinishEstimate:
    """The trainer's step rate and step times over the samples of one attempt, by the sidecar's clock."""

    def __init__(self) -> None:
        self._rate = StepRate()
        self._step_times = StepTimes()
        self._trend_at = -TREND_EVERY_S
        self._trend: LeakTrend | None = None

    def update(
        self,
        going: Going,
        recorder: SampleRecorder,
        progress: ProgressSample,
        now: float,
        phase_timeouts: list[PhaseTimeout],
    ) -> float | None:
        """The trainer's structured progress and the phases' stale timeouts into the artifact; the
        finish estimated from it (seconds), said once when, at this rate, it would pass the
        deadline's soft stop."""
        if progress.step is None and not progress.records_refused:
            return None
        self._rate.observe(now, progress.step)
        self._step_times.observe(now, progress.step)
        eta = _estimated(going, recorder, progress, self._rate.per_s())
        if now - self._trend_at >= TREND_EVERY_S:
            self._trend_at, self._trend = now, self._step_times.trend()
        if recorder.summary.progress is not None:  # _estimated has just set it
            recorder.summary.progress.step_time_trend = self._trend
            recorder.summary.progress.phase_timeouts = phase_timeouts
        return eta


def _estimated(
    going: Going, recorder: SampleRecorder, progress: ProgressSample, per_s: float | None
) -> float | None:
    """The ETA at ``per_s`` (None without a total or a rate), kept in the artifact with the note."""
    eta = eta_s(progress.step, progress.total_steps, per_s)
    clock = going.ports.clock
    left = going.preflight.clock.remaining(clock.wall(), clock.monotonic())
    before = recorder.summary.progress
    note = before.finish_note if before is not None else None
    if note is None and (note := finish_note(eta, left - going.settings.deadline.checkpoint_margin_s)):
        print(f"soak-sidecar: {note}", file=sys.stderr, flush=True)
    recorder.summary.progress = ProgressInfo(
        step=progress.step,
        total_steps=progress.total_steps,
        phase=progress.phase,
        steps_per_s=per_s,
        eta_s=eta,
        finish_note=note,
        records_refused=progress.records_refused,
        phase_calibration_factor=going.settings.monitor.phase_calibration_factor,
    )
    return eta
