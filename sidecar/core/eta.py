"""The finish against the deadline: the trainer's step rate over the recent past, by the sidecar's
clock, and when its declared total (``total_steps`` in its progress records) will be reached. Pure.

The rate is taken over the last ``WINDOW_S`` of samples (at least two records ``MIN_SPAN_S``
apart): recent enough to follow a slowdown, long enough not to follow one slow step. A step
count that goes back (a resumed attempt starting over) starts the window again.

Rates and step times are timed between the samples at which a step was first seen: a step longer
than the sample interval (most large-model training) spans several samples, and timing it from the
last of them would read every step as one sample interval.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from sidecar.core.trends import WINDOW_POINTS, LeakTrend, Thinned, TrendWindow

WINDOW_S = 600.0
MIN_SPAN_S = 2.0
# Points kept at most (a sample every 0.1 s for the whole window).
MAX_POINTS = 6_000
# Seconds of records the rate must rest on before the finish is said to pass the soft stop.
NOTE_MIN_SPAN_S = 60.0
# What the throughput rule's first-hour basis compares the recent step time with.
FIRST_HOUR_S = 3600.0


class StepRate:
    """Steps per second over the recent window; time is the caller's monotonic seconds."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        # (time first seen, step) of each step seen in the window.
        self._points: deque[tuple[float, int]] = deque(maxlen=MAX_POINTS)
        # The first step of the attempt (since the step last went back): the mean rate's start.
        self._first: tuple[float, int] | None = None
        self._now = 0.0

    def observe(self, t: float, step: int | None) -> None:
        if step is None:
            return
        self._now = t
        if self._points and step < self._points[-1][1]:
            self._points.clear()
            self._first = None
        self._first = self._first or (t, step)
        if not self._points or step > self._points[-1][1]:
            self._points.append((t, step))
        while len(self._points) > 2 and t - self._points[1][0] >= self._window_s:
            self._points.popleft()

    def per_s(self) -> float | None:
        return self._rate(self._points[0]) if self._points else None

    def span_s(self) -> float:
        """Seconds the recent window's records span: how much the rate rests on."""
        return self._now - self._points[0][0] if self._points else 0.0

    def mean_per_s(self) -> float | None:
        """Steps per second from the attempt's first record to its last: what the indexes of a
        multi-pod soak are compared by (sidecar.core.slow_index)."""
        return None if self._first is None else self._rate(self._first)

    def _rate(self, start: tuple[float, int]) -> float | None:
        """From ``start`` to the last step first seen; lower once the step in progress has taken
        longer than that rate allows (a stalled trainer's rate falls rather than stays). Once
        MIN_SPAN_S have passed since ``start``: a long checkpoint after a few quick steps has a rate."""
        (t0, s0), (t1, s1) = start, self._points[-1]
        if s1 == s0 or self._now - t0 < MIN_SPAN_S:
            return None
        return min((s1 - s0) / (t1 - t0), (s1 - s0 + 1) / (self._now - t0))


@dataclass(frozen=True)
class Pace:
    """The step times of one attempt, as the throughput rule weighs them (sidecar.core.throughput)."""

    trend: LeakTrend | None
    # Medians (seconds per step): robust to the one long step a checkpoint or an eval leaves.
    median_s: float | None
    first_hour_s: float | None  # over the first hour, once it is over
    recent_s: float | None  # over the last WINDOW_S


class StepTimes:
    """Seconds per step between the samples at which a step was first seen, over the whole attempt
    (evenly thinned, ``TrendWindow``): their Theil-Sen trend per hour, with its 95 % interval, says
    whether training slows down; the first hour's and the recent medians say by how much since it began.
    A step count that goes back (a counter reset each epoch, or forged) gives no step time and
    restarts nothing: a trainer cannot wipe the throughput rule's evidence. A resumed attempt has a
    sidecar, and step times, of its own."""

    def __init__(self, first_hour_s: float = FIRST_HOUR_S) -> None:
        self._first_hour_s = first_hour_s
        # (time, step) of the sample at which the current step was first seen.
        self._base: tuple[float, int] | None = None
        self._window = TrendWindow()
        self._first: Thinned[float] = Thinned(WINDOW_POINTS)
        self._recent: deque[tuple[float, float]] = deque(maxlen=MAX_POINTS)
        self._began: float | None = None

    def observe(self, t: float, step: int | None) -> None:
        if step is None:
            return
        base = self._base
        if base is not None and step == base[1]:
            return
        # A step that went back moves the base too, so that the advances after it are timed.
        self._base = (t, step)
        if base is None or step < base[1] or t <= base[0]:
            return
        seconds = (t - base[0]) / (step - base[1])
        self._window.add(t, {"step_time_s": seconds})
        self._began = base[0] if self._began is None else self._began
        if t - self._began <= self._first_hour_s:
            self._first.add(seconds)
        self._recent.append((t, seconds))
        while t - self._recent[0][0] > WINDOW_S:
            self._recent.popleft()

    def trend(self) -> LeakTrend | None:
        slope = self._window.slope("step_time_s")
        return None if slope is None else LeakTrend.of("step time", "s", slope)

    def pace(self, now: float) -> Pace:
        """The trend and the medians at ``now`` (the first hour's once an hour has passed)."""
        window = [values["step_time_s"] for _, values in self._window.points]
        hour_over = self._began is not None and now - self._began >= self._first_hour_s
        return Pace(
            trend=self.trend(),
            median_s=_median(window),
            first_hour_s=_median(self._first.items) if hour_over else None,
            recent_s=_median([seconds for _, seconds in self._recent]),
        )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def eta_s(step: int | None, total_steps: int | None, steps_per_s: float | None) -> float | None:
    """Seconds until ``total_steps`` at the recent rate; None without a total or a rate, 0 once reached."""
    if step is None or total_steps is None:
        return None
    if step >= total_steps:
        return 0.0
    if steps_per_s is None or steps_per_s <= 0:
        return None
    return (total_steps - step) / steps_per_s


def finish_note(eta: float | None, soft_stop_in_s: float | None, *, rate_span_s: float) -> str | None:
    """One line when the run will not finish before the deadline's soft stop at this rate, once the
    rate rests on NOTE_MIN_SPAN_S of records (a few seconds of them say little)."""
    if eta is None or soft_stop_in_s is None or eta <= soft_stop_in_s or rate_span_s < NOTE_MIN_SPAN_S:
        return None
    return (
        f"at this rate the run needs {_duration(eta)} more; {_duration(max(0.0, soft_stop_in_s))} remain "
        "before the deadline's soft stop"
    )


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{seconds:.0f} s"
