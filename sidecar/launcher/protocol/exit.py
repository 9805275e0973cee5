"""exit.json: how the trainer ended and what the launcher had to kill. The launcher builds an
ExitRecord and writes ``to_json()``; the sidecar reads it with ``parse()``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError, get, items, number
from .names import PROTOCOL, REASONS

STOP_TIME_NAMES = ("soft_stop", "term", "kill")


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    # The process's arguments as /proc showed them (first CMDLINE_READ_BYTES), unredacted: the
    # launcher knows no redaction rules, the sidecar redacts them argument by argument.
    command: tuple[str, ...]


@dataclass(frozen=True)
class OomKill:
    """A process the launcher reaped dead of a SIGKILL it did not send, as the cgroup's OOM-kill
    counter rose: the kernel's OOM killer's victim."""

    pid: int
    command: tuple[str, ...]  # the trainer's argv, or [comm] for another process (a zombie has no argv)
    at_unix: float | None = None


@dataclass(frozen=True)
class MemoryReport:
    """The trainer's memory cgroup as the launcher read it: limit and OOM kills."""

    cgroup: str  # "v1" or "v2"
    limit_bytes: int | None  # None: no limit
    oom_kills_at_start: int
    oom_kills_at_end: int
    oom_killed: tuple[OomKill, ...] = ()

    @property
    def oom_kills(self) -> int:
        """OOM kills in the cgroup while the trainer ran (some victims are not named: a grandchild
        is reaped by its own parent, not the launcher)."""
        return max(0, self.oom_kills_at_end - self.oom_kills_at_start, len(self.oom_killed))

    def to_json(self) -> dict[str, Any]:
        return {
            "cgroup": self.cgroup,
            "limit_bytes": self.limit_bytes,
            "oom_kills_at_start": self.oom_kills_at_start,
            "oom_kills_at_end": self.oom_kills_at_end,
            "oom_killed": [
                {"pid": kill.pid, "command": list(kill.command), "at_unix": kill.at_unix}
                for kill in self.oom_killed
            ],
        }

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> MemoryReport:
        cgroup = get(raw, "cgroup", str)
        if cgroup not in ("v1", "v2"):
            raise ProtocolError(f"exit.json: unknown memory cgroup version {cgroup!r:.20}")
        counts = [get(raw, key, int) for key in ("oom_kills_at_start", "oom_kills_at_end")]
        limit = get(raw, "limit_bytes", int, optional=True)
        if min(counts) < 0 or (limit is not None and limit <= 0):
            raise ProtocolError("exit.json: memory counters must be positive")
        victims = get(raw, "oom_killed", list, optional=True) or []
        if len(victims) > MAX_OOM_VICTIMS:
            raise ProtocolError(f"exit.json: more than {MAX_OOM_VICTIMS} OOM victims")
        return cls(
            cgroup=cgroup,
            limit_bytes=limit,
            oom_kills_at_start=counts[0],
            oom_kills_at_end=counts[1],
            oom_killed=tuple(
                OomKill(
                    pid=get(item, "pid", int),
                    command=_argv(item),
                    at_unix=_finite(number(item, "at_unix", optional=True)),
                )
                for item in victims
            ),
        )


@dataclass(frozen=True)
class ControlAction:
    seq: int
    action: str
    reason: str | None


@dataclass(frozen=True)
class ExitRecord:
    launch_id: str | None
    exit_code: int
    reason: str  # one of REASONS
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
    soft_stop_signalled: tuple[int, ...] = ()
    killed_with_trainer: tuple[KilledProcess, ...] = ()
    survivors_killed: tuple[KilledProcess, ...] = ()
    # Killed processes beyond the lists' MAX_LISTED_PROCESSES each (the sidecar's samples saw them).
    unlisted_killed: int = 0
    unreaped: tuple[int, ...] = ()
    stdout_dropped_bytes: int = 0
    started_unix: float | None = None
    ended_unix: float | None = None
    # None: no memory cgroup with an OOM counter was readable.
    memory: MemoryReport | None = None

    @property
    def trainer_started(self) -> bool:
        return self.trainer_pid is not None

    @property
    def trainer_returncode(self) -> int | None:
        """Popen's ``returncode``: the negative signal number for a signalled trainer."""
        if not self.trainer_started:
            return None
        if self.returncode is not None:
            return self.returncode
        return -self.signal if self.signal is not None else None

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"protocol": PROTOCOL}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            raw[name] = list(value) if isinstance(value, tuple) else value
        raw["stop_times_unix"] = dict(self.stop_times_unix)
        raw["control"] = [vars(action) for action in self.control]
        for name in ("killed_with_trainer", "survivors_killed"):
            raw[name] = [{"pid": p.pid, "command": list(p.command)} for p in getattr(self, name)]
        raw["memory"] = None if self.memory is None else self.memory.to_json()
        return raw

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ExitRecord:
        reason = get(raw, "reason", str)
        if reason not in REASONS:
            raise ProtocolError(f"exit.json: unknown reason {reason!r:.80}")
        return cls(
            launch_id=get(raw, "launch_id", str, optional=True),
            exit_code=get(raw, "exit_code", int),
            reason=reason,
            returncode=get(raw, "returncode", int, optional=True),
            signal=get(raw, "signal", int, optional=True),
            signal_name=get(raw, "signal_name", str, optional=True),
            trainer_pid=get(raw, "trainer_pid", int, optional=True),
            **_flags(raw),
            soft_stop_reason=get(raw, "soft_stop_reason", str, optional=True),
            stop_times_unix=_stop_times(raw),
            control=tuple(
                ControlAction(
                    seq=get(item, "seq", int),
                    action=get(item, "action", str),
                    reason=get(item, "reason", str, optional=True),
                )
                for item in get(raw, "control", list, optional=True) or []
            ),
            signals_forwarded=items(raw, "signals_forwarded", str),
            signals_deferred=items(raw, "signals_deferred", str),
            soft_stop_signalled=items(raw, "soft_stop_signalled", int),
            killed_with_trainer=_processes(raw, "killed_with_trainer"),
            survivors_killed=_processes(raw, "survivors_killed"),
            unlisted_killed=get(raw, "unlisted_killed", int, optional=True) or 0,
            unreaped=items(raw, "unreaped", int),
            stdout_dropped_bytes=get(raw, "stdout_dropped_bytes", int, optional=True) or 0,
            started_unix=number(raw, "started_unix", optional=True),
            ended_unix=number(raw, "ended_unix", optional=True),
            memory=_memory(raw),
        )


# The launcher names at most this many (each one a death it reaped); more is a forged record.
MAX_OOM_VICTIMS = 1024


def _memory(raw: Mapping[str, Any]) -> MemoryReport | None:
    found = get(raw, "memory", dict, optional=True)
    return None if found is None else MemoryReport.parse(found)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


FLAGS = ("deadline_expired", "heartbeat_lost", "owner_lost", "soft_stop_sent", "term_sent", "kill_sent")


def _flags(raw: Mapping[str, Any]) -> dict[str, bool]:
    return {name: bool(get(raw, name, bool, optional=True)) for name in FLAGS}


def _processes(raw: Mapping[str, Any], key: str) -> tuple[KilledProcess, ...]:
    return tuple(
        KilledProcess(pid=get(item, "pid", int), command=_argv(item))
        for item in get(raw, key, list, optional=True) or []
    )


def _argv(item: Mapping[str, Any]) -> tuple[str, ...]:
    get(item, "command", list)  # required, a list
    return items(item, "command", str)


def _stop_times(raw: Mapping[str, Any]) -> dict[str, float]:
    found = get(raw, "stop_times_unix", dict, optional=True) or {}
    return {
        name: float(value)
        for name, value in found.items()
        if name in STOP_TIME_NAMES
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }
