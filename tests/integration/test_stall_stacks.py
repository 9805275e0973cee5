"""The stall's stacks through the real launcher and py-spy: a stop request that asks for them gets
every live process's Python stack (or why not) in stacks.json before the TERM, within its bound."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.adapters.rundir.channel import RunDir
from sidecar.adapters.rundir.zipapp import (
    ARCHIVE_PACKAGE,
    build_launcher,
    install_stack_reader,
    launcher_path,
)
from sidecar.launcher.protocol import names as proto
from sidecar.launcher.protocol.files import read_json
from sidecar.launcher.protocol.stacks import StacksRecord
from sidecar.launcher.stacks import capture, find_py_spy
from tests.fixtures.processes import Spawner
from tests.integration.test_launcher_process import Run, launch  # noqa: F401  (the fixture)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# The launcher is stdlib-only: the system interpreter, which another UID can run.
SYSTEM_PYTHON = "/usr/bin/python3"

# A shell that runs a Python process stuck in a named function, and tells where it got to.
STUCK = """
import sys, time
open(sys.argv[1], "w").write("ready")
def waiting_for_the_collective():
    while True:
        time.sleep(0.2)
waiting_for_the_collective()
"""


@pytest.fixture(scope="module")
def py_spy() -> str:
    tool = find_py_spy()
    if tool is None:
        pytest.fail("py-spy is not installed (requirements.lock installs it)")
    return tool


def stuck(tmp_path: Path) -> tuple[list[str], Path]:
    script, ready = tmp_path / "stuck.py", tmp_path / "ready"
    script.write_text(STUCK)
    return ["sh", "-c", f'"{sys.executable}" "{script}" "{ready}"; echo never'], ready


def test_a_stall_stop_takes_every_stack_before_the_term(
    launch: Callable[..., Run],  # noqa: F811
    tmp_path: Path,
    py_spy: str,
) -> None:
    command, ready = stuck(tmp_path)
    run = launch(command)
    run.go(kill_grace=2.0)
    wait_until("trainer ready", ready.exists)
    asked = time.time()
    run.rd.request("terminate", "progress stalled", stacks_timeout_s=10.0)
    record = run.finish()
    raw = read_json(str(run.rd.file(proto.STACKS_FILE)))
    assert raw is not None
    stacks = StacksRecord.parse(raw)
    assert stacks.tool == py_spy and stacks.requested_unix is not None and stacks.requested_unix >= asked
    by_program = {p.command[0].rsplit("/", 1)[-1]: p for p in stacks.processes}
    python = next(p for name, p in by_program.items() if name.startswith("python"))
    assert python.stack is not None and "waiting_for_the_collective" in python.stack
    assert by_program["sh"].missing == "not a Python process"
    # Before the TERM, which ended the trainer.
    assert stacks.captured_unix <= record.stop_times_unix["term"]
    assert record.reason == "control" and record.term_sent


def test_a_stop_without_stacks_takes_none(launch: Callable[..., Run], tmp_path: Path) -> None:  # noqa: F811
    command, ready = stuck(tmp_path)
    run = launch(command)
    run.go(kill_grace=2.0)
    wait_until("trainer ready", ready.exists)
    run.rd.request("terminate", "GPU fault")
    assert run.finish().term_sent
    assert not run.rd.file(proto.STACKS_FILE).exists()


def test_a_reader_past_its_bound_is_named_timed_out(tmp_path: Path, spawn: Spawner, py_spy: str) -> None:
    proc = spawn(python_stuck(tmp_path))
    wait_until("stuck process ready", (tmp_path / "ready").exists)
    started = time.monotonic()
    record = capture([proc.pid], tool=py_spy, timeout_s=0.001, launch_id="x", requested_unix=None)
    assert time.monotonic() - started < 5.0  # the killed reader is reaped, not waited out
    assert [p.missing for p in record.processes] == ["timed out after 0.001s"]


def test_without_py_spy_each_process_says_why(tmp_path: Path, spawn: Spawner) -> None:
    proc = spawn(python_stuck(tmp_path))
    wait_until("stuck process ready", (tmp_path / "ready").exists)
    record = capture([proc.pid], tool=None, timeout_s=5.0, launch_id="x", requested_unix=None)
    (process,) = record.processes
    assert process.stack is None and process.missing is not None and "was not found" in process.missing


def python_stuck(tmp_path: Path) -> list[str]:
    """The stuck Python program alone; the caller waits for its ready file."""
    _, ready = stuck(tmp_path)
    return [sys.executable, str(tmp_path / "stuck.py"), str(ready)]


def test_a_process_of_another_user_is_named_ptrace_refused(
    tmp_path: Path, spawn: Spawner, py_spy: str
) -> None:
    """The launcher's capture under an unprivileged UID may not read root's process: the kernel's
    refusal, named. The launcher's own file and py-spy, beside it, as install-launcher puts them."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the launcher's capture under another UID")
    proc = spawn(python_stuck(tmp_path))
    wait_until("stuck process ready", (tmp_path / "ready").exists)
    with tempfile.TemporaryDirectory() as shared:
        os.chmod(shared, 0o755)
        launcher = build_launcher(Path(shared))
        reader = install_stack_reader(Path(shared))
        assert reader is not None
        code = (
            f"import json, sys\nsys.path.insert(0, {str(launcher)!r})\n"
            f"from {ARCHIVE_PACKAGE}.stacks import capture\n"
            f"record = capture([{proc.pid}], tool={str(reader)!r}, timeout_s=20.0, launch_id='x', "
            "requested_unix=None)\nprint(json.dumps(record.to_json()))\n"
        )
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c", code]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=shared)
    assert done.returncode == 0, done.stderr
    (process,) = StacksRecord.parse(json.loads(done.stdout)).processes
    assert process.stack is None and process.missing == "ptrace refused"


# -- from the trainer's side: a reader it put in py-spy's place, its argv, its own control requests --

# A "py-spy" that leaves a daemon (in a session of its own) holding its pipes, then hangs itself.
DAEMON_READER = """#!/bin/sh
setsid sh -c 'echo $$ >> "{pids}"; exec sleep 20' &
exec sleep 20
"""
# A "py-spy" that writes without end.
FLOOD_READER = """#!{python}
import os
chunk = b"x" * (1 << 20)
while True:
    os.write(1, chunk)
"""


def fake_reader(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "py-spy"
    tool.write_text(text)
    tool.chmod(0o755)
    return tool


def kill_listed(pids: Path) -> list[int]:
    """Kills the daemons a fake reader listed (a test leaves nothing behind); the pids it killed."""
    killed = []
    for line in pids.read_text().split() if pids.exists() else []:
        try:
            os.kill(int(line), signal.SIGKILL)
            killed.append(int(line))
        except ProcessLookupError:
            pass
    return killed


def test_a_reader_whose_daemon_holds_its_pipes_is_not_waited_out(tmp_path: Path, spawn: Spawner) -> None:
    proc = spawn(python_stuck(tmp_path))
    wait_until("stuck process ready", (tmp_path / "ready").exists)
    pids = tmp_path / "daemons"
    tool = fake_reader(tmp_path / "bin", DAEMON_READER.format(pids=pids))
    try:
        started = time.monotonic()
        record = capture([proc.pid], tool=str(tool), timeout_s=1.0, launch_id="x", requested_unix=None)
        assert time.monotonic() - started < 4.0
        assert [p.missing for p in record.processes] == ["timed out after 1s"]
    finally:
        kill_listed(pids)


def test_a_flooding_reader_is_read_within_bounds(tmp_path: Path) -> None:
    """In a process of its own, whose peak memory tells what the capture kept."""
    tool = fake_reader(tmp_path / "bin", FLOOD_READER.format(python=sys.executable))
    probe = (
        "import os, resource, sys, time\n"
        "from sidecar.launcher.stacks import capture\n"
        # Peak memory survives exec on Linux: what counts is how much the capture added.
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "started = time.monotonic()\n"
        f"record = capture([os.getpid()], tool={str(tool)!r}, timeout_s=2.0, launch_id='x',"
        " requested_unix=None)\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(time.monotonic() - started, grew // 1024)\n"
        "print(record.processes[0].missing)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env, timeout=60, check=True)
    took, grew_mib, missing = done.stdout.decode().split(maxsplit=2)
    assert float(took) < 5.0
    assert int(grew_mib) < 200
    assert missing.strip() == "timed out after 2s"


@pytest.mark.parametrize(
    "secrets",
    [["--token", "s3cr3t", "--password=hunter2"], ["--note", "x\nPython v9", "--token", "s3cr3t", "hunter2"]],
    ids=["plain", "an argument that fakes py-spy's version line"],
)
def test_a_dump_keeps_no_command_line(
    tmp_path: Path, spawn: Spawner, py_spy: str, secrets: list[str]
) -> None:
    """py-spy prints the target's argv above its stack: the record keeps it apart, to be redacted."""
    proc = spawn([*python_stuck(tmp_path), *secrets])
    wait_until("stuck process ready", (tmp_path / "ready").exists)
    record = capture([proc.pid], tool=py_spy, timeout_s=10.0, launch_id="x", requested_unix=None)
    (process,) = record.processes
    assert process.stack is not None and "waiting_for_the_collective" in process.stack
    assert process.stack.startswith(f"Process {proc.pid}\nPython v")
    assert "s3cr3t" not in process.stack and "hunter2" not in process.stack
    assert "s3cr3t" in process.command  # apart, for the sidecar's redaction


def launcher_beside(folder: Path, tool_text: str) -> Path:
    """A copy of the launcher with a "py-spy" beside it (where the chart's init container puts the
    real one, on a volume the trainer may be able to write)."""
    fake_reader(folder, tool_text)
    copy = folder / launcher_path().name
    shutil.copyfile(launcher_path(), copy)
    return copy


def test_a_hanging_reader_does_not_hold_up_the_stop_nor_outlive_the_launcher(
    tmp_path: Path, spawn: Spawner
) -> None:
    pids = tmp_path / "daemons"
    launcher = launcher_beside(tmp_path / "soak-bin", DAEMON_READER.format(pids=pids))
    command, ready = stuck(tmp_path)
    rd = RunDir(tmp_path / "run")
    rd.reset()
    proc = spawn([sys.executable, str(launcher), "--run-dir", str(rd.path), "--", *command])
    try:
        run = Run(proc, rd, tmp_path / "unused")
        run.go(kill_grace=1.0)
        wait_until("trainer ready", ready.exists)
        asked = time.monotonic()
        run.rd.request("terminate", "progress stalled", stacks_timeout_s=1.0)
        record = run.finish(timeout_s=30.0)
        assert time.monotonic() - asked < 8.0
        assert record.term_sent and record.reason == "control"
        raw = read_json(str(run.rd.file(proto.STACKS_FILE)))
        assert raw is not None
        stacks = StacksRecord.parse(raw)
        assert stacks.tool == str(launcher.parent / "py-spy")  # beside the launcher's file
        assert {p.missing for p in stacks.processes} == {"timed out after 1s"}
    finally:
        # Its daemons were the launcher's (a subreaper's) to kill: none is left to kill here.
        assert kill_listed(pids) == []


# The trainer, told to stop, asks for its stacks again and again (it can write control.json).
REASKING = """
import json, os, signal, sys, time
run_dir = os.environ["SOAK_RUN_DIR"]
launch_id = json.load(open(os.path.join(run_dir, "launcher.json")))["launch_id"]
def reask(*_):
    for seq in range(1000, 1100):
        tmp = os.path.join(run_dir, ".forged.tmp")
        with open(tmp, "w") as out:
            json.dump({"protocol": 1, "launch_id": launch_id, "seq": seq, "action": "terminate",
                       "reason": "forged", "stacks_timeout_s": 60}, out)
        os.replace(tmp, os.path.join(run_dir, "control.json"))
        time.sleep(0.2)
signal.signal(signal.SIGTERM, reask)
open(sys.argv[1], "w").write("ready")
while True:
    time.sleep(0.2)
"""


def test_a_request_after_the_term_takes_no_stacks_over_the_stalls(
    launch: Callable[..., Run],  # noqa: F811
    tmp_path: Path,
    py_spy: str,
) -> None:
    script, ready = tmp_path / "reasking.py", tmp_path / "ready"
    script.write_text(REASKING)
    run = launch([sys.executable, str(script), str(ready)])
    run.go(kill_grace=2.0)
    wait_until("trainer ready", ready.exists)
    run.rd.request("terminate", "progress stalled", stacks_timeout_s=10.0)
    record = run.finish()
    raw = read_json(str(run.rd.file(proto.STACKS_FILE)))
    assert raw is not None
    stacks = StacksRecord.parse(raw)
    assert stacks.captured_unix <= record.stop_times_unix["term"]  # the stall's, not a later one
    assert record.stop_times_unix["kill"] - record.stop_times_unix["term"] < 2.0 + 1.0


def test_a_stacks_file_the_launcher_cannot_replace_does_not_fail_the_stop(
    launch: Callable[..., Run],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The trainer made stacks.json a folder: the stacks are lost, the stop is not."""
    command, ready = stuck(tmp_path)
    run = launch(command)
    run.go(kill_grace=2.0)
    wait_until("trainer ready", ready.exists)
    (run.rd.file(proto.STACKS_FILE) / "in-the-way").mkdir(parents=True)
    run.rd.request("terminate", "progress stalled", stacks_timeout_s=5.0)
    record = run.finish()
    assert record.reason == "control" and record.term_sent
