"""The slow index of a multi-pod soak: an index whose step rate is well below the others'. Pure.

Each index's rate is its attempt's mean steps per second by its own sidecar's clock (the trainer's
progress records, sidecar.core.eta). An index is slow when its rate is below ``SLOW_BELOW`` of the
median of the other indexes' rates: against the others, not a median it is part of, so two pods
are compared with each other. A claim of the trainer's like every rate: it names an index to look
at and fails nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Below this share of the others' median an index is named slow: a 30 % slower pod (0.70 or
# 0.77 of the rate, by the throughput or by the step time) is, run-to-run noise of a few % is not.
SLOW_BELOW = 0.85


@dataclass(frozen=True)
class IndexRate:
    """One index's latest attempt and its rate (steps per second)."""

    index: int
    attempt: int
    steps_per_s: float
    node: str | None = None


@dataclass(frozen=True)
class SlowIndex:
    index: int
    attempt: int
    node: str | None
    steps_per_s: float
    others_median: float

    @property
    def ratio(self) -> float:
        return self.steps_per_s / self.others_median

    def describe(self) -> str:
        where = f" on node {self.node}" if self.node else ""
        return (
            f"index {self.index}{where} ran at {self.steps_per_s:.3g} steps/s, {self.ratio:.2f}x the median "
            f"of the other indexes ({self.others_median:.3g} steps/s)"
        )


def latest_rates(rates: Sequence[IndexRate]) -> list[IndexRate]:
    """Each index's latest attempt with a rate, by index; rates that are no rate (not finite, not
    above zero) left out."""
    latest: dict[int, IndexRate] = {}
    for rate in rates:
        if not (math.isfinite(rate.steps_per_s) and rate.steps_per_s > 0):
            continue
        if rate.index not in latest or rate.attempt >= latest[rate.index].attempt:
            latest[rate.index] = rate
    return [latest[index] for index in sorted(latest)]


def slow_indexes(rates: Sequence[IndexRate]) -> list[SlowIndex]:
    """The indexes below ``SLOW_BELOW`` of the other indexes' median rate (their latest attempts)."""
    latest = latest_rates(rates)
    slow: list[SlowIndex] = []
    for rate in latest:
        others = [other.steps_per_s for other in latest if other.index != rate.index]
        if not others:
            continue
        median = statistics.median(others)
        if rate.steps_per_s < SLOW_BELOW * median:
            slow.append(SlowIndex(rate.index, rate.attempt, rate.node, rate.steps_per_s, median))
    return slow
