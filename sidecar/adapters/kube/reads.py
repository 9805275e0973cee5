"""Reads: the sidecar's own pod (its identity), and a Job's pods, verdict Events and conditions as
the core's facts. The client's untyped objects stop here."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sidecar.adapters.kube.client import KubeClient
from sidecar.core.pod_facts import (
    Condition,
    ContainerFacts,
    ContainerState,
    EventFacts,
    JobFacts,
    PodFacts,
)
from sidecar.core.publication import VERDICT_EVENT_REASONS

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# The Job controller's label on its pods since Kubernetes 1.27 (the chart needs 1.31). The legacy
# bare `job-name` is not read: a pod anyone made with only that label is no pod of the Job, and
# choosing between the two let one planted pod hide the others.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LIST_PAGE = 500
MAX_PAGES = 1_000  # 500,000 pods: beyond any Job, and never a loop on a server that repeats itself


@dataclass(frozen=True)
class PodIdentity:
    """What the API says about the sidecar's pod, for the run identity and the artifact."""

    namespace: str
    name: str
    uid: str
    node_name: str | None
    trainer_image: str | None
    trainer_image_id: str | None
    trainer_image_digest: str | None
    job_name: str | None
    job_uid: str | None


def get_pod(client: KubeClient, namespace: str, name: str, trainer_container: str = "trainer") -> PodIdentity:
    """The pod's uid, node, trainer image digest (from containerStatuses) and owning Job."""
    pod = client.call(
        f"get pod {namespace}/{name}",
        lambda: client.core.read_namespaced_pod(name, namespace, _request_timeout=client.timeout),
    )
    meta = pod.metadata
    spec_image = next((c.image for c in (pod.spec.containers or []) if c.name == trainer_container), None)
    statuses = (pod.status and pod.status.container_statuses) or []
    status = next((s for s in statuses if s.name == trainer_container), None)
    image_id = status.image_id if status is not None and status.image_id else None
    digest_match = _DIGEST_RE.search(image_id) if image_id else None
    job = _owning_job(meta.owner_references or [])
    return PodIdentity(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node_name=pod.spec.node_name,
        trainer_image=spec_image,
        trainer_image_id=image_id,
        trainer_image_digest=digest_match.group(0) if digest_match else None,
        job_name=job.name if job is not None else None,
        job_uid=job.uid if job is not None else None,
    )


def wait_for_trainer_digest(
    client: KubeClient,
    namespace: str,
    name: str,
    trainer_container: str = "trainer",
    *,
    timeout_s: float = 60.0,
    poll_s: float = 2.0,
    monotonic: Callable[[], float] = time.monotonic,
) -> PodIdentity:
    """``get_pod`` until the trainer's image digest is known or ``timeout_s`` passed.

    Both containers start together and the kubelet reports imageID only with its next
    status sync, so the sidecar's first read can come too early. On timeout the last
    identity is returned with ``trainer_image_digest`` None; the caller decides.
    """
    end = monotonic() + timeout_s
    while True:
        identity = get_pod(client, namespace, name, trainer_container)
        if identity.trainer_image_digest is not None or monotonic() >= end:
            return identity
        client.sleep(min(poll_s, max(end - monotonic(), 0.0)))


def job_pods(client: KubeClient, namespace: str, job: str) -> list[PodFacts]:
    """Every pod of the Job, once each, by the Job controller's label; in pages of LIST_PAGE pods,
    as kubectl reads (a 1,024-pod Job's list is three bounded answers rather than one of every pod)."""
    return _pods_labelled(client, namespace, f"{JOB_NAME_LABEL}={job}")


def _pods_labelled(client: KubeClient, namespace: str, selector: str) -> list[PodFacts]:
    seen: dict[str, PodFacts] = {}
    token: str | None = None
    for _page in range(MAX_PAGES):
        result = client.call(
            f"list pods in {namespace} ({selector})",
            lambda token=token: client.core.list_namespaced_pod(  # type: ignore[misc]
                namespace,
                label_selector=selector,
                limit=LIST_PAGE,
                _continue=token,
                _request_timeout=client.timeout,
            ),
        )
        for pod in result.items or []:
            facts = _pod_facts(pod)
            seen.setdefault(facts.uid, facts)
        token = result.metadata._continue if result.metadata is not None else None
        if not token:
            break
    return list(seen.values())


def verdict_events(client: KubeClient, namespace: str) -> list[EventFacts]:
    """The Events of soak verdicts (reasons SoakPassed and SoakFailed) about pods."""
    found: list[EventFacts] = []
    for reason in VERDICT_EVENT_REASONS:
        selector = f"involvedObject.kind=Pod,reason={reason}"
        result = client.call(
            f"list events in {namespace} ({selector})",
            lambda selector=selector: client.core.list_namespaced_event(  # type: ignore[misc]
                namespace, field_selector=selector, _request_timeout=client.timeout
            ),
        )
        found.extend(_event_facts(event) for event in result.items or [])
    return found


def read_job(client: KubeClient, namespace: str, name: str) -> JobFacts:
    """The Job's conditions (RBAC: jobs get)."""
    job = client.call(
        f"get job {namespace}/{name}",
        lambda: client.batch.read_namespaced_job(name, namespace, _request_timeout=client.timeout),
    )
    conditions = (job.status.conditions if job.status is not None else None) or []
    return JobFacts(
        name=name,
        conditions=_conditions(conditions),
        suspended=bool(job.spec is not None and job.spec.suspend),
        deleting=job.metadata is not None and job.metadata.deletion_timestamp is not None,
    )


def read_pod(client: KubeClient, namespace: str, name: str) -> PodFacts:
    """A pod as the core's facts (its conditions, containers' states, deletion)."""
    pod = client.call(
        f"get pod {namespace}/{name}",
        lambda: client.core.read_namespaced_pod(name, namespace, _request_timeout=client.timeout),
    )
    return _pod_facts(pod)


def _conditions(conditions: list[Any] | None) -> tuple[Condition, ...]:
    return tuple(
        Condition(
            type=str(c.type),
            status=str(c.status),
            reason=c.reason,
            message=c.message,
            since=_when(getattr(c, "last_transition_time", None)),
        )
        for c in conditions or []
    )


def _owning_job(refs: list[Any]) -> Any:
    jobs = [r for r in refs if r.kind == "Job" and str(r.api_version).startswith("batch/")]
    controllers = [r for r in jobs if r.controller]
    return (controllers or jobs or [None])[0]


def _pod_facts(pod: Any) -> PodFacts:
    meta, status = pod.metadata, pod.status
    created = meta.creation_timestamp
    return PodFacts(
        name=str(meta.name),
        uid=str(meta.uid),
        annotations=dict(meta.annotations or {}),
        created=created if isinstance(created, datetime) else None,
        deleting=meta.deletion_timestamp is not None,
        phase=status.phase if status is not None else None,
        reason=status.reason if status is not None else None,
        message=status.message if status is not None else None,
        init_containers=_containers(status.init_container_statuses if status is not None else None),
        containers=_containers(status.container_statuses if status is not None else None),
        conditions=_conditions(status.conditions if status is not None else None),
        node=_node_name(pod.spec),
    )


def _node_name(spec: Any) -> str | None:
    name = getattr(spec, "node_name", None) if spec is not None else None
    return str(name) if name else None


def _containers(statuses: list[Any] | None) -> tuple[ContainerFacts, ...]:
    return tuple(
        ContainerFacts(name=str(s.name), state=_state(s.state), last_state=_state(s.last_state))
        for s in statuses or []
    )


def _state(state: Any) -> ContainerState | None:
    """A V1ContainerState: at most one of waiting, running, terminated is set."""
    if state is None:
        return None
    if state.terminated is not None:
        ended = state.terminated
        code = ended.exit_code
        return ContainerState(
            "terminated",
            ended.reason,
            ended.message,
            code if isinstance(code, int) else None,
            started_at=_when(ended.started_at),
        )
    if state.waiting is not None:
        return ContainerState("waiting", state.waiting.reason, state.waiting.message)
    if state.running is not None:
        return ContainerState("running", started_at=_when(state.running.started_at))
    return None


def _when(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


def _event_facts(event: Any) -> EventFacts:
    involved = event.involved_object
    return EventFacts(
        pod_name=involved.name if involved is not None else None,
        pod_uid=involved.uid if involved is not None else None,
        annotations=dict(event.metadata.annotations or {}),
    )
