"""What the Kubernetes API says about a soak Job's pods, its verdict Events and the Job itself.

Pure records: the kube adapter builds them from the client's objects, so the decisions of
:mod:`sidecar.core.job_pods` run on hand-built facts as well as on a real apiserver's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

StateKind = Literal["waiting", "running", "terminated"]


@dataclass(frozen=True)
class Condition:
    """A status condition of a pod or a Job."""

    type: str
    # "True", "False" or "Unknown", as the API says it.
    status: str
    reason: str | None = None
    message: str | None = None
    # When it last changed (the API server's clock).
    since: datetime | None = None


JobCondition = Condition


@dataclass(frozen=True)
class ContainerState:
    """One of a container's states; ``exit_code`` only for ``terminated``."""

    kind: StateKind
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    # When the container started (running, or terminated after running), as the kubelet says.
    started_at: datetime | None = None


@dataclass(frozen=True)
class ContainerFacts:
    name: str
    # None: the kubelet reports no state (yet).
    state: ContainerState | None = None
    # The previous run of a restarted container, as the kubelet keeps it.
    last_state: ContainerState | None = None


@dataclass(frozen=True)
class PodFacts:
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: datetime | None = None
    # The pod has a deletion timestamp: it is going away.
    deleting: bool = False
    phase: str | None = None
    # The pod's own reason and message (Evicted, ...).
    reason: str | None = None
    message: str | None = None
    init_containers: tuple[ContainerFacts, ...] = ()
    containers: tuple[ContainerFacts, ...] = ()
    # The pod's status conditions (DisruptionTarget says why a pod is being stopped).
    conditions: tuple[Condition, ...] = ()
    # The node the pod was scheduled to (spec.nodeName), None before it was.
    node: str | None = None

    def container(self, name: str) -> ContainerFacts | None:
        return next((c for c in self.containers if c.name == name), None)

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


@dataclass(frozen=True)
class EventFacts:
    """A verdict Event: the pod it is about (None when it names none) and its annotations."""

    pod_name: str | None
    pod_uid: str | None
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobFacts:
    name: str
    conditions: tuple[JobCondition, ...] = ()
    # spec.suspend: the Job is (being) suspended, its pods stopped.
    suspended: bool = False
    # The Job has a deletion timestamp.
    deleting: bool = False


@dataclass(frozen=True)
class PodMoments:
    """When the pod was created, scheduled and had all its containers started (Unix seconds; the
    API server's and the kubelet's clocks); None where the pod does not say."""

    created: float | None
    scheduled: float | None
    containers_started: float | None


def pod_moments(pod: PodFacts) -> PodMoments:
    scheduled = pod.condition("PodScheduled")
    starts = [c.state.started_at for c in pod.containers if c.state is not None]
    every_started = bool(starts) and all(start is not None for start in starts)
    return PodMoments(
        created=None if pod.created is None else pod.created.timestamp(),
        scheduled=scheduled.since.timestamp()
        if scheduled is not None and scheduled.status == "True" and scheduled.since is not None
        else None,
        containers_started=max(s.timestamp() for s in starts if s is not None) if every_started else None,
    )
