"""While the trainer runs: observe what the policy says is due, carry out what it decides.

The rules are in ``sidecar.core.monitor_policy``; this loop only samples (processes, GPUs,
progress), reports, and acts on the launcher. Time and sleep come from the ports.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.app.console import Console
from sidecar.app.estimate import FinishEstimate
from sidecar.app.evidence import EvidenceTrail
from sidecar.app.ports import Ports
from sidecar.app.session import LaunchSession
from sidecar.app.signals import Cancelled, DeferredSignals
from sidecar.app.stopping import stop_on_cancellation, stop_signal
from sidecar.app.values import Going, Launched, Started, Watched
from sidecar.core.artifact import SampleRecorder
from sidecar.core.errors import ConfigError, LauncherError
from sidecar.core.gpu_health import gpu_fault
from sidecar.core.ledger.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_LIMIT_BYTES,
    CheckpointReport,
    parse_checkpoint,
)
from sidecar.core.ledger.moments import ProgressMoments
from sidecar.core.monitor_policy import (
    Due,
    MonitorPolicy,
    MonitorTimings,
    Observation,
    lock_loss,
    monitor_failed,
)
from sidecar.core.ports import GpuBackend, TrainerMemory
from sidecar.core.running_annotations import ProgressFigures
from sidecar.core.samples import ZOMBIE, ProcessInfo, ProgressSample, Sample
from sidecar.core.trainer_process import claim_mismatch, launcher_stopped, trainer_of
from sidecar.launcher.protocol.exit import ExitRecord


def _read_checkpoint(ports: Ports) -> CheckpointReport | str | None:
    """The trainer's checkpoint record (a claim: only that it changed is taken), or why it cannot
    be read."""
    try:
        found = ports.progress.read_file(CHECKPOINT_FILE, CHECKPOINT_LIMIT_BYTES)
        return None if found is None else parse_checkpoint(found[0])
    except OSError as exc:
        return f"{CHECKPOINT_FILE}: {exc}"
    except ConfigError as exc:
        return str(exc)


@dataclass
class SamplerFindings:
    """What the samples found that no record may change: trainer.json's claim disagreeing with the
    trainer seen (the first disagreement: it is then no longer checked), and the first sight of the
    launcher stopped or traced (the trainer's doing)."""

    violations: list[str] = field(default_factory=list)
    launcher_stopped: str | None = None


@dataclass(frozen=True)
class FoundAtStart:
    """The progress dir and the checkpoint record before the go-ahead: a resumed attempt shares them
    with the attempts before it, and what they left is not this attempt's progress or checkpoint."""

    progress: ProgressSample
    checkpoint: CheckpointReport | None


def found_at_start(ports: Ports) -> FoundAtStart:
    found = _read_checkpoint(ports)
    return FoundAtStart(ports.progress.sample(), found if isinstance(found, CheckpointReport) else None)


class Sampler:
    """One full sample: the launcher's process tree, its GPUs, the progress dir; recorded."""

    def __init__(
        self,
        ports: Ports,
        launched: Launched,
        gpu: GpuBackend,
        recorder: SampleRecorder,
        memory: TrainerMemory | None = None,
        *,
        found: FoundAtStart | None = None,
    ) -> None:
        self._ports = ports
        self._memory = memory
        self._launcher_pid = launched.launcher.pid
        self._gpu = gpu
        self.recorder = recorder
        # The trainer as this sidecar first saw it (trainer_of), and what trainer.json claimed
        # against it: a claim that disagrees is named in the artifact, never followed.
        self.trainer: ProcessInfo | None = None
        self.found = SamplerFindings()
        self.duration_s = 0.0  # of the latest sample
        # The progress dir and checkpoint record as the attempt found them: not its own progress.
        # (None once the files changed: from then on every sample shows this attempt's progress.)
        self.baseline = None if found is None else found.progress
        self.moments = ProgressMoments(inherited=None if found is None else found.checkpoint)

    def take(self, now: float, started: Started) -> Sample:
        tree = self._ports.processes.sample(self._launcher_pid)
        sample = Sample(
            t_wall=self._ports.clock.wall(),
            elapsed_s=round(now - started.monotonic, 6),
            process=tree,
            gpu=self._gpu.sample({p.pid for p in tree.processes}, now),
            progress=self._ports.progress.sample(),
            cgroup=None if self._memory is None else self._memory.sample(),
        )
        steady = self._steady(sample)
        keep = [self._launcher_pid] + ([] if self.trainer is None else [self.trainer.pid])
        self.recorder.add(sample, steady=steady, keep=keep)
        if self.found.launcher_stopped is None:
            tracer = self._ports.processes.tracer(self._launcher_pid)
            self.found.launcher_stopped = launcher_stopped(
                tree.processes, self._launcher_pid, sample.elapsed_s, tracer
            )
        if self.baseline is not None and sample.progress != self.baseline:
            self.baseline = None
        progressed_bytes = sample.progress.bytes_total if self.baseline is None else 0
        self.moments.observe(sample.t_wall, progressed_bytes, self._checkpoint())
        self.duration_s = max(0.0, self._ports.clock.monotonic() - now)
        return sample

    def final_look(self) -> None:
        """Once the trainer has exited: a checkpoint it wrote after the last sample (on a soft stop),
        and the progress records it wrote last."""
        self.moments.observe_checkpoint(self._ports.clock.wall(), self._checkpoint())
        last, known = self._ports.progress.sample(), self.recorder.summary.progress
        if known is not None and last.step is not None:
            update = {"step": last.step, "phase": last.phase, "total_steps": last.total_steps}
            self.recorder.summary.progress = known.model_copy(update=update)

    def _checkpoint(self) -> CheckpointReport | str | None:
        return _read_checkpoint(self._ports)

    def _steady(self, sample: Sample) -> bool:
        """The trainer runs (not a zombie) and has made progress: growth is measured over these."""
        processes = sample.process.processes
        if self.trainer is None:
            self.trainer = trainer_of(processes, self._launcher_pid)
        trainer = self.trainer
        if trainer is None:
            return False
        self._check_claim(trainer)
        if sample.progress.bytes_total <= 0:
            return False
        in_sample = any(
            p.pid == trainer.pid and p.start_ticks == trainer.start_ticks and p.state != ZOMBIE
            for p in processes
        )
        # An exiting trainer closes its fds and frees its memory before it turns zombie: a sample
        # taken then would hide a leak. Exit is irreversible, so looking after the sample is
        # conservative (a trainer that began exiting just after it loses one good sample).
        return in_sample and not self._ports.processes.is_exiting(trainer.pid, trainer.start_ticks)

    def _check_claim(self, trainer: ProcessInfo) -> None:
        """trainer.json against the trainer seen, at every sample until they disagree: the trainer
        can rewrite the file at any time, so a first read that agreed proves nothing later."""
        if self.found.violations:
            return
        with contextlib.suppress(LauncherError):
            claim = self._ports.channel.trainer()
            if claim is not None:
                disagreement = claim_mismatch(claim.pid, claim.start_ticks, trainer)
                self.found.violations.extend([] if disagreement is None else [disagreement])


def watch(
    going: Going,
    *,
    session: LaunchSession,
    sampler: Sampler,
    console: Console,
    signals: DeferredSignals,
    trail: EvidenceTrail | None = None,
) -> Watched:
    """Until the launcher exits. Cancellation and failures of the monitor itself stop the trainer
    and become the verdict: a broken monitor fails the soak, and still writes an artifact."""
    mset, ports = going.settings.monitor, going.ports
    timings = MonitorTimings(
        sample_interval_s=mset.sample_interval_s,
        startup_timeout_s=mset.startup_timeout_s,
        stale_progress_s=mset.stale_progress_s,
        phase_stale_s=mset.phase_stale_s(),
        phase_calibration_factor=mset.phase_calibration_factor,
        progress_signal=mset.progress_signal,
        fallback_after_s=session.fallback_after_s,
        stack_capture_s=mset.stack_capture_s,
    )
    policy = MonitorPolicy(timings, started=going.started.monotonic, baseline=sampler.baseline)
    last_seen = session.last_seen
    go_unix = ports.clock.wall()  # the go-ahead was just given
    try:
        _loop(going, session=session, sampler=sampler, console=console, policy=policy, last_seen=last_seen)
    except (KeyboardInterrupt, Cancelled) as stop:
        signals.defer()
        stop_on_cancellation(going, session, policy, signals, stop_signal(stop), trail=trail)
        session.await_exit(session.fallback_after_s, last_seen)
    except Exception as exc:
        signals.defer()
        reason = f"soak monitor failed: {type(exc).__name__}: {exc}"
        policy.interrupted(monitor_failed(reason))
        session.request_stop("terminate", reason)
        session.await_exit(session.fallback_after_s, last_seen)
    # From here on the artifact comes first: a further Ctrl-C or SIGTERM is noted, not raised.
    signals.defer()
    session.reap(session.fallback_after_s)
    record = ports.channel.wait_exit(2.0)
    violations = list(sampler.found.violations)
    record, unconfirmed_record = _confirmed(going, session, policy, record, violations)
    sampler.final_look()
    return Watched(
        failure=policy.failure,
        gpu_fault=policy.gpu_fault,
        last_seen=tuple(last_seen),
        exit_record=record,
        protocol_violations=tuple(violations),
        stacks=stall_stacks(ports) if policy.stacks_requested else None,
        go_unix=go_unix,
        moments=sampler.moments,
        ran_past_deadline=policy.ran_past_deadline,
        fallback_kill=policy.fallback_kill,
        launcher_stopped=sampler.found.launcher_stopped,
        unconfirmed_record=unconfirmed_record,
    )


def _confirmed(
    going: Going,
    session: LaunchSession,
    policy: MonitorPolicy,
    record: ExitRecord | None,
    violations: list[str],
) -> tuple[ExitRecord | None, ExitRecord | None]:
    """exit.json as the verdict may take it (None: judged as no record, never a pass), and a record
    kept as evidence only; what disagreed is added to ``violations``."""
    found = session.unconfirmed(record, patience_s=_kubelet_patience(going, policy))
    if found is None:
        return record, None
    if found.contradicted or policy.failure is None:
        violations.append(found.problem)
        return None, None
    # A run the sidecar already failed (a pod deleted, within its grace period) whose record the
    # kubelet had not confirmed yet: kept as evidence, never as the verdict's.
    return None, record


def _kubelet_patience(going: Going, policy: MonitorPolicy) -> float:
    """How long a pod's sidecar waits for the kubelet's report of the trainer container's end. A soak
    already failed by what the sidecar saw (a stop from outside, within the pod's grace period)
    waits only as long as for a stop's cause."""
    patience_s, status = going.settings.kube.exit_status_wait_s, going.ports.pod_status
    if policy.failure is not None and status is not None:
        return min(patience_s, status.cause_wait_s)
    return patience_s


def stall_stacks(ports: Ports) -> dict[str, Any]:
    """The stacks the launcher took before a stall's TERM, or why there are none."""
    try:
        record = ports.channel.stacks()
    except LauncherError as exc:
        return {"missing": f"stacks.json is unreadable: {exc}"}
    if record is None:
        return {"missing": "the launcher wrote no stacks.json (it did not act on the stop request in time)"}
    return record.to_json()


def _loop(
    going: Going,
    *,
    session: LaunchSession,
    sampler: Sampler,
    console: Console,
    policy: MonitorPolicy,
    last_seen: list[ProcessInfo],
) -> None:
    clock = going.ports.clock
    mset = going.settings.monitor
    finish = FinishEstimate(mset.throughput_limit(), mset.sample_interval_s)
    while not session.exited():
        now = clock.monotonic()
        seen, sample = _observe(going, sampler, policy.due(now), now)
        eta = None
        if sample is not None:
            last_seen[:] = sample.process.processes
            eta = finish.update(going, sampler.recorder, sample.progress, now, policy.phase_timeouts())
            seen = replace(seen, throughput_drop=finish.dropped)
        action = policy.step(now, seen)
        if sample is not None:
            rate = finish.steps_per_s
            age = policy.progress_age(now)
            _report(going, console, sample, age, duration_s=sampler.duration_s, eta=eta, rate=rate)
        if action.stop is not None:
            session.request_stop(action.stop, action.reason, stacks_timeout_s=action.stacks_timeout_s)
        if action.kill_remembered:
            session.kill_remembered(last_seen)
            return
        going.ports.sleep(policy.sleep_s(clock.monotonic()))


def _observe(going: Going, sampler: Sampler, due: Due, now: float) -> tuple[Observation, Sample | None]:
    ports = going.ports
    clock = ports.clock
    lost = ports.lock_loss.reason
    lock = None if lost is None else lock_loss(lost)
    expired = going.preflight.clock.expired(clock.wall(), clock.monotonic())
    if due == "sample":
        sample = sampler.take(now, going.started)
        # A lost GPU, or a health rule (XID, row remap, ECC, ...) on what the samples showed.
        fault = sample.gpu.fault or sampler.recorder.summary.gpu_fault
        return Observation(sample.progress, gpu_fault(fault) if fault else None, lock, expired), sample
    progress = ports.progress.sample() if due == "liveness" else None
    return Observation(progress, None, lock, expired), None


def _report(
    going: Going,
    console: Console,
    sample: Sample,
    age: float | None,
    *,
    duration_s: float,
    eta: float | None,
    rate: float | None,
) -> None:
    ports = going.ports
    clock = ports.clock
    if ports.publisher is not None:
        wall = clock.wall()
        # Without progress records, nothing of theirs is annotated.
        figures = (
            None
            if rate is None and eta is None
            else ProgressFigures(rate, None if eta is None else wall + eta)
        )
        ports.publisher.progress("running", wall, clock.monotonic(), figures)
    left = going.preflight.clock.remaining(clock.wall(), clock.monotonic())
    console.report(sample, budget_left_s=left, progress_age_s=age, eta_s=eta)
    if ports.metrics is not None:
        ports.metrics.observe(
            sample, budget_left_s=left, progress_age_s=age, duration_s=duration_s, eta_s=eta
        )
