"""What the trainer writes is a claim: a forged run-dir record can neither aim the sidecar's kills nor
switch its leak checks off (the real CLI, launcher and processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fixtures.processes import Spawner

pytestmark = pytest.mark.integration

FAST = {
    "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
    "SOAK_MONITOR__STATUS_LINE": "off",
    "SOAK_LAUNCHER__KILL_GRACE_S": "1",
}

# A trainer that overwrites the launcher's trainer.json to name another process (pid and group),
# then either stops its launcher and hangs ("stop-launcher": only the sidecar's own kill can end it)
# or becomes the example trainer with the given flags.
FORGER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    path = os.path.join(os.environ["SOAK_RUN_DIR"], "trainer.json")
    while not os.path.exists(path):
        time.sleep(0.01)
    record = json.load(open(path))
    forged = int(sys.argv[1])
    record.update(pid=forged, pgid=forged, start_ticks=None)
    with open(path + ".forged", "w") as out:
        json.dump(record, out)
    os.replace(path + ".forged", path)
    if sys.argv[2] == "stop-launcher":
        os.kill(os.getppid(), signal.SIGSTOP)
        time.sleep(600)
    os.execv(sys.executable, [sys.executable, "-m", "sidecar.examples.trainer", *sys.argv[3:]])
    """
)


def run_cli(spawn: Spawner, tmp: Path, *args: str, **env: str) -> tuple[int, str]:
    proc = spawn(
        [sys.executable, "-m", "sidecar.cli", "run", "--local", *args],
        cwd=tmp,
        env={**os.environ, **FAST, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.decode(errors="replace")


def artifact(tmp: Path) -> dict[str, Any]:
    (path,) = (tmp / "soak-output" / "runs").glob("*/*/artifact.json")
    result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return result


def test_a_forged_trainer_json_does_not_switch_the_leak_check_off(tmp_path: Path, spawn: Spawner) -> None:
    decoy = spawn(["sleep", "600"])  # never in the launcher's tree
    code, err = run_cli(
        spawn, tmp_path, "--", sys.executable, "-c", FORGER, str(decoy.pid), "run",
        "--leak-fds", "50", "--steps", "10", "--step-s", "0.3",
        SOAK_MONITOR__MAX_FD_GROWTH="50",
    )  # fmt: skip
    assert code == 13, err
    found = artifact(tmp_path)
    assert found["failure_classification"] == "resource_leak"
    assert found["resource_summary"]["fd_growth"] > 50
    assert f"trainer.json names pid {decoy.pid}" in found["protocol_violations"][0]


def test_a_forged_trainer_json_cannot_aim_the_sidecars_kill(tmp_path: Path, spawn: Spawner) -> None:
    """The launcher is stopped, so the sidecar's own kill fallback ends the hung trainer: the group
    it kills is the trainer it saw, not the unrelated process trainer.json names."""
    decoy = spawn(["sleep", "600"])  # its own session and group, outside the run
    code, err = run_cli(
        spawn, tmp_path, "--startup-timeout", "3", "--", sys.executable, "-c", FORGER, str(decoy.pid),
        "stop-launcher",
    )  # fmt: skip
    assert code != 0, err
    assert decoy.poll() is None and psutil.Process(decoy.pid).status() != psutil.STATUS_ZOMBIE
    found = artifact(tmp_path)
    assert f"trainer.json names pid {decoy.pid}" in found["protocol_violations"][0], found
