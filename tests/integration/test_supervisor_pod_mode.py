"""Pod mode without Kubernetes: the sidecar finds a launcher it did not start through the run dir.

The launcher runs as its own process (as in the trainer container) and the supervisor runs in
another (as the sidecar container), sharing the run dir like the pod's emptyDir. Publication is
left out here; tests/integration/test_kube_pod_mode.py runs the same against a real apiserver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.app.supervisor import Supervisor
from sidecar.app.values import RunRequest
from sidecar.core.identity import new_run_id
from tests.fixtures.processes import Spawner
from tests.integration.test_supervisor_rules import make_ports, make_settings, trainer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# Runs one pod-mode supervisor with make_settings()/make_ports() and prints the exit code; the
# status output, when the overrides turn it on (monitor.status_line), goes to stderr.
DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from sidecar.app.supervisor import Supervisor
    from sidecar.app.values import RunRequest
    from tests.integration.test_supervisor_rules import make_ports, make_settings
    tmp, run_id, overrides = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    settings = make_settings(tmp, **overrides)
    kube = settings.kube
    request = RunRequest(mode="pod", run_id=run_id, index=kube.completion_index, indexes=kube.completions)
    result = Supervisor(settings, make_ports(settings, sys.stderr), request).run()
    print("EXIT", result.exit_code, result.artifact_path, flush=True)
    """
)


def start_launcher(
    spawn: Spawner, tmp: Path, *args: str, go_timeout: float = 60.0
) -> subprocess.Popen[bytes]:
    return spawn(
        [
            sys.executable,
            str(launcher_path()),
            "--run-dir",
            str(tmp / "run"),
            "--go-timeout",
            str(go_timeout),
            "--",
            *trainer(tmp / "progress", *args),
        ]
    )


def artifact_of(path: Path) -> dict[str, Any]:
    artifact: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return artifact


def test_a_launcher_that_never_appears_is_a_clear_verdict(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, launcher={"appear_timeout_s": 1.0})
    result = Supervisor(settings, make_ports(settings), RunRequest(mode="pod", run_id=new_run_id())).run()
    assert (result.exit_code, result.verdict.classification) == (19, "launcher_missing")
    assert result.artifact_path is not None
    assert "no launcher.json" in (artifact_of(result.artifact_path)["failure_reason"] or "")


def test_a_trainer_container_that_exited_before_the_sidecar_was_ready(tmp_path: Path, spawn: Spawner) -> None:
    launcher = start_launcher(spawn, tmp_path, go_timeout=0.5)
    assert launcher.wait(timeout=30) == 75  # the launcher's go timeout
    settings = make_settings(tmp_path)
    result = Supervisor(settings, make_ports(settings), RunRequest(mode="pod", run_id=new_run_id())).run()
    assert (result.exit_code, result.verdict.classification) == (19, "launcher_missing")
    assert "exited before the sidecar was ready (go_timeout)" in (result.verdict.reason or "")


def test_pod_mode_takes_the_command_from_the_launcher(tmp_path: Path, spawn: Spawner) -> None:
    launcher = start_launcher(spawn, tmp_path, "--steps", "3")
    settings = make_settings(tmp_path)
    result = Supervisor(settings, make_ports(settings), RunRequest(mode="pod", run_id=new_run_id())).run()
    assert result.exit_code == 0, result.verdict
    assert launcher.wait(timeout=30) == 0
    assert result.artifact_path is not None
    assert "sidecar.examples.trainer" in " ".join(artifact_of(result.artifact_path)["command"])


def test_a_restarted_sidecar_resumes_the_running_trainer(tmp_path: Path, spawn: Spawner) -> None:
    overrides = json.dumps({"launcher": {"heartbeat_timeout_s": 20.0}})
    run_id = new_run_id()
    launcher = start_launcher(spawn, tmp_path, "--steps", "40", "--step-s", "0.1")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    first = spawn([sys.executable, "-c", DRIVER, str(tmp_path), run_id, overrides], env=env)
    go = tmp_path / "run" / "go.json"
    wait_until("the trainer started", (tmp_path / "run" / "trainer.json").exists)
    record = (tmp_path / "deadlines" / f"{run_id}.json").read_bytes()
    go_before = go.read_bytes()
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert launcher.poll() is None  # the trainer runs on while the sidecar is away
    second = spawn(
        [sys.executable, "-c", DRIVER, str(tmp_path), run_id, overrides], env=env, stdout=subprocess.PIPE
    )
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0
    assert out.decode().startswith("EXIT 0"), out
    assert launcher.wait(timeout=30) == 0
    # the same deadline record and the same go-ahead: nothing was extended or restarted
    assert (tmp_path / "deadlines" / f"{run_id}.json").read_bytes() == record
    assert go.read_bytes() == go_before
    artifact = artifact_of(Path(out.decode().split()[2]))
    assert artifact["deadline"]["resumed"] is True
    assert artifact["status"] == "passed"


def test_two_indexes_of_one_soak_share_its_deadline_and_run_side_by_side(
    tmp_path: Path, spawn: Spawner
) -> None:
    """A two-pod soak on one machine: each pod has its own run dir, launcher and sidecar; they share
    the deadline store. Both run at once (their locks are per index), resume one record, and
    number their attempts apart."""
    run_id = new_run_id()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    sidecars = []
    for index in (0, 1):
        pod = tmp_path / f"pod-{index}"
        (pod / "progress").mkdir(parents=True)
        # The same command on every index (the identity): the progress dir comes from go.json.
        spawn(
            [
                sys.executable,
                str(launcher_path()),
                "--run-dir",
                str(pod / "run"),
                "--",
                sys.executable,
                "-m",
                "sidecar.examples.trainer",
                "--steps",
                "10",
                "--step-s",
                "0.1",
            ]
        )
        overrides = {
            "deadline": {"store_dir": str(tmp_path / "deadlines")},
            "kube": {"completion_index": index, "completions": 2},
        }
        sidecars.append(
            spawn(
                [sys.executable, "-c", DRIVER, str(pod), run_id, json.dumps(overrides)],
                env=env,
                stdout=subprocess.PIPE,
            )
        )
    artifacts = []
    for sidecar in sidecars:
        out, _ = sidecar.communicate(timeout=120)
        assert out.decode().startswith("EXIT 0"), out
        artifacts.append(artifact_of(Path(out.decode().split()[2])))
    assert [a["context"]["index"] for a in artifacts] == [0, 1]
    assert {a["context"]["indexes"] for a in artifacts} == {2}
    assert [a["context"]["attempt"] for a in artifacts] == [1, 1]  # numbered per index
    assert artifacts[0]["deadline"]["started_unix"] == artifacts[1]["deadline"]["started_unix"]
    assert sorted(p.name for p in (tmp_path / "deadlines").glob("*.json")) == [f"{run_id}.json"]
    assert {a["deadline"]["resumed"] for a in artifacts} == {False, True}  # one made it, one resumed it
