"""What the monitor does next, decided from the time and what it just observed. Pure.

The monitoring loop (sidecar.app.monitoring) asks ``due(now)`` what to observe, observes it, and
carries out the ``Action`` that ``step(now, observation)`` returns. Every rule of the watch loop
lives here: liveness, lock loss, GPU fault, the throughput rule, deadline, and the kill fallback
when the launcher does not act on a stop request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.liveness import LivenessTracker, ProgressSignal
from sidecar.core.phase_timeouts import PhaseTimeout
from sidecar.core.samples import ProgressSample

StopAction = Literal["terminate", "kill"]
Due = Literal["sample", "liveness"] | None
# How long the loop may sleep at most and at least between steps.
MAX_SLEEP_S = 0.1
MIN_SLEEP_S = 0.005


@dataclass(frozen=True)
class MonitorTimings:
    """The monitor's settings, in seconds (monitor.* and launcher.kill_grace_s)."""

    sample_interval_s: float
    startup_timeout_s: float
    stale_progress_s: float
    progress_signal: ProgressSignal
    # How long after a stop request the sidecar waits for the launcher before killing itself.
    fallback_after_s: float
    # How long a stall's stop may wait for the trainer's stacks (0: none are taken).
    stack_capture_s: float = 0.0
    # The stale timeout of each phase but train (monitor.stale_<phase>_s).
    phase_stale_s: Mapping[str, float] = field(default_factory=dict)
    # Calibrate those from the attempt's own visits to each phase (None: off).
    phase_calibration_factor: float | None = None

    @property
    def liveness_interval_s(self) -> float:
        """Liveness is judged more often than full samples when its timeouts are short, so a stale
        trainer is caught within a tenth of the timeout, not a whole sample interval late."""
        shortest = min(self.stale_progress_s, self.startup_timeout_s)
        return min(self.sample_interval_s, max(0.1, shortest / 10))


@dataclass(frozen=True)
class Observation:
    """What the loop saw at one step. ``progress`` is None when nothing was due."""

    progress: ProgressSample | None = None
    # A GPU fault the sample showed (core.gpu_health.gpu_fault), and the deadline lock's loss.
    gpu_fault: Finding | None = None
    lock_loss: Finding | None = None
    deadline_expired: bool = False
    # The throughput rule's cause (core.throughput), once the step times pass its limit.
    throughput_drop: Finding | None = None


@dataclass(frozen=True)
class Action:
    """``stop``: ask the launcher to terminate or kill, for ``reason``, taking the trainer's stacks
    first for up to ``stacks_timeout_s`` (a stall). ``kill_remembered``: the launcher did not act in
    time; kill what was seen and stop monitoring."""

    stop: StopAction | None = None
    reason: str = ""
    kill_remembered: bool = False
    stacks_timeout_s: float = 0.0


CONTINUE = Action()


class MonitorPolicy:
    """The watch loop's state machine. Time is always an argument (monotonic seconds)."""

    def __init__(
        self, timings: MonitorTimings, *, started: float, baseline: ProgressSample | None = None
    ) -> None:
        self._timings = timings
        # baseline: the progress dir as the attempt found it (an earlier attempt's files).
        self._liveness = LivenessTracker(
            timings.startup_timeout_s,
            timings.stale_progress_s,
            started,
            timings.progress_signal,
            baseline,
            phase_stale_s=timings.phase_stale_s,
            phase_calibration_factor=timings.phase_calibration_factor,
        )
        self._next_sample = self._next_liveness = started
        self._stop_by: float | None = None
        self.failure: Finding | None = None
        self.gpu_fault: Finding | None = None
        self.stacks_requested = False
        # The launcher was still running when the deadline had passed (step is called only then).
        self.ran_past_deadline = False
        # Why the sidecar killed the remembered processes itself: the launcher did not act in time.
        self.fallback_kill: str | None = None

    def due(self, now: float) -> Due:
        """What to observe now; a full sample also judges liveness."""
        if now >= self._next_sample:
            self._next_sample = now + self._timings.sample_interval_s
            self._next_liveness = now + self._timings.liveness_interval_s
            return "sample"
        if now >= self._next_liveness:
            self._next_liveness = now + self._timings.liveness_interval_s
            return "liveness"
        return None

    def sleep_s(self, now: float) -> float:
        return min(MAX_SLEEP_S, max(MIN_SLEEP_S, min(self._next_sample, self._next_liveness) - now))

    def progress_age(self, now: float) -> float | None:
        return self._liveness.last_progress_age(now)

    def phase_timeouts(self) -> list[PhaseTimeout]:
        return self._liveness.phase_timeouts()

    def step(self, now: float, seen: Observation) -> Action:
        """One turn of the loop while the launcher runs."""
        self.ran_past_deadline = self.ran_past_deadline or seen.deadline_expired
        stale = None if seen.progress is None else self._liveness.observe(seen.progress, now)
        if stale is not None and self.failure is None:
            self.failure = stale
        if seen.gpu_fault is not None and self.gpu_fault is None:
            self.gpu_fault = seen.gpu_fault
        if self._stop_by is None:
            return self._first_stop(now, seen, stale)
        if now > self._stop_by:
            self.fallback_kill = (
                f"the launcher did not stop the trainer within {self._timings.fallback_after_s:g} s of the "
                "request: the sidecar killed its processes itself"
            )
            return Action(kill_remembered=True, reason=self.fallback_kill)
        return CONTINUE

    def _first_stop(self, now: float, seen: Observation, stale: Finding | None) -> Action:
        """At most one stop request: the first of lock loss, GPU fault, staleness, a throughput drop,
        the deadline."""
        if seen.lock_loss is not None:
            # Another supervisor may take the run over: ours must stop now (fail closed).
            self.failure = self.failure or seen.lock_loss
            return self._stop(now, "kill", seen.lock_loss.reason)
        if self.gpu_fault is not None:
            return self._stop(now, "terminate", self.gpu_fault.reason)
        if stale is not None:
            # Where the trainer hangs is the stall's evidence: its stacks first, then the TERM.
            return self._stop(now, "terminate", stale.reason, stacks_timeout_s=self._timings.stack_capture_s)
        if seen.throughput_drop is not None:
            # Slow, not hung: the TERM lets a trainer that handles it checkpoint on the way out.
            self.failure = self.failure or seen.throughput_drop
            return self._stop(now, "terminate", seen.throughput_drop.reason)
        if seen.deadline_expired:
            # The launcher enforces the deadline itself; this is the second line.
            return self._stop(now, "kill", "total-job deadline expired")
        return CONTINUE

    def _stop(self, now: float, action: StopAction, reason: str, *, stacks_timeout_s: float = 0.0) -> Action:
        self._stop_by = now + self._timings.fallback_after_s + stacks_timeout_s
        self.stacks_requested = stacks_timeout_s > 0
        return Action(stop=action, reason=reason, stacks_timeout_s=stacks_timeout_s)

    def interrupted(self, finding: Finding) -> None:
        """Cancellation or a failure of the monitor itself: it decides the verdict."""
        self.failure = finding


def monitor_failed(reason: str) -> Finding:
    """The sidecar's own failure (a crash of its monitor, an unreadable sample): never a pass."""
    return Finding(Classification.MONITOR_FAILURE, reason, Source.SIDECAR)


def lock_loss(reason: str) -> Finding:
    """The deadline lock's loss, as the monitor's failure: another supervisor may take the run over."""
    return monitor_failed(f"deadline lock lost: {reason}")
