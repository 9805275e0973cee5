"""What a sidecar asks of the apiserver, counted by the apiserver itself, and ``soak-sidecar verdict``
on a 1,024-pod Job.

Starts a real kube-apiserver (with etcd) that writes an audit line for every request, SeaweedFS
for the evidence, and a namespace set up like the chart's. Then:

1. Two real attempts in emulated pods (``soak-sidecar run --pod`` beside the launcher in one PID
   namespace, the ServiceAccount's own token), a short one and a long one, both with progress
   annotations and evidence flushes every second and a sample every 0.2 s. Their requests, by verb
   and resource, come from the audit log (user: the ServiceAccount). What the long one asks more
   per second is the periodic part; the rest is fixed per attempt. Requests per sample are the
   periodic part over the samples taken: 0 means no per-sample call.
2. A Job of ``--pods`` pods that each published a verdict (annotations and an Event, by the
   sidecar's own publisher). ``soak-sidecar verdict`` on it: wall time and requests (audit, by the
   admin user in its time window); the baseline, in the same run, is one plain LIST of the Job's
   pods with the Kubernetes client (the least any reader of the pods does).

    python bench/apiserver.py [--pods 1024] [--smoke]

``--smoke``: 8 pods and shorter attempts, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from io import StringIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client as k8s

from sidecar import cli
from sidecar.adapters.kube.client import KubeClient
from sidecar.adapters.kube.connection import connect
from sidecar.adapters.kube.publisher import PodPublisher
from sidecar.core.publication import Publication
from tests.components import require
from tests.fixtures.kube import (
    PREFIX,
    SA,
    KubeApiServer,
    KubeEnv,
    chart_namespace,
    container_status,
    create_job,
    create_pod,
    run_kube_apiserver,
    set_status,
    terminated,
)
from tests.fixtures.kube_pod import run_pod
from tests.fixtures.s3 import REGION, SeaweedServer, run_seaweedfs

PERIOD_S = 1.0
SAMPLE_S = 0.2


class Audit:
    """The audit log's requests, read from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def skip(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since(self, user: str) -> collections.Counter[str]:
        """Requests by ``user`` since the last call, as "verb resource[/subresource]" counts."""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            lines = log.read().splitlines()
            self.offset = log.tell()
        counts: collections.Counter[str] = collections.Counter()
        for line in lines:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user:
                continue
            ref = event.get("objectRef") or {}
            what = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            counts[f"{event['verb']} {what}"] += 1
        return counts


def attempt_requests(
    env: KubeEnv, tmp: Path, audit: Audit, s3: SeaweedServer, steps: int, *, progress: bool
) -> tuple[int, int, float]:
    """One attempt of ``steps`` trainer steps of 0.1 s: (its requests, samples, seconds)."""
    user = f"system:serviceaccount:{env.namespace}:{SA}"
    audit.skip()
    started = time.monotonic()
    result = run_pod(
        env,
        tmp,
        f"soak-train-{uuid.uuid4().hex[:6]}",
        ["--steps", str(steps), "--step-s", "0.1"],
        SOAK_KUBE__PROGRESS_ANNOTATIONS_S=str(PERIOD_S if progress else 0),
        SOAK_EVIDENCE__FLUSH_S=str(PERIOD_S),
        SOAK_MONITOR__SAMPLE_INTERVAL_S=str(SAMPLE_S),
        SOAK_S3__BUCKET=s3.bucket,
        SOAK_S3__ENDPOINT_URL=s3.endpoint,
        SOAK_S3__REGION=REGION,
        SOAK_S3__ADDRESSING_STYLE="path",
        AWS_ACCESS_KEY_ID=s3.access_key,
        AWS_SECRET_ACCESS_KEY=s3.secret_key,
    )
    seconds = time.monotonic() - started
    if result["returncode"] != 0:
        raise SystemExit(f"the attempt failed ({result['returncode']}):\n{str(result['output'])[-3000:]}")
    artifact = json.loads(next((tmp / "out").rglob("artifact.json")).read_text())
    counts = audit.since(user)
    print(
        f"  {steps} steps, progress annotations {'on' if progress else 'off'}: {seconds:.1f} s, "
        f"{artifact['resource_summary']['sample_count']} samples, "
        f"{sum(counts.values())} requests: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    )
    return sum(counts.values()), int(artifact["resource_summary"]["sample_count"]), seconds


def published_job(server: KubeApiServer, env: KubeEnv, pods: int) -> str:
    """A Job whose ``pods`` pods each ended and published a verdict as the sidecar does."""
    admin = server.api_client()
    core = k8s.CoreV1Api(admin)
    job = f"scale-{uuid.uuid4().hex[:6]}"
    job_uid = create_job(admin, env.namespace, job)
    client = KubeClient(connect(kubeconfig=env.admin_kubeconfig), backoff_s=0.05)

    def one(index: int) -> None:
        name = f"{job}-{index}-{uuid.uuid4().hex[:5]}"
        pod = create_pod(core, env.namespace, name, job, job_uid)
        sidecar = container_status("soak-sidecar", terminated(0, "Completed"))
        set_status(core, env.namespace, name, {"phase": "Succeeded", "containerStatuses": [sidecar]})
        publication = Publication(
            status="passed",
            classification=None,
            reason="",
            exit_code=0,
            artifact_uri=f"s3://soak/ns/{job}/run/1-{name}/artifact.json",
            artifact_sha256="ab" * 32,
            attempt=1,
            deadline_unix=1_900_000_000.0,
        )
        outcome = PodPublisher(
            client, namespace=env.namespace, pod_name=name, pod_uid=pod.metadata.uid, prefix=PREFIX,
            termination_log=None,
        ).publish(publication)  # fmt: skip
        if outcome.errors:
            raise RuntimeError(outcome.errors)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(pods)))
    client.close()
    return job


@contextmanager
def timed() -> Iterator[list[float]]:
    took: list[float] = []
    started = time.perf_counter()
    yield took
    took.append(time.perf_counter() - started)


def verdict_cost(server: KubeApiServer, env: KubeEnv, audit: Audit, job: str, reps: int) -> None:
    core = k8s.CoreV1Api(server.api_client())
    mine, baseline, requests = [], [], collections.Counter[str]()
    for _ in range(reps):
        audit.skip()
        out = StringIO()
        with timed() as took, redirect_stdout(out):
            code = cli.main(["verdict", job, "-n", env.namespace, "--kubeconfig", str(env.admin_kubeconfig)])
        mine += took
        requests = audit.since("soak-admin")
        rows = [line for line in out.getvalue().splitlines() if job in line]
        with timed() as took:
            listed = core.list_namespaced_pod(
                env.namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
            )
        baseline += took
    print(
        f"  verdict exit {code}, {len(rows)} pod rows; requests: "
        + ", ".join(f"{k} {n}" for k, n in sorted(requests.items()))
    )
    took_s, list_s = statistics.median(mine), statistics.median(baseline)
    print(
        f"  verdict {took_s:.2f} s (median of {reps}); one LIST of the {len(listed.items)} pods "
        f"{list_s:.2f} s; ratio {took_s / list_s:.1f}x"
    )


def summarise(
    short: tuple[int, int, float], long: tuple[int, int, float], noted: tuple[int, int, float]
) -> None:
    """The periodic part (what the long attempt asked more per second), per kind, and the rest."""
    evidence_per_s = (long[0] - short[0]) / (long[2] - short[2])
    progress_per_s = (noted[0] - long[0]) / noted[2]
    fixed = short[0] - evidence_per_s * short[2]
    per_sample = (long[0] - short[0]) / max(1, long[1] - short[1])
    print(
        f"  evidence: {evidence_per_s * PERIOD_S:.2f} requests per flush; progress annotations: "
        f"{progress_per_s * PERIOD_S:.2f} per period; {per_sample:.3f} requests per sample taken "
        f"(a call per sample would be >= 1); "
        f"fixed per attempt: about {fixed:.0f}"
    )
    print(
        f"  per hour at the defaults (evidence every 300 s, progress annotations off): "
        f"{evidence_per_s * PERIOD_S * 3600 / 300:.0f} requests, plus {fixed:.0f} once per attempt; "
        f"with progress annotations every 60 s: +{progress_per_s * PERIOD_S * 60:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pods", type=int, default=1024, help="pods of the Job the verdict reads (default 1024)"
    )
    parser.add_argument("--steps", type=int, nargs=2, default=[20, 120], help="short and long attempt, steps")
    parser.add_argument("--reps", type=int, default=3, help="verdict repetitions (default 3)")
    parser.add_argument("--smoke", action="store_true", help="8 pods, attempts of 10 and 30 steps")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(pods=8, steps=[10, 30], reps=1)
        args = parser.parse_args()
    require("pidns")
    assets = require("kube-binaries")
    with tempfile.TemporaryDirectory(prefix="bench-apiserver-") as tmp:
        base = Path(tmp)
        (base / "kube").mkdir()
        audit_log = base / "audit.log"
        with (
            run_kube_apiserver(assets, base / "kube", audit_log=audit_log) as server,
            run_seaweedfs(base / "weed") as s3,
            chart_namespace(server) as env,
        ):
            audit = Audit(audit_log)
            print(f"one attempt's requests (evidence every {PERIOD_S:g} s, a sample every {SAMPLE_S:g} s):")
            short = attempt_requests(env, base / "short", audit, s3, args.steps[0], progress=False)
            long = attempt_requests(env, base / "long", audit, s3, args.steps[1], progress=False)
            noted = attempt_requests(env, base / "noted", audit, s3, args.steps[1], progress=True)
            summarise(short, long, noted)
            print(f"soak-sidecar verdict on a Job of {args.pods} pods, each with its verdict published:")
            job = published_job(server, env, args.pods)
            verdict_cost(server, env, audit, job, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
