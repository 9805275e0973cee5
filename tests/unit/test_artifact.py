"""SampleRecorder (bounded memory, aggregates, growth), leak checks, run_summary figures, status."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sidecar.core.artifact import (
    ResourceSummary,
    SampleRecorder,
    leak_failures,
    project_memory,
    run_summary_figures,
    utc_timestamp,
)
from sidecar.core.samples import (
    GpuDevice,
    GpuSample,
    ProcessInfo,
    ProcessTreeSample,
    ProgressSample,
    Sample,
)
from sidecar.core.status import status_fields, status_json, status_line


def make_sample(
    i: float,
    *,
    rss_kib: int = 1000,
    fds: int = 10,
    eventfd: int = 0,
    gpu_mib: float | None = None,
    progress: int = 100,
    processes: int = 1,
) -> Sample:
    info = ProcessInfo(
        pid=100,
        ppid=1,
        start_time=0.0,
        start_ticks=1,
        rss_kib=rss_kib,
        fd_count=fds,
        fd_classes={"eventfd": eventfd, "other": fds - eventfd},
        threads=2,
        state="sleeping",
        command="trainer",
    )
    gpu = (
        GpuSample()
        if gpu_mib is None
        else GpuSample(
            available=True,
            attribution="unavailable",
            used_memory_mib_total=gpu_mib,
            devices=[GpuDevice(index=0, uuid="GPU-0", name="mock", memory_used_mib=gpu_mib)],
        )
    )
    return Sample(
        t_wall=1_700_000_000.0 + i,
        elapsed_s=float(i),
        process=ProcessTreeSample(
            process_count=processes,
            rss_kib_total=rss_kib,
            fd_count_total=fds,
            fd_classes_total={"eventfd": eventfd, "other": fds - eventfd},
            threads_total=2,
            processes=[info],
        ),
        gpu=gpu,
        progress=ProgressSample(file_count=1, bytes_total=progress, max_mtime=1.0),
    )


# ---------------------------------------------------------------------- bounded memory


def test_series_stays_bounded_and_evenly_strided() -> None:
    lines: list[int] = []
    recorder = SampleRecorder(lambda line: lines.append(len(line)), series_points=64)
    template = make_sample(0)
    for i in range(100_000):
        recorder.add(template.model_copy(update={"elapsed_s": float(i)}))
    series = recorder.series("samples.jsonl.gz", None)
    assert recorder.count == series.count == 100_000
    assert len(lines) == 100_000  # every sample streamed out
    points = series.downsampled
    assert len(points) <= 64
    assert len(points) >= 32  # halving keeps at least half the capacity
    stride = series.stride
    assert stride & (stride - 1) == 0  # a power of two
    assert [p.elapsed_s for p in points] == [float(k * stride) for k in range(len(points))]
    # the series spans the whole run, not just its start
    assert points[-1].elapsed_s > 100_000 - 2 * stride


def test_series_capacity_has_a_floor() -> None:
    recorder = SampleRecorder(None, series_points=1)
    for i in range(1000):
        recorder.add(make_sample(i))
    assert len(recorder.series(None, None).downsampled) <= 16


def test_series_below_capacity_keeps_everything() -> None:
    recorder = SampleRecorder(None, series_points=64)
    for i in range(10):
        recorder.add(make_sample(i))
    series = recorder.series(None, None)
    assert series.stride == 1
    assert [p.elapsed_s for p in series.downsampled] == [float(i) for i in range(10)]


# ---------------------------------------------------------------------- aggregates and growth


def test_maxima_cover_every_sample() -> None:
    recorder = SampleRecorder(None, series_points=16)
    recorder.add(make_sample(0, rss_kib=500, fds=5, eventfd=1, processes=1), steady=False)
    recorder.add(make_sample(1, rss_kib=9000, fds=40, eventfd=7, processes=3, progress=900))
    recorder.add(make_sample(2, rss_kib=2000, fds=20, eventfd=2, processes=2, progress=50))
    s = recorder.summary
    assert s.sample_count == 3
    assert s.max_process_rss_kib == 9000
    assert s.max_fd_count == 40
    assert s.max_eventfd_count == 7
    assert s.max_process_count == 3
    assert s.max_progress_bytes == 900
    assert s.max_shared_memory_fd_count == 0


def test_growth_is_measured_over_steady_samples_only() -> None:
    recorder = SampleRecorder(None, series_points=16)
    # start-up: only the launcher, then the trainer importing (not steady)
    recorder.add(make_sample(0, rss_kib=1000, fds=5), steady=False)
    assert recorder.summary.fd_growth is None
    recorder.add(make_sample(1, rss_kib=5000, fds=12, gpu_mib=0.0), steady=False)
    # training
    recorder.add(make_sample(2, rss_kib=30_000, fds=20, gpu_mib=1000.0))
    recorder.add(make_sample(3, rss_kib=31_024, fds=25, gpu_mib=1500.0))
    # teardown: the trainer is a zombie without fds or memory (not steady)
    recorder.add(make_sample(4, rss_kib=1000, fds=5, gpu_mib=0.0), steady=False)
    s = recorder.summary
    assert s.rss_growth_kib == 1024
    assert s.fd_growth == 5
    (device,) = s.gpu_devices
    assert device.first_used_mib == 1000.0
    assert device.last_used_mib == 1500.0
    assert device.growth_mib == 500.0
    assert device.max_used_mib == 1500.0
    assert s.max_gpu_used_memory_mib == 1500.0


def test_growth_default_every_sample_is_steady() -> None:
    recorder = SampleRecorder(None, series_points=16)
    recorder.add(make_sample(0, fds=10))
    recorder.add(make_sample(1, fds=4))
    assert recorder.summary.fd_growth == -6


def test_no_steady_sample_means_no_growth() -> None:
    recorder = SampleRecorder(None, series_points=16)
    recorder.add(make_sample(0, fds=10, gpu_mib=10.0), steady=False)
    recorder.add(make_sample(1, fds=400, gpu_mib=9000.0), steady=False)
    s = recorder.summary
    assert s.fd_growth is None and s.rss_growth_kib is None
    assert s.gpu_devices[0].growth_mib is None
    assert leak_failures(s, max_rss_growth_mib=0, max_fd_growth=0, max_gpu_growth_mib=0) == []


def test_gpu_fault_and_attribution_are_kept() -> None:
    recorder = SampleRecorder(None, series_points=16)
    first = make_sample(0, gpu_mib=10.0)
    recorder.add(first.model_copy(update={"gpu": first.gpu.model_copy(update={"fault": "GPU lost"})}))
    recorder.add(make_sample(1, gpu_mib=10.0))
    assert recorder.summary.gpu_fault == "GPU lost"
    assert recorder.summary.gpu_attribution == "unavailable"


# ---------------------------------------------------------------------- leak checks


def test_leak_failures_thresholds() -> None:
    summary = ResourceSummary(rss_growth_kib=300 * 1024, fd_growth=50)
    assert leak_failures(summary, max_rss_growth_mib=None, max_fd_growth=None, max_gpu_growth_mib=None) == []
    # equal to the limit is not a leak
    assert leak_failures(summary, max_rss_growth_mib=300, max_fd_growth=50, max_gpu_growth_mib=None) == []
    failures = leak_failures(summary, max_rss_growth_mib=100, max_fd_growth=49, max_gpu_growth_mib=None)
    assert failures == [
        "process tree RSS grew by 300.0 MiB > 100.0 MiB",
        "process tree fd count grew by 50 > 49",
    ]


def test_leak_failures_gpu() -> None:
    recorder = SampleRecorder(None, series_points=16)
    recorder.add(make_sample(0, gpu_mib=100.0))
    recorder.add(make_sample(1, gpu_mib=700.0))
    failures = leak_failures(
        recorder.summary, max_rss_growth_mib=None, max_fd_growth=None, max_gpu_growth_mib=512
    )
    assert failures == ["GPU 0 (GPU-0) memory grew by 600.0 MiB > 512.0 MiB"]


# ---------------------------------------------------------------------- run_summary figures


@pytest.mark.parametrize(
    "document",
    [
        None,
        [],
        "text",
        3,
        {},
        {"runtime_manifest": None},
        {"runtime_manifest": []},
        {"runtime_manifest": "x"},
    ],
)
def test_run_summary_figures_without_manifest(document: Any) -> None:
    assert run_summary_figures(document) == {}


def test_run_summary_figures_odd_sections_and_values() -> None:
    figures = run_summary_figures(
        {
            "runtime_manifest": {
                "inference_flight": ["not", "a", "dict"],
                "inference_memory_budget": {"ipc_event_count": {"nested": 1}},
                "replay_ingress": {
                    "ingress_depth": 8,
                    "occupancy": True,
                    "backpressure_wait_s": float("nan"),
                    "high_water_occupancy": float("inf"),
                    "dropped_batches": "3",
                    "early_returns": [1],
                },
            }
        }
    )
    assert figures["max_in_flight"] is None
    assert "ipc_event_count" not in figures  # not a scalar: dropped
    assert "replay_ingress_early_returns" not in figures
    assert figures["replay_ingress_depth"] == 8
    assert figures["replay_ingress_final_occupancy"] is True
    assert figures["replay_ingress_dropped_batches"] == "3"
    assert figures["replay_ingress_backpressure_wait_s"] == "nan"
    assert figures["replay_ingress_high_water_occupancy"] == "inf"
    json.dumps(figures, allow_nan=False)  # strict JSON


def test_run_summary_figures_complete() -> None:
    figures = run_summary_figures(
        {
            "runtime_manifest": {
                "inference_flight": {"max_in_flight": 4, "max_publication_lag": 1},
                "inference_memory_budget": {"ipc_event_count": 12},
                "replay_ingress": {"ingress_slot_rows": 64, "backpressure_waits": 0},
            }
        }
    )
    assert figures["max_in_flight"] == 4
    assert figures["max_publication_lag"] == 1
    assert figures["ipc_event_count"] == 12
    assert figures["replay_ingress_slot_rows"] == 64
    assert figures["replay_ingress_backpressure_waits"] == 0
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in figures.values())


# ---------------------------------------------------------------------- status line


def test_status_line_formatting() -> None:
    sample = make_sample(3725.4, rss_kib=2048 * 1024, fds=42, gpu_mib=1234.6)
    line = status_line(sample, budget_left_s=59.9, progress_age_s=None)
    assert line == (
        "elapsed 1:02:05  budget left 0:59  no progress yet  rss 2048 MiB  procs 1  fds 42  gpu 1235 MiB"
    )
    assert "\n" not in line


def test_status_line_fits_the_terminal_dropping_the_least_important_fields() -> None:
    sample = make_sample(3725.4, rss_kib=2048 * 1024, fds=42, gpu_mib=1234.6)
    line = status_line(sample, budget_left_s=59.9, progress_age_s=12.0, width=60)
    assert line == "elapsed 1:02:05  budget left 0:59  last progress 0:12 ago"
    assert len(status_line(sample, budget_left_s=59.9, progress_age_s=12.0, width=10)) == 9


def test_status_line_without_gpu_or_budget() -> None:
    sample = make_sample(5, gpu_mib=None)
    line = status_line(sample, budget_left_s=None, progress_age_s=-3.0)
    assert "elapsed 0:05" in line
    assert "budget left -" in line
    assert "gpu -" in line
    assert "last progress 0:00 ago" in line  # a negative age (clock step) shows as zero


def test_status_json_fields() -> None:
    sample = make_sample(1.23456, rss_kib=1536, fds=7, gpu_mib=None)
    fields = json.loads(status_json(sample, budget_left_s=100.04, progress_age_s=0.26))
    assert fields == status_fields(sample, budget_left_s=100.04, progress_age_s=0.26)
    assert fields["event"] == "sample"
    assert fields["elapsed_s"] == 1.235
    assert fields["budget_left_s"] == 100.0
    assert fields["rss_mib"] == 1.5
    assert fields["fds"] == 7
    assert fields["gpu_used_mib"] is None
    assert fields["progress_age_s"] == 0.3


def test_utc_timestamps_are_whole_seconds_with_a_z() -> None:
    assert utc_timestamp(0.0) == "1970-01-01T00:00:00Z"
    assert utc_timestamp(1_700_000_000.9) == "2023-11-14T22:13:20Z"


# ---------------------------------------------------------------------- leak trends


def test_trends_of_rss_fds_and_gpu_memory_over_the_steady_samples() -> None:
    recorder = SampleRecorder(None, series_points=16)
    recorder.add(make_sample(0, rss_kib=50, fds=3), steady=False)  # start-up: not in the trend
    for i in range(1, 400):
        recorder.add(make_sample(i * 5, rss_kib=1000 + i, fds=10, gpu_mib=2000.0 + i / 10))
    trends = {t.series: t for t in recorder.resource_summary().trends}
    assert set(trends) == {"process tree RSS", "process tree fds", "GPU GPU-0 memory"}
    # 1 KiB per 5 s sample, 0.1 MiB per sample: per hour.
    assert trends["process tree RSS"].per_hour == pytest.approx(1024 * 3600 / 5)
    assert trends["process tree RSS"].unit == "bytes" and trends["process tree fds"].per_hour == 0
    assert trends["GPU GPU-0 memory"].per_hour == pytest.approx(0.1 * 3600 / 5)
    assert trends["process tree RSS"].points <= 256  # bounded, whatever the run's length


def test_no_steady_samples_no_trends() -> None:
    recorder = SampleRecorder(None, series_points=16)
    for i in range(10):
        recorder.add(make_sample(i), steady=False)
    assert recorder.resource_summary().trends == []


def leaking(mib_per_sample: int, samples: int = 100) -> SampleRecorder:
    """RSS growing ``mib_per_sample`` every 10 s sample from 100 MiB."""
    recorder = SampleRecorder(None, series_points=16)
    for i in range(samples):
        recorder.add(make_sample(i * 10, rss_kib=(100 + i * mib_per_sample) * 1024))
    return recorder


def test_projection_to_the_memory_limit_and_the_opt_in_failure() -> None:
    recorder = leaking(1)  # 0.1 MiB/s, last sample at 199 MiB
    reason = project_memory(recorder.summary, recorder.trends, 1000 * 2**20, budget_left_s=3600.0)
    assert recorder.summary.memory_limit_bytes == 1000 * 2**20
    assert recorder.summary.projected_memory_limit_s == pytest.approx(8010.0)  # 801 MiB at 0.1 MiB/s
    assert reason is None  # reached after the deadline
    reason = project_memory(recorder.summary, recorder.trends, 1000 * 2**20, budget_left_s=9000.0)
    assert reason is not None and "would be reached in 8010 s, before the deadline (9000 s left)" in reason


def test_no_projection_without_a_limit_or_without_growth() -> None:
    recorder = leaking(0)
    assert project_memory(recorder.summary, recorder.trends, 2**30, budget_left_s=1e9) is None
    assert recorder.summary.projected_memory_limit_s is None
    recorder = leaking(1)
    assert project_memory(recorder.summary, recorder.trends, None, budget_left_s=1e9) is None
    assert recorder.summary.memory_limit_bytes is None
