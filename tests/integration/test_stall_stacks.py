"""The stall's stacks through the real launcher and py-spy: a stop request that asks for them gets
every live process's Python stack (or why not) in stacks.json before the TERM, within its bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.adapters.rundir.zipapp import ARCHIVE_PACKAGE, build_launcher, install_stack_reader
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
