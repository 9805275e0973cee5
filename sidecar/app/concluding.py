"""Once the launcher has exited: gather the facts the verdict needs and let the core decide."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.app.artifact import Evidence
from sidecar.app.ports import Ports
from sidecar.app.session import LaunchSession
from sidecar.app.values import Going, Launched, Preflight, Started, Watched
from sidecar.core.artifact import (
    SampleRecorder,
    leak_failures,
    project_memory,
    run_summary_figures,
    shm_finding,
)
from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.conclusion import Conclusion, DeadlineSeen, RunFacts, conclude, residual_processes
from sidecar.core.gpu_clean import GpuLeftover, gpu_leftovers
from sidecar.core.gpu_health import gpu_fault
from sidecar.core.gpu_trends import correctable_growth
from sidecar.core.pod_facts import PodMoments
from sidecar.core.ports import GpuBackend, TrainerMemory
from sidecar.core.run_summary import SummaryOutcome, evaluate_run_summary, unreadable
from sidecar.core.samples import GpuDevice, GpuSample, ProcessInfo, ShmLeftovers
from sidecar.core.trends import quantity_bytes
from sidecar.settings import Settings


@dataclass(frozen=True)
class Concluded:
    conclusion: Conclusion
    summary: SummaryOutcome
    duration_s: float
    shm_left: ShmLeftovers | None = None

    def evidence(
        self,
        started: Started,
        launched: Launched,
        checked: Preflight,
        watched: Watched,
        *,
        devices: tuple[GpuDevice, ...],
        env: Mapping[str, str],
        pod: PodMoments | None,
    ) -> Evidence:
        """What the run left behind beyond the verdict, for its artifact."""
        return Evidence(
            started=started,
            launched=launched,
            preflight=checked,
            summary=self.summary,
            exit_record=watched.exit_record,
            unconfirmed_record=watched.unconfirmed_record,
            residuals=self.conclusion.residuals_reported,
            duration_s=self.duration_s,
            gpu_devices=devices,
            trainer_env=env,
            protocol_violations=watched.protocol_violations,
            stacks=watched.stacks,
            deadline_end=self.conclusion.deadline,
            go_unix=watched.go_unix,
            moments=watched.moments,
            pod=pod,
            shm_left=self.shm_left,
        )


def conclude_run(
    going: Going,
    watched: Watched,
    *,
    session: LaunchSession,
    recorder: SampleRecorder,
    gpu: GpuBackend,
    gpu_before: GpuSample,
    memory: TrainerMemory | None = None,
) -> Concluded:
    settings, ports, launched = going.settings, going.ports, going.launched
    clock, mset = ports.clock, settings.monitor
    duration = clock.monotonic() - going.started.monotonic
    if mset.post_shutdown_grace_s:
        ports.sleep(mset.post_shutdown_grace_s)
    launcher_pid = launched.launcher.pid
    still_alive = ports.processes.still_alive(residual_processes(watched.last_seen, launcher_pid))
    # Nothing the run started may outlive it (the launcher may be gone: SIGKILLed, crashed).
    session.kill_remembered(still_alive, tree=watched.last_seen)
    still_alive += _strays(ports, launcher_pid)
    shm_left = _memory_left(going, recorder, memory)
    summary = read_summary(settings, ports, going.started)
    run_pids = {p.pid for p in watched.last_seen} | {launcher_pid}
    left = gpu_leftovers(gpu_before, gpu.look(run_pids), run_pids, settings.gpu.clean_tolerance_mib)
    recorder.summary.gpu_left = list(left.findings)
    leaks = [*_leaks(going, recorder), *_gpu_leaks(settings, left)]
    conclusion = conclude(
        RunFacts(
            monitor_failure=watched.failure,
            gpu_fault=watched.gpu_fault or _gpu_fault(settings, recorder, left),
            exit_record=watched.exit_record,
            trainer_program=launched.command[0],
            duration_s=duration,
            min_duration_s=mset.min_duration_s,
            launcher_pid=launcher_pid,
            last_seen=watched.last_seen,
            still_alive=tuple(still_alive),
            summary=summary,
            leaks=tuple(leaks),
            deadline=_deadline_seen(going, watched),
            fallback_kill=watched.fallback_kill,
            launcher_stopped=watched.launcher_stopped,
            trainer_xids=tuple(recorder.health.trainer_xids()),
            heartbeat=session.heartbeat_record(resumed=going.started.already_going),
            peak_rss_kib=recorder.summary.max_process_rss_kib,
            container_oom_killed=_container_oom_killed(ports, watched),
            shm_left=None if shm_left is None else shm_finding(shm_left),
            progress=recorder.summary.progress,
        )
    )
    recorder.summary.residual_process_count = len(conclusion.residual_pids)
    recorder.summary.run_summary_figures = run_summary_figures(summary.data)
    return Concluded(conclusion=conclusion, summary=summary, duration_s=duration, shm_left=shm_left)


def _strays(ports: Ports, launcher_pid: int) -> list[ProcessInfo]:
    """Processes that escaped the launcher's tree to the sidecar (local mode), killed: residuals."""
    if ports.strays is None:
        return []
    escaped = ports.strays.find(launcher_pid)
    if escaped:
        ports.processes.kill(escaped)
        ports.strays.reap(escaped)
    return escaped


def _memory_left(going: Going, recorder: SampleRecorder, memory: TrainerMemory | None) -> ShmLeftovers | None:
    """Once the launcher cleaned up and the survivors were killed: the cgroup's memory still charged,
    and the files the trainer's UID wrote to /dev/shm since the attempt started (named on stderr too:
    a passed soak has no reason text to name them in)."""
    if memory is None:
        return None
    recorder.summary.memory_cgroup = memory.cgroup
    recorder.after_cleanup(memory.sample())
    left = memory.shm_leftovers(going.started.wall)
    finding = shm_finding(left)
    if finding is not None:
        print(f"soak-sidecar: {finding}", file=sys.stderr, flush=True)
    return left


def _deadline_seen(going: Going, watched: Watched) -> DeadlineSeen:
    clock, deadline = going.ports.clock, going.preflight.clock
    wall, monotonic = clock.wall(), clock.monotonic()
    left = deadline.remaining(wall, monotonic)
    return DeadlineSeen(
        passed=deadline.expired(wall, monotonic),
        term_due=left <= going.settings.deadline.term_grace_s,
        margin_due=left <= going.preflight.record.checkpoint_margin_seconds,
        outlived=watched.ran_past_deadline,
    )


def _shared(recorder: SampleRecorder) -> bool:
    """Whether the launcher's memory cgroup is the sidecar's own (unknown counts as shared)."""
    cgroup = recorder.summary.memory_cgroup
    return cgroup is None or cgroup.sidecar_own is not False


def _leaks(going: Going, recorder: SampleRecorder) -> list[Finding]:
    """Growth beyond the configured limits, and the memory limit reached before the deadline."""
    settings, clock, mset = going.settings, going.ports.clock, going.settings.monitor
    leaks = leak_failures(
        recorder.summary,
        max_rss_growth_mib=mset.max_rss_growth_mib,
        max_fd_growth=mset.max_fd_growth,
        max_gpu_growth_mib=settings.gpu.max_memory_growth_mib,
        max_cgroup_memory_growth_mib=mset.cgroup_memory_growth_limit_mib(
            shared_with_sidecar=_shared(recorder)
        ),
    )
    limit = quantity_bytes(mset.memory_limit) if mset.memory_limit else None
    budget_left = going.preflight.clock.remaining(clock.wall(), clock.monotonic())
    too_fast = project_memory(recorder.summary, recorder.trends, limit, budget_left)
    if too_fast and mset.fail_on_projected_memory_limit:
        leaks.append(too_fast)
    return [_leak(reason) for reason in leaks]


def _leak(reason: str) -> Finding:
    return Finding(Classification.RESOURCE_LEAK, reason, Source.SIDECAR)


def _gpu_leaks(settings: Settings, left: GpuLeftover) -> list[Finding]:
    """Processes of the run still on a GPU, as leaks: only when the user opted in."""
    held = left.held_by_run if settings.gpu.fail_on_dirty_gpu else ()
    return [_leak(f"GPU left dirty: {process}") for process in held]


def _gpu_fault(settings: Settings, recorder: SampleRecorder, left: GpuLeftover) -> Finding | None:
    """A GPU fault a health rule found after the last sample; else a device left dirty, or whose
    correctable errors grow, as a GPU fault (retried on another node): each only when the user
    opted in."""
    if recorder.summary.gpu_fault:
        return gpu_fault(recorder.summary.gpu_fault)
    if settings.gpu.fail_on_dirty_gpu and left.on_device:
        return gpu_fault(f"GPU left dirty: {'; '.join(left.on_device)}")
    if not settings.gpu.fail_on_correctable_growth:
        return None
    growing = correctable_growth(recorder.gpu_trends.trends())
    return gpu_fault(f"correctable errors grow: {'; '.join(growing)}") if growing else None


def _container_oom_killed(ports: Ports, watched: Watched) -> bool:
    """The kubelet's word, asked when the launcher's own is missing: no exit.json (the OOM killer
    may have taken the launcher with the container), or no memory cgroup it could read. The
    kubelet reports the container's end a moment after it."""
    status, record = ports.pod_status, watched.exit_record
    if status is None or (record is not None and record.memory is not None):
        return False
    end = ports.clock.monotonic() + status.cause_wait_s
    while (ended := status.trainer_ended()) is None and ports.clock.monotonic() < end:
        ports.sleep(CONTAINER_STATUS_POLL_S)
    return ended is not None and ended.reason == "OOMKilled"


CONTAINER_STATUS_POLL_S = 0.5


def read_summary(settings: Settings, ports: Ports, started: Started) -> SummaryOutcome:
    sset = settings.summary
    try:
        found = ports.progress.read_file(sset.file_name, sset.max_bytes)
    except OSError as exc:
        return unreadable(Classification.INVALID_RUN_SUMMARY, f"run_summary.json cannot be read: {exc}")
    raw, mtime = found if found is not None else (None, None)
    return evaluate_run_summary(
        raw,
        mtime=mtime,
        run_started_wall=started.wall,
        max_bytes=sset.max_bytes,
        manifest_validator=ports.manifest_validator,
        profile=sset.profile,
    )
