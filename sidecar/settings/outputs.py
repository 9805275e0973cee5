"""Where a run's results go and what the sidecar talks to: artifact, redaction, S3, Kubernetes, GPUs,
metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sidecar.core.errors import ConfigError
from sidecar.core.publication import normalize_prefix
from sidecar.core.redaction import RedactionRules
from sidecar.settings.base import DAY_S, MAX_BYTES, MAX_MIB, MIN_INTERVAL_S, Group


class ArtifactSettings(Group):
    """Where the local artifact goes."""

    output_dir: Path = Field(
        Path("soak-output"),
        description="Local output: artifacts, and locally the run, progress and deadline dirs. "
        "Default ./soak-output.",
    )


class EvidenceSettings(Group):
    """Evidence on its way out while the trainer runs, so a hard stop loses little (docs/artifact.md)."""

    flush_s: float = Field(
        300.0,
        ge=0.1,
        le=DAY_S,
        description="Seconds between uploads of the new samples and console output as segments (objects "
        "never rewritten); a hard stop loses at most this much in S3. Default 300.",
    )


class RedactionSettings(Group):
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
        "(built in: hf_, sk-, ghp_, AKIA, ... tokens). JSON list. Default []. Each runs on every "
        "argument (cut to 4096 characters) of every process of the trainer's tree at every sample, "
        "and the trainer chooses those arguments: write patterns that match in linear time (no "
        "nested or overlapping repeats such as (a+)+ or (a|a)*). Only that they compile is checked.",
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


class S3Settings(Group):
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
    accept_unverified_checksums: bool = Field(
        False,
        description="Use a store that does not check and echo the SHA-256 sent with each upload "
        "(x-amz-checksum-sha256): every upload is then recorded as unverified in the artifact and "
        "the report. Default false: such a store is refused before the trainer starts.",
    )
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


class KubeSettings(Group):
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
    exit_status_wait_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description=(
            "Seconds to wait, once the launcher has exited, for the kubelet to report the trainer "
            "container's terminated state, which exit.json is held to; a record it never confirms "
            "fails the soak. Default 30."
        ),
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


class GpuSettings(Group):
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
        description="Scenario JSON for the mock library (docs/nvml-mock.md); --gpu-scenario also takes a "
        "bundled one by name: two_gpus_growing, old_driver_host_pids, xid79_fallen_off_bus, gpu_lost, "
        "reset_required, hw_slowdown, gpu_memory_leak, correctable_errors_growing, gpu_left_dirty, "
        "gpu_needs_reset, "
        "xid31_trainer_fault (docs/gpu-health.md). Required "
        "by backend mock, and implies it when no backend is set. Default none.",
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
    clean_tolerance_mib: float = Field(
        256.0,
        ge=0,
        le=MAX_MIB,
        description="MiB of device memory above its level before the soak that a GPU may still hold, with "
        "no process listed, once the trainer's tree is gone. Default 256.",
    )
    fail_on_dirty_gpu: bool = Field(
        False,
        description="Fail a soak that left a GPU dirty: a process of the run still listed (a leak, 13), "
        "memory not returned or a reset pending (a GPU fault, 150). Default false: reported only.",
    )
    fail_on_correctable_growth: bool = Field(
        False,
        description="Make a GPU fault (150, retried on another node) of a device whose correctable errors "
        "(remapped rows, PCIe replays) grow steadily during the soak. Default false: reported only.",
    )

    @model_validator(mode="after")
    def _backend_consistent(self) -> GpuSettings:
        if self.require and self.backend == "none":
            raise ValueError("require needs a GPU backend other than none")
        if self.backend == "mock" and self.mock_scenario is None:
            raise ValueError("backend mock needs mock_scenario (--gpu-scenario or SOAK_GPU__MOCK_SCENARIO)")
        if self.mock_scenario is not None and self.backend != "mock":
            if "backend" in self.model_fields_set:
                raise ValueError(f"mock_scenario is for backend mock, not {self.backend}")
            self.backend = "mock"  # a scenario alone means the mock: never silently ignored
        return self


class MetricsSettings(Group):
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
