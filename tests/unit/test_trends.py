"""Leak trends on synthetic series: flat, a linear leak, a step, noise, and the window's bounds."""

from __future__ import annotations

import random

import pytest

from sidecar.core.trends import LeakTrend, TrendWindow, quantity_bytes, seconds_to_limit, theil_sen

HOUR = 3600.0


def series(f: object, n: int = 200, dt: float = 60.0) -> tuple[list[float], list[float]]:
    ts = [i * dt for i in range(n)]
    return ts, [f(t) for t in ts]  # type: ignore[operator]


def test_a_flat_series_has_no_slope() -> None:
    slope = theil_sen(*series(lambda t: 4096.0))
    assert slope is not None and slope.per_s == slope.low_per_s == slope.high_per_s == 0.0


def test_a_linear_leak_is_found_exactly() -> None:
    slope = theil_sen(*series(lambda t: 1000.0 + 2.5 * t))
    assert slope is not None and slope.per_s == pytest.approx(2.5)
    assert slope.low_per_s == pytest.approx(2.5) and slope.high_per_s == pytest.approx(2.5)


def test_a_step_is_not_a_leak() -> None:
    """One jump early in the window (a cache filled, a model loaded) makes a least-squares fit see a
    leak; Theil-Sen does not (fewer than 29 % of the pairs straddle it)."""
    ts, ys = series(lambda t: 1000.0 if t < 1200 else 1500.0)
    slope = theil_sen(ts, ys)
    assert slope is not None and slope.per_s == 0.0 and slope.low_per_s == 0.0
    mean_t, mean_y = sum(ts) / len(ts), sum(ys) / len(ys)
    least_squares = sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys, strict=True)) / sum(
        (t - mean_t) ** 2 for t in ts
    )
    assert least_squares > 0.01  # the naive fit reads the step as a leak


def test_noise_widens_the_interval_around_the_true_slope() -> None:
    rng = random.Random(7)
    ts, ys = series(lambda t: 1000.0 + 0.5 * t + rng.gauss(0, 200))
    slope = theil_sen(ts, ys)
    assert slope is not None
    assert slope.low_per_s < 0.5 < slope.high_per_s
    assert slope.high_per_s - slope.low_per_s < 0.2
    flat = theil_sen(*series(lambda t: 1000.0 + rng.gauss(0, 200)))
    assert flat is not None and flat.low_per_s < 0.0 < flat.high_per_s  # no leak claimed


def test_too_few_points_or_no_time_gives_no_slope() -> None:
    assert theil_sen([0.0, 1.0], [1.0, 2.0]) is None
    assert theil_sen([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]) is None


def test_the_window_stays_bounded_and_evenly_spaced() -> None:
    window = TrendWindow(capacity=16)
    for i in range(10_000):
        window.add(float(i), {"rss": 2.0 * i, "gpu": None})
    assert len(window.points) < 16
    gaps = {b[0] - a[0] for a, b in zip(window.points, window.points[1:], strict=False)}
    assert len(gaps) == 1
    slope = window.slope("rss")
    assert slope is not None and slope.per_s == pytest.approx(2.0)
    assert window.slope("gpu") is None  # never had a value


def test_leak_trend_is_per_hour() -> None:
    slope = theil_sen(*series(lambda t: 1.0 * t))
    assert slope is not None
    trend = LeakTrend.of("rss_bytes", "bytes", slope)
    assert (trend.per_hour, trend.points) == (HOUR, 200)


def test_time_to_a_limit() -> None:
    assert seconds_to_limit(1000.0, 2000.0, 10.0) == 100.0
    assert seconds_to_limit(1000.0, 2000.0, 0.0) is None and seconds_to_limit(1000.0, 2000.0, -1.0) is None
    assert seconds_to_limit(3000.0, 2000.0, 1.0) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8Gi", 8 * 2**30), ("512M", 512_000_000), ("1e9", 10**9), ("1536Mi", 1536 * 2**20), ("100", 100)],
)
def test_memory_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "8GB", "-1Gi", "lots", "1.5.2Gi"])
def test_not_a_memory_quantity(text: str) -> None:
    assert quantity_bytes(text) is None
