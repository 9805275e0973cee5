"""Per-GPU degradation trends (pure): beyond fixed thresholds, how a device's health counters move
during the soak, as Theil-Sen slopes with their 95 % interval (``sidecar.core.trends``).

Over every sample that read them (not only the steady ones: a device degrades whatever the trainer
does): single-bit ECC errors, correctable remapped rows and PCIe replays (correctable errors: the
hardware fixed them, but their growth is wear), the time spent in hardware slowdown so far (its slope
is the seconds of slowdown per hour) and the temperature per 100 W drawn (cooling that worsens at the
same power).
A device whose correctable errors grow (the whole interval above zero) is flagged: reported, and a
GPU fault (retryable on another node) only with ``gpu.fail_on_correctable_growth``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.core.gpu_health import HARDWARE_SLOWDOWN
from sidecar.core.samples import GpuDevice, GpuSample
from sidecar.core.trends import LeakTrend, TrendWindow

# key prefix -> (what the trend is called after "GPU <index> (<uuid>) ", unit, a correctable error count)
SERIES: dict[str, tuple[str, str, bool]] = {
    "ecc_corrected": ("single-bit ECC errors", "errors", True),
    "remapped_correctable": ("correctable remapped rows", "rows", True),
    "pcie_replays": ("PCIe replays", "replays", True),
    "temperature_per_100w": ("temperature per 100 W", "degC", False),
    "hw_slowdown": ("time in hardware slowdown", "s", False),
}
MIN_POWER_W = 10.0  # below it the temperature per watt says nothing of cooling


def degradation_values(gpu: GpuSample) -> dict[str, float | None]:
    values: dict[str, float | None] = {}
    for device in gpu.devices:
        label = _label(device)
        values[f"ecc_corrected|{label}"] = _number(device.ecc_corrected)
        values[f"remapped_correctable|{label}"] = _number(device.remapped_rows_correctable)
        values[f"pcie_replays|{label}"] = _number(device.pcie_replay_count)
        if device.temperature_c is not None and device.power_w is not None and device.power_w >= MIN_POWER_W:
            values[f"temperature_per_100w|{label}"] = device.temperature_c / device.power_w * 100.0
    return values


class GpuTrends:
    """The window of degradation values, and each device's time in hardware slowdown so far (each
    interval between two samples counted as the later sample saw it)."""

    def __init__(self) -> None:
        self.window = TrendWindow()
        self._slowdown_s: dict[str, float] = {}
        self._last_t: float | None = None

    def add(self, t: float, gpu: GpuSample) -> None:
        elapsed = 0.0 if self._last_t is None else max(0.0, t - self._last_t)
        self._last_t = t
        values = degradation_values(gpu)
        for device in gpu.devices:
            if device.clock_event_reasons is None:
                continue
            key = f"hw_slowdown|{_label(device)}"
            slowed = any(reason in HARDWARE_SLOWDOWN for reason in device.clock_event_reasons)
            self._slowdown_s[key] = self._slowdown_s.get(key, 0.0) + (elapsed if slowed else 0.0)
            values[key] = self._slowdown_s[key]
        self.window.add(t, values)

    def trends(self) -> list[LeakTrend]:
        return degradation_trends(self.window)


def degradation_trends(window: TrendWindow) -> list[LeakTrend]:
    keys = dict.fromkeys(key for _, values in window.points for key in values)
    trends = []
    for key in keys:
        slope = window.slope(key)
        if slope is not None:
            kind, _, label = key.partition("|")
            name, unit, _ = SERIES[kind]
            trends.append(LeakTrend.of(f"{label} {name}", unit, slope))
    return trends


def correctable_growth(trends: Iterable[LeakTrend]) -> list[str]:
    """The devices whose correctable errors grow steadily (the whole 95 % interval above zero)."""
    counters = {name: unit for name, unit, correctable in SERIES.values() if correctable}
    return [
        f"{t.series} grow {t.per_hour:.1f} {t.unit}/h (95 % interval {t.low_per_hour:.1f} to "
        f"{t.high_per_hour:.1f})"
        for t in trends
        if t.low_per_hour > 0 and any(t.series.endswith(f" {name}") for name in counters)
    ]


def _label(device: GpuDevice) -> str:
    return f"GPU {device.index} ({device.uuid})"


def _number(value: int | None) -> float | None:
    return None if value is None else float(value)
