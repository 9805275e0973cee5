"""What a report reads of an artifact and of each sample (pure): the one parser of both.

Both are untrusted input (whoever can write the directory or the bucket can edit them). The JSON is
parsed without NaN or Infinity, and a nesting deep enough to exhaust the parser's stack is an error;
then every field the report draws or prints is checked for its type and range here, so the renderer
(:mod:`sidecar.core.report`) meets only strings and finite numbers it can scale and format. Anything
else is a ``ConfigError`` naming the field: one line, exit 64.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.core.artifact.lost import describe_lost
from sidecar.core.artifact.models import PROVISIONAL_STATUSES, LostAttempt
from sidecar.core.errors import ConfigError
from sidecar.core.report_fields import (
    MAX_NUMBER,
    as_list,
    as_object,
    clip,
    console_file,
    got,
    integer,
    number,
    optional_number,
    optional_text,
    recorded_sha256,
    samples_file,
    text,
)
from sidecar.core.report_samples import load_json

# The launcher's stop_times_unix names, as the plots label them.
STOP_LABELS = {"soft_stop": "soft stop", "term": "TERM", "kill": "KILL"}


@dataclass(frozen=True)
class Trend:
    series: str
    unit: str
    per_hour: float
    low_per_hour: float
    high_per_hour: float
    points: int


@dataclass(frozen=True)
class Residual:
    pid: int
    fate: str
    command: str


@dataclass(frozen=True)
class StackView:
    """One process's Python stack at a stall, or why there is none."""

    pid: int
    command: str
    stack: str | None
    missing: str | None


@dataclass(frozen=True)
class Stacks:
    """A stall's stacks (the launcher's stacks.json) or, with no processes, why they are missing."""

    processes: tuple[StackView, ...]
    missing: str | None = None


@dataclass(frozen=True)
class TrainerEnd:
    """How the trainer ended, as the launcher recorded it (exit.json)."""

    reason: str  # the launcher's: exited, deadline, heartbeat_lost, control, signalled, ...
    returncode: int | None
    signal_name: str | None
    ended_unix: float | None


@dataclass(frozen=True)
class ReportArtifact:
    """The fields of an artifact the report shows."""

    status: str
    run_id: str
    classification: str | None
    exit_code: int | None
    reason: str | None
    started_at: str | None
    duration_s: float
    deadline_unix: float | None
    # When the soft stop, the first TERM and the first KILL went to the trainer: (name, Unix time).
    stop_times: tuple[tuple[str, float], ...]
    trends: tuple[Trend, ...]
    gpu_trends: tuple[Trend, ...]  # per-GPU degradation (sidecar/core/gpu_trends.py)
    gpu_left: tuple[str, ...]  # what the run left on its GPUs (sidecar/core/gpu_clean.py)
    residuals: tuple[Residual, ...]
    figures: tuple[tuple[str, str | int | float | bool | None], ...]
    samples_file: str | None  # None: the trainer never ran, no samples
    command: tuple[str, ...] = ()  # redacted by the sidecar
    trainer_end: TrainerEnd | None = None
    console_file: str | None = None  # the console log's copy beside the artifact
    stacks: Stacks | None = None  # None: no stall asked for them
    # Earlier attempts that ended without a verdict, one line each (sidecar.core.artifact.lost).
    lost_attempts: tuple[str, ...] = ()
    # Where the attempt's time went: (phase, seconds) in order; None for an artifact without them.
    phases: tuple[tuple[str, float, float], ...] | None = None  # (kind, start_unix, seconds)
    lost_work_known: bool = True
    # Which attempt (and index) of which deadline: what a run's page orders and sums them by.
    attempt: int | None = None
    index: int | None = None
    deadline_started_unix: float | None = None
    # What the phases say of the lost work: a checkpoint's step, or why it is not known.
    checkpoint_note: str | None = None
    # When the newest piece of a partial attempt's evidence was written (set by the source).
    last_evidence_unix: float | None = None
    # The SHA-256 (hex) the artifact recorded of each object it names: the uploaded files, their
    # segments, the samples file; what a reader compares the bytes it reads with.
    recorded_sha256: tuple[tuple[str, str], ...] = ()
    # The store did not confirm the checksums of the uploads (s3.accept_unverified_checksums).
    checksums_unverified: bool = False
    # The trainer's mean steps per second (its progress records) and the node: the slow index's.
    steps_per_s: float | None = None
    node: str | None = None

    def sha256_of(self, name: str) -> str | None:
        return dict(self.recorded_sha256).get(name)

    @property
    def partial(self) -> bool:
        """A provisional artifact: the attempt is running, or ended without a verdict."""
        return self.status in PROVISIONAL_STATUSES


def parse_artifact(data: bytes, where: str) -> ReportArtifact:
    """The artifact at ``where`` (named in errors) from its bytes."""
    doc = load_json(data, where)
    if not isinstance(doc, dict) or "status" not in doc:
        raise ConfigError(f"{where} is not a soak-sidecar artifact")
    try:
        return _artifact(doc)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _artifact(doc: Mapping[str, object]) -> ReportArtifact:
    post = as_object(doc.get("post_shutdown"), "post_shutdown")
    launcher = as_object(post.get("launcher_exit"), "post_shutdown.launcher_exit")
    stops = as_object(launcher.get("stop_times_unix"), "post_shutdown.launcher_exit.stop_times_unix")
    summary = as_object(doc.get("resource_summary"), "resource_summary")
    trends = as_list(summary.get("trends"), "resource_summary.trends")
    gpu_trends = as_list(summary.get("gpu_trends"), "resource_summary.gpu_trends")
    residuals = as_list(post.get("residual_processes"), "post_shutdown.residual_processes")
    return ReportArtifact(
        status=text(doc["status"], "status"),
        run_id=optional_text(as_object(doc.get("context"), "context").get("run_id"), "context.run_id") or "",
        classification=optional_text(doc.get("failure_classification"), "failure_classification"),
        exit_code=None if doc.get("exit_code") is None else integer(doc["exit_code"], "exit_code"),
        reason=optional_text(doc.get("failure_reason"), "failure_reason"),
        started_at=optional_text(doc.get("started_at_utc"), "started_at_utc"),
        duration_s=optional_number(doc.get("duration_s"), "duration_s") or 0.0,
        deadline_unix=optional_number(
            as_object(doc.get("deadline"), "deadline").get("deadline_unix"), "deadline.deadline_unix"
        ),
        deadline_started_unix=optional_number(
            as_object(doc.get("deadline"), "deadline").get("started_unix"), "deadline.started_unix"
        ),
        attempt=_optional_integer(as_object(doc.get("context"), "context").get("attempt"), "context.attempt"),
        index=_optional_integer(as_object(doc.get("context"), "context").get("index"), "context.index"),
        stop_times=tuple(
            (name, number(stops[name], f"post_shutdown.launcher_exit.stop_times_unix.{name}"))
            for name in STOP_LABELS
            if stops.get(name) is not None
        ),
        trends=tuple(_trend(trend, f"resource_summary.trends[{n}]") for n, trend in enumerate(trends)),
        gpu_trends=tuple(
            _trend(trend, f"resource_summary.gpu_trends[{n}]") for n, trend in enumerate(gpu_trends)
        ),
        gpu_left=tuple(
            text(item, "resource_summary.gpu_left[]")
            for item in as_list(summary.get("gpu_left"), "resource_summary.gpu_left")
        ),
        residuals=tuple(_residual(process, n) for n, process in enumerate(residuals)),
        figures=tuple(sorted(_figures(summary.get("run_summary_figures")).items())),
        samples_file=samples_file(as_object(doc.get("samples"), "samples").get("samples_file")),
        command=tuple(text(part, "command[]") for part in as_list(doc.get("command"), "command")),
        trainer_end=_trainer_end(launcher),
        console_file=console_file(doc.get("console_log")),
        stacks=_stacks(doc.get("stacks")),
        **_phases(doc.get("phases")),
        lost_attempts=tuple(
            _lost(item, n) for n, item in enumerate(as_list(doc.get("lost_attempts", []), "lost_attempts"))
        ),
        recorded_sha256=recorded_sha256(doc),
        checksums_unverified=as_object(doc.get("upload"), "upload").get("checksums_unverified") is True,
        steps_per_s=optional_number(_progress(summary).get("mean_steps_per_s"), "progress.mean_steps_per_s"),
        node=optional_text(as_object(doc.get("context"), "context").get("node"), "context.node"),
    )


def _progress(summary: Mapping[str, object]) -> Mapping[str, object]:
    found = summary.get("progress")
    return {} if found is None else as_object(found, "resource_summary.progress")


def _phases(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    info = as_object(value, "phases")
    items = [
        as_object(item, f"phases.phases[{n}]")
        for n, item in enumerate(as_list(info.get("phases"), "phases.phases"))
    ]
    checkpoint = info.get("checkpoint")
    note = None
    if checkpoint is not None:
        step = integer(as_object(checkpoint, "phases.checkpoint").get("step"), "phases.checkpoint.step")
        note = f"last checkpoint reported: step {step}"
    elif info.get("lost_work_known") is False:
        note = "no checkpoint reported: the work lost is not known"
    phases = tuple(
        (
            text(i.get("kind"), "phases kind"),
            number(i.get("start_unix"), "phases start_unix"),
            number(i.get("seconds"), "phases seconds"),
        )
        for i in items
    )
    return {
        "phases": phases,
        "checkpoint_note": note,
        "lost_work_known": info.get("lost_work_known") is not False,
    }


def _optional_integer(value: object, where: str) -> int | None:
    return None if value is None else integer(value, where)


def _lost(value: object, n: int) -> str:
    where = f"lost_attempts[{n}]"
    item = as_object(value, where)
    attempt = LostAttempt(
        attempt=integer(item.get("attempt"), f"{where}.attempt"),
        status=text(item.get("status"), f"{where}.status"),
        reason=optional_text(item.get("reason"), f"{where}.reason"),
        last_evidence_at_utc=optional_text(item.get("last_evidence_at_utc"), f"{where}.last_evidence_at_utc"),
        evidence=text(item.get("evidence"), f"{where}.evidence"),
    )
    return describe_lost(attempt)


def _stacks(value: object) -> Stacks | None:
    if value is None:
        return None
    stacks = as_object(value, "stacks")
    views = []
    for n, item in enumerate(as_list(stacks.get("processes", []), "stacks.processes")):
        where = f"stacks.processes[{n}]"
        process = as_object(item, where)
        command = as_list(process.get("command", []), f"{where}.command")
        views.append(
            StackView(
                pid=integer(process.get("pid"), f"{where}.pid"),
                command=" ".join(text(part, f"{where}.command[]") for part in command),
                stack=optional_text(process.get("stack"), f"{where}.stack"),
                missing=optional_text(process.get("missing"), f"{where}.missing"),
            )
        )
    return Stacks(tuple(views), optional_text(stacks.get("missing"), "stacks.missing"))


def _trainer_end(launcher: Mapping[str, object]) -> TrainerEnd | None:
    where = "post_shutdown.launcher_exit"
    if launcher.get("reason") is None:
        return None
    returncode = launcher.get("returncode")
    return TrainerEnd(
        reason=text(launcher["reason"], f"{where}.reason"),
        returncode=None if returncode is None else integer(returncode, f"{where}.returncode"),
        signal_name=optional_text(launcher.get("signal_name"), f"{where}.signal_name"),
        ended_unix=optional_number(launcher.get("ended_unix"), f"{where}.ended_unix"),
    )


def _trend(value: object, where: str) -> Trend:
    trend = as_object(value, where)
    return Trend(
        series=text(trend.get("series"), f"{where}.series"),
        unit=text(trend.get("unit"), f"{where}.unit"),
        per_hour=number(trend.get("per_hour"), f"{where}.per_hour", low=-MAX_NUMBER),
        low_per_hour=number(trend.get("low_per_hour"), f"{where}.low_per_hour", low=-MAX_NUMBER),
        high_per_hour=number(trend.get("high_per_hour"), f"{where}.high_per_hour", low=-MAX_NUMBER),
        points=integer(trend.get("points"), f"{where}.points"),
    )


def _residual(value: object, n: int) -> Residual:
    where = f"post_shutdown.residual_processes[{n}]"
    process = as_object(value, where)
    return Residual(
        pid=integer(process.get("pid"), f"{where}.pid"),
        fate=text(process.get("fate"), f"{where}.fate"),
        command=text(process.get("command"), f"{where}.command"),
    )


def _figures(value: object) -> dict[str, str | int | float | bool | None]:
    """The run summary figures: scalars only (the sidecar writes no others)."""
    figures: dict[str, str | int | float | bool | None] = {}
    for name, figure in as_object(value, "resource_summary.run_summary_figures").items():
        if figure is not None and not isinstance(figure, (str, int, float, bool)):
            where = f"resource_summary.run_summary_figures[{clip(name)!r}]"
            raise ConfigError(f"{where} must be a number or text, got {got(figure)}")
        figures[name] = figure
    return figures
