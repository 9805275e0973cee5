"""Each phase's stale timeout, optionally calibrated from the attempt's own history. Pure.

A phase other than train (a progress record's ``phase``) has its own configured stale timeout
(``monitor.stale_<phase>_s``). With a calibration factor (``monitor.phase_calibration_factor``), a
phase that has completed a visit in this attempt gets ``factor`` times its longest completed visit
instead, never below the train timeout (the floor: a short first visit must not make the next one
stricter than training itself) and never above the configured one (the cap: calibration never
loosens a timeout, and a trainer that declares a phase and stays in it is still a stall). A visit
is timed by the sidecar's clock: from the sample that first shows the phase to the sample that
shows another.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

TRAIN = "train"


class PhaseTimeout(BaseModel):
    """One phase's stale timeout, as the artifact states it."""

    model_config = ConfigDict(extra="forbid")

    phase: str
    configured_s: float = Field(description="monitor.stale_<phase>_s: the timeout, and calibration's cap.")
    longest_visit_s: float | None = Field(
        None, description="Its longest completed visit in this attempt, by the sidecar's clock."
    )
    calibrated_s: float | None = Field(
        None,
        description="The factor times longest_visit_s, at least the train timeout and at most "
        "configured_s: the timeout in force (null: no calibration, or no completed visit yet).",
    )


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}s"


class PhaseTimeouts:
    """The stale timeout in force in each phase, from the visits seen so far."""

    def __init__(self, train_s: float, configured: Mapping[str, float], factor: float | None = None) -> None:
        self._train_s = train_s
        self._configured = dict(configured)
        self._factor = factor
        # The phase the samples show now, since when (the sidecar's clock); each phase's longest
        # completed visit.
        self._phase = TRAIN
        self._since = 0.0
        self._longest: dict[str, float] = {}

    def observe(self, phase: str, now: float) -> None:
        """The phase a sample shows at ``now``: a change ends the visit to the phase before."""
        if phase == self._phase:
            return
        if self._phase in self._configured:  # train has none: its timeout is the floor
            visit = now - self._since
            self._longest[self._phase] = max(self._longest.get(self._phase, 0.0), visit)
        self._phase, self._since = phase, now

    def timeout_s(self, phase: str) -> float:
        """The stale timeout in force in ``phase``."""
        if phase not in self._configured:
            return self._train_s
        calibrated = self._calibrated_s(phase)
        return self._configured[phase] if calibrated is None else calibrated

    def why(self, phase: str) -> str:
        """The timeout in force in a phase but train and, where calibration lowered it, how."""
        timeout, longest = self.timeout_s(phase), self._longest.get(phase)
        if self._factor is None or longest is None or timeout >= self._configured[phase]:
            return f"its stale timeout: {timeout:g}s"
        floored = ", at least the train timeout" if self._factor * longest < self._train_s else ""
        return (
            f"its stale timeout: {_seconds(timeout)}, calibrated: {self._factor:g}x the longest seen, "
            f"{_seconds(longest)}{floored}"
        )

    def stated(self) -> list[PhaseTimeout]:
        """Every configured phase's timeouts, for the artifact."""
        return [
            PhaseTimeout(
                phase=phase,
                configured_s=configured,
                longest_visit_s=_rounded(self._longest.get(phase)),
                calibrated_s=_rounded(self._calibrated_s(phase)),
            )
            for phase, configured in self._configured.items()
        ]

    def _calibrated_s(self, phase: str) -> float | None:
        longest = self._longest.get(phase)
        if self._factor is None or longest is None:
            return None
        return min(self._configured[phase], max(self._factor * longest, self._train_s))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
