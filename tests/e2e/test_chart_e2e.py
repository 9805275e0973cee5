"""The chart on a real cluster, installed with ``helm install`` as a user would, one soak per test.

Each scenario is checked through the API (Job conditions, pod and container status, annotations,
Events, termination messages), through ``soak-sidecar verdict`` and through the S3 bucket the
sidecar uploads to. The cluster comes from tests/e2e/conftest.py (``SOAK_E2E=node|kind``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.exitcodes import ExitCode
from sidecar.core.ledger.phases import PHASES
from tests.cluster import images
from tests.cluster.providers import NAMESPACE, S3_BUCKET, E2ECluster, container, terminated
from tests.components import absent, require
from tests.fixtures import trainers
from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

PREFIX = "soak.sidecar.io/"
SOAK_TIMEOUT_S = 240
# Every early exit must end the pod this fast, never linger (issue: the pod hung until
# activeDeadlineSeconds when the sidecar exited 64).
EARLY_EXIT_BOUND_S = 60
LONG_TRAINER = ["--steps", "400", "--step-s", "0.5"]


@pytest.fixture
def soak(e2e: E2ECluster) -> Iterator[Any]:
    """install(release, values) -> (job, run_id); every release is uninstalled afterwards."""
    releases: list[str] = []

    def install(release: str, values: dict[str, Any]) -> tuple[str, str]:
        run_id = str(uuid.uuid4())
        merged = _merge(e2e.s3_values, {"runId": run_id, **values})
        e2e.helm_install(release, merged)
        releases.append(release)
        return f"{release}-soak-sidecar", run_id

    yield install
    for release in releases:
        e2e.helm_uninstall(release)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def verdict(e2e: E2ECluster, job: str) -> tuple[int, dict[str, Any]]:
    """``soak-sidecar verdict JOB -n NS -o json`` with KUBECONFIG set, as a user would run it."""
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "verdict", job, "-n", NAMESPACE, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**e2e.env},
    )
    assert result.stdout.strip(), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return result.returncode, report


def ours(pod: dict[str, Any]) -> dict[str, str]:
    return {
        k.removeprefix(PREFIX): v
        for k, v in (pod["metadata"].get("annotations") or {}).items()
        if k.startswith(PREFIX)
    }


def sidecar_exit(pod: dict[str, Any]) -> int:
    return int(terminated(pod, "soak-sidecar")["exitCode"])


def failed_reason(job: dict[str, Any]) -> str:
    (failed,) = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    return str(failed["reason"])


def artifacts_of(e2e: E2ECluster, run_id: str) -> dict[str, dict[str, Any]]:
    return {key: obj for key, obj in e2e.list_objects().items() if f"/{run_id}/" in key}


def ledger_key(e2e: E2ECluster, run_id: str) -> str:
    (key,) = [key for key in artifacts_of(e2e, run_id) if key.endswith(f"/{run_id}/ledger.json")]
    return key


def ledger_of(e2e: E2ECluster, run_id: str) -> dict[str, Any]:
    """The run's ledger in the bucket (one object beside its attempts)."""
    objects = artifacts_of(e2e, run_id)
    (ledger,) = [obj["json"] for key, obj in objects.items() if key.endswith(f"/{run_id}/ledger.json")]
    assert isinstance(ledger, dict)
    return ledger


def wait_running(e2e: E2ECluster, job: str, *, progressing: bool = False) -> dict[str, Any]:
    """The soak's pod once the trainer has started (the sidecar has logged a sample); with
    ``progressing``, once a sample has seen the trainer's progress."""
    found: dict[str, Any] = {}

    def sampling() -> bool:
        pods = e2e.pods(job)
        if not pods or pods[-1]["status"].get("phase") != "Running":
            return False
        found["pod"] = pods[-1]
        lines = e2e.logs(pods[-1]["metadata"]["name"], "soak-sidecar").splitlines()
        samples = [line for line in lines if '"event": "sample"' in line]
        if not progressing:
            return bool(samples)
        return any('"progress_age_s": null' not in line for line in samples)

    wait_until(f"Job {job} sampling", sampling, SOAK_TIMEOUT_S, interval_s=1.0)
    pod: dict[str, Any] = found["pod"]
    return pod


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_lifetime_s(pod: dict[str, Any]) -> float:
    """From the pod's start to the last container's finish."""
    finished = [_stamp(terminated(pod, name)["finishedAt"]) for name in ("trainer", "soak-sidecar")]
    return max(finished) - _stamp(pod["status"]["startTime"])


def failed_by_policy(e2e: E2ECluster, job_name: str, code: ExitCode, classification: str) -> dict[str, Any]:
    """A permanent verdict: the Job failed through its podFailurePolicy after one pod, no retry."""
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed" and failed_reason(job) == "PodFailurePolicy", job["status"]
    (pod,) = e2e.pods(job_name)
    assert sidecar_exit(pod) == code, e2e.logs(pod["metadata"]["name"], "soak-sidecar")[-3000:]
    assert ours(pod)["classification"] == classification
    return pod


# ---------------------------------------------------------------- scenarios

# What the project image may weigh (docker image inspect's Size). It was 320 MiB before the
# Kubernetes client's asyncio half, aiohttp and the installers left it; a dependency that brings
# as much back fails here.
IMAGE_BUDGET_MIB = 280


def test_the_image_stays_small(e2e: E2ECluster) -> None:
    size = int(images.project_image().with_suffix(".size").read_text(encoding="utf-8"))
    print(f"project image: {size / 2**20:.0f} MiB")
    assert size <= IMAGE_BUDGET_MIB * 2**20, f"project image {size / 2**20:.0f} MiB > {IMAGE_BUDGET_MIB} MiB"


def test_passing_soak(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak("pass", {})
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    (pod,) = e2e.pods(job_name)
    assert condition == "Complete", (condition, e2e.logs(pod["metadata"]["name"], "soak-sidecar")[-3000:])
    assert job["status"]["succeeded"] == 1
    assert sidecar_exit(pod) == ExitCode.PASSED
    message = terminated(pod, "soak-sidecar").get("message", "")
    assert '"passed"' in message or "passed" in message, message
    published = ours(pod)
    assert published["verdict"] == "passed" and published["exit-code"] == "0"
    assert published["attempt"] == "1" and run_id in published["artifact"]
    events = e2e.events(pod["metadata"]["name"])
    assert any("passed" in (e.get("message") or "").lower() for e in events), events
    # The artifact and its evidence are in S3, each with a SHA-256 checksum the store verified.
    objects = artifacts_of(e2e, run_id)
    (artifact_key,) = [k for k in objects if k.endswith("/artifact.json")]
    assert published["artifact"].endswith(artifact_key)
    artifact = objects[artifact_key]
    assert artifact["sha256"] == published["artifact-sha256"]
    assert artifact["json"]["status"] == "passed"
    # Where the attempt's time went, from the pod's creation: its own phases first, in order (the
    # API's clock has whole seconds, so a quick scheduling or container start may round to none).
    kinds = [phase["kind"] for phase in artifact["json"]["phases"]["phases"]]
    assert kinds[0] in ("scheduling", "container_start"), kinds
    assert kinds == sorted(kinds, key=PHASES.index), kinds
    assert kinds[-3:] == ["startup", "productive", "teardown"] or kinds[-2:] == ["productive", "teardown"], (
        kinds
    )
    for key, obj in objects.items():
        assert obj["checksum_sha256"], f"{key} has no stored checksum"
        assert (
            base64.b64decode(obj["checksum_sha256"]).hex() == obj["sha256"] or "-" in obj["checksum_sha256"]
        )
    assert any(k.endswith("samples.jsonl.gz") for k in objects), objects
    code, report = verdict(e2e, job_name)
    assert code == 0 and report["passed"] is True
    assert [a["verdict"] for a in report["attempts"]] == ["passed"]


def test_crash_fails_the_job_at_once(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak(
        "crash",
        {"trainer": {"args": ["--steps", "20", "--step-s", "0.3", "--crash"]}, "job": {"backoffLimit": 2}},
    )
    # backoffLimit 2, yet no retry: the verdict is permanent.
    failed_by_policy(e2e, job_name, ExitCode.TRAINER_FAILED, "learner_failure")
    code, report = verdict(e2e, job_name)
    assert code != 0 and [a["exit_code"] for a in report["attempts"]] == [ExitCode.TRAINER_FAILED]
    assert any(k.endswith("/artifact.json") for k in artifacts_of(e2e, run_id))
    # Annotations that claim a pass are not believed over the kubelet's record of the exit code.
    (pod,) = e2e.pods(job_name)
    forged = {"metadata": {"annotations": {f"{PREFIX}verdict": "passed", f"{PREFIX}exit-code": "0"}}}
    e2e.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", NAMESPACE, "--type=merge", "-p", json.dumps(forged)
    )
    code, report = verdict(e2e, job_name)
    assert code != 0 and report["passed"] is False, report
    assert "mismatch" in json.dumps(report["attempts"][-1]), report


def test_stall(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak(
        "stall",
        {
            "trainer": {"args": ["--steps", "50", "--step-s", "0.3", "--hang"]},
            "monitor": {"staleProgressSeconds": 6},
        },
    )
    failed_by_policy(e2e, job_name, ExitCode.STALLED, "timeout/stale_tick")
    # Where it hung: the launcher ran the py-spy the init container put beside it, in the trainer's
    # container under PSS restricted, before the TERM.
    (artifact,) = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    stacks = artifact["stacks"]
    assert stacks.get("tool") == "/soak/bin/py-spy", stacks
    taken = [p["stack"] for p in stacks["processes"] if p["stack"]]
    assert any("examples/trainer.py" in stack for stack in taken), stacks


def test_deadline(e2e: E2ECluster, soak: Any) -> None:
    # A trainer that ignores the soft stop and SIGTERM: only the KILL at the deadline ends it.
    job_name, run_id = soak(
        "deadline",
        {
            "trainer": {"args": ["--steps", "2", "--step-s", "0.2", "--hang", "--ignore-term"]},
            "deadline": {"budgetSeconds": 30, "checkpointMarginSeconds": 10, "termGraceSeconds": 4},
            "monitor": {"staleProgressSeconds": 600},
        },
    )
    pod = failed_by_policy(e2e, job_name, ExitCode.DEADLINE_EXHAUSTED, "deadline_exhausted")
    assert terminated(pod, "trainer")["exitCode"] == 128 + 9
    (artifact,) = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    launcher_exit = artifact["post_shutdown"]["launcher_exit"]
    assert launcher_exit["soft_stop_sent"] and launcher_exit["term_sent"] and launcher_exit["kill_sent"]
    # The trainer's whole tree is gone: nothing survived the kill at the deadline.
    assert artifact["post_shutdown"]["residual_processes"] == [], artifact["post_shutdown"]


GPU_LOST_AT_S = 4


def test_gpu_fault_retries_on_the_same_deadline(e2e: E2ECluster, soak: Any) -> None:
    scenario = {
        "driver_version": "550.54.15",
        "time_unit": "seconds",
        "devices": [
            {
                "uuid": "GPU-00000000-0000-4000-8000-0000000000e2",
                "memory_used_mib": 2048,
                "lost_at": GPU_LOST_AT_S,
                "processes": [{"pid": "~sidecar.examples.trainer", "used_memory_mib": 1000}],
            }
        ],
    }
    job_name, run_id = soak(
        "gpufault",
        {
            "trainer": {"args": LONG_TRAINER},
            "job": {"backoffLimit": 1},
            "gpu": {"mock": {"scenario": scenario}},
        },
    )
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed" and failed_reason(job) == "BackoffLimitExceeded", job["status"]
    first, second = e2e.pods(job_name)
    assert sidecar_exit(first) == sidecar_exit(second) == ExitCode.GPU_FAULT
    assert ours(first)["classification"] == ours(second)["classification"] == "gpu_fault"
    # The second pod resumed the same deadline record: attempt 2, the same deadline, never a fresh budget.
    assert (ours(first)["attempt"], ours(second)["attempt"]) == ("1", "2")
    assert ours(first)["deadline"] == ours(second)["deadline"]
    artifacts = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    assert len(artifacts) == 2
    assert len({json.dumps(a["deadline"]["deadline_unix"]) for a in artifacts}) == 1
    code, report = verdict(e2e, job_name)
    assert code != 0 and [a["attempt"] for a in report["attempts"]] == [1, 2]


def test_sidecar_killed_stops_the_trainer(e2e: E2ECluster, soak: Any) -> None:
    """The sidecar SIGKILLed mid-run: the launcher stops the trainer, and the evidence sent until
    then stays in the bucket (the provisional artifact, segments), which ``verdict`` points at."""
    job_name, run_id = soak(
        "sidecarkill",
        {
            "trainer": {"args": LONG_TRAINER},
            "job": {"backoffLimit": 0},
            "sidecar": {
                "extraEnv": [
                    {"name": "SOAK_LAUNCHER__HEARTBEAT_TIMEOUT_S", "value": "5"},
                    {"name": "SOAK_EVIDENCE__FLUSH_S", "value": "2"},
                ]
            },
        },
    )
    pod = wait_running(e2e, job_name)
    wait_until(
        "a segment of samples in the bucket",
        lambda: any(".seg-" in key for key in artifacts_of(e2e, run_id)),
        SOAK_TIMEOUT_S,
        interval_s=1.0,
    )
    kill_sidecar(e2e, pod["metadata"]["name"])
    killed_at = time.time()
    condition, _job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed"
    (pod,) = e2e.pods(job_name)
    assert sidecar_exit(pod) == 128 + 9
    trainer = terminated(pod, "trainer")
    assert "heartbeat_lost" in trainer.get("message", ""), trainer
    assert _stamp(trainer["finishedAt"]) - killed_at < 30, "the launcher stops the trainer on heartbeat loss"
    _, report = verdict(e2e, job_name)
    (attempt,) = report["attempts"]
    assert attempt["verdict"] is None and "heartbeat_lost" in attempt["reason"], attempt
    assert attempt["reason"].startswith("attempt 1 ended without a verdict (last evidence at "), attempt
    objects = artifacts_of(e2e, run_id)
    assert not any(key.endswith("/artifact.json") for key in objects), sorted(objects)
    (record_key,) = [key for key in objects if key.endswith("/provisional-0001.json")]
    assert attempt["artifact"] == f"s3://{S3_BUCKET}/{record_key}", attempt
    provisional = objects[record_key]["json"]
    assert provisional["status"] == "running" and provisional["context"]["attempt"] == 1
    assert provisional["deadline"]["run_id"] == run_id
    assert any(key.endswith("/samples.jsonl.gz.seg-000001") for key in objects), sorted(objects)


def test_pod_deleted_mid_run_is_cancelled_with_evidence(e2e: E2ECluster, soak: Any) -> None:
    grace_s = 30
    job_name, run_id = soak(
        "deleted",
        {
            "trainer": {"args": LONG_TRAINER, "stopGraceSeconds": 10},
            "job": {"backoffLimit": 0},
            "pod": {"terminationGracePeriodSeconds": grace_s},
        },
    )
    pod = wait_running(e2e, job_name)
    name = pod["metadata"]["name"]
    started = time.monotonic()
    e2e.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s", timeout=180)
    assert time.monotonic() - started < grace_s, "the sidecar finished within the grace period"
    (artifact,) = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    # No Job decision, no DisruptionTarget: the pod was deleted, and the verdict says so.
    assert artifact["failure_classification"] == "pod_deleted", artifact["failure_reason"]
    assert artifact["exit_code"] == ExitCode.CANCELLED
    # The trainer got the soft stop before any SIGTERM (whichever came first: the kubelet's SIGTERM
    # to the launcher, or the sidecar's request on its cancellation), checkpointed and exited 0.
    assert_soft_stopped(artifact)
    events = e2e.events(name)
    assert any("the pod was deleted" in (e.get("message") or "") for e in events), events


# The trainer grows past its container's memory limit; the kernel kills it.
GROWS = "import time\nx = []\nwhile True:\n    x.append(bytearray(8 * 2**20)); time.sleep(0.05)\n"


def test_out_of_memory_names_the_limit(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak(
        "oom",
        {
            "trainer": {
                "command": ["python3", "-c", GROWS],
                "resources": {"limits": {"memory": "192Mi"}, "requests": {"memory": "192Mi"}},
            },
            "job": {"backoffLimit": 2},
        },
    )
    pod = failed_by_policy(e2e, job_name, ExitCode.OUT_OF_MEMORY, "out_of_memory")
    reason = ours(pod)["reason"]
    assert "OOM killer killed the trainer" in reason and "memory limit of 192.0 MiB" in reason, reason
    (artifact,) = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    memory = artifact["post_shutdown"]["launcher_exit"]["memory"]
    assert memory["limit_bytes"] == 192 * 2**20 and memory["oom_killed"], memory
    events = e2e.events(pod["metadata"]["name"])
    assert any("out of memory" in (e.get("message") or "") for e in events), events


SHORT_TRAINER = ["--steps", "40", "--step-s", "0.5"]


def stopped_then_resumed(
    e2e: E2ECluster, job_name: str, run_id: str, cause: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The soak's first attempt was stopped for ``cause`` and the second passed on the same deadline:
    both attempts' artifacts (from S3)."""
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Complete", job["status"]
    artifacts = sorted(
        (o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")),
        key=lambda a: int(a["context"]["attempt"]),
    )
    assert [(a["context"]["attempt"], a["failure_classification"]) for a in artifacts] == [
        (1, cause),
        (2, None),
    ], [a["failure_reason"] for a in artifacts]
    # A suspension is no failure (153: the podFailurePolicy ignores it); a drain is a cancellation
    # the DisruptionTarget condition makes the policy ignore.
    assert artifacts[0]["exit_code"] == (
        ExitCode.JOB_SUSPENDED if cause == "job_suspended" else ExitCode.CANCELLED
    )
    assert len({json.dumps(a["deadline"]["deadline_unix"]) for a in artifacts}) == 1
    code, report = verdict(e2e, job_name)
    assert code == 0 and report["passed"] is True, report
    first, second = artifacts
    return first, second


@pytest.fixture
def checkpoint_claim(e2e: E2ECluster) -> Iterator[tuple[str, Path]]:
    """A PVC bound to a host directory the node reaches (a hostPath PV), writable by the pod's UIDs,
    as a user's checkpoint volume: (claim name, the directory)."""
    root = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=e2e.workdir))
    root.chmod(0o777)
    if not any(root.is_relative_to(path) for path in e2e.host_paths):
        pytest.skip(f"{root} is not a directory this cluster's node reaches")
    name = f"checkpoints-{uuid.uuid4().hex[:8]}"
    e2e.apply([
        {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                "hostPath": {"path": str(root), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": name},
            },
        },
        {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ])  # fmt: skip
    yield name, root
    e2e.kubectl("delete", "pvc", name, "-n", NAMESPACE, "--wait=false", check=False)
    e2e.kubectl("delete", "pv", name, "--wait=false", check=False)


def test_a_drained_soak_says_evicted_and_resumes(
    e2e: E2ECluster, soak: Any, checkpoint_claim: tuple[str, Path]
) -> None:
    """...from the checkpoint the drained pod saved on the checkpoint volume, with no hand step."""
    claim, volume = checkpoint_claim
    values = {
        "trainer": {"args": SHORT_TRAINER, "stopGraceSeconds": 5},
        "checkpoint": {"existingClaim": claim},
    }
    job_name, run_id = soak("drained", values)
    # Drained once the trainer works: its attempt then has a productive phase (CI drained one still
    # starting, on a loaded machine).
    pod = wait_running(e2e, job_name, progressing=True)
    node = pod["spec"]["nodeName"]
    try:
        e2e.kubectl(
            *("drain", node, "--pod-selector", f"batch.kubernetes.io/job-name={job_name}"),
            *("--delete-emptydir-data", "--ignore-daemonsets", "--timeout=120s"),
            timeout=180,
        )
    finally:
        e2e.kubectl("uncordon", node)
    first, second = stopped_then_resumed(e2e, job_name, run_id, "evicted")
    assert "EvictionByEvictionAPI" in first["failure_reason"], first["failure_reason"]
    # The first pod checkpointed on the volume; the second resumed from that record by itself.
    record = json.loads((volume / run_id / "checkpoint.json").read_text(encoding="utf-8"))
    assert record["step"] > 0, record
    assert first["deadline"]["resumed_from"] is None
    assert second["deadline"]["resumed_from"] == f"/soak/checkpoints/{run_id}/checkpoint.json", second[
        "deadline"
    ]
    events = e2e.events(pod["metadata"]["name"])
    assert any("evicted through the Eviction API" in (e.get("message") or "") for e in events), events
    ledger = ledger_of(e2e, run_id)
    drained, resumed = ledger["attempts"]
    assert (drained["attempt"], drained["classification"], resumed["status"]) == (1, "evicted", "passed")
    kinds = [kind for kind, _, _ in drained["phases"]]
    # the pod's way to the trainer's first progress (scheduling, to the second the API stamps, may
    # take none), the work, the checkpoint the soft stop asked for; in order
    assert {"container_start", "launcher", "startup"} <= set(kinds), kinds
    assert kinds == sorted(kinds, key=PHASES.index), kinds
    assert "productive" in kinds and "checkpointing" in kinds, kinds
    assert drained["lost_work_known"], drained  # the trainer checkpointed on the soft stop
    budget = ledger["budget"]
    assert 0 < budget["goodput"] < 1 and budget["badput_s"]["evicted"] > 0, budget
    _, report = verdict(e2e, job_name)
    assert report["goodput"] == pytest.approx(budget["goodput"], abs=1e-4), report
    assert report["ledger"] == f"s3://{S3_BUCKET}/{ledger_key(e2e, run_id)}", report
    size = artifacts_of(e2e, run_id)[ledger_key(e2e, run_id)]["size"]
    for attempt in (drained, resumed):
        spent = ", ".join(f"{kind} {seconds:.1f} s" for kind, _, seconds in attempt["phases"])
        print(f"drained soak: attempt {attempt['attempt']} ({attempt['status']}): {spent}")
    print(f"drained soak: budget {json.dumps(budget)}; ledger.json {size} bytes for 2 attempts")


def test_a_suspended_soak_says_so_and_resumes(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak("suspended", {"trainer": {"args": SHORT_TRAINER, "stopGraceSeconds": 5}})
    pod = wait_running(e2e, job_name)
    e2e.kubectl("patch", "job", job_name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_until("the suspended Job's pod gone", lambda: not e2e.pods(job_name), SOAK_TIMEOUT_S, interval_s=1.0)
    e2e.kubectl("patch", "job", job_name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    first, _ = stopped_then_resumed(e2e, job_name, run_id, "job_suspended")
    assert "the Job was suspended" in first["failure_reason"]
    events = e2e.events(pod["metadata"]["name"])
    assert any("the Job was suspended" in (e.get("message") or "") for e in events), events


def test_a_deleted_job_says_so(e2e: E2ECluster, soak: Any) -> None:
    job_name, run_id = soak("jobdeleted", {"trainer": {"args": LONG_TRAINER, "stopGraceSeconds": 5}})
    pod = wait_running(e2e, job_name)
    e2e.kubectl("delete", "job", job_name, "-n", NAMESPACE, "--wait=true", "--timeout=120s", timeout=180)

    def artifact() -> dict[str, Any] | None:
        found = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
        return found[0] if found else None

    wait_until("the deleted Job's artifact", lambda: artifact() is not None, SOAK_TIMEOUT_S, interval_s=1.0)
    stopped = artifact()
    assert stopped is not None and stopped["failure_classification"] == "job_deleted", stopped
    assert stopped["exit_code"] == ExitCode.CANCELLED
    events = e2e.events(pod["metadata"]["name"])
    assert any("the Job was deleted" in (e.get("message") or "") for e in events), events


def assert_soft_stopped(artifact: dict[str, Any]) -> None:
    """The trainer (the example trainer) was stopped by the soft stop, not by a signal: it caught the
    soft-stop signal, wrote its run_summary and exited 0 of its own accord."""
    launcher_exit = artifact["post_shutdown"]["launcher_exit"] or {}
    assert launcher_exit.get("soft_stop_sent") and launcher_exit.get("soft_stop_signalled"), launcher_exit
    reason = str(launcher_exit.get("soft_stop_reason"))
    assert reason.startswith(("signal: SIGTERM", "control: ")), launcher_exit
    assert (launcher_exit.get("returncode"), launcher_exit.get("term_sent")) == (0, False), launcher_exit
    assert (artifact["run_summary"] or {}).get("status") == "failed", artifact["run_summary"]  # stopped early


EARLY_EXITS: dict[str, tuple[dict[str, Any], ExitCode]] = {
    # Bad settings: refused before anything runs (64).
    "badsettings": (
        {"sidecar": {"extraEnv": [{"name": "SOAK_MONITOR__SAMPLE_INTERVAL_S", "value": "-1"}]}},
        ExitCode.USAGE,
    ),
    # A sidecar pointed at another run dir finds no launcher there and signals none: a launcher is
    # never found by its command line (docs/security.md); that one ends at its --go-timeout
    # (tests/integration/test_pod_early_exit.py::test_no_run_dir_no_launcher_found_by_its_command_line).
}


EARLY_REASONS = {
    "badsettings": "soak-sidecar: error: invalid settings",
    "storedown": "cannot probe the S3 store",  # a verdict of its own (transient_infra)
}


@pytest.mark.parametrize("release", [*EARLY_EXITS, "storedown"])
def test_early_sidecar_exit_ends_the_pod(e2e: E2ECluster, soak: Any, release: str) -> None:
    values: dict[str, Any]
    if release == "storedown":
        values, expected = {"s3": {"endpointUrl": e2e.closed_port_endpoint}}, ExitCode.TRANSIENT_INFRA
    else:
        values, expected = EARLY_EXITS[release]
    job_name, _ = soak(release, {"trainer": {"args": LONG_TRAINER}, "job": {"backoffLimit": 0}, **values})
    condition, _job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed"
    (pod,) = e2e.pods(job_name)
    assert pod["status"]["phase"] == "Failed"
    assert sidecar_exit(pod) == expected, e2e.logs(pod["metadata"]["name"], "soak-sidecar")
    trainer_log = e2e.logs(pod["metadata"]["name"], "trainer")
    assert "step" not in trainer_log.lower() or "not starting" in trainer_log, trainer_log
    assert terminated(pod, "trainer")["exitCode"] in (int(expected), 128 + 15), container(pod, "trainer")
    assert pod_lifetime_s(pod) < EARLY_EXIT_BOUND_S, pod_lifetime_s(pod)
    # Why, in the pod status and so in soak-sidecar verdict.
    _, report = verdict(e2e, job_name)
    assert EARLY_REASONS[release] in report["attempts"][-1]["reason"], report


# Trainer code probing the boundary from inside the trainer container, then the example trainer.
PROBE = """
import json, os, sys
import boto3, botocore
from botocore import UNSIGNED
from botocore.config import Config

def find_sidecar():
    for entry in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if argv[:3] == [b"/opt/venv/bin/python3", b"/opt/venv/bin/soak-sidecar", b"run"]:
            return int(entry)
        if any(a.endswith(b"/soak-sidecar") for a in argv[:2]) and b"run" in argv:
            return int(entry)
    return None

def uid_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[1])

found = {}
def attempt(name, action):
    try:
        action()
        found[name] = "allowed"
    except PermissionError:
        found[name] = "denied"
    except botocore.exceptions.ClientError as exc:
        found[name] = "denied" if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403 else repr(exc)
    except Exception as exc:
        found[name] = repr(exc)

sidecar = find_sidecar()
found.update(sidecar_pid=sidecar, sidecar_uid=uid_of(sidecar), trainer_uid=os.getuid())
root = f"/proc/{sidecar}/root"
attempt("environ", lambda: open(f"/proc/{sidecar}/environ", "rb").read())
attempt("token", lambda: open(root + "/var/run/secrets/kubernetes.io/serviceaccount/token").read())
attempt("s3_secret", lambda: open(root + "/soak/credentials/s3/secret-access-key").read())
attempt("memory", lambda: open(f"/proc/{sidecar}/mem", "rb").read(1))
attempt("signal", lambda: os.kill(sidecar, 0))
endpoint, bucket = os.environ["PROBE_S3_ENDPOINT"], os.environ["PROBE_S3_BUCKET"]
record = "soak-deadlines/" + os.environ["SOAK_RUN_ID"] + ".json"
guessed = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="AKIAGUESSEDGUESSED12", aws_secret_access_key="guessed")
attempt("s3_guessed_delete", lambda: guessed.delete_object(Bucket=bucket, Key=record))
anonymous = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                         config=Config(signature_version=UNSIGNED))
attempt("s3_anonymous_delete", lambda: anonymous.delete_object(Bucket=bucket, Key=record))
print("SOAK-PROBE " + json.dumps(found), flush=True)
os.execvp(sys.executable, [sys.executable, "-m", "sidecar.examples.trainer", *sys.argv[1:]])
"""


def test_the_trainer_cannot_reach_the_sidecars_secrets(e2e: E2ECluster, soak: Any) -> None:
    """Separate UIDs on a real kubelet: trainer code finds the sidecar in the shared PID namespace
    and is refused its environment, its token and S3 credentials (through /proc/<pid>/root), its
    memory and signals; S3 refuses guessed and anonymous deletes of the deadline record. The soak
    still passes, with the trainer's fd tables reported by the launcher."""
    endpoint = e2e.s3_values.get("s3", {}).get("endpointUrl") or "http://seaweedfs-s3:8333"
    values = {
        "trainer": {
            "command": ["python3", "-c", PROBE],
            "args": ["--steps", "12", "--step-s", "0.5"],
            "env": [
                {"name": "PROBE_S3_ENDPOINT", "value": endpoint},
                {"name": "PROBE_S3_BUCKET", "value": "soak-e2e"},
            ],
        }
    }
    job_name, run_id = soak("boundary", values)
    condition, _ = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    (pod,) = e2e.pods(job_name)
    name = pod["metadata"]["name"]
    trainer_log = e2e.logs(name, "trainer")
    assert condition == "Complete", (trainer_log[-2000:], e2e.logs(name, "soak-sidecar")[-3000:])
    (line,) = [line for line in trainer_log.splitlines() if line.startswith("SOAK-PROBE ")]
    probe = json.loads(line.removeprefix("SOAK-PROBE "))
    assert probe["sidecar_pid"], probe
    assert (probe["trainer_uid"], probe["sidecar_uid"]) == (10001, 10002), probe
    for what in (
        "environ",
        "token",
        "s3_secret",
        "memory",
        "signal",
        "s3_guessed_delete",
        "s3_anonymous_delete",
    ):
        assert probe[what] == "denied", (what, probe)
    (artifact,) = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    assert artifact["status"] == "passed", artifact["failure_reason"]
    # fd tables of a tree under another UID came from the launcher's reports.
    assert artifact["resource_summary"]["max_fd_count"] > 0, artifact["resource_summary"]
    assert_token_confined_to_its_pod(e2e, job_name, name)


def token_kubeconfig(e2e: E2ECluster, token: str) -> Path:
    """A kubeconfig for this cluster that authenticates with ``token`` alone (no client certificate,
    which would win over a token)."""
    config = json.loads(e2e.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    path = Path(tempfile.mkdtemp(prefix="soak-token-")) / "kubeconfig"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def assert_token_confined_to_its_pod(e2e: E2ECluster, job_name: str, pod: str) -> None:
    """The chart's ValidatingAdmissionPolicy on the real apiserver: a token bound to the soak's pod
    (what the kubelet projects into the sidecar) annotates that pod and nothing else."""
    account = e2e.get_json("job", job_name, "-n", NAMESPACE)["spec"]["template"]["spec"]["serviceAccountName"]
    token = e2e.kubectl(
        "create", "token", account, "-n", NAMESPACE, "--bound-object-kind", "Pod", "--bound-object-name", pod
    ).stdout.strip()
    other: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{pod[:40]}-other", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "soak-sidecar:e2e", "command": ["true"]}]},
    }
    e2e.kubectl("create", "-f", "-", stdin=json.dumps(other))
    try:
        as_sidecar = [
            "--kubeconfig",
            str(token_kubeconfig(e2e, token)),
            "-n",
            NAMESPACE,
            "--type=merge",
            "-p",
        ]
        own = json.dumps({"metadata": {"annotations": {f"{PREFIX}probe": "ok"}}})
        assert e2e.kubectl("patch", "pod", pod, *as_sidecar, own, check=False).returncode == 0
        for target, body in [
            (other["metadata"]["name"], own),
            (pod, json.dumps({"metadata": {"labels": {"evil": "yes"}}})),
        ]:
            denied = e2e.kubectl("patch", "pod", target, *as_sidecar, body, check=False)
            assert denied.returncode != 0 and "soak-sidecar service account may" in denied.stderr, (
                denied.stderr
            )
    finally:
        e2e.kubectl("delete", "pod", other["metadata"]["name"], "-n", NAMESPACE, "--wait=false", check=False)


def test_one_index_failing_fails_a_multi_pod_soak_and_stops_the_other(e2e: E2ECluster, soak: Any) -> None:
    """An Indexed Job of two pods sharing one deadline: index 1's trainer crashes, a permanent
    verdict; the podFailurePolicy fails the whole Job and its controller stops index 0, whose
    verdict says why. Both artifacts reach S3; the job verdict names both indexes."""
    # One command for both indexes (it is the run's identity); index 1 crashes early.
    by_rank = (
        'exec python3 -m sidecar.examples.trainer $([ "$NODE_RANK" = 1 ] '
        '&& echo "--steps 6 --step-s 0.3 --crash" || echo "--steps 400 --step-s 0.5")'
    )
    job_name, run_id = soak(
        "indexed",
        {"trainer": {"command": ["sh", "-c", by_rank]}, "job": {"completions": 2, "backoffLimitPerIndex": 1}},
    )
    started = time.monotonic()
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed", job.get("status")
    # The failed index's pod stays; the one the Job controller stopped may be deleted already.
    pods = {index_of(pod): pod for pod in e2e.pods(job_name)}
    failed = pods[1]
    assert sidecar_exit(failed) == ExitCode.TRAINER_FAILED and ours(failed)["index"] == "1"
    if 0 in pods:
        assert ours(pods[0])["classification"] == "job_failed", ours(pods[0])
    assert time.monotonic() - started < 120, "the Job failed within a minute or two of the crash"
    # Both artifacts are in S3, one deadline for the soak; the stopped index's says why.
    artifacts = {
        o["json"]["context"]["index"]: o["json"]
        for k, o in artifacts_of(e2e, run_id).items()
        if k.endswith("/artifact.json")
    }
    assert sorted(artifacts) == [0, 1]
    assert len({a["deadline"]["started_unix"] for a in artifacts.values()}) == 1
    stopped = artifacts[0]
    assert (stopped["failure_classification"], stopped["exit_code"]) == ("job_failed", ExitCode.CANCELLED)
    assert "the Job failed, so this pod was stopped" in stopped["failure_reason"], stopped["failure_reason"]
    assert_soft_stopped(stopped)  # it kept its evidence: a checkpoint and its run_summary
    code, report = verdict(e2e, job_name)
    assert code != 0 and report["passed"] is False
    # Index 0's row stays even once the Job controller has deleted its pod (its verdict Event).
    rows = {a["index"]: a for a in report["attempts"]}
    assert sorted(rows) == [0, 1] and rows[0]["classification"] == "job_failed", report["attempts"]
    assert "index 1 attempt 1 did not pass" in report["reason"] and "the Job is Failed" in report["reason"]


def test_a_slow_index_is_named_by_the_verdict_the_ledger_and_its_own_artifact(
    e2e: E2ECluster, soak: Any
) -> None:
    """Two indexes of one soak, each its own trainer; index 1's steps take 30 % longer. Each pod
    annotates its rate while it runs and its mean rate with its verdict, the ledger keeps them, and
    `soak-sidecar verdict` names index 1 with its node and its rate against the other's. Index 1
    ends last, so its own artifact, compared with the ledger as it ends, says it was the slow one."""
    by_rank = (
        'exec python3 -m sidecar.examples.trainer --steps 60 --step-s $([ "$NODE_RANK" = 1 ] '
        "&& echo 0.39 || echo 0.3)"
    )
    job_name, run_id = soak(
        "slowindex",
        {
            "trainer": {"command": ["sh", "-c", by_rank]},
            "job": {"completions": 2, "backoffLimitPerIndex": 0},
            "kube": {"progressAnnotationSeconds": 2},
        },
    )

    def both_annotate_a_finish() -> bool:
        return len([p for p in e2e.pods(job_name) if ours(p).get("eta")]) == 2

    wait_until("both indexes annotating their rate and finish", both_annotate_a_finish, SOAK_TIMEOUT_S)
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Complete", job.get("status")
    code, report = verdict(e2e, job_name)
    assert code == 0 and report["passed"] is True, report
    (slow,) = report["slow_indexes"]
    assert slow["index"] == 1 and slow["node"] and 0.6 < slow["ratio"] < 0.85, slow
    print(f"slow index as soak-sidecar verdict names it: {slow}")  # the figure, shown with -rP
    rows = {a["index"]: a for a in report["attempts"]}
    assert 0 < rows[1]["steps_per_s"] < rows[0]["steps_per_s"], report["attempts"]
    artifacts = {
        o["json"]["context"]["index"]: o["json"]
        for k, o in artifacts_of(e2e, run_id).items()
        if k.endswith("/artifact.json")
    }
    assert artifacts[0]["resource_summary"]["progress"]["slow_index"] is None
    said = artifacts[1]["resource_summary"]["progress"]["slow_index"]
    assert said.startswith(f"index 1 on node {slow['node']} ran at "), said
    rates = {a["index"]: a["steps_per_s"] for a in ledger_of(e2e, run_id)["attempts"]}
    assert rates[1] < rates[0], rates


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def kill_sidecar(e2e: E2ECluster, pod: str) -> None:
    e2e.kubectl(
        "exec", pod, "-n", NAMESPACE, "-c", "soak-sidecar", "--", "python3", "-c",
        "import os, signal\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if open(f'/proc/{pid}/cmdline', 'rb').read().endswith(b'soak-sidecar\\0run\\0--pod\\0'):\n"
        "        os.kill(int(pid), signal.SIGKILL)\n",
    )  # fmt: skip


def test_one_index_is_retried_alone_on_the_same_deadline(e2e: E2ECluster, soak: Any) -> None:
    """Index 1 loses its sidecar (no verdict: counted against its own backoffLimitPerIndex); only
    index 1 gets a new pod, which resumes the soak's one deadline as that index's attempt 2. Both
    indexes then pass and the Job is Complete: the job verdict passes."""
    job_name, run_id = soak(
        "retryindex",
        {
            "trainer": {"args": ["--steps", "50", "--step-s", "0.5"]},
            # backoffLimit bounds the whole Job even with per-index limits (kind-values sets 0).
            "job": {"completions": 2, "backoffLimitPerIndex": 1, "backoffLimit": 3},
            "sidecar": {"extraEnv": [{"name": "SOAK_LAUNCHER__HEARTBEAT_TIMEOUT_S", "value": "5"}]},
        },
    )
    found: dict[str, str] = {}

    def index_1_sampling() -> bool:
        pods = [p for p in e2e.pods(job_name) if index_of(p) == 1 and p["status"].get("phase") == "Running"]
        if pods:
            found["pod"] = pods[0]["metadata"]["name"]
        return bool(pods) and '"event": "sample"' in e2e.logs(found["pod"], "soak-sidecar")

    wait_until("index 1 sampling", index_1_sampling, SOAK_TIMEOUT_S, interval_s=1.0)
    kill_sidecar(e2e, found["pod"])
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Complete", job.get("status")
    pods = sorted(e2e.pods(job_name), key=lambda p: (index_of(p), p["metadata"]["creationTimestamp"]))
    assert [index_of(p) for p in pods] == [0, 1, 1]  # index 0 never restarted
    assert sidecar_exit(pods[1]) == 128 + 9 and sidecar_exit(pods[0]) == sidecar_exit(pods[2]) == 0
    assert (ours(pods[0])["attempt"], ours(pods[2])["attempt"]) == ("1", "2")  # numbered per index
    assert ours(pods[0])["deadline"] == ours(pods[2])["deadline"]  # one deadline, never a fresh one
    artifacts = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    assert len({a["deadline"]["started_unix"] for a in artifacts}) == 1
    code, report = verdict(e2e, job_name)
    assert code == 0 and report["passed"] is True, report
    assert [(a["index"], a["attempt"]) for a in report["attempts"]] == [(0, 1), (1, 1), (1, 2)]
    # One time line for both indexes: index 1's first attempt, without a verdict, as its second found it.
    ledger = ledger_of(e2e, run_id)
    assert [(a["index"], a["attempt"], a["status"]) for a in ledger["attempts"]] == [
        (0, 1, "passed"),
        (1, 1, "lost"),
        (1, 2, "passed"),
    ], ledger["attempts"]
    assert 0 < ledger["budget"]["goodput"] < 1 and ledger["budget"]["badput_s"]["ended without a verdict"] > 0


# The torch of the trainer venv (.ci/run), mounted read-only into the trainer container; the image's
# Python must be the venv's minor version for its wheels to load.
TORCH_MOUNT = "/opt/soak-torch"
TRAINERS_MOUNT = "/opt/soak-trainers"


def host_torch() -> Path:
    """site-packages of the trainer venv holding torch (the test is skipped or fails without it)."""
    probe = (
        "import pathlib, sys, torch\n"
        "print('%d.%d' % sys.version_info[:2], pathlib.Path(torch.__file__).parents[1])"
    )
    version, site = subprocess.run(
        [str(require("trainer-venv")), "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    if version != images.BASE_PYTHON:
        absent("trainer-venv", f"the trainer venv is Python {version}, the image's is {images.BASE_PYTHON}")
    return Path(site)


def test_two_pods_form_one_torch_ddp_group_and_pass(e2e: E2ECluster, soak: Any) -> None:
    """Two indexes, one torchrun node each: their ranks rendezvous through the headless Service
    (index 0's stable name, resolved by cluster DNS) into one gloo DDP group of world size 2, train
    and pass. Each index's sidecar validates its own node's run_summary; the job verdict passes."""
    if not e2e.host_paths:
        pytest.skip("torch is mounted from this host's trainer venv, which this cluster's node cannot see")
    torch_site, trainer_dir = host_torch(), trainers.TRAINERS_DIR
    for path in (torch_site, trainer_dir):
        assert any(path.is_relative_to(root) for root in e2e.host_paths), (
            f"{path} is not mounted into the node"
        )
    job_name, run_id = soak(
        "ddp",
        {
            "trainer": {
                "command": [
                    "python3", "-m", "torch.distributed.run", "--nproc_per_node=1",
                    f"{TRAINERS_MOUNT}/ddp_trainer.py",
                ],
                "args": ["--steps", "30", "--step-s", "0.2"],
                "env": [
                    {"name": "PYTHONPATH", "value": TORCH_MOUNT},
                    {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
                ],
                "volumeMounts": [
                    {"name": "torch", "mountPath": TORCH_MOUNT, "readOnly": True},
                    {"name": "trainers", "mountPath": TRAINERS_MOUNT, "readOnly": True},
                ],
            },
            "pod": {
                "volumes": [
                    {"name": "torch", "hostPath": {"path": str(torch_site), "type": "Directory"}},
                    {"name": "trainers", "hostPath": {"path": str(trainer_dir), "type": "Directory"}},
                ]
            },
            "job": {"completions": 2, "backoffLimitPerIndex": 0},
            "monitor": {"startupTimeoutSeconds": 180},
        },
    )  # fmt: skip
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    pods = {index_of(pod): pod for pod in e2e.pods(job_name)}
    logs = {index: e2e.logs(pod["metadata"]["name"], "trainer") for index, pod in pods.items()}
    assert condition == "Complete", (job.get("status"), logs)
    assert sorted(pods) == [0, 1] and all(sidecar_exit(pod) == 0 for pod in pods.values())
    # One process group across the two pods: rank 0 in index 0's pod, rank 1 in index 1's.
    assert f"rank 0 of 2 on {job_name}-0" in logs[0], logs[0]
    assert f"rank 1 of 2 on {job_name}-1" in logs[1], logs[1]
    artifacts = {
        o["json"]["context"]["index"]: o["json"]
        for k, o in artifacts_of(e2e, run_id).items()
        if k.endswith("/artifact.json")
    }
    assert sorted(artifacts) == [0, 1]
    for artifact in artifacts.values():
        assert (artifact["status"], artifact["run_summary"]["status"]) == ("passed", "completed")
    assert len({a["deadline"]["started_unix"] for a in artifacts.values()}) == 1
    code, report = verdict(e2e, job_name)
    assert code == 0 and report["passed"] is True, report


def test_a_retryable_verdict_retries_only_that_index_on_the_same_deadline(e2e: E2ECluster, soak: Any) -> None:
    """Index 1's GPU is lost (the mock's devices_by_index): gpu_fault (150), retryable, so only index
    1 gets a new pod, attempt 2 on the same deadline. It loses its GPU again and exhausts its
    backoffLimitPerIndex: the Job fails, index 0 (never restarted) is stopped as job_failed."""
    device = {
        "uuid": "GPU-00000000-0000-4000-8000-0000000000e3",
        "memory_used_mib": 2048,
        "processes": [{"pid": "~sidecar.examples.trainer", "used_memory_mib": 1000}],
    }
    scenario = {"devices": [device], "devices_by_index": {"1": [{**device, "lost_at": GPU_LOST_AT_S}]}}
    job_name, run_id = soak(
        "indexgpu",
        {
            "trainer": {"args": LONG_TRAINER, "stopGraceSeconds": 10},
            "job": {"completions": 2, "backoffLimitPerIndex": 1, "backoffLimit": 3},
            "gpu": {"mock": {"scenario": scenario}},
        },
    )
    condition, job = e2e.wait_job_finished(job_name, SOAK_TIMEOUT_S)
    assert condition == "Failed", job.get("status")
    pods = sorted(e2e.pods(job_name), key=lambda p: (index_of(p), p["metadata"]["creationTimestamp"]))
    by_index = [(index_of(p), ours(p).get("attempt")) for p in pods if ours(p).get("attempt")]
    assert [index for index, _ in by_index].count(0) <= 1, by_index  # index 0 never restarted
    retried = [p for p in pods if index_of(p) == 1]
    assert [ours(p)["attempt"] for p in retried] == ["1", "2"]
    assert [sidecar_exit(p) for p in retried] == [ExitCode.GPU_FAULT] * 2
    assert {ours(p)["classification"] for p in retried} == {"gpu_fault"}
    artifacts = [o["json"] for k, o in artifacts_of(e2e, run_id).items() if k.endswith("/artifact.json")]
    assert sorted((a["context"]["index"], a["failure_classification"]) for a in artifacts) == [
        (0, "job_failed"),
        (1, "gpu_fault"),
        (1, "gpu_fault"),
    ]
    assert len({a["deadline"]["started_unix"] for a in artifacts}) == 1  # one deadline, never a fresh one
    code, report = verdict(e2e, job_name)
    assert code != 0 and report["passed"] is False
    assert "index 1 attempt 2 did not pass" in report["reason"], report["reason"]
