"""The small records: launcher.json, trainer.json, soft-stop.json (the launcher writes them) and
abort.json, control.json (the sidecar writes them). Each is written with ``to_json()`` and read
with ``parse()``, which raises ProtocolError for a record of the wrong shape."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError, get
from .names import MAX_GPU_ENV_CHARS, MAX_GPU_ENV_VARS, PROTOCOL
from .stacks import MAX_STACKS_TIMEOUT_S


@dataclass(frozen=True)
class LauncherInfo:
    """launcher.json: who the launcher is (PID-reuse-safe through start_ticks and boot_id)."""

    launch_id: str
    pid: int
    start_ticks: int | None
    boot_id: str | None
    hostname: str
    command: tuple[str, ...]
    # Why the command cannot be started ("was not found", "is not executable"); None when it can.
    command_problem: str | None
    python: str
    python_version: str
    subreaper: bool
    owner_pid: int | None
    go_timeout_s: float
    started_unix: float
    # The launcher's GPU selection variables (the trainer inherits them).
    gpu_env: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "command": list(self.command),
            "gpu_env": dict(self.gpu_env),
        }

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> LauncherInfo:
        command = get(raw, "command", list)
        return cls(
            launch_id=get(raw, "launch_id", str),
            pid=get(raw, "pid", int),
            start_ticks=get(raw, "start_ticks", int, optional=True),
            boot_id=get(raw, "boot_id", str, optional=True),
            hostname=get(raw, "hostname", str),
            command=tuple(str(part) for part in command),
            command_problem=get(raw, "command_problem", str, optional=True),
            python=get(raw, "python", str),
            python_version=get(raw, "python_version", str),
            subreaper=get(raw, "subreaper", bool),
            owner_pid=get(raw, "owner_pid", int, optional=True),
            go_timeout_s=float(get(raw, "go_timeout_s", (int, float))),
            started_unix=float(get(raw, "started_unix", (int, float))),
            gpu_env=_gpu_env(get(raw, "gpu_env", Mapping, optional=True) or {}),
        )


def _gpu_env(raw: Mapping[str, Any]) -> dict[str, str]:
    if len(raw) > MAX_GPU_ENV_VARS:
        raise ProtocolError(f"run dir record: gpu_env holds {len(raw)} variables")
    env = {}
    for name, value in raw.items():
        if not isinstance(value, str) or len(value) > MAX_GPU_ENV_CHARS:
            raise ProtocolError(f"run dir record: gpu_env {name!r:.40} is not a short string")
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

    def to_json(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, **{name: getattr(self, name) for name in self.__dataclass_fields__}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> TrainerInfo:
        return cls(
            launch_id=get(raw, "launch_id", str),
            pid=get(raw, "pid", int),
            pgid=get(raw, "pgid", int),
            start_ticks=get(raw, "start_ticks", int, optional=True),
            started_unix=float(get(raw, "started_unix", (int, float))),
        )


@dataclass(frozen=True)
class SoftStopRecord:
    """soft-stop.json: the launcher told the trainer to checkpoint and stop."""

    launch_id: str
    reason: str
    deadline_unix: float
    sent_unix: float

    def to_json(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, **{name: getattr(self, name) for name in self.__dataclass_fields__}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SoftStopRecord:
        return cls(
            launch_id=get(raw, "launch_id", str),
            reason=get(raw, "reason", str),
            deadline_unix=float(get(raw, "deadline_unix", (int, float))),
            sent_unix=float(get(raw, "sent_unix", (int, float))),
        )


@dataclass(frozen=True)
class AbortRequest:
    """abort.json: do not start the trainer; exit with exit_code. Unbound (no launch_id) before the
    sidecar has seen a launcher: then it applies to any."""

    launch_id: str | None
    reason: str
    # 1-255; None when the file holds no usable code (the launcher then exits EXIT_ABORT_DEFAULT).
    exit_code: int | None

    def to_json(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, **{name: getattr(self, name) for name in self.__dataclass_fields__}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> AbortRequest:
        code = raw.get("exit_code")
        usable = isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 255
        return cls(
            launch_id=get(raw, "launch_id", str, optional=True),
            reason=str(raw.get("reason"))[:512],
            exit_code=code if usable else None,
        )


@dataclass(frozen=True)
class ControlRequest:
    """control.json: one of ACTIONS; a request counts once, by its rising seq. The action is kept as
    written: the launcher consumes the seq of one it does not know and ignores it."""

    launch_id: str
    seq: int
    action: str
    reason: str | None
    # > 0: take the trainer's Python stacks (stacks.json) first, for at most this long (a stall).
    stacks_timeout_s: float = 0.0
    requested_unix: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, **{name: getattr(self, name) for name in self.__dataclass_fields__}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ControlRequest:
        reason = raw.get("reason")
        # Neither is a reason to drop the stop it comes with: a value of the wrong type, NaN or one
        # out of range asks for no stacks (or no request time); a huge timeout for the most.
        stacks, requested = _real(raw.get("stacks_timeout_s")), _real(raw.get("requested_unix"))
        return cls(
            launch_id=get(raw, "launch_id", str),
            seq=get(raw, "seq", int),
            action=str(raw.get("action"))[:64],
            reason=None if reason is None else str(reason)[:512],
            stacks_timeout_s=float(min(stacks, MAX_STACKS_TIMEOUT_S)) if stacks > 0 else 0.0,
            requested_unix=float(requested) if math.isfinite(requested) else None,
        )


def _real(value: object) -> float | int:
    """A JSON number as it is (never converted: an integer of hundreds of digits overflows a float),
    NaN for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    if isinstance(value, int) and abs(value) > 2**53:
        return math.inf if value > 0 else -math.inf
    return value
