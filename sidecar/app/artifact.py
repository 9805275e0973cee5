"""The artifact: the verdict with every piece of evidence behind it, self-contained."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.app.ports import ArtifactFiles, Ports
from sidecar.app.values import Launched, Preflight, Started
from sidecar.core import verdict as verdicts
from sidecar.core.artifact import (
    Artifact,
    AttemptPhasesInfo,
    CheckpointInfo,
    DeadlineInfo,
    MonitorConfig,
    PhaseInfo,
    PostShutdown,
    SampleRecorder,
    utc_timestamp,
)
from sidecar.core.artifact.objects import SAMPLES_FILE
from sidecar.core.ledger.moments import ProgressMoments
from sidecar.core.ledger.phases import AttemptMarks, attempt_phases
from sidecar.core.pod_facts import PodMoments
from sidecar.core.redaction import redact_command
from sidecar.core.run_summary import SummaryOutcome
from sidecar.core.samples import GpuDevice, ResidualProcess, ShmLeftovers
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.settings import Settings


@dataclass(frozen=True)
class Evidence:
    """What the run left behind beyond the verdict; a run refused before its start has little."""

    started: Started
    launched: Launched | None = None
    preflight: Preflight | None = None
    summary: SummaryOutcome | None = None
    exit_record: ExitRecord | None = None
    # exit.json the kubelet had not confirmed (watched.unconfirmed_record): shown, marked as such.
    unconfirmed_record: ExitRecord | None = None
    residuals: tuple[ResidualProcess, ...] = ()
    duration_s: float = 0.0
    gpu_devices: tuple[GpuDevice, ...] = ()
    trainer_env: Mapping[str, str] = field(default_factory=dict)
    protocol_violations: tuple[str, ...] = ()
    deadline_end: verdicts.DeadlineEnd | None = None
    stacks: Mapping[str, Any] | None = None
    go_unix: float | None = None
    moments: ProgressMoments | None = None
    # The pod's creation, scheduling and container starts (pod mode; a first sidecar only).
    pod: PodMoments | None = None
    # What the trainer's UID left in /dev/shm (None: not looked at).
    shm_left: ShmLeftovers | None = None


def _launcher_exit(evidence: Evidence) -> dict[str, Any] | None:
    if evidence.exit_record is not None:
        return evidence.exit_record.to_json()
    if evidence.unconfirmed_record is not None:
        return {**evidence.unconfirmed_record.to_json(), "confirmed": False}
    return None


def build_artifact(
    settings: Settings,
    ports: Ports,
    files: ArtifactFiles,
    evidence: Evidence,
    *,
    verdict: verdicts.Verdict,
    recorder: SampleRecorder,
) -> Artifact:
    console = files.keep_copies(ports.channel.console_logs())
    artifact = _document(settings, ports, evidence, recorder)
    apply_verdict(artifact, verdict)
    artifact.console_log = str(console[-1].resolve()) if console else None
    if evidence.summary is not None:  # monitoring ran: the samples file is part of the evidence
        artifact.samples = recorder.series(SAMPLES_FILE, files.sha256(SAMPLES_FILE))
        artifact.phases = _phases(evidence, passed=verdict.status == "passed", end=ports.clock.wall())
    return artifact


def _phases(evidence: Evidence, *, passed: bool, end: float) -> AttemptPhasesInfo:
    moments = evidence.moments or ProgressMoments()
    # The phases are the ledger's accounting, never the verdict's: a record the kubelet had not
    # confirmed when a pod was stopped (kept as evidence) still places the stop and the exit.
    record = evidence.exit_record or evidence.unconfirmed_record
    stops = dict(record.stop_times_unix) if record is not None else {}
    pod = evidence.pod if evidence.pod is not None and evidence.pod.created is not None else None
    marks = AttemptMarks(
        start=evidence.started.wall if pod is None or pod.created is None else pod.created,
        start_kind="launcher" if pod is None else "scheduling",
        scheduled=None if pod is None else pod.scheduled,
        containers_started=None if pod is None else pod.containers_started,
        end=end,
        go=evidence.go_unix,
        first_progress=moments.first_progress_unix,
        last_checkpoint=moments.checkpoint_seen_unix,
        stop_requested=stops.get("soft_stop", stops.get("term")),
        soft_stop="soft_stop" in stops,
        trainer_exit=None if record is None else record.ended_unix,
        passed=passed,
    )
    split = attempt_phases(marks)
    checkpoint = moments.checkpoint
    return AttemptPhasesInfo(
        phases=[
            PhaseInfo(kind=p.kind, start_unix=p.start, seconds=round(p.seconds, 6)) for p in split.phases
        ],
        lost_work_known=split.lost_work_known,
        checkpoint=None
        if checkpoint is None or moments.checkpoint_seen_unix is None
        else CheckpointInfo(
            step=checkpoint.step,
            path=checkpoint.path,
            bytes=checkpoint.bytes,
            duration_s=checkpoint.duration_s,
            seen_at_unix=moments.checkpoint_seen_unix,
            records_seen=moments.checkpoints_seen,
        ),
        checkpoint_problem=moments.checkpoint_problem,
    )


def provisional_artifact(settings: Settings, ports: Ports, evidence: Evidence) -> Artifact:
    """The attempt as it starts, without a verdict (status running): what a hard stop leaves."""
    recorder = SampleRecorder(None, settings.monitor.series_points)
    artifact = _document(settings, ports, evidence, recorder)
    artifact.samples = recorder.series(SAMPLES_FILE, None)
    return artifact


def _document(settings: Settings, ports: Ports, evidence: Evidence, recorder: SampleRecorder) -> Artifact:
    """Everything but the verdict (status running) and the files kept beside it."""
    mset, started, summary = settings.monitor, evidence.started, evidence.summary
    request = started.request
    command = evidence.launched.command if evidence.launched else request.command
    if evidence.preflight is not None:  # what the trainer ran: a resumed attempt's resume arguments too
        command = (*command, *evidence.preflight.extra_args)
    rules = settings.redaction.rules()
    return Artifact(
        status="running",
        failure_reason=None,
        failure_classification=None,
        exit_code=None,
        command=list(redact_command(command, rules)),
        context={
            **request.context,
            "mode": request.mode,
            "run_id": request.run_id,
            "attempt": started.attempt,
            # One pod of a multi-pod soak: its index and how many peers share the run's deadline.
            **({} if request.index is None else {"index": request.index, "indexes": request.indexes}),
        },
        started_at_utc=utc_timestamp(started.wall),
        ended_at_utc=utc_timestamp(ports.clock.wall()),
        duration_s=round(evidence.duration_s, 6),
        returncode=None if evidence.exit_record is None else evidence.exit_record.trainer_returncode,
        monitor=MonitorConfig(
            sample_interval_s=mset.sample_interval_s,
            startup_timeout_s=mset.startup_timeout_s,
            stale_progress_s=mset.stale_progress_s,
            post_shutdown_grace_s=mset.post_shutdown_grace_s,
            min_duration_s=mset.min_duration_s,
            sample_count=recorder.count,
        ),
        deadline=_deadline_info(ports, evidence),
        samples=recorder.series(None, None),
        resource_summary=recorder.resource_summary(),
        shutdown=json_safe(dict(summary.shutdown)) if summary and summary.shutdown is not None else None,
        post_shutdown=PostShutdown(
            residual_processes=list(evidence.residuals),
            launcher_exit=_launcher_exit(evidence),
            shm_left=evidence.shm_left,
        ),
        run_summary=json_safe(summary.data) if summary else None,
        console_log=None,
        provenance=_provenance(ports, evidence),
        lost_attempts=list(started.lost_attempts),
        protocol_violations=list(evidence.protocol_violations),
        stacks=None if evidence.stacks is None else dict(evidence.stacks),
    )


def _deadline_info(ports: Ports, evidence: Evidence) -> DeadlineInfo | None:
    if evidence.preflight is None:
        return None
    record, exit_record = evidence.preflight.record, evidence.exit_record
    return DeadlineInfo(
        run_id=evidence.started.request.run_id,
        store=ports.store.location,
        identity_sha256=record.identity_sha256,
        started_unix=record.started_unix,
        deadline_unix=record.deadline_unix,
        budget_s=record.budget_seconds,
        checkpoint_margin_s=record.checkpoint_margin_seconds,
        remaining_at_start_s=evidence.preflight.remaining_at_start_s,
        resumed=evidence.preflight.resumed,
        resumed_from=evidence.preflight.resume_checkpoint,
        expired=evidence.deadline_end == "expired",
        budget_spent=evidence.deadline_end == "budget_spent",
        soft_stop_sent=bool(exit_record and exit_record.soft_stop_sent),
        term_sent=bool(exit_record and exit_record.term_sent),
        kill_sent=bool(exit_record and exit_record.kill_sent),
    )


def _provenance(ports: Ports, evidence: Evidence) -> dict[str, Any]:
    host = ports.provenance.describe()
    env = evidence.trainer_env
    return {
        "source": host["source"],
        "gpu_devices": [device.model_dump() for device in evidence.gpu_devices],
        "software": host["software"],
        "environment": {
            "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES"),
            "NVIDIA_VISIBLE_DEVICES": env.get("NVIDIA_VISIBLE_DEVICES"),
        },
        "host": {
            "hostname": host["hostname"],
            "boot_id": host["boot_id"],
            "launcher": None if evidence.launched is None else evidence.launched.launcher.hostname,
        },
    }


def json_safe(value: Any) -> Any:
    """The trainer's document may hold NaN/Infinity (its parser accepts them): keep them as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def apply_verdict(artifact: Artifact, final: verdicts.Verdict) -> None:
    artifact.status = final.status
    artifact.failure_reason = final.reason
    artifact.failure_classification = final.classification
    artifact.exit_code = int(final.exit_code)
