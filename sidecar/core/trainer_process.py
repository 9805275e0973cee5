"""Which process is the trainer: the sidecar's own observation, never a file the trainer can write.

The launcher starts exactly one child, the trainer, in a session of its own; everything the
trainer starts is younger than it. So in a sample of the launcher's tree the trainer is the
launcher's oldest direct child (orphans the subreaper adopts are descendants, hence younger).
``trainer.json`` is a claim that is checked against this, never the source of a pid to signal or
of the samples a leak check counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.core.samples import ProcessInfo


def trainer_of(processes: Sequence[ProcessInfo], launcher_pid: int) -> ProcessInfo | None:
    """The launcher's oldest direct child with a known start time, None when it has none."""
    children = [p for p in processes if p.ppid == launcher_pid and p.pid > 1 and p.start_ticks is not None]
    return min(children, key=lambda p: (p.start_ticks or 0, p.pid), default=None)


def claim_mismatch(claimed_pid: int, claimed_ticks: int | None, observed: ProcessInfo) -> str | None:
    """Why trainer.json's claim is not the trainer the sidecar saw; None when it agrees."""
    if claimed_pid == observed.pid and claimed_ticks in (None, observed.start_ticks):
        return None
    return (
        f"trainer.json names pid {claimed_pid} (start ticks {claimed_ticks}), but the launcher's child "
        f"is pid {observed.pid} (start ticks {observed.start_ticks}): the claim was ignored"
    )


# Only a signal or a tracer stops the launcher; neither comes from the sidecar or the kubelet, and the
# launcher's UID is the trainer's. (psutil's names, as the samples carry them.)
STOPPED_STATES = frozenset({"stopped", "tracing-stop"})


def launcher_stopped(
    processes: Sequence[ProcessInfo], launcher_pid: int, elapsed_s: float, tracer: int | None = None
) -> str | None:
    """Why the launcher, seen in this sample, is stopped or traced from the trainer's side (its
    state, or a tracer attached: the sidecar never traces it); None when it runs untraced."""
    launcher = next((p for p in processes if p.pid == launcher_pid), None)
    if tracer is not None:
        seen = f"traced by pid {tracer}"
    elif launcher is not None and launcher.state in STOPPED_STATES:
        seen = launcher.state
    else:
        return None
    return (
        f"the launcher (pid {launcher_pid}) was seen {seen} {elapsed_s:.1f} s into the attempt: "
        "stopped or traced from the trainer's side"
    )
