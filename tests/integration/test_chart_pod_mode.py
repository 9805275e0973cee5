"""`soak-sidecar run --pod` with the chart's own ServiceAccount, Role and RoleBinding.

The chart is rendered by the real helm binary and its RBAC objects are server-side applied into
the real kube-apiserver; the emulated pod (tests/integration/test_kube_pod_mode.py) then runs with
a TokenRequest token of the chart's ServiceAccount, so the verdict reaches the pod's annotations,
an Event and `soak-sidecar verdict` with exactly the privileges the chart grants.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s

from sidecar import cli
from tests.components import require
from tests.fixtures.helm import RUN_ID, HelmBinaryEngine
from tests.fixtures.kube import (
    PREFIX,
    SA,
    KubeApiServer,
    KubeEnv,
    create_job,
    create_namespace,
    create_pod,
    running_status,
    set_status,
    wait_for_rbac,
)
from tests.fixtures.kube_pod import run_pod
from tests.integration.test_helm_apiserver import Kubectl, apply

pytestmark = [pytest.mark.integration, pytest.mark.helm, pytest.mark.kube, pytest.mark.needs_root]


def test_pod_mode_with_the_charts_rbac(
    kube_apiserver: KubeApiServer,
    helm_binary: Path,
    kubectl_binary: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    require("pidns")
    admin = kube_apiserver.api_client()
    core = k8s.CoreV1Api(admin)
    namespace = f"soak-chart-{uuid.uuid4().hex[:8]}"
    create_namespace(core, namespace)
    # Named as the emulated pods name their ServiceAccount; the Role and binding are the chart's.
    values = {"runId": RUN_ID, "serviceAccount": {"name": SA}}
    manifests = HelmBinaryEngine(helm_binary).template(values, release="soak", namespace=namespace)
    rbac = [m for m in manifests if m["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert {m["kind"] for m in rbac} == {"ServiceAccount", "Role", "RoleBinding"}
    apply(Kubectl(kubectl_binary, kube_apiserver.kubeconfig(kube_apiserver.admin_token)), rbac)
    account = next(m for m in rbac if m["kind"] == "ServiceAccount")["metadata"]["name"]
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    job_name = "soak-chart-job"
    job_uid = create_job(admin, namespace, job_name)
    sa_kubeconfig = kube_apiserver.kubeconfig(token, namespace)
    create_pod(core, namespace, "rbac-probe", job_name, job_uid)
    set_status(core, namespace, "rbac-probe", running_status())
    wait_for_rbac(sa_kubeconfig, namespace, "rbac-probe")
    env = KubeEnv(
        server=kube_apiserver,
        core=core,
        namespace=namespace,
        other_namespace=namespace,
        sa_token=token,
        sa_kubeconfig=sa_kubeconfig,
        admin_kubeconfig=kube_apiserver.kubeconfig(kube_apiserver.admin_token),
        job_name=job_name,
        job_uid=job_uid,
    )
    passed = run_pod(env, tmp_path / "pass", "soak-chart-pass", ["--steps", "3", "--step-s", "0.1"])
    assert passed["returncode"] == 0, passed["output"]
    annotations = passed["annotations"]
    assert isinstance(annotations, dict)
    assert annotations[f"{PREFIX}verdict"] == "passed"
    assert annotations[f"{PREFIX}attempt"] == "1"
    events = passed["events"]
    assert isinstance(events, list) and events, "the chart's Role must allow the verdict Event"

    failed = run_pod(
        env, tmp_path / "fail", "soak-chart-fail", ["--steps", "4", "--step-s", "0.1", "--crash"]
    )
    assert failed["returncode"] == 10, failed["output"]

    code = cli.main(
        ["verdict", job_name, "-n", namespace, "--kubeconfig", str(env.admin_kubeconfig), "-o", "json"]
    )
    rows = {row["pod"]: row for row in json.loads(capsys.readouterr().out)["attempts"]}
    assert rows["soak-chart-pass"]["verdict"] == "passed"
    assert rows["soak-chart-fail"]["exit_code"] == 10
    assert code == 1
    core.delete_namespace(namespace)
