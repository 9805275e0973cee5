"""The run's groups: sampling and liveness, the run summary, the deadline, the launcher."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sidecar.core.samples import SAMPLE_COMMAND_BYTES, SAMPLE_PROCESSES
from sidecar.core.throughput import ThroughputLimit
from sidecar.core.trends import quantity_bytes
from sidecar.launcher.protocol.fields import signal_number
from sidecar.launcher.protocol.names import DEFAULT_EXIT_GRACE_S, MAX_EXIT_GRACE_S
from sidecar.launcher.protocol.stacks import MAX_STACKS_TIMEOUT_S
from sidecar.settings.base import DAY_S, MAX_BYTES, MAX_MIB, MAX_SECONDS, MIN_INTERVAL_S, Group
from soak_sidecar_kit import contract


class MonitorSettings(Group):
    """Sampling and liveness: how often to sample, and when a quiet trainer counts as hung."""

    sample_interval_s: float = Field(
        5.0, ge=MIN_INTERVAL_S, le=DAY_S, description="Seconds between samples. Default 5."
    )
    startup_timeout_s: float = Field(
        600.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds allowed before the first progress file appears. Default 600.",
    )
    stale_progress_s: float = Field(
        120.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds without any progress change before the soak fails, while the trainer's "
        "last progress record (progress.jsonl) says phase train, or there is none. Default 120.",
    )
    stale_eval_s: float = Field(
        1800.0,
        gt=0,
        le=MAX_SECONDS,
        description="The stale-progress timeout while the last progress record says phase eval, "
        "seconds. Default 1800.",
    )
    stale_checkpoint_s: float = Field(
        1800.0,
        gt=0,
        le=MAX_SECONDS,
        description="The stale-progress timeout while the last progress record says phase checkpoint, "
        "seconds. Default 1800.",
    )
    stale_data_s: float = Field(
        600.0,
        gt=0,
        le=MAX_SECONDS,
        description="The stale-progress timeout while the last progress record says phase data, "
        "seconds. Default 600.",
    )
    stale_compile_s: float = Field(
        3600.0,
        gt=0,
        le=MAX_SECONDS,
        description="The stale-progress timeout while the last progress record says phase compile, "
        "seconds. Default 3600.",
    )
    phase_calibration_factor: float | None = Field(
        None,
        ge=1,
        le=1000,
        description="Calibrate the phases' stale timeouts from the attempt's own history: once a visit "
        "to a phase other than train has ended, that phase's timeout is this many times its longest "
        "visit so far, at least stale_progress_s and at most its own stale_<phase>_s (a factor, 1 to "
        "1000; e.g. 3: a checkpoint may take 3x the longest seen). Default off.",
    )

    def phase_stale_s(self) -> dict[str, float]:
        """The stale timeout of each phase but train (a progress record's phase)."""
        return {
            "eval": self.stale_eval_s,
            "checkpoint": self.stale_checkpoint_s,
            "data": self.stale_data_s,
            "compile": self.stale_compile_s,
        }

    stack_capture_s: float = Field(
        10.0,
        ge=0,
        le=MAX_STACKS_TIMEOUT_S,
        description="Seconds a stall's stop may wait for the trainer's Python stacks (py-spy, taken by the "
        "launcher before the TERM); 0 takes none. Default 10.",
    )
    post_shutdown_grace_s: float = Field(
        5.0,
        ge=0,
        le=DAY_S,
        description="Seconds to wait after the trainer exits before the residual check. Default 5.",
    )
    min_duration_s: float = Field(
        0.0,
        ge=0,
        le=MAX_SECONDS,
        description="A soak that ends sooner than this many seconds fails. Default 0.",
    )
    progress_dir: Path = Field(
        Path("soak-output/progress"),
        description="Directory the trainer writes progress and run_summary.json to. "
        "Default <output>/runs/<run id>/progress locally, /soak/progress in the chart.",
    )
    progress_signal: Literal["bytes", "any"] = Field(
        "any",
        description="What counts as progress: 'any' (any change: a file added, grown or rewritten, "
        "its mtime) or 'bytes' (only a change of the files' total size). Default any.",
    )
    max_rss_growth_mib: float | None = Field(
        None,
        ge=0,
        le=MAX_MIB,
        description="Fail (resource_leak) when the tree's RSS grows more than this, MiB. Default off.",
    )
    max_cgroup_memory_growth_mib: float | None = Field(
        None,
        ge=0,
        le=MAX_MIB,
        description="Fail (resource_leak) when the anonymous plus shared memory (anon+shmem: memfd, "
        "/dev/shm, tmpfs; page cache left out) of the launcher's memory cgroup grows more than this over "
        "the steady samples, or stays more than this above its first steady sample once the trainer's "
        "processes are gone, MiB. Default: the RSS limit (--max-rss-growth; off when that is off) "
        "where the cgroup is not the sidecar's own; off where it is (a local run).",
    )
    max_fd_growth: int | None = Field(
        None,
        ge=0,
        le=10_000_000,
        description="Fail (resource_leak) when the tree's fd count grows more than this. Default off.",
    )
    max_throughput_drop_pct: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Fail (throughput_dropped, exit 21), stopping the trainer, when its throughput drops "
        "more than this many percent: an hour on at the step-time trend's 95 % low end (per_hour), "
        "or against the first hour (first_hour); from its progress records (docs/trainers.md). "
        "Default off: a slowdown beyond doubt is then only noted.",
    )
    throughput_drop_basis: Literal["per_hour", "first_hour"] = Field(
        "per_hour",
        description="What max_throughput_drop_pct is against: per_hour (the trend) or first_hour (the "
        "median step time of the last 10 minutes against the first hour's). Default per_hour.",
    )
    memory_limit: str | None = Field(
        None,
        description="The trainer's memory limit, a Kubernetes quantity (8Gi, 512M) or bytes: the artifact "
        "projects when the RSS trend reaches it. The chart sets it from trainer.resources.limits.memory. "
        "Default none.",
    )
    fail_on_projected_memory_limit: bool = Field(
        False,
        description="Fail (resource_leak) when the RSS trend (the low end of its 95 % interval) reaches "
        "memory_limit before the deadline. Default false.",
    )
    series_points: int = Field(
        512, ge=16, le=1_000_000, description="Samples kept in memory as a downsampled series. Default 512."
    )
    sample_processes: int = Field(
        SAMPLE_PROCESSES,
        ge=1,
        le=1024,
        description="Processes a sample line lists one by one (the launcher, the trainer, then the largest "
        "by RSS); the others are summed in it, and the totals always count every process. "
        f"Default {SAMPLE_PROCESSES}.",
    )
    sample_command_bytes: int = Field(
        SAMPLE_COMMAND_BYTES,
        ge=0,
        le=64 * 1024 * 1024,
        description="Bytes of command lines an attempt's samples record, in all (each command once, "
        f"at its first listing). Default {SAMPLE_COMMAND_BYTES} (1 MiB).",
    )
    status_line: Literal["auto", "tty", "json", "off"] = Field(
        "auto",
        description="Live status: a one-line display on a TTY, one JSON line per sample otherwise. "
        "Default auto.",
    )

    def cgroup_memory_growth_limit_mib(self, *, shared_with_sidecar: bool) -> float | None:
        """The cgroup leak rule's limit: its own setting, else the RSS limit where the cgroup is the
        trainer's alone. Memory a trainer keeps outside its RSS (a memfd, /dev/shm) is the same leak
        the RSS rule is there to catch; page cache is not counted, so reading a dataset does not
        reach it. A cgroup the sidecar shares (a local run: the sidecar's own, with whatever else
        runs in it, a whole terminal session) is judged only when asked for explicitly."""
        if self.max_cgroup_memory_growth_mib is not None:
            return self.max_cgroup_memory_growth_mib
        return None if shared_with_sidecar else self.max_rss_growth_mib

    def throughput_limit(self) -> ThroughputLimit:
        """The throughput rule (sidecar.core.throughput): max_throughput_drop_pct and its basis."""
        return ThroughputLimit(self.max_throughput_drop_pct, self.throughput_drop_basis)

    @field_validator("memory_limit")
    @classmethod
    def _a_quantity(cls, value: str | None) -> str | None:
        if value is not None and not quantity_bytes(value):
            raise ValueError(f"{value!r} is not a memory quantity (8Gi, 512M, 1e9 or bytes)")
        return value


class SummarySettings(Group):
    """run_summary.json validation."""

    file_name: str = Field(
        contract.SUMMARY_FILE, description="Name inside progress_dir. Default run_summary.json."
    )
    max_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        le=MAX_BYTES,
        description="Largest accepted run_summary.json, bytes. Default 16 MiB.",
    )
    manifest_validator: str | None = Field(
        None,
        description="Runtime-manifest validator as 'module:function' (called with the manifest and "
        "completed=bool, raising TypeError/ValueError). Default none; the entry point group "
        "'soak_sidecar.manifest_validators' is consulted when unset.",
    )
    profile: Literal["replay", "core"] = Field(
        "replay",
        description="Rules a completed run_summary must meet: 'core' (status, schema versions, the "
        "shutdown contract, the manifest validator: any trainer) or 'replay' (core plus the "
        "replay-ingress invariants and drained inference flight: a replay-buffer trainer). The "
        "operator's choice, never the trainer's. Default replay.",
    )


class DeadlineSettings(Group):
    """The persistent total-job deadline."""

    budget_s: float = Field(
        7200.0, gt=0, le=MAX_SECONDS, description="Total job budget in seconds, across retries. Default 7200."
    )
    checkpoint_margin_s: float = Field(
        120.0,
        gt=0,
        le=MAX_SECONDS,
        description="Soft stop this many seconds before the deadline. Default 120.",
    )
    max_budget_s: float = Field(
        7200.0,
        gt=0,
        le=MAX_SECONDS,
        description="Largest budget a record may carry, seconds (two hours by default: a record "
        "that claims more is refused; raise it explicitly for multi-day soaks). Default 7200.",
    )
    term_grace_s: float = Field(
        5.0,
        ge=0,
        le=DAY_S,
        description="SIGTERM this many seconds before the deadline, SIGKILL at it. Default 5.",
    )
    store: Literal["file", "s3"] = Field("file", description="Where deadline records live. Default file.")
    store_dir: Path = Field(
        Path("soak-output/deadlines"),
        description="Directory of the file store. Default <output>/deadlines.",
    )
    run_id: str | None = Field(
        None, description="Run UUID shared by every attempt. Default: a new UUID (local mode only)."
    )
    resume: bool = Field(
        False,
        description="Require an existing record (never create a fresh budget). Default false.",
    )
    resume_checkpoint: Path | None = Field(
        None, description="Checkpoint to resume from (must be approved). Default none."
    )
    checkpoint_path: Path | None = Field(
        None,
        description="The run's checkpoint file, fixed for every attempt: it joins the run "
        "identity and the approval, and resume_checkpoint must name it. Default none (no resume).",
    )
    auto_resume: bool = Field(
        False,
        description="Resume from checkpoint_path whenever that file exists at the attempt's start (a "
        "retried pod, with no hand step), as resume_checkpoint would; needs checkpoint_path. A fresh "
        "attempt (no file yet) starts afresh. Default false.",
    )
    resume_flag: str | None = Field(
        None,
        description="Trainer argument followed by the checkpoint path on a resumed attempt (e.g. "
        "--resume); empty or null appends nothing: the trainer reads $SOAK_RESUME_CHECKPOINT, as "
        "the trainer kit does, and its argument parser never meets an argument it does not know. "
        "Default none.",
    )
    dataset_manifest: Path | None = Field(
        None, description="File whose sha256 joins the run identity. Default none."
    )
    code_files: list[Path] = Field(
        default_factory=list, description="Files whose sha256 join the run identity. Default none."
    )
    approval_file: Path | None = Field(
        None,
        description="Approval record that must match the identity exactly. Default none (off).",
    )
    require_approval: bool = Field(
        False, description="Refuse to run without an approval file. Default false."
    )

    @model_validator(mode="after")
    def _times_in_order(self) -> DeadlineSettings:
        # Field names in these messages are rewritten to what the user set (load_settings).
        if self.checkpoint_margin_s >= self.budget_s:
            raise ValueError(
                f"checkpoint_margin_s ({self.checkpoint_margin_s:g} s) must be smaller "
                f"than budget_s ({self.budget_s:g} s)"
            )
        # The launcher soft-stops at deadline - margin and TERMs at deadline - term grace: a grace
        # not below the margin TERMs the trainer before (or with) the soft stop, so it never checkpoints.
        if self.term_grace_s >= self.checkpoint_margin_s:
            raise ValueError(
                f"term_grace_s ({self.term_grace_s:g} s) must be smaller than checkpoint_margin_s "
                f"({self.checkpoint_margin_s:g} s): SIGTERM would come before the soft stop"
            )
        if self.budget_s > self.max_budget_s:
            raise ValueError(
                f"budget_s ({self.budget_s:g} s) exceeds max_budget_s ({self.max_budget_s:g} s): "
                "raise the cap explicitly with SOAK_DEADLINE__MAX_BUDGET_S for a longer soak"
            )
        if self.auto_resume and self.checkpoint_path is None:
            raise ValueError(
                "auto_resume needs checkpoint_path (--checkpoint): the run's checkpoint record to resume from"
            )
        return self


class LauncherSettings(Group):
    """The run-dir protocol between sidecar and launcher."""

    run_dir: Path = Field(
        Path("soak-output/run"),
        description="Run dir shared with the launcher. Default <output>/runs/<run id>/run locally, "
        "/soak/run in the chart.",
    )
    heartbeat_interval_s: float = Field(
        1.0, ge=MIN_INTERVAL_S, le=DAY_S, description="Sidecar heartbeat period, seconds. Default 1."
    )
    heartbeat_timeout_s: float = Field(
        15.0,
        gt=0,
        le=DAY_S,
        description="Launcher kills the trainer after this long without a heartbeat. Default 15.",
    )
    appear_timeout_s: float = Field(
        300.0, gt=0, le=MAX_SECONDS, description="Seconds the sidecar waits for launcher.json. Default 300."
    )
    go_timeout_s: float = Field(
        300.0, gt=0, le=MAX_SECONDS, description="Seconds the launcher waits for go.json. Default 300."
    )
    kill_grace_s: float = Field(
        5.0, ge=0, le=DAY_S, description="Seconds between TERM and KILL when stopping survivors. Default 5."
    )
    exit_grace_s: float = Field(
        DEFAULT_EXIT_GRACE_S,
        ge=0,
        le=MAX_EXIT_GRACE_S,
        description="After the trainer exits on its own (no stop sent): seconds its remaining "
        "descendants get to exit by themselves, reaped as they do, never past the deadline's TERM; only "
        "what still runs then is a survivor (TERM, KILL after kill_grace_s; a resource leak). A rank still "
        "exiting when rank 0 ends is no leak. 0: at once. At most 60. Default 5.",
    )
    console_log_bytes: int = Field(
        64 * 1024 * 1024, gt=0, le=MAX_BYTES, description="Cap of the console log, bytes. Default 64 MiB."
    )
    soft_stop_signal: str = Field(
        "SIGUSR1", description="Signal sent to the trainer group at the margin. Default SIGUSR1."
    )
    stop_grace_s: float = Field(
        30.0,
        ge=0,
        le=DAY_S,
        description="A soak stopped from outside (the pod deleted, its Job failed, Ctrl-C, SIGTERM): "
        "seconds the trainer gets after the soft stop to checkpoint and exit before SIGTERM; 0 sends "
        "SIGTERM at once; a second stop signal ends the grace at once. Keep it well inside the pod's "
        "terminationGracePeriodSeconds. Default 30 in a pod, 5 for run --local.",
    )

    keep_env: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Local mode: variables of the sidecar's environment a trainer still gets, named "
        "exactly. The rest of SOAK_*, AWS_*, KUBECONFIG and BOTO_CONFIG, in any case (the sidecar's "
        "settings and credentials), are withheld. JSON list. Default [].",
    )

    @model_validator(mode="after")
    def _beats_within_timeout(self) -> LauncherSettings:
        # The launcher kills the trainer when the newest beat is older than the timeout: a period
        # not below it loses the supervisor between two healthy beats.
        if self.heartbeat_interval_s >= self.heartbeat_timeout_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g} s) must be smaller than "
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g} s): the launcher would kill the "
                "trainer as supervisor_lost between two beats"
            )
        return self

    @field_validator("soft_stop_signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        # The launcher's own parser (it reads this value from go.json), so the two cannot disagree;
        # a name it cannot use is refused before any record exists.
        signal_number(value)
        return value
