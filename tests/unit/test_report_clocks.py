"""The GPUs' clock-event reasons under the report's throughput: each slowdown reason's spans built from
the samples (held since the previous sample), drawn only for a run with progress steps and reasons
read, the idle and application-clock reasons left out."""

from __future__ import annotations

import json
import re

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.gpu_health import CLOCK_EVENT_REASONS, HARDWARE_SLOWDOWN
from sidecar.core.report import render_report
from sidecar.core.report_clocks import SLOWDOWN, TITLE, ClockReasons, Span, clock_reasons_plot
from sidecar.core.report_input import parse_artifact
from sidecar.core.report_samples import ReportSample, parse_sample

T0 = 1_700_000_000.0
GPU0, GPU1 = "GPU 0 GPU-aaaa", "GPU 1 GPU-bbbb"


def test_the_drawn_reasons_are_nvmls_slowdown_ones() -> None:
    assert set(SLOWDOWN) <= set(CLOCK_EVENT_REASONS) and set(HARDWARE_SLOWDOWN) <= set(SLOWDOWN)
    assert {"gpu_idle", "applications_clocks"}.isdisjoint(SLOWDOWN)


def test_a_reason_holds_from_the_sample_before_the_first_that_saw_it_to_the_last() -> None:
    clocks = ClockReasons()
    seen: dict[int, list[tuple[str, list[str]]]] = {
        3: [(GPU0, ["gpu_idle", "sw_thermal"]), (GPU1, [])],
        4: [(GPU0, ["sw_thermal"]), (GPU1, [])],
        5: [(GPU0, ["sw_thermal"]), (GPU1, ["sw_thermal"])],
        6: [(GPU0, []), (GPU1, ["sw_thermal", "applications_clocks"])],
        9: [(GPU0, ["hw_power_brake"]), (GPU1, [])],
    }
    for n in range(12):
        clocks.add(T0 + 10 * n, seen.get(n, [(GPU0, ["gpu_idle"]), (GPU1, [])]))
    assert clocks.read
    assert clocks.spans == {
        "sw_thermal": [Span(T0 + 20, T0 + 60, {GPU0, GPU1})],
        "hw_power_brake": [Span(T0 + 80, T0 + 90, {GPU0})],
    }
    # Two stretches with a sample between them are two spans; the first sample's is a point.
    flapping = ClockReasons()
    for n, reasons in enumerate([["sw_power_cap"], [], ["sw_power_cap"], ["sw_power_cap"]]):
        flapping.add(T0 + n, [(GPU0, reasons)])
    assert flapping.spans["sw_power_cap"] == [Span(T0, T0, {GPU0}), Span(T0 + 1, T0 + 3, {GPU0})]


def test_no_gpu_that_read_its_reasons_is_no_evidence() -> None:
    clocks = ClockReasons()
    clocks.add(T0, [])
    assert not clocks.read
    clocks.add(T0 + 1, [(GPU0, [])])
    assert clocks.read and clocks.spans == {}
    assert "no GPU reported a slowdown" in clock_reasons_plot(clocks, T0, T0 + 1)


def test_a_band_spans_its_stretch_on_the_shared_time_axis_and_flapping_is_one_band() -> None:
    clocks = ClockReasons()
    for n in range(101):
        clocks.add(T0 + n, [(GPU0, ["sw_thermal"] if 25 <= n <= 50 else [])])
    svg = clock_reasons_plot(clocks, T0, T0 + 100)
    ((x, width),) = re.findall(r'data-reason="sw_thermal" x="([\d.]+)" y="\d+" width="([\d.]+)"', svg)
    assert (float(x), float(width)) == pytest.approx((70 + 24 * 8.1, 26 * 8.1), abs=0.1)  # 8.1 px/s
    assert "sw_thermal (thermal)" in svg and "GPU or its memory too hot" in svg
    # A reason on every other sample of a 72-hour soak at 5 s is a few bands, not 25,920 rects.
    flapping = ClockReasons()
    for n in range(51_840):
        flapping.add(T0 + 5 * n, [(GPU0, ["sw_power_cap"] if n % 2 else [])])
    assert clock_reasons_plot(flapping, T0, T0 + 5 * 51_839).count('class="band"') == 1


def samples(reasons: list[str] | None, *, steps: bool = True) -> list[ReportSample]:
    """A minute of samples, a GPU with ``reasons`` from 0:00:20 to 0:00:40 (None: never read)."""
    found = []
    for n in range(61):
        device: dict[str, object] = {"index": 0, "uuid": "GPU-0123456789abcdef"}
        if reasons is not None:
            device["clock_event_reasons"] = ["gpu_idle", *(reasons if 20 < n <= 40 else [])]
        line = {
            "t_wall": T0 + n,
            "gpu": {"devices": [device]},
            "progress": {"step": 10 * n if steps else None},
        }
        found.append(parse_sample(json.dumps(line).encode()))
    return found


@pytest.mark.parametrize(
    ("reasons", "steps", "drawn"),
    [
        (["sw_thermal"], True, True),
        ([], True, True),  # read, none active: drawn, saying so
        (["sw_thermal"], False, False),  # no progress records: no throughput to read it against
        (None, True, False),  # no GPU read its reasons (no GPUs, or an older sidecar)
    ],
)
def test_the_plot_is_under_the_throughput_only_with_steps_and_reasons_read(
    reasons: list[str] | None, steps: bool, drawn: bool
) -> None:
    artifact = parse_artifact(
        json.dumps({"status": "passed", "samples": {"samples_file": "s"}}).encode(), "a"
    )
    page = render_report(artifact, samples(reasons, steps=steps))
    assert (TITLE in page) is drawn
    if drawn:
        assert page.index("Throughput") < page.index(TITLE) and 'data-reason="gpu_idle"' not in page
    band = "<title>sw_thermal on GPU 0 GPU-01234567: 0:00:20 to 0:00:40</title>"
    assert (band in page) is (drawn and bool(reasons))


def test_a_samples_reasons_are_read_by_device_and_checked() -> None:
    def line(reasons: object) -> bytes:
        device = {"index": 2, "uuid": "GPU-x", "clock_event_reasons": reasons}
        return json.dumps({"t_wall": T0, "gpu": {"devices": [device]}}).encode()

    assert parse_sample(line(["hw_slowdown"])).clock_reasons == (("GPU 2 GPU-x", ("hw_slowdown",)),)
    assert parse_sample(line(None)).clock_reasons == ()
    with pytest.raises(ConfigError, match=r"clock_event_reasons\[\] must be text"):
        parse_sample(line([7]))
    with pytest.raises(ConfigError, match=r"clock_event_reasons must be a list"):
        parse_sample(line("hw_slowdown"))
