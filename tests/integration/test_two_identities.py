"""A pod's two identities on one machine: the launcher and the trainer as UID 10001, the sidecar as
root with every capability dropped, which, like another UID, may not read the trainer's fd tables or
environ nor signal it (that takes the same UID or CAP_SYS_PTRACE/CAP_KILL). The launcher, the
trainer-side agent, reports both; the trainer in turn cannot read the sidecar's environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.adapters.rundir.zipapp import build_launcher
from sidecar.core.identity import new_run_id
from tests.fixtures.processes import Spawner
from tests.integration.test_supervisor_pod_mode import DRIVER
from tests.integration.test_supervisor_rules import status_samples
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

TRAINER_UID = 10001
# The launcher is stdlib-only: the system interpreter, which another UID can run (pyenv's lives
# under /root).
SYSTEM_PYTHON = "/usr/bin/python3"
SIDECAR_MARK = "soak-sidecar-under-test"  # on the sidecar's command line, for the trainer to find
FDS = 40  # pipes the trainer holds open: 80 fds beyond its standard ones
RELEASE = "release"  # written to the progress dir once the sidecar has sampled the trainer

TRAINER = textwrap.dedent(
    f"""
    import json, os, shutil, sys, time
    progress = os.environ["SOAK_PROGRESS_DIR"]
    pipes = [os.pipe() for _ in range({FDS})]
    probe = {{}}
    for entry in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{{entry}}/cmdline", "rb").read()
        except OSError:
            continue
        # (Spelt in two parts: this script's own command line holds it too.)
        if b"soak-sidecar-" + b"under-test" in argv and int(entry) != os.getpid():
            try:
                open(f"/proc/{{entry}}/environ", "rb").read()
                probe["environ"] = "allowed"
            except PermissionError:
                probe["environ"] = "denied"
    with open(os.path.join(progress, "probe.json"), "w") as out:
        json.dump(probe, out)
    # 12 steps at least, then on until the test has seen the sidecar sample it (RELEASE appears).
    for step in range(6000):
        with open(os.path.join(progress, "step"), "w") as out:
            out.write(str(step) * (step + 1))
        if step >= 11 and os.path.exists(os.path.join(progress, "{RELEASE}")):
            break
        time.sleep(0.1)
    shutil.copy(sys.argv[1], os.path.join(progress, "run_summary.json"))
    """
)


@pytest.fixture
def pod_dir() -> Iterator[Path]:
    """A directory both identities can reach (pytest's tmp_path is root's alone)."""
    if shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.fail("setpriv (util-linux) and /usr/bin/python3 are needed")
    base = Path(tempfile.mkdtemp(prefix="soak-two-uids-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_launcher_reports_what_a_sidecar_under_another_identity_cannot_read(
    pod_dir: Path, spawn: Spawner
) -> None:
    (pod_dir / "run").mkdir(mode=0o777)
    (pod_dir / "run").chmod(0o777)  # an emptyDir: both containers write it
    (pod_dir / "progress").mkdir()
    os.chown(pod_dir / "progress", TRAINER_UID, TRAINER_UID)
    summary = pod_dir / "run_summary.json"
    shutil.copy(
        Path(__file__).resolve().parents[1] / "data" / "run_summary" / "minimal_completed.json", summary
    )
    summary.chmod(0o644)
    # As in the pod: install-launcher's copy on a volume the trainer reads (root's cache is 0700).
    launcher_file = build_launcher(pod_dir / "bin")
    as_trainer = ["setpriv", f"--reuid={TRAINER_UID}", f"--regid={TRAINER_UID}", "--clear-groups"]
    launcher = spawn(
        [*as_trainer, SYSTEM_PYTHON, str(launcher_file), "--run-dir", str(pod_dir / "run"), "--",
         SYSTEM_PYTHON, "-c", TRAINER, str(summary)],
        env={"PATH": os.environ["PATH"], "NVIDIA_VISIBLE_DEVICES": "GPU-7f2c"},
    )  # fmt: skip
    without_capabilities = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    overrides = json.dumps({"monitor": {"status_line": "json"}})  # one JSON object per sample
    status = pod_dir / "sidecar.stderr"
    with status.open("wb") as err:
        sidecar = spawn(
            [*without_capabilities, sys.executable, "-c", DRIVER, str(pod_dir), new_run_id(), overrides,
             SIDECAR_MARK],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )  # fmt: skip
    # Handshake: the trainer runs until the sidecar has sampled it (the tree's second process) with
    # the pipes the launcher reports for it in fds.json, not for a time that is likely to be enough.
    wait_until(
        "a sample of the trainer with its pipes",
        lambda: any(s["processes"] >= 2 and s["fds"] >= 2 * FDS for s in status_samples(status)),
    )
    (pod_dir / "progress" / RELEASE).touch()
    out, _ = sidecar.communicate(timeout=120)
    assert launcher.wait(timeout=30) == 0
    assert out.decode().startswith("EXIT 0"), out
    artifact = json.loads(Path(out.decode().split()[2]).read_text(encoding="utf-8"))
    assert artifact["status"] == "passed", artifact["failure_reason"]
    # The fd tables came from fds.json: the sidecar could not list them itself.
    assert artifact["resource_summary"]["max_fd_count"] >= 2 * FDS, artifact["resource_summary"]
    report = json.loads((pod_dir / "run" / "fds.json").read_text(encoding="utf-8"))
    assert {entry["pid"] for entry in report["processes"]} >= {launcher.pid}
    # The trainer's GPU variable came from launcher.json: its environ was unreadable.
    assert artifact["provenance"]["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-7f2c"
    probe = json.loads((pod_dir / "progress" / "probe.json").read_text(encoding="utf-8"))
    assert probe == {"environ": "denied"}
