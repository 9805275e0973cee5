"""The launcher's records as the sidecar reads them (docs/run-dir-protocol.md): typed, validated.

Pure: the run-dir adapter reads the JSON and hands the mapping here; a record of the wrong shape is a
LauncherError, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.errors import LauncherError

MAX_GPU_ENV_VARS = 8
MAX_GPU_ENV_CHARS = 4096
# fds.json bounds: far above any real tree; a report beyond them is the trainer's forgery.
MAX_FD_REPORT_PROCESSES = 20_000
MAX_FD_COUNT = 10_000_000
MAX_FD_CLASSES = 32

# The launcher's reason for the soft stop it sends at the deadline's checkpoint margin.
DEADLINE_SOFT_STOP = "checkpoint_margin"


def _get(raw: object, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if not isinstance(raw, Mapping):
        raise LauncherError(f"run dir record: an entry holding {key} is not an object ({raw!r:.80})")
    value = raw.get(key)
    if value is None and optional:
        return None
    # bool is an int subclass: reject it where a number is expected.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise LauncherError(f"run dir record: {key} has the wrong type ({value!r})")
    if not isinstance(value, kind):
        raise LauncherError(f"run dir record: {key} has the wrong type ({value!r})")
    return value


def _items(raw: Mapping[str, Any], key: str, kind: type) -> tuple[Any, ...]:
    """A list of plain ``kind`` values (never a bool for an int): anything else is a LauncherError."""
    items = _get(raw, key, list, optional=True) or []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, kind):
            problem = f"holds {item!r:.80}, which is not of type {kind.__name__}"
            raise LauncherError(f"run dir record: {key} {problem}")
    return tuple(items)


def _number(raw: Mapping[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = _get(raw, key, (int, float), optional=optional)
    return None if value is None else float(value)


@dataclass(frozen=True)
class LauncherInfo:
    """launcher.json: who the launcher is (PID-reuse-safe through start_ticks and boot_id)."""

    launch_id: str
    pid: int
    start_ticks: int | None
    boot_id: str | None
    hostname: str
    command: tuple[str, ...]
    # Why the command cannot be started ("was not found", "is not executable"); None when it can
    # (or the launcher predates the check).
    command_problem: str | None
    python: str
    python_version: str
    subreaper: bool
    owner_pid: int | None
    go_timeout_s: float
    started_unix: float
    # The launcher's GPU selection variables (the trainer inherits them); {} from older launchers.
    gpu_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> LauncherInfo:
        command = _get(raw, "command", list)
        return cls(
            launch_id=_get(raw, "launch_id", str),
            pid=_get(raw, "pid", int),
            start_ticks=_get(raw, "start_ticks", int, optional=True),
            boot_id=_get(raw, "boot_id", str, optional=True),
            hostname=_get(raw, "hostname", str),
            command=tuple(str(part) for part in command),
            command_problem=_get(raw, "command_problem", str, optional=True),
            python=_get(raw, "python", str),
            python_version=_get(raw, "python_version", str),
            subreaper=_get(raw, "subreaper", bool),
            owner_pid=_get(raw, "owner_pid", int, optional=True),
            go_timeout_s=float(_get(raw, "go_timeout_s", (int, float))),
            started_unix=float(_get(raw, "started_unix", (int, float))),
            gpu_env=_gpu_env(_get(raw, "gpu_env", Mapping, optional=True) or {}),
        )


def _gpu_env(raw: Mapping[str, Any]) -> dict[str, str]:
    if len(raw) > MAX_GPU_ENV_VARS:
        raise LauncherError(f"run dir record: gpu_env holds {len(raw)} variables")
    env = {}
    for name, value in raw.items():
        if not isinstance(value, str) or len(value) > MAX_GPU_ENV_CHARS:
            raise LauncherError(f"run dir record: gpu_env {name!r:.40} is not a short string")
        env[str(name)] = value
    return env


@dataclass(frozen=True)
class TrainerInfo:
    """trainer.json: the trainer's process (leader of its own session and process group)."""

    launch_id: str
    pid: int
    pgid: int
    start_ticks: int | None
    started_unix: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> TrainerInfo:
        return cls(
            launch_id=_get(raw, "launch_id", str),
            pid=_get(raw, "pid", int),
            pgid=_get(raw, "pgid", int),
            start_ticks=_get(raw, "start_ticks", int, optional=True),
            started_unix=float(_get(raw, "started_unix", (int, float))),
        )


@dataclass(frozen=True)
class SoftStopRecord:
    """soft-stop.json: the launcher told the trainer to checkpoint and stop."""

    reason: str
    deadline_unix: float
    sent_unix: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SoftStopRecord:
        return cls(
            reason=_get(raw, "reason", str),
            deadline_unix=float(_get(raw, "deadline_unix", (int, float))),
            sent_unix=float(_get(raw, "sent_unix", (int, float))),
        )


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str


@dataclass(frozen=True)
class ControlAction:
    seq: int
    action: str
    reason: str | None


def _stop_times(raw: Mapping[str, Any]) -> dict[str, float]:
    found = _get(raw, "stop_times_unix", dict, optional=True) or {}
    return {
        name: float(value)
        for name, value in found.items()
        if name in ("soft_stop", "term", "kill")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


@dataclass(frozen=True)
class ExitRecord:
    """exit.json: how the trainer ended and what the launcher had to kill."""

    launch_id: str | None
    exit_code: int
    reason: str
    returncode: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    trainer_pid: int | None = None
    deadline_expired: bool = False
    heartbeat_lost: bool = False
    owner_lost: bool = False
    soft_stop_sent: bool = False
    soft_stop_reason: str | None = None  # DEADLINE_SOFT_STOP, "signal: <name>", "control: <reason>"
    # When the soft stop, the first TERM and the first KILL were sent (wall clock), by those names.
    stop_times_unix: Mapping[str, float] = field(default_factory=dict)
    term_sent: bool = False
    kill_sent: bool = False
    control: tuple[ControlAction, ...] = ()
    signals_forwarded: tuple[str, ...] = ()
    signals_deferred: tuple[str, ...] = ()
    killed_with_trainer: tuple[KilledProcess, ...] = ()
    survivors_killed: tuple[KilledProcess, ...] = ()
    unreaped: tuple[int, ...] = ()
    stdout_dropped_bytes: int = 0
    started_unix: float | None = None
    ended_unix: float | None = None

    @property
    def trainer_started(self) -> bool:
        return self.trainer_pid is not None

    @property
    def trainer_returncode(self) -> int | None:
        """The seed's ``returncode``: negative signal number for a signalled trainer."""
        if not self.trainer_started:
            return None
        if self.returncode is not None:
            return self.returncode
        return -self.signal if self.signal is not None else None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ExitRecord:
        def processes(key: str) -> tuple[KilledProcess, ...]:
            return tuple(
                KilledProcess(pid=_get(item, "pid", int), command=_get(item, "command", str))
                for item in _get(raw, key, list, optional=True) or []
            )

        def flag(key: str) -> bool:
            return bool(_get(raw, key, bool, optional=True))

        reason = _get(raw, "reason", str)
        return cls(
            launch_id=_get(raw, "launch_id", str, optional=True),
            exit_code=_get(raw, "exit_code", int),
            reason=reason,
            returncode=_get(raw, "returncode", int, optional=True),
            signal=_get(raw, "signal", int, optional=True),
            signal_name=_get(raw, "signal_name", str, optional=True),
            trainer_pid=_get(raw, "trainer_pid", int, optional=True),
            deadline_expired=flag("deadline_expired"),
            heartbeat_lost=flag("heartbeat_lost"),
            owner_lost=flag("owner_lost"),
            soft_stop_sent=flag("soft_stop_sent"),
            soft_stop_reason=_get(raw, "soft_stop_reason", str, optional=True),
            stop_times_unix=_stop_times(raw),
            term_sent=flag("term_sent"),
            kill_sent=flag("kill_sent"),
            control=tuple(
                ControlAction(
                    seq=_get(item, "seq", int),
                    action=_get(item, "action", str),
                    reason=_get(item, "reason", str, optional=True),
                )
                for item in _get(raw, "control", list, optional=True) or []
            ),
            signals_forwarded=_items(raw, "signals_forwarded", str),
            signals_deferred=_items(raw, "signals_deferred", str),
            killed_with_trainer=processes("killed_with_trainer"),
            survivors_killed=processes("survivors_killed"),
            unreaped=_items(raw, "unreaped", int),
            stdout_dropped_bytes=_get(raw, "stdout_dropped_bytes", int, optional=True) or 0,
            started_unix=_number(raw, "started_unix", optional=True),
            ended_unix=_number(raw, "ended_unix", optional=True),
        )


@dataclass(frozen=True)
class FdTable:
    """One process's fd count and classes, as the launcher reported them in fds.json."""

    fd_count: int
    fd_classes: Mapping[str, int]


def parse_fd_report(raw: Mapping[str, Any], launch_id: str) -> dict[tuple[int, int], FdTable]:
    """fds.json by (pid, start ticks). The trainer can write the run dir, so this is its word on its
    own fd tables: bounded and typed, and a report of another launch counts as none."""
    if raw.get("launch_id") != launch_id:
        return {}
    entries = _get(raw, "processes", list)
    if len(entries) > MAX_FD_REPORT_PROCESSES:
        raise LauncherError(f"run dir record: fds.json lists {len(entries)} processes")
    tables: dict[tuple[int, int], FdTable] = {}
    for entry in entries:
        pid, ticks, count = (
            _get(entry, "pid", int),
            _get(entry, "start_ticks", int),
            _get(entry, "fd_count", int),
        )
        classes = _get(entry, "fd_classes", Mapping)
        if not 0 <= count <= MAX_FD_COUNT or len(classes) > MAX_FD_CLASSES:
            raise LauncherError(f"run dir record: fds.json entry of pid {pid} is out of bounds")
        if not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= count for n in classes.values()
        ):
            raise LauncherError(f"run dir record: fds.json classes of pid {pid} are not counts")
        tables[(pid, ticks)] = FdTable(fd_count=count, fd_classes={str(k): v for k, v in classes.items()})
    return tables
