"""The pod's shared PID namespace: a worker that double-forks and setsid()s away must not outlive
the launcher. Run inside ``unshare --pid --fork --mount-proc`` with a PID-1 reaper (pause)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.pidns import PidNsResult

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

# Leaves a grandchild in its own session, then exits 0: the classic escape from killpg.
ESCAPING_TRAINER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "3600"])
    os._exit(0)
os.waitpid(pid, 0)
while not any(open(f"/proc/{p}/cmdline", "rb").read().startswith(b"sleep\\0")
              for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/cmdline")):
    time.sleep(0.01)
"""

# The sidecar inside the namespace: starts the launcher, beats, gives go, waits for it.
DRIVER = """
import subprocess, sys, time
from pathlib import Path
from sidecar.adapters.rundir.channel import Heartbeat, RunDir
from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.launcher.protocol.go import GoRequest
run_dir, trainer, flags = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rd = RunDir(run_dir)
rd.reset()
launcher = subprocess.Popen([sys.executable, str(launcher_path()), "--run-dir", str(run_dir),
                             *flags, "--", sys.executable, trainer])
rd.wait_for_launcher(30)
with Heartbeat(rd, 0.2):
    rd.give_go(GoRequest(launch_id=rd.launch_id, deadline_unix=time.time() + 120, checkpoint_margin_s=10,
                         term_grace_s=5, heartbeat_timeout_s=30, kill_grace_s=2, console_log_bytes=1 << 20))
    sys.exit(launcher.wait(timeout=60))
"""


def run_escape(pidns: Callable[..., PidNsResult], tmp_path: Path, *flags: str) -> PidNsResult:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(ESCAPING_TRAINER)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    return pidns([sys.executable, str(driver), str(tmp_path / "run"), str(trainer), *flags], timeout_s=90)


def test_setsid_worker_is_killed_and_reaped_by_the_subreaper(
    pidns: Callable[..., PidNsResult], tmp_path: Path
) -> None:
    result = run_escape(pidns, tmp_path)
    assert result.returncode == 0, result.output
    assert result.leftovers == (), result.output
    record = json.loads((tmp_path / "run" / "exit.json").read_text())
    assert record["reason"] == "exited" and record["exit_code"] == 0
    assert [p["command"] for p in record["survivors_killed"]] == [["sleep", "3600"]]
    assert record["unreaped"] == []


def test_without_the_subreaper_the_worker_escapes_to_pid_1(
    pidns: Callable[..., PidNsResult], tmp_path: Path
) -> None:
    """Proves the test above can fail: the same run with the subreaper off leaks the worker."""
    result = run_escape(pidns, tmp_path, "--no-subreaper")
    assert result.returncode == 0, result.output
    assert [(p.command, p.ppid) for p in result.leftovers] == [("sleep 3600", 1)]
    record = json.loads((tmp_path / "run" / "exit.json").read_text())
    assert record["survivors_killed"] == []
