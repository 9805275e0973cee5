"""kind cluster, image and in-cluster SeaweedFS for the end-to-end test (tests/e2e/test_kind_e2e.py).

Everything runs through the real CLIs (docker, kind, kubectl, helm) with a private kubeconfig, so
the user's current context is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND_CONFIG = REPO_ROOT / "kind-config.yaml"
IMAGE = "soak-sidecar:e2e"  # matches helm/soak-sidecar/ci/kind-values.yaml
NAMESPACE = "soak-e2e"
# SeaweedFS for the in-cluster S3; `weed server` is fine here (the cluster is deleted whole).
SEAWEEDFS_IMAGE = "chrislusf/seaweedfs:3.80"
S3_SERVICE = "seaweedfs-s3"  # kind-values.yaml: s3.endpointUrl http://seaweedfs-s3:8333
S3_SECRET = "soak-s3"  # kind-values.yaml: s3.credentials.existingSecret
S3_BUCKET = "soak-e2e"  # kind-values.yaml: s3.bucket
S3_ACCESS_KEY = "soak-e2e-access"
S3_SECRET_KEY = "soak-e2e-secret-key-0123456789"


def skip_reason() -> str | None:
    """Why the e2e test cannot run here, or None when it can."""
    if os.environ.get("SOAK_E2E") != "1":
        return "opt-in: set SOAK_E2E=1 (needs a running Docker daemon and kind on PATH)"
    missing = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    if missing:
        return f"SOAK_E2E=1 but {', '.join(missing)} not on PATH (needs Docker and kind)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60, check=False)
    if info.returncode != 0:
        return f"SOAK_E2E=1 but the Docker daemon is not reachable: {info.stderr.strip()[-300:]}"
    return None


def run(
    argv: list[str],
    *,
    timeout: float = 600,
    stdin: str | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


@dataclass
class Cluster:
    name: str
    kubeconfig: Path
    kubectl_bin: Path
    helm_bin: Path

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args],
            stdin=stdin,
            check=check,
            timeout=timeout,
        )

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def helm_install(self, release: str, values_file: Path, overrides: dict[str, Any]) -> None:
        extra = Path(self.kubeconfig.parent / f"{release}-overrides.json")
        extra.write_text(json.dumps(overrides))
        run(
            [
                str(self.helm_bin),
                "install",
                release,
                str(REPO_ROOT / "helm" / "soak-sidecar"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                NAMESPACE,
                "--values",
                str(values_file),
                "--values",
                str(extra),
            ]
        )

    def wait_job(self, job: str, condition: str, timeout_s: int) -> dict[str, Any]:
        self.kubectl(
            "wait",
            f"job/{job}",
            "-n",
            NAMESPACE,
            f"--for=condition={condition}",
            f"--timeout={timeout_s}s",
            timeout=timeout_s + 60,
        )
        found: dict[str, Any] = json.loads(
            self.kubectl("get", "job", job, "-n", NAMESPACE, "-o", "json").stdout
        )
        return found

    def job_pods(self, job: str) -> list[dict[str, Any]]:
        listed = json.loads(
            self.kubectl(
                "get", "pods", "-n", NAMESPACE, "-l", f"batch.kubernetes.io/job-name={job}", "-o", "json"
            ).stdout
        )
        pods: list[dict[str, Any]] = listed["items"]
        return pods

    def run_python_pod(self, name: str, script: str, timeout_s: int = 300) -> str:
        """Run script with the soak-sidecar image (boto3 inside) and S3 credentials; its logs."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "python",
                        "image": IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", script],
                        "env": [
                            {"name": "S3_ENDPOINT", "value": f"http://{S3_SERVICE}:8333"},
                            {"name": "S3_BUCKET", "value": S3_BUCKET},
                            *[
                                {"name": key, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": key}}}
                                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                            ],
                        ],
                    }
                ],
            },
        }
        self.apply([pod])
        deadline = time.monotonic() + timeout_s
        phase = ""
        while time.monotonic() < deadline:
            phase = self.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}").stdout
            if phase in {"Succeeded", "Failed"}:
                break
            time.sleep(2)
        logs = self.kubectl("logs", name, "-n", NAMESPACE, check=False).stdout
        self.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false", check=False)
        assert phase == "Succeeded", f"pod {name} ended {phase or 'never'}:\n{logs}"
        return logs


def create_cluster(name: str, workdir: Path, kubectl_bin: Path, helm_bin: Path) -> Cluster:
    kubeconfig = workdir / "kubeconfig"
    run(
        [
            "kind",
            "create",
            "cluster",
            "--name",
            name,
            "--config",
            str(KIND_CONFIG),
            "--kubeconfig",
            str(kubeconfig),
            "--wait",
            "300s",
        ],
        timeout=900,
    )
    return Cluster(name, kubeconfig, kubectl_bin, helm_bin)


def delete_cluster(cluster: Cluster) -> None:
    run(
        ["kind", "delete", "cluster", "--name", cluster.name, "--kubeconfig", str(cluster.kubeconfig)],
        timeout=600,
        check=False,
    )


def build_and_load_image(cluster: Cluster) -> None:
    run(["docker", "build", "--tag", IMAGE, str(REPO_ROOT)], timeout=1800)
    run(["kind", "load", "docker-image", IMAGE, "--name", cluster.name], timeout=900)


def seaweedfs_objects() -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "seaweedfs"}
    identities = {
        "identities": [
            {
                "name": "soak",
                "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": S3_SECRET, "namespace": NAMESPACE},
            "stringData": {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "seaweedfs-s3-config", "namespace": NAMESPACE},
            "stringData": {"s3.json": json.dumps(identities)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "seaweedfs", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "weed",
                                "image": SEAWEEDFS_IMAGE,
                                "args": [
                                    "server",
                                    "-dir=/data",
                                    "-ip.bind=0.0.0.0",
                                    "-master.volumeSizeLimitMB=64",
                                    "-volume.max=20",
                                    "-filer",
                                    "-s3",
                                    "-s3.port=8333",
                                    "-s3.config=/etc/seaweedfs/s3.json",
                                ],
                                "ports": [{"containerPort": 8333, "name": "s3"}],
                                "readinessProbe": {"tcpSocket": {"port": 8333}, "periodSeconds": 2},
                                "volumeMounts": [
                                    {"name": "data", "mountPath": "/data"},
                                    {"name": "config", "mountPath": "/etc/seaweedfs", "readOnly": True},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "data", "emptyDir": {}},
                            {"name": "config", "secret": {"secretName": "seaweedfs-s3-config"}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": S3_SERVICE, "namespace": NAMESPACE},
            "spec": {"selector": labels, "ports": [{"name": "s3", "port": 8333, "targetPort": 8333}]},
        },
    ]


CREATE_BUCKET = """
import os, time, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1")
for attempt in range(60):
    try:
        s3.create_bucket(Bucket=os.environ["S3_BUCKET"])
        break
    except s3.exceptions.BucketAlreadyOwnedByYou:
        break
    except Exception as exc:  # SeaweedFS still starting
        print("waiting:", exc)
        time.sleep(2)
else:
    raise SystemExit("bucket not created")
print("bucket ready")
"""

LIST_KEYS = """
import json, os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1")
keys = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=os.environ["S3_BUCKET"]):
    keys += [item["Key"] for item in page.get("Contents", [])]
print("KEYS " + json.dumps(keys))
"""


def install_seaweedfs(cluster: Cluster) -> None:
    cluster.apply(seaweedfs_objects())
    cluster.kubectl(
        "rollout", "status", "deployment/seaweedfs", "-n", NAMESPACE, "--timeout=300s", timeout=360
    )
    cluster.run_python_pod("create-bucket", CREATE_BUCKET)


def list_s3_keys(cluster: Cluster, pod_name: str) -> list[str]:
    logs = cluster.run_python_pod(pod_name, LIST_KEYS)
    (line,) = [line for line in logs.splitlines() if line.startswith("KEYS ")]
    keys: list[str] = json.loads(line.removeprefix("KEYS "))
    return keys
