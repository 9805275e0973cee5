"""The soak artifact: a versioned, self-contained JSON document (schema in docs/artifact.md).

Multi-day soaks must not grow memory: every sample is streamed to a compressed JSONL file beside
the artifact, and only running aggregates plus a downsampled series stay in memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sidecar.core.gpu_health import GpuHealthSummary, GpuHealthTracker
from sidecar.core.samples import GpuSample, ProcessTreeSample, ProgressSample, ResidualProcess, Sample
from sidecar.core.trends import LeakTrend, Thinned, TrendWindow, seconds_to_limit

ARTIFACT_SCHEMA_VERSION = "2.1.0"


def utc_timestamp(epoch: float) -> str:
    """An epoch time as the artifact's ``*_at_utc`` fields hold it (UTC, whole seconds)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SeriesPoint(_Model):
    """A sample without its per-process detail: what the in-memory series keeps."""

    elapsed_s: float
    process_count: int
    zombie_count: int
    rss_kib_total: int
    fd_count_total: int
    fd_classes_total: dict[str, int]
    threads_total: int
    gpu_used_memory_mib: float | None
    progress_bytes: int

    @classmethod
    def of(cls, sample: Sample) -> SeriesPoint:
        proc = sample.process
        return cls(
            elapsed_s=sample.elapsed_s,
            process_count=proc.process_count,
            zombie_count=proc.zombie_count,
            rss_kib_total=proc.rss_kib_total,
            fd_count_total=proc.fd_count_total,
            fd_classes_total=proc.fd_classes_total,
            threads_total=proc.threads_total,
            gpu_used_memory_mib=sample.gpu.used_memory_mib_total,
            progress_bytes=sample.progress.bytes_total,
        )


class DeviceSummary(_Model):
    """One GPU over the run; first/last used memory come from steady samples (see growth)."""

    uuid: str
    index: int
    name: str
    first_used_mib: float | None = None
    last_used_mib: float | None = None
    max_used_mib: float | None = None

    @property
    def growth_mib(self) -> float | None:
        if self.first_used_mib is None or self.last_used_mib is None:
            return None
        return self.last_used_mib - self.first_used_mib


class ResourceSummary(_Model):
    """Maxima and growth over the whole run (the seed's resource summary plus growth and GPUs)."""

    sample_count: int = 0
    max_process_count: int | None = None
    max_zombie_count: int | None = None
    max_process_rss_kib: int | None = None
    max_fd_count: int | None = None
    max_eventfd_count: int | None = None
    max_shared_memory_fd_count: int | None = None
    max_gpu_used_memory_mib: float | None = None
    max_progress_bytes: int | None = None
    rss_growth_kib: int | None = Field(
        default=None,
        description="RSS of the last steady sample minus the first's (steady: the trainer runs "
        "and has made progress, so start-up and teardown are not growth).",
    )
    fd_growth: int | None = Field(
        default=None, description="fd count of the last steady sample minus the first's."
    )
    gpu_devices: list[DeviceSummary] = Field(default_factory=list)
    gpu_attribution: str | None = None
    gpu_unavailable_reason: str | None = Field(
        default=None, description="Why there is no GPU data (no NVML, no GPUs for the trainer, off)."
    )
    gpu_fault: str | None = None
    memory_limit_bytes: int | None = Field(default=None, description="The trainer's memory limit, if known.")
    projected_memory_limit_s: float | None = Field(
        default=None,
        description="Seconds from the last steady sample until the RSS trend reaches the memory limit.",
    )
    trends: list[LeakTrend] = Field(
        default_factory=list,
        description="Theil-Sen slopes (per hour, 95 % interval) of RSS, fds and GPU memory over the "
        "steady samples.",
    )
    gpu_health: GpuHealthSummary | None = Field(
        default=None, description="XID/ECC events, row remapping, clock-event reasons, link errors."
    )
    nvml_time_ms_max: float | None = None
    residual_process_count: int = 0
    run_summary_figures: dict[str, Any] = Field(
        default_factory=dict,
        description="The seed's figures taken from run_summary (in-flight, replay ingress).",
    )


class SeriesInfo(_Model):
    count: int
    samples_file: str | None = Field(description="Compressed JSONL with every sample, beside the artifact.")
    samples_sha256: str | None = None
    downsampled: list[SeriesPoint]
    stride: int = Field(description="Every stride-th sample is kept in `downsampled`.")


class MonitorConfig(_Model):
    sample_interval_s: float
    startup_timeout_s: float
    stale_progress_s: float
    post_shutdown_grace_s: float
    min_duration_s: float
    sample_count: int


class DeadlineInfo(_Model):
    run_id: str
    store: str
    identity_sha256: str
    started_unix: float
    deadline_unix: float
    budget_s: float
    checkpoint_margin_s: float
    remaining_at_start_s: float
    resumed: bool
    expired: bool = False
    soft_stop_sent: bool = False
    term_sent: bool = False
    kill_sent: bool = False


class UploadInfo(_Model):
    uris: dict[str, str] = Field(default_factory=dict, description="File name -> URI.")
    sha256: dict[str, str] = Field(default_factory=dict, description="File name -> sha256 hex.")
    error: str | None = None


class PostShutdown(_Model):
    residual_processes: list[ResidualProcess] = Field(
        default_factory=list, description="Every process that outlived the trainer, however it ended."
    )
    launcher_exit: dict[str, Any] | None = Field(default=None, description="The launcher's exit.json.")


class Artifact(_Model):
    schema_version: str = ARTIFACT_SCHEMA_VERSION
    status: Literal["passed", "failed"]
    failure_reason: str | None
    failure_classification: str | None
    exit_code: int
    command: list[str]
    context: dict[str, Any]
    started_at_utc: str
    ended_at_utc: str
    duration_s: float
    returncode: int | None
    monitor: MonitorConfig
    deadline: DeadlineInfo | None
    samples: SeriesInfo
    resource_summary: ResourceSummary
    shutdown: dict[str, Any] | None
    post_shutdown: PostShutdown
    run_summary: Any
    console_log: str | None
    provenance: dict[str, Any]
    upload: UploadInfo | None = None
    protocol_violations: list[str] = Field(
        default_factory=list,
        description="Run-dir records the trainer's side wrote that disagreed with what the sidecar "
        "observed (e.g. a trainer.json naming another process than the launcher's child): named here, "
        "never followed.",
    )


def _max(current: float | None, value: float | None) -> Any:
    if value is None:
        return current
    return value if current is None or value > current else current


class SampleRecorder:
    """Streams samples to ``write_line`` and keeps O(series_points) memory.

    The downsampled series doubles its stride whenever it fills up, so it stays evenly spaced
    over the whole run however long the run is.

    Maxima cover every sample. Growth (RSS, fds, per-GPU memory) is measured between the first
    and the last *steady* sample (``add(..., steady=True)``): the supervisor marks a sample
    steady when the trainer is running and has made progress, so neither the trainer's start-up
    (imports, model load) nor its teardown (a zombie holds no fds) reads as growth or hides it.
    """

    def __init__(
        self,
        write_line: Callable[[str], None] | None,
        series_points: int,
        health: GpuHealthTracker | None = None,
    ) -> None:
        self._write_line = write_line
        self.health = health or GpuHealthTracker()
        self._series: Thinned[SeriesPoint] = Thinned(max(16, series_points))
        self.trends = TrendWindow()
        self._count = 0
        self.summary = ResourceSummary()
        self._first_steady: Sample | None = None
        self.last: Sample | None = None
        self._devices: dict[str, DeviceSummary] = {}

    @property
    def count(self) -> int:
        return self._count

    def add(self, sample: Sample, *, steady: bool = True) -> None:
        if self._write_line is not None:
            # Absent means None: a sample of 8 GPUs is then half the size, and so is parsing it.
            self._write_line(sample.model_dump_json(exclude_none=True))
        self._series.add(SeriesPoint.of(sample))
        self._count += 1
        self.last = sample
        if steady and self._first_steady is None:
            self._first_steady = sample
        self._aggregate(sample, steady=steady)

    def _aggregate(self, sample: Sample, *, steady: bool) -> None:
        s = self.summary
        proc: ProcessTreeSample = sample.process
        s.sample_count = self._count
        s.max_process_count = _max(s.max_process_count, proc.process_count)
        s.max_zombie_count = _max(s.max_zombie_count, proc.zombie_count)
        s.max_process_rss_kib = _max(s.max_process_rss_kib, proc.rss_kib_total)
        s.max_fd_count = _max(s.max_fd_count, proc.fd_count_total)
        s.max_eventfd_count = _max(s.max_eventfd_count, proc.fd_classes_total.get("eventfd", 0))
        s.max_shared_memory_fd_count = _max(
            s.max_shared_memory_fd_count, proc.fd_classes_total.get("shared_memory", 0)
        )
        s.max_progress_bytes = _max(s.max_progress_bytes, sample.progress.bytes_total)
        if steady and self._first_steady is not None:
            first = self._first_steady.process
            s.rss_growth_kib = proc.rss_kib_total - first.rss_kib_total
            s.fd_growth = proc.fd_count_total - first.fd_count_total
            self.trends.add(sample.elapsed_s, trend_values(sample))
        self._aggregate_gpu(sample.gpu, sample.elapsed_s, steady=steady)

    def resource_summary(self) -> ResourceSummary:
        """The summary for the artifact: with the leak trends, and the GPU health figures once GPUs
        were sampled."""
        update: dict[str, Any] = {"trends": leak_trends(self.trends)}
        if self.health.observed:
            update["gpu_health"] = self.health.summary()
        return self.summary.model_copy(update=update)

    def _aggregate_gpu(self, gpu: GpuSample, t: float, *, steady: bool) -> None:
        s = self.summary
        if not gpu.available:
            s.gpu_unavailable_reason = s.gpu_unavailable_reason or gpu.reason
            return
        health_fault = self.health.observe(gpu, t)
        if health_fault and s.gpu_fault is None:
            s.gpu_fault = health_fault
        s.max_gpu_used_memory_mib = _max(s.max_gpu_used_memory_mib, gpu.used_memory_mib_total)
        s.nvml_time_ms_max = _max(s.nvml_time_ms_max, gpu.nvml_time_ms)
        # A sample taken after the trainer exited (the launcher still cleaning up) finds no
        # trainer PID to attribute to: the run's attribution is that of the samples while it ran.
        if gpu.attribution != "not_sampled" and (steady or s.gpu_attribution is None):
            s.gpu_attribution = gpu.attribution
        if gpu.fault and s.gpu_fault is None:
            s.gpu_fault = gpu.fault
        for device in gpu.devices:
            summary = self._devices.get(device.uuid)
            if summary is None:
                summary = DeviceSummary(uuid=device.uuid, index=device.index, name=device.name)
                self._devices[device.uuid] = summary
                s.gpu_devices.append(summary)
            if device.memory_used_mib is not None:
                summary.max_used_mib = _max(summary.max_used_mib, device.memory_used_mib)
                if steady:
                    summary.last_used_mib = device.memory_used_mib
                    if summary.first_used_mib is None:
                        summary.first_used_mib = device.memory_used_mib

    def series(self, samples_file: str | None, samples_sha256: str | None) -> SeriesInfo:
        return SeriesInfo(
            count=self._count,
            samples_file=samples_file,
            samples_sha256=samples_sha256,
            downsampled=list(self._series.items),
            stride=self._series.stride,
        )


# The series whose trend the artifact reports: (key prefix, name in the artifact, unit).
TREND_SERIES = (("rss_bytes", "process tree RSS", "bytes"), ("fds", "process tree fds", "fds"))


def trend_values(sample: Sample) -> dict[str, float | None]:
    values: dict[str, float | None] = {
        "rss_bytes": sample.process.rss_kib_total * 1024.0,
        "fds": float(sample.process.fd_count_total),
    }
    for device in sample.gpu.devices:
        values[f"gpu_mib:{device.uuid}"] = device.memory_used_mib
    return values


def leak_trends(window: TrendWindow) -> list[LeakTrend]:
    """Theil-Sen trends of the steady window: RSS, fds, and each GPU's memory."""
    keys = dict.fromkeys(key for _, values in window.points for key in values)
    trends = []
    for key in keys:
        slope = window.slope(key)
        if slope is None:
            continue
        if key.startswith("gpu_mib:"):
            trends.append(LeakTrend.of(f"GPU {key.removeprefix('gpu_mib:')} memory", "MiB", slope))
        else:
            name, unit = next((n, u) for k, n, u in TREND_SERIES if k == key)
            trends.append(LeakTrend.of(name, unit, slope))
    return trends


def project_memory(
    summary: ResourceSummary, window: TrendWindow, limit_bytes: int | None, budget_left_s: float
) -> str | None:
    """Record when the RSS trend reaches the trainer's memory limit (from the last steady sample);
    the failure reason when even the low end of its 95 % interval gets there before the deadline."""
    summary.memory_limit_bytes = limit_bytes
    slope = window.slope("rss_bytes")
    if limit_bytes is None or slope is None:
        return None
    current = window.points[-1][1]["rss_bytes"]
    projected = seconds_to_limit(current, limit_bytes, slope.per_s)
    summary.projected_memory_limit_s = None if projected is None else round(projected, 3)
    surely = seconds_to_limit(current, limit_bytes, slope.low_per_s)
    if surely is None or surely >= budget_left_s:
        return None
    return (
        f"process tree RSS grows {slope.low_per_s * 3600 / 2**20:.1f} MiB/h or more: the memory limit "
        f"({limit_bytes / 2**20:.0f} MiB) would be reached in {surely:.0f} s, before the deadline "
        f"({budget_left_s:.0f} s left)"
    )


def leak_failures(
    summary: ResourceSummary,
    *,
    max_rss_growth_mib: float | None,
    max_fd_growth: int | None,
    max_gpu_growth_mib: float | None,
) -> list[str]:
    """Growth beyond the configured limits, as reasons; limits left unset are not checked."""
    failures: list[str] = []
    if max_rss_growth_mib is not None and summary.rss_growth_kib is not None:
        growth_mib = summary.rss_growth_kib / 1024
        if growth_mib > max_rss_growth_mib:
            failures.append(f"process tree RSS grew by {growth_mib:.1f} MiB > {max_rss_growth_mib:.1f} MiB")
    if max_fd_growth is not None and summary.fd_growth is not None and summary.fd_growth > max_fd_growth:
        failures.append(f"process tree fd count grew by {summary.fd_growth} > {max_fd_growth}")
    if max_gpu_growth_mib is not None:
        for device in summary.gpu_devices:
            growth = device.growth_mib
            if growth is not None and growth > max_gpu_growth_mib:
                failures.append(
                    f"GPU {device.index} ({device.uuid}) memory grew by {growth:.1f} MiB > "
                    f"{max_gpu_growth_mib:.1f} MiB"
                )
    return failures


def run_summary_figures(run_summary: Any) -> dict[str, Any]:
    """The seed's resource-summary figures that come from the trainer's own run_summary."""
    manifest = run_summary.get("runtime_manifest") if isinstance(run_summary, dict) else None
    if not isinstance(manifest, dict):
        return {}

    def section(name: str) -> dict[str, Any]:
        value = manifest.get(name)
        return value if isinstance(value, dict) else {}

    flight, budget, replay = (
        section("inference_flight"),
        section("inference_memory_budget"),
        section("replay_ingress"),
    )
    figures: dict[str, Any] = {
        "ipc_event_count": budget.get("ipc_event_count"),
        "max_in_flight": flight.get("max_in_flight"),
        "max_publication_lag": flight.get("max_publication_lag"),
    }
    for key, name in (
        ("ingress_depth", "replay_ingress_depth"),
        ("ingress_slot_rows", "replay_ingress_slot_rows"),
        ("high_water_occupancy", "replay_ingress_high_water_occupancy"),
        ("occupancy", "replay_ingress_final_occupancy"),
        ("backpressure_waits", "replay_ingress_backpressure_waits"),
        ("backpressure_wait_s", "replay_ingress_backpressure_wait_s"),
        ("early_returns", "replay_ingress_early_returns"),
        ("dropped_batches", "replay_ingress_dropped_batches"),
    ):
        figures[name] = replay.get(key)
    # Only JSON-safe scalars: the trainer's document is untrusted input. NaN/Infinity (which the
    # seed's parser accepts) are kept as text: the artifact is strict JSON (allow_nan=False).
    return {
        k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in figures.items()
        if v is None or isinstance(v, (int, float, str, bool))
    }


def dumps_artifact(artifact: Artifact) -> str:
    return json.dumps(artifact.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"


__all__ = [
    "ARTIFACT_SCHEMA_VERSION",
    "Artifact",
    "DeadlineInfo",
    "MonitorConfig",
    "PostShutdown",
    "ProgressSample",
    "ResourceSummary",
    "SampleRecorder",
    "SeriesInfo",
    "SeriesPoint",
    "UploadInfo",
    "dumps_artifact",
    "leak_failures",
    "run_summary_figures",
]
