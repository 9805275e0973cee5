"""One e2e cluster interface over two providers, chosen by ``SOAK_E2E``: ``node`` (the real single
node built here, what CI runs) or ``kind`` (Docker and kind).

Either way the test sees an :class:`E2ECluster`: a kubeconfig, helm and kubectl, the namespace with
the S3 credentials Secret, the chart values that fit the provider, and a way to read the S3 bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.system import REPO_ROOT, log
from tests.waiting import wait_until

NAMESPACE = "soak-e2e"
S3_SECRET = "soak-s3"  # helm/soak-sidecar/ci/kind-values.yaml: s3.credentials.existingSecret
S3_BUCKET = "soak-e2e"  # kind-values.yaml: s3.bucket
CHART_DIR = REPO_ROOT / "helm" / "soak-sidecar"
VALUES_FILE = CHART_DIR / "ci" / "kind-values.yaml"
PROVIDERS = ("node", "kind")

# Lists the bucket with each object's size and stored SHA-256 checksum; run on the host (node)
# or in a pod (kind). Environment: S3_ENDPOINT, S3_BUCKET and the AWS credentials. An object gone
# between the listing and its read (a soak's deadline lease, released as it ends) is left out.
LIST_OBJECTS = """
import hashlib, json, os, boto3, botocore.exceptions
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1")
found = {}
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=os.environ["S3_BUCKET"]):
    for item in page.get("Contents", []):
        try:
            head = s3.head_object(Bucket=os.environ["S3_BUCKET"], Key=item["Key"], ChecksumMode="ENABLED")
            body = s3.get_object(Bucket=os.environ["S3_BUCKET"], Key=item["Key"])["Body"].read()
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                continue
            raise
        found[item["Key"]] = {"size": item["Size"], "checksum_sha256": head.get("ChecksumSHA256"),
                              "sha256": hashlib.sha256(body).hexdigest(),
                              "json": json.loads(body) if item["Key"].endswith(".json") else None}
print("OBJECTS " + json.dumps(found))
"""


def selected_provider() -> str | None:
    """``SOAK_E2E``: node, kind, or unset (the e2e tests skip); anything else is an error."""
    value = os.environ.get("SOAK_E2E", "").strip()
    if not value:
        return None
    if value not in PROVIDERS:
        raise ValueError(f"SOAK_E2E={value!r}: expected one of {', '.join(PROVIDERS)}")
    return value


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
class E2ECluster:
    provider: str
    kubeconfig: Path
    tools: Path  # holds helm and kubectl
    workdir: Path
    s3_endpoint: str  # as pods reach it
    s3_values: dict[str, Any]  # chart values that point the sidecar at this S3
    list_objects: Callable[[], dict[str, dict[str, Any]]]
    closed_port_endpoint: str  # an S3 URL pods can reach where nothing listens (store down)
    s3_credentials: tuple[str, str]  # access key id, secret access key
    # Host directories a pod's hostPath reaches at the same path: all of them on the real node, what
    # the kind config mounts into the kind node.
    host_paths: tuple[Path, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """What a user's shell would have: KUBECONFIG set, helm and kubectl first on PATH, and a HOME
        of its own, so their caches land in the workdir (never in the checkout or the caller's home)."""
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.tools / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            stdin=stdin,
            check=check,
            timeout=timeout,
        )

    def get_json(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return found

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def helm_install(self, release: str, values: dict[str, Any]) -> None:
        overrides = self.workdir / f"{release}-{uuid.uuid4().hex[:6]}.json"
        overrides.write_text(json.dumps(values), encoding="utf-8")
        run(
            [
                str(self.tools / "helm"),
                "install",
                release,
                str(CHART_DIR),
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                NAMESPACE,
                "--values",
                str(VALUES_FILE),
                "--values",
                str(overrides),
            ]
        )

    def helm_uninstall(self, release: str, namespace: str = NAMESPACE) -> None:
        run(
            [
                str(self.tools / "helm"),
                "uninstall",
                release,
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                namespace,
                "--wait",
                "--timeout",
                "120s",
            ],
            check=False,
            timeout=180,
        )

    def job(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        return self.get_json("job", name, "-n", namespace)

    def wait_job_finished(
        self, name: str, timeout_s: float, namespace: str = NAMESPACE
    ) -> tuple[str, dict[str, Any]]:
        """Wait for Complete or Failed, whichever comes: a broken soak fails fast, not at a timeout."""
        outcome: dict[str, Any] = {}

        def finished() -> bool:
            job = self.job(name, namespace)
            for condition in job.get("status", {}).get("conditions") or []:
                if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
                    outcome.update(condition=condition["type"], job=job)
                    return True
            return False

        wait_until(f"Job {name} Complete or Failed", finished, timeout_s, interval_s=1.0)
        return outcome["condition"], outcome["job"]

    def pods(self, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get_json(
            "pods", "-n", NAMESPACE, "-l", f"batch.kubernetes.io/job-name={job}"
        )["items"]
        return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])

    def events(self, pod: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get_json(
            "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={pod}"
        )["items"]
        return items

    def logs(self, pod: str, container: str) -> str:
        return self.kubectl("logs", pod, "-n", NAMESPACE, "-c", container, check=False).stdout

    def state_report(self) -> str:
        """The namespace's Jobs, pods and Events in a few lines: what a failed e2e test shows, since
        CI keeps only its output and the cluster is gone by then."""
        lines = []
        for job in self.get_json("jobs", "-n", NAMESPACE)["items"]:
            conditions = [(c["type"], c.get("reason")) for c in job.get("status", {}).get("conditions") or []]
            lines.append(
                f"job {job['metadata']['name']}: {conditions} {job.get('status', {}).get('failedIndexes')}"
            )
        for pod in self.get_json("pods", "-n", NAMESPACE)["items"]:
            meta, status = pod["metadata"], pod.get("status", {})
            exits = {
                s["name"]: s.get("state", {}).get("terminated", {}).get("exitCode")
                for s in status.get("containerStatuses") or []
            }
            notes = {
                k: v for k, v in (meta.get("annotations") or {}).items() if "index" in k or "attempt" in k
            }
            lines.append(
                f"pod {meta['name']}: {status.get('phase')} {status.get('reason') or ''} exits={exits} "
                f"deleting={meta.get('deletionTimestamp')} {notes}"
            )
        events = self.get_json("events", "-n", NAMESPACE)["items"]
        events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        for event in events[-60:]:
            involved = event.get("involvedObject", {})
            lines.append(
                f"event {event.get('lastTimestamp') or event.get('eventTime')} {involved.get('kind')}/"
                f"{involved.get('name')} {event.get('reason')}: {(event.get('message') or '')[:200]}"
            )
        return "\n".join(lines)


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (status,) = [s for s in pod["status"].get("containerStatuses", []) if s["name"] == name]
    return dict(status)


def terminated(pod: dict[str, Any], name: str) -> dict[str, Any]:
    state: dict[str, Any] = container(pod, name)["state"].get("terminated") or {}
    return state


# ---------------------------------------------------------------- the node provider


@contextlib.contextmanager
def node_cluster(workdir: Path, tools: Path) -> Iterator[E2ECluster]:
    from tests.cluster.node import RealNode
    from tests.cluster.system import free_ports
    from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY, run_seaweedfs

    node = RealNode(workdir=workdir / "node", kubectl_bin=tools / "kubectl")
    try:
        node.up()
        with run_seaweedfs(workdir / "s3", bucket=S3_BUCKET, ip=node.host_address) as server:
            env = {
                "S3_ENDPOINT": server.endpoint,
                "S3_BUCKET": S3_BUCKET,
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            }

            def list_objects() -> dict[str, dict[str, Any]]:
                out = run([sys.executable, "-c", LIST_OBJECTS], env=env, timeout=120).stdout
                return _objects_line(out)

            cluster = E2ECluster(
                provider="node",
                kubeconfig=node.kubeconfig,
                tools=tools,
                workdir=workdir,
                s3_endpoint=server.endpoint,
                s3_values={"s3": {"endpointUrl": server.endpoint, "region": REGION}},
                list_objects=list_objects,
                closed_port_endpoint=f"http://{node.host_address}:{free_ports(1, node.host_address)[0]}",
                s3_credentials=(ACCESS_KEY, SECRET_KEY),
                host_paths=(Path("/"),),
            )
            _namespace_with_secret(cluster, *cluster.s3_credentials)
            yield cluster
    finally:
        started = time.monotonic()
        node.down()
        log(f"node down in {time.monotonic() - started:.0f} s")


def _objects_line(out: str) -> dict[str, dict[str, Any]]:
    (line,) = [line for line in out.splitlines() if line.startswith("OBJECTS ")]
    found: dict[str, dict[str, Any]] = json.loads(line.removeprefix("OBJECTS "))
    return found


def _namespace_with_secret(cluster: E2ECluster, access_key: str, secret_key: str) -> None:
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": S3_SECRET, "namespace": NAMESPACE},
                "stringData": {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
            },
        ]
    )


# ---------------------------------------------------------------- the kind provider


def kind_missing() -> str | None:
    missing = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    if missing:
        return f"SOAK_E2E=kind needs {', '.join(missing)} on PATH"
    info = run(["docker", "info"], check=False, timeout=60)
    if info.returncode != 0:
        return f"SOAK_E2E=kind but the Docker daemon is not reachable: {info.stderr.strip()[-300:]}"
    return None


@contextlib.contextmanager
def kind_cluster(workdir: Path, tools: Path) -> Iterator[E2ECluster]:
    from tests.cluster import kind

    with contextlib.ExitStack() as stack:
        if kind.local_node():
            stack.enter_context(kind.local_runtime())
        missing = kind_missing()
        if missing:
            raise RuntimeError(missing)
        yield from _kind_cluster(workdir, tools)


def _kind_cluster(workdir: Path, tools: Path) -> Iterator[E2ECluster]:
    from tests.cluster import kind

    name = f"soak-e2e-{uuid.uuid4().hex[:6]}"
    kubeconfig, host_paths = kind.create_cluster(name, workdir)
    try:
        cluster = E2ECluster(
            provider="kind",
            kubeconfig=kubeconfig,
            tools=tools,
            workdir=workdir,
            s3_endpoint=kind.S3_ENDPOINT_ANY_NAMESPACE,
            s3_values={},
            list_objects=lambda: {},
            closed_port_endpoint="",
            s3_credentials=(kind.S3_ACCESS_KEY, kind.S3_SECRET_KEY),
            host_paths=host_paths,
        )
        # The node's own address: a closed port there refuses at once. A Service's ClusterIP on a port
        # it does not serve has no rule behind it, and a connection there only times out.
        node_ip = cluster.kubectl(
            "get", "nodes", "-o", "jsonpath={.items[0].status.addresses[?(@.type=='InternalIP')].address}"
        ).stdout.strip()
        cluster.closed_port_endpoint = f"http://{node_ip}:1"
        kind.build_and_load_image(name)
        kind.install_seaweedfs(cluster)
        cluster.list_objects = lambda: _objects_line(
            kind.run_python_pod(cluster, "list-objects", LIST_OBJECTS)
        )
        yield cluster
    finally:
        if os.environ.get("SOAK_E2E_KEEP") != "1":
            kind.delete_cluster(name, kubeconfig)


@contextlib.contextmanager
def e2e_cluster(provider: str, workdir: Path, tools: Path) -> Iterator[E2ECluster]:
    chosen = node_cluster if provider == "node" else kind_cluster
    with chosen(workdir, tools) as cluster:
        yield cluster
