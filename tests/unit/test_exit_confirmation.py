"""exit.json held to the exit status the trainer cannot write, field by field (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.core.exit_confirmation import disagreement, inconsistency
from sidecar.launcher.protocol.exit import ExitRecord

EXITED = ExitRecord(launch_id="a" * 32, exit_code=3, reason="exited", returncode=3, trainer_pid=40)


def test_the_launchers_own_records_agree() -> None:
    assert disagreement(EXITED, 3, "the launcher") is None
    killed = replace(
        EXITED, exit_code=137, returncode=None, signal=9, reason="deadline", deadline_expired=True
    )
    assert disagreement(killed, 137, "the launcher") is None
    lost = replace(killed, exit_code=125, reason="heartbeat_lost", heartbeat_lost=True)
    assert disagreement(lost, 125, "the launcher") is None
    spawn = ExitRecord(launch_id="a" * 32, exit_code=127, reason="spawn_failed")
    assert disagreement(spawn, 127, "the launcher") is None


@pytest.mark.parametrize(
    ("forged", "status"),
    [
        (replace(EXITED, returncode=0), 3),  # a crash that calls its return code 0
        (replace(EXITED, exit_code=0, returncode=0), 3),  # a pass the launcher's status denies
        (EXITED, -9),  # the launcher was killed: it wrote nothing
        (replace(EXITED, reason="heartbeat_lost", heartbeat_lost=True), 3),  # a lost sidecar at code 3
        (replace(EXITED, exit_code=127, returncode=None, reason="spawn_failed"), 127),  # started, not spawned
        (replace(EXITED, returncode=3, signal=9), 3),
        (replace(EXITED, exit_code=19, returncode=None, trainer_pid=None, reason="spawn_failed"), 19),
    ],
)
def test_a_record_that_disagrees_anywhere_is_not_the_launchers(forged: ExitRecord, status: int) -> None:
    assert disagreement(forged, status, "the launcher") is not None


def test_a_record_alone_is_checked_for_consistency() -> None:
    assert inconsistency(EXITED) is None
    assert inconsistency(replace(EXITED, exit_code=0)) == (
        "exit.json is inconsistent: exit code 0 for a trainer that ended with status 3"
    )
