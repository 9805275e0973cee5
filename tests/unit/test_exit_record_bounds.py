"""exit.json stays a record whatever the trainer's tree: bounded lists and commands (an argument of
control bytes grows six times once JSON-escaped), read back whole by the sidecar's parser."""

from __future__ import annotations

import json

from sidecar.launcher.exiting import exit_record
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.names import (
    LISTED_COMMAND_CHARS,
    MAX_LISTED_PIDS,
    MAX_LISTED_PROCESSES,
    RECORD_LIMIT_BYTES,
)
from sidecar.launcher.state import StopState


def test_a_storm_of_survivors_with_long_control_byte_argv_still_fits_a_record() -> None:
    state = StopState()
    hostile = ("python3", "-c", "\x01" * 16 * 1024, "\x02" * 16 * 1024)
    state.survivors_killed = {1000 + n: hostile for n in range(5000)}
    state.killed_with_trainer = {20000 + n: hostile for n in range(5000)}
    state.soft_stop_signalled = list(range(2, 100_000))
    record = exit_record("a" * 32, 13, state, None, 0)
    encoded = json.dumps(record.to_json()).encode()
    assert len(encoded) < RECORD_LIMIT_BYTES
    back = ExitRecord.parse(json.loads(encoded))
    assert len(back.survivors_killed) == len(back.killed_with_trainer) == MAX_LISTED_PROCESSES
    assert back.unlisted_killed == 2 * (5000 - MAX_LISTED_PROCESSES)
    assert all(sum(map(len, p.command)) <= LISTED_COMMAND_CHARS for p in back.survivors_killed)
    assert back.survivors_killed[0].command[:2] == ("python3", "-c")
    assert len(back.soft_stop_signalled) == MAX_LISTED_PIDS


def test_a_small_tree_is_listed_whole() -> None:
    state = StopState()
    state.survivors_killed = {7: ("sleep", "600")}
    back = exit_record(None, 13, state, None, 0)
    assert [(p.pid, p.command) for p in back.survivors_killed] == [(7, ("sleep", "600"))]
    assert back.unlisted_killed == 0
