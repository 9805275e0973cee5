"""A pod's own moments (pure): created, scheduled, every container started."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sidecar.core.pod_facts import (
    Condition,
    ContainerFacts,
    ContainerState,
    PodFacts,
    PodMoments,
    pod_moments,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_created_scheduled_and_the_last_container_started() -> None:
    pod = PodFacts(
        "p",
        "u",
        created=T0,
        conditions=(Condition("PodScheduled", "True", since=at(2)),),
        containers=(
            ContainerFacts("trainer", ContainerState("running", started_at=at(20))),
            ContainerFacts("soak-sidecar", ContainerState("terminated", exit_code=0, started_at=at(12))),
        ),
    )
    assert pod_moments(pod) == PodMoments(T0.timestamp(), at(2).timestamp(), at(20).timestamp())


def test_what_the_pod_does_not_say_is_unknown() -> None:
    pending = PodFacts(
        "p",
        "u",
        conditions=(Condition("PodScheduled", "False", "Unschedulable", since=at(2)),),
        containers=(
            ContainerFacts("trainer", ContainerState("waiting", "ContainerCreating")),
            ContainerFacts("soak-sidecar", ContainerState("running", started_at=at(12))),
        ),
    )
    assert pod_moments(pending) == PodMoments(None, None, None)
    assert pod_moments(PodFacts("p", "u")) == PodMoments(None, None, None)
