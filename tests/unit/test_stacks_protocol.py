"""stacks.json and the stop request that asks for it: bounded parsing, redaction, and the sidecar's
reader, which takes the file as evidence of this launch only."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.rundir.channel import RunDir
from sidecar.core.errors import LauncherError
from sidecar.core.redaction import DEFAULT_RULES
from sidecar.launcher.channel import SidecarChannel
from sidecar.launcher.protocol import names as proto
from sidecar.launcher.protocol.fields import ProtocolError
from sidecar.launcher.protocol.records import ControlRequest
from sidecar.launcher.protocol.stacks import (
    MAX_STACK_CHARS,
    MAX_STACK_PROCESSES,
    MAX_STACKS_TIMEOUT_S,
    STACKS_LIMIT_BYTES,
    ProcessStack,
    StacksRecord,
    without_command_line,
)
from sidecar.launcher.stacks import why_missing
from tests.unit.test_launcher_rundir import LAUNCH_ID, announce
from tests.unit.test_report_page import artifact as report_artifact
from tests.unit.test_report_page import page


def record(**overrides: Any) -> dict[str, Any]:
    return {
        **StacksRecord(
            launch_id=LAUNCH_ID,
            tool="/soak/bin/py-spy",
            requested_unix=1000.0,
            started_unix=1000.1,
            captured_unix=1000.3,
            timeout_s=10.0,
            processes=(
                ProcessStack(
                    7, ("python", "train.py", "--token", "s3cr3t"), "Thread 7 (idle)\n    hang (t.py:3)\n"
                ),
                ProcessStack(8, ("sh", "-c", "x"), None, "not a Python process"),
            ),
        ).to_json(),
        **overrides,
    }


def test_a_record_round_trips() -> None:
    raw = record()
    assert StacksRecord.parse(raw).to_json() == raw


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"processes": [{"pid": 1, "command": [], "stack": "x", "missing": "y"}]}, "either a stack"),
        ({"processes": [{"pid": 1, "command": [], "stack": None, "missing": None}]}, "either a stack"),
        (
            {"processes": [{"pid": 1, "command": ["a"], "stack": "x"}] * (MAX_STACK_PROCESSES + 1)},
            "more than",
        ),
        ({"captured_unix": math.nan}, "finite"),
        ({"requested_unix": math.inf}, "finite"),
        ({"omitted": -1}, "negative"),
        ({"processes": "all of them"}, "wrong type"),
        ({"processes": [{"pid": "1", "command": [], "stack": "x"}]}, "wrong type"),
    ],
)
def test_a_malformed_record_is_a_protocol_error(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        StacksRecord.parse(record(**change))


def test_a_huge_stack_is_cut() -> None:
    raw = record(processes=[{"pid": 1, "command": ["a"], "stack": "x" * (10 * MAX_STACK_CHARS)}])
    (process,) = StacksRecord.parse(raw).processes
    assert process.stack is not None and len(process.stack) == MAX_STACK_CHARS


@pytest.mark.parametrize(
    ("asked", "taken"),
    [
        (5.0, 5.0),
        (0, 0.0),
        (-3, 0.0),
        (math.nan, 0.0),
        (math.inf, MAX_STACKS_TIMEOUT_S),
        (1e9, MAX_STACKS_TIMEOUT_S),
    ],
)
def test_a_stop_request_asks_for_stacks_within_bounds(asked: float, taken: float) -> None:
    raw = {
        "launch_id": LAUNCH_ID,
        "seq": 1,
        "action": "terminate",
        "reason": "stalled",
        "stacks_timeout_s": asked,
    }
    assert ControlRequest.parse(raw).stacks_timeout_s == taken


def test_an_older_stop_request_asks_for_no_stacks() -> None:
    request = ControlRequest.parse({"launch_id": LAUNCH_ID, "seq": 1, "action": "terminate", "reason": None})
    assert request.stacks_timeout_s == 0.0 and request.requested_unix is None


@pytest.mark.parametrize(
    ("stderr", "meaning"),
    [
        (b"Error: Failed to find python version from target process\n", "not a Python process"),
        (
            b"Error: Failed to get process executable name.\nReason: Permission denied (os error 13)\n",
            "ptrace refused",
        ),
        (b"Error: Operation not permitted (os error 1)\n", "ptrace refused"),
        (b"Error: No such process (os error 3)\n", "exited before its stack was read"),
        (b"Error: something new\nReason: odd\nmore\n", "py-spy failed: Error: something new; Reason: odd"),
        (b"", "py-spy failed: exit status 1"),
    ],
)
def test_why_a_stack_is_missing(stderr: bytes, meaning: str) -> None:
    assert why_missing(1, stderr) == meaning


def test_the_sidecar_reads_stacks_of_this_launch_only_and_redacted(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, DEFAULT_RULES)
    announce(rd)
    rd.wait_for_launcher(1)
    path = rd.file(proto.STACKS_FILE)
    assert rd.stacks() is None
    path.write_text(json.dumps(record(launch_id="f" * 32)))
    assert rd.stacks() is None  # a stale file of another launch
    path.write_text(json.dumps(record()))
    stacks = rd.stacks()
    assert stacks is not None and stacks.processes[0].command == (
        "python",
        "train.py",
        "--token",
        "<redacted>",
    )
    path.write_text(json.dumps(record(processes=[{"pid": 1}])))
    with pytest.raises(LauncherError, match="command"):
        rd.stacks()


def test_the_sidecar_follows_no_link_and_reads_no_huge_file(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    rd.wait_for_launcher(1)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(record()))
    os.symlink(elsewhere, rd.file(proto.STACKS_FILE))
    with pytest.raises(LauncherError, match="not a regular file"):
        rd.stacks()
    rd.file(proto.STACKS_FILE).unlink()
    huge = record(processes=[{"pid": 1, "command": ["a"], "stack": "x" * (5 * 1024 * 1024)}])
    rd.file(proto.STACKS_FILE).write_text(json.dumps(huge))
    with pytest.raises(LauncherError, match="within 4 MiB"):
        rd.stacks()


def test_a_record_the_launcher_writes_always_fits_what_the_sidecar_reads() -> None:
    """Escaping grows text up to sixfold: 64 processes of full stacks and long commands in
    non-ASCII text still fit STACKS_LIMIT_BYTES, cut, with the head of each stack kept."""
    stack = "Thread 1 (idle)\n    hung_here (t.py:1)\n" + "\u00e9\u0001" * (MAX_STACK_CHARS // 2)
    process = ProcessStack(7, ("\u00e9" * 16 * 1024,) * 64, stack)
    full = StacksRecord(LAUNCH_ID, "py-spy", 1.0, 1.0, 1.0, 10.0, (process,) * MAX_STACK_PROCESSES)
    assert len(json.dumps(full.to_json())) > STACKS_LIMIT_BYTES
    fitted = full.within()
    assert len(json.dumps(fitted.to_json())) <= STACKS_LIMIT_BYTES
    kept = fitted.processes[0]
    assert kept.stack is not None and kept.stack.startswith("Thread 1 (idle)\n    hung_here")
    assert StacksRecord.parse(json.loads(json.dumps(fitted.to_json()))).processes[0].stack == kept.stack
    small = StacksRecord(LAUNCH_ID, "py-spy", 1.0, 1.0, 1.0, 10.0, (ProcessStack(7, ("a",), "s"),))
    assert small.within() == small


def test_a_local_run_dir_keeps_stacks_only_redacted(tmp_path: Path) -> None:
    rd = RunDir(tmp_path, DEFAULT_RULES)
    announce(rd)
    rd.wait_for_launcher(1)
    rd.file(proto.STACKS_FILE).write_text(json.dumps(record()))
    rd.redact_commands()
    assert "s3cr3t" not in rd.file(proto.STACKS_FILE).read_text()


# -- from the trainer's side: what it can write in stacks.json and control.json --

HUGE = 10**400  # valid JSON; overflows a float


@pytest.mark.parametrize("value", ["5", True, [1], {"s": 1}, HUGE, -HUGE])
def test_a_stop_request_with_a_bad_stacks_timeout_still_stops(value: object) -> None:
    raw = {
        "launch_id": LAUNCH_ID,
        "seq": 1,
        "action": "terminate",
        "reason": "stalled",
        "stacks_timeout_s": value,
        "requested_unix": value,
    }
    request = ControlRequest.parse(raw)
    assert request.action == "terminate"
    assert request.stacks_timeout_s == (MAX_STACKS_TIMEOUT_S if value == HUGE else 0.0)
    assert request.requested_unix is None


def test_the_launcher_takes_a_stop_whose_stacks_timeout_is_malformed(tmp_path: Path) -> None:
    channel = SidecarChannel(str(tmp_path), LAUNCH_ID)
    for seq, value in enumerate(["5", HUGE, math.nan], start=1):
        raw = {
            "protocol": 1,
            "launch_id": LAUNCH_ID,
            "seq": seq,
            "action": "terminate",
            "stacks_timeout_s": value,
        }
        (tmp_path / proto.CONTROL_FILE).write_text(json.dumps(raw))
        request = channel.new_control()
        assert request is not None and request.seq == seq and request.action == "terminate"


@pytest.mark.parametrize(
    "change",
    [
        {"started_unix": HUGE},
        {"requested_unix": -HUGE},
        {"omitted": HUGE},
        {"processes": [{"pid": HUGE, "command": [], "stack": "x"}]},
        {"processes": [{"pid": 0, "command": [], "stack": "x"}]},
        {"processes": [{"pid": -7, "command": [], "stack": "x"}]},
    ],
)
def test_numbers_past_any_range_are_a_protocol_error(tmp_path: Path, change: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        StacksRecord.parse(record(**change))
    rd = RunDir(tmp_path, DEFAULT_RULES)
    announce(rd)
    rd.wait_for_launcher(1)
    rd.file(proto.STACKS_FILE).write_text(json.dumps(record(**change)))
    with pytest.raises(LauncherError):
        rd.stacks()
    rd.redact_commands()  # a record it cannot read is removed, never a crash
    assert not rd.file(proto.STACKS_FILE).exists()


def test_a_stall_stacks_artifact_renders_whatever_stacks_json_held(tmp_path: Path) -> None:
    """What the sidecar puts in the artifact from stacks.json is always a page the report can show."""
    rd = RunDir(tmp_path, DEFAULT_RULES)
    announce(rd)
    rd.wait_for_launcher(1)
    script = "<script>alert(1)</script>"
    processes = [
        {"pid": 2**22, "command": [script, "--token", "s3cr3t"], "stack": script},
        {"pid": 1, "command": [], "stack": None, "missing": script},
    ]
    rd.file(proto.STACKS_FILE).write_text(json.dumps(record(processes=processes, omitted=2**22)))
    stacks = rd.stacks()
    assert stacks is not None
    doc = report_artifact()
    doc["stacks"] = stacks.to_json()
    text = page(doc)
    assert "<script>" not in text and "s3cr3t" not in text


def test_the_sidecar_keeps_no_command_line_in_a_stack(tmp_path: Path) -> None:
    """py-spy prints "Process PID: ARGV" above a stack; a launcher that kept it leaks no secret."""
    rd = RunDir(tmp_path, DEFAULT_RULES)
    announce(rd)
    rd.wait_for_launcher(1)
    dump = (
        "Process 7: python train.py --token s3cr3t --password=hunter2\n"
        "Python v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 7 (idle): "MainThread"\n    hang (t.py:3)\n'
    )
    argv = ["python", "train.py", "--token", "s3cr3t", "--password=hunter2"]
    processes = [{"pid": 7, "command": argv, "stack": dump}]
    rd.file(proto.STACKS_FILE).write_text(json.dumps(record(processes=processes)))
    stacks = rd.stacks()
    assert stacks is not None
    (process,) = stacks.processes
    assert process.stack is not None and "hang (t.py:3)" in process.stack
    assert "s3cr3t" not in process.stack and "hunter2" not in process.stack
    rd.redact_commands()
    kept = rd.file(proto.STACKS_FILE).read_text()
    assert "s3cr3t" not in kept and "hunter2" not in kept


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "t.py", "--note", "x\nPython v9", "--password", "S3CRET"],  # fakes the version line
        ["python", "t.py", "--note", "x\nPython v9 (y)\n\nThread 1", "--password", "S3CRET"],
    ],
)
def test_a_dump_header_is_cut_where_the_arguments_end_not_where_they_fake_it(argv: list[str]) -> None:
    stack = 'Python v3.11.7 (/usr/bin/python3)\n\nThread 7 (idle): "M"\n    hang (t.py:3)\n'
    dump = f"Process 7: {' '.join(argv)}\n{stack}"
    cut = without_command_line(7, dump, argv)
    assert cut.startswith("Process 7\nPython v3.11.7") and "hang (t.py:3)" in cut and "S3CRET" not in cut
    # Not those arguments (another process's, a truncated read): withheld, secrets and all.
    assert "S3CRET" not in without_command_line(7, dump, argv[:3])
