"""All configuration: one pydantic-settings model, env prefix ``SOAK_``, groups nested with ``__``.

Example: ``SOAK_MONITOR__SAMPLE_INTERVAL_S=2`` sets ``settings.monitor.sample_interval_s``.
Built once in the CLI (env, then command-line overrides) and passed down; nothing else reads
the environment for configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sidecar.core.errors import ConfigError
from sidecar.core.publication import normalize_prefix
from sidecar.core.redaction import RedactionRules
from sidecar.core.trends import quantity_bytes
from sidecar.launcher.protocol.fields import signal_number

# Bounds that refuse absurd values (1e308 s, 1e-300 s) while allowing any real soak: a year of
# budget, a day for any grace, timeout or interval, 10 ms the shortest interval.
MIN_INTERVAL_S = 0.01
DAY_S = 86_400.0
MAX_SECONDS = 366 * DAY_S
MAX_BYTES = 1024**4
MAX_MIB = 1024.0**3


class _Group(BaseModel):
    # Non-finite numbers are refused with their own message ("should be a finite number").
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class MonitorSettings(_Group):
    """Sampling and liveness (the seed's ``run_soak`` knobs)."""

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
        description="Seconds without any progress change before the soak fails. Default 120.",
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
        "bytes",
        description="What counts as progress: 'bytes' (the seed's rule: the total size changed) or "
        "'any' (also a file added or rewritten). Default bytes.",
    )
    max_rss_growth_mib: float | None = Field(
        None,
        ge=0,
        le=MAX_MIB,
        description="Fail (resource_leak) when the tree's RSS grows more than this, MiB. Default off.",
    )
    max_fd_growth: int | None = Field(
        None,
        ge=0,
        le=10_000_000,
        description="Fail (resource_leak) when the tree's fd count grows more than this. Default off.",
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
    status_line: Literal["auto", "tty", "json", "off"] = Field(
        "auto",
        description="Live status: a one-line display on a TTY, one JSON line per sample otherwise. "
        "Default auto.",
    )

    @field_validator("memory_limit")
    @classmethod
    def _a_quantity(cls, value: str | None) -> str | None:
        if value is not None and not quantity_bytes(value):
            raise ValueError(f"{value!r} is not a memory quantity (8Gi, 512M, 1e9 or bytes)")
        return value


class SummarySettings(_Group):
    """run_summary.json validation."""

    file_name: str = Field(
        "run_summary.json", description="Name inside progress_dir. Default run_summary.json."
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


class DeadlineSettings(_Group):
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
        description="Largest budget a record may carry, seconds (the seed's two-hour cap; raise it "
        "explicitly for multi-day soaks). Default 7200.",
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
    resume_flag: str | None = Field(
        "--resume",
        description="Trainer argument followed by the checkpoint path on a resumed attempt; "
        "empty or null appends nothing. Default --resume.",
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
    def _margin_below_budget(self) -> DeadlineSettings:
        if self.checkpoint_margin_s >= self.budget_s:
            raise ValueError(
                f"checkpoint_margin_s ({self.checkpoint_margin_s:g} s; --checkpoint-margin) must be smaller "
                f"than budget_s ({self.budget_s:g} s; --budget)"
            )
        if self.budget_s > self.max_budget_s:
            raise ValueError(
                f"budget_s ({self.budget_s:g} s) exceeds max_budget_s ({self.max_budget_s:g} s): "
                "raise the cap explicitly with SOAK_DEADLINE__MAX_BUDGET_S for a longer soak"
            )
        return self


class LauncherSettings(_Group):
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
        "SIGTERM at once. Keep it well inside the pod's terminationGracePeriodSeconds. Default 30.",
    )

    keep_env: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Local mode: variables of the sidecar's environment a trainer still gets. The "
        "rest of SOAK_*, AWS_*, KUBECONFIG and BOTO_CONFIG (the sidecar's settings and credentials) "
        "are withheld. JSON list. Default [].",
    )

    @field_validator("soft_stop_signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        # The launcher's own parser (it reads this value from go.json), so the two cannot disagree;
        # a name it cannot use is refused before any record exists.
        signal_number(value)
        return value


class ArtifactSettings(_Group):
    """Where the local artifact goes."""

    output_dir: Path = Field(
        Path("soak-output"),
        description="Local output: artifacts, and locally the run, progress and deadline dirs. "
        "Default ./soak-output.",
    )


class RedactionSettings(_Group):
    """Secrets in the trainer's command line, redacted wherever it is stored or printed (docs/security.md)."""

    extra_words: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More words that make a flag or NAME=value secret when its name ends in one "
        "(built in: key, token, password, secret, credential(s), auth, ...). JSON list. Default [].",
    )
    extra_patterns: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More regular expressions whose matches are redacted anywhere in an argument "
        "(built in: hf_, sk-, ghp_, AKIA, ... tokens). JSON list. Default [].",
    )

    @field_validator("extra_words")
    @classmethod
    def _words(cls, value: list[str]) -> list[str]:
        for word in value:
            if not re.fullmatch(r"[A-Za-z0-9]{1,64}", word):
                raise ValueError(f"redaction word {word!r} must be 1-64 letters or digits")
        return value

    @field_validator("extra_patterns")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or len(pattern) > 500:
                raise ValueError("a redaction pattern must be 1-500 characters")
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"redaction pattern {pattern!r} is not a regular expression: {exc}") from exc
            if compiled.match(""):
                raise ValueError(f"redaction pattern {pattern!r} matches the empty string")
        return value

    def rules(self) -> RedactionRules:
        return RedactionRules(
            extra_words=frozenset(self.extra_words), extra_patterns=tuple(self.extra_patterns)
        )


class S3Settings(_Group):
    """Artifact upload and the S3 deadline store (upload is on when bucket is set)."""

    bucket: str | None = Field(None, description="Bucket name; unset disables upload. Default none.")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint URL. Default AWS.")
    region: str | None = Field(None, description="Region name. Default from the AWS chain.")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="Bucket addressing. Default auto."
    )
    prefix: str = Field("soak", description="First key segment. Default soak.")
    credentials_dir: Path | None = Field(
        None,
        description="Directory with files access-key-id, secret-access-key and optionally "
        "session-token (a mounted Secret), re-read as they rotate; replaces AWS_* environment "
        "credentials. Default none (boto3's chain).",
    )
    key_template: str = Field(
        "{prefix}/{namespace}/{job}/{run_id}/{attempt}-{pod}/",
        description="Artifact key prefix template. "
        "Default {prefix}/{namespace}/{job}/{run_id}/{attempt}-{pod}/.",
    )
    max_attempts: int = Field(
        5,
        ge=1,
        le=20,
        description="Attempts per S3 request, the first included ('standard' retry mode). Default 5.",
    )
    connect_timeout_s: float = Field(5.0, gt=0, le=DAY_S, description="Connect timeout, seconds. Default 5.")
    read_timeout_s: float = Field(30.0, gt=0, le=DAY_S, description="Read timeout, seconds. Default 30.")
    multipart_threshold_bytes: int = Field(
        16 * 1024 * 1024,
        ge=5 * 1024 * 1024,
        le=MAX_BYTES,
        description="Multipart above this size, bytes. Default 16 MiB.",
    )
    multipart_chunk_bytes: int = Field(
        16 * 1024 * 1024,
        ge=5 * 1024 * 1024,
        le=5 * 1024**3,
        description="Multipart part size, bytes. Default 16 MiB.",
    )
    sse: str | None = Field(None, description="ServerSideEncryption (AES256, aws:kms). Default none.")
    sse_kms_key_id: str | None = Field(None, description="KMS key id for aws:kms. Default none.")
    storage_class: str | None = Field(None, description="Storage class. Default bucket default.")
    checksum_when_required: bool = Field(
        False,
        description="Send integrity headers only when required (for stores that reject boto3's "
        "defaults). Default false.",
    )
    deadline_prefix: str = Field(
        "soak-deadlines", description="Key prefix of the S3 deadline store. Default soak-deadlines."
    )
    multipart_concurrency: int = Field(
        4,
        ge=1,
        le=32,
        description="Parts uploaded in parallel (memory: this times the part size). Default 4.",
    )
    lock_lease_s: float = Field(
        30.0,
        gt=0,
        le=DAY_S,
        description="S3 supervisor lock lease, seconds: a lease not renewed for this long "
        "(judged on the waiter's own monotonic clock) may be taken over. Default 30.",
    )
    lock_renew_interval_s: float = Field(
        10.0,
        ge=MIN_INTERVAL_S,
        le=DAY_S,
        description="Seconds between renewals of the S3 lock lease. Default 10.",
    )

    @model_validator(mode="after")
    def _check_s3(self) -> S3Settings:
        # Imported here to keep the import inside this group; keys depends on errors only.
        from sidecar.core.keys import render_key_prefix, template_fields, validate_key  # noqa: PLC0415

        try:
            template_fields(self.key_template)
            # Rendered once now with plain values: a template that cannot make a valid key (a ".."
            # segment, say) fails at startup, not at the upload after the run.
            sample = {"prefix": self.prefix, "namespace": "ns", "job": "job", "pod": "pod"}
            render_key_prefix(self.key_template, {**sample, "run_id": "run", "attempt": "1"})
            validate_key(self.prefix)
            validate_key(self.deadline_prefix)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        if self.lock_renew_interval_s * 2 > self.lock_lease_s:
            raise ValueError("lock_renew_interval_s must be at most half of lock_lease_s")
        return self


class KubeSettings(_Group):
    """Pod mode: identity from the downward API and verdict publication."""

    @model_validator(mode="after")
    def _index_in_range(self) -> KubeSettings:
        if self.completion_index is not None and self.completion_index >= self.completions:
            raise ValueError(
                f"completion_index {self.completion_index} is not below completions {self.completions}"
            )
        return self

    pod_name: str | None = Field(None, description="Pod name (downward API POD_NAME). Default none.")
    namespace: str | None = Field(None, description="Pod namespace (POD_NAMESPACE). Default none.")
    pod_uid: str | None = Field(None, description="Pod UID (POD_UID). Default none.")
    trainer_container: str = Field("trainer", description="Name of the trainer container. Default trainer.")
    completion_index: int | None = Field(
        None,
        ge=0,
        le=99_999,
        description="This pod's index in a multi-pod soak (an Indexed Job's completion index, from the "
        "downward API): its own lock and attempt numbers, the run's one deadline. Default none.",
    )
    completions: int = Field(
        1, ge=1, le=100_000, description="Pods of the soak (an Indexed Job's completions). Default 1."
    )
    annotation_prefix: str = Field(
        "soak.sidecar.io/", description="Annotation key prefix. Default soak.sidecar.io/."
    )
    publish_events: bool = Field(True, description="Emit a Kubernetes Event with the verdict. Default true.")
    progress_annotations_s: float = Field(
        0.0,
        ge=0,
        le=DAY_S,
        description="Minimum seconds between progress annotations; 0 disables. Default 0.",
    )
    termination_log: Path = Field(
        Path("/dev/termination-log"),
        description="Termination message file. Default /dev/termination-log.",
    )
    api_retries: int = Field(5, ge=0, le=100, description="Retries on 409/429/5xx. Default 5.")
    api_backoff_s: float = Field(
        0.5,
        gt=0,
        le=DAY_S,
        description="First retry delay, doubling up to 8 s (Retry-After wins). Default 0.5.",
    )
    request_timeout_s: float = Field(
        10.0, gt=0, le=DAY_S, description="Per-request API timeout, seconds. Default 10."
    )
    kubeconfig: Path | None = Field(
        None,
        description="Kubeconfig to use instead of the in-cluster service account. Default none.",
    )
    sidecar_container: str = Field(
        "soak-sidecar",
        description="Name of the sidecar container (its Events' field path). Default soak-sidecar.",
    )

    @field_validator("annotation_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        try:
            return normalize_prefix(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc


class GpuSettings(_Group):
    """GPU sampling."""

    backend: Literal["auto", "nvml", "mock", "none"] = Field(
        "auto", description="auto: NVML when the library loads, else no GPU data. Default auto."
    )
    require: bool = Field(False, description="Fail when GPU data is unavailable. Default false.")
    devices: list[str] | None = Field(
        None,
        description="Explicit device indices/UUIDs. Default: the trainer's NVIDIA_VISIBLE_DEVICES.",
    )
    mock_library_dir: Path | None = Field(
        None,
        description="Directory holding the mock libnvidia-ml.so.1 (backend mock). Default: built "
        "with gcc on first use into $XDG_CACHE_HOME/soak-sidecar/nvml-mock.",
    )
    mock_scenario: Path | None = Field(
        None,
        description="Scenario JSON for the mock library (docs/nvml-mock.md); required by backend "
        "mock. Default none.",
    )
    max_memory_growth_mib: float | None = Field(
        None,
        ge=0,
        le=MAX_MIB,
        description="Fail (resource_leak) when a device's used memory grows more than this, MiB. "
        "Default off.",
    )
    process_interval_s: float = Field(
        15.0,
        ge=MIN_INTERVAL_S,
        le=DAY_S,
        description="Seconds between (expensive) per-process NVML queries. Default 15.",
    )
    fail_on_slowdown_s: float | None = Field(
        None,
        gt=0,
        le=DAY_S,
        description="Seconds of unbroken hardware slowdown (HW slowdown, HW thermal, power brake) that "
        "make a GPU fault (150, retried on another node). Default none: reported, never a failure.",
    )

    @model_validator(mode="after")
    def _backend_consistent(self) -> GpuSettings:
        if self.require and self.backend == "none":
            raise ValueError("require needs a GPU backend other than none")
        if self.backend == "mock" and self.mock_scenario is None:
            raise ValueError("backend mock needs mock_scenario (--gpu-scenario or SOAK_GPU__MOCK_SCENARIO)")
        return self


class MetricsSettings(_Group):
    """Prometheus metrics while the sidecar runs (docs/observability.md)."""

    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Serve /metrics on this TCP port; 0 serves none. Default 0 (the chart: 9400).",
    )
    address: str = Field(
        "127.0.0.1",
        pattern=r"^[0-9a-fA-F.:]{2,45}$",
        description="Address the metrics endpoint binds (an IP). Default 127.0.0.1 (the chart: 0.0.0.0).",
    )
    linger_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Seconds the endpoint stays up after the verdict, so a scrape sees soak_verdict_info. "
        "Default 0.",
    )


class Settings(BaseSettings):
    """Everything soak-sidecar can be told. Env: ``SOAK_<GROUP>__<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="SOAK_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    summary: SummarySettings = Field(default_factory=SummarySettings)
    deadline: DeadlineSettings = Field(default_factory=DeadlineSettings)
    launcher: LauncherSettings = Field(default_factory=LauncherSettings)
    artifact: ArtifactSettings = Field(default_factory=ArtifactSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment plus explicit overrides; one clear error line."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc
