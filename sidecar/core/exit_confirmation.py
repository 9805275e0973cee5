"""Whether exit.json can be the launcher's own record. Pure.

exit.json sits in the run dir, which the trainer (same UID as the launcher) can write. How the
trainer ended is therefore taken from a channel that UID cannot write, and the record is held to it
field by field: locally the launcher's own exit status (the sidecar is its parent), in a pod the
trainer container's exit code as the kubelet reports it. The launcher's exit status is the trainer's
(its code, 128+N for signal N) or one of the launcher's own codes, and every field of its record
follows from how it ended. A record that disagrees anywhere is not the launcher's: it is judged as
no record at all (never a pass, never a retryable code, never a cause the sidecar did not see).
"""

from __future__ import annotations

from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.names import (
    BEFORE_START_REASONS,
    EXIT_LAUNCHER_ERROR,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_SUPERVISOR_LOST,
)

_LOST = frozenset({"heartbeat_lost", "owner_lost"})
MAX_SIGNAL = 64
MAX_STATUS = 255


def disagreement(record: ExitRecord, status: int, who: str) -> str | None:
    """Why ``record`` is not the launcher's, given ``status``: the exit status the unwritable channel
    reports for ``who`` (negative: killed by that signal); None when every field agrees."""
    if status < 0:
        return f"exit.json says exit code {record.exit_code}, but {who} was killed by signal {-status}"
    if record.exit_code != status:
        return f"exit.json says exit code {record.exit_code}, but {who} exited {status}"
    return inconsistency(record)


def inconsistency(record: ExitRecord) -> str | None:
    """A field of ``record`` that contradicts its exit code or another field; None if none does."""
    code, reason = record.exit_code, record.reason
    trainer_code = _trainer_code(record)
    checks = (
        (record.returncode is not None and record.signal is not None, "both a return code and a signal"),
        (not 0 <= code <= MAX_STATUS, f"exit code {code}"),
        (trainer_code is not None and not 0 <= trainer_code <= MAX_STATUS, "an impossible trainer status"),
        (
            (reason == "heartbeat_lost" and not record.heartbeat_lost)
            or (reason == "owner_lost" and not record.owner_lost),
            f"reason {reason!r} with heartbeat_lost={record.heartbeat_lost}, owner_lost={record.owner_lost}",
        ),
        (reason in _LOST and code != EXIT_SUPERVISOR_LOST, f"reason {reason!r} with exit code {code}"),
        (
            reason == "launcher_error" and code != EXIT_LAUNCHER_ERROR,
            f"a launcher error with exit code {code}",
        ),
        (
            reason == "spawn_failed" and code not in (EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE),
            f"a failed spawn with exit code {code}",
        ),
        (
            (reason in BEFORE_START_REASONS or reason == "spawn_failed") and record.trainer_started,
            f"reason {reason!r} for a trainer that was started",
        ),
        (
            not record.trainer_started and trainer_code is not None,
            "a trainer status for a trainer never started",
        ),
        (
            record.trainer_started
            and reason not in _LOST
            and reason != "launcher_error"
            and trainer_code != code,
            f"exit code {code} for a trainer that ended with status {trainer_code}",
        ),
    )
    problems = [what for failed, what in checks if failed]
    return f"exit.json is inconsistent: {problems[0]}" if problems else None


def _trainer_code(record: ExitRecord) -> int | None:
    """The launcher's exit status for the trainer's end that the record states (128+N for signal N)."""
    if record.signal is not None:
        return 128 + record.signal if 0 < record.signal <= MAX_SIGNAL else -1
    return record.returncode
