"""The ``kind`` cluster provider: a kind cluster, the image built by Docker, SeaweedFS in-cluster.

For users who have Docker and kind (CI uses the real node, tests/cluster/node.py). Everything runs
through the real CLIs (docker, kind, kubectl, helm) with a private kubeconfig, so the user's current
context is never touched.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.cluster.providers import NAMESPACE, S3_BUCKET, S3_SECRET, run
from tests.cluster.system import REPO_ROOT
from tests.docs_commands import CHART_IMAGE
from tests.waiting import wait_until

if TYPE_CHECKING:
    from tests.cluster.providers import E2ECluster

KIND_CONFIG = REPO_ROOT / "kind-config.yaml"
IMAGE = "soak-sidecar:e2e"  # matches helm/soak-sidecar/ci/kind-values.yaml
# SeaweedFS for the in-cluster S3; `weed server` is fine here (the cluster is deleted whole).
SEAWEEDFS_IMAGE = "chrislusf/seaweedfs:3.80"
S3_SERVICE = "seaweedfs-s3"  # kind-values.yaml: s3.endpointUrl http://seaweedfs-s3:8333
S3_ENDPOINT = f"http://{S3_SERVICE}:8333"
S3_ACCESS_KEY = "soak-e2e-access"
S3_SECRET_KEY = "soak-e2e-secret-key-0123456789"


def create_argv(name: str, kubeconfig: Path) -> list[str]:
    return ["kind", "create", "cluster", "--name", name, "--config", str(KIND_CONFIG),
            "--kubeconfig", str(kubeconfig), "--wait", "300s"]  # fmt: skip


def delete_argv(name: str, kubeconfig: Path) -> list[str]:
    return ["kind", "delete", "cluster", "--name", name, "--kubeconfig", str(kubeconfig)]


def load_argv(name: str) -> list[str]:
    return ["kind", "load", "docker-image", IMAGE, CHART_IMAGE, "--name", name]


def create_cluster(name: str, workdir: Path) -> Path:
    kubeconfig = workdir / "kubeconfig"
    run(create_argv(name, kubeconfig), timeout=900)
    return kubeconfig


def delete_cluster(name: str, kubeconfig: Path) -> None:
    run(delete_argv(name, kubeconfig), timeout=600, check=False)


def build_and_load_image(name: str) -> None:
    run(["docker", "build", "--tag", IMAGE, "--tag", CHART_IMAGE, str(REPO_ROOT)], timeout=1800)
    run(load_argv(name), timeout=900)


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


def run_python_pod(cluster: E2ECluster, name: str, script: str, timeout_s: int = 300) -> str:
    """Run script with the soak-sidecar image (boto3 inside) and S3 credentials; its logs."""
    pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "python",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                    "env": [
                        {"name": "S3_ENDPOINT", "value": S3_ENDPOINT},
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
    cluster.apply([pod])
    phase: dict[str, str] = {}

    def ended() -> bool:
        phase["now"] = cluster.kubectl(
            "get", "pod", pod_name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}"
        ).stdout
        return phase["now"] in {"Succeeded", "Failed"}

    wait_until(f"pod {pod_name}", ended, timeout_s, interval_s=2)
    logs = cluster.kubectl("logs", pod_name, "-n", NAMESPACE, check=False).stdout
    cluster.kubectl("delete", "pod", pod_name, "-n", NAMESPACE, "--wait=false", check=False)
    assert phase["now"] == "Succeeded", f"pod {pod_name} ended {phase['now']}:\n{logs}"
    return logs


def install_seaweedfs(cluster: E2ECluster) -> None:
    cluster.apply(seaweedfs_objects())
    cluster.kubectl(
        "rollout", "status", "deployment/seaweedfs", "-n", NAMESPACE, "--timeout=300s", timeout=360
    )
    run_python_pod(cluster, "create-bucket", CREATE_BUCKET)
