"""``soak-sidecar verdict JOB``: the verdict of every attempt of a soak Job, read from its pods.

Sources, best first: the pod's annotations, else the sidecar container's termination message
(written even when the API was unreachable). A pod with neither says why: still running, the
sidecar crashed (its exit code), evicted or deleted. Exit 0 only when the latest attempt passed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sidecar.adapters.kube import KubeClient, connect, default_namespace
from sidecar.core.errors import SoakError
from sidecar.core.job_verdict import AttemptOutcome, job_verdict
from sidecar.core.publication import (
    DEFAULT_PREFIX,
    Publication,
    normalize_prefix,
    parse_annotations,
    parse_termination_message,
    sanitize,
)

# Kubernetes >= 1.27 labels Job pods with the prefixed key; older clusters only with the bare one.
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
REASON_COLUMN = 60
NOT_PASSED = 1
WAIT_POLL_S = 2.0  # how often --wait reads the Job


@dataclass(frozen=True)
class AttemptRow:
    attempt: int
    pod: str
    # The pod's index in a multi-pod soak (an Indexed Job), None for a single-pod soak.
    index: int | None
    phase: str
    verdict: str | None
    classification: str | None
    exit_code: int | None
    reason: str
    artifact: str | None
    artifact_sha256: str | None
    source: str | None
    created: str | None
    # What the kubelet recorded for the sidecar container: the check on what the pod says of itself.
    sidecar_exit_code: int | None = None
    indexes: int | None = None

    @property
    def passed(self) -> bool:
        """Published as passed, and confirmed: the sidecar container exited 0."""
        return self.verdict == "passed" and self.exit_code == 0 and self.sidecar_exit_code == 0


EPILOG = (
    "exit codes: 0 the latest attempt passed (a multi-pod soak: every index's latest attempt "
    "passed and the Job is Complete, which needs jobs get); 1 it failed, has no verdict yet, or the "
    "Job has no pods; 15 the API refused (RBAC: needs pods list; events list shows the attempts "
    "whose pods are gone); 64 bad kubeconfig or arguments; "
    "151 the API was unreachable"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("job", metavar="JOB", help="name of the soak Job")
    parser.add_argument("-n", "--namespace", default=None, help="namespace (default: kubeconfig's)")
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="format (default table)"
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file")
    parser.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"annotation prefix (default {DEFAULT_PREFIX})"
    )
    parser.add_argument("--sidecar-container", default="soak-sidecar", help="sidecar container name")
    parser.add_argument(
        "--wait",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the Job to end, passed or failed (needs jobs get); default 0",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _wait_for_job(client: KubeClient, namespace: str, job: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not client.job_finished(namespace, job):
        if time.monotonic() >= deadline:
            print(
                f"soak-sidecar verdict: Job {namespace}/{job} still running after {timeout_s:g} s",
                file=sys.stderr,
            )
            return
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


def run(args: argparse.Namespace) -> int:
    try:
        prefix = normalize_prefix(args.prefix)
        api = connect(kubeconfig=args.kubeconfig, prefer_in_cluster=False)
        namespace = args.namespace or default_namespace(args.kubeconfig)
        with KubeClient(api, retries=2, backoff_s=0.5) as client:
            if args.wait:
                _wait_for_job(client, namespace, args.job, args.wait)
            pods = job_pods(client, namespace, args.job)
            events = _verdict_events(client, namespace)
    except SoakError as exc:
        print(f"soak-sidecar verdict: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    rows = attempt_rows(pods, prefix=prefix, sidecar_container=args.sidecar_container)
    rows = sorted(
        rows + gone_rows(events, pods, job=args.job, prefix=prefix),
        key=lambda r: (-1 if r.index is None else r.index, r.attempt),
    )
    job = job_verdict(
        [AttemptOutcome(r.index, r.attempt, r.passed, r.indexes) for r in rows],
        job_condition=_job_condition(args, namespace) if any(r.index is not None for r in rows) else None,
    )
    if args.output == "json":
        print(
            json.dumps(
                {
                    "job": args.job,
                    "namespace": namespace,
                    "passed": job.passed,
                    "reason": job.reason,
                    "attempts": [asdict(r) for r in rows],
                },
                indent=2,
            )
        )
    elif rows:
        print(render_table(rows))
        print(f"job: {'PASSED' if job.passed else 'NOT PASSED'}: {job.reason}")
    if not rows:
        print(f"soak-sidecar verdict: no pods of Job {namespace}/{args.job}", file=sys.stderr)
    return 0 if job.passed else NOT_PASSED


def _job_condition(args: argparse.Namespace, namespace: str) -> str | None:
    """The Job's end condition, which a multi-pod soak's pass needs (RBAC: jobs get)."""
    try:
        api = connect(kubeconfig=args.kubeconfig, prefer_in_cluster=False)
        with KubeClient(api, retries=2, backoff_s=0.5) as client:
            return client.job_condition(namespace, args.job)
    except SoakError as exc:
        print(f"soak-sidecar verdict: cannot read Job {namespace}/{args.job}: {exc}", file=sys.stderr)
        return None


def _verdict_events(client: KubeClient, namespace: str) -> list[Any]:
    """The verdict Events of the namespace; none (with a note) when they cannot be listed."""
    try:
        return client.list_verdict_events(namespace)
    except SoakError as exc:
        print(f"soak-sidecar verdict: pods already gone are not shown: {exc}", file=sys.stderr)
        return []


def gone_rows(events: Sequence[Any], pods: Sequence[Any], *, job: str, prefix: str) -> list[AttemptRow]:
    """Attempts whose pod is gone (the Job controller deletes the pods it stops when the Job fails),
    from the verdict Event each sidecar posted with its verdict as annotations. Never counted as
    passed: no kubelet record confirms them."""
    present = {pod.metadata.uid for pod in pods}
    # Pods of Job <job>: <job>-<5 chars>, or <job>-<index>-<5 chars> in an Indexed Job.
    named = re.compile(rf"{re.escape(job)}-(?:[0-9]+-)?[a-z0-9]{{5}}")
    latest: dict[str, tuple[Any, Publication]] = {}
    for event in events:
        involved = event.involved_object
        pub = parse_annotations(event.metadata.annotations, prefix)
        ours = involved is not None and named.fullmatch(involved.name or "") is not None
        if pub is None or not ours or involved.uid in present:
            continue
        latest[involved.uid] = (event, pub)
    rows = []
    for event, pub in latest.values():
        published = sanitize(pub.reason, 2048)
        rows.append(
            AttemptRow(
                attempt=pub.attempt or 1,
                pod=sanitize(event.involved_object.name, 2048),
                index=pub.index,
                indexes=pub.indexes,
                phase="Gone",
                verdict=sanitize(pub.status, 256),
                classification=_shown(pub.classification),
                exit_code=pub.exit_code,
                reason=f"{published}; the pod is gone: as its verdict Event records it",
                artifact=_shown(pub.artifact_uri),
                artifact_sha256=_shown(pub.artifact_sha256),
                source="event",
                created=None,
            )
        )
    return rows


def job_pods(client: KubeClient, namespace: str, job: str) -> list[Any]:
    """Every pod carrying either job-name label, once each."""
    seen: dict[str, Any] = {}
    for label in JOB_NAME_LABELS:
        for pod in client.list_pods(namespace, f"{label}={job}"):
            seen.setdefault(pod.metadata.uid, pod)
    return list(seen.values())


def attempt_rows(pods: Sequence[Any], *, prefix: str, sidecar_container: str) -> list[AttemptRow]:
    """One row per pod, by index then oldest first; attempt is the published one, else one more
    than the last of the same index."""
    found = [(pod, _index_of(pod), *_verdict_of(pod, prefix, sidecar_container)) for pod in pods]
    found.sort(key=lambda f: (-1 if f[1] is None else f[1], _created(f[0]), f[0].metadata.name))
    rows: list[AttemptRow] = []
    for pod, index, pub, source, why in found:
        created = _created(pod)
        kubelet = _sidecar_exit_code(pod, sidecar_container)
        verdict, reason = _confirmed(pub, kubelet, sidecar_container, why)
        previous = rows[-1] if rows and rows[-1].index == index else None
        rows.append(
            AttemptRow(
                attempt=pub.attempt
                if pub is not None and pub.attempt is not None
                else (previous.attempt + 1 if previous else 1),
                pod=sanitize(pod.metadata.name, 2048),
                index=index,
                indexes=pub.indexes if pub is not None else None,
                phase=sanitize(_phase(pod), 2048),
                verdict=verdict,
                classification=_shown(pub.classification if pub is not None else None),
                exit_code=pub.exit_code if pub is not None else None,
                reason=sanitize(reason, 2048),
                artifact=_shown(pub.artifact_uri if pub is not None else None),
                artifact_sha256=_shown(pub.artifact_sha256 if pub is not None else None),
                source=source,
                created=created.isoformat() if created != _EPOCH else None,
                sidecar_exit_code=kubelet,
            )
        )
    return rows


# Set by the Job controller on every pod of an Indexed Job.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def _index_of(pod: Any) -> int | None:
    """The pod's completion index (the Job controller's annotation); None for a non-indexed Job."""
    text = (pod.metadata.annotations or {}).get(COMPLETION_INDEX_ANNOTATION)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _shown(text: str | None) -> str | None:
    """Every column as a terminal may show it: no escape sequences or control characters."""
    return None if text is None else sanitize(text, 2048)


def _confirmed(
    pub: Publication | None, kubelet: int | None, container: str, why: str
) -> tuple[str | None, str]:
    """(verdict, reason): the published verdict when the kubelet's record of the sidecar's exit
    agrees; a pod can say anything of itself in its annotations, not what the kubelet recorded."""
    if pub is None:
        return None, why
    status, published = sanitize(pub.status, 256), sanitize(pub.reason, 2048)
    if kubelet is None:
        note = f"{published}; " if published else ""
        return status, f"{note}not confirmed yet: the kubelet has recorded no exit for {container}"
    if kubelet != pub.exit_code:
        return "mismatch", (
            f"the pod's annotations say {status} (exit {pub.exit_code}) but the kubelet recorded "
            f"exit {kubelet} for {container}: not trusted"
        )
    return status, published


def _sidecar_exit_code(pod: Any, container: str) -> int | None:
    status = pod.status
    statuses = (status.container_statuses if status is not None else None) or []
    terminated = _terminated(next((s for s in statuses if s.name == container), None))
    code = None if terminated is None else terminated.exit_code
    return code if isinstance(code, int) else None


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _created(pod: Any) -> datetime:
    stamp = pod.metadata.creation_timestamp
    return stamp if isinstance(stamp, datetime) else _EPOCH


def _phase(pod: Any) -> str:
    status = pod.status
    phase = (status.phase if status is not None else None) or "Unknown"
    if pod.metadata.deletion_timestamp is not None:
        return f"{phase} (deleting)"
    return str(phase)


def _verdict_of(pod: Any, prefix: str, sidecar_container: str) -> tuple[Publication | None, str | None, str]:
    """(verdict, where it came from, why there is none)."""
    pub = parse_annotations(pod.metadata.annotations, prefix)
    if pub is not None:
        return pub, "annotations", ""
    status = pod.status
    sidecar = next(
        (
            s
            for s in ((status.container_statuses if status is not None else None) or [])
            if s.name == sidecar_container
        ),
        None,
    )
    terminated = _terminated(sidecar)
    if terminated is not None:
        pub = parse_termination_message(terminated.message)
        if pub is not None:
            return pub, "termination-message", ""
    why = _why_no_verdict(pod, sidecar, terminated)
    launcher = _launcher_message(status)
    return None, None, f"{why}; {launcher}" if launcher else why


def _launcher_message(status: Any) -> str | None:
    """The launcher's own termination message (why it stopped the trainer: heartbeat lost, ...)."""
    for container in (status.container_statuses if status is not None else None) or []:
        terminated = _terminated(container)
        message = (terminated.message or "").strip() if terminated is not None else ""
        if message.startswith("soak-launcher: "):
            return message
    return None


def _terminated(container_status: Any) -> Any:
    if container_status is None:
        return None
    # A restarted sidecar's previous run counts: its exit is why there is no verdict yet.
    for state in (container_status.state, container_status.last_state):
        if state is not None and state.terminated is not None:
            return state.terminated
    return None


def _why_no_verdict(pod: Any, sidecar: Any, terminated: Any) -> str:
    return _ended_without_verdict(pod, terminated) or _not_done_yet(pod.status, sidecar)


def _ended_without_verdict(pod: Any, terminated: Any) -> str | None:
    """Why a pod or sidecar that ended (evicted, deleted, exited, finished) left no verdict."""
    status = pod.status
    phase = status.phase if status is not None else None
    pod_reason = status.reason if status is not None else None
    pod_message = (status.message if status is not None else None) or ""
    if pod_reason == "Evicted":
        return f"evicted: {pod_message}".rstrip(": ")
    if pod.metadata.deletion_timestamp is not None:
        return "pod deleted before the sidecar published a verdict"
    if terminated is not None:
        detail = f", {terminated.reason}" if terminated.reason else ""
        said = (terminated.message or "").strip()
        said = f": {said}" if said else ""
        return f"sidecar container terminated without a verdict (exit {terminated.exit_code}{detail}){said}"
    if phase in ("Failed", "Succeeded"):
        detail = f": {pod_reason or ''} {pod_message}".rstrip(": ")
        return f"pod {phase.lower()} without a verdict{detail}"
    return None


def _not_done_yet(status: Any, sidecar: Any) -> str:
    if status is not None and status.phase == "Pending":
        stuck = _waiting(status)
        return f"pending: {stuck}" if stuck else "pending: not running yet"
    if sidecar is not None and sidecar.state is not None and sidecar.state.waiting is not None:
        return f"sidecar waiting: {sidecar.state.waiting.reason or 'unknown'}"
    return "still running"


def _waiting(status: Any) -> str:
    """Why containers wait (ImagePullBackOff, CreateContainerConfigError, ...), with the kubelet's words."""
    statuses = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    found = []
    for container in statuses:
        waiting = container.state.waiting if container.state is not None else None
        if waiting is not None and waiting.reason not in (None, "PodInitializing", "ContainerCreating"):
            found.append(
                f"{container.name} {waiting.reason}" + (f" ({waiting.message})" if waiting.message else "")
            )
    return "; ".join(found)


COLUMNS = ("ATTEMPT", "POD", "PHASE", "VERDICT", "CLASSIFICATION", "EXIT", "REASON", "ARTIFACT")


def render_table(rows: Sequence[AttemptRow]) -> str:
    """The attempts, one row each; an INDEX column for a multi-pod soak."""
    indexed = any(r.index is not None for r in rows)
    header: tuple[str, ...] = COLUMNS
    body: list[tuple[str, ...]] = [
        (
            str(r.attempt),
            r.pod,
            r.phase,
            r.verdict or "-",
            r.classification or "-",
            "-" if r.exit_code is None else str(r.exit_code),
            _clip(r.reason or "-", REASON_COLUMN),
            r.artifact or "-",
        )
        for r in rows
    ]
    if indexed:
        header = ("INDEX", *header)
        body = [("-" if r.index is None else str(r.index), *line) for r, line in zip(rows, body, strict=True)]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (header, *body)
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"
