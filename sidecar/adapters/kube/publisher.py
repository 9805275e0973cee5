"""The sidecar's verdict and progress on its own pod: annotations (a merge patch), an Event, and
the termination message."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sidecar.adapters.kube.client import KubeClient
from sidecar.adapters.kube.termination import write_termination_message
from sidecar.core.errors import ConfigError, PublishError
from sidecar.core.publication import (
    Publication,
    build_annotations,
    event_message,
    event_reason,
    event_type,
    termination_message,
)
from sidecar.core.running_annotations import (
    ProgressFigures,
    build_evidence_annotations,
    build_progress_annotations,
)
from sidecar.settings import KubeSettings

COMPONENT = "soak-sidecar"
# Event names are DNS subdomains (253); leave room for the ".<16 hex>" suffix.
_EVENT_NAME_STEM = 253 - 17


def patch_annotations(
    client: KubeClient, namespace: str, name: str, annotations: Mapping[str, str | None]
) -> None:
    """JSON merge patch of the pod's annotations (None deletes a key); other keys are kept."""
    body = {"metadata": {"annotations": dict(annotations)}}
    client.call(
        f"patch annotations of pod {namespace}/{name}",
        lambda: client.core.patch_namespaced_pod(
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=client.timeout,
        ),
    )


def create_event(
    client: KubeClient,
    namespace: str,
    pod_name: str,
    pod_uid: str,
    *,
    reason: str,
    message: str,
    type_: str = "Normal",
    container: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> str:
    """A core/v1 Event about the pod; returns its name. ``annotations``: the verdict's, so the
    Event keeps it once the pod is gone (``soak-sidecar verdict`` reads them back).

    The name is fixed before the first try, so a retry after a lost response finds the
    Event already there (409) instead of recording it twice.
    """
    now = datetime.now(timezone.utc)
    event_name = f"{pod_name[:_EVENT_NAME_STEM]}.{time.time_ns():016x}"
    body = k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(
            name=event_name, namespace=namespace, annotations=dict(annotations) if annotations else None
        ),
        involved_object=k8s.V1ObjectReference(
            api_version="v1",
            kind="Pod",
            namespace=namespace,
            name=pod_name,
            uid=pod_uid,
            field_path=f"spec.containers{{{container}}}" if container else None,
        ),
        reason=reason,
        message=message,
        type=type_,
        source=k8s.V1EventSource(component=COMPONENT),
        reporting_component=COMPONENT,
        reporting_instance=pod_name[:128],
        first_timestamp=now,
        last_timestamp=now,
        count=1,
    )

    def create() -> None:
        try:
            client.core.create_namespaced_event(namespace, body, _request_timeout=client.timeout)
        except ApiException as exc:
            if exc.status != 409:  # 409: our own earlier try got through
                raise

    client.call(f"create event for pod {namespace}/{pod_name}", create)
    return event_name


@dataclass(frozen=True)
class PublishOutcome:
    """Which channels carried the verdict; errors are kept, never raised, so all are tried."""

    termination_message: bool
    annotations: bool
    event: bool
    errors: tuple[PublishError, ...]


class PodPublisher:
    """Publishes the sidecar's verdict and (rate-limited) progress on its own pod."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        pod_name: str,
        pod_uid: str,
        prefix: str,
        termination_log: Path | None,
        publish_events: bool = True,
        container: str | None = None,
        progress_interval_s: float = 0.0,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._pod = pod_name
        self._uid = pod_uid
        self._prefix = prefix
        self._termination_log = termination_log
        self._events = publish_events
        self._container = container
        self._progress_interval_s = progress_interval_s
        self._last_progress: tuple[str, float] | None = None

    @classmethod
    def from_settings(cls, client: KubeClient, kube: KubeSettings) -> PodPublisher:
        """The sidecar's own pod as named by the downward API; ConfigError when it is not."""
        if not (kube.namespace and kube.pod_name and kube.pod_uid):
            raise ConfigError(
                "pod mode needs SOAK_KUBE__NAMESPACE, SOAK_KUBE__POD_NAME and SOAK_KUBE__POD_UID "
                "(downward API)"
            )
        return cls(
            client,
            namespace=kube.namespace,
            pod_name=kube.pod_name,
            pod_uid=kube.pod_uid,
            prefix=kube.annotation_prefix,
            termination_log=kube.termination_log,
            publish_events=kube.publish_events,
            container=kube.sidecar_container,
            progress_interval_s=kube.progress_annotations_s,
        )

    def publish(self, pub: Publication) -> PublishOutcome:
        """Termination message first (it survives an API outage), then annotations, then Event."""
        errors: list[PublishError] = []
        wrote = patched = evented = False
        if self._termination_log is not None:
            with _collect(errors):
                write_termination_message(self._termination_log, termination_message(pub))
                wrote = True
        annotations = build_annotations(pub, self._prefix)
        with _collect(errors):
            patch_annotations(self._client, self._namespace, self._pod, annotations)
            patched = True
        if self._events:
            with _collect(errors):
                create_event(
                    self._client,
                    self._namespace,
                    self._pod,
                    self._uid,
                    reason=event_reason(pub),
                    message=event_message(pub),
                    type_=event_type(pub),
                    container=self._container,
                    annotations={k: v for k, v in annotations.items() if v is not None},
                )
                evented = True
        return PublishOutcome(wrote, patched, evented, tuple(errors))

    def progress(
        self, phase: str, now_wall: float, now_monotonic: float, figures: ProgressFigures | None = None
    ) -> bool:
        """Annotate phase and heartbeat (and the trainer's rate and estimated finish, ``figures``)
        when the phase changed or the interval passed.

        Returns whether a patch was sent. Progress is advisory: a failure is swallowed so a
        flaky API never disturbs the soak (the verdict publication reports its own errors).
        """
        if self._progress_interval_s <= 0:
            return False
        last = self._last_progress
        if last is not None and last[0] == phase and now_monotonic - last[1] < self._progress_interval_s:
            return False
        self._last_progress = (phase, now_monotonic)
        try:
            annotations = build_progress_annotations(phase, now_wall, self._prefix, figures)
            patch_annotations(self._client, self._namespace, self._pod, annotations)
        except PublishError:
            return False
        return True

    def evidence(self, uri: str, at_unix: float) -> bool:
        """Annotate where the attempt's evidence is and when it last reached the store: what
        ``soak-sidecar verdict`` shows of an attempt whose sidecar never published a verdict.
        Advisory like progress: a failure is swallowed."""
        try:
            patch_annotations(
                self._client,
                self._namespace,
                self._pod,
                build_evidence_annotations(uri, at_unix, self._prefix),
            )
        except PublishError:
            return False
        return True


@contextmanager
def _collect(errors: list[PublishError]) -> Iterator[None]:
    try:
        yield
    except PublishError as exc:
        errors.append(exc)
