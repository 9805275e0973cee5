"""RunDir: the sidecar's side of the protocol, against hand-written launcher records."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.rundir.channel import Heartbeat, RunDir
from sidecar.adapters.rundir.local import spawn_local_launcher
from sidecar.core.errors import ConfigError, LauncherError
from sidecar.launcher.exiting import write_termination_log
from sidecar.launcher.protocol import names as proto
from sidecar.launcher.protocol.exit import ExitRecord, KilledProcess
from sidecar.launcher.protocol.fields import ProtocolError
from sidecar.launcher.protocol.files import atomic_write_json, read_bytes, read_json
from sidecar.launcher.protocol.go import GoRequest
from tests.waiting import wait_until

LAUNCH_ID = "0123456789abcdef0123456789abcdef"


def announce(rd: RunDir, **overrides: Any) -> None:
    raw: dict[str, Any] = {
        "protocol": 1,
        "launch_id": LAUNCH_ID,
        "pid": 4242,
        "start_ticks": 123,
        "boot_id": "b",
        "hostname": "h",
        "command": ["python", "train.py"],
        "python": "/usr/bin/python3",
        "python_version": "3.9.18",
        "subreaper": True,
        "owner_pid": None,
        "go_timeout_s": 300.0,
        "started_unix": 1.0,
    }
    raw.update(overrides)
    rd.path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(str(rd.file(proto.LAUNCHER_FILE)), raw)


def exit_raw(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "protocol": 1,
        "launch_id": LAUNCH_ID,
        "exit_code": 137,
        "returncode": None,
        "signal": 9,
        "signal_name": "SIGKILL",
        "reason": "deadline",
        "trainer_pid": 77,
        "deadline_expired": True,
        "kill_sent": True,
        "control": [{"seq": 1, "action": "soft_stop", "reason": "r"}],
        "killed_with_trainer": [{"pid": 78, "command": ["worker", "--rank", "1"]}],
        "survivors_killed": [],
        "unreaped": [],
        "started_unix": 1.0,
        "ended_unix": 2.5,
    }
    raw.update(overrides)
    return raw


def test_wait_for_launcher_reads_and_binds(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    info = rd.wait_for_launcher(1.0)
    assert info.launch_id == LAUNCH_ID and info.pid == 4242 and info.subreaper
    assert info.command == ("python", "train.py")
    assert rd.launch_id == LAUNCH_ID


def test_wait_for_launcher_fails_on_timeout_death_or_early_exit(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    started = time.monotonic()
    with pytest.raises(LauncherError, match=r"after 0\.2s"):
        rd.wait_for_launcher(0.2, poll_s=0.01)
    assert time.monotonic() - started >= 0.2
    with pytest.raises(LauncherError, match="exited before announcing"):
        rd.wait_for_launcher(30, alive=lambda: False)
    atomic_write_json(
        str(rd.file(proto.EXIT_FILE)),
        {"protocol": 1, "launch_id": None, "exit_code": 71, "reason": "subreaper_unavailable"},
    )
    with pytest.raises(LauncherError, match="subreaper_unavailable"):
        rd.wait_for_launcher(30)


def test_records_with_wrong_types_or_protocol_are_rejected(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd, pid="4242")
    with pytest.raises(LauncherError, match="pid"):
        rd.launcher()
    announce(rd, subreaper=1)
    with pytest.raises(LauncherError, match="subreaper"):
        rd.launcher()
    announce(rd, protocol=2)
    with pytest.raises(LauncherError, match="protocol"):
        rd.launcher()


def go_request(**overrides: Any) -> GoRequest:
    fields: dict[str, Any] = {
        "launch_id": LAUNCH_ID,
        "deadline_unix": 1000.0,
        "checkpoint_margin_s": 120,
        "term_grace_s": 5,
        "heartbeat_timeout_s": 15,
        "kill_grace_s": 5,
        "console_log_bytes": 1024,
    }
    return GoRequest(**{**fields, **overrides})


def test_give_go_writes_go_and_the_trainers_deadline_copy(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    with pytest.raises(LauncherError, match="wait_for_launcher"):
        rd.give_go(go_request())
    announce(rd)
    rd.wait_for_launcher(1)
    with pytest.raises(LauncherError, match="names launcher"):
        rd.give_go(go_request(launch_id="f" * 32))
    sent = go_request(env={proto.ENV_RUN_ID: "r-1", "EXTRA": "x"}, extra_args=("--resume", "/ck"))
    rd.give_go(sent, {"format": "soak-deadline-v1"})
    go = json.loads(rd.file(proto.GO_FILE).read_text())
    assert go["launch_id"] == LAUNCH_ID and go["protocol"] == 1
    assert GoRequest.from_json(go) == sent  # the launcher reads back exactly what was sent
    env = sent.trainer_env()
    assert env["SOAK_SOFT_STOP_UNIX"] == "880.0" and env["SOAK_TERM_UNIX"] == "995.0"
    assert env["SOAK_RUN_ID"] == "r-1" and env["EXTRA"] == "x"
    copy = json.loads(rd.file(proto.DEADLINE_COPY_FILE).read_text())
    assert copy["soft_stop_unix"] == 880.0 and copy["term_unix"] == 995.0
    assert copy["run_id"] == "r-1" and copy["record"] == {"format": "soak-deadline-v1"}


def test_go_request_refuses_what_the_launcher_would_refuse() -> None:
    with pytest.raises(ValueError, match="signal"):
        go_request(soft_stop_signal="SIGBOGUS")
    with pytest.raises(ValueError, match="finite"):
        GoRequest.from_json({"launch_id": LAUNCH_ID, "checkpoint_margin_s": 1})


def test_request_sequence_continues_and_validates(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    rd.wait_for_launcher(1)
    assert rd.request("soft_stop", "margin") == 1
    assert rd.request("terminate", "stale") == 2
    # A fresh RunDir (a restarted sidecar) keeps counting from the file.
    other = RunDir(tmp_path)
    other.wait_for_launcher(1)
    assert other.request("kill", "now") == 3
    control = json.loads(rd.file(proto.CONTROL_FILE).read_text())
    assert time.time() - 60 < control.pop("requested_unix") <= time.time()
    assert control == {
        "protocol": 1,
        "launch_id": LAUNCH_ID,
        "seq": 3,
        "action": "kill",
        "reason": "now",
        "stacks_timeout_s": 0.0,
    }
    rd.request("terminate", "stalled", stacks_timeout_s=7.5)
    assert json.loads(rd.file(proto.CONTROL_FILE).read_text())["stacks_timeout_s"] == 7.5
    with pytest.raises(ConfigError):
        rd.request("explode", "x")  # type: ignore[arg-type]


def test_abort_validates_and_is_unbound_before_the_launcher(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    with pytest.raises(ConfigError):
        rd.abort("x", 0)
    rd.abort("refused", 15)
    assert json.loads(rd.file(proto.ABORT_FILE).read_text())["launch_id"] is None
    announce(rd)
    rd.wait_for_launcher(1)
    rd.abort("refused", 15)
    assert json.loads(rd.file(proto.ABORT_FILE).read_text())["launch_id"] == LAUNCH_ID


def test_beats_always_change_content(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    seen = set()
    for _ in range(3):
        rd.beat()
        seen.add(rd.file(proto.HEARTBEAT_FILE).read_bytes())
    assert len(seen) == 3


def test_heartbeat_thread_beats_until_closed(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    before = set(threading.enumerate())
    with Heartbeat(rd, 0.02) as beat:
        wait_until("four heartbeats", lambda: beat.beats >= 4, timeout_s=10)
        assert beat.unwritten == []
        (beating,) = [t for t in set(threading.enumerate()) - before if t.name == "soak-heartbeat"]
    after = rd.file(proto.HEARTBEAT_FILE).read_bytes()
    beats = beat.beats
    # Handshake, not a while: once the beating thread has ended nothing can beat any more, so the
    # file and the count as they were on leaving the block are the last ones.
    wait_until("the heartbeat thread ended", lambda: not beating.is_alive(), timeout_s=10)
    assert rd.file(proto.HEARTBEAT_FILE).read_bytes() == after, "no beats after exit"
    assert beat.beats == beats, "no beats after exit"
    with pytest.raises(ConfigError):
        Heartbeat(rd, 0)


def test_read_exit_parses_and_filters_by_launcher(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    rd.wait_for_launcher(1)
    assert rd.read_exit() is None
    atomic_write_json(str(rd.file(proto.EXIT_FILE)), exit_raw())
    record = rd.read_exit()
    assert isinstance(record, ExitRecord)
    assert record.exit_code == 137 and record.signal == 9 and record.deadline_expired
    assert record.killed_with_trainer == (KilledProcess(78, ("worker", "--rank", "1")),)
    assert record.control[0].action == "soft_stop" and record.trainer_started
    assert rd.wait_exit(0.1) == record
    atomic_write_json(str(rd.file(proto.EXIT_FILE)), exit_raw(launch_id="another"))
    assert rd.read_exit() is None
    assert rd.wait_exit(0.1, poll_s=0.02) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"reason": "vanished"},
        {"exit_code": "137"},
        {"deadline_expired": "yes"},
        {"unreaped": 3},
        {"memory": "oom"},
        {"memory": {"cgroup": "v3", "oom_kills_at_start": 0, "oom_kills_at_end": 1}},
        {"memory": {"cgroup": "v2", "oom_kills_at_start": -1, "oom_kills_at_end": 1}},
        {"memory": {"cgroup": "v2", "oom_kills_at_start": 0, "oom_kills_at_end": True}},
        {"memory": {"cgroup": "v2", "oom_kills_at_start": 0, "oom_kills_at_end": 1, "limit_bytes": 0}},
        {
            "memory": {
                "cgroup": "v2",
                "oom_kills_at_start": 0,
                "oom_kills_at_end": 1,
                "oom_killed": [{"pid": 1}],
            }
        },
        {
            "memory": {
                "cgroup": "v2",
                "oom_kills_at_start": 0,
                "oom_kills_at_end": 1,
                "oom_killed": [{"pid": 1, "command": ["x"]}] * 1025,
            }
        },
    ],
)
def test_malformed_exit_records_raise(tmp_path: Path, bad: dict[str, Any]) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    rd.wait_for_launcher(1)
    atomic_write_json(str(rd.file(proto.EXIT_FILE)), exit_raw(**bad))
    with pytest.raises(LauncherError):
        rd.read_exit()


def test_the_memory_report_round_trips_and_redacts_its_victims(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    announce(rd)
    rd.wait_for_launcher(1)
    victim = {"pid": 77, "command": ["python3", "train.py", "--password", "hunter2"], "at_unix": 5.0}
    memory = {"cgroup": "v1", "limit_bytes": 2**27, "oom_kills_at_start": 4, "oom_kills_at_end": 6}
    atomic_write_json(str(rd.file(proto.EXIT_FILE)), exit_raw(memory={**memory, "oom_killed": [victim]}))
    record = rd.read_exit()
    assert record is not None and record.memory is not None
    assert record.memory.oom_kills == 2 and record.memory.limit_bytes == 2**27
    assert record.memory.oom_killed[0].command[-1] != "hunter2"
    assert ExitRecord.parse(record.to_json()) == record


def test_reset_removes_a_previous_runs_files(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    announce(rd)
    rd.wait_for_launcher(1)
    rd.beat()
    atomic_write_json(str(rd.file(proto.EXIT_FILE)), exit_raw())
    rd.file(proto.CONSOLE_LOG).write_text("old")
    rd.file(".go.json.deadbeef.tmp").write_text("partial")
    keep = rd.path / "unrelated.txt"
    keep.write_text("mine")
    rd.reset()
    assert sorted(p.name for p in rd.path.iterdir()) == ["unrelated.txt"]
    assert rd.launch_id is None and rd.read_exit() is None and rd.console_logs() == []


def test_spawn_local_launcher_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        spawn_local_launcher(tmp_path, [])
    with pytest.raises(LauncherError):
        spawn_local_launcher(tmp_path, ["true"], python=str(tmp_path / "no-python"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("unreaped", ["x"]), ("unreaped", [True]), ("survivors_killed", ["x"]), ("signals_forwarded", [1])],
)
def test_hostile_exit_record_fields_are_protocol_errors(tmp_path: Path, field: str, value: object) -> None:
    raw = {"launch_id": LAUNCH_ID, "exit_code": 0, "reason": "exited", field: value}
    match = field if field != "survivors_killed" else "not an object"
    with pytest.raises(ProtocolError, match=match):
        ExitRecord.parse(raw)
    atomic_write_json(str(tmp_path / proto.EXIT_FILE), {"protocol": proto.PROTOCOL, **raw})
    with pytest.raises(LauncherError, match=match):  # the sidecar's error, from the adapter
        RunDir(tmp_path).read_exit()


def test_run_dir_reads_never_follow_a_link_wait_on_a_fifo_or_read_without_bound(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text('{"protocol": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo.json")  # no writer: a blocking open would hang the reader
    (tmp_path / "huge.json").write_bytes(b" " * (proto.RECORD_LIMIT_BYTES + 1))
    assert read_json(str(tmp_path / "secret")) == {"protocol": 1}
    for name in ("link.json", "fifo.json", "huge.json", "absent.json"):
        assert read_bytes(str(tmp_path / name)) is None, name


def test_the_sidecar_lock_is_never_taken_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / ".sidecar.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="cannot use run dir"), RunDir(tmp_path).exclusive():
        pass


def test_launcher_termination_log_is_cut_on_a_character_and_never_through_a_link(tmp_path: Path) -> None:
    # The launcher writes the trainer container's message with the same writer as the sidecar.
    record = ExitRecord.parse(exit_raw(signal_name="\u00e9" * 5000))
    log = tmp_path / "log"
    write_termination_log(str(log), record)
    assert len(log.read_bytes()) <= 4096 and log.read_bytes().decode("utf-8").startswith("soak-launcher:")
    victim = tmp_path / "victim"
    victim.write_text("keep", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(victim)
    write_termination_log(str(link), record)  # logged, not raised: the launcher still exits
    assert victim.read_text(encoding="utf-8") == "keep"
