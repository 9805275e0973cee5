"""Pure parts of the launcher: deadline clock, go.json validation, console log bound, files."""

from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.launcher import main as launcher_main
from sidecar.launcher import output
from sidecar.launcher.deadline import MonotonicDeadline
from sidecar.launcher.output import ConsoleLog, FdWriter, OutputTee
from sidecar.launcher.proc import command_problem
from sidecar.launcher.protocol import names as proto
from sidecar.launcher.protocol.fields import signal_number
from sidecar.launcher.protocol.files import atomic_write_json, read_json
from sidecar.launcher.protocol.go import GoRequest


class FakeClock:
    def __init__(self) -> None:
        self.wall_now = 1_000_000.0
        self.mono_now = 50.0

    def wall(self) -> float:
        return self.wall_now

    def monotonic(self) -> float:
        return self.mono_now

    def advance(self, seconds: float) -> None:
        self.wall_now += seconds
        self.mono_now += seconds


def test_wall_clock_rollback_cannot_extend_the_deadline() -> None:
    clock = FakeClock()
    deadline = MonotonicDeadline(clock.wall_now + 100.0, wall=clock.wall, monotonic=clock.monotonic)
    clock.advance(40.0)
    assert deadline.remaining() == pytest.approx(60.0)
    clock.wall_now -= 3600.0  # someone sets the clock back an hour
    assert deadline.remaining() == pytest.approx(60.0)
    clock.advance(60.0)
    assert deadline.remaining() == pytest.approx(0.0)


def test_wall_clock_jump_forward_shortens_it() -> None:
    clock = FakeClock()
    deadline = MonotonicDeadline(clock.wall_now + 100.0, wall=clock.wall, monotonic=clock.monotonic)
    clock.wall_now += 30.0
    assert deadline.remaining() == pytest.approx(70.0)


def go_raw(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "deadline_unix": 2_000_000_000.0,
        "checkpoint_margin_s": 120,
        "term_grace_s": 5,
        "heartbeat_timeout_s": 15,
        "kill_grace_s": 5,
        "console_log_bytes": 1024,
        "soft_stop_signal": "SIGUSR2",
        "env": {"A": "1"},
    }
    raw.update(overrides)
    return raw


def test_go_request_parses_a_valid_go() -> None:
    go = GoRequest.from_json(go_raw())
    assert go.deadline_unix == 2_000_000_000.0
    assert go.soft_stop_signum == signal.SIGUSR2
    assert go.env == {"A": "1"} and go.console_log_bytes == 1024


def test_the_exit_grace_is_5_s_unless_go_json_says_otherwise_and_travels_in_it() -> None:
    assert GoRequest.from_json(go_raw()).exit_grace_s == 5.0
    for grace in (0, 0.5, 60):
        go = GoRequest.from_json(go_raw(exit_grace_s=grace))
        assert go.exit_grace_s == grace and GoRequest.from_json(go.to_json()) == go


@pytest.mark.parametrize(
    "bad",
    [
        {"deadline_unix": None},
        {"deadline_unix": True},
        {"deadline_unix": math.nan},
        {"deadline_unix": math.inf},
        {"deadline_unix": "soon"},
        {"checkpoint_margin_s": 0},
        {"term_grace_s": -1},
        {"kill_grace_s": -1},
        {"heartbeat_timeout_s": 0},
        {"console_log_bytes": 0},
        {"console_log_bytes": 1.5},
        {"console_log_bytes": True},
        {"soft_stop_signal": "SIGNOPE"},
        {"env": {"A": 1}},
        {"env": ["A=1"]},
        {"exit_grace_s": -0.1},
        {"exit_grace_s": math.nan},
        {"exit_grace_s": math.inf},
        {"exit_grace_s": True},
        {"exit_grace_s": "5"},
        {"exit_grace_s": 61},
        {"exit_grace_s": 1e12},
    ],
)
def test_go_request_rejects_malformed_fields(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"go\.json|signal"):
        GoRequest.from_json(go_raw(**bad))


@pytest.mark.parametrize("name", ["SIGUSR1", "usr1", "USR1", " sigusr1 ", str(int(signal.SIGUSR1))])
def test_signal_number_accepts_names_and_numbers(name: str) -> None:
    assert signal_number(name) == signal.SIGUSR1


def test_signal_number_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        signal_number("SIGWHATEVER")
    with pytest.raises(ValueError):
        signal_number("999")


def test_console_log_stays_within_its_cap_and_keeps_the_tail(tmp_path: Path) -> None:
    path = tmp_path / proto.CONSOLE_LOG
    cap = 1000
    log = ConsoleLog(str(path), cap)
    written = b""
    for i in range(300):
        chunk = f"{i:04d}-".encode() * (i % 7 + 1)
        log.write(chunk)
        written += chunk
        rotated = tmp_path / proto.CONSOLE_LOG_ROTATED
        total = path.stat().st_size + (rotated.stat().st_size if rotated.exists() else 0)
        assert total <= cap
    log.write(b"x" * 5000)  # one chunk far over the cap
    written += b"x" * 5000
    log.close()
    kept = (tmp_path / proto.CONSOLE_LOG_ROTATED).read_bytes() + path.read_bytes()
    assert cap // 2 < len(kept) <= cap
    assert written.endswith(kept)


def test_atomic_write_json_leaves_no_temp_and_read_json_tolerates_garbage(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    atomic_write_json(str(target), {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    assert read_json(str(target)) == {"a": [1, 2], "b": 1}
    assert read_json(str(tmp_path / "missing.json")) is None
    target.write_text("{not json")
    assert read_json(str(target)) is None
    target.write_text("[1, 2]")
    assert read_json(str(target)) is None


def test_command_line_errors_exit_with_usage_code(tmp_path: Path) -> None:
    assert launcher_main.main(["--run-dir", str(tmp_path)]) == proto.EXIT_USAGE
    assert launcher_main.main(["--run-dir", str(tmp_path), "--"]) == proto.EXIT_USAGE
    assert (
        launcher_main.main(["--run-dir", str(tmp_path), "--go-timeout", "0", "--", "x"]) == proto.EXIT_USAGE
    )
    assert launcher_main.main(["--", "x"]) == proto.EXIT_USAGE
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert launcher_main.main(["--run-dir", str(blocker / "run"), "--", "x"]) == proto.EXIT_USAGE


def test_protocol_names_are_consistent() -> None:
    assert len(set(proto.RUN_DIR_FILES)) == len(proto.RUN_DIR_FILES)
    assert {proto.EXIT_FILE, proto.GO_FILE, proto.LAUNCHER_FILE} <= set(proto.RUN_DIR_FILES)
    assert proto.CONSOLE_LOG_ROTATED == proto.CONSOLE_LOG + ".1"
    codes = [
        proto.EXIT_USAGE,
        proto.EXIT_PROTOCOL,
        proto.EXIT_LAUNCHER_ERROR,
        proto.EXIT_SUBREAPER,
        proto.EXIT_GO_TIMEOUT,
        proto.EXIT_INSUFFICIENT_BUDGET,
        proto.EXIT_SUPERVISOR_LOST,
        proto.EXIT_NOT_EXECUTABLE,
        proto.EXIT_NOT_FOUND,
    ]
    assert len(set(codes)) == len(codes) and all(0 < c < 128 for c in codes)


def test_launcher_is_standard_library_only() -> None:
    """It runs under the trainer image's own interpreter (MIN_PYTHON): standard library and its own
    modules only, imported relatively (the zipapp holds it under another name), no 3.10+ syntax."""
    import ast
    import sys

    package = Path(launcher_main.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 10
    for source in sources:
        tree = ast.parse(source.read_text(), feature_version=proto.MIN_PYTHON)
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
        assert modules - {"__future__"} <= set(sys.stdlib_module_names), source
        assert not any(isinstance(node, ast.Match) for node in ast.walk(tree)), source


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    got = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            got += chunk
    except BlockingIOError:
        pass
    return got


def test_fd_writer_never_blocks_on_an_unread_pipe_and_counts_what_it_drops() -> None:
    read_end, write_end = os.pipe()
    try:
        writer = FdWriter(write_end, 256 * 1024)
        chunks = [bytes([65 + i % 26]) * 65536 for i in range(64)]  # 4 MiB, pipe holds 64 KiB
        started = time.monotonic()
        for chunk in chunks:
            writer.put(chunk)
        assert time.monotonic() - started < 1.0, "put() must only queue"
        assert writer.dropped_bytes > 0 and writer.queued() <= 256 * 1024
        started = time.monotonic()
        writer.close(0.3)
        assert time.monotonic() - started < 1.0, "close() is bounded"
        writer.put(b"after close")
        shown = _drain(read_end)
        total = sum(len(c) for c in chunks)
        # PIPE_BUF-sized atomic writes: exact, except that the one write blocked at close() lands
        # when we drain the pipe here (the launcher exits instead, which the integration test checks).
        assert 0 <= len(shown) + writer.dropped_bytes - total <= select.PIPE_BUF
        assert b"".join(chunks).startswith(shown)
        assert os.get_blocking(write_end), "O_NONBLOCK is never set on the target fd"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_fd_writer_delivers_everything_in_order_to_a_reader() -> None:
    read_end, write_end = os.pipe()
    try:
        writer = FdWriter(write_end, 1 << 20)
        sent = b""
        got = b""
        for i in range(2000):
            line = f"line {i:05d}\n".encode()
            writer.put(line)
            sent += line
            if i % 100 == 0:
                assert writer.flush(5.0)
                got += _drain(read_end)
        writer.close(5.0)
        got += _drain(read_end)
        assert got == sent and writer.dropped_bytes == 0 and writer.error is None
    finally:
        os.close(read_end)
        os.close(write_end)


def test_fd_writer_stops_quietly_when_the_reader_is_gone() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        writer = FdWriter(write_end, 1 << 20)
        writer.put(b"x" * 100)
        assert writer.flush(5.0)
        assert isinstance(writer.error, BrokenPipeError)
        writer.put(b"y" * 100)
        writer.close(0.1)
        assert writer.dropped_bytes == 0, "a closed stdout is not a slow reader"
    finally:
        os.close(write_end)


def test_drop_notes_are_rate_limited_and_the_last_one_comes_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[str] = []
    monkeypatch.setattr(output, "log", notes.append)
    read_end, write_end = os.pipe()
    try:
        writer = FdWriter(write_end, 1 << 20)
        tee = OutputTee(writer)
        writer.dropped_bytes = 1000
        tee.note()
        writer.dropped_bytes = 1500
        tee.note()  # within DROP_NOTE_INTERVAL_S of the first note: silent
        assert notes == ["1000 bytes of trainer output not shown (stdout reader too slow)"]
        tee._drop_noted_at -= output.DROP_NOTE_INTERVAL_S
        tee.note()
        writer.dropped_bytes = 1600
        tee.close()  # the final note, whatever the interval
        tee.note()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert notes[1:] == [
        "500 bytes of trainer output not shown (stdout reader too slow)",
        "100 bytes of trainer output not shown (stdout reader too slow)",
    ]


def test_command_problem_is_what_the_spawn_would_find(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o644)
    assert command_problem([str(script)]) == "is not executable"
    script.chmod(0o755)
    assert command_problem([str(script), "--flag"]) is None
    assert command_problem([str(tmp_path / "absent")]) == "was not found"
    assert command_problem(["no-such-program-on-path"]) == "was not found"
    assert command_problem(["sh"]) is None
    assert command_problem([]) == "was not found"


def test_the_chart_and_docs_state_the_launchers_minimum_python() -> None:
    """MIN_PYTHON is declared once; what users read about the trainer image's Python says the same."""
    root = Path(__file__).resolve().parents[2]
    stated = f"{proto.MIN_PYTHON[0]}.{proto.MIN_PYTHON[1]}"
    for name in ("helm/soak-sidecar/values.yaml", "helm/soak-sidecar/values.schema.json"):
        versions = set(re.findall(r"runs the launcher \((\d+\.\d+) or newer\)", (root / name).read_text()))
        assert versions == {stated}, name


def test_the_launcher_can_make_itself_non_dumpable() -> None:
    """refuse_tracers in a child (it is irreversible): PR_GET_DUMPABLE then reads 0."""
    import ctypes

    from sidecar.launcher.proc import refuse_tracers

    child = os.fork()
    if child == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = refuse_tracers() and libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
