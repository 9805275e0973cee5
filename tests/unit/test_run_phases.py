"""The supervisor's phases with a fake for every port: no process, no sleep, simulated time.

Each test scripts the launcher and the trainer (tests/fakes.py) and checks what the supervisor
asked of its ports and the verdict it delivered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.app.ports import Ports
from sidecar.app.session import go_ahead
from sidecar.app.stopping import stop_notice
from sidecar.app.supervisor import Supervisor
from sidecar.app.values import Launched, Preflight, RunRequest, RunResult, Started
from sidecar.core.boot import BootClock
from sidecar.core.deadline import DeadlineClock, new_record
from sidecar.core.disruption import StopEvidence
from sidecar.core.errors import ConfigError, StoreUnavailableError
from sidecar.core.identity import make_identity
from sidecar.core.pod_facts import Condition, ContainerState, JobFacts, PodFacts, PodMoments
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.records import LauncherInfo
from sidecar.settings import Settings, load_settings
from tests.fakes import (
    EPOCH,
    LAUNCH_ID,
    TRAINER_PID,
    FakeChannel,
    FakePodStatus,
    FakeProcesses,
    FakeReferenceClock,
    Fakes,
    MemoryStore,
    Script,
    fakes,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"
SUMMARY = (DATA / "minimal_completed.json").read_bytes()
RUN_ID = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
REQUEST = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))


def settings(tmp_path: Path, **monitor: Any) -> Settings:
    (tmp_path / "progress").mkdir(parents=True, exist_ok=True)
    monitor = {
        "progress_dir": tmp_path / "progress",
        "sample_interval_s": 1.0,
        "startup_timeout_s": 30.0,
        "stale_progress_s": 10.0,
        "post_shutdown_grace_s": 0.5,
        "status_line": "off",
        **monitor,
    }
    return load_settings(
        {
            **{f"monitor.{name}": value for name, value in monitor.items()},
            "deadline.budget_s": 600.0,
            "deadline.checkpoint_margin_s": 10.0,
            "deadline.store_dir": tmp_path / "deadlines",
            "launcher.run_dir": tmp_path / "run",
            "launcher.kill_grace_s": 1.0,
            "launcher.exit_grace_s": 2.0,
            "artifact.output_dir": tmp_path / "out",
            "s3.bucket": "soaks",
            "gpu.backend": "none",
        }
    )


def run(
    tmp_path: Path, script: Script, *, mode: str = "local", upload_fails: bool = False, **monitor: Any
) -> tuple[RunResult, Fakes, dict[str, Any]]:
    fake = fakes(script, SUMMARY, upload_fails=upload_fails)
    request = RunRequest(mode=mode, run_id=RUN_ID, command=("python3", "train.py") if mode == "local" else ())  # type: ignore[arg-type]
    result = Supervisor(settings(tmp_path, **monitor), fake.ports(), request).run()
    return result, fake, fake.files.artifact()


def test_a_passing_run_goes_through_every_phase(tmp_path: Path) -> None:
    result, fake, artifact = run(tmp_path, Script(runs_s=5.0))
    assert result.verdict.status == "passed" and result.exit_code == 0
    # preflight: the attempt was numbered under the store's lock and the record created
    assert fake.store.locked == [RUN_ID] and fake.store.attempts == {RUN_ID: 1}
    record = json.loads(fake.store.records[RUN_ID])
    assert record["budget_seconds"] == 600.0
    # launch session: local launcher spawned, heartbeat on, go with the record's deadline
    assert fake.spawner.spawned == [("python3", "train.py")] and fake.channel.heartbeats == 1
    assert fake.world.go is not None and fake.world.go.deadline_unix == record["deadline_unix"]
    assert fake.gpu.env == {"NVIDIA_VISIBLE_DEVICES": "0"} and fake.gpu.closed
    # monitoring sampled about once a second while the trainer ran five
    assert 4 <= artifact["monitor"]["sample_count"] <= 7 and fake.publisher.notes >= 4
    # the provisional artifact when the attempt was numbered (no segment: flush_s is 300 s);
    # delivery: samples, then the artifact naming their URIs; then the publication
    uploaded = [name for _, name in fake.sink.uploaded]
    assert uploaded == ["provisional-0001.json", "samples.jsonl.gz", "artifact.json"]
    ((provisional_key, provisional),) = fake.sink.objects.items()
    assert json.loads(provisional)["status"] == "running" and json.loads(provisional)["exit_code"] is None
    assert json.loads(provisional)["context"]["attempt"] == 1
    assert fake.publisher.evidence_notes == [f"s3://soaks/{provisional_key}"]
    assert artifact["upload"]["segments"] == []
    assert artifact["upload"]["uris"]["samples.jsonl.gz"].startswith("s3://soaks/")
    (published,) = fake.publisher.published
    assert published.status == "passed" and published.attempt == 1
    assert published.artifact_uri is not None and published.artifact_uri.endswith("/artifact.json")
    assert artifact["context"] == {"mode": "local", "run_id": RUN_ID, "attempt": 1}
    assert artifact["started_at_utc"] == "2023-11-14T22:13:20Z"


def test_a_trainer_json_forged_after_the_first_samples_is_named_too(tmp_path: Path) -> None:
    """The trainer may rewrite trainer.json at any time: a first read that agreed proves nothing."""
    script = replace(Script(runs_s=5.0), forged_trainer=(TRAINER_PID + 1, 1), forges_at_s=3.0)
    _, _, artifact = run(tmp_path, script)
    assert "trainer.json names pid 102" in artifact["protocol_violations"][0]


def test_a_forged_trainer_json_cannot_aim_the_kill_fallback(tmp_path: Path) -> None:
    """trainer.json names the worker and the group 1 (kill(-1)): the sidecar kills the group of the
    trainer it saw itself, the launcher's child, and names the forged claim."""
    script = Script(runs_s=1000.0, progresses=False, obeys_stop=False, leaves_orphan=True)
    script = replace(script, forged_trainer=(TRAINER_PID + 1, 1))
    _, fake, artifact = run(tmp_path, script, post_shutdown_grace_s=5.0)
    assert [pgid for pgid, _ in fake.processes.groups_killed] == [TRAINER_PID]
    assert "trainer.json names pid 102" in artifact["protocol_violations"][0]


def test_progress_that_stalls_is_stopped_and_judged(tmp_path: Path) -> None:
    result, fake, _ = run(tmp_path, Script(runs_s=1000.0, progresses=False))
    assert result.verdict.classification == "timeout/stale_tick"
    assert fake.world.requests == [("terminate", fake.world.requests[0][1])]
    assert "did not change" in fake.world.requests[0][1]
    assert fake.world.now < 20.0  # caught within the stale timeout plus a liveness step


def test_a_stall_asks_for_the_trainers_stacks_and_the_artifact_holds_them(tmp_path: Path) -> None:
    _, fake, artifact = run(tmp_path, Script(runs_s=1000.0, progresses=False), stack_capture_s=4.0)
    assert fake.world.stacks_timeouts == [4.0]
    (process,) = artifact["stacks"]["processes"]
    assert process["pid"] == TRAINER_PID and "all_reduce" in process["stack"]
    assert artifact["stacks"]["timeout_s"] == 4.0


def test_stacks_the_launcher_never_wrote_are_named_missing(tmp_path: Path) -> None:
    script = Script(runs_s=1000.0, progresses=False, obeys_stop=False)
    _, _, artifact = run(tmp_path, script, post_shutdown_grace_s=5.0)
    assert "wrote no stacks.json" in artifact["stacks"]["missing"]


def test_no_stacks_are_asked_for_when_switched_off_or_for_other_stops(tmp_path: Path) -> None:
    _, fake, artifact = run(tmp_path / "off", Script(runs_s=1000.0, progresses=False), stack_capture_s=0.0)
    assert fake.world.stacks_timeouts == [0.0] and artifact["stacks"] is None
    _, fake, artifact = run(tmp_path / "gpu", Script(runs_s=1000.0, gpu_fault_at_s=2.0))
    assert fake.world.stacks_timeouts == [0.0] and artifact["stacks"] is None


def test_a_launcher_that_ignores_the_stop_gets_the_kill_fallback(tmp_path: Path) -> None:
    script = Script(runs_s=1000.0, progresses=False, obeys_stop=False)
    result, fake, _ = run(tmp_path, script, post_shutdown_grace_s=5.0)
    assert result.verdict.classification == "timeout/stale_tick"
    # exit_grace_s (2: the trainer may have exited just before the request) + kill_grace_s (1) + 10 s
    # of slack + the stacks' 10 s after the request, then the sidecar kills by itself, at once (not
    # only when concluding, after the post-shutdown grace)
    ((pgid, killed_at),) = fake.processes.groups_killed
    assert pgid == TRAINER_PID
    requested_at = 10.0  # stale once progress has not changed for 10 s
    assert fake.world.stacks_timeouts == [10.0]
    assert requested_at + 23.0 < killed_at < requested_at + 23.0 + 1.5


def test_a_worker_that_outlives_the_trainer_is_a_resource_leak(tmp_path: Path) -> None:
    result, fake, artifact = run(tmp_path, Script(runs_s=3.0, leaves_orphan=True))
    assert result.verdict.classification == "resource_leak"
    assert [p["pid"] for p in artifact["post_shutdown"]["residual_processes"]] == [TRAINER_PID + 1]
    assert fake.world.killed == [TRAINER_PID + 1]  # and it does not outlive the run


def test_a_gpu_fault_terminates_the_trainer(tmp_path: Path) -> None:
    result, fake, _ = run(tmp_path, Script(runs_s=1000.0, gpu_fault_at_s=2.0))
    assert result.verdict.classification == "gpu_fault"
    assert fake.world.requests[0] == ("terminate", "GPU fault: GPU 0 fell off the bus")


def test_a_lost_deadline_lock_kills_the_trainer(tmp_path: Path) -> None:
    script = Script(runs_s=1000.0)
    fake = fakes(script, SUMMARY)
    ports = fake.ports()
    original_sleep = fake.world.sleep

    def sleep_then_lose(seconds: float) -> None:
        original_sleep(seconds)
        if fake.world.now > 3.0:
            fake.lock_loss("lease taken over by another pod")

    ports = Ports(**{**vars(ports), "sleep": sleep_then_lose})
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    result = Supervisor(settings(tmp_path), ports, request).run()
    assert result.verdict.classification == "monitor_failure"
    assert fake.world.requests[0] == ("kill", "deadline lock lost: lease taken over by another pod")


def test_ctrl_c_while_running_is_an_external_cancellation(tmp_path: Path) -> None:
    result, fake, _ = run(tmp_path, Script(runs_s=1000.0, interrupt_at_s=2.0))
    assert result.verdict.classification == "external_cancellation"
    # The soft stop first (the trainer checkpoints and exits), so nothing needs terminating.
    assert [action for action, _ in fake.world.requests] == ["soft_stop", "terminate"]
    assert fake.world.exit_record is not None and fake.world.exit_record.returncode == 0


def test_ctrl_c_reaches_a_trainer_that_ignores_the_soft_stop_after_the_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0, obeys_stop=False), SUMMARY)
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    grace = settings(tmp_path).launcher.stop_grace_s
    result = Supervisor(settings(tmp_path), fake.ports(), request).run()
    assert result.verdict.classification == "external_cancellation"
    assert [action for action, _ in fake.world.requests][:2] == ["soft_stop", "terminate"]
    soft_at, term_at = fake.world.request_times[:2]
    assert grace > 0 and term_at - soft_at >= grace
    # Said at once, with the grace and how to cut it short.
    assert f"SIGINT: soft stop sent; the trainer has {grace:g}s to checkpoint" in capsys.readouterr().err


def test_what_a_stop_from_outside_says_it_does() -> None:
    assert stop_notice("SIGTERM", 5.0) == (
        "soak-sidecar: SIGTERM: soft stop sent; the trainer has 5s to checkpoint and exit "
        "(--stop-grace, SOAK_LAUNCHER__STOP_GRACE_S) before SIGTERM; stop again to end it now"
    )
    assert "stopping the trainer now" in stop_notice("SIGINT", 0.0)


def test_a_pod_stopped_because_its_job_failed_elsewhere_says_so(tmp_path: Path) -> None:
    """A multi-pod soak: another index failed for good, the Job controller stops this pod."""
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0), SUMMARY)
    failure = "PodFailurePolicy: Container soak-sidecar for pod soak/train-1 failed with exit code 10"
    failing = JobFacts(
        "soak", conditions=(Condition("FailureTarget", "True", "PodFailurePolicy", failure[18:]),)
    )
    # The Job's status shows the cause a moment after the SIGTERM.
    status = FakePodStatus(
        StopEvidence(None, job=JobFacts("soak")), StopEvidence(None), StopEvidence(None, job=failing)
    )
    ports = replace(fake.ports(), pod_status=status)
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"), index=0, indexes=2)
    result = Supervisor(settings(tmp_path), ports, request).run()
    assert (result.verdict.classification, result.exit_code) == ("job_failed", 17)  # cancelled
    assert result.verdict.reason == f"the Job failed, so this pod was stopped: {failure}"
    assert fake.world.requests[0][0] == "soft_stop"
    artifact = fake.files.artifact()
    assert (artifact["context"]["index"], artifact["context"]["indexes"]) == (0, 2)
    assert fake.store.locked == [f"{RUN_ID}.index-0"] and fake.store.attempts == {f"{RUN_ID}.index-0": 1}


def test_an_evicted_pod_says_so_and_stops_softly_first(tmp_path: Path) -> None:
    """kubectl drain: the Eviction API marks the pod DisruptionTarget before the SIGTERM."""
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0), SUMMARY)
    evicted = PodFacts(
        "train-0",
        "uid",
        deleting=True,
        conditions=(
            Condition("DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"),
        ),
    )
    status = FakePodStatus(StopEvidence(None, pod=evicted, job=JobFacts("soak")))
    result = Supervisor(settings(tmp_path), replace(fake.ports(), pod_status=status), REQUEST).run()
    assert (result.verdict.classification, result.exit_code) == ("evicted", 17)
    assert (
        result.verdict.reason is not None
        and "(EvictionByEvictionAPI: Eviction API: evicting)" in result.verdict.reason
    )
    assert fake.world.requests[0][0] == "soft_stop"
    assert status.reads == 1  # decisive at once: no waiting for more
    assert fake.files.artifact()["failure_classification"] == "evicted"


def test_a_pod_deleted_with_no_cause_waits_a_moment_for_one(tmp_path: Path) -> None:
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0), SUMMARY)
    deleted = PodFacts("train-0", "uid", deleting=True)
    status = FakePodStatus(StopEvidence(None, pod=deleted, job=JobFacts("soak")))
    result = Supervisor(settings(tmp_path), replace(fake.ports(), pod_status=status), REQUEST).run()
    assert result.verdict.classification == "pod_deleted"
    assert status.reads >= 3  # asked until cause_wait_s passed


def test_locally_a_ctrl_c_is_named_in_the_reason(tmp_path: Path) -> None:
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0), SUMMARY)
    result = Supervisor(settings(tmp_path), fake.ports(), REQUEST).run()
    assert result.verdict.classification == "external_cancellation"
    assert (
        result.verdict.reason == "soak was interrupted before the trainer completed: the sidecar got Ctrl-C"
    )


def test_an_oom_killed_trainer_is_out_of_memory_with_limit_victim_and_peak(tmp_path: Path) -> None:
    result, _, artifact = run(tmp_path, Script(oom_killed=True, writes_summary=False))
    assert (result.verdict.classification, result.exit_code) == ("out_of_memory", 20)
    reason = result.verdict.reason or ""
    assert reason.startswith(
        "out of memory: the kernel's OOM killer killed the trainer (pid 101: python3 train.py) "
        "at its memory limit of 192.0 MiB; peak RSS sampled "
    ), reason
    assert artifact["post_shutdown"]["launcher_exit"]["memory"]["oom_kills_at_end"] == 1
    assert artifact["exit_code"] == 20


def test_a_launcher_without_the_subreaper_is_refused_before_the_go(tmp_path: Path) -> None:
    result, fake, artifact = run(tmp_path, Script(subreaper=False))
    assert result.verdict.classification == "refused"
    assert fake.world.go is None and fake.world.aborted is not None
    assert fake.world.aborted[1] == result.exit_code
    assert artifact["deadline"] is None and artifact["monitor"]["sample_count"] == 0


def test_a_launcher_that_never_appears_is_launcher_missing(tmp_path: Path) -> None:
    result, fake, _ = run(tmp_path, Script(appears=False), mode="pod")
    assert result.verdict.classification == "launcher_missing"
    assert fake.world.go is None


def test_a_command_that_cannot_start_uses_no_record_and_no_attempt(tmp_path: Path) -> None:
    result, fake, artifact = run(tmp_path, Script(command_problem="was not found"))
    assert result.verdict.classification == "trainer_not_started" and result.exit_code == 19
    assert "'python3' was not found" in (result.verdict.reason or "")
    assert fake.store.records == {} and fake.store.attempts == {}
    assert fake.world.aborted is not None and fake.world.aborted[1] == 19  # the launcher exits now
    assert fake.world.go is None and artifact["context"]["attempt"] == 0


def test_an_upload_failure_turns_a_pass_into_evidence_lost(tmp_path: Path) -> None:
    result, fake, artifact = run(tmp_path, Script(runs_s=2.0), upload_fails=True)
    assert result.verdict.classification == "evidence_lost"
    assert artifact["upload"]["error"] == "the bucket refused the upload"
    assert fake.publisher.published[0].classification == "evidence_lost"


def test_a_trainer_without_a_run_summary_fails(tmp_path: Path) -> None:
    result, _, _ = run(tmp_path, Script(runs_s=2.0, writes_summary=False))
    assert result.verdict.status == "failed"


def test_local_mode_needs_a_command(tmp_path: Path) -> None:
    fake = fakes(Script(), SUMMARY)
    with pytest.raises(ConfigError, match="needs a trainer command"):
        Supervisor(settings(tmp_path), fake.ports(), RunRequest(mode="local", run_id=RUN_ID))


def test_go_ahead_carries_the_record_the_settings_and_the_trainers_extras(tmp_path: Path) -> None:
    fake = fakes(Script(), SUMMARY)
    info = fake.channel.wait_for_launcher(1.0)
    identity = make_identity(
        run_id=RUN_ID, command=("t",), budget_s=600, checkpoint_margin_s=10, deadline_store="memory://"
    )
    record = new_record(identity, now_wall=EPOCH)
    conf = settings(tmp_path)
    preflight = Preflight(
        record=record,
        clock=DeadlineClock(record, now_wall=EPOCH + 100, now_monotonic=0.0),
        resumed=False,
        remaining_at_start_s=500.0,
        resume_checkpoint="/ck/step-9",
        checkpoint_record="/ck/step-9",
        extra_args=("--resume", "/ck/step-9"),
    )
    started = Started(RunRequest(mode="local", run_id=RUN_ID, command=("t",)), wall=EPOCH, monotonic=0.0)
    go = go_ahead(conf, Launched(info, ("t",)), started, preflight)
    assert go.launch_id == LAUNCH_ID and go.deadline_unix == pytest.approx(EPOCH + 600)
    assert go.soft_stop_unix == pytest.approx(EPOCH + 590)
    assert go.kill_grace_s == 1.0 and go.exit_grace_s == 2.0
    assert go.extra_args == ("--resume", "/ck/step-9")
    env = go.trainer_env()
    assert env["SOAK_RUN_ID"] == RUN_ID and env["SOAK_RESUME_CHECKPOINT"] == "/ck/step-9"
    assert env["SOAK_PROGRESS_DIR"] == str((tmp_path / "progress").resolve())
    assert env["SOAK_CHECKPOINT_RECORD"] == "/ck/step-9" and env["SOAK_CHECKPOINT_DIR"] == "/ck"
    in_progress = str((tmp_path / "progress" / "checkpoint.json").resolve())
    record_beside_progress = replace(preflight, checkpoint_record=in_progress)
    env = go_ahead(conf, Launched(info, ("t",)), started, record_beside_progress).trainer_env()
    assert env["SOAK_CHECKPOINT_RECORD"] == in_progress and "SOAK_CHECKPOINT_DIR" not in env


def test_go_ahead_gives_the_deadline_in_this_nodes_wall_clock(tmp_path: Path) -> None:
    """A node whose wall clock is 30 s ahead of the record's (within the skew tolerance) gets a
    go.json deadline 30 s earlier in real time: the least any clock allows, never more."""
    fake = fakes(Script(), SUMMARY)
    info = fake.channel.wait_for_launcher(1.0)
    identity = make_identity(
        run_id=RUN_ID, command=("t",), budget_s=600, checkpoint_margin_s=10, deadline_store="memory://"
    )
    record = new_record(identity, now_wall=EPOCH, boot=BootClock("b", 1000.0))
    # 100 s of real time later by CLOCK_BOOTTIME; the wall clock says 130 s.
    clock = DeadlineClock(record, now_wall=EPOCH + 130, now_monotonic=0.0, boot=BootClock("b", 1100.0))
    assert clock.remaining(EPOCH + 130, 0.0) == pytest.approx(470.0)
    preflight = Preflight(record, clock, False, 470.0, None, None, ())
    started = Started(RunRequest(mode="local", run_id=RUN_ID, command=("t",)), wall=EPOCH, monotonic=0.0)
    go = go_ahead(settings(tmp_path), Launched(info, ("t",)), started, preflight)
    assert go.deadline_unix == pytest.approx(EPOCH + 600)  # the record's deadline, in this wall clock


def test_a_reference_clock_stamps_the_record_and_bounds_every_later_attempt(tmp_path: Path) -> None:
    """A pod's record carries the apiserver's time; an attempt after a reboot (another boot id) whose
    wall clock is behind the apiserver's beyond the tolerance is refused, within it is shortened."""
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    first = fakes(Script(runs_s=5.0), SUMMARY)
    ports = replace(first.ports(), reference_clock=FakeReferenceClock(first.world))
    assert Supervisor(settings(tmp_path), ports, request).run().exit_code == 0
    record = json.loads(first.store.records[RUN_ID])
    assert record["reference"] == {
        "source": "the Kubernetes apiserver's clock (Date)",
        "unix": record["started_unix"],
    }

    def attempt(apiserver_ahead_s: float) -> tuple[RunResult, Fakes]:
        # The world's clock starts again at EPOCH: the node's wall clock says no time has passed.
        fake = fakes(Script(runs_s=5.0), SUMMARY)
        fake.world.boot_id = "after-a-reboot"
        fake.store = first.store
        clock = FakeReferenceClock(fake.world, offset_s=apiserver_ahead_s)
        return Supervisor(
            settings(tmp_path), replace(fake.ports(), reference_clock=clock), request
        ).run(), fake

    refused, _ = attempt(400.0)
    assert refused.exit_code == 15 and "apiserver's clock (Date) says" in (refused.verdict.reason or "")
    shortened, fake = attempt(30.0)
    assert shortened.exit_code == 0 and fake.world.go is not None
    assert fake.world.go.deadline_unix == pytest.approx(record["deadline_unix"] - 30.0, abs=1.0)


def test_refusals_before_the_lock_never_share_an_s3_key(tmp_path: Path) -> None:
    fake = fakes(Script(), SUMMARY)
    ports = Ports(**{**vars(fake.ports()), "store": RefusingStore()})
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    for _ in range(2):
        result = Supervisor(settings(tmp_path), ports, request).run()
        assert result.verdict.classification == "transient_infra"
    prefixes = {prefix for prefix, name in fake.sink.uploaded if name == "artifact.json"}
    assert len(prefixes) == 2, fake.sink.uploaded  # the second refusal did not hit the first's key
    assert all("/unnumbered-" in prefix for prefix in prefixes)


class RefusingStore(MemoryStore):
    """A store whose lock cannot be taken: the run is refused before it has an attempt number."""

    def lock(self, run_id: str) -> Any:
        raise StoreUnavailableError("the deadline store is down")


class BrokenProcesses(FakeProcesses):
    """A process table that fails in a way nothing foresaw."""

    def environ(self, pid: int) -> Any:
        raise RuntimeError("an adapter bug")


def test_any_failure_still_ends_in_a_verdict_with_an_artifact(tmp_path: Path) -> None:
    fake = fakes(Script(), SUMMARY)
    ports = Ports(**{**vars(fake.ports()), "processes": BrokenProcesses(fake.world)})
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    result = Supervisor(settings(tmp_path), ports, request).run()
    assert result.verdict.classification == "monitor_failure" and result.exit_code == 70
    assert result.verdict.reason == "soak-sidecar failed: RuntimeError: an adapter bug"
    assert fake.files.artifact()["failure_classification"] == "monitor_failure"
    assert fake.publisher.published[0].exit_code == 70
    assert fake.world.aborted is not None and fake.world.go is None  # the trainer never started


class HostileChannel(FakeChannel):
    """exit.json as a trainer could write it: well-formed JSON, wrong inside."""

    def wait_exit(self, timeout_s: float) -> ExitRecord | None:
        hostile = {"launch_id": LAUNCH_ID, "exit_code": 0, "reason": "exited", "unreaped": ["x"]}
        return ExitRecord.parse(hostile)


def test_a_hostile_exit_record_is_a_verdict_not_a_crash(tmp_path: Path) -> None:
    fake = fakes(Script(runs_s=2.0), SUMMARY)
    ports = Ports(**{**vars(fake.ports()), "channel": HostileChannel(fake.world)})
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    result = Supervisor(settings(tmp_path), ports, request).run()
    assert result.verdict.classification == "monitor_failure"
    assert "unreaped holds 'x', which is not of type int" in (result.verdict.reason or "")


class ForgedLauncherChannel(FakeChannel):
    """launcher.json names another process (a daemon left by an earlier trainer wrote it first)."""

    def wait_for_launcher(self, timeout_s: float, *, alive: Callable[[], bool] | None = None) -> LauncherInfo:
        return replace(super().wait_for_launcher(timeout_s, alive=alive), pid=4242, start_ticks=4242)


def test_a_launcher_json_naming_another_process_is_not_the_local_launcher(tmp_path: Path) -> None:
    fake = fakes(Script(), SUMMARY)
    processes = fake.processes
    ports = Ports(**{**vars(fake.ports()), "channel": ForgedLauncherChannel(fake.world)})
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    result = Supervisor(settings(tmp_path), ports, request).run()
    assert result.verdict.classification == "launcher_missing"
    assert "names pid 4242, not the launcher started here" in (result.verdict.reason or "")
    assert fake.world.go is None and not processes.groups_killed  # nothing started, nothing signalled


def phases_of(artifact: dict[str, Any]) -> dict[str, float]:
    return {phase["kind"]: phase["seconds"] for phase in artifact["phases"]["phases"]}


def test_the_artifact_says_where_the_attempts_time_went(tmp_path: Path) -> None:
    """Productive from the first progress to the trainer's exit, then teardown (the simulated launcher
    starts the trainer at once: no launcher or startup phase here; tests/integration shows them); a
    pass loses no work."""
    _, _, artifact = run(tmp_path, Script(runs_s=5.0))
    kinds = phases_of(artifact)
    assert list(kinds) == ["productive", "teardown"], kinds
    assert 4.0 <= kinds["productive"] <= 6.0 and artifact["phases"]["lost_work_known"]
    assert artifact["phases"]["checkpoint"] is None


def test_a_failed_attempt_loses_the_work_since_its_last_checkpoint(tmp_path: Path) -> None:
    result, _, artifact = run(tmp_path, Script(runs_s=6.0, returncode=1, checkpoint_at_s=2.0))
    assert result.verdict.status == "failed"
    info = artifact["phases"]
    kinds = phases_of(artifact)
    assert list(kinds) == ["productive", "lost_work", "teardown"], kinds
    assert 3.0 <= kinds["lost_work"] <= 5.0 and info["lost_work_known"]
    assert info["checkpoint"]["step"] == 7 and info["checkpoint"]["path"] == "ckpt/7"
    assert info["checkpoint"]["records_seen"] == 1
    phases = info["phases"]
    span = phases[-1]["start_unix"] + phases[-1]["seconds"] - phases[0]["start_unix"]
    assert abs(sum(kinds.values()) - span) < 1e-3


def test_without_a_checkpoint_the_lost_work_is_not_guessed(tmp_path: Path) -> None:
    _, _, artifact = run(tmp_path, Script(runs_s=4.0, returncode=1))
    assert artifact["phases"]["checkpoint"] is None and not artifact["phases"]["lost_work_known"]
    assert "lost_work" not in phases_of(artifact)


def test_a_pods_attempt_begins_at_its_pods_creation(tmp_path: Path) -> None:
    """In a pod the attempt's first phases are the pod's own: scheduling and the containers' start."""
    fake = fakes(Script(runs_s=4.0), SUMMARY)
    created = fake.world.wall() - 30.0
    moments = PodMoments(created=created, scheduled=created + 2.0, containers_started=created + 20.0)
    ports = replace(fake.ports(), pod_status=FakePodStatus(StopEvidence(None), moments=moments))
    request = RunRequest(mode="local", run_id=RUN_ID, command=("python3", "train.py"))
    Supervisor(settings(tmp_path), ports, request).run()
    phases = fake.files.artifact()["phases"]["phases"]
    assert [(p["kind"], p["seconds"]) for p in phases[:3]] == [
        ("scheduling", 2.0),
        ("container_start", 18.0),
        ("launcher", 10.0),
    ]
    assert phases[0]["start_unix"] == created


def _pod_run(tmp_path: Path, script: Script, ended: ContainerState | None) -> tuple[RunResult, Fakes]:
    fake = fakes(script, SUMMARY)
    ports = replace(fake.ports(), pod_status=FakePodStatus(StopEvidence(None), ended=ended))
    result = Supervisor(settings(tmp_path), ports, RunRequest(mode="pod", run_id=RUN_ID)).run()
    return result, fake


def test_in_a_pod_the_kubelets_report_of_the_trainer_container_confirms_exit_json(tmp_path: Path) -> None:
    result, _ = _pod_run(tmp_path, Script(runs_s=3.0), ContainerState("terminated", "Completed", exit_code=0))
    assert result.verdict.status == "passed" and result.exit_code == 0


def test_in_a_pod_a_record_the_kubelet_contradicts_is_no_record(tmp_path: Path) -> None:
    """The trainer container exited 3 (its launcher said so to the kubelet); exit.json says 0."""
    result, fake = _pod_run(tmp_path, Script(runs_s=3.0), ContainerState("terminated", "Error", exit_code=3))
    assert result.exit_code == 70 and result.verdict.classification == "monitor_failure"
    artifact = fake.files.artifact()
    violations = " ".join(artifact["protocol_violations"])
    assert "the trainer container (as the kubelet reports it) exited 3" in violations, violations


def test_in_a_pod_a_record_the_kubelet_never_confirms_cannot_pass(tmp_path: Path) -> None:
    result, fake = _pod_run(tmp_path, Script(runs_s=3.0), None)
    assert result.exit_code == 70 and result.verdict.status != "passed"
    violations = " ".join(fake.files.artifact()["protocol_violations"])
    assert "the kubelet reported no end of the trainer container within 30 s" in violations
    assert fake.world.now >= 30.0  # it waited for the kubelet first


def test_in_a_pod_a_stopped_run_keeps_an_unconfirmed_record_as_evidence_only(tmp_path: Path) -> None:
    """A pod deleted: the sidecar's own verdict stands; the kubelet had not yet reported the trainer
    container's end within the stop's short wait, so the record is shown but marked unconfirmed."""
    fake = fakes(Script(runs_s=1000.0, interrupt_at_s=2.0), SUMMARY)
    deleted = PodFacts("train-0", "uid", deleting=True)
    status = FakePodStatus(StopEvidence(None, pod=deleted, job=JobFacts("soak")), ended=None)
    result = Supervisor(
        settings(tmp_path), replace(fake.ports(), pod_status=status), RunRequest(mode="pod", run_id=RUN_ID)
    ).run()
    assert result.verdict.classification == "pod_deleted"
    artifact = fake.files.artifact()
    assert artifact["post_shutdown"]["launcher_exit"]["confirmed"] is False
    assert artifact["post_shutdown"]["launcher_exit"]["soft_stop_sent"] is True
    assert artifact["protocol_violations"] == []
    # The ledger's phases still place the stop and the exit by the record (accounting, not verdict).
    assert "teardown" in [p["kind"] for p in artifact["phases"]["phases"]]
