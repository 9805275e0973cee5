"""The sidecar sets its own signal dispositions: Ctrl-C (SIGINT) stops a soak started as a
background job (which inherits SIGINT ignored), and nohup's ignored SIGHUP is kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def start(spawn: Spawner, tmp_path: Path, ignored: tuple[int, ...]) -> subprocess.Popen[bytes]:
    def inherit_ignored() -> None:
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)

    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--status", "off", "--gpu-backend", "none",
        "--sample-interval", "0.2", "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "600",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    return spawn(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, preexec_fn=inherit_ignored)


def steps(tmp_path: Path) -> int:
    found = list((tmp_path / "soak-output" / "runs").glob("*/progress/progress.jsonl"))
    return len(found[0].read_text(encoding="utf-8").splitlines()) if found else 0


def progressed(tmp_path: Path) -> bool:
    return steps(tmp_path) > 0


def reason(tmp_path: Path) -> str:
    (path,) = (tmp_path / "soak-output" / "runs").glob("*/attempt-1/artifact.json")
    found: str = json.loads(path.read_text(encoding="utf-8"))["failure_reason"]
    return found


def test_ctrl_c_stops_a_soak_started_with_sigint_ignored(tmp_path: Path, spawn: Spawner) -> None:
    proc = start(spawn, tmp_path, (signal.SIGINT,))
    wait_until("the trainer's first steps", lambda: progressed(tmp_path), 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 17, err.decode(errors="replace")
    assert "the sidecar got Ctrl-C" in reason(tmp_path)


def test_nohups_ignored_sighup_is_kept(tmp_path: Path, spawn: Spawner) -> None:
    proc = start(spawn, tmp_path, (signal.SIGHUP,))
    wait_until("the trainer's first steps", lambda: progressed(tmp_path), 60)
    proc.send_signal(signal.SIGHUP)  # a closed terminal, under nohup: the soak goes on
    after = steps(tmp_path) + 10
    wait_until(
        "ten more steps after the SIGHUP", lambda: steps(tmp_path) >= after or proc.poll() is not None, 60
    )
    assert proc.poll() is None, "the SIGHUP stopped the soak"
    proc.send_signal(signal.SIGTERM)  # then a real stop, which names itself
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 17, err.decode(errors="replace")
    assert "SIGTERM" in reason(tmp_path) and "SIGHUP" not in reason(tmp_path)
