"""Leak trends (pure): a robust slope over the steady window, with its uncertainty, and when a growing
series would reach a limit.

Theil-Sen: the median of the slopes between every pair of points, which a step, a spike or noise
moves far less than a least-squares fit; the 95 % interval is Sen's (1968), from the ranks of those
pairwise slopes. The window keeps at most ``TrendWindow.capacity`` evenly spaced points (its stride
doubles as it fills), so the pairwise work stays bounded however long the soak runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

Z_95 = 1.959964
WINDOW_POINTS = 256
MIN_POINTS = 3


@dataclass(frozen=True)
class Slope:
    per_s: float
    low_per_s: float
    high_per_s: float
    points: int
    span_s: float


def theil_sen(ts: Sequence[float], ys: Sequence[float]) -> Slope | None:
    """The Theil-Sen slope of ``ys`` over ``ts`` and its 95 % interval; None with fewer than
    MIN_POINTS points or no time between them."""
    n = len(ts)
    if n < MIN_POINTS or n != len(ys):
        return None
    slopes = sorted(
        (ys[j] - ys[i]) / (ts[j] - ts[i]) for i in range(n) for j in range(i + 1, n) if ts[j] != ts[i]
    )
    if not slopes:
        return None
    count = len(slopes)
    middle = count // 2
    median = slopes[middle] if count % 2 else (slopes[middle - 1] + slopes[middle]) / 2
    spread = Z_95 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = slopes[max(0, math.floor((count - spread) / 2))]
    high = slopes[min(count - 1, math.ceil((count + spread) / 2) - 1)]
    return Slope(median, low, high, n, max(ts) - min(ts))


T = TypeVar("T")


class Thinned(Generic[T]):
    """Every ``stride``-th item added, at most ``capacity`` of them: the stride doubles (and every
    other item kept goes) whenever they fill up, so they stay evenly spaced over the whole run."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stride = 1
        self._seen = 0
        self.items: list[T] = []

    def add(self, item: T) -> None:
        if self._seen % self.stride == 0:
            self.items.append(item)
            if len(self.items) >= self.capacity:
                self.items = self.items[::2]
                self.stride *= 2
        self._seen += 1


class TrendWindow:
    """Evenly spaced (t, values) points of the steady samples, at most ``capacity`` of them."""

    def __init__(self, capacity: int = WINDOW_POINTS) -> None:
        self._thinned: Thinned[tuple[float, dict[str, float]]] = Thinned(capacity)

    @property
    def points(self) -> list[tuple[float, dict[str, float]]]:
        return self._thinned.items

    def add(self, t: float, values: Mapping[str, float | None]) -> None:
        self._thinned.add((t, {k: v for k, v in values.items() if v is not None}))

    def slope(self, key: str) -> Slope | None:
        pairs = [(t, values[key]) for t, values in self.points if key in values]
        return theil_sen([t for t, _ in pairs], [v for _, v in pairs])


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LeakTrend(_Model):
    """One series' trend over the steady window, per hour in the series' unit."""

    series: str
    unit: str
    per_hour: float
    low_per_hour: float = Field(description="95 % interval, low end.")
    high_per_hour: float = Field(description="95 % interval, high end.")
    points: int
    span_s: float

    @classmethod
    def of(cls, series: str, unit: str, slope: Slope) -> LeakTrend:
        return cls(
            series=series,
            unit=unit,
            per_hour=round(slope.per_s * 3600, 6),
            low_per_hour=round(slope.low_per_s * 3600, 6),
            high_per_hour=round(slope.high_per_s * 3600, 6),
            points=slope.points,
            span_s=round(slope.span_s, 3),
        )


def seconds_to_limit(current: float, limit: float, per_s: float) -> float | None:
    """When a series growing at ``per_s`` from ``current`` reaches ``limit`` (0 when it already has);
    None when it does not grow."""
    if current >= limit:
        return 0.0
    if per_s <= 0:
        return None
    return (limit - current) / per_s


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes memory quantity ("8Gi", "512M", "1e9") in bytes; None when it is not one."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        return None
    return int(float(match.group(1)) * _FACTORS[match.group(2)])
