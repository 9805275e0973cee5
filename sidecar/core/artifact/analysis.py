"""What the artifact concludes from the samples and the trainer's summary: leak trends, the
memory-limit projection, growth beyond the configured limits, and the run_summary figures."""

from __future__ import annotations

import math
from typing import Any

from sidecar.core.artifact.models import ResourceSummary
from sidecar.core.samples import Sample, ShmFile, ShmLeftovers
from sidecar.core.trends import LeakTrend, TrendWindow, seconds_to_limit

# The cgroup series: the launcher's memory cgroup, anonymous plus shared memory
# (CgroupMemorySample.held_bytes).
CGROUP_SERIES = "cgroup memory (anon+shmem)"
# The series whose trend the artifact reports: (key prefix, name in the artifact, unit).
TREND_SERIES = (
    ("rss_bytes", "process tree RSS", "bytes"),
    ("fds", "process tree fds", "fds"),
    ("cgroup_memory_bytes", CGROUP_SERIES, "bytes"),
)


def trend_values(sample: Sample) -> dict[str, float | None]:
    values: dict[str, float | None] = {
        "rss_bytes": sample.process.rss_kib_total * 1024.0,
        "fds": float(sample.process.fd_count_total),
    }
    held = None if sample.cgroup is None else sample.cgroup.held_bytes
    if held is not None:
        values["cgroup_memory_bytes"] = float(held)
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
    max_cgroup_memory_growth_mib: float | None = None,
) -> list[str]:
    """Growth beyond the configured limits, as reasons; limits left unset are not checked.

    The cgroup's memory is held to its limit twice: its growth over the steady samples (RSS's rule),
    and what stayed charged once the trainer's tree was gone (/dev/shm files, tmpfs), measured from the
    same first steady sample: memory a trainer fills and leaves between two samples shows there."""
    failures: list[str] = []
    if max_rss_growth_mib is not None and summary.rss_growth_kib is not None:
        growth_mib = summary.rss_growth_kib / 1024
        if growth_mib > max_rss_growth_mib:
            failures.append(f"process tree RSS grew by {growth_mib:.1f} MiB > {max_rss_growth_mib:.1f} MiB")
    if max_cgroup_memory_growth_mib is not None:
        failures.extend(_cgroup_growth(summary, max_cgroup_memory_growth_mib))
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


def _cgroup_growth(summary: ResourceSummary, limit_mib: float) -> list[str]:
    where = "" if summary.memory_cgroup is None else f" {summary.memory_cgroup.path}"
    failures = []
    if summary.cgroup_memory_growth_bytes is not None:
        growth_mib = summary.cgroup_memory_growth_bytes / 2**20
        if growth_mib > limit_mib:
            failures.append(
                f"{CGROUP_SERIES} of cgroup{where} grew by {growth_mib:.1f} MiB > {limit_mib:.1f} MiB"
            )
    if summary.cgroup_memory_left_bytes is not None:
        left_mib = summary.cgroup_memory_left_bytes / 2**20
        if left_mib > limit_mib:
            failures.append(
                f"{CGROUP_SERIES} of cgroup{where} was still {left_mib:.1f} MiB above its first steady "
                f"sample once the trainer's processes were gone > {limit_mib:.1f} MiB"
            )
    return failures


def shm_finding(left: ShmLeftovers, *, listed: int = 8) -> str | None:
    """The files the trainer's UID left in /dev/shm, named for the verdict's reason; None when none."""
    if not left.files:
        return None
    named = ", ".join(_shm_file(f) for f in left.files[:listed])
    rest = len(left.files) - listed + left.more
    tail = f" and {rest} more" if rest > 0 else ""
    return f"files left in {left.directory} by the trainer's UID {left.uid}: {named}{tail}"


def _shm_file(found: ShmFile) -> str:
    size, held = found.bytes / 2**20, found.allocated_bytes / 2**20
    return (
        f"{found.path} ({size:.1f} MiB)"
        if f"{size:.1f}" == f"{held:.1f}"
        else (f"{found.path} ({size:.1f} MiB, {held:.1f} MiB of it in memory)")
    )


def run_summary_figures(run_summary: Any) -> dict[str, Any]:
    """The resource-summary figures that come from the trainer's own run_summary (in-flight and
    replay-ingress figures of its runtime_manifest)."""
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
    # summary's parser accepts) are kept as text: the artifact is strict JSON (allow_nan=False).
    return {
        k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in figures.items()
        if v is None or isinstance(v, (int, float, str, bool))
    }
