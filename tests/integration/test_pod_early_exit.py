"""A pod's sidecar that ends before the go-ahead releases the waiting launcher, so the trainer never
starts and the pod does not linger: through abort.json when the run dir takes it, else through
abort.json in the run dir named on the launcher's command line (a sidecar under another UID cannot
signal it), else by SIGTERM to the launcher. Run as in a pod: launcher and sidecar side share a
fresh PID namespace."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.launcher.protocol import names as proto
from tests.fixtures.pidns import PidNsResult

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

# The pod in small: the launcher as the chart starts it, then the sidecar's early exit.
POD = """
import json, subprocess, sys, time
from pathlib import Path
from sidecar.adapters.rundir.channel import RunDir
from sidecar.adapters.rundir.pod import release_waiting_launcher
from sidecar.adapters.rundir.zipapp import launcher_path
run_dir, sidecar_run_dir, marker, term_log = map(Path, sys.argv[1:5])
moved = sys.argv[5] == "move"
launcher = subprocess.Popen([sys.executable, str(launcher_path()), "--run-dir", str(run_dir),
                             "--termination-log", str(term_log), "--",
                             sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"])
RunDir(run_dir).wait_for_launcher(30)
if moved:
    run_dir.rename(run_dir.with_name("moved"))
done = release_waiting_launcher(sidecar_run_dir, "soak-sidecar exited early: bad settings", 64)
print(json.dumps({"done": done, "launcher_exit": launcher.wait(timeout=30)}))
"""


def pod(
    pidns: Callable[..., PidNsResult], tmp_path: Path, sidecar_run_dir: Path, *, move: bool = False
) -> dict[str, object]:
    run_dir = tmp_path / "run"
    result = pidns(
        [
            sys.executable,
            "-c",
            POD,
            str(run_dir),
            str(sidecar_run_dir),
            str(tmp_path / "marker"),
            str(tmp_path / "termination-log"),
            "move" if move else "stay",
        ],
        timeout_s=90,
    )
    assert result.returncode == 0, result.output
    assert not result.leftovers, result.leftovers
    (line,) = [line for line in result.output.splitlines() if line.startswith("{")]
    report: dict[str, object] = json.loads(line)
    assert not (tmp_path / "marker").exists(), "the trainer must never start"
    return report


def test_abort_through_the_run_dir(pidns: Callable[..., PidNsResult], tmp_path: Path) -> None:
    report = pod(pidns, tmp_path, tmp_path / "run")
    assert report["done"] == f"abort.json written to {tmp_path / 'run'}"
    assert report["launcher_exit"] == 64  # the sidecar's own exit code, on the trainer container too
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("soak-launcher: ") and '"reason": "aborted"' in message, message
    exit_record = json.loads((tmp_path / "run" / proto.EXIT_FILE).read_text())
    assert exit_record["reason"] == "aborted"


def test_abort_through_the_launchers_run_dir_when_the_sidecars_is_unusable(
    pidns: Callable[..., PidNsResult], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the sidecar expects its run dir")
    report = pod(pidns, tmp_path, blocker / "run")
    assert report["done"] == f"abort.json written to {tmp_path / 'run'}"
    assert report["launcher_exit"] == 64


def test_sigterm_when_no_run_dir_is_usable(pidns: Callable[..., PidNsResult], tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the sidecar expects its run dir")
    report = pod(pidns, tmp_path, blocker / "run", move=True)  # the launcher's run dir is gone too
    assert str(report["done"]).startswith("SIGTERM to launcher pid ")
    assert report["launcher_exit"] == 128 + 15
    assert '"reason": "signalled"' in (tmp_path / "termination-log").read_text()


def test_nothing_once_the_trainer_runs(tmp_path: Path) -> None:
    """After go.json the launcher is the heartbeat's business: an early-exit path must not abort."""
    from sidecar.adapters.rundir.pod import release_waiting_launcher

    (tmp_path / proto.GO_FILE).write_text("{}")
    done = release_waiting_launcher(tmp_path, "late", 70)
    assert "heartbeat" in done
    assert not (tmp_path / proto.ABORT_FILE).exists()
