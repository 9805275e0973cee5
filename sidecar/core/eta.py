"""The finish against the deadline: the trainer's step rate over the recent past, by the sidecar's
clock, and when its declared total (``total_steps`` in its progress records) will be reached. Pure.

The rate is taken over the last ``WINDOW_S`` of samples (at least two records ``MIN_SPAN_S``
apart): recent enough to follow a slowdown, long enough not to follow one slow step. A step
count that goes back (a resumed attempt starting over) starts the window again.
"""

from __future__ import annotations

from collections import deque

from sidecar.core.trends import LeakTrend, TrendWindow

WINDOW_S = 600.0
MIN_SPAN_S = 2.0
# Points kept at most (a sample every 0.1 s for the whole window).
MAX_POINTS = 6_000


class StepRate:
    """Steps per second over the recent window; time is the caller's monotonic seconds."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._points: deque[tuple[float, int]] = deque(maxlen=MAX_POINTS)

    def observe(self, t: float, step: int | None) -> None:
        if step is None:
            return
        if self._points and step < self._points[-1][1]:
            self._points.clear()
        self._points.append((t, step))
        while len(self._points) > 2 and t - self._points[1][0] >= self._window_s:
            self._points.popleft()

    def per_s(self) -> float | None:
        if len(self._points) < 2:
            return None
        (t0, s0), (t1, s1) = self._points[0], self._points[-1]
        if t1 - t0 < MIN_SPAN_S:
            return None
        return (s1 - s0) / (t1 - t0)


class StepTimes:
    """Seconds per step between samples whose step advanced, over the whole attempt (evenly thinned,
    ``TrendWindow``): their Theil-Sen trend per hour, with its 95 % interval, says whether
    training slows down. A step count that goes back starts them again."""

    def __init__(self) -> None:
        self._window = TrendWindow()
        self._last: tuple[float, int] | None = None

    def observe(self, t: float, step: int | None) -> None:
        if step is None:
            return
        last, self._last = self._last, (t, step)
        if last is None or step < last[1]:
            if last is not None:
                self._window = TrendWindow()
            return
        if step > last[1] and t > last[0]:
            self._window.add(t, {"step_time_s": (t - last[0]) / (step - last[1])})

    def trend(self) -> LeakTrend | None:
        slope = self._window.slope("step_time_s")
        return None if slope is None else LeakTrend.of("step time", "s", slope)


def eta_s(step: int | None, total_steps: int | None, steps_per_s: float | None) -> float | None:
    """Seconds until ``total_steps`` at the recent rate; None without a total or a rate, 0 once reached."""
    if step is None or total_steps is None:
        return None
    if step >= total_steps:
        return 0.0
    if steps_per_s is None or steps_per_s <= 0:
        return None
    return (total_steps - step) / steps_per_s


def finish_note(eta: float | None, soft_stop_in_s: float | None) -> str | None:
    """One line when the run will not finish before the deadline's soft stop at this rate."""
    if eta is None or soft_stop_in_s is None or eta <= soft_stop_in_s:
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
