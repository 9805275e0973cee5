"""What one sample holds: process tree, GPUs, progress. Produced by adapters, consumed by the core."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# A stored command line is cut to this many characters (after redaction).
COMMAND_MAX_CHARS = 512
# A sample line lists this many processes one by one by default (monitor.sample_processes), and
# records this many bytes of command lines in all, per attempt (monitor.sample_command_bytes).
SAMPLE_PROCESSES = 16
SAMPLE_COMMAND_BYTES = 1024 * 1024
FD_CLASSES = ("pipe", "socket", "memfd", "eventfd", "eventpoll", "nvidia", "shared_memory", "other")
# ProcessInfo.state of a process that has exited and is not yet reaped.
ZOMBIE = "zombie"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProcessInfo(_Model):
    pid: int
    ppid: int
    start_time: float = Field(
        description="Process creation time (epoch s); a PID with another start time is another process."
    )
    start_ticks: int | None = Field(
        None,
        description="Start time in clock ticks since boot (field 22 of /proc/<pid>/stat); "
        "identity checks use it when set: it is immune to wall-clock steps.",
    )
    rss_kib: int
    fd_count: int
    fd_classes: dict[str, int]
    threads: int
    state: str
    command: str = Field(
        "",
        description="Command line, truncated; never the environment. Absent in a sample line, "
        "which names it by command_id.",
    )
    command_id: str | None = Field(
        None,
        description="In a sample line: 16 hex digits of BLAKE2b (8 bytes) over the command; its text "
        "is in the `commands` of the first sample line that listed it (unless the attempt's command "
        "budget was spent then).",
    )


class ResidualProcess(_Model):
    """A process of the run that outlived the trainer."""

    pid: int
    command: str
    fate: Literal["alive_after_shutdown", "killed_by_launcher", "unreaped"] = Field(
        description="alive_after_shutdown: still running when the sidecar checked (it then killed "
        "it); killed_by_launcher: the launcher had to kill it after the trainer ended; unreaped: "
        "the launcher could not reap it"
    )
    last_seen: ProcessInfo | None = Field(
        None, description="The process as last sampled; None when it came and went between samples."
    )


class UnlistedProcesses(_Model):
    """The processes of the tree a sample line does not list one by one, summed."""

    count: int = 0
    rss_kib: int = 0
    fd_count: int = 0
    threads: int = 0
    states: dict[str, int] = Field(default_factory=dict, description="Process count by state.")


class ProcessTreeSample(_Model):
    """The tree's totals are exact, over every process. The sampler lists every process; a sample
    line (samples.jsonl.gz) lists at most ``monitor.sample_processes`` of them (the launcher, the
    trainer, then the largest by RSS, in pid order) and sums the rest in ``unlisted``."""

    process_count: int = 0
    zombie_count: int = 0
    rss_kib_total: int = 0
    fd_count_total: int = 0
    fd_classes_total: dict[str, int] = Field(default_factory=dict)
    threads_total: int = 0
    processes: list[ProcessInfo] = Field(default_factory=list)
    unlisted: UnlistedProcesses | None = Field(
        None, description="In a sample line: the processes not listed, summed; absent when none."
    )
    commands: dict[str, str] | None = Field(
        None,
        description="In a sample line: the command lines first listed in it, by command_id; each "
        "is recorded once per attempt while the attempt's command budget lasts.",
    )
    commands_unrecorded: int | None = Field(
        None,
        description="In a sample line: listed processes whose command was new but not recorded "
        "(the attempt's command budget was spent).",
    )


class ProgressSample(_Model):
    file_count: int = 0
    bytes_total: int = 0
    max_mtime: float | None = None
    # The newest structured progress record (sidecar.core.progress_records) seen so far: the
    # trainer's claim of where it is, timed by the sample that saw it.
    step: int | None = None
    phase: str | None = None
    total_steps: int | None = None
    samples: float | None = None
    tokens: float | None = None
    loss: float | None = None
    # progress.jsonl lines refused by the parser so far.
    records_refused: int = 0


class GpuDevice(_Model):
    index: int
    uuid: str
    name: str
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    memory_reserved_mib: float | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = Field(default=None, description="Single-bit ECC errors corrected (volatile).")
    retired_pages: int | None = None
    unavailable: list[str] = Field(default_factory=list, description="Metrics NVML does not support here.")
    errors: dict[str, str] = Field(
        default_factory=dict, description="Metrics that failed in this sample (other NVML errors)."
    )
    fault: str | None = Field(default=None, description="Hardware fault (GPU lost, reset needed).")
    # Health (read with the process lists, every gpu.process_interval_s; clock reasons every sample).
    clock_event_reasons: list[str] | None = Field(
        default=None, description="Active clock-event (throttle) reasons, by name."
    )
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    pcie_replay_count: int | None = None
    recovery_action: str | None = Field(
        default=None,
        description="What NVML says the GPU needs (none, gpu_reset, node_reboot, drain_p2p, ...).",
    )
    nvlink_active_links: int | None = None
    nvlink_crc_errors: int | None = Field(default=None, description="Flit and data CRC errors, all links.")
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None


class GpuEvent(_Model):
    """One NVML event (XID, ECC) as the event thread received it."""

    t_wall: float
    device_index: int
    device_uuid: str
    kind: Literal["xid", "ecc_single_bit", "ecc_double_bit"]
    data: int = Field(description="The XID number; for ECC events, NVML's event data.")


class GpuProcess(_Model):
    pid: int
    device_uuid: str
    used_memory_mib: float | None
    kind: Literal["compute", "graphics"]
    in_tree: bool


class GpuSample(_Model):
    available: bool = False
    reason: str | None = Field(default=None, description="Why GPU data is missing or partial.")
    devices: list[GpuDevice] = Field(default_factory=list)
    processes: list[GpuProcess] = Field(default_factory=list)
    attribution: Literal["pid", "unavailable", "not_sampled"] = "not_sampled"
    used_memory_mib_total: float | None = Field(
        default=None,
        description="Memory of the trainer's processes when attributed, else of its devices.",
    )
    fault: str | None = Field(default=None, description="Hardware fault (GPU lost, reset required).")
    nvml_time_ms: float = 0.0
    processes_age_s: float | None = Field(
        default=None, description="Age of the process list (queried every gpu.process_interval_s)."
    )
    driver_version: str | None = None
    events: list[GpuEvent] = Field(default_factory=list, description="Events since the previous sample.")
    events_unavailable: str | None = Field(
        default=None, description="Why NVML events are not watched (no event API, not supported)."
    )
    processes_unlisted: int | None = Field(
        default=None,
        description="In a sample line: GPU processes beyond monitor.sample_processes, not listed "
        "(used_memory_mib_total still counts them).",
    )
    events_unlisted: int | None = Field(
        default=None,
        description="In a sample line: events beyond monitor.sample_processes, not listed (the "
        "artifact's gpu_health counts every event).",
    )


class CgroupMemorySample(_Model):
    """The launcher's memory cgroup (where the trainer's tree runs) at one sample, in bytes as the
    kernel counts them: ``memory.current`` and ``memory.stat`` (v2), ``memory.usage_in_bytes`` and
    the hierarchical ``total_*`` keys of ``memory.stat`` (v1)."""

    available: bool = True
    reason: str | None = Field(default=None, description="Why this sample could not be read.")
    current_bytes: int | None = Field(
        default=None, description="memory.current (v2) or memory.usage_in_bytes (v1): everything charged."
    )
    anon_bytes: int | None = Field(default=None, description="Anonymous memory (v2 anon, v1 total_rss).")
    shmem_bytes: int | None = Field(
        default=None, description="Shared memory: memfd, /dev/shm, tmpfs, SysV (v2 shmem, v1 total_shmem)."
    )
    file_bytes: int | None = Field(
        default=None, description="Page cache, shmem included (v2 file, v1 total_cache)."
    )
    inactive_file_bytes: int | None = Field(
        default=None, description="Page cache the kernel reclaims first (inactive_file)."
    )

    @property
    def held_bytes(self) -> int | None:
        """What the leak rule judges: anonymous plus shared memory, the memory only its owner's
        freeing gives back. Page cache (a dataset read, checkpoints written) is left out: the kernel
        reclaims it under pressure, and a trainer that reads its data again grows it without leaking."""
        if not self.available or self.anon_bytes is None or self.shmem_bytes is None:
            return None
        return self.anon_bytes + self.shmem_bytes


class MemoryCgroupInfo(_Model):
    """Which memory cgroup the cgroup series measures, or why there is none."""

    available: bool
    reason: str | None = Field(default=None, description="Why the cgroup's memory cannot be sampled.")
    version: Literal["v1", "v2"] | None = None
    path: str | None = Field(
        default=None, description="The launcher's cgroup as /proc/<launcher pid>/cgroup names it."
    )
    sidecar_own: bool | None = Field(
        default=None,
        description="The sidecar runs in the same cgroup (locally, as a rule): the series then counts "
        "the sidecar's own memory too.",
    )


class ShmFile(_Model):
    path: str = Field(description="Its path, non-UTF-8 bytes and control characters escaped.")
    bytes: int = Field(description="Its size (st_size).")
    allocated_bytes: int = Field(description="What it holds in memory (st_blocks x 512).")
    mtime_unix: float


class ShmLeftovers(_Model):
    """Regular files under /dev/shm owned by the trainer's UID and created or changed since the
    attempt started, as found once the trainer's tree was gone."""

    directory: str
    uid: int | None = Field(description="The launcher's UID as the sidecar read it; None: unknown.")
    files: list[ShmFile] = Field(default_factory=list)
    more: int = Field(default=0, description="Further such files found but not listed (bounded).")
    truncated: bool = Field(
        default=False, description="The scan stopped at its bound (entries or depth): more may exist."
    )
    error: str | None = Field(default=None, description="Why the directory could not be scanned.")


class Sample(_Model):
    t_wall: float
    elapsed_s: float
    process: ProcessTreeSample
    gpu: GpuSample
    progress: ProgressSample
    cgroup: CgroupMemorySample | None = Field(
        default=None, description="The launcher's memory cgroup; absent when it cannot be sampled."
    )
