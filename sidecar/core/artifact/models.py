"""The soak artifact's document: a versioned, self-contained JSON document (schema in
docs/artifact.md), as pydantic models."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sidecar.core.artifact.progress import ProgressInfo
from sidecar.core.gpu_health import GpuHealthSummary
from sidecar.core.samples import MemoryCgroupInfo, ResidualProcess, Sample, ShmLeftovers
from sidecar.core.trends import LeakTrend

ARTIFACT_SCHEMA_VERSION = "2.5.0"
# An attempt still running, or stopping: its provisional artifact (no verdict yet).
PROVISIONAL_STATUSES = ("running", "stopping")


def utc_timestamp(epoch: float) -> str:
    """An epoch time as the artifact's ``*_at_utc`` fields hold it (UTC, whole seconds)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# The last second datetime can show (9999-12-31T23:59:59Z).
LAST_SHOWABLE_UNIX = 253_402_300_799


def claimed_utc(epoch: float | None) -> str | None:
    """A time read from something others could write (a file's mtime, a listed object's): as
    ``utc_timestamp``, or None when it is no time that can be shown (before 1970, past year 9999)."""
    if epoch is None or not 0 <= epoch <= LAST_SHOWABLE_UNIX:  # NaN fails both comparisons
        return None
    return utc_timestamp(epoch)


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
    """Maxima and growth over the whole run, GPU figures, and figures from the run_summary."""

    # The trainer's structured progress, when it writes any.
    progress: ProgressInfo | None = None

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
    memory_cgroup: MemoryCgroupInfo | None = Field(
        default=None,
        description="The launcher's memory cgroup the cgroup series measures (path, v1/v2, whether it is "
        "the sidecar's own), or why there is none. None: not looked at (a run that never started).",
    )
    max_cgroup_memory_bytes: int | None = Field(
        default=None, description="The cgroup's anonymous plus shared memory (anon+shmem), at most."
    )
    cgroup_memory_first_bytes: int | None = Field(
        default=None,
        description="The cgroup's anon+shmem at the first steady sample that could read it: what growth "
        "and what was left are measured from.",
    )
    cgroup_memory_growth_bytes: int | None = Field(
        default=None,
        description="The cgroup's anon+shmem of the last steady sample minus the first's (as RSS).",
    )
    cgroup_memory_after_bytes: int | None = Field(
        default=None,
        description="The cgroup's anon+shmem once the trainer's processes were gone (after the launcher's "
        "cleanup and the residual check).",
    )
    cgroup_memory_left_bytes: int | None = Field(
        default=None,
        description="cgroup_memory_after_bytes minus the first steady sample's anon+shmem: memory the run "
        "left charged (a /dev/shm or tmpfs file) however briefly it was held.",
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
    gpu_trends: list[LeakTrend] = Field(
        default_factory=list,
        description="Per-GPU degradation trends over every sample: correctable remapped rows, PCIe "
        "replays, temperature per 100 W (sidecar/core/gpu_trends.py).",
    )
    gpu_left: list[str] = Field(
        default_factory=list,
        description="What the run left on its GPUs once its tree was gone: processes of the run still "
        "listed, memory not returned, resets pending (sidecar/core/gpu_clean.py).",
    )
    gpu_degradation: list[str] = Field(
        default_factory=list,
        description="Devices whose correctable errors grow steadily (the whole 95 % interval above zero).",
    )
    gpu_health: GpuHealthSummary | None = Field(
        default=None, description="XID/ECC events, row remapping, clock-event reasons, link errors."
    )
    nvml_time_ms_max: float | None = None
    residual_process_count: int = 0
    run_summary_figures: dict[str, Any] = Field(
        default_factory=dict,
        description="The replay profile's figures taken from run_summary (in-flight, replay ingress).",
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
    resumed_from: str | None = Field(
        None, description="The checkpoint this attempt was started to resume from (--resume-checkpoint)."
    )
    expired: bool = Field(
        False, description="The deadline passed, or its TERM or KILL ended the trainer before it did."
    )
    budget_spent: bool = Field(
        False,
        description="The trainer was soft-stopped at the checkpoint margin, before the deadline, and had "
        "not finished: the budget ran out though the deadline had not expired.",
    )
    soft_stop_sent: bool = False
    term_sent: bool = False
    kill_sent: bool = False


class Segment(_Model):
    """A slice of an evidence file uploaded while the trainer ran: never rewritten; a file's
    segments in order, concatenated, are its bytes from offset 0 up to the last flush."""

    name: str = Field(description="Object name under the attempt's prefix, e.g. samples.jsonl.gz.seg-000001.")
    file: str = Field(description="The evidence file it is a slice of (samples.jsonl.gz, console.log).")
    offset: int = Field(ge=0, description="Byte offset of the slice in that file.")
    size: int = Field(ge=0)
    sha256: str
    uri: str
    uploaded_at_utc: str


class UploadInfo(_Model):
    uris: dict[str, str] = Field(default_factory=dict, description="File name -> URI.")
    sha256: dict[str, str] = Field(default_factory=dict, description="File name -> sha256 hex.")
    error: str | None = None
    segments: list[Segment] = Field(
        default_factory=list,
        description="The evidence uploaded in segments every evidence.flush_s while the trainer ran.",
    )
    checksums_unverified: bool = Field(
        False,
        description="The store does not check and echo the SHA-256 sent with each upload "
        "(s3.accept_unverified_checksums): these digests are the sidecar's own, unconfirmed.",
    )
    segments_error: str | None = Field(
        default=None,
        description="The first failure of a segment or provisional upload (later flushes try again).",
    )


class PhaseInfo(_Model):
    kind: str = Field(
        description="scheduling, container_start, launcher, startup, productive, lost_work, "
        "checkpointing or teardown (sidecar/core/ledger/phases.py)."
    )
    start_unix: float
    seconds: float


class CheckpointInfo(_Model):
    """The trainer's latest checkpoint record (checkpoint.json in the progress dir), a claim: only
    when the sidecar first saw it is the sidecar's."""

    step: int
    path: str | None = None
    bytes: int | None = None
    duration_s: float | None = None
    seen_at_unix: float = Field(description="The sample that first showed this record (the sidecar's clock).")
    records_seen: int = Field(description="How many different checkpoint records the samples showed.")


class AttemptPhasesInfo(_Model):
    """Where the attempt's wall time went, from its start to its verdict: phases with neither gap nor
    overlap."""

    phases: list[PhaseInfo]
    lost_work_known: bool = Field(
        description="False when the attempt did not pass and no checkpoint was reported: its lost work "
        "is not guessed (no checkpoint reported)."
    )
    checkpoint: CheckpointInfo | None = Field(default=None, description="None: no checkpoint reported.")
    checkpoint_problem: str | None = Field(default=None, description="Why checkpoint.json could not be read.")


class LostAttempt(_Model):
    """An earlier attempt of the same run (and index) that ended without a verdict: its sidecar was
    killed, or its node lost. What its provisional artifact and segments say of it."""

    attempt: int
    status: str = Field(description="Its last provisional status: running, or stopping (a stop had begun).")
    reason: str | None = Field(default=None, description="Why it was stopping, when it got that far.")
    last_evidence_at_utc: str | None = Field(default=None, description="Its last record or segment.")
    evidence: str = Field(description="Where its provisional artifact is (s3:// URI or local path).")
    started_unix: float | None = Field(default=None, description="When it started, as its record says.")
    last_evidence_unix: float | None = Field(default=None, description="Its last record or segment (Unix s).")


class PostShutdown(_Model):
    residual_processes: list[ResidualProcess] = Field(
        default_factory=list, description="Every process that outlived the trainer, however it ended."
    )
    launcher_exit: dict[str, Any] | None = Field(default=None, description="The launcher's exit.json.")
    shm_left: ShmLeftovers | None = Field(
        default=None,
        description="Regular files under /dev/shm owned by the trainer's UID and created or changed since "
        "the attempt started, found once the trainer's tree was gone (a finding; the memory they hold "
        "is judged by the cgroup leak rule). None: not looked at.",
    )


class Artifact(_Model):
    schema_version: str = ARTIFACT_SCHEMA_VERSION
    status: Literal["passed", "failed", "running", "stopping"] = Field(
        description="The verdict; running or stopping in the provisional artifact, written when the "
        "attempt is numbered and replaced by the final one (a stop from outside first records its cause "
        "as stopping).",
    )
    failure_reason: str | None
    failure_classification: str | None
    exit_code: int | None = Field(description="The sidecar's exit code; None while there is no verdict.")
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
    stacks: dict[str, Any] | None = Field(
        default=None,
        description="A stall's evidence: the Python stacks of the trainer's processes, taken by the launcher "
        "(py-spy) before the TERM (stacks.json: per process a stack or why it is missing), or why there "
        "are none. Absent when no stall stopped the trainer.",
    )
    phases: AttemptPhasesInfo | None = Field(
        default=None, description="Where the attempt's wall time went; None for an attempt that never ran."
    )
    lost_attempts: list[LostAttempt] = Field(
        default_factory=list,
        description="Earlier attempts of this run (and index) that ended without a verdict.",
    )
    protocol_violations: list[str] = Field(
        default_factory=list,
        description="Run-dir records the trainer's side wrote that disagreed with what the sidecar "
        "observed (e.g. a trainer.json naming another process than the launcher's child): named here, "
        "never followed.",
    )


def dumps_artifact(artifact: Artifact) -> str:
    return json.dumps(artifact.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"
