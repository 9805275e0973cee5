"""The retrying client every Kubernetes call goes through: backoff on 409/429/5xx/network errors,
and each error translated into the core's (ForbiddenError for 403, else PublishError)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sidecar.adapters.kube.connection import connect
from sidecar.core.errors import ForbiddenError, NotFoundError, PublishError
from sidecar.core.publication import truncate_utf8
from sidecar.settings import KubeSettings

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({409, 429})
_MAX_BACKOFF_S = 8.0


class KubeClient:
    """The API groups soak-sidecar uses, and :meth:`call`, which every request goes through."""

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
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.version = k8s.VersionApi(api_client)
        self.timeout = request_timeout_s
        # Also how the reads that poll wait: one injected sleep for retries and polls.
        self.sleep = sleep
        self._retries = retries
        self._backoff_s = backoff_s

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

    def call(self, what: str, request: Callable[[], T]) -> T:
        """``request()``, retried; ``what`` names it in the error."""
        attempt = 0
        while True:
            try:
                return request()
            except ApiException as exc:
                if exc.status == 403:
                    raise ForbiddenError(f"{what}: forbidden: {_api_message(exc)}") from exc
                if exc.status == 404:
                    raise NotFoundError(f"{what}: not found (HTTP 404): {_api_message(exc)}") from exc
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
            self.sleep(delay)

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
