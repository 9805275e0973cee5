"""The frozen values a run's phases pass along."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sidecar.core import verdict as verdicts
from sidecar.core.artifact import LostAttempt
from sidecar.core.classification import Finding
from sidecar.core.deadline import DeadlineClock, DeadlineRecord
from sidecar.core.identity import run_slot
from sidecar.core.ledger.moments import ProgressMoments
from sidecar.core.samples import ProcessInfo
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.records import LauncherInfo
from sidecar.settings import Settings

if TYPE_CHECKING:
    from sidecar.app.ports import Ports

Mode = Literal["local", "pod"]


@dataclass(frozen=True)
class RunRequest:
    """What the CLI asks for: one run of ``command`` (local) or of the launcher's (pod)."""

    mode: Mode
    run_id: str
    command: tuple[str, ...] = ()
    context: Mapping[str, Any] = field(default_factory=dict)
    # Names the attempt's artifact directory after the pod, so retries never share one.
    attempt_label: str | None = None
    # One pod of a multi-pod soak (an Indexed Job's completion index) of ``indexes`` pods: its own
    # lock and attempt numbers, the run's one deadline record.
    index: int | None = None
    indexes: int = 1

    @property
    def slot(self) -> str:
        return run_slot(self.run_id, self.index)


@dataclass(frozen=True)
class Started:
    """The run as it began: the request, when, and (once the store's lock is held) the attempt."""

    request: RunRequest
    wall: float
    monotonic: float
    attempt: int = 0
    artifact_dir: Path = Path()
    # Pod mode after a sidecar restart: the launcher got its go-ahead from our predecessor.
    already_going: bool = False
    # Earlier attempts of this slot that ended without a verdict (found once numbered).
    lost_attempts: tuple[LostAttempt, ...] = ()


@dataclass(frozen=True)
class Launched:
    launcher: LauncherInfo
    command: tuple[str, ...]
    # False when the trainer's tree runs under another UID: its fd tables come from the launcher.
    fd_tables_readable: bool = True


@dataclass(frozen=True)
class Preflight:
    """The run's identity was approved and its deadline record created or resumed."""

    record: DeadlineRecord
    clock: DeadlineClock
    resumed: bool
    remaining_at_start_s: float
    resume_checkpoint: str | None
    # The run's checkpoint record (checkpoint_path, canonical), the same for every attempt.
    checkpoint_record: str | None
    # Appended to the trainer's command: the approved resume flag and checkpoint, when one is set.
    extra_args: tuple[str, ...]


@dataclass(frozen=True)
class Going:
    """What every phase from the go-ahead on works with."""

    settings: Settings
    ports: Ports
    started: Started
    launched: Launched
    preflight: Preflight


@dataclass(frozen=True)
class Watched:
    """What monitoring learned by the time the launcher exited."""

    # The monitor's failure (a stall, a stop from outside, ...) and the first GPU fault it saw.
    failure: Finding | None
    gpu_fault: Finding | None
    last_seen: tuple[ProcessInfo, ...]
    exit_record: ExitRecord | None
    # Run-dir records that disagreed with what the sidecar observed (named, never followed).
    protocol_violations: tuple[str, ...] = ()
    # The stall's stacks (stacks.json) or why they are missing; None when none were asked for.
    stacks: Mapping[str, Any] | None = None
    # When the go-ahead was given, and the first progress and checkpoints the samples showed.
    go_unix: float | None = None
    moments: ProgressMoments | None = None
    # The launcher still ran after the deadline, by the sidecar's clock.
    ran_past_deadline: bool = False
    # The sidecar had to kill the trainer's processes itself (the launcher did not act in time).
    fallback_kill: str | None = None
    # A sample saw the launcher stopped or traced: the trainer's doing, never a pass.
    launcher_stopped: str | None = None
    # exit.json kept as evidence only: the kubelet had not confirmed it when a run the sidecar had
    # already failed ended (exit_record is then None).
    unconfirmed_record: ExitRecord | None = None


@dataclass(frozen=True)
class RunResult:
    verdict: verdicts.Verdict
    artifact_path: Path | None
    exit_code: int
