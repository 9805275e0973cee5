"""Kubernetes API adapter: the sidecar's pod, its annotations and Events, the termination message.

Every kubernetes/urllib3 error is translated into :class:`sidecar.core.errors.PublishError`
(:class:`sidecar.core.errors.ForbiddenError` for 403) at this boundary. The sidecar's service account
needs only ``pods get/patch`` and ``events create`` in its own namespace (docs/rbac.md).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from sidecar.adapters.fsutil import write_fsync
from sidecar.core.boot import ReferenceTime
from sidecar.core.errors import ConfigError, ForbiddenError, PublishError, RefusedError, TransientError
from sidecar.core.publication import (
    MAX_TERMINATION_MESSAGE_BYTES,
    VERDICT_EVENT_REASONS,
    Publication,
    build_annotations,
    build_progress_annotations,
    event_message,
    event_reason,
    event_type,
    termination_message,
    truncate_utf8,
)
from sidecar.settings import KubeSettings

T = TypeVar("T")

COMPONENT = "soak-sidecar"
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_RETRYABLE_STATUS = frozenset({409, 429})
_MAX_BACKOFF_S = 8.0
# Event names are DNS subdomains (253); leave room for the ".<16 hex>" suffix.
_EVENT_NAME_STEM = 253 - 17
_SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


def connect(
    *,
    kubeconfig: Path | None = None,
    host: str | None = None,
    token: str | None = None,
    ca_file: Path | None = None,
    prefer_in_cluster: bool = True,
) -> k8s.ApiClient:
    """An ApiClient from, in order: an explicit host+token, ``kubeconfig``, then the environment.

    Without either, ``prefer_in_cluster`` tries the pod's service account first (the sidecar)
    and the default kubeconfig second; otherwise the other way round (the verdict CLI).
    In-cluster tokens are re-read as the kubelet rotates them.
    """
    cfg = k8s.Configuration()
    try:
        if host is not None:
            if token is None:
                raise ConfigError("an explicit API host needs a token")
            cfg.host = host
            # The key's name changed in client 36 ("authorization" -> "BearerToken"), and the
            # prefix is looked up under the new name only: set the whole header value under both.
            cfg.api_key = {"authorization": f"Bearer {token}", "BearerToken": f"Bearer {token}"}
            if ca_file is not None:
                cfg.ssl_ca_cert = str(ca_file)
        elif kubeconfig is not None:
            k8s_config.load_kube_config(
                config_file=str(kubeconfig), client_configuration=cfg, persist_config=False
            )
        else:
            loaders: list[Callable[[], None]] = [
                lambda: k8s_config.load_incluster_config(client_configuration=cfg),
                lambda: k8s_config.load_kube_config(client_configuration=cfg, persist_config=False),
            ]
            if not prefer_in_cluster:
                loaders.reverse()
            _first_that_loads(loaders)
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"no usable Kubernetes configuration: {exc}") from exc
    # Our own retry loop decides about retries; urllib3's hidden ones would multiply it.
    cfg.retries = 0
    return k8s.ApiClient(cfg)


def default_namespace(kubeconfig: Path | None = None) -> str:
    """The kubeconfig context's namespace, else the pod's own (in-cluster), else ``default``."""
    try:
        _, context = k8s_config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
        namespace = (context.get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    except (ConfigException, OSError, ValueError, TypeError):
        pass
    try:
        return Path(_SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _first_that_loads(loaders: list[Callable[[], None]]) -> None:
    errors: list[str] = []
    for load in loaders:
        try:
            load()
            return
        except (ConfigException, OSError, ValueError) as exc:
            errors.append(str(exc))
    raise ConfigException("; ".join(errors))


class KubeClient:
    """The few API calls soak-sidecar makes, retried with backoff on 409/429/5xx/network errors."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        retries: int = 5,
        backoff_s: float = 0.5,
        request_timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._retries = retries
        self._backoff_s = backoff_s
        self._timeout = request_timeout_s
        self._sleep = sleep

    @classmethod
    def from_settings(cls, kube: KubeSettings) -> KubeClient:
        """In-cluster service account unless ``kube.kubeconfig`` is set; retries as configured."""
        return cls(
            connect(kubeconfig=kube.kubeconfig),
            retries=kube.api_retries,
            backoff_s=kube.api_backoff_s,
            request_timeout_s=kube.request_timeout_s,
        )

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_pod(self, namespace: str, name: str, trainer_container: str = "trainer") -> PodIdentity:
        """The pod's uid, node, trainer image digest (from containerStatuses) and owning Job."""
        pod = self.read_pod(namespace, name)
        meta = pod.metadata
        spec_image = next((c.image for c in (pod.spec.containers or []) if c.name == trainer_container), None)
        status = next(
            (
                s
                for s in ((pod.status and pod.status.container_statuses) or [])
                if s.name == trainer_container
            ),
            None,
        )
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
        self,
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
            identity = self.get_pod(namespace, name, trainer_container)
            if identity.trainer_image_digest is not None or monotonic() >= end:
                return identity
            self._sleep(min(poll_s, max(end - monotonic(), 0.0)))

    def read_pod(self, namespace: str, name: str) -> Any:
        """The raw V1Pod."""
        return self._call(
            f"get pod {namespace}/{name}",
            lambda: self._core.read_namespaced_pod(name, namespace, _request_timeout=self._timeout),
        )

    def server_time(self) -> float:
        """The apiserver's clock now (epoch seconds), from the Date header of a GET /version (readable
        by every authenticated client). Date names a whole second: the middle of it is returned."""

        def request() -> Any:
            version = k8s.VersionApi(self._api)
            return version.get_code_with_http_info(_request_timeout=self._timeout)[2].get("Date")

        date = self._call("read the apiserver's time", request)
        try:
            when = parsedate_to_datetime(date)
        except (TypeError, ValueError) as exc:
            raise PublishError(f"read the apiserver's time: unusable Date header {date!r}") from exc
        if when.tzinfo is None:
            raise PublishError(f"read the apiserver's time: Date header {date!r} names no time zone")
        return when.timestamp() + 0.5

    def job_finished(self, namespace: str, name: str) -> bool:
        """Whether the Job has ended (a Complete or Failed condition): no retry will follow."""
        return self.job_condition(namespace, name) is not None

    def job_condition(self, namespace: str, name: str) -> str | None:
        """The Job's ``Complete`` or ``Failed`` condition, None while it has neither."""
        job = self._call(
            f"get job {namespace}/{name}",
            lambda: k8s.BatchV1Api(self._api).read_namespaced_job(
                name, namespace, _request_timeout=self._timeout
            ),
        )
        conditions = (job.status.conditions if job.status is not None else None) or []
        ended = [c.type for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"]
        return str(ended[0]) if ended else None

    def job_failure(self, namespace: str, name: str) -> str | None:
        """Why the Job failed or is failing (its ``FailureTarget`` or ``Failed`` condition: reason and
        message), None while it is not."""
        job = self._call(
            f"get job {namespace}/{name}",
            lambda: k8s.BatchV1Api(self._api).read_namespaced_job(
                name, namespace, _request_timeout=self._timeout
            ),
        )
        conditions = (job.status.conditions if job.status is not None else None) or []
        for condition in conditions:
            if condition.type in ("FailureTarget", "Failed") and condition.status == "True":
                return f"{condition.reason or condition.type}: {condition.message or 'no message'}"
        return None

    def list_verdict_events(self, namespace: str) -> list[Any]:
        """Raw CoreV1Events of soak verdicts (reasons SoakPassed and SoakFailed) about pods."""
        found: list[Any] = []
        for reason in VERDICT_EVENT_REASONS:
            selector = f"involvedObject.kind=Pod,reason={reason}"
            result = self._call(
                f"list events in {namespace} ({selector})",
                lambda selector=selector: self._core.list_namespaced_event(  # type: ignore[misc]
                    namespace, field_selector=selector, _request_timeout=self._timeout
                ),
            )
            found.extend(result.items or [])
        return found

    def list_pods(self, namespace: str, label_selector: str) -> list[Any]:
        """Raw V1Pods matching ``label_selector``."""
        result = self._call(
            f"list pods in {namespace} ({label_selector})",
            lambda: self._core.list_namespaced_pod(
                namespace, label_selector=label_selector, _request_timeout=self._timeout
            ),
        )
        return list(result.items or [])

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """JSON merge patch of the pod's annotations (None deletes a key); other keys are kept."""
        body = {"metadata": {"annotations": dict(annotations)}}
        self._call(
            f"patch annotations of pod {namespace}/{name}",
            lambda: self._core.patch_namespaced_pod(
                name,
                namespace,
                body,
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            ),
        )

    def create_event(
        self,
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
                self._core.create_namespaced_event(namespace, body, _request_timeout=self._timeout)
            except ApiException as exc:
                if exc.status != 409:  # 409: our own earlier try got through
                    raise

        self._call(f"create event for pod {namespace}/{pod_name}", create)
        return event_name

    def _call(self, what: str, request: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                return request()
            except ApiException as exc:
                if exc.status == 403:
                    raise ForbiddenError(f"{what}: forbidden: {_api_message(exc)}") from exc
                if not _retryable(exc.status) or attempt >= self._retries:
                    raise PublishError(
                        f"{what}: HTTP {exc.status}: {_api_message(exc)}"
                        + (f" (after {attempt + 1} tries)" if attempt else "")
                    ) from exc
                delay = _retry_after(exc) or self._backoff(attempt)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt >= self._retries:
                    raise PublishError(f"{what}: API unreachable after {attempt + 1} tries: {exc}") from exc
                delay = self._backoff(attempt)
            except ValueError as exc:
                # The client's model classes reject a response they cannot represent.
                raise PublishError(f"{what}: unexpected API response: {exc}") from exc
            attempt += 1
            self._sleep(delay)

    def _backoff(self, attempt: int) -> float:
        # Full jitter: pods of one Job that finish together do not retry in lockstep.
        ceiling = min(self._backoff_s * 2**attempt, _MAX_BACKOFF_S)
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not security


def _retryable(status: int | None) -> bool:
    return status is None or status in _RETRYABLE_STATUS or status >= 500


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After")
    try:
        return min(float(value), _MAX_BACKOFF_S) if value is not None else None
    except ValueError:
        return None


def _api_message(exc: ApiException) -> str:
    # The Status body says why (RBAC rule, validation); fall back to the HTTP reason.
    return truncate_utf8(str(exc.body or exc.reason or "").strip(), 512)


def _owning_job(refs: list[Any]) -> Any:
    jobs = [r for r in refs if r.kind == "Job" and str(r.api_version).startswith("batch/")]
    controllers = [r for r in jobs if r.controller]
    return (controllers or jobs or [None])[0]


class ApiserverClock:
    """The ReferenceClock port over the apiserver's clock: the deadline record is stamped with it, and
    every attempt reads it again, so a pod on a node whose clock is wrong cannot gain time."""

    source = "the Kubernetes apiserver's clock (Date)"

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def now(self) -> ReferenceTime:
        try:
            return ReferenceTime(source=self.source, unix=self._client.server_time())
        except ForbiddenError as exc:
            raise RefusedError(
                f"cannot read the Kubernetes apiserver's clock for the deadline: {exc}"
            ) from exc
        except PublishError as exc:
            raise TransientError(
                f"cannot read the Kubernetes apiserver's clock for the deadline: {exc}"
            ) from exc


def write_termination_message(path: Path, text: str) -> None:
    """Write the container's termination message (<= 4096 bytes); needs no API server.

    The kubelet mounts the file, so it is written in place rather than renamed over.
    """
    data = truncate_utf8(text, MAX_TERMINATION_MESSAGE_BYTES).encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_fsync(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PublishError(f"cannot write termination message {path}: {exc}") from exc


@dataclass(frozen=True)
class PublishOutcome:
    """Which channels carried the verdict; errors are kept, never raised, so all are tried."""

    termination_message: bool
    annotations: bool
    event: bool
    errors: tuple[PublishError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


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
            self._client.patch_annotations(self._namespace, self._pod, annotations)
            patched = True
        if self._events:
            with _collect(errors):
                self._client.create_event(
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

    def progress(self, phase: str, now_wall: float, now_monotonic: float) -> bool:
        """Annotate phase and heartbeat when the phase changed or the interval passed.

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
            annotations = build_progress_annotations(phase, now_wall, self._prefix)
            self._client.patch_annotations(self._namespace, self._pod, annotations)
        except PublishError:
            return False
        return True


@contextmanager
def _collect(errors: list[PublishError]) -> Iterator[None]:
    try:
        yield
    except PublishError as exc:
        errors.append(exc)
