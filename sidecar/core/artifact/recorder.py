"""Recording the samples of a run in bounded memory.

Multi-day soaks must not grow memory: every sample is streamed to a compressed JSONL file beside
the artifact, and only running aggregates plus a downsampled series stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from sidecar.core.artifact.analysis import leak_trends, trend_values
from sidecar.core.artifact.models import DeviceSummary, ResourceSummary, SeriesInfo, SeriesPoint
from sidecar.core.gpu_health import GpuHealthTracker
from sidecar.core.gpu_trends import GpuTrends, correctable_growth
from sidecar.core.sample_lines import SampleLines
from sidecar.core.samples import (
    SAMPLE_COMMAND_BYTES,
    SAMPLE_PROCESSES,
    CgroupMemorySample,
    GpuSample,
    ProcessTreeSample,
    Sample,
)
from sidecar.core.trends import Thinned, TrendWindow


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

    Every figure is taken from the whole sample (its totals cover every process); what is written
    and kept (``last``, the first steady sample) is its line (``SampleLines``): a bounded list.
    """

    def __init__(
        self,
        write_line: Callable[[str], None] | None,
        series_points: int,
        health: GpuHealthTracker | None = None,
        lines: SampleLines | None = None,
    ) -> None:
        self._write_line = write_line
        self._lines = lines or SampleLines(SAMPLE_PROCESSES, SAMPLE_COMMAND_BYTES)
        self.health = health or GpuHealthTracker()
        self._series: Thinned[SeriesPoint] = Thinned(max(16, series_points))
        self.trends = TrendWindow()
        self.gpu_trends = GpuTrends()
        self.summary = ResourceSummary()
        self._first_steady: Sample | None = None
        self.last: Sample | None = None
        self._devices: dict[str, DeviceSummary] = {}

    @property
    def count(self) -> int:
        return self.summary.sample_count

    def add(self, sample: Sample, *, steady: bool = True, keep: Collection[int] = ()) -> None:
        """``keep``: pids the line lists whatever the tree (the launcher, the trainer)."""
        line = self._lines.line(sample, keep)
        if self._write_line is not None:
            self._write_line(self._lines.dumps(line))
        self._series.add(SeriesPoint.of(sample))
        self.summary.sample_count += 1
        self.last = line
        if steady and self._first_steady is None:
            self._first_steady = line
        self._aggregate(sample, steady=steady)

    def _aggregate(self, sample: Sample, *, steady: bool) -> None:
        s = self.summary
        proc: ProcessTreeSample = sample.process
        s.max_process_count = _max(s.max_process_count, proc.process_count)
        s.max_zombie_count = _max(s.max_zombie_count, proc.zombie_count)
        s.max_process_rss_kib = _max(s.max_process_rss_kib, proc.rss_kib_total)
        s.max_fd_count = _max(s.max_fd_count, proc.fd_count_total)
        s.max_eventfd_count = _max(s.max_eventfd_count, proc.fd_classes_total.get("eventfd", 0))
        s.max_shared_memory_fd_count = _max(
            s.max_shared_memory_fd_count, proc.fd_classes_total.get("shared_memory", 0)
        )
        s.max_progress_bytes = _max(s.max_progress_bytes, sample.progress.bytes_total)
        held = None if sample.cgroup is None else sample.cgroup.held_bytes
        s.max_cgroup_memory_bytes = _max(s.max_cgroup_memory_bytes, held)
        if steady and held is not None:
            if s.cgroup_memory_first_bytes is None:
                s.cgroup_memory_first_bytes = held
            s.cgroup_memory_growth_bytes = held - s.cgroup_memory_first_bytes
        if steady and self._first_steady is not None:
            first = self._first_steady.process
            s.rss_growth_kib = proc.rss_kib_total - first.rss_kib_total
            s.fd_growth = proc.fd_count_total - first.fd_count_total
            self.trends.add(sample.elapsed_s, trend_values(sample))
        self._aggregate_gpu(sample.gpu, sample.elapsed_s, steady=steady)

    def after_cleanup(self, cgroup: CgroupMemorySample | None) -> None:
        """The cgroup once the trainer's processes are gone: what the run left charged to it."""
        held = None if cgroup is None else cgroup.held_bytes
        s = self.summary
        s.cgroup_memory_after_bytes = held
        if held is not None and s.cgroup_memory_first_bytes is not None:
            s.cgroup_memory_left_bytes = held - s.cgroup_memory_first_bytes

    def resource_summary(self) -> ResourceSummary:
        """The summary for the artifact: with the leak trends, and the GPU health figures once GPUs
        were sampled."""
        gpu_trends = self.gpu_trends.trends()
        update: dict[str, Any] = {
            "trends": leak_trends(self.trends),
            "gpu_trends": gpu_trends,
            "gpu_degradation": correctable_growth(gpu_trends),
        }
        if self.health.observed:
            update["gpu_health"] = self.health.summary()
        return self.summary.model_copy(update=update)

    def _aggregate_gpu(self, gpu: GpuSample, t: float, *, steady: bool) -> None:
        s = self.summary
        if not gpu.available:
            s.gpu_unavailable_reason = s.gpu_unavailable_reason or gpu.reason
            return
        health_fault = self.health.observe(gpu, t)
        self.gpu_trends.add(t, gpu)
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
            count=self.count,
            samples_file=samples_file,
            samples_sha256=samples_sha256,
            downsampled=list(self._series.items),
            stride=self._series.stride,
        )
