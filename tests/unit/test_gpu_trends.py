"""Per-GPU degradation trends (pure): correctable error counts and cooling, as Theil-Sen slopes over
every sample; a device whose correctable errors grow over the whole interval is flagged."""

from __future__ import annotations

from sidecar.core.gpu_trends import GpuTrends, correctable_growth, degradation_trends, degradation_values
from sidecar.core.samples import GpuDevice, GpuSample
from sidecar.core.trends import TrendWindow

UUID = "GPU-6f1e2d3c-0000-4000-8000-000000000000"


def sample(t: float, *, replays: int | None, rows: int | None = 0, power: float | None = 400.0) -> GpuSample:
    device = GpuDevice(
        index=0, uuid=UUID, name="H100", temperature_c=60 + t / 100, power_w=power,
        pcie_replay_count=replays, remapped_rows_correctable=rows,
    )  # fmt: skip
    return GpuSample(available=True, devices=[device])


def window(samples: list[tuple[float, GpuSample]]) -> TrendWindow:
    trends = TrendWindow()
    for t, gpu in samples:
        trends.add(t, degradation_values(gpu))
    return trends


def test_growing_replays_are_flagged_and_flat_rows_are_not() -> None:
    trends = degradation_trends(window([(t, sample(t, replays=int(t) * 2)) for t in range(0, 600, 60)]))
    by_series = {t.series.removeprefix(f"GPU 0 ({UUID}) "): t for t in trends}
    assert by_series["PCIe replays"].per_hour == 7200 and by_series["correctable remapped rows"].per_hour == 0
    assert by_series["temperature per 100 W"].per_hour > 0  # 1 degC per 100 s at the same 400 W
    (flagged,) = correctable_growth(trends)  # cooling is reported, never flagged as an error count
    assert flagged.startswith(f"GPU 0 ({UUID}) PCIe replays grow 7200.0 replays/h")


def test_one_jump_between_flat_stretches_is_not_steady_growth() -> None:
    replays = [0, 0, 0, 0, 0, 500, 500, 500, 500, 500]
    trends = degradation_trends(
        window([(t * 60.0, sample(t * 60.0, replays=r)) for t, r in enumerate(replays)])
    )
    assert correctable_growth(trends) == []


def test_counters_a_driver_does_not_give_and_idle_power_make_no_series() -> None:
    values = degradation_values(sample(0, replays=None, rows=None, power=5.0))
    assert values == {
        f"ecc_corrected|GPU 0 ({UUID})": None,
        f"remapped_correctable|GPU 0 ({UUID})": None,
        f"pcie_replays|GPU 0 ({UUID})": None,
    }
    assert degradation_trends(window([(t, sample(t, replays=None, rows=None)) for t in range(2)])) == []


def test_time_in_hardware_slowdown_is_counted_between_samples_and_trended_per_hour() -> None:
    trends = GpuTrends()
    for n in range(20):  # every other minute in hardware slowdown
        reasons = ["hw_slowdown"] if n % 2 else ["gpu_idle"]
        device = GpuDevice(index=0, uuid=UUID, name="H100", clock_event_reasons=reasons)
        trends.add(n * 60.0, GpuSample(available=True, devices=[device]))
    (slowdown,) = [t for t in trends.trends() if t.series.endswith("time in hardware slowdown")]
    assert slowdown.unit == "s" and 1500 < slowdown.per_hour < 2100  # half of each hour
    assert correctable_growth(trends.trends()) == []  # time, not an error count: reported, never flagged
