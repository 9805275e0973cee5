"""What a report reads of an artifact and of each sample (pure): the one parser of both.

Both are untrusted input (whoever can write the directory or the bucket can edit them). The JSON is
parsed without NaN or Infinity, and a nesting deep enough to exhaust the parser's stack is an error;
then every field the report draws or prints is checked for its type and range here, so the renderer
(:mod:`sidecar.core.report`) meets only strings and finite numbers it can scale and format. Anything
else is a ``ConfigError`` naming the field: one line, exit 64.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.core.artifact.lost import describe_lost
from sidecar.core.artifact.models import PROVISIONAL_STATUSES, LostAttempt
from sidecar.core.errors import ConfigError

# Every number the report uses lies within this bound (10**400 or 1e999 do not): the plots' scaling
# and the labels' formatting stay finite. Times, counts, bytes and MiB are also never negative.
MAX_NUMBER = 2.0**63
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
    phases: tuple[tuple[str, float], ...] | None = None
    # What the phases say of the lost work: a checkpoint's step, or why it is not known.
    checkpoint_note: str | None = None
    # When the newest piece of a partial attempt's evidence was written (set by the source).
    last_evidence_unix: float | None = None

    @property
    def partial(self) -> bool:
        """A provisional artifact: the attempt is running, or ended without a verdict."""
        return self.status in PROVISIONAL_STATUSES


@dataclass(frozen=True)
class ReportSample:
    """One sample as the plots draw it; absent figures read as 0, as the sidecar writes them."""

    t_wall: float
    rss_kib: float
    fd_classes: tuple[tuple[str, float], ...]
    processes: float
    zombies: float
    gpu_used_mib: tuple[tuple[str, float], ...]  # (device label, memory used)
    progress_bytes: float


def _refuse_constant(token: str) -> float:
    raise ValueError(f"{token} is not a finite number")


# One decoder for every line: json.loads with an argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def load_json(data: bytes, where: str) -> object:
    """``data`` as JSON without NaN or Infinity; a ConfigError (never a RecursionError) otherwise."""
    try:
        return _DECODER.decode(data.decode("utf-8"))
    except RecursionError as exc:
        raise ConfigError(f"{where} is nested too deeply to parse") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers over Python's digit limit
        raise ConfigError(f"{where} is not valid JSON: {_clip(str(exc))}") from exc


def parse_artifact(data: bytes, where: str) -> ReportArtifact:
    """The artifact at ``where`` (named in errors) from its bytes."""
    doc = load_json(data, where)
    if not isinstance(doc, dict) or "status" not in doc:
        raise ConfigError(f"{where} is not a soak-sidecar artifact")
    try:
        return _artifact(doc)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def parse_sample(line: bytes) -> ReportSample:
    """One line of samples.jsonl.gz; a ConfigError for a line the report cannot draw."""
    doc = _object(load_json(line, "sample"), "sample")
    tree = _object(doc.get("process"), "process")
    gpu_used: list[tuple[str, float]] = []
    for device in _list(_object(doc.get("gpu"), "gpu").get("devices"), "gpu.devices"):
        reading = _device(_object(device, "gpu device"))
        if reading is not None:
            gpu_used.append(reading)
    return ReportSample(
        t_wall=_number(doc.get("t_wall"), "t_wall"),
        rss_kib=_number(tree.get("rss_kib_total", 0), "rss_kib_total"),
        fd_classes=tuple(
            (name, _number(count, "fd_classes_total"))
            for name, count in _object(tree.get("fd_classes_total"), "fd_classes_total").items()
        ),
        processes=_number(tree.get("process_count", 0), "process_count"),
        zombies=_number(tree.get("zombie_count", 0), "zombie_count"),
        gpu_used_mib=tuple(gpu_used),
        progress_bytes=_number(_object(doc.get("progress"), "progress").get("bytes_total", 0), "bytes_total"),
    )


def _artifact(doc: Mapping[str, object]) -> ReportArtifact:
    post = _object(doc.get("post_shutdown"), "post_shutdown")
    launcher = _object(post.get("launcher_exit"), "post_shutdown.launcher_exit")
    stops = _object(launcher.get("stop_times_unix"), "post_shutdown.launcher_exit.stop_times_unix")
    summary = _object(doc.get("resource_summary"), "resource_summary")
    trends = _list(summary.get("trends"), "resource_summary.trends")
    residuals = _list(post.get("residual_processes"), "post_shutdown.residual_processes")
    return ReportArtifact(
        status=_text(doc["status"], "status"),
        run_id=_optional_text(_object(doc.get("context"), "context").get("run_id"), "context.run_id") or "",
        classification=_optional_text(doc.get("failure_classification"), "failure_classification"),
        exit_code=None if doc.get("exit_code") is None else _integer(doc["exit_code"], "exit_code"),
        reason=_optional_text(doc.get("failure_reason"), "failure_reason"),
        started_at=_optional_text(doc.get("started_at_utc"), "started_at_utc"),
        duration_s=_optional_number(doc.get("duration_s"), "duration_s") or 0.0,
        deadline_unix=_optional_number(
            _object(doc.get("deadline"), "deadline").get("deadline_unix"), "deadline.deadline_unix"
        ),
        stop_times=tuple(
            (name, _number(stops[name], f"post_shutdown.launcher_exit.stop_times_unix.{name}"))
            for name in STOP_LABELS
            if stops.get(name) is not None
        ),
        trends=tuple(_trend(trend, n) for n, trend in enumerate(trends)),
        residuals=tuple(_residual(process, n) for n, process in enumerate(residuals)),
        figures=tuple(sorted(_figures(summary.get("run_summary_figures")).items())),
        samples_file=_samples_file(_object(doc.get("samples"), "samples").get("samples_file")),
        command=tuple(_text(part, "command[]") for part in _list(doc.get("command"), "command")),
        trainer_end=_trainer_end(launcher),
        console_file=_console_file(doc.get("console_log")),
        stacks=_stacks(doc.get("stacks")),
        **_phases(doc.get("phases")),
        lost_attempts=tuple(
            _lost(item, n) for n, item in enumerate(_list(doc.get("lost_attempts", []), "lost_attempts"))
        ),
    )


def _phases(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    info = _object(value, "phases")
    items = [
        _object(item, f"phases.phases[{n}]")
        for n, item in enumerate(_list(info.get("phases"), "phases.phases"))
    ]
    checkpoint = info.get("checkpoint")
    note = None
    if checkpoint is not None:
        step = _integer(_object(checkpoint, "phases.checkpoint").get("step"), "phases.checkpoint.step")
        note = f"last checkpoint reported: step {step}"
    elif info.get("lost_work_known") is False:
        note = "no checkpoint reported: the work lost is not known"
    phases = tuple(
        (_text(i.get("kind"), "phases kind"), _number(i.get("seconds"), "phases seconds")) for i in items
    )
    return {"phases": phases, "checkpoint_note": note}


def _lost(value: object, n: int) -> str:
    where = f"lost_attempts[{n}]"
    item = _object(value, where)
    attempt = LostAttempt(
        attempt=_integer(item.get("attempt"), f"{where}.attempt"),
        status=_text(item.get("status"), f"{where}.status"),
        reason=_optional_text(item.get("reason"), f"{where}.reason"),
        last_evidence_at_utc=_optional_text(
            item.get("last_evidence_at_utc"), f"{where}.last_evidence_at_utc"
        ),
        evidence=_text(item.get("evidence"), f"{where}.evidence"),
    )
    return describe_lost(attempt)


def _stacks(value: object) -> Stacks | None:
    if value is None:
        return None
    stacks = _object(value, "stacks")
    views = []
    for n, item in enumerate(_list(stacks.get("processes", []), "stacks.processes")):
        where = f"stacks.processes[{n}]"
        process = _object(item, where)
        command = _list(process.get("command", []), f"{where}.command")
        views.append(
            StackView(
                pid=_integer(process.get("pid"), f"{where}.pid"),
                command=" ".join(_text(part, f"{where}.command[]") for part in command),
                stack=_optional_text(process.get("stack"), f"{where}.stack"),
                missing=_optional_text(process.get("missing"), f"{where}.missing"),
            )
        )
    return Stacks(tuple(views), _optional_text(stacks.get("missing"), "stacks.missing"))


def _trainer_end(launcher: Mapping[str, object]) -> TrainerEnd | None:
    where = "post_shutdown.launcher_exit"
    if launcher.get("reason") is None:
        return None
    returncode = launcher.get("returncode")
    return TrainerEnd(
        reason=_text(launcher["reason"], f"{where}.reason"),
        returncode=None if returncode is None else _integer(returncode, f"{where}.returncode"),
        signal_name=_optional_text(launcher.get("signal_name"), f"{where}.signal_name"),
        ended_unix=_optional_number(launcher.get("ended_unix"), f"{where}.ended_unix"),
    )


def _console_file(path: object) -> str | None:
    """The name of the console log's copy in the attempt's directory (the artifact holds the path it
    had on the node); None when there is none or the name could leave that directory."""
    name = _optional_text(path, "console_log")
    base = None if name is None else name.rsplit("/", 1)[-1]
    return base if base and not base.startswith(".") else None


def _trend(value: object, n: int) -> Trend:
    where = f"resource_summary.trends[{n}]"
    trend = _object(value, where)
    return Trend(
        series=_text(trend.get("series"), f"{where}.series"),
        unit=_text(trend.get("unit"), f"{where}.unit"),
        per_hour=_number(trend.get("per_hour"), f"{where}.per_hour", low=-MAX_NUMBER),
        low_per_hour=_number(trend.get("low_per_hour"), f"{where}.low_per_hour", low=-MAX_NUMBER),
        high_per_hour=_number(trend.get("high_per_hour"), f"{where}.high_per_hour", low=-MAX_NUMBER),
        points=_integer(trend.get("points"), f"{where}.points"),
    )


def _residual(value: object, n: int) -> Residual:
    where = f"post_shutdown.residual_processes[{n}]"
    process = _object(value, where)
    return Residual(
        pid=_integer(process.get("pid"), f"{where}.pid"),
        fate=_text(process.get("fate"), f"{where}.fate"),
        command=_text(process.get("command"), f"{where}.command"),
    )


def _figures(value: object) -> dict[str, str | int | float | bool | None]:
    """The run summary figures: scalars only (the sidecar writes no others)."""
    figures: dict[str, str | int | float | bool | None] = {}
    for name, figure in _object(value, "resource_summary.run_summary_figures").items():
        if figure is not None and not isinstance(figure, (str, int, float, bool)):
            where = f"resource_summary.run_summary_figures[{_clip(name)!r}]"
            raise ConfigError(f"{where} must be a number or text, got {_got(figure)}")
        figures[name] = figure
    return figures


def _samples_file(name: object) -> str | None:
    """None for an attempt without samples (refused or unable to start: the trainer never ran)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ConfigError(f"samples.samples_file must be a file name beside the artifact, got {_got(name)}")
    return name


def _device(device: Mapping[str, object]) -> tuple[str, float] | None:
    """A device's plot label and memory used; None when it has no reading."""
    used = device.get("memory_used_mib")
    if used is None:
        return None
    index = _integer(device.get("index"), "gpu device index")
    uuid = _text(device.get("uuid", ""), "gpu device uuid")
    return f"GPU {index} {uuid[:12]}", _number(used, "memory_used_mib")


def _object(value: object, where: str) -> Mapping[str, object]:
    """An optional object: absent or null reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object, got {_got(value)}")
    return value


def _list(value: object, where: str) -> list[object]:
    """An optional list: absent or null reads as empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list, got {_got(value)}")
    return value


def _number(value: object, where: str, *, low: float = 0.0) -> float:
    # A bool is no number here. Comparing is exact for ints of any size, and NaN compares false.
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= MAX_NUMBER:
        return float(value)
    raise ConfigError(f"{where} must be a number from {low:g} to {MAX_NUMBER:g}, got {_got(value)}")


def _optional_number(value: object, where: str) -> float | None:
    return None if value is None else _number(value, where)


def _integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_NUMBER:
        raise ConfigError(f"{where} must be an integer within {MAX_NUMBER:g}, got {_got(value)}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be text, got {_got(value)}")
    return value


def _optional_text(value: object, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _clip(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:77]}..."


def _got(value: object) -> str:
    """A value as an error shows it: short, and never a walk of a deeply nested one."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(_clip(value))
    return _clip(repr(value))
