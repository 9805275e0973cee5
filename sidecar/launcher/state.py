"""What the launcher has done to stop the trainer, and why: the record exit.json is built from."""

from __future__ import annotations

from dataclasses import dataclass, field

from .protocol.exit import ControlAction


class ExitRequestError(Exception):
    """Leave the launcher with this code after exit.json is written."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class StopState:
    reason: str | None = None  # the first reason that stuck; "exited" when none did
    deadline_expired: bool = False
    heartbeat_lost: bool = False
    owner_lost: bool = False
    soft_stop_sent: bool = False
    soft_stop_reason: str | None = None
    # When the soft stop, the first TERM and the first KILL went to the tree (wall clock).
    stop_times: dict[str, float] = field(default_factory=dict)
    term_sent: bool = False
    kill_sent: bool = False
    control_actions: list[ControlAction] = field(default_factory=list)
    signals_forwarded: list[str] = field(default_factory=list)
    # Stop signals turned into the soft stop, and when (monotonic) they are forwarded after all.
    signals_deferred: list[str] = field(default_factory=list)
    forward_stop_at: float | None = None
    soft_stop_signalled: list[int] = field(default_factory=list)
    killed_with_trainer: dict[int, tuple[str, ...]] = field(default_factory=dict)
    survivors_killed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    unreaped: list[int] = field(default_factory=list)
    # Monotonic: when TERM's grace ends (then KILL), and when the first KILL went out.
    escalate_at: float | None = None
    killed_at: float | None = None

    def because(self, reason: str) -> None:
        """Record why the trainer stops, unless an earlier reason already stands."""
        self.reason = self.reason or reason
