"""The attempts of a soak Job, from the facts of its pods and verdict Events (pure).

Sources of a pod's verdict, best first: its annotations, else the sidecar container's termination
message (written even when the API was unreachable). A published verdict counts only when the
kubelet's record of the sidecar's exit agrees: a pod can say anything of itself in its
annotations. A pod with no verdict says why: still running, the sidecar crashed (its exit code),
evicted or deleted. Pods already gone keep a row from the verdict Event their sidecar posted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from sidecar.core.job_verdict import AttemptOutcome
from sidecar.core.pod_facts import ContainerFacts, ContainerState, EventFacts, JobFacts, PodFacts
from sidecar.core.publication import Publication, parse_annotations, parse_termination_message, sanitize
from sidecar.core.running_annotations import EvidenceNote, parse_evidence, parse_progress_figures
from sidecar.core.slow_index import IndexRate, SlowIndex, slow_indexes

# Set by the Job controller on every pod of an Indexed Job.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Kubelet reasons that only mean "starting": not worth showing as why a pod is pending.
_STARTING = (None, "PodInitializing", "ContainerCreating")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Every column as a terminal may show it: no escape sequences or control characters.
_COLUMN_BYTES = 2048
_STATUS_BYTES = 256


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
    # The run's goodput once this attempt was in its ledger, and where the ledger is.
    goodput: float | None = None
    ledger: str | None = None
    # The node it ran on, and the trainer's steps per second: the attempt's mean once it has a
    # verdict, the recent rate while it runs (what the pod says of itself).
    node: str | None = None
    steps_per_s: float | None = None

    @property
    def passed(self) -> bool:
        """Published as passed, and confirmed: the sidecar container exited 0."""
        return self.verdict == "passed" and self.exit_code == 0 and self.sidecar_exit_code == 0


def job_rows(
    pods: Sequence[PodFacts], events: Sequence[EventFacts], *, job: str, prefix: str, sidecar_container: str
) -> list[AttemptRow]:
    """Every attempt of Job ``job``: its pods' and those gone, by index then attempt."""
    rows = attempt_rows(pods, prefix=prefix, sidecar_container=sidecar_container)
    return sorted(
        rows + gone_rows(events, pods, job=job, prefix=prefix),
        key=lambda r: (-1 if r.index is None else r.index, r.attempt),
    )


def outcomes(rows: Sequence[AttemptRow]) -> list[AttemptOutcome]:
    return [AttemptOutcome(r.index, r.attempt, r.passed, r.indexes) for r in rows]


def attempt_rows(pods: Sequence[PodFacts], *, prefix: str, sidecar_container: str) -> list[AttemptRow]:
    """One row per pod, by index then oldest first; attempt is the published one, else one more
    than the last of the same index."""
    ordered = sorted(
        ((pod, index_of(pod)) for pod in pods),
        key=lambda found: (-1 if found[1] is None else found[1], found[0].created or _EPOCH, found[0].name),
    )
    rows: list[AttemptRow] = []
    for pod, index in ordered:
        pub, source, why = verdict_of(pod, prefix, sidecar_container)
        kubelet = sidecar_exit_code(pod, sidecar_container)
        verdict, reason = confirmed(pub, kubelet, sidecar_container, why)
        previous = rows[-1] if rows and rows[-1].index == index else None
        if pub is not None and pub.attempt is not None:
            attempt = pub.attempt
        else:
            attempt = previous.attempt + 1 if previous else 1
        evidence = parse_evidence(pod.annotations, prefix) if pub is None else None
        if evidence is not None:
            reason = _with_evidence(
                reason, attempt, evidence, ended=_ended_without_verdict(pod, sidecar_container)
            )
        rows.append(
            AttemptRow(
                attempt=attempt,
                pod=sanitize(pod.name, _COLUMN_BYTES),
                index=index,
                indexes=pub.indexes if pub is not None else None,
                phase=sanitize(_phase(pod), _COLUMN_BYTES),
                verdict=verdict,
                classification=_shown(pub.classification if pub is not None else None),
                exit_code=pub.exit_code if pub is not None else None,
                reason=sanitize(reason, _COLUMN_BYTES),
                artifact=_shown(pub.artifact_uri if pub is not None else evidence.uri if evidence else None),
                artifact_sha256=_shown(pub.artifact_sha256 if pub is not None else None),
                source=source,
                created=pod.created.isoformat() if pod.created is not None else None,
                sidecar_exit_code=kubelet,
                goodput=pub.goodput if pub is not None else None,
                ledger=_shown(pub.ledger_uri if pub is not None else None),
                node=_shown(pod.node),
                steps_per_s=_steps_per_s(pub, pod, prefix),
            )
        )
    return rows


def gone_rows(
    events: Sequence[EventFacts], pods: Sequence[PodFacts], *, job: str, prefix: str
) -> list[AttemptRow]:
    """Attempts whose pod is gone (the Job controller deletes the pods it stops when the Job fails),
    from the verdict Event each sidecar posted with its verdict as annotations; the last Event of a
    pod wins. Never counted as passed: no kubelet record confirms them."""
    present = {pod.uid for pod in pods}
    # Pods of Job <job>: <job>-<5 chars>, or <job>-<index>-<5 chars> in an Indexed Job.
    named = re.compile(rf"{re.escape(job)}-(?:[0-9]+-)?[a-z0-9]{{5}}")
    latest: dict[str | None, tuple[str, Publication]] = {}
    for event in events:
        pub = parse_annotations(event.annotations, prefix)
        name = event.pod_name or ""
        if pub is None or named.fullmatch(name) is None or event.pod_uid in present:
            continue
        latest[event.pod_uid] = (name, pub)
    return [
        AttemptRow(
            attempt=pub.attempt or 1,
            pod=sanitize(name, _COLUMN_BYTES),
            index=pub.index,
            indexes=pub.indexes,
            phase="Gone",
            verdict=sanitize(pub.status, _STATUS_BYTES),
            classification=_shown(pub.classification),
            exit_code=pub.exit_code,
            reason=f"{sanitize(pub.reason, _COLUMN_BYTES)}; the pod is gone: as its verdict Event records it",
            artifact=_shown(pub.artifact_uri),
            artifact_sha256=_shown(pub.artifact_sha256),
            source="event",
            created=None,
            goodput=pub.goodput,
            steps_per_s=pub.steps_per_s,
            ledger=_shown(pub.ledger_uri),
        )
        for name, pub in latest.values()
    ]


def _steps_per_s(pub: Publication | None, pod: PodFacts, prefix: str) -> float | None:
    if pub is not None:
        return pub.steps_per_s
    figures = parse_progress_figures(pod.annotations, prefix)
    return None if figures is None else figures.steps_per_s


def slow_rows(rows: Sequence[AttemptRow]) -> list[SlowIndex]:
    """The indexes whose latest attempt's rate is well below the others' (sidecar.core.slow_index)."""
    rates = [
        IndexRate(r.index, r.attempt, r.steps_per_s, r.node)
        for r in rows
        if r.index is not None and r.steps_per_s is not None
    ]
    return slow_indexes(rates)


def run_goodput(rows: Sequence[AttemptRow]) -> tuple[float, AttemptRow] | None:
    """The goodput the newest attempt that tells one published (every attempt before it is in its
    figure), and that attempt."""
    told = [(r.goodput, r) for r in rows if r.goodput is not None]
    if not told:
        return None
    return max(told, key=lambda found: (found[1].created or "", found[1].attempt))


def _with_evidence(why: str, attempt: int, evidence: EvidenceNote, *, ended: str | None) -> str:
    """A pod without a verdict whose sidecar had sent evidence: how far that evidence goes."""
    when = "" if evidence.at_unix is None else f" (last evidence at {_utc(evidence.at_unix)})"
    if ended is None:
        return f"{why}{when}"
    return f"attempt {attempt} ended without a verdict{when}: {why}"


def _utc(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def index_of(pod: PodFacts) -> int | None:
    """The pod's completion index (the Job controller's annotation); None for a non-indexed Job."""
    text = pod.annotations.get(COMPLETION_INDEX_ANNOTATION)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def confirmed(
    pub: Publication | None, kubelet: int | None, container: str, why: str
) -> tuple[str | None, str]:
    """(verdict, reason): the published verdict when the kubelet's record of the sidecar's exit
    (``kubelet``) agrees; ``why`` there is none when nothing was published."""
    if pub is None:
        return None, why
    status, published = sanitize(pub.status, _STATUS_BYTES), sanitize(pub.reason, _COLUMN_BYTES)
    if kubelet is None:
        note = f"{published}; " if published else ""
        return status, f"{note}not confirmed yet: the kubelet has recorded no exit for {container}"
    if kubelet != pub.exit_code:
        return "mismatch", (
            f"the pod's annotations say {status} (exit {pub.exit_code}) but the kubelet recorded "
            f"exit {kubelet} for {container}: not trusted"
        )
    return status, published


def sidecar_exit_code(pod: PodFacts, container: str) -> int | None:
    """The sidecar's exit as the kubelet recorded it; None while it has recorded none."""
    terminated = last_terminated(pod.container(container))
    return None if terminated is None else terminated.exit_code


def last_terminated(container: ContainerFacts | None) -> ContainerState | None:
    """The current run's end, else the previous run's: a restarted sidecar's exit is why there is
    no verdict yet."""
    if container is None:
        return None
    for state in (container.state, container.last_state):
        if state is not None and state.kind == "terminated":
            return state
    return None


def verdict_of(
    pod: PodFacts, prefix: str, sidecar_container: str
) -> tuple[Publication | None, str | None, str]:
    """(verdict, where it came from, why there is none)."""
    pub = parse_annotations(pod.annotations, prefix)
    if pub is not None:
        return pub, "annotations", ""
    terminated = last_terminated(pod.container(sidecar_container))
    if terminated is not None:
        pub = parse_termination_message(terminated.message)
        if pub is not None:
            return pub, "termination-message", ""
    why = why_no_verdict(pod, sidecar_container)
    launcher = _launcher_message(pod)
    return None, None, f"{why}; {launcher}" if launcher else why


def why_no_verdict(pod: PodFacts, sidecar_container: str) -> str:
    """Why a pod has published no verdict: it ended without one, or it is not done yet."""
    return _ended_without_verdict(pod, sidecar_container) or _not_done_yet(pod, sidecar_container)


def _launcher_message(pod: PodFacts) -> str | None:
    """The launcher's own termination message (why it stopped the trainer: heartbeat lost, ...)."""
    for container in pod.containers:
        terminated = last_terminated(container)
        message = (terminated.message or "").strip() if terminated is not None else ""
        if message.startswith("soak-launcher: "):
            return message
    return None


def _ended_without_verdict(pod: PodFacts, sidecar_container: str) -> str | None:
    """Why a pod or sidecar that ended (evicted, deleted, exited, finished) left no verdict."""
    if pod.reason == "Evicted":
        return f"evicted: {pod.message or ''}".rstrip(": ")
    if pod.deleting:
        return "pod deleted before the sidecar published a verdict"
    terminated = last_terminated(pod.container(sidecar_container))
    if terminated is not None:
        detail = f", {terminated.reason}" if terminated.reason else ""
        said = (terminated.message or "").strip()
        said = f": {said}" if said else ""
        return f"sidecar container terminated without a verdict (exit {terminated.exit_code}{detail}){said}"
    if pod.phase in ("Failed", "Succeeded"):
        detail = " ".join(part for part in (pod.reason, pod.message) if part)
        return f"pod {pod.phase.lower()} without a verdict" + (f": {detail}" if detail else "")
    return None


def _not_done_yet(pod: PodFacts, sidecar_container: str) -> str:
    if pod.phase == "Pending":
        stuck = _waiting(pod)
        return f"pending: {stuck}" if stuck else "pending: not running yet"
    sidecar = pod.container(sidecar_container)
    state = sidecar.state if sidecar is not None else None
    if state is not None and state.kind == "waiting":
        return f"sidecar waiting: {state.reason or 'unknown'}"
    return "still running"


def _waiting(pod: PodFacts) -> str:
    """Why containers wait (ImagePullBackOff, CreateContainerConfigError, ...), with the kubelet's words."""
    found = []
    for container in (*pod.init_containers, *pod.containers):
        state = container.state
        if state is not None and state.kind == "waiting" and state.reason not in _STARTING:
            said = f" ({state.message})" if state.message else ""
            found.append(f"{container.name} {state.reason}{said}")
    return "; ".join(found)


def _phase(pod: PodFacts) -> str:
    phase = pod.phase or "Unknown"
    return f"{phase} (deleting)" if pod.deleting else phase


def _shown(text: str | None) -> str | None:
    return None if text is None else sanitize(text, _COLUMN_BYTES)


def end_condition(job: JobFacts) -> str | None:
    """The Job's ``Complete`` or ``Failed`` condition, None while it has neither: no retry will
    follow once it has one."""
    ended = [c.type for c in job.conditions if c.type in ("Complete", "Failed") and c.status == "True"]
    return ended[0] if ended else None


def job_failure(job: JobFacts) -> str | None:
    """Why the Job failed or is failing (its ``FailureTarget`` or ``Failed`` condition: reason and
    message), None while it is not."""
    for condition in job.conditions:
        if condition.type in ("FailureTarget", "Failed") and condition.status == "True":
            return f"{condition.reason or condition.type}: {condition.message or 'no message'}"
    return None
