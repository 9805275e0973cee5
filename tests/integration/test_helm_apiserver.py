"""The rendered chart against a real kube-apiserver (RBAC, admission, server-side validation).

ServiceAccount, Role, RoleBinding and ConfigMap are server-side applied for real; the Job is
applied with dry-run (there is no controller manager to run it), and a Pod made from its
template is created for real in a namespace that enforces the "restricted" Pod Security
Standard. The chart's ServiceAccount then acts with its own token: what the sidecar does
(read and annotate its pod, emit an Event) is allowed, everything else is not.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.system import prometheus_operator_crd
from tests.fixtures.helm import CHART_DIR, RUN_ID, HelmBinaryEngine, HelmEngine, Manifest
from tests.fixtures.kube import KubeApiServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.helm, pytest.mark.kube]

POLICY_WAIT_S = 60.0


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--request-timeout=60s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def can_i(self, verb: str, resource: str, namespace: str) -> bool:
        result = self.run("auth", "can-i", verb, resource, "-n", namespace, check=False)
        assert result.stdout.strip() in {"yes", "no"}, result.stdout + result.stderr
        return result.stdout.strip() == "yes"


@pytest.fixture
def apiserver(kube_apiserver: KubeApiServer) -> KubeApiServer:
    return kube_apiserver


@pytest.fixture
def engine(helm_binary: Path) -> HelmEngine:
    return HelmBinaryEngine(helm_binary)


@pytest.fixture
def admin(apiserver: Any, kubectl_binary: Path) -> Kubectl:
    return Kubectl(kubectl_binary, apiserver.kubeconfig(apiserver.admin_token))


def make_namespace(admin: Kubectl, labels: dict[str, str] | None = None) -> str:
    name = f"soak-chart-{uuid.uuid4().hex[:8]}"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    admin.run("apply", "--server-side", "-f", "-", stdin=json.dumps(namespace))
    return name


def apply(
    kubectl: Kubectl, objects: list[Manifest], *, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    args = ["apply", "--server-side", "--field-manager=soak-chart-test", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    return kubectl.run(*args, stdin=yaml.safe_dump_all(objects))


def pod_token(admin: Kubectl, account: str, namespace: str, pod: str | None) -> str:
    """A token of ``account``; bound to ``pod`` like the kubelet's projected one, unless None."""
    bound = [] if pod is None else ["--bound-object-kind", "Pod", "--bound-object-name", pod]
    return admin.run("create", "token", account, "-n", namespace, "--duration=10m", *bound).stdout.strip()


def pod_from_job(job: Manifest, name: str) -> Manifest:
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name, "namespace": job["metadata"]["namespace"]},
        "spec": template["spec"],
    }


@pytest.mark.parametrize("value_set", ["default", "kind", "indexed"])
def test_chart_objects_are_accepted_by_the_apiserver(
    engine: HelmEngine, admin: Kubectl, value_set: str
) -> None:
    namespace = make_namespace(admin, RESTRICTED)
    values: dict[str, Any] = {"runId": RUN_ID}
    if value_set != "default":
        values = yaml.safe_load((CHART_DIR / "ci" / f"{value_set}-values.yaml").read_text())
    manifests = engine.template(values, release="soak", namespace=namespace)
    job = next(m for m in manifests if m["kind"] == "Job")
    others = [m for m in manifests if m["kind"] != "Job"]

    applied = apply(admin, others)
    assert "serverside-applied" in applied.stdout, applied.stdout
    dry = apply(admin, [job], dry_run=True)
    assert "serverside-applied (server dry run)" in dry.stdout, dry.stdout
    assert "Warning" not in dry.stderr, dry.stderr  # PodSecurity warn=restricted on the template

    # A real Pod from the template: PodSecurity enforce=restricted admits it, the ServiceAccount
    # admission finds the chart's ServiceAccount, the projected token volume validates.
    created = admin.run("create", "-f", "-", stdin=json.dumps(pod_from_job(job, "soak-probe")))
    assert "created" in created.stdout
    stored = json.loads(admin.run("get", "pod", "soak-probe", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["automountServiceAccountToken"] is False
    assert stored["spec"]["serviceAccountName"] == job["spec"]["template"]["spec"]["serviceAccountName"]
    # With automount off, nothing may have injected a token volume into the other containers.
    for item in stored["spec"]["containers"] + stored["spec"]["initContainers"]:
        mounts = {m["mountPath"] for m in item.get("volumeMounts", [])}
        has_token = "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
        assert has_token == (item["name"] == "soak-sidecar"), item["name"]


def test_restricted_namespace_rejects_a_weakened_pod(engine: HelmEngine, admin: Kubectl) -> None:
    """The check above can fail: the same pod with a privilege escalation is refused."""
    namespace = make_namespace(admin, RESTRICTED)
    manifests = engine.template({"runId": RUN_ID}, namespace=namespace)
    apply(admin, [m for m in manifests if m["kind"] != "Job"])  # the ServiceAccount must exist
    job = next(m for m in manifests if m["kind"] == "Job")
    assert (
        "created"
        in admin.run(
            "create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod_from_job(job, "intact"))
        ).stdout
    )
    pod = pod_from_job(job, "weakened")
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    result = admin.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
    assert result.returncode != 0
    assert "allowPrivilegeEscalation" in result.stderr


def test_chart_service_account_has_exactly_what_the_sidecar_needs(
    engine: HelmEngine, admin: Kubectl, apiserver: Any, kubectl_binary: Path
) -> None:
    namespace = make_namespace(admin)
    other = make_namespace(admin)
    manifests = engine.template({"runId": RUN_ID}, namespace=namespace)
    job = next(m for m in manifests if m["kind"] == "Job")
    apply(admin, [m for m in manifests if m["kind"] != "Job"])
    admin.run("create", "-f", "-", stdin=json.dumps(pod_from_job(job, "soak-probe")))
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    sidecar = Kubectl(
        kubectl_binary, apiserver.kubeconfig(pod_token(admin, account, namespace, "soak-probe"), namespace)
    )

    own_job = f"jobs.batch/{job['metadata']['name']}"
    for verb, resource in [
        ("get", "pods"),
        ("patch", "pods"),
        ("create", "events"),
        ("get", own_job),  # why its pod was stopped: suspended, failed, deleted
    ]:
        assert sidecar.can_i(verb, resource, namespace), f"{verb} {resource}"
    for verb, resource in [
        ("list", "pods"),
        ("delete", "pods"),
        ("update", "pods"),
        ("create", "events.events.k8s.io"),
        ("create", "pods"),
        ("get", "secrets"),
        ("get", "jobs.batch"),  # only its own, by name
        ("get", "jobs.batch/another-job"),
        ("patch", own_job),
        ("get", "configmaps"),
    ]:
        assert not sidecar.can_i(verb, resource, namespace), f"{verb} {resource}"
    assert not sidecar.can_i("get", "pods", other), "the Role must not reach other namespaces"

    # And for real: what publication does, with the ServiceAccount's own token.
    sidecar.run("get", "pod", "soak-probe", "-n", namespace)
    sidecar.run(
        "patch",
        "pod",
        "soak-probe",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"annotations": {"soak.sidecar.io/verdict": "passed"}}}),
    )
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"soak-probe.{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "name": "soak-probe", "namespace": namespace},
        "reason": "SoakPassed",
        "message": "soak passed every check",
        "type": "Normal",
    }
    sidecar.run("create", "-f", "-", stdin=json.dumps(event))
    annotated = json.loads(admin.run("get", "pod", "soak-probe", "-n", namespace, "-o", "json").stdout)
    assert annotated["metadata"]["annotations"]["soak.sidecar.io/verdict"] == "passed"
    denied = sidecar.run("delete", "pod", "soak-probe", "-n", namespace, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


def only_job(manifests: list[Manifest]) -> Manifest:
    return next(m for m in manifests if m["kind"] == "Job")


def two_pods_and_a_bound_token(
    engine: HelmEngine, admin: Kubectl, apiserver: Any, kubectl_binary: Path, values: dict[str, Any]
) -> tuple[str, list[Manifest], Kubectl]:
    """The chart applied in a fresh namespace, pods soak-own and soak-other made from its Job, and
    kubectl acting as the sidecar with a token bound to soak-own (as the kubelet projects it)."""
    namespace = make_namespace(admin)
    manifests = engine.template({"runId": RUN_ID, **values}, namespace=namespace)
    job = only_job(manifests)
    apply(admin, [m for m in manifests if m["kind"] != "Job"])
    for name in ("soak-own", "soak-other"):
        admin.run("create", "-f", "-", stdin=json.dumps(pod_from_job(job, name)))
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    token = pod_token(admin, account, namespace, "soak-own")
    return namespace, manifests, Kubectl(kubectl_binary, apiserver.kubeconfig(token, namespace))


def merge(key: str, value: object) -> str:
    return json.dumps({"metadata": {key: value}})


def test_the_admission_policy_confines_the_token_to_its_own_pods_annotations(
    engine: HelmEngine, admin: Kubectl, apiserver: Any, kubectl_binary: Path
) -> None:
    namespace, manifests, sidecar = two_pods_and_a_bound_token(engine, admin, apiserver, kubectl_binary, {})
    kinds = {m["kind"] for m in manifests}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    account = only_job(manifests)["spec"]["template"]["spec"]["serviceAccountName"]

    def patch(kubectl: Kubectl, pod: str, body: str, kind: str = "merge") -> subprocess.CompletedProcess[str]:
        return kubectl.run("patch", "pod", pod, "-n", namespace, f"--type={kind}", "-p", body, check=False)

    # The policy is in force once the apiserver has loaded it: wait for that handshake.
    # (Patches made before it loads land: they use a key of their own.)
    other_annotation = merge("annotations", {"soak.sidecar.io/probe": "x"})
    attempts: list[subprocess.CompletedProcess[str]] = []

    def refused() -> bool:
        attempts.append(patch(sidecar, "soak-other", other_annotation))
        return attempts[-1].returncode != 0

    wait_until("the admission policy in force", refused, timeout_s=POLICY_WAIT_S, interval_s=0.5)
    denied = attempts[-1]
    assert "may change only its own pod" in denied.stderr, denied.stderr
    denied = patch(sidecar, "soak-other", merge("annotations", {"soak.sidecar.io/verdict": "passed"}))
    assert denied.returncode != 0 and "may change only its own pod" in denied.stderr, denied.stderr

    allowed = patch(sidecar, "soak-own", merge("annotations", {"soak.sidecar.io/verdict": "passed"}))
    assert allowed.returncode == 0, allowed.stderr
    image = json.dumps({"spec": {"containers": [{"name": "trainer", "image": "evil:latest"}]}})
    for body, kind, message in [
        (merge("labels", {"soak.sidecar.io/verdict": "passed"}), "merge", "only annotations of its pod"),
        (
            merge("annotations", {"example.com/owner": "me"}),
            "merge",
            "only annotations under soak.sidecar.io/",
        ),
        (image, "strategic", "only annotations of its pod"),
    ]:
        result = patch(sidecar, "soak-own", body, kind)
        assert result.returncode != 0 and message in result.stderr, (body, result.stderr)
    unbound = Kubectl(
        kubectl_binary, apiserver.kubeconfig(pod_token(admin, account, namespace, None), namespace)
    )
    result = patch(unbound, "soak-own", merge("annotations", {"soak.sidecar.io/verdict": "failed"}))
    assert result.returncode != 0 and "token bound to its pod" in result.stderr, result.stderr

    def event(pod: str) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:8]}", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                "reason": "SoakPassed",
                "message": "soak passed every check",
                "type": "Normal",
            }
        )

    assert sidecar.run("create", "-f", "-", stdin=event("soak-own"), check=False).returncode == 0
    forged = sidecar.run("create", "-f", "-", stdin=event("soak-other"), check=False)
    assert forged.returncode != 0 and "Events only about its own pod" in forged.stderr, forged.stderr
    stored = json.loads(admin.run("get", "pod", "soak-other", "-n", namespace, "-o", "json").stdout)
    assert "soak.sidecar.io/verdict" not in stored["metadata"].get("annotations", {})


def test_without_the_admission_policy_the_token_reaches_other_pods(
    engine: HelmEngine, admin: Kubectl, apiserver: Any, kubectl_binary: Path
) -> None:
    """What the policy prevents: with rbac.admissionPolicy=false the Role alone lets the token
    patch another pod of the namespace (the finding this policy answers)."""
    off = {"rbac": {"admissionPolicy": False}}
    namespace, manifests, sidecar = two_pods_and_a_bound_token(engine, admin, apiserver, kubectl_binary, off)
    assert "ValidatingAdmissionPolicy" not in {m["kind"] for m in manifests}
    result = sidecar.run(
        "patch", "pod", "soak-other", "-n", namespace, "--type=merge", "-p", merge("labels", {"x": "y"})
    )
    assert result.returncode == 0


def test_the_network_policy_is_accepted_by_the_apiserver(engine: HelmEngine, admin: Kubectl) -> None:
    namespace = make_namespace(admin)
    values = yaml.safe_load((CHART_DIR / "ci" / "gpu-values.yaml").read_text())
    manifests = engine.template(values, release="soak", namespace=namespace)
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    applied = apply(admin, [policy])
    assert "serverside-applied" in applied.stdout, applied.stdout


def test_the_podmonitor_validates_against_the_prometheus_operators_crd(
    engine: HelmEngine, admin: Kubectl
) -> None:
    """The PodMonitor CRD from the Prometheus Operator's own module, installed in a real apiserver:
    the chart's PodMonitor is accepted, and the CRD's schema does reject a broken one."""
    crd = prometheus_operator_crd("podmonitors").read_text(encoding="utf-8")
    admin.run("apply", "--server-side", "-f", "-", stdin=crd)
    admin.run("wait", "--for=condition=Established", "crd/podmonitors.monitoring.coreos.com", "--timeout=60s")
    namespace = make_namespace(admin)
    values = {"runId": RUN_ID, "metrics": {"enabled": True, "podMonitor": {"enabled": True}}}
    (monitor,) = [
        m for m in engine.template(values, release="soak", namespace=namespace) if m["kind"] == "PodMonitor"
    ]

    def accepted() -> bool:  # the new type reaches discovery a moment after Established
        return admin.run("get", "podmonitors", "-n", namespace, check=False).returncode == 0

    wait_until("PodMonitor served", accepted, 60.0, interval_s=0.5)
    applied = apply(admin, [monitor])
    assert "serverside-applied" in applied.stdout, applied.stdout
    metadata = {**monitor["metadata"], "name": "broken"}
    endpoints = [{"port": "metrics", "interval": "thirty"}]
    broken = {**monitor, "metadata": metadata, "spec": {**monitor["spec"], "podMetricsEndpoints": endpoints}}
    refused = admin.run(
        "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(broken), check=False
    )
    assert refused.returncode != 0 and "interval" in refused.stderr, refused.stderr
