"""A stop from outside (Ctrl-C, SIGTERM, an eviction, a deleted Job) while the trainer runs: its
cause, and the soft stop first so the trainer can checkpoint and keep its evidence."""

from __future__ import annotations

import sys

from sidecar.app.evidence import EvidenceTrail
from sidecar.app.ports import Ports
from sidecar.app.session import LaunchSession
from sidecar.app.signals import Cancelled, DeferredSignals
from sidecar.app.values import Going
from sidecar.core.classification import Finding
from sidecar.core.disruption import INTERRUPTED_REASON, StopEvidence, cause_of_stop, decisive_cause
from sidecar.core.monitor_policy import MonitorPolicy

CAUSE_POLL_S = 0.5


def cancellation(ports: Ports, signal: str | None) -> Finding:
    """Why the sidecar was stopped (sidecar.core.disruption): in a pod, what the pod and its Job
    say, asked until a decisive cause shows or ``cause_wait_s`` passed; else the signal."""
    status = ports.pod_status
    if status is None:
        return cause_of_stop(StopEvidence(signal))
    end = ports.clock.monotonic() + status.cause_wait_s
    while True:
        evidence = status.stop_evidence(signal)
        if decisive_cause(evidence) is not None or ports.clock.monotonic() >= end:
            return cause_of_stop(evidence)
        ports.sleep(CAUSE_POLL_S)


def stop_signal(stop: BaseException) -> str:
    """The signal behind a KeyboardInterrupt (SIGINT) or a Cancelled."""
    return str(stop) if isinstance(stop, Cancelled) else "SIGINT"


def stop_on_cancellation(
    going: Going,
    session: LaunchSession,
    policy: MonitorPolicy,
    signals: DeferredSignals,
    signal: str,
    *,
    trail: EvidenceTrail | None,
) -> None:
    """The soft stop first, so the trainer can checkpoint and keep its evidence; SIGTERM after
    launcher.stop_grace_s (or at once when asked again to stop), then the usual escalation. The
    cause goes into the provisional artifact before the grace: a SIGKILL during it keeps the cause."""
    ports, grace = going.ports, going.settings.launcher.stop_grace_s
    asked = signals.noted
    requested = ports.clock.monotonic()
    # First: the cause can wait, the trainer not.
    session.request_stop("soft_stop" if grace > 0 else "terminate", INTERRUPTED_REASON)
    print(stop_notice(signal, grace), file=sys.stderr, flush=True)
    cause = cancellation(ports, signal)
    policy.interrupted(cause)
    if trail is not None:
        trail.stopping(cause.kind, cause.reason)
    if grace > 0:
        session.await_soft_exit(requested + grace, lambda: signals.noted > asked)
        if signals.noted > asked:
            print(
                "soak-sidecar: asked again: stopping the trainer now (SIGTERM)", file=sys.stderr, flush=True
            )
        session.request_stop("terminate", INTERRUPTED_REASON)


def stop_notice(signal: str, grace_s: float) -> str:
    """The one line a stop from outside prints at once: what happens next and how to hurry it."""
    if grace_s <= 0:
        return f"soak-sidecar: {signal}: stopping the trainer now (SIGTERM; launcher.stop_grace_s is 0)"
    return (
        f"soak-sidecar: {signal}: soft stop sent; the trainer has {grace_s:g}s to checkpoint and exit "
        f"(--stop-grace, SOAK_LAUNCHER__STOP_GRACE_S) before SIGTERM; stop again to end it now"
    )
