"""Is training slowing down? The trainer's step times by the sidecar's clock (sidecar.core.eta.Pace)
as a finding. Pure.

Without a limit a slowdown the samples show beyond doubt (the step-time trend's 95 % interval
entirely above zero) is a note: named in a failed verdict's reason and kept in the artifact. With
``monitor.max_throughput_drop_pct`` it is a cause of its own, ``throughput_dropped`` (exit 21), once
the drop passes the limit:

- ``per_hour`` (default): the throughput an hour on at the trend's low end, against the typical
  step time now; the low end, so noise alone never trips it;
- ``first_hour``: the recent median step time (the last 10 minutes) against the first hour's.

Both use step times only where the step advanced, and medians or a Theil-Sen fit: the one long step
a checkpoint or an eval leaves behind moves neither; the trend counts from MIN_TREND_POINTS step
times on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sidecar.core.classification import Classification, Finding, Source, Standing
from sidecar.core.eta import Pace

DropBasis = Literal["per_hour", "first_hour"]
# Step times a trend needs before it says anything: a few noisy steps at the start are no slowdown.
MIN_TREND_POINTS = 30


@dataclass(frozen=True)
class ThroughputLimit:
    """The rule's settings: the largest drop in percent (None: no rule), and what it is against."""

    max_drop_pct: float | None = None
    basis: DropBasis = "per_hour"


def drop_per_hour_pct(pace: Pace) -> float | None:
    """How much lower the throughput is an hour on at the trend's low end (percent; 0 when the trend
    does not show a slowdown beyond doubt); None before there is a trend."""
    if pace.trend is None or pace.trend.points < MIN_TREND_POINTS or not pace.median_s:
        return None
    growth = pace.trend.low_per_hour / pace.median_s
    return 100.0 * (1.0 - 1.0 / (1.0 + growth)) if growth > 0 else 0.0


def drop_since_first_hour_pct(pace: Pace) -> float | None:
    """How much lower the recent throughput is than the first hour's (percent, negative when faster);
    None until the first hour is over."""
    if pace.first_hour_s is None or not pace.recent_s:
        return None
    return 100.0 * (1.0 - pace.first_hour_s / pace.recent_s)


def throughput_finding(pace: Pace, limit: ThroughputLimit) -> Finding | None:
    """The cause ``throughput_dropped`` when the drop passes the limit; else a note when the trend
    shows a slowdown beyond doubt; else None."""
    per_hour = drop_per_hour_pct(pace)
    slowing = _slowing(pace) if per_hour else None
    if limit.max_drop_pct is not None:
        drop = per_hour if limit.basis == "per_hour" else drop_since_first_hour_pct(pace)
        if drop is not None and drop > limit.max_drop_pct:
            return Finding(
                Classification.THROUGHPUT_DROPPED, _cause(pace, drop, limit, slowing), Source.SIDECAR
            )
    if slowing is None:
        return None
    return Finding(Classification.THROUGHPUT_DROPPED, slowing, Source.SIDECAR, standing=Standing.NOTE)


def _cause(pace: Pace, drop: float, limit: ThroughputLimit, slowing: str | None) -> str:
    if limit.basis == "first_hour":
        return (
            f"the throughput dropped {drop:.0f} % against the first hour (median step time "
            f"{pace.first_hour_s:.3g} s then, {pace.recent_s:.3g} s in the last 10 minutes), more than "
            f"monitor.max_throughput_drop_pct {limit.max_drop_pct:g} %"
        )
    return (
        f"the throughput drops {drop:.0f} % an hour at least ({slowing}), more than "
        f"monitor.max_throughput_drop_pct {limit.max_drop_pct:g} % an hour"
    )


def _slowing(pace: Pace) -> str | None:
    """The slowdown in words, from the trend as a share of the typical step time."""
    trend, median = pace.trend, pace.median_s
    if trend is None or not median:
        return None
    span = f"{trend.span_s / 60:.0f} min" if trend.span_s >= 120 else f"{trend.span_s:.0f} s"
    per_hour = (trend.per_hour, trend.low_per_hour, trend.high_per_hour)
    grows, low, high = (100 * each / median for each in per_hour)
    return (
        f"training slows down: the step time grows {grows:.0f} % an hour (95 % interval {low:.0f} to "
        f"{high:.0f} %, {trend.points} points over {span}, typical step {median:.3g} s)"
    )
