"""A pod's sidecar that ends before the go-ahead releases the waiting launcher, so the trainer never
starts and the pod does not linger: through abort.json when the run dir takes it, else by SIGTERM to
the launcher its launcher.json names, verified. Processes that merely look like launchers (by their
command line) are never written to nor signalled. Run as in a pod: launcher and sidecar side share a
fresh PID namespace."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.adapters.procfs import same_process_alive
from sidecar.adapters.provenance import boot_id
from sidecar.adapters.rundir.pod import release_waiting_launcher
from sidecar.launcher.protocol import names as proto
from tests.fixtures.pidns import PidNsResult

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

# The pod in small: the launcher as the chart starts it, a decoy that looks like a launcher by its
# command line (and names a run dir of its own), then the sidecar's early exit. "block-abort" makes
# abort.json unwritable (a directory in its place); "forge" points launcher.json at the decoy.
POD = """
import json, os, shutil, subprocess, sys, time
from pathlib import Path
from sidecar.adapters.procfs import same_process_alive
from sidecar.adapters.provenance import boot_id
from sidecar.adapters.rundir.channel import RunDir
from sidecar.adapters.rundir.pod import release_waiting_launcher
from sidecar.adapters.rundir.zipapp import launcher_path
run_dir, sidecar_run_dir, marker, term_log = map(Path, sys.argv[1:5])
how = sys.argv[5]
decoy_dir = run_dir.with_name("decoy-run")
decoy_dir.mkdir()
decoy_file = run_dir.with_name(launcher_path().name)
ready = decoy_file.with_suffix(".ready")
decoy_file.write_text(f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(600)")
decoy = subprocess.Popen([sys.executable, str(decoy_file), "--run-dir", str(decoy_dir)])
while not ready.exists():  # started, so the launcher starts on a later clock tick than the decoy
    time.sleep(0.01)
launcher = subprocess.Popen([sys.executable, str(launcher_path()), "--run-dir", str(run_dir),
                             "--go-timeout", "20", "--termination-log", str(term_log), "--",
                             sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"])
RunDir(run_dir).wait_for_launcher(30)
if how in ("block-abort", "forge"):
    (run_dir / "abort.json").mkdir()
if how == "forge":
    record = json.loads((run_dir / "launcher.json").read_text())
    record["pid"] = decoy.pid
    (run_dir / "launcher.json").write_text(json.dumps(record))
done = release_waiting_launcher(sidecar_run_dir, "soak-sidecar exited early: bad settings", 64,
                                is_running=same_process_alive, boot_id=boot_id())
if how == "forge":
    shutil.rmtree(run_dir / "abort.json")
    RunDir(run_dir).abort("test over", 64)
print(json.dumps({"done": done, "launcher_pid": launcher.pid, "launcher_exit": launcher.wait(timeout=60),
                  "decoy_alive": decoy.poll() is None, "decoy_dir": os.listdir(decoy_dir)}))
decoy.kill()
decoy.wait()
"""


def pod(
    pidns: Callable[..., PidNsResult], tmp_path: Path, sidecar_run_dir: Path, how: str = "plain"
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
            how,
        ],
        timeout_s=90,
    )
    assert result.returncode == 0, result.output
    assert not result.leftovers, result.leftovers
    (line,) = [line for line in result.output.splitlines() if line.startswith("{")]
    report: dict[str, object] = json.loads(line)
    assert not (tmp_path / "marker").exists(), "the trainer must never start"
    assert report["decoy_alive"] and report["decoy_dir"] == [], report
    return report


def test_abort_through_the_run_dir(pidns: Callable[..., PidNsResult], tmp_path: Path) -> None:
    report = pod(pidns, tmp_path, tmp_path / "run")
    assert report["done"] == f"abort.json written to {tmp_path / 'run'}"
    assert report["launcher_exit"] == 64  # the sidecar's own exit code, on the trainer container too
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("soak-launcher: ") and '"reason": "aborted"' in message, message
    exit_record = json.loads((tmp_path / "run" / proto.EXIT_FILE).read_text())
    assert exit_record["reason"] == "aborted"


def test_sigterm_to_the_announced_launcher_when_abort_cannot_be_written(
    pidns: Callable[..., PidNsResult], tmp_path: Path
) -> None:
    report = pod(pidns, tmp_path, tmp_path / "run", "block-abort")
    assert str(report["done"]).endswith(f"SIGTERM to launcher pid {report['launcher_pid']}"), report
    assert report["launcher_exit"] == 128 + 15
    assert '"reason": "signalled"' in (tmp_path / "termination-log").read_text()


def test_a_forged_launcher_json_is_not_signalled(pidns: Callable[..., PidNsResult], tmp_path: Path) -> None:
    # launcher.json names the decoy's pid with the real launcher's start ticks: not that process.
    report = pod(pidns, tmp_path, tmp_path / "run", "forge")
    assert "names no running launcher" in str(report["done"]), report
    assert report["launcher_exit"] == 64  # released afterwards by the test itself, not signalled


def test_no_run_dir_no_launcher_found_by_its_command_line(
    pidns: Callable[..., PidNsResult], tmp_path: Path
) -> None:
    # The sidecar's run dir is unusable: look-alikes by command line (the real launcher and the
    # decoy, each naming a run dir) are left alone; the launcher ends at its --go-timeout.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the sidecar expects its run dir")
    report = pod(pidns, tmp_path, blocker / "run")
    assert "no launcher announced there" in str(report["done"]), report
    assert report["launcher_exit"] == proto.EXIT_GO_TIMEOUT
    assert not (tmp_path / "run" / proto.ABORT_FILE).exists()


def test_nothing_once_the_trainer_runs(tmp_path: Path) -> None:
    """After go.json the launcher is the heartbeat's business: an early-exit path must not abort."""
    (tmp_path / proto.GO_FILE).write_text("{}")
    done = release_waiting_launcher(tmp_path, "late", 70, is_running=same_process_alive, boot_id=boot_id())
    assert "heartbeat" in done
    assert not (tmp_path / proto.ABORT_FILE).exists()
