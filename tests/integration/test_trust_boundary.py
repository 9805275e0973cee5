"""What the trainer writes is a claim: a forged run-dir record can neither aim the sidecar's kills nor
switch its leak checks off (the real CLI, launcher and processes)."""

from __future__ import annotations

import contextlib
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


# A trainer that forges exit.json for its launcher (well-formed and clean: exit 0, nothing left
# behind; or with wrong types), writes a passing run_summary, leaves a worker in a session of its
# own, then SIGKILLs its launcher so the forgery is the only record. "clean": it exits; "types":
# it stays, so only the sidecar can end it. Pids go to the progress dir for the test to check.
# What each forger does first: five steps of progress and a passing run_summary; ``info`` is
# launcher.json (its pid and launch id).
PASSES_FIRST = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from sidecar.examples.replay_summary import run_summary, write_atomic
    run_dir, progress = Path(os.environ["SOAK_RUN_DIR"]), Path(os.environ["SOAK_PROGRESS_DIR"])
    info = json.loads((run_dir / "launcher.json").read_text())
    for step in range(5):
        (progress / "step").write_text(str(step))
        time.sleep(0.2)
    summary = run_summary(steps=5, completed=True, classification="normal_completion", error=None)
    write_atomic(progress / "run_summary.json", summary)
    """
)
FORGES_EXIT = PASSES_FIRST + textwrap.dedent(
    """
    clean = {"protocol": 1, "launch_id": info["launch_id"], "exit_code": 0, "reason": "exited",
             "returncode": 0, "trainer_pid": os.getpid()}
    forged = clean if sys.argv[1] == "clean" else {**clean, "exit_code": "x"}
    (run_dir / ".forged").write_text(json.dumps(forged))
    os.replace(run_dir / ".forged", run_dir / "exit.json")
    worker = os.fork()
    if worker == 0:
        os.setsid()
        os.execvp("sleep", ["sleep", "120"])
    (progress / "pids").write_text(f"{os.getpid()} {worker}")
    os.kill(info["pid"], signal.SIGKILL)
    if sys.argv[1] == "types":
        time.sleep(120)
    """
)


def forged_exit_run(spawn: Spawner, tmp_path: Path, how: str) -> tuple[int, str, list[psutil.Process]]:
    try:
        code, err = run_cli(spawn, tmp_path, "--", sys.executable, "-c", FORGES_EXIT, how)
    finally:
        pids = next((tmp_path / "soak-output" / "runs").glob("*/progress/pids"), None)
        found = [] if pids is None else [int(p) for p in pids.read_text().split()]
    processes = []
    for pid in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    return code, err, processes


def test_a_forged_clean_exit_record_from_a_killed_launcher_never_passes(
    tmp_path: Path, spawn: Spawner
) -> None:
    code, err, processes = forged_exit_run(spawn, tmp_path, "clean")
    try:
        assert code != 0, err
        found = artifact(tmp_path)
        assert found["status"] == "failed", found["failure_reason"]
        assert any(
            "the launcher was killed by signal 9: not the launcher's record" in v
            for v in found["protocol_violations"]
        )
    finally:
        for process in processes:  # the worker the trainer hid in a session of its own
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def test_a_trainer_that_breaks_the_exit_record_does_not_outlive_the_sidecar(
    tmp_path: Path, spawn: Spawner
) -> None:
    code, err, processes = forged_exit_run(spawn, tmp_path, "types")
    try:
        assert code != 0, err
        trainer = processes[0]
        with contextlib.suppress(psutil.NoSuchProcess):
            assert trainer.status() == psutil.STATUS_ZOMBIE, "the trainer outlived the sidecar"
    finally:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


# Puts a directory where the sidecar's heartbeat goes, then keeps making progress: the launcher
# loses the heartbeat and kills it.
BREAKS_THE_HEARTBEAT = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    beat = Path(os.environ["SOAK_RUN_DIR"]) / "sidecar.heartbeat"
    beat.unlink()
    beat.mkdir()
    (beat / "x").touch()
    progress = Path(os.environ["SOAK_PROGRESS_DIR"])
    while True:
        (progress / "step").write_text(str(time.time()))
        time.sleep(0.2)
    """
)


def test_a_trainer_that_breaks_the_heartbeat_is_not_a_lost_sidecar(tmp_path: Path, spawn: Spawner) -> None:
    code, _ = run_cli(
        spawn, tmp_path, "--", sys.executable, "-c", BREAKS_THE_HEARTBEAT,
        SOAK_LAUNCHER__HEARTBEAT_TIMEOUT_S="3",
    )  # fmt: skip
    found = artifact(tmp_path)
    assert found["failure_classification"] == "monitor_failure", found["failure_reason"]
    assert code == 70 and "heartbeat could not be written into the run dir" in found["failure_reason"]


# A crash dressed as a pass: its own exit.json (its real code 3, returncode 0), a valid summary,
# then every new fd taken from its launcher (prlimit RLIMIT_NOFILE 0, which the same UID may do).
STARVES_ITS_LAUNCHER = PASSES_FIRST + textwrap.dedent(
    """
    import resource
    forged = {"protocol": 1, "launch_id": info["launch_id"], "exit_code": 3, "reason": "exited",
              "returncode": 0, "trainer_pid": os.getpid()}
    (run_dir / ".forged").write_text(json.dumps(forged))
    os.replace(run_dir / ".forged", run_dir / "exit.json")
    resource.prlimit(info["pid"], resource.RLIMIT_NOFILE, (0, 0))
    sys.exit(3)
    """
)


def test_a_crash_that_starves_its_launcher_of_fds_behind_a_forged_record_fails(
    tmp_path: Path, spawn: Spawner
) -> None:
    """The launcher opened its record before the trainer started: it still writes its own."""
    code, err = run_cli(spawn, tmp_path, "--", sys.executable, "-c", STARVES_ITS_LAUNCHER)
    found = artifact(tmp_path)
    assert (code, found["failure_classification"]) == (10, "trainer_failure"), (found["failure_reason"], err)
    assert "trainer exited with returncode 3" in found["failure_reason"]


# Stops its launcher before the checkpoint margin, trains on past the deadline, writes a clean
# summary and exits 0, leaving a child to wake the launcher up.
OUTRUNS_THE_DEADLINE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from sidecar.examples.replay_summary import run_summary, write_atomic
    run_dir, progress = Path(os.environ["SOAK_RUN_DIR"]), Path(os.environ["SOAK_PROGRESS_DIR"])
    launcher = json.loads((run_dir / "launcher.json").read_text())["pid"]
    os.kill(launcher, signal.SIGSTOP)
    deadline, step = float(os.environ["SOAK_DEADLINE_UNIX"]), 0
    while time.time() < deadline + 2:
        step += 1
        (progress / "step").write_text(str(step))
        time.sleep(0.2)
    summary = run_summary(steps=step, completed=True, classification="normal_completion", error=None)
    write_atomic(progress / "run_summary.json", summary)
    if os.fork() == 0:
        time.sleep(0.3)
        os.kill(launcher, signal.SIGCONT)
        os._exit(0)
    sys.exit(0)
    """
)


def test_a_trainer_that_stops_its_launcher_and_outruns_the_deadline_exhausts_it(
    tmp_path: Path, spawn: Spawner
) -> None:
    code, err = run_cli(
        spawn, tmp_path, "--budget", "12", "--checkpoint-margin", "6", "--", sys.executable, "-c",
        OUTRUNS_THE_DEADLINE,
    )  # fmt: skip
    found = artifact(tmp_path)
    assert (code, found["failure_classification"]) == (14, "deadline_exhausted"), (
        found["failure_reason"],
        err,
    )


# Passes in every file it writes, but holds its launcher stopped for two seconds on the way (short of
# the heartbeat timeout and the deadline: nothing but the samples sees it), then lets it go and exits 0.
STOPS_ITS_LAUNCHER = PASSES_FIRST + textwrap.dedent(
    """
    os.kill(info["pid"], signal.SIGSTOP)
    time.sleep(2.0)
    os.kill(info["pid"], signal.SIGCONT)
    sys.exit(0)
    """
)


def test_a_launcher_seen_stopped_is_the_trainers_doing_and_never_passes(
    tmp_path: Path, spawn: Spawner
) -> None:
    code, err = run_cli(spawn, tmp_path, "--", sys.executable, "-c", STOPS_ITS_LAUNCHER)
    found = artifact(tmp_path)
    assert (code, found["failure_classification"]) == (10, "trainer_failure"), (found["failure_reason"], err)
    assert (
        "was seen stopped" in found["failure_reason"] and "from the trainer's side" in found["failure_reason"]
    )


# Passes in every file it writes, but holds a ptrace attachment to its launcher for two seconds
# (PTRACE_SEIZE: the launcher keeps running; a tracer could make it clone or exec at will).
TRACES_ITS_LAUNCHER = PASSES_FIRST + textwrap.dedent(
    """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
    assert libc.ptrace(PTRACE_SEIZE, info["pid"], 0, 0) == 0, ctypes.get_errno()
    time.sleep(2.0)
    libc.ptrace(PTRACE_DETACH, info["pid"], 0, 0)
    sys.exit(0)
    """
)


def test_a_launcher_seen_traced_is_the_trainers_doing_and_never_passes(
    tmp_path: Path, spawn: Spawner
) -> None:
    code, err = run_cli(spawn, tmp_path, "--", sys.executable, "-c", TRACES_ITS_LAUNCHER)
    found = artifact(tmp_path)
    assert (code, found["failure_classification"]) == (10, "trainer_failure"), (found["failure_reason"], err)
    assert "was seen traced by pid" in found["failure_reason"]


# Kills its launcher, then leaves a daemon in a session of its own (double fork): with no launcher,
# orphans go to the nearest subreaper, which locally is the sidecar itself.
KILLS_ITS_LAUNCHER_AND_HIDES = textwrap.dedent(
    """
    import json, os, signal, sys, time
    run_dir = os.environ["SOAK_RUN_DIR"]
    launcher = json.load(open(os.path.join(run_dir, "launcher.json")))["pid"]
    os.kill(launcher, signal.SIGKILL)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", sys.argv[1]])
        os._exit(0)
    os.wait()
    """
)


def test_a_process_that_escapes_a_killed_launcher_does_not_outlive_the_soak(
    tmp_path: Path, spawn: Spawner
) -> None:
    token = f"escapee-{os.getpid()}-{tmp_path.name}"
    code, err = run_cli(spawn, tmp_path, "--", sys.executable, "-c", KILLS_ITS_LAUNCHER_AND_HIDES, token)
    left = [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    assert code != 0 and not left, (code, err)
    residuals = artifact(tmp_path)["post_shutdown"]["residual_processes"]
    assert any(token in entry["command"] for entry in residuals), residuals
