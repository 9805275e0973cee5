"""The Kubernetes side against a real kube-apiserver + etcd (RBAC on, no kubelet).

The sidecar acts with a TokenRequest token of a ServiceAccount bound to the least-privilege Role
of docs/rbac.md; the admin token only sets the scene (namespaces, pods, pod status emulating the
kubelet) and inspects the result.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sidecar import cli
from sidecar.adapters.kube import reads
from sidecar.adapters.kube.client import KubeClient
from sidecar.adapters.kube.clock import ApiserverClock
from sidecar.adapters.kube.connection import connect
from sidecar.adapters.kube.publisher import PodPublisher, create_event, patch_annotations
from sidecar.adapters.kube.reads import get_pod, read_job, wait_for_trainer_digest
from sidecar.core.errors import ConfigError, ForbiddenError, TransientError
from sidecar.core.job_pods import COMPLETION_INDEX_ANNOTATION, end_condition
from sidecar.core.publication import (
    MAX_TERMINATION_MESSAGE_BYTES,
    REASON_BYTES,
    Publication,
    build_annotations,
    parse_termination_message,
    termination_message,
)
from sidecar.settings import load_settings
from tests.fixtures.kube import (
    DIGEST,
    MERGE,
    PREFIX,
    KubeEnv,
    container_status,
    create_job,
    create_pod,
    ours,
    running_status,
    set_status,
    terminated,
)

pytestmark = [pytest.mark.integration, pytest.mark.kube]


@pytest.fixture(scope="module")
def env(kube_env: KubeEnv) -> KubeEnv:
    return kube_env


def verdict(**overrides: Any) -> Publication:
    fields: dict[str, Any] = {
        "status": "failed",
        "classification": "stale_progress",
        "reason": "no progress for 120 s",
        "exit_code": 12,
        "artifact_uri": "s3://soak/ns/job/run/1-pod/artifact.json",
        "artifact_sha256": "ab" * 32,
        "attempt": 1,
        "deadline_unix": 1_900_000_000.0,
    }
    fields.update(overrides)
    return Publication(**fields)


def test_identity_with_the_service_account_token(env: KubeEnv) -> None:
    with env.sa_client() as client:
        identity = get_pod(client, env.namespace, "soak-train-abcde")
    assert identity.trainer_image_digest == DIGEST
    assert identity.trainer_image == "registry.example/trainer:1"
    assert (identity.job_name, identity.job_uid) == (env.job_name, env.job_uid)
    assert identity.namespace == env.namespace


def test_publish_annotations_event_and_termination_message(env: KubeEnv, tmp_path: Path) -> None:
    pod = create_pod(env.core, env.namespace, "soak-train-publ1", env.job_name, env.job_uid)
    log = tmp_path / "termination-log"
    with env.sa_client() as client:
        publisher = PodPublisher(
            client,
            namespace=env.namespace,
            pod_name=pod.metadata.name,
            pod_uid=pod.metadata.uid,
            prefix=PREFIX,
            termination_log=log,
            container="soak-sidecar",
        )
        first = publisher.publish(verdict())
        # A restarted sidecar publishing again: absent fields are deleted, not left stale.
        second = publisher.publish(verdict(artifact_uri=None, artifact_sha256=None, reason="again"))
    assert not first.errors and not second.errors, (first.errors, second.errors)
    stored = env.core.read_namespaced_pod(pod.metadata.name, env.namespace).metadata.annotations
    assert stored["team.example/owner"] == "ml-infra"  # merge patch leaves others alone
    expected = build_annotations(verdict(artifact_uri=None, artifact_sha256=None, reason="again"))
    assert ours(stored) == {k: v for k, v in expected.items() if v is not None}
    assert f"{PREFIX}artifact" not in stored
    events = env.core.list_namespaced_event(
        env.namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}"
    ).items
    assert len(events) == 2
    event = events[0]
    assert (event.reason, event.type, event.source.component) == ("SoakFailed", "Warning", "soak-sidecar")
    assert event.involved_object.field_path == "spec.containers{soak-sidecar}"
    assert event.message.startswith("soak failed (exit 12, stale_progress) attempt 1")
    back = parse_termination_message(log.read_text(encoding="utf-8"))
    assert back is not None and back.reason == "again"


def test_rbac_denies_another_namespace(env: KubeEnv) -> None:
    foreign = create_pod(env.core, env.other_namespace, "victim", None, None)
    with env.sa_client() as client:
        with pytest.raises(ForbiddenError, match="forbidden"):
            patch_annotations(client, env.other_namespace, "victim", {f"{PREFIX}verdict": "passed"})
        with pytest.raises(ForbiddenError):
            get_pod(client, env.other_namespace, "victim")
        with pytest.raises(ForbiddenError):
            create_event(
                client, env.other_namespace, "victim", foreign.metadata.uid, reason="SoakPassed", message="x"
            )
    stored = env.core.read_namespaced_pod("victim", env.other_namespace).metadata.annotations
    assert ours(stored) == {}


def test_hostile_reason_never_makes_an_invalid_patch(env: KubeEnv) -> None:
    pod = create_pod(env.core, env.namespace, "soak-train-hostile", env.job_name, env.job_uid)
    hostile = (b"\xff\xfe\x00\x07\x1b]0;pwned\x07\r\n\xed\xa0\x80" + "é😀".encode()) * 300_000
    assert len(hostile) > 5_000_000
    bad_classification = "x\x00y" * 1000 + "\ud800"
    with env.sa_client() as client:
        publisher = PodPublisher(
            client,
            namespace=env.namespace,
            pod_name=pod.metadata.name,
            pod_uid=pod.metadata.uid,
            prefix=PREFIX,
            termination_log=None,
        )
        outcome = publisher.publish(verdict(reason=hostile, classification=bad_classification))
    assert not outcome.errors, outcome.errors
    stored = ours(env.core.read_namespaced_pod(pod.metadata.name, env.namespace).metadata.annotations)
    assert len(stored[f"{PREFIX}reason"].encode()) <= REASON_BYTES
    assert sum(len(k.encode()) + len(v.encode()) for k, v in stored.items()) <= 4096
    assert stored == {
        k: v
        for k, v in build_annotations(verdict(reason=hostile, classification=bad_classification)).items()
        if v
    }
    assert len(termination_message(verdict(reason=hostile)).encode()) <= MAX_TERMINATION_MESSAGE_BYTES


def test_the_api_really_rejects_oversized_annotations(env: KubeEnv) -> None:
    # Why sanitising matters: the same reason, unbounded, is refused outright.
    with pytest.raises(ApiException) as info:
        env.core.patch_namespaced_pod(
            "soak-train-abcde",
            env.namespace,
            {"metadata": {"annotations": {f"{PREFIX}reason": "x" * 300_000}}},
            _content_type=MERGE,
        )
    assert info.value.status == 422


def test_progress_annotations(env: KubeEnv) -> None:
    pod = create_pod(env.core, env.namespace, "soak-train-progress", env.job_name, env.job_uid)
    with env.sa_client() as client:
        publisher = PodPublisher(
            client,
            namespace=env.namespace,
            pod_name=pod.metadata.name,
            pod_uid=pod.metadata.uid,
            prefix=PREFIX,
            termination_log=None,
            progress_interval_s=60.0,
        )
        assert publisher.progress("running", 1_800_000_000.0, 100.0)
        assert not publisher.progress("running", 1_800_000_005.0, 105.0)
    stored = ours(env.core.read_namespaced_pod(pod.metadata.name, env.namespace).metadata.annotations)
    assert stored == {f"{PREFIX}phase": "running", f"{PREFIX}heartbeat": "1800000000"}


# ---------------------------------------------------------------- soak-sidecar verdict


def new_job(env: KubeEnv) -> tuple[str, str]:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    return name, create_job(env.server.api_client(), env.namespace, name)


def published_pod(
    env: KubeEnv,
    job: tuple[str, str],
    name: str,
    pub: Publication,
    *,
    kubelet_exit: int | str | None = "same",
) -> None:
    """A pod that published ``pub``; the kubelet (played here) recorded the sidecar's exit as the
    published one unless ``kubelet_exit`` says otherwise (None: not terminated yet)."""
    pod = create_pod(env.core, env.namespace, name, *job)
    code = pub.exit_code if kubelet_exit == "same" else kubelet_exit
    if isinstance(code, int):
        sidecar = container_status("soak-sidecar", terminated(code, "Completed" if code == 0 else "Error"))
        status = {"phase": "Failed" if code else "Succeeded", "containerStatuses": [sidecar]}
        set_status(env.core, env.namespace, name, status)
    with env.sa_client() as client:
        outcome = PodPublisher(
            client,
            namespace=env.namespace,
            pod_name=name,
            pod_uid=pod.metadata.uid,
            prefix=PREFIX,
            termination_log=None,
        ).publish(pub)
    assert not outcome.errors, outcome.errors


def run_cli(env: KubeEnv, job: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = cli.main(["verdict", job, "-n", env.namespace, "--kubeconfig", str(env.admin_kubeconfig), *extra])
    return code, capsys.readouterr().out


def run_json(env: KubeEnv, job: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out = run_cli(env, job, capsys, "-o", "json")
    return code, json.loads(out)


def replace_attempt(pub: Publication, attempt: int) -> Publication:
    return replace(pub, attempt=attempt)


PASSED = verdict(status="passed", classification=None, reason="", exit_code=0)
DEADLINE = verdict(classification="deadline_exhausted", reason="total job deadline expired", exit_code=14)


def test_verdict_cli_latest_passed(env: KubeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    job = new_job(env)
    published_pod(env, job, f"{job[0]}-aaaaa", verdict(attempt=1))
    published_pod(env, job, f"{job[0]}-bbbbb", replace_attempt(PASSED, 2))
    code, table = run_cli(env, job[0], capsys)
    assert code == 0
    lines = table.splitlines()
    assert lines[0].split() == [
        "ATTEMPT",
        "POD",
        "PHASE",
        "VERDICT",
        "CLASSIFICATION",
        "EXIT",
        "REASON",
        "ARTIFACT",
    ]
    assert lines[1].split()[:6] == ["1", f"{job[0]}-aaaaa", "Failed", "failed", "stale_progress", "12"]
    assert lines[2].split()[:6] == ["2", f"{job[0]}-bbbbb", "Succeeded", "passed", "-", "0"]
    print(table)


def test_verdict_cli_shows_a_pod_already_gone_from_its_verdict_event(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Job controller deletes the pods it stops when a Job fails: each sidecar's verdict Event
    carries the verdict as annotations, so the attempt still has its row (never counted as passed)."""
    job = new_job(env)
    gone = f"{job[0]}-0-aaaaa"
    stopped = verdict(classification="job_failed", reason="the Job failed", exit_code=17, index=0, indexes=2)
    published_pod(env, job, gone, stopped)
    failed = verdict(exit_code=10, classification="trainer_failure", index=1, indexes=2)
    published_pod(env, job, f"{job[0]}-1-bbbbb", failed)
    index = {"metadata": {"annotations": {COMPLETION_INDEX_ANNOTATION: "1"}}}
    env.core.patch_namespaced_pod(f"{job[0]}-1-bbbbb", env.namespace, index)
    env.core.delete_namespaced_pod(gone, env.namespace, grace_period_seconds=0)
    code, report = run_json(env, job[0], capsys)
    assert code == 1
    rows = [(a["index"], a["pod"], a["phase"], a["classification"], a["source"]) for a in report["attempts"]]
    assert rows == [
        (0, gone, "Gone", "job_failed", "event"),
        (1, f"{job[0]}-1-bbbbb", "Failed", "trainer_failure", "annotations"),
    ]
    assert "the pod is gone" in report["attempts"][0]["reason"]
    assert "index 0 attempt 1 did not pass" in report["reason"]


def test_verdict_cli_trusts_the_kubelet_over_the_annotations(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    job = new_job(env)
    # The pod says it passed; the kubelet recorded the sidecar's exit 13 (resource_leak).
    published_pod(env, job, f"{job[0]}-aaaaa", replace_attempt(PASSED, 1), kubelet_exit=13)
    code, doc = run_json(env, job[0], capsys)
    assert code == 1 and doc["passed"] is False
    row = doc["attempts"][-1]
    assert (row["verdict"], row["sidecar_exit_code"]) == ("mismatch", 13)
    assert row["reason"] == (
        "the pod's annotations say passed (exit 0) but the kubelet recorded exit 13 for soak-sidecar: "
        "not trusted"
    )


def test_verdict_cli_waits_for_the_kubelet_to_confirm_a_pass(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    job = new_job(env)
    published_pod(env, job, f"{job[0]}-aaaaa", replace_attempt(PASSED, 1), kubelet_exit=None)
    code, doc = run_json(env, job[0], capsys)
    assert code == 1 and doc["passed"] is False
    reason = doc["attempts"][-1]["reason"]
    assert reason.endswith("not confirmed yet: the kubelet has recorded no exit for soak-sidecar")


def test_verdict_cli_shows_no_terminal_escapes_in_any_column(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    job = new_job(env)
    name = f"{job[0]}-aaaaa"
    published_pod(env, job, name, replace_attempt(DEADLINE, 1))
    # Annotations as anyone able to patch the pod could write them.
    escapes = {"verdict": "failed\x1b[2J", "classification": "x\x1b]0;pwned\x07", "artifact": "s3://b/\x9bk"}
    annotations = {f"{PREFIX}{key}": value for key, value in escapes.items()}
    patch = {"metadata": {"annotations": annotations}}
    env.core.patch_namespaced_pod(name, env.namespace, patch, _content_type=MERGE)
    _code, table = run_cli(env, job[0], capsys)
    assert not any(char in table for char in "\x1b\x07\x9b"), table


def test_verdict_cli_deadline_exhausted(env: KubeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    job = new_job(env)
    published_pod(env, job, f"{job[0]}-aaaaa", replace_attempt(PASSED, 1))
    published_pod(env, job, f"{job[0]}-bbbbb", replace_attempt(DEADLINE, 2))
    code, doc = run_json(env, job[0], capsys)
    assert code == 1 and doc["passed"] is False
    last = doc["attempts"][-1]
    assert (last["verdict"], last["classification"], last["exit_code"]) == (
        "failed",
        "deadline_exhausted",
        14,
    )
    assert last["source"] == "annotations"


def test_verdict_cli_pods_without_a_verdict(env: KubeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    job = new_job(env)
    published_pod(env, job, f"{job[0]}-a-passed", replace_attempt(PASSED, 1))
    evicted = f"{job[0]}-b-evicted"
    create_pod(env.core, env.namespace, evicted, *job)
    set_status(
        env.core,
        env.namespace,
        evicted,
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    )
    crashed = f"{job[0]}-c-crashed"
    create_pod(env.core, env.namespace, crashed, *job)
    set_status(
        env.core,
        env.namespace,
        crashed,
        {
            "phase": "Running",
            "containerStatuses": [
                container_status("trainer", {"running": {"startedAt": "2025-01-01T00:00:00Z"}}),
                container_status("soak-sidecar", terminated(137, "OOMKilled")),
            ],
        },
    )
    # The API was down when this one finished: only the termination message carries the verdict.
    offline = f"{job[0]}-d-offline"
    create_pod(env.core, env.namespace, offline, *job)
    set_status(
        env.core,
        env.namespace,
        offline,
        {
            "phase": "Failed",
            "containerStatuses": [
                container_status("trainer", terminated(1, "Error")),
                container_status(
                    "soak-sidecar",
                    terminated(
                        10,
                        "Error",
                        termination_message(
                            replace_attempt(
                                verdict(
                                    classification="trainer_failed", reason="trainer exited 1", exit_code=10
                                ),
                                4,
                            )
                        ),
                    ),
                ),
            ],
        },
    )
    running = f"{job[0]}-e-running"
    create_pod(env.core, env.namespace, running, *job)
    set_status(env.core, env.namespace, running, running_status())

    code, doc = run_json(env, job[0], capsys)
    assert code == 1
    assert [(r["attempt"], r["pod"]) for r in doc["attempts"]] == [
        (1, f"{job[0]}-a-passed"),
        (2, evicted),
        (3, crashed),
        (4, offline),
        (5, running),
    ]
    by_pod = {row["pod"]: row for row in doc["attempts"]}
    assert by_pod[evicted]["verdict"] is None
    assert by_pod[evicted]["reason"] == "evicted: The node was low on resource: memory."
    assert by_pod[crashed]["reason"] == (
        "sidecar container terminated without a verdict (exit 137, OOMKilled)"
    )
    assert (by_pod[offline]["verdict"], by_pod[offline]["exit_code"], by_pod[offline]["source"]) == (
        "failed",
        10,
        "termination-message",
    )
    assert by_pod[offline]["attempt"] == 4
    assert by_pod[running]["reason"] == "still running"
    assert doc["attempts"][-1]["pod"] == running

    code, table = run_cli(env, job[0], capsys)
    *_, latest, job_line = table.splitlines()
    assert code == 1 and "still running" in latest
    assert job_line.startswith("job: NOT PASSED: attempt ")
    print(table)


def test_verdict_cli_unknown_job(env: KubeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["verdict", "no-such-job", "-n", env.namespace, "--kubeconfig", str(env.admin_kubeconfig)]
    )
    assert code == 1
    assert "no pods of Job" in capsys.readouterr().err


def test_verdict_cli_forbidden_for_the_sidecar_account(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    # The sidecar's Role has no pods list: least privilege, and the CLI says so instead of crashing.
    code = cli.main(["verdict", env.job_name, "-n", env.namespace, "--kubeconfig", str(env.sa_kubeconfig)])
    assert code == 15
    assert "forbidden" in capsys.readouterr().err


def test_waits_for_the_kubelet_to_report_the_trainer_image(env: KubeEnv) -> None:
    name = "soak-train-late-status"
    create_pod(env.core, env.namespace, name, env.job_name, env.job_uid)
    polls: list[float] = []

    def kubelet_syncs_on_second_poll(delay: float) -> None:
        polls.append(delay)
        if len(polls) == 2:
            set_status(env.core, env.namespace, name, running_status())

    with KubeClient(connect(kubeconfig=env.sa_kubeconfig), sleep=kubelet_syncs_on_second_poll) as client:
        identity = wait_for_trainer_digest(client, env.namespace, name, timeout_s=60, poll_s=0.1)
        assert identity.trainer_image_digest == DIGEST
        assert polls == [0.1, 0.1]
        # No status ever: the identity comes back without a digest once the time is up.
        create_pod(env.core, env.namespace, "soak-train-no-status", None, None)
        late = wait_for_trainer_digest(
            client, env.namespace, "soak-train-no-status", timeout_s=0.3, poll_s=0.1
        )
    assert late.trainer_image_digest is None


def test_wiring_from_settings(env: KubeEnv, tmp_path: Path) -> None:
    pod = create_pod(env.core, env.namespace, "soak-train-settings", env.job_name, env.job_uid)
    settings = load_settings(
        {
            "kube.kubeconfig": env.sa_kubeconfig,
            "kube.namespace": env.namespace,
            "kube.pod_name": pod.metadata.name,
            "kube.pod_uid": pod.metadata.uid,
            "kube.annotation_prefix": "soak.example.org",
            "kube.termination_log": tmp_path / "termination-log",
            "kube.sidecar_container": "watcher",
            "kube.progress_annotations_s": 30,
        }
    )
    with KubeClient.from_settings(settings.kube) as client:
        publisher = PodPublisher.from_settings(client, settings.kube)
        assert publisher.progress("running", 1_800_000_000.0, 1.0)
        assert not publisher.publish(verdict()).errors
    stored = env.core.read_namespaced_pod(pod.metadata.name, env.namespace).metadata.annotations
    assert stored["soak.example.org/verdict"] == "failed"
    assert stored["soak.example.org/phase"] == "running"
    event = env.core.list_namespaced_event(
        env.namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}"
    ).items[0]
    assert event.involved_object.field_path == "spec.containers{watcher}"
    assert (tmp_path / "termination-log").stat().st_size > 0
    with pytest.raises(ConfigError, match="downward API"):
        PodPublisher.from_settings(client, load_settings().kube)


def test_verdict_cli_waits_for_the_job_to_end(env: KubeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    """--wait returns once the Job has a Complete or Failed condition, and says so when it has not."""
    job = new_job(env)
    published_pod(env, job, f"{job[0]}-aaaaa", replace_attempt(PASSED, 1))
    code = cli.main(
        ["verdict", job[0], "-n", env.namespace, "--kubeconfig", str(env.admin_kubeconfig), "--wait", "0.5"]
    )
    assert code == 0  # the latest attempt passed, though the Job never ended
    assert f"Job {env.namespace}/{job[0]} still running after 0.5 s" in capsys.readouterr().err
    batch = k8s.BatchV1Api(env.server.api_client())
    now = "2025-01-01T00:00:00Z"
    batch.patch_namespaced_job_status(
        job[0],
        env.namespace,
        {
            "status": {
                "startTime": now,
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "lastTransitionTime": now},
                    {"type": "Failed", "status": "True", "lastTransitionTime": now},
                ],
            }
        },
    )
    with KubeClient(connect(kubeconfig=env.admin_kubeconfig), retries=0) as client:
        assert end_condition(read_job(client, env.namespace, job[0])) == "Failed"
    code, _ = run_cli(env, job[0], capsys, "--wait", "600")
    assert code == 0


def test_verdict_cli_says_why_a_pod_is_stuck_or_ended_early(
    env: KubeEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    job = new_job(env)
    stuck = f"{job[0]}-a-stuck"
    create_pod(env.core, env.namespace, stuck, *job)
    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "soak-s3" not found'}}
    set_status(
        env.core,
        env.namespace,
        stuck,
        {"phase": "Pending", "containerStatuses": [container_status("soak-sidecar", waiting)]},
    )
    early = f"{job[0]}-b-early"
    create_pod(env.core, env.namespace, early, *job)
    said = "soak-sidecar: error: invalid settings: monitor.sample_interval_s: must be > 0"
    set_status(
        env.core,
        env.namespace,
        early,
        {
            "phase": "Failed",
            "containerStatuses": [container_status("soak-sidecar", terminated(64, "Error", said))],
        },
    )
    _code, doc = run_json(env, job[0], capsys)
    by_pod = {row["pod"]: row for row in doc["attempts"]}
    assert by_pod[stuck]["reason"] == (
        'pending: soak-sidecar CreateContainerConfigError (secret "soak-s3" not found)'
    )
    assert (
        by_pod[early]["reason"] == f"sidecar container terminated without a verdict (exit 64, Error): {said}"
    )


def test_the_apiservers_clock_is_read_off_its_date_header(env: KubeEnv) -> None:
    with env.sa_client() as client:
        before = time.time()
        reading = ApiserverClock(client).now()
        after = time.time()
    assert reading.source == "the Kubernetes apiserver's clock (Date)"
    # Date names a whole second; the reading is its middle.
    assert before - 0.5 <= reading.unix <= after + 0.5


def test_an_unreachable_apiserver_clock_is_a_transient_failure() -> None:
    client = KubeClient(connect(host="https://127.0.0.1:9", token="t"), retries=1, backoff_s=0.01)
    with pytest.raises(TransientError, match="cannot read the Kubernetes apiserver's clock for the deadline"):
        ApiserverClock(client).now()


def test_verdict_reads_every_page_of_a_jobs_pods(
    env: KubeEnv, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pods come in pages (LIST_PAGE, 500 in production; 2 here): none is left out."""
    monkeypatch.setattr(reads, "LIST_PAGE", 2)
    job = new_job(env)
    names = [f"{job[0]}-{index}-{uuid.uuid4().hex[:5]}" for index in range(5)]
    for name in names:
        published_pod(env, job, name, PASSED)
    code, doc = run_json(env, job[0], capsys)
    assert code == 0, doc
    assert sorted(row["pod"] for row in doc["attempts"]) == sorted(names)
