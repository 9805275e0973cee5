"""The soak's conclusion from what the run left behind. Pure: every fact is an argument.

The post-run rules: a launcher that wrote no exit record, a trainer that could not be
started, processes that outlived the trainer, and when a failure counts as the deadline's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.core import verdict as verdicts
from sidecar.core.artifact.progress import ProgressInfo
from sidecar.core.classification import Classification, Finding, Source, Standing
from sidecar.core.run_summary import SummaryOutcome
from sidecar.core.samples import COMMAND_MAX_CHARS, ProcessInfo, ResidualProcess
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.names import DEADLINE_SOFT_STOP


@dataclass(frozen=True)
class SidecarHeartbeat:
    """The sidecar's own record of the heartbeat it wrote into the run dir: the only word on
    whether it was lost. The launcher's heartbeat_lost says only that the launcher saw no change
    in time; a trainer that stops or starves the launcher, or removes the file, causes that too."""

    # Why heartbeats could not be written into the run dir (the trainer can break it), the first few.
    unwritten: tuple[str, ...] = ()
    # The longest time between two heartbeats that landed, by the sidecar's clock.
    longest_gap_s: float = 0.0
    # The launcher's heartbeat timeout (go.json).
    timeout_s: float = math.inf
    # This sidecar took over a running trainer: its predecessor may have been gone for a while.
    resumed: bool = False

    @property
    def lapsed(self) -> bool:
        """The sidecar itself stalled or was gone long enough for the launcher to miss it (half
        the timeout: the launcher notices a change late when it is starved)."""
        return self.resumed or self.longest_gap_s >= self.timeout_s * LAPSE_SHARE


LAPSE_SHARE = 0.5


@dataclass(frozen=True)
class DeadlineSeen:
    """The deadline by the sidecar's own clock. The exit record's deadline flags are the launcher's
    word in a file the trainer can write: they count only where this agrees."""

    passed: bool = False  # at the conclusion
    term_due: bool = False  # the deadline's TERM time (term_grace_s before it) had come
    margin_due: bool = False  # the checkpoint margin's soft stop had come
    # The launcher, and the trainer's tree with it, still ran after the deadline (whatever the
    # trainer exits with later: a stopped launcher cannot hold the deadline off).
    outlived: bool = False


@dataclass(frozen=True)
class RunFacts:
    """What the monitor, the launcher and the trainer's files say once the trainer has ended."""

    # The monitor's failure (core.monitor_policy), and the first GPU fault the monitor or the checks
    # after the run found (core.gpu_health.gpu_fault).
    monitor_failure: Finding | None
    gpu_fault: Finding | None
    exit_record: ExitRecord | None
    trainer_program: str
    duration_s: float
    min_duration_s: float
    launcher_pid: int | None
    # The processes of the last sample, and those of them still alive after the post-shutdown grace.
    last_seen: tuple[ProcessInfo, ...]
    still_alive: tuple[ProcessInfo, ...]
    summary: SummaryOutcome
    leaks: tuple[Finding, ...]
    deadline: DeadlineSeen
    # XIDs the application caused (core.gpu_health): named in a failed verdict's reason.
    trainer_xids: tuple[str, ...] = ()
    heartbeat: SidecarHeartbeat = SidecarHeartbeat()
    # The sidecar had to kill the trainer's processes itself: a finding, never silent.
    fallback_kill: str | None = None
    # A sample saw the launcher stopped or traced (core.trainer_process.launcher_stopped).
    launcher_stopped: str | None = None
    # The largest RSS of the trainer's tree any sample saw (KiB), for an OOM kill's reason.
    peak_rss_kib: int | None = None
    # The kubelet's word (pod mode): the trainer's container was OOMKilled.
    container_oom_killed: bool = False
    # Files the trainer's UID left in /dev/shm (core.artifact.shm_finding): named in a failed
    # verdict's reason, a finding that fails nothing by itself (the cgroup leak rule judges the memory).
    shm_left: str | None = None
    # Where the trainer's progress records left it: a slowdown or a finish past the deadline that
    # its step times showed are named in a failed verdict's reason.
    progress: ProgressInfo | None = None


@dataclass(frozen=True)
class Conclusion:
    verdict: verdicts.Verdict
    residual_pids: tuple[int, ...]
    # What the artifact lists: every residual PID, how it ended, and how it was last seen.
    residuals_reported: tuple[ResidualProcess, ...]
    deadline: verdicts.DeadlineEnd | None = None


def conclude(facts: RunFacts) -> Conclusion:
    residual_pids = _residual_pids(facts)
    record = facts.exit_record
    deadline = deadline_end(record, facts.summary, seen=facts.deadline)
    verdict = verdicts.decide(
        monitor_failure=_monitor_failure(facts),
        returncode=None if record is None else record.trainer_returncode,
        duration_s=facts.duration_s,
        min_duration_s=facts.min_duration_s,
        residuals=[str(pid) for pid in residual_pids],
        leaks=facts.leaks,
        summary=facts.summary,
        deadline=deadline,
        gpu_fault=facts.gpu_fault,
        out_of_memory=out_of_memory(
            record, facts.peak_rss_kib, container_oom_killed=facts.container_oom_killed
        ),
        also=_notes(facts),
    )
    return Conclusion(verdict, residual_pids, _reported(facts), deadline)


def _notes(facts: RunFacts) -> list[Finding]:
    """What a failure's reason names, and the sidecar's findings that never pass."""
    found: list[Finding] = []
    if facts.trainer_xids:
        caused = "; ".join(facts.trainer_xids)
        found.append(_note(Classification.TRAINER_FAILURE, f"the trainer caused {caused}"))
    if facts.shm_left is not None:
        found.append(_note(Classification.RESOURCE_LEAK, facts.shm_left))
    found.extend(_progress_notes(facts))
    if facts.fallback_kill is not None:
        found.append(_after(Classification.MONITOR_FAILURE, facts.fallback_kill))
    if facts.launcher_stopped is not None:
        found.append(_after(Classification.TRAINER_FAILURE, facts.launcher_stopped))
    return found


def _progress_notes(facts: RunFacts) -> list[Finding]:
    progress, failure = facts.progress, facts.monitor_failure
    if progress is None:
        return []
    dropped = failure is not None and failure.kind is Classification.THROUGHPUT_DROPPED
    notes = []
    if progress.slowdown is not None and not dropped:
        notes.append(_note(Classification.THROUGHPUT_DROPPED, progress.slowdown))
    if progress.finish_note is not None:
        notes.append(_note(Classification.DEADLINE_EXHAUSTED, progress.finish_note))
    return notes


def _note(kind: Classification, reason: str) -> Finding:
    return Finding(kind, reason, Source.SIDECAR, standing=Standing.NOTE)


def _after(kind: Classification, reason: str) -> Finding:
    return Finding(kind, reason, Source.SIDECAR, standing=Standing.AFTER)


def _monitor_failure(facts: RunFacts) -> Finding | None:
    record = facts.exit_record
    if facts.monitor_failure is not None:
        return facts.monitor_failure
    if record is None:
        # A launcher the OOM killer took with the trainer's container leaves no record: the
        # kubelet's OOMKilled is then the cause (see out_of_memory).
        missing = "launcher exited without writing exit.json"
        return (
            None
            if facts.container_oom_killed
            else Finding(Classification.MONITOR_FAILURE, missing, Source.SIDECAR)
        )
    if record.heartbeat_lost or record.owner_lost:
        return _lost_sidecar(record, facts.heartbeat, facts.launcher_stopped)
    if record.reason == "spawn_failed":
        problem = "was not found" if record.exit_code == 127 else "is not executable"
        reason = f"the trainer command {facts.trainer_program!r} {problem} (launcher exit {record.exit_code})"
        return Finding(Classification.TRAINER_NOT_STARTED, reason, Source.LAUNCHER)
    return None


def _lost_sidecar(record: ExitRecord, heartbeat: SidecarHeartbeat, launcher_stopped: str | None) -> Finding:
    """The launcher says it lost the sidecar. Retryable (152) only when the sidecar's own record
    shows it: a sidecar that concludes was not gone (owner lost), and one whose heartbeats all
    landed on time was not stalled. Otherwise the launcher was stopped, starved or lied to."""
    if launcher_stopped is not None:
        reason = f"the launcher reported the sidecar lost, but {launcher_stopped}"
        return Finding(Classification.TRAINER_FAILURE, reason, Source.SIDECAR)
    if heartbeat.unwritten:
        # The heartbeat could not land: the run dir broke (the trainer can write it), not the sidecar.
        return Finding(
            Classification.MONITOR_FAILURE,
            f"the sidecar's heartbeat could not be written into the run dir ({heartbeat.unwritten[0]}): "
            "the launcher lost it and killed the trainer",
            Source.SIDECAR,
        )
    if record.heartbeat_lost and heartbeat.lapsed:
        return Finding(
            Classification.SUPERVISOR_LOST,
            "the launcher lost the sidecar's heartbeat and killed the trainer: the sidecar stalled or "
            "died, the trainer's own outcome is unknown",
            Source.LAUNCHER,
        )
    lost = "heartbeat" if record.heartbeat_lost else "process (--owner-pid)"
    return Finding(
        Classification.TRAINER_FAILURE,
        f"the launcher reported the sidecar's {lost} lost, but the sidecar was there throughout "
        f"(its heartbeats landed at most {heartbeat.longest_gap_s:.1f} s apart, the timeout is "
        f"{heartbeat.timeout_s:g} s): the launcher was stopped or starved, or the heartbeat file removed, "
        "from the trainer's side",
        Source.SIDECAR,
    )


def out_of_memory(
    record: ExitRecord | None, peak_rss_kib: int | None, *, container_oom_killed: bool
) -> Finding | None:
    """The OOM killer as the cause, when the trainer's cgroup counted an OOM kill while it ran (the
    launcher's record) or the kubelet reports its container OOMKilled; None otherwise."""
    memory = None if record is None else record.memory
    counted = memory is not None and memory.oom_kills > 0
    if not (counted or container_oom_killed):
        return None
    parts = ["out of memory: the kernel's OOM killer killed"]
    victims = () if memory is None else memory.oom_killed
    trainer_pid = None if record is None else record.trainer_pid
    if victims:
        parts.append(", ".join(_victim(kill.pid, kill.command, trainer_pid) for kill in victims[:MAX_NAMED]))
    elif counted and memory is not None:
        count = memory.oom_kills
        parts.append(f"{count} process{'es' if count > 1 else ''} in the trainer's cgroup")
    else:
        parts.append("the trainer's container (the kubelet reports it OOMKilled)")
    limit = None if memory is None else memory.limit_bytes
    parts.append("(no memory limit was set)" if limit is None else f"at its memory limit of {_mib(limit)}")
    text = " ".join(parts)
    if peak_rss_kib is not None:
        text += f"; peak RSS sampled {peak_rss_kib / 1024:.1f} MiB"
    return Finding(Classification.OUT_OF_MEMORY, text, Source.LAUNCHER if counted else Source.PLATFORM)


MAX_NAMED = 4
NAMED_COMMAND_CHARS = 80


def _victim(pid: int, command: Sequence[str], trainer_pid: int | None) -> str:
    who = "the trainer" if pid == trainer_pid else "a process"
    shown = " ".join(command)
    if len(shown) > NAMED_COMMAND_CHARS:
        shown = shown[: NAMED_COMMAND_CHARS - 3] + "..."
    return f"{who} (pid {pid}: {shown})"


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _residual_pids(facts: RunFacts) -> tuple[int, ...]:
    """The launcher (a subreaper) kills what outlives the trainer before it exits, so a leaked
    worker is rarely still alive here: what it had to kill after the trainer ended, or could not
    reap, is residual too (what exited by itself within the launcher's exit grace never is)."""
    pids = {p.pid for p in facts.still_alive}
    if facts.exit_record is not None:
        pids.update(k.pid for k in facts.exit_record.survivors_killed)
        pids.update(facts.exit_record.unreaped)
    if facts.launcher_pid is not None:
        pids.discard(facts.launcher_pid)
    return tuple(sorted(pids))


REPORTED_RESIDUALS = 64


def _reported(facts: RunFacts) -> tuple[ResidualProcess, ...]:
    """One entry per residual PID: the launcher's list names what it killed even when no sample saw it."""
    seen = {p.pid: p for p in facts.last_seen}
    entries: dict[int, ResidualProcess] = {}
    for alive in facts.still_alive:
        entries[alive.pid] = ResidualProcess(
            pid=alive.pid, command=alive.command, fate="alive_after_shutdown", last_seen=alive
        )
    record = facts.exit_record
    killed = () if record is None else record.survivors_killed
    for victim in killed:
        entries.setdefault(
            victim.pid,
            ResidualProcess(
                pid=victim.pid,
                command=" ".join(victim.command)[:COMMAND_MAX_CHARS],
                fate="killed_by_launcher",
                last_seen=seen.get(victim.pid),
            ),
        )
    for pid in () if record is None else record.unreaped:
        last = seen.get(pid)
        entries.setdefault(
            pid,
            ResidualProcess(pid=pid, command=last.command if last else "", fate="unreaped", last_seen=last),
        )
    entries.pop(facts.launcher_pid or -1, None)
    # At most REPORTED_RESIDUALS, by pid: the resource summary counts them all.
    return tuple(entries[pid] for pid in sorted(entries)[:REPORTED_RESIDUALS])


def deadline_end(
    record: ExitRecord | None, summary: SummaryOutcome, *, seen: DeadlineSeen
) -> verdicts.DeadlineEnd | None:
    """How the deadline ended the run, if it did.

    ``expired``: the launcher still ran after the deadline, or the deadline passed, or the trainer
    died of the deadline's TERM or KILL (sent term_grace_s before it). ``budget_spent``: the trainer
    was soft-stopped at the checkpoint margin, before the deadline, and had not finished: the
    budget's verdict, not the trainer's (or an external) cancellation, but the deadline itself did
    not expire. A soft stop for any other reason (a stop signal, the sidecar's cancellation) is not
    the deadline's. Each of the record's claims counts only when the sidecar's clock agrees.
    """
    if seen.outlived or (record is not None and record.deadline_expired and seen.passed):
        return "expired"
    by_term = record is not None and record.reason == "deadline" and (seen.term_due or seen.passed)
    if (by_term or seen.passed) and (record is None or record.returncode != 0):
        return "expired"
    margin = record is not None and record.soft_stop_reason in (None, DEADLINE_SOFT_STOP)
    due = seen.margin_due or seen.term_due or seen.passed
    if record is not None and record.soft_stop_sent and margin and due and not summary.passed:
        return "budget_spent"
    return None


def residual_processes(processes: Sequence[ProcessInfo], launcher_pid: int | None) -> list[ProcessInfo]:
    """The processes to check for survivors: all seen but the launcher (it exits last)."""
    return [p for p in processes if p.pid != launcher_pid]
