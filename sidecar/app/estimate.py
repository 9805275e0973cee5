"""The finish against the deadline, from the trainer's structured progress records (sidecar.core.eta):
kept in the artifact, shown in the status line and on /metrics, and said once when, at the recent
rate, the run would pass the deadline's soft stop; and the throughput rule (sidecar.core.throughput)
on the step times, judged as often as the trend is fitted."""

from __future__ import annotations

import math
import sys

from sidecar.app.values import Going
from sidecar.core.artifact import SampleRecorder
from sidecar.core.artifact.progress import ProgressInfo
from sidecar.core.classification import Finding, Standing
from sidecar.core.eta import Pace, StepRate, StepTimes, eta_s, finish_note
from sidecar.core.phase_timeouts import PhaseTimeout
from sidecar.core.samples import ProgressSample
from sidecar.core.throughput import (
    ThroughputLimit,
    drop_per_hour_pct,
    drop_since_first_hour_pct,
    throughput_finding,
)

# The step-time trend is a pairwise fit over up to 256 points (some milliseconds): once every this
# many seconds, or every TREND_EVERY_SAMPLES samples when they come more often than that.
TREND_EVERY_S = 30.0
TREND_EVERY_SAMPLES = 6


class FinishEstimate:
    """The trainer's step rate and step times over the samples of one attempt, by the sidecar's clock,
    and what the throughput rule makes of them (sidecar.core.throughput)."""

    def __init__(self, limit: ThroughputLimit, sample_interval_s: float) -> None:
        self._limit = limit
        self._trend_every_s = min(TREND_EVERY_S, TREND_EVERY_SAMPLES * sample_interval_s)
        self._rate = StepRate()
        self._step_times = StepTimes()
        self._trend_at = -math.inf
        self._pace: Pace | None = None
        # The throughput rule's cause once its limit is passed; a slowdown's note otherwise.
        self.dropped: Finding | None = None
        self.slowing: Finding | None = None

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
        eta = _estimated(going, recorder, progress, self._rate)
        if now - self._trend_at >= self._trend_every_s:
            self._trend_at, self._pace = now, self._step_times.pace(now)
            self._judge(self._pace)
        info = recorder.summary.progress  # _estimated has just set it
        if info is not None:
            info.phase_timeouts = phase_timeouts
        if info is not None and self._pace is not None:
            info.step_time_trend = self._pace.trend
            info.drop_per_hour_pct = _rounded(drop_per_hour_pct(self._pace))
            info.drop_since_first_hour_pct = _rounded(drop_since_first_hour_pct(self._pace))
            info.slowdown = None if self.slowing is None else self.slowing.reason
        return eta

    @property
    def steps_per_s(self) -> float | None:
        """The recent rate (sidecar.core.eta.StepRate)."""
        return self._rate.per_s()

    def _judge(self, pace: Pace) -> None:
        found = throughput_finding(pace, self._limit)
        if found is not None and found.standing is Standing.CAUSE:
            self.dropped = self.dropped or found
        else:
            self.slowing = found


def _rounded(percent: float | None) -> float | None:
    return None if percent is None else round(percent, 3)


def _estimated(
    going: Going, recorder: SampleRecorder, progress: ProgressSample, rate: StepRate
) -> float | None:
    """The ETA at the recent rate (None without a total or a rate), kept in the artifact with the note."""
    per_s = rate.per_s()
    eta = eta_s(progress.step, progress.total_steps, per_s)
    clock = going.ports.clock
    left = going.preflight.clock.remaining(clock.wall(), clock.monotonic())
    before = recorder.summary.progress
    said = before.finish_note if before is not None else None
    # Said once; kept in the artifact as it stands now.
    soft_stop_in_s = left - going.settings.deadline.checkpoint_margin_s
    now_note = finish_note(eta, soft_stop_in_s, rate_span_s=rate.span_s())
    if now_note is not None and said is None:
        print(f"soak-sidecar: {now_note}", file=sys.stderr, flush=True)
    note = now_note or said
    recorder.summary.progress = ProgressInfo(
        step=progress.step,
        total_steps=progress.total_steps,
        phase=progress.phase,
        steps_per_s=per_s,
        mean_steps_per_s=rate.mean_per_s(),
        eta_s=eta,
        finish_note=note,
        records_refused=progress.records_refused,
        phase_calibration_factor=going.settings.monitor.phase_calibration_factor,
    )
    return eta
