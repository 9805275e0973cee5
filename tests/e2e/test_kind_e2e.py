"""End to end on kind: the image, the chart, a passing and a failing soak, verdicts and artifacts.

Opt-in (SOAK_E2E=1) and only where Docker and kind exist: creates a kind cluster from
kind-config.yaml, builds the image and loads it, installs SeaweedFS in-cluster and the chart with
the mock GPU (helm/soak-sidecar/ci/kind-values.yaml), runs the example trainer once cleanly and
once with --crash, reads both verdicts with `soak-sidecar verdict`, checks the podFailurePolicy
outcome and the artifacts in S3, then deletes the cluster (SOAK_E2E_KEEP=1 keeps it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.exitcodes import ExitCode
from tests.e2e import kind_helpers as kind
from tests.fixtures.helm import CHART_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

_REASON = kind.skip_reason()
if _REASON is not None:
    pytestmark.append(pytest.mark.skip(reason=_REASON))

SOAK_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, helm_binary: Path, kubectl_binary: Path
) -> Iterator[kind.Cluster]:
    workdir = tmp_path_factory.mktemp("kind")
    created = kind.create_cluster(f"soak-e2e-{uuid.uuid4().hex[:6]}", workdir, kubectl_binary, helm_binary)
    try:
        kind.build_and_load_image(created)
        kind.install_seaweedfs(created)
        yield created
    finally:
        if os.environ.get("SOAK_E2E_KEEP") != "1":
            kind.delete_cluster(created)


def verdict(cluster: kind.Cluster, job: str) -> tuple[int, dict[str, Any]]:
    """`soak-sidecar verdict JOB -n NS -o json` against the cluster, as a user would run it."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sidecar.cli import main; raise SystemExit(main())",
            "verdict",
            job,
            "-n",
            kind.NAMESPACE,
            "-o",
            "json",
            "--kubeconfig",
            str(cluster.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stdout.strip(), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return result.returncode, report


def sidecar_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "soak-sidecar"]
    return dict(status)


def run_soak(cluster: kind.Cluster, release: str, trainer_args: list[str]) -> tuple[str, str]:
    run_id = str(uuid.uuid4())
    cluster.helm_install(
        release,
        CHART_DIR / "ci" / "kind-values.yaml",
        {"runId": run_id, "trainer": {"args": trainer_args}},
    )
    return f"{release}-soak-sidecar", run_id


def test_passing_and_failing_soaks(cluster: kind.Cluster) -> None:
    passing_job, passing_run = run_soak(cluster, "pass", ["--steps", "20", "--step-s", "0.5"])
    failing_job, failing_run = run_soak(cluster, "fail", ["--steps", "20", "--step-s", "0.5", "--crash"])

    # The passing soak completes; its sidecar exited 0 with a termination message.
    job = cluster.wait_job(passing_job, "Complete", SOAK_TIMEOUT_S)
    assert job["status"]["succeeded"] == 1
    (pod,) = cluster.job_pods(passing_job)
    terminated = sidecar_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] == ExitCode.PASSED
    assert terminated.get("message"), "the verdict must survive in the termination message"
    assert pod["metadata"]["annotations"]["soak.sidecar.io/verdict"] == "passed"
    code, report = verdict(cluster, passing_job)
    assert code == 0, report
    assert report["passed"] is True
    assert report["attempts"][-1]["verdict"] == "passed"
    passing_artifact = report["attempts"][-1]["artifact"]
    assert passing_artifact and passing_run in passing_artifact

    # The failing soak: the trainer crashed, the sidecar exits TRAINER_FAILED (permanent), and
    # the podFailurePolicy fails the Job at once (not through the backoff limit).
    job = cluster.wait_job(failing_job, "Failed", SOAK_TIMEOUT_S)
    (failed,) = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "PodFailurePolicy", failed
    (pod,) = cluster.job_pods(failing_job)
    assert sidecar_status(pod)["state"]["terminated"]["exitCode"] == ExitCode.TRAINER_FAILED
    code, report = verdict(cluster, failing_job)
    assert code != 0
    assert report["passed"] is False
    last = report["attempts"][-1]
    assert last["verdict"] != "passed" and last["exit_code"] == ExitCode.TRAINER_FAILED
    assert last["artifact"] and failing_run in last["artifact"]

    # Both artifacts are in the in-cluster S3 under their run ids.
    keys = kind.list_s3_keys(cluster, "list-artifacts")
    for run_id, job_name in ((passing_run, passing_job), (failing_run, failing_job)):
        mine = [k for k in keys if f"/{job_name}/{run_id}/" in k]
        assert mine, f"no artifact keys for {job_name} in {keys}"
        assert any(k.endswith(".json") for k in mine), mine
