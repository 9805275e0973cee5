"""The launcher's exit: its code, exit.json, and the condensed termination message."""

from __future__ import annotations

import json
import os
import time
import uuid

from .output import log
from .protocol.exit import ExitRecord, KilledProcess
from .protocol.fields import signal_name
from .protocol.files import atomic_write_json
from .protocol.names import (
    EXIT_FILE,
    EXIT_LAUNCHER_ERROR,
    EXIT_SUPERVISOR_LOST,
    LISTED_COMMAND_CHARS,
    MAX_LISTED_PIDS,
    MAX_LISTED_PROCESSES,
)
from .protocol.termination import write_termination_message
from .state import StopState
from .trainer import Trainer


def exit_code(state: StopState, trainer: Trainer | None) -> int:
    """The trainer's own code (128+N for signal N), or the launcher's when the sidecar was lost."""
    if state.reason in ("heartbeat_lost", "owner_lost"):
        return EXIT_SUPERVISOR_LOST
    if trainer is None or trainer.status is None:
        return EXIT_LAUNCHER_ERROR
    code = os.waitstatus_to_exitcode(trainer.status)
    return 128 - code if code < 0 else code


def exit_record(
    launch_id: str | None, code: int, state: StopState, trainer: Trainer | None, stdout_dropped: int
) -> ExitRecord:
    status = trainer.status if trainer is not None else None
    returncode = signum = None
    if status is not None:
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
        else:
            returncode = os.waitstatus_to_exitcode(status)
    return ExitRecord(
        launch_id=launch_id,
        exit_code=code,
        reason=state.reason or "exited",
        returncode=returncode,
        signal=signum,
        signal_name=signal_name(signum) if signum is not None else None,
        trainer_pid=trainer.pid if trainer is not None else None,
        deadline_expired=state.deadline_expired,
        heartbeat_lost=state.heartbeat_lost,
        owner_lost=state.owner_lost,
        soft_stop_sent=state.soft_stop_sent,
        soft_stop_reason=state.soft_stop_reason,
        stop_times_unix=dict(state.stop_times),
        term_sent=state.term_sent,
        kill_sent=state.kill_sent,
        control=tuple(state.control_actions),
        signals_forwarded=tuple(state.signals_forwarded),
        signals_deferred=tuple(state.signals_deferred),
        soft_stop_signalled=tuple(state.soft_stop_signalled[:MAX_LISTED_PIDS]),
        killed_with_trainer=_processes(state.killed_with_trainer),
        survivors_killed=_processes(state.survivors_killed),
        unlisted_killed=sum(
            max(0, len(found) - MAX_LISTED_PROCESSES)
            for found in (state.killed_with_trainer, state.survivors_killed)
        ),
        unreaped=tuple(state.unreaped[:MAX_LISTED_PIDS]),
        stdout_dropped_bytes=stdout_dropped,
        started_unix=trainer.started_unix if trainer is not None else None,
        ended_unix=time.time(),
    )


def _processes(found: dict[int, tuple[str, ...]]) -> tuple[KilledProcess, ...]:
    """The first MAX_LISTED_PROCESSES by pid, each command cut to LISTED_COMMAND_CHARS."""
    listed = sorted(found.items())[:MAX_LISTED_PROCESSES]
    return tuple(KilledProcess(pid, _clipped(command)) for pid, command in listed)


def _clipped(command: tuple[str, ...]) -> tuple[str, ...]:
    kept: list[str] = []
    left = LISTED_COMMAND_CHARS
    for argument in command:
        if left <= 0:
            break
        kept.append(argument[:left])
        left -= len(argument)
    return tuple(kept)


class RecordSlot:
    """exit.json's temp file and the run dir, opened before the trainer starts: the trainer (same
    UID) may later take every new fd from the launcher (``prlimit RLIMIT_NOFILE 0``), so writing
    the record then needs none, only write, fsync and rename."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, EXIT_FILE)
        self.tmp = os.path.join(run_dir, f".{EXIT_FILE}.{uuid.uuid4().hex[:12]}.tmp")
        self.dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError:
            os.close(self.dir_fd)
            raise

    def fill(self, payload: bytes) -> None:
        """Write the record and rename it into place (once); OSError when that fails."""
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(self.fd, view) :]
            os.fsync(self.fd)
            os.replace(self.tmp, self.path)
            os.fsync(self.dir_fd)
        finally:
            os.close(self.fd)
            os.close(self.dir_fd)


def open_record_slot(run_dir: str) -> RecordSlot | None:
    try:
        return RecordSlot(run_dir)
    except OSError as exc:
        log(f"cannot prepare {EXIT_FILE}: {exc}")
        return None


def write_exit(
    run_dir: str, record: ExitRecord, termination_log: str | None, slot: RecordSlot | None = None
) -> bool:
    """exit.json (into ``slot`` when one was prepared); False when it could not be written."""
    written = True
    try:
        payload = (json.dumps(record.to_json(), sort_keys=True) + "\n").encode()
        if slot is not None:
            slot.fill(payload)
        else:
            atomic_write_json(os.path.join(run_dir, EXIT_FILE), record.to_json())
    except (OSError, MemoryError) as exc:
        log(f"cannot write {EXIT_FILE}: {exc}")
        written = False
    if termination_log is not None:
        write_termination_log(termination_log, record)
    return written


def write_termination_log(path: str, record: ExitRecord) -> None:
    """The exit record, condensed, as the trainer container's termination message: why the trainer
    ended is then in the pod status even when the sidecar died first (heartbeat loss)."""
    summary = {
        "reason": record.reason,
        "exit_code": record.exit_code,
        "returncode": record.returncode,
        "signal_name": record.signal_name,
    }
    try:
        write_termination_message(path, "soak-launcher: " + json.dumps(summary, sort_keys=True))
    except OSError as exc:
        log(f"cannot write the termination log {path}: {exc}")
