"""The seed's liveness rules, the deadline rules and cancellation, through the real Supervisor.

Each test runs the real local-mode stack (launcher process, example trainer, /proc sampler,
progress probe, file deadline store) with short intervals and asserts the verdict and the artifact
written on disk. Every test would fail if the rule it names were removed from the product.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from sidecar.adapters.filestore import FileDeadlineStore
from sidecar.adapters.identity_files import identity_from_settings
from sidecar.app.ports import Ports
from sidecar.app.supervisor import Supervisor
from sidecar.app.values import RunRequest, RunResult
from sidecar.app.wiring import build_ports
from sidecar.core.artifact.objects import SAMPLES_FILE
from sidecar.core.deadline import obtain_record
from sidecar.core.identity import new_run_id
from sidecar.core.redaction import DEFAULT_RULES
from sidecar.core.samples import ProcessTreeSample
from sidecar.settings import Settings, load_settings
from tests.fixtures.processes import Spawner, kill_orphan
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PY = sys.executable


def trainer(progress: Path, *flags: str, steps: int = 4, step_s: float = 0.1) -> list[str]:
    return [
        PY,
        "-m",
        "sidecar.examples.trainer",
        "--steps",
        str(steps),
        "--step-s",
        str(step_s),
        "--progress-dir",
        str(progress),
        *flags,
    ]


def make_settings(tmp: Path, **groups: Mapping[str, Any]) -> Settings:
    """Fast settings with every directory inside ``tmp``; ``groups`` override per group.

    The progress dir exists already, as a pod's progress volume does before any container starts
    (a pod-mode sidecar only reads it)."""
    (tmp / "progress").mkdir(parents=True, exist_ok=True)
    base: dict[str, dict[str, Any]] = {
        "monitor": {
            "sample_interval_s": 0.2,
            "startup_timeout_s": 30.0,
            "stale_progress_s": 30.0,
            "post_shutdown_grace_s": 0.2,
            "min_duration_s": 0.0,
            "progress_dir": tmp / "progress",
            "status_line": "off",
        },
        "deadline": {
            "budget_s": 600.0,
            "checkpoint_margin_s": 10.0,
            "term_grace_s": 1.0,
            "store_dir": tmp / "deadlines",
        },
        "launcher": {
            "run_dir": tmp / "run",
            "heartbeat_interval_s": 0.2,
            "heartbeat_timeout_s": 60.0,
            "kill_grace_s": 1.0,
            "exit_grace_s": 0.5,
            "appear_timeout_s": 60.0,
            "go_timeout_s": 120.0,
        },
        "artifact": {"output_dir": tmp / "out"},
        "gpu": {"backend": "none"},
    }
    for group, values in groups.items():
        base.setdefault(group, {}).update(values)
    return load_settings(
        {f"{group}.{name}": value for group, values in base.items() for name, value in values.items()}
    )


def make_ports(settings: Settings, status_stream: IO[str] | None = None) -> Ports:
    """The ports the CLI builds for a local run; the status output (monitor.status_line, off in
    make_settings) goes to ``status_stream``, by default nowhere."""
    return build_ports(settings, pod=False, status_stream=status_stream).ports


def status_samples(stream: Path) -> list[dict[str, Any]]:
    """The ``--status json`` objects (one per sample) a sidecar has written to ``stream`` so far."""
    complete = stream.read_text(encoding="utf-8").split("\n")[:-1]
    return [json.loads(line) for line in complete if line.startswith('{"event": "sample"')]


def supervise(
    settings: Settings, command: list[str], *, run_id: str | None = None, ports: Ports | None = None
) -> tuple[RunResult, dict[str, Any]]:
    request = RunRequest(mode="local", run_id=run_id or new_run_id(), command=tuple(command))
    result = Supervisor(settings, ports or make_ports(settings), request).run()
    assert result.artifact_path is not None
    artifact = json.loads(result.artifact_path.read_text(encoding="utf-8"))
    return result, artifact


def assert_verdict(
    result: RunResult,
    artifact: dict[str, Any],
    *,
    classification: str | None,
    exit_code: int,
) -> None:
    status = "passed" if classification is None else "failed"
    assert result.verdict.status == status, result.verdict
    assert result.verdict.classification == classification, result.verdict
    assert result.exit_code == exit_code, result.verdict
    assert artifact["status"] == status
    assert artifact["failure_classification"] == classification
    assert artifact["exit_code"] == exit_code
    assert artifact["failure_reason"] == result.verdict.reason


# The sidecar has sampled the running trainer this many times when its launcher is killed.
SAMPLES_WITH_TRAINER = 3


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ---------------------------------------------------------------------- passing run and samples


def test_passing_run_and_samples_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", steps=6))
    assert_verdict(result, artifact, classification=None, exit_code=0)
    assert artifact["failure_reason"] is None
    assert artifact["returncode"] == 0
    assert artifact["run_summary"]["status"] == "completed"
    assert artifact["post_shutdown"]["residual_processes"] == []
    assert artifact["post_shutdown"]["launcher_exit"]["reason"] == "exited"
    assert artifact["deadline"]["resumed"] is False
    assert artifact["resource_summary"]["run_summary_figures"]["max_in_flight"] == 4

    # samples.jsonl.gz holds one JSON line per sample, and the artifact counts them all
    samples_path = result.artifact_path.parent / SAMPLES_FILE  # type: ignore[union-attr]
    with gzip.open(samples_path, "rt", encoding="utf-8") as stream:
        lines = stream.read().splitlines()
    assert len(lines) >= 2
    parsed = [json.loads(line) for line in lines]
    assert [p["elapsed_s"] for p in parsed] == sorted(p["elapsed_s"] for p in parsed)
    assert artifact["samples"]["count"] == len(lines)
    assert artifact["monitor"]["sample_count"] == len(lines)
    assert artifact["resource_summary"]["sample_count"] == len(lines)
    assert artifact["samples"]["samples_file"] == SAMPLES_FILE
    assert artifact["samples"]["samples_sha256"] == hashlib.sha256(samples_path.read_bytes()).hexdigest()
    assert len(artifact["samples"]["downsampled"]) == len(lines)  # below capacity: stride 1

    # the console log is kept beside the artifact: the next run reuses (resets) the run dir
    console = Path(artifact["console_log"])
    assert console.parent == result.artifact_path.parent.resolve()  # type: ignore[union-attr]
    assert "step 6/6" in console.read_text(encoding="utf-8")


# ---------------------------------------------------------------------- liveness rules


def test_startup_timeout(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, monitor={"startup_timeout_s": 1.5})
    sleeper = [PY, "-c", "import time; time.sleep(60)"]
    result, artifact = supervise(settings, sleeper)
    assert_verdict(result, artifact, classification="timeout/startup", exit_code=12)
    reason = result.verdict.reason or ""
    assert reason.startswith("training produced no progress artifact within 1.5s")
    assert "trainer did not write run_summary.json" in reason
    # the sidecar asked the launcher to stop the trainer: it did not run its 60 s
    assert artifact["duration_s"] < 50
    assert artifact["post_shutdown"]["launcher_exit"]["term_sent"] is True


def test_stale_progress(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, monitor={"stale_progress_s": 1.5})
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--hang", steps=2))
    assert_verdict(result, artifact, classification="timeout/stale_tick", exit_code=12)
    assert (result.verdict.reason or "").startswith("training progress did not change for ")
    assert artifact["duration_s"] < 50


def test_min_duration(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, monitor={"min_duration_s": 3600.0})
    result, artifact = supervise(settings, trainer(tmp_path / "progress", steps=2))
    assert result.verdict.status == "failed"
    assert result.verdict.classification == "trainer_failure"
    assert "before the soak's minimum duration (min_duration_seconds=3600.0)" in (result.verdict.reason or "")
    assert artifact["failure_reason"] == result.verdict.reason
    assert artifact["returncode"] == 0
    assert result.exit_code != 0
    assert artifact["exit_code"] == result.exit_code


def test_nonzero_returncode(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--crash", steps=4))
    # the trainer's valid abnormal classification replaces the generic kind (seed rule)
    assert_verdict(result, artifact, classification="learner_failure", exit_code=10)
    assert (result.verdict.reason or "").startswith("trainer exited with returncode 3")
    assert artifact["returncode"] == 3


def test_a_crash_without_a_summary_is_the_trainers_failure_not_a_contract_violation(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--crash", "--no-summary", steps=4))
    # The crash is the first real cause; the missing summary is its evidence, not a contract
    # violation (exit 11).
    assert_verdict(result, artifact, classification="trainer_failure", exit_code=10)
    assert result.verdict.reason == "trainer exited with returncode 3; trainer did not write run_summary.json"


def test_missing_run_summary(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--no-summary"))
    assert_verdict(result, artifact, classification="missing_run_summary", exit_code=11)
    assert result.verdict.reason == "trainer did not write run_summary.json"


def test_invalid_run_summary(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--bad-summary"))
    assert result.verdict.status == "failed"
    assert result.exit_code == 11
    assert result.verdict.classification == "schema_violation"
    assert "occupancy" in (result.verdict.reason or "")
    assert artifact["run_summary"]["runtime_manifest"]["replay_ingress"]["occupancy"] == 1


def test_residual_orphan_fails_the_soak(tmp_path: Path) -> None:
    """Residual rule, end to end: the trainer leaves a setsid()'d worker that ignores SIGTERM.

    Here the launcher is a child subreaper, so the orphan is adopted and killed by the launcher
    after the trainer exits (exit.json ``survivors_killed``): nothing can stay alive for the
    sidecar's own ``still_alive`` check. The seed's rule (a process of the tree that outlives the
    trainer fails the soak) must still hold, so the survivors the launcher had to kill count as
    residuals (stricter than the seed, which waited post_shutdown_grace before looking).
    """
    settings = make_settings(tmp_path)
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--spawn-orphan", steps=3))
    assert_verdict(result, artifact, classification="resource_leak", exit_code=13)
    killed = artifact["post_shutdown"]["launcher_exit"]["survivors_killed"]
    assert killed, artifact["post_shutdown"]
    pids = ", ".join(str(item["pid"]) for item in killed)
    assert (result.verdict.reason or "").startswith(f"residual child processes after shutdown: {pids}")
    assert artifact["resource_summary"]["residual_process_count"] == len(killed)
    # The list names every one of them, sampled or not: a leak verdict never shows an empty list.
    listed = [(p["pid"], p["fate"]) for p in artifact["post_shutdown"]["residual_processes"]]
    assert listed == [(item["pid"], "killed_by_launcher") for item in killed]
    assert all(gone(item["pid"]) for item in killed)


def test_residual_survivor_of_a_lost_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Residual rule at the sidecar level: a real process the launcher can no longer kill.

    The launcher is SIGKILLed mid-run (it cannot clean up), so the trainer survives outside any
    subreaper. The sidecar's ``still_alive`` check over the last sampled tree must find it
    (PID-reuse-safe), record it in the artifact, and then kill it: nothing may outlive the run.
    The verdict is the earlier monitor failure (the seed adds the residual reason only when
    nothing failed yet), so the residual shows in ``post_shutdown`` and the resource summary.
    """
    settings = make_settings(tmp_path)
    run_dir = tmp_path / "run"
    progress_file = tmp_path / "progress" / "progress.jsonl"
    ports = make_ports(settings)
    take_sample = ports.processes.sample
    with_trainer: list[ProcessTreeSample] = []
    seen: dict[str, psutil.Process] = {}

    def sample_then_kill_the_launcher(root_pid: int) -> ProcessTreeSample:
        """The sidecar's real sample. Handshake: once SAMPLES_WITH_TRAINER of them held the running
        trainer, the launcher (the sampled root) is SIGKILLed before the sidecar goes on, so the
        last tree it keeps holds the trainer."""
        tree = take_sample(root_pid)
        started = read_json(run_dir / "trainer.json")
        if "trainer" in seen or started is None or not progress_file.exists():
            return tree
        if int(started["pid"]) in {p.pid for p in tree.processes}:
            with_trainer.append(tree)
        if len(with_trainer) == SAMPLES_WITH_TRAINER:
            seen["trainer"] = psutil.Process(int(started["pid"]))  # ours to kill should the test fail
            os.kill(root_pid, signal.SIGKILL)
            wait_until("the launcher dead", lambda: gone(root_pid))
        return tree

    monkeypatch.setattr(ports.processes, "sample", sample_then_kill_the_launcher)
    # A silent trainer: one that prints would die of SIGPIPE once its reader, the launcher, is gone.
    silent = [
        PY,
        "-c",
        f"import pathlib, time\np = pathlib.Path({str(progress_file)!r})\n"
        "for _ in range(600):\n    with p.open('a') as f:\n        f.write('x\\n')\n"
        "    time.sleep(0.1)\n",
    ]
    try:
        result, artifact = supervise(settings, silent, ports=ports)
        assert "trainer" in seen
        assert_verdict(result, artifact, classification="monitor_failure", exit_code=70)
        assert "launcher exited without writing exit.json" in (result.verdict.reason or "")
        residual_pids = [p["pid"] for p in artifact["post_shutdown"]["residual_processes"]]
        assert seen["trainer"].pid in residual_pids
        assert artifact["resource_summary"]["residual_process_count"] == len(residual_pids)
        # The sidecar killed it: nothing may outlive the run.
        wait_until("trainer gone", lambda: gone(seen["trainer"].pid), timeout_s=10)
    finally:
        if "trainer" in seen:
            kill_orphan(seen["trainer"])


# ---------------------------------------------------------------------- leaks


def test_fd_leak_is_resource_leak(tmp_path: Path) -> None:
    """100 fds leaked per step over 3 s: any two steady samples a step apart exceed the limit."""
    settings = make_settings(tmp_path, monitor={"max_fd_growth": 50})
    result, artifact = supervise(
        settings, trainer(tmp_path / "progress", "--leak-fds", "50", steps=10, step_s=0.3)
    )
    assert_verdict(result, artifact, classification="resource_leak", exit_code=13)
    assert "process tree fd count grew by" in (result.verdict.reason or "")
    assert artifact["resource_summary"]["fd_growth"] > 50


def test_an_rss_trend_that_reaches_the_memory_limit_before_the_deadline_is_a_leak(tmp_path: Path) -> None:
    """20 MiB more RSS every 0.1 s step: the Theil-Sen trend reaches a 4 GiB limit within minutes,
    long before the deadline, so the opt-in rule fails the soak; without it the projection is only
    reported."""
    steps = ("--leak-rss", "20")
    for fail in (True, False):
        monitor = {"memory_limit": "4Gi", "fail_on_projected_memory_limit": fail, "sample_interval_s": 0.1}
        settings = make_settings(tmp_path / str(fail), monitor=monitor)
        result, artifact = supervise(settings, trainer(tmp_path / str(fail) / "progress", *steps, steps=15))
        summary = artifact["resource_summary"]
        rss = next(t for t in summary["trends"] if t["series"] == "process tree RSS")
        assert rss["low_per_hour"] > 0 and summary["memory_limit_bytes"] == 4 * 2**30
        assert 0 < summary["projected_memory_limit_s"] < 3600
        if fail:
            assert_verdict(result, artifact, classification="resource_leak", exit_code=13)
            assert "the memory limit (4096 MiB) would be reached in" in (result.verdict.reason or "")
        else:
            assert result.verdict.status == "passed", result.verdict.reason


def test_growth_is_measured_from_the_running_trainer(tmp_path: Path) -> None:
    """A healthy trainer's own baseline fds are not a leak: growth starts once it runs.

    The first sample is usually taken before the launcher has started the trainer; measuring
    growth from it would count the whole trainer as growth.
    """
    settings = make_settings(tmp_path, monitor={"max_fd_growth": 3})
    result, artifact = supervise(settings, trainer(tmp_path / "progress", steps=8, step_s=0.15))
    assert_verdict(result, artifact, classification=None, exit_code=0)
    assert artifact["resource_summary"]["fd_growth"] <= 3


# ---------------------------------------------------------------------- deadline


def test_deadline_exhausted(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        deadline={"budget_s": 4.0, "checkpoint_margin_s": 1.0, "term_grace_s": 0.5},
        monitor={"stale_progress_s": 120.0},
    )
    # --hang with few steps: the trainer sits in a loop that ignores the soft stop
    result, artifact = supervise(settings, trainer(tmp_path / "progress", "--hang", steps=2))
    assert_verdict(result, artifact, classification="deadline_exhausted", exit_code=14)
    assert (result.verdict.reason or "").startswith(
        "the total-job deadline expired before the trainer finished"
    )
    assert artifact["deadline"]["expired"] is True
    assert artifact["deadline"]["soft_stop_sent"] is True
    assert artifact["deadline"]["term_sent"] is True


def test_soft_stop_at_the_margin_is_the_deadline_verdict(tmp_path: Path) -> None:
    """A trainer that checkpoints and exits cleanly at the margin still ran out of budget."""
    settings = make_settings(
        tmp_path,
        deadline={"budget_s": 5.0, "checkpoint_margin_s": 3.0, "term_grace_s": 0.5},
        monitor={"stale_progress_s": 120.0},
    )
    result, artifact = supervise(settings, trainer(tmp_path / "progress", steps=200, step_s=0.1))
    assert_verdict(result, artifact, classification="deadline_exhausted", exit_code=14)
    assert artifact["returncode"] == 0
    assert artifact["deadline"]["soft_stop_sent"] is True
    assert artifact["deadline"]["term_sent"] is False
    assert (tmp_path / "progress" / "checkpoint.json").exists()
    # The budget was spent, the deadline itself had not expired: the verdict says which.
    assert artifact["deadline"]["expired"] is False and artifact["deadline"]["budget_spent"] is True
    assert (result.verdict.reason or "").startswith("the budget ran out")


def test_insufficient_budget_at_start(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, deadline={"budget_s": 10.0, "checkpoint_margin_s": 3.0, "resume": True}
    )
    command = trainer(tmp_path / "progress", steps=2)
    run_id = new_run_id()
    store = FileDeadlineStore(settings.deadline.store_dir)
    identity = identity_from_settings(
        settings.deadline,
        run_id=run_id,
        command=command,
        deadline_store=store.location,
        redaction=DEFAULT_RULES,
    )
    # the original attempt started 8.5 s ago: 1.5 s of the 10 s budget left, below the margin
    record = obtain_record(
        store, identity, now_wall=time.time() - 8.5, resume_required=False, max_budget_s=100.0
    ).record
    result, artifact = supervise(settings, command, run_id=run_id)
    assert_verdict(result, artifact, classification="insufficient_budget", exit_code=18)
    assert "insufficient original budget" in (result.verdict.reason or "")
    abort = read_json(tmp_path / "run" / "abort.json")
    assert abort is not None and abort["exit_code"] == 18
    assert not (tmp_path / "run" / "trainer.json").exists()
    assert artifact["returncode"] is None
    # never extended
    stored = store.load(run_id)
    assert stored is not None and json.loads(stored)["deadline_unix"] == record.deadline_unix


def test_resume_with_changed_command_is_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    run_id = new_run_id()
    first, _ = supervise(settings, trainer(tmp_path / "progress", steps=2), run_id=run_id)
    assert first.exit_code == 0
    resumed = make_settings(tmp_path, deadline={"resume": True})
    result, artifact = supervise(resumed, trainer(tmp_path / "progress", steps=3), run_id=run_id)
    assert_verdict(result, artifact, classification="refused", exit_code=15)
    abort = read_json(tmp_path / "run" / "abort.json")
    assert abort is not None and abort["exit_code"] == 15
    assert not (tmp_path / "run" / "trainer.json").exists()


# ---------------------------------------------------------------------- the sidecar itself stalls


def local_flags(tmp_path: Path) -> list[str]:
    """Every directory inside ``tmp_path``, fast sampling, no GPU, no status line."""
    return [
        "--output",
        str(tmp_path / "out"),
        "--run-dir",
        str(tmp_path / "run"),
        "--progress-dir",
        str(tmp_path / "progress"),
        "--deadline-dir",
        str(tmp_path / "deadlines"),
        "--sample-interval",
        "0.2",
        "--post-shutdown-grace",
        "0.2",
        "--gpu-backend",
        "none",
        "--status",
        "off",
    ]


def test_a_stalled_sidecar_is_supervisor_lost_not_the_trainers_failure(
    tmp_path: Path, spawn: Spawner
) -> None:
    """SIGSTOP the sidecar past the heartbeat timeout: the launcher fails closed and kills the
    trainer; once resumed, the sidecar blames the heartbeat, not the trainer (retryable, 152)."""
    env = {
        **os.environ,
        "SOAK_LAUNCHER__HEARTBEAT_INTERVAL_S": "0.2",
        "SOAK_LAUNCHER__HEARTBEAT_TIMEOUT_S": "1",
        "SOAK_LAUNCHER__KILL_GRACE_S": "1",
    }
    argv = [PY, "-m", "sidecar.cli", "run", "--local", *local_flags(tmp_path), "--"]
    proc = spawn(
        [*argv, *trainer(tmp_path / "progress", steps=600, step_s=0.1)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_until("first progress", (tmp_path / "progress" / "progress.jsonl").exists, 60)
    proc.send_signal(signal.SIGSTOP)
    wait_until("the launcher gave up", (tmp_path / "run" / "exit.json").exists, 30)
    proc.send_signal(signal.SIGCONT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 152, err.decode()
    (path,) = (tmp_path / "out" / "runs").glob("*/attempt-1/artifact.json")
    artifact = json.loads(path.read_text(encoding="utf-8"))
    assert artifact["failure_classification"] == "supervisor_lost"
    assert artifact["failure_reason"].startswith("the launcher lost the sidecar's heartbeat")
    assert artifact["post_shutdown"]["launcher_exit"]["heartbeat_lost"] is True


# ---------------------------------------------------------------------- external cancellation


@pytest.mark.parametrize(
    "signals",
    [
        (signal.SIGTERM,),
        (signal.SIGINT,),
        (signal.SIGHUP,),
        (signal.SIGQUIT,),
        (signal.SIGUSR1,),
        (signal.SIGUSR2,),
        (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTERM),
    ],
    ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "repeated"],
)
def test_external_cancellation_via_cli(
    tmp_path: Path, signals: tuple[signal.Signals, ...], spawn: Spawner
) -> None:
    """Ctrl-C, SIGTERM or any other stop signal: the trainer is stopped, the artifact written, exit
    17; SIGHUP too, whose default action would leave neither artifact nor verdict. Signals repeated
    while the sidecar concludes are noted, not raised: they cannot lose the artifact."""
    env = {**os.environ, "SOAK_LAUNCHER__KILL_GRACE_S": "1", "PYTHONUNBUFFERED": "1"}
    argv = [
        PY,
        "-m",
        "sidecar.cli",
        "run",
        "--local",
        *local_flags(tmp_path),
        "--",
        *trainer(tmp_path / "progress", steps=600, step_s=0.1),
    ]
    stderr_file = tmp_path / "sidecar.stderr"
    with stderr_file.open("wb") as err:
        proc = spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    wait_until("first progress", (tmp_path / "progress" / "progress.jsonl").exists, 60)
    started = read_json(tmp_path / "run" / "trainer.json")
    announced = read_json(tmp_path / "run" / "launcher.json")
    assert started is not None and announced is not None
    trainer_pid = int(started["pid"])
    # Handshakes, not pauses. The launcher is held (SIGSTOP) while the signals arrive, so the sidecar
    # cannot conclude before it has handled each one: the first starts the cancellation (the
    # sidecar's soft stop appears in control.json), every later one is noted on stderr.
    launcher = psutil.Process(int(announced["pid"]))
    launcher.suspend()
    try:
        first, *repeated = signals
        proc.send_signal(first)
        wait_until("the sidecar's stop request", (tmp_path / "run" / "control.json").exists)
        assert (read_json(tmp_path / "run" / "control.json") or {}).get("action") == "soft_stop"
        for count, signum in enumerate(repeated, start=1):
            proc.send_signal(signum)
            wait_until(f"{signum.name} noted", _noted(stderr_file, count))
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            launcher.resume()
    proc.wait(timeout=60)
    stderr = stderr_file.read_text()
    assert proc.returncode == 17, stderr
    noted = [line.split()[1] for line in stderr.splitlines() if "while concluding" in line]
    assert noted == [signum.name for signum in repeated], stderr
    artifacts = list((tmp_path / "out" / "runs").glob("*/attempt-1/artifact.json"))
    assert len(artifacts) == 1, stderr
    artifact = json.loads(artifacts[0].read_text(encoding="utf-8"))
    assert artifact["failure_classification"] == "external_cancellation"
    assert artifact["exit_code"] == 17
    assert (artifact["failure_reason"] or "").startswith("soak was interrupted before the trainer completed")
    assert "FAILED [external_cancellation]" in stderr
    # Said at once: the local default grace, and that a second signal cuts it short.
    assert f"{first.name}: soft stop sent; the trainer has 5s to checkpoint and exit" in stderr, stderr
    wait_until("trainer gone", lambda: gone(trainer_pid), timeout_s=10)


def _noted(stderr_file: Path, count: int) -> Callable[[], bool]:
    """The sidecar said ``count`` times that a signal came while it concluded."""
    return lambda: stderr_file.read_text().count("while concluding") == count


# ---------------------------------------------------------------------- untrusted run_summary


def test_nan_in_run_summary_still_gives_a_strict_json_artifact(tmp_path: Path) -> None:
    """NaN/Infinity in the trainer's document (the seed's parser accepts them) never break the
    artifact, which is strict JSON: they are kept as text in run_summary, shutdown and figures."""
    progress = tmp_path / "progress"
    script = (
        "import json, pathlib\n"
        "from sidecar.examples.replay_summary import run_summary\n"
        f"p = pathlib.Path({str(progress)!r})\n"
        "(p / 'progress.jsonl').write_text('step\\n')\n"
        "s = run_summary(steps=3, completed=True, classification='normal_completion', error=None)\n"
        "s['runtime_manifest']['replay_ingress']['backpressure_wait_s'] = float('nan')\n"
        "s['runtime_manifest']['shutdown']['cleanup']['wall_s'] = float('inf')\n"
        "(p / 'run_summary.json').write_text(json.dumps(s))\n"
    )
    settings = make_settings(tmp_path)
    result, _ = supervise(settings, [PY, "-c", script])
    assert result.artifact_path is not None

    def reject(token: str) -> float:
        raise AssertionError(f"non-standard JSON constant {token} in the artifact")

    artifact = json.loads(result.artifact_path.read_text(encoding="utf-8"), parse_constant=reject)
    assert artifact["resource_summary"]["run_summary_figures"]["replay_ingress_backpressure_wait_s"] == "nan"
    assert artifact["run_summary"]["runtime_manifest"]["replay_ingress"]["backpressure_wait_s"] == "nan"
    assert artifact["exit_code"] == result.exit_code


def test_an_approved_resume_reaches_the_trainer_as_the_seeds_flag(tmp_path: Path) -> None:
    checkpoint = tmp_path / "progress" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text(json.dumps({"step": 3}), encoding="utf-8")
    run_id = new_run_id()
    command = trainer(tmp_path / "progress", steps=4)
    first = make_settings(tmp_path, deadline={"checkpoint_path": checkpoint})
    result, _ = supervise(first, command, run_id=run_id)
    assert result.exit_code == 0, result.verdict
    resumed = make_settings(
        tmp_path, deadline={"checkpoint_path": checkpoint, "resume_checkpoint": checkpoint}
    )
    result, artifact = supervise(resumed, command, run_id=run_id)
    assert result.exit_code == 0, result.verdict
    assert artifact["deadline"]["resumed"] is True
    console = (tmp_path / "run" / "console.log").read_text(encoding="utf-8")
    assert f"resumed from {checkpoint.resolve()} at step 3" in console
    assert "step 2/4" not in console


def test_a_resume_from_another_checkpoint_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.json"
    other = tmp_path / "other.json"
    for path in (checkpoint, other):
        path.write_text(json.dumps({"step": 1}), encoding="utf-8")
    settings = make_settings(tmp_path, deadline={"checkpoint_path": checkpoint, "resume_checkpoint": other})
    result, _ = supervise(settings, trainer(tmp_path / "progress"))
    assert (result.exit_code, result.verdict.classification) == (15, "refused")
    assert "resume" in (result.verdict.reason or "")
