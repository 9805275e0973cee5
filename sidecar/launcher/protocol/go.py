"""go.json, the sidecar's go-ahead, and deadline.json, the trainer's copy of its deadline."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError, require_finite, signal_number
from .names import (
    DEFAULT_CONSOLE_LOG_BYTES,
    DEFAULT_EXIT_GRACE_S,
    DEFAULT_KILL_GRACE_S,
    ENV_RUN_ID,
    MAX_EXIT_GRACE_S,
    MIN_FD_REPORT_S,
    PROTOCOL,
)

GO_NUMBERS = (
    "deadline_unix",
    "checkpoint_margin_s",
    "term_grace_s",
    "heartbeat_timeout_s",
    "kill_grace_s",
    "stop_grace_s",
    "exit_grace_s",
)


@dataclass(frozen=True)
class GoRequest:
    """go.json. The sidecar builds one and writes ``to_json()``; the launcher starts the trainer only
    on what ``from_json()`` accepts."""

    launch_id: str
    deadline_unix: float
    checkpoint_margin_s: float
    term_grace_s: float
    heartbeat_timeout_s: float
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    console_log_bytes: int = DEFAULT_CONSOLE_LOG_BYTES
    soft_stop_signal: str = "SIGUSR1"
    env: Mapping[str, str] = field(default_factory=dict)
    # Appended to the trainer's argv: the approved `--resume <checkpoint>`.
    extra_args: tuple[str, ...] = ()
    # Seconds between fd reports (fds.json); None when the sidecar reads the fd tables itself.
    fd_report_s: float | None = None
    # A stop signal from outside: seconds between the soft stop and forwarding it (0: at once).
    stop_grace_s: float = 0.0
    # After the trainer exits on its own: seconds its descendants get to exit by themselves.
    exit_grace_s: float = DEFAULT_EXIT_GRACE_S

    def __post_init__(self) -> None:
        for key in GO_NUMBERS:
            require_finite("go.json", key, getattr(self, key))
        if self.checkpoint_margin_s <= 0 or min(self.term_grace_s, self.kill_grace_s, self.stop_grace_s) < 0:
            raise ProtocolError(
                "go.json: need margin > 0, term_grace_s >= 0, kill_grace_s >= 0, stop_grace_s >= 0"
            )
        if self.heartbeat_timeout_s <= 0:
            raise ProtocolError("go.json: heartbeat_timeout_s must be > 0")
        if not 0 <= self.exit_grace_s <= MAX_EXIT_GRACE_S:
            raise ProtocolError(f"go.json: exit_grace_s must be within 0 to {MAX_EXIT_GRACE_S:g}")
        cap = self.console_log_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise ProtocolError("go.json: console_log_bytes must be a positive integer")
        signal_number(self.soft_stop_signal)
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ProtocolError("go.json: env must map strings to strings")
        if not all(isinstance(arg, str) for arg in self.extra_args):
            raise ProtocolError("go.json: extra_args must be a list of strings")
        if self.fd_report_s is not None:
            require_finite("go.json", "fd_report_s", self.fd_report_s)
            if self.fd_report_s < MIN_FD_REPORT_S:
                raise ProtocolError(f"go.json: fd_report_s must be >= {MIN_FD_REPORT_S}")

    @property
    def soft_stop_signum(self) -> int:
        return signal_number(self.soft_stop_signal)

    @property
    def soft_stop_unix(self) -> float:
        return self.deadline_unix - self.checkpoint_margin_s

    @property
    def term_unix(self) -> float:
        return self.deadline_unix - self.term_grace_s

    def trainer_env(self) -> dict[str, str]:
        """What the trainer's environment gains: its deadline figures, then the sidecar's ``env``."""
        return {
            "SOAK_DEADLINE_UNIX": repr(self.deadline_unix),
            "SOAK_SOFT_STOP_UNIX": repr(self.soft_stop_unix),
            "SOAK_TERM_UNIX": repr(self.term_unix),
            "SOAK_CHECKPOINT_MARGIN_S": repr(self.checkpoint_margin_s),
            "SOAK_SOFT_STOP_SIGNAL": self.soft_stop_signal,
            **self.env,
        }

    def deadline_copy(self, record: Mapping[str, Any] | None) -> dict[str, Any]:
        """deadline.json, the trainer's copy of its deadline, written by the sidecar with go.json."""
        return {
            "protocol": PROTOCOL,
            "deadline_unix": self.deadline_unix,
            "soft_stop_unix": self.soft_stop_unix,
            "term_unix": self.term_unix,
            "checkpoint_margin_s": self.checkpoint_margin_s,
            "term_grace_s": self.term_grace_s,
            "soft_stop_signal": self.soft_stop_signal,
            "run_id": self.env.get(ENV_RUN_ID),
            "record": None if record is None else dict(record),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "env": dict(self.env),
            "extra_args": list(self.extra_args),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GoRequest:
        extra_args = raw.get("extra_args", [])
        if not isinstance(extra_args, list):
            raise ProtocolError("go.json: extra_args must be a list of strings")
        return cls(
            launch_id=str(raw.get("launch_id")),
            deadline_unix=raw.get("deadline_unix", math.nan),  # a missing number fails __post_init__
            checkpoint_margin_s=raw.get("checkpoint_margin_s", math.nan),
            term_grace_s=raw.get("term_grace_s", math.nan),
            heartbeat_timeout_s=raw.get("heartbeat_timeout_s", math.nan),
            kill_grace_s=raw.get("kill_grace_s", DEFAULT_KILL_GRACE_S),
            console_log_bytes=raw.get("console_log_bytes", DEFAULT_CONSOLE_LOG_BYTES),
            soft_stop_signal=str(raw.get("soft_stop_signal", "SIGUSR1")),
            env=raw.get("env", {}),
            extra_args=tuple(extra_args),
            fd_report_s=raw.get("fd_report_s"),
            stop_grace_s=raw.get("stop_grace_s", 0.0),
            exit_grace_s=raw.get("exit_grace_s", DEFAULT_EXIT_GRACE_S),
        )
