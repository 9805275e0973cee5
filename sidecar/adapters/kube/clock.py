"""The apiserver's clock, which a deadline is measured against in pod mode."""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any

from sidecar.adapters.kube.client import KubeClient
from sidecar.core.boot import ReferenceTime
from sidecar.core.errors import ForbiddenError, PublishError, RefusedError, TransientError


def server_time(client: KubeClient) -> float:
    """The apiserver's clock now (epoch seconds), from the Date header of a GET /version (readable
    by every authenticated client). Date names a whole second: the middle of it is returned."""

    def request() -> Any:
        return client.version.get_code_with_http_info(_request_timeout=client.timeout)[2].get("Date")

    date = client.call("read the apiserver's time", request)
    try:
        when = parsedate_to_datetime(date)
    except (TypeError, ValueError) as exc:
        raise PublishError(f"read the apiserver's time: unusable Date header {date!r}") from exc
    if when.tzinfo is None:
        raise PublishError(f"read the apiserver's time: Date header {date!r} names no time zone")
    return when.timestamp() + 0.5


class ApiserverClock:
    """The ReferenceClock port over the apiserver's clock: the deadline record is stamped with it, and
    every attempt reads it again, so a pod on a node whose clock is wrong cannot gain time."""

    source = "the Kubernetes apiserver's clock (Date)"

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def now(self) -> ReferenceTime:
        try:
            return ReferenceTime(source=self.source, unix=server_time(self._client))
        except ForbiddenError as exc:
            raise RefusedError(
                f"cannot read the Kubernetes apiserver's clock for the deadline: {exc}"
            ) from exc
        except PublishError as exc:
            raise TransientError(
                f"cannot read the Kubernetes apiserver's clock for the deadline: {exc}"
            ) from exc
