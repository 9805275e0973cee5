"""``soak-sidecar run --pod`` end to end against the real kube-apiserver.

A pod is emulated on this machine: one PID namespace (``unshare``, PID 1 a reaper standing in
for pause) holding the trainer container's launcher and the sidecar container's
``soak-sidecar run --pod``, sharing a run dir, with the pod's identity in the downward-API
variables and the sidecar authenticated by a TokenRequest token of its least-privilege
ServiceAccount. The verdict then shows up in the pod's annotations, an Event, the termination
message and ``soak-sidecar verdict``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from sidecar import cli
from tests.components import require
from tests.fixtures.kube import PREFIX, KubeEnv
from tests.fixtures.kube_pod import run_pod

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.needs_root]


@pytest.fixture(scope="module")
def pod_env(kube_env: KubeEnv) -> KubeEnv:
    require("pidns")
    return kube_env


def test_pod_mode_passing_failing_and_deadline(
    pod_env: KubeEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = pod_env
    passed = run_pod(env, tmp_path / "a", "soak-train-e2e-pass", ["--steps", "3", "--step-s", "0.1"])
    assert passed["returncode"] == 0, passed["output"]
    annotations = passed["annotations"]
    assert isinstance(annotations, dict)
    assert annotations[f"{PREFIX}verdict"] == "passed", passed["output"]
    assert annotations[f"{PREFIX}exit-code"] == "0"
    assert passed["events"] and passed["events"][0][:2] == ("SoakPassed", "Normal")  # type: ignore[index]
    assert passed["leftovers"] == ()

    failed = run_pod(
        env, tmp_path / "b", "soak-train-e2e-fail", ["--steps", "6", "--step-s", "0.1", "--crash"]
    )
    assert failed["returncode"] == 10, failed["output"]
    annotations = failed["annotations"]
    assert isinstance(annotations, dict)
    assert annotations[f"{PREFIX}verdict"] == "failed"
    assert annotations[f"{PREFIX}exit-code"] == "10"
    termination = failed["termination"]
    assert termination is not None and termination.exit_code == 10  # type: ignore[attr-defined]

    deadline = run_pod(
        env,
        tmp_path / "c",
        "soak-train-e2e-deadline",
        ["--hang"],
        SOAK_DEADLINE__BUDGET_S="6",
        SOAK_DEADLINE__CHECKPOINT_MARGIN_S="2",
        SOAK_DEADLINE__TERM_GRACE_S="1",
        SOAK_MONITOR__STALE_PROGRESS_S="60",
    )
    assert deadline["returncode"] == 14, deadline["output"]
    annotations = deadline["annotations"]
    assert isinstance(annotations, dict)
    assert annotations[f"{PREFIX}classification"] == "deadline_exhausted"

    code = cli.main(
        [
            "verdict",
            env.job_name,
            "-n",
            env.namespace,
            "--kubeconfig",
            str(env.admin_kubeconfig),
            "-o",
            "json",
        ]
    )
    rows = {r["pod"]: r for r in json.loads(capsys.readouterr().out)["attempts"]}
    assert rows["soak-train-e2e-pass"]["verdict"] == "passed"
    assert rows["soak-train-e2e-fail"]["exit_code"] == 10
    assert rows["soak-train-e2e-deadline"]["exit_code"] == 14
    assert code == 1  # the latest attempt ran out of deadline
    cli.main(["verdict", env.job_name, "-n", env.namespace, "--kubeconfig", str(env.admin_kubeconfig)])
    print(capsys.readouterr().out)  # the table, for the test log


def test_a_node_whose_clock_is_behind_the_apiservers_cannot_gain_time(
    pod_env: KubeEnv, tmp_path: Path, clockshim: Path
) -> None:
    """A file store on the node's own disk dates records by the node's clock; the apiserver's clock,
    stamped into the record and read again by every attempt, bounds an attempt after a reboot (no
    CLOCK_BOOTTIME anchor applies) whose wall clock is an hour behind."""
    shared = {
        "SOAK_DEADLINE__RUN_ID": str(uuid.uuid4()),
        "SOAK_DEADLINE__STORE_DIR": str(tmp_path / "deadlines"),
    }
    first = run_pod(pod_env, tmp_path / "a", "soak-clock-a", ["--steps", "3", "--step-s", "0.1"], **shared)
    assert first["returncode"] == 0, first["output"]
    (path,) = (tmp_path / "deadlines").glob("*.json")
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["reference"]["source"] == "the Kubernetes apiserver's clock (Date)"
    assert abs(record["reference"]["unix"] - record["started_unix"]) < 5  # NTP-synced: they agree

    behind = run_pod(
        pod_env,
        tmp_path / "b",
        "soak-clock-b",
        ["--steps", "3", "--step-s", "0.1"],
        boot_id=str(uuid.uuid4()),
        LD_PRELOAD=str(clockshim),
        CLOCKSHIM_OFFSET_S="-3600",
        **shared,
    )
    assert behind["returncode"] == 15, behind["output"]
    assert "the Kubernetes apiserver's clock (Date) says" in str(behind["output"])
    annotations = behind["annotations"]
    assert isinstance(annotations, dict) and annotations[f"{PREFIX}exit-code"] == "15"
    assert path.read_text(encoding="utf-8") == json.dumps(record, sort_keys=True, indent=2) + "\n"
