"""A run, as a pipeline of phases; the supervisor only wires them.

    prepare_dirs -> exclusive run dir -> store lock + attempt -> session.start (launcher)
    -> preflight (identity, approval, deadline) -> session.going (heartbeat, go)
    -> watch (monitor policy) -> conclude_run (core.conclusion) -> build_artifact -> deliver

A run that cannot start still ends in a verdict with an artifact (``_unstarted``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from sidecar.app.artifact import Evidence, build_artifact, provisional_artifact
from sidecar.app.concluding import conclude_run
from sidecar.app.console import Console
from sidecar.app.delivery import Delivery, LedgerPlace, deliver, key_prefix, runs_prefix
from sidecar.app.evidence import EvidenceTrail
from sidecar.app.ledger import earlier_budget, earlier_lost, lost_entry, slow_beside_other_indexes
from sidecar.app.monitoring import Sampler, found_at_start, watch
from sidecar.app.ports import ArtifactFiles, Ports
from sidecar.app.preflight import preflight, prepare_dirs
from sidecar.app.session import LaunchSession
from sidecar.app.signals import Cancelled, DeferredSignals
from sidecar.app.stopping import cancellation, stop_signal
from sidecar.app.values import Going, Launched, Preflight, RunRequest, RunResult, Started, Watched
from sidecar.core import verdict as verdicts
from sidecar.core.artifact import SampleRecorder, UploadInfo
from sidecar.core.artifact.objects import SAMPLES_FILE
from sidecar.core.classification import Classification
from sidecar.core.errors import (
    ConfigError,
    InsufficientBudgetError,
    LauncherError,
    RefusedError,
    SoakError,
    TrainerNotStartedError,
    TransientError,
)
from sidecar.core.exitcodes import ExitCode
from sidecar.core.gpu_health import GpuHealthTracker
from sidecar.core.monitor_policy import monitor_failed
from sidecar.core.pod_facts import PodMoments
from sidecar.core.ports import GpuBackend, TrainerMemory
from sidecar.core.sample_lines import SampleLines
from sidecar.core.samples import GpuDevice
from sidecar.core.store_features import StoreFeatures
from sidecar.settings import Settings

TRAINER_FAILED_WHILE_RUNNING = "soak-sidecar failed while the trainer was running"
# Seconds a launcher that never got its go-ahead is given to exit, past its kill grace.
UNSTARTED_REAP_SLACK_S = 5.0


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        ports: Ports,
        request: RunRequest,
    ) -> None:
        if request.mode == "local" and not request.command:
            raise ConfigError("local mode needs a trainer command")
        self._settings = settings
        self._ports = ports
        self._session = LaunchSession(settings, ports, request)
        clock = ports.clock
        self._started = Started(request, wall=clock.wall(), monotonic=clock.monotonic())
        self._console = Console(ports.status_stream, settings.monitor.status_line)
        self._signals = DeferredSignals()
        self._trail: EvidenceTrail | None = None
        self._store: StoreFeatures | None = None

    def run(self) -> RunResult:
        """The pipeline inside its guards: one sidecar per run dir, the store's lock from before the
        launcher starts to the verdict (no other pod can start the run meanwhile), and a verdict for
        every way a run ends."""
        prepare_dirs(self._settings, self._started.request.mode, self._ports.workdirs)
        self._started = replace(self._started, artifact_dir=self._artifact_dir(0))
        try:
            with contextlib.ExitStack() as held:
                self._hold_run_dir(held)
                try:
                    self._check_store()
                    held.enter_context(self._ports.store.lock(self._started.request.slot))
                    held.callback(self._session.reap, self._unstarted_reap_s)
                    return self._pipeline()
                except ConfigError as exc:
                    # A usage error (exit 64): the launcher must not wait for a go that never comes.
                    self._release_launcher(str(exc), int(exc.exit_code))
                    raise
                except (RefusedError, InsufficientBudgetError, TransientError) as exc:
                    refusal = verdicts.refused(str(exc), classification=_refusal_kind(exc))
                    self._release_launcher(str(exc), int(refusal.exit_code) or 1)
                    return self._unstarted(refusal)
                except Exception as exc:
                    # A bug, or input nothing foresaw: the trainer is stopped (_stopping_on_failure)
                    # and the run still ends in a verdict, an artifact and a publication.
                    reason = f"soak-sidecar failed: {type(exc).__name__}: {exc}"
                    self._release_launcher(reason, int(ExitCode.INTERNAL))
                    return self._unstarted(verdicts.stopped(Classification.MONITOR_FAILURE, reason))
        except (KeyboardInterrupt, Cancelled) as stop:
            # Interrupted before monitoring began (waiting for the launcher, the store lock, ...):
            # still an external cancellation with an artifact, and the trainer must not run on.
            self._signals.defer()
            return self._cancelled_before_monitoring(stop_signal(stop))
        finally:
            if self._trail is not None:
                self._trail.close()
            self._signals.restore()
            self._console.close()

    def _check_store(self) -> None:
        """The S3 store must honour conditional writes (and confirm checksums, unless accepted)
        before the first lock or claim: a refusal is configuration (exit 64)."""
        if self._ports.store_check is not None:
            self._store = self._ports.store_check.check(self._started.request.slot)

    def _pipeline(self) -> RunResult:
        try:
            launched = self._session.start(self._console)
        except TrainerNotStartedError as exc:
            self._session.abort(str(exc), int(ExitCode.TRAINER_NOT_STARTED))
            return self._unstarted(verdicts.stopped(Classification.TRAINER_NOT_STARTED, str(exc)))
        except LauncherError as exc:
            return self._unstarted(verdicts.stopped(Classification.LAUNCHER_MISSING, str(exc)))
        checked: Preflight | None = None
        try:
            checked = preflight(self._settings, self._ports, self._started, launched)
            files, trail = self._claim_attempt(launched, checked)
            # The trainer inherits the launcher's environment (go.json names no GPUs), so the
            # launcher's NVIDIA_VISIBLE_DEVICES is the trainer's; under another UID its environ is
            # unreadable and launcher.json's report stands in. Opened before the go-ahead, so a
            # broken GPU setup stops the run before the trainer starts.
            environ = self._ports.processes.environ(launched.launcher.pid)
            trainer_env = dict(launched.launcher.gpu_env if environ is None else environ)
            gpu = self._ports.open_gpu(trainer_env or None)
            # The launcher's memory cgroup, found while only the launcher runs in it.
            opener = self._ports.trainer_memory
            memory = None if opener is None else opener(launched.launcher.pid)
            going = Going(self._settings, self._ports, self._started, launched, checked)
            with self._stopping_on_failure(), contextlib.closing(gpu):
                before = gpu.look(set())  # what the node's GPUs held before the trainer started
                watched, recorder, devices = self._watch(going, gpu, files, trail, memory)
                concluded = conclude_run(
                    going,
                    watched,
                    session=self._session,
                    recorder=recorder,
                    gpu=gpu,
                    gpu_before=before,
                    memory=memory,
                )
        except LauncherError as exc:
            return self._run_dir_broke(exc, launched, checked)
        if (progress := recorder.summary.progress) is not None:
            where = runs_prefix(self._settings, self._started.request)
            progress.slow_index = slow_beside_other_indexes(self._ports, self._started, where, progress)
        evidence = concluded.evidence(
            self._started,
            launched,
            checked,
            watched,
            devices=devices,
            env=trainer_env,
            pod=self._pod_moments(),
        )
        return self._deliver(files, evidence, concluded.conclusion.verdict, recorder)

    def _claim_attempt(self, launched: Launched, checked: Preflight) -> tuple[ArtifactFiles, EvidenceTrail]:
        """Numbered once the deadline record exists and the run may start: a run refused or unable
        to start uses no attempt, and the ledger never holds a claim without a record. The
        provisional artifact follows at once, before the trainer starts."""
        request = self._started.request
        attempt = self._ports.store.claim_attempt(request.slot)
        self._started = replace(
            self._started,
            attempt=attempt,
            artifact_dir=self._artifact_dir(attempt),
            lost_attempts=earlier_lost(
                self._ports, request, attempt, prefix=runs_prefix(self._settings, request)
            ),
        )
        files = self._ports.artifact_files(self._started.artifact_dir)
        files.create()
        trail = self._trail = EvidenceTrail(
            files=files,
            sink=self._ports.sink,
            publisher=self._ports.publisher,
            key_prefix=key_prefix(self._settings, self._started.request, str(attempt)),
            flush_s=self._settings.evidence.flush_s,
            clock=self._ports.clock,
            console_logs=self._ports.channel.console_logs,
        )
        self._tell_earlier_budget()
        evidence = Evidence(self._started, launched=launched, preflight=checked)
        try:
            trail.begin(provisional_artifact(self._settings, self._ports, evidence))
        except OSError as exc:
            raise ConfigError(f"cannot write the provisional artifact in {files.path}: {exc}") from exc
        return files, trail

    def _tell_earlier_budget(self) -> None:
        """The live endpoint's goodput and budget by cause, as the ledger says of the earlier attempts
        (until now); this attempt's own part follows with its verdict."""
        metrics, request = self._ports.metrics, self._started.request
        if metrics is None:
            return
        found = earlier_budget(
            self._ports,
            run_id=request.run_id,
            runs_prefix=runs_prefix(self._settings, request),
            until=self._ports.clock.wall(),
        )
        if found is not None:
            metrics.run_budget(found.goodput, {"productive": found.productive_s, **found.badput_s})

    def _pod_moments(self) -> PodMoments | None:
        """The pod's own moments, for the attempt's phases; a restarted sidecar's attempt began
        long after its pod, so it has none."""
        status = self._ports.pod_status
        if status is None or self._started.already_going:
            return None
        return status.moments()

    def _hold_run_dir(self, held: contextlib.ExitStack) -> None:
        # Before anything touches the run dir: a second sidecar must not reset or abort the first
        # one's launcher.
        held.enter_context(self._ports.channel.exclusive())
        if self._started.request.mode == "pod" and self._ports.channel.go_given():
            # A restarted sidecar: the trainer already runs. Keep its launcher fed while the store's
            # lock is re-acquired (an S3 lease may take lock_lease_s).
            self._started = replace(self._started, already_going=True)
            held.enter_context(self._ports.channel.heartbeat(self._settings.launcher.heartbeat_interval_s))

    @contextlib.contextmanager
    def _stopping_on_failure(self) -> Iterator[None]:
        """When supervision itself fails, kill the trainer's process group at once rather than
        leave it running until the heartbeat timeout."""
        try:
            yield
        except BaseException:
            self._session.emergency_stop(TRAINER_FAILED_WHILE_RUNNING, self._session.last_seen)
            raise

    def _watch(
        self,
        going: Going,
        gpu: GpuBackend,
        files: ArtifactFiles,
        trail: EvidenceTrail,
        memory: TrainerMemory | None,
    ) -> tuple[Watched, SampleRecorder, tuple[GpuDevice, ...]]:
        """Heartbeat and go-ahead, then monitoring until the launcher exits; samples streamed."""
        found = found_at_start(self._ports)  # before the go-ahead: the earlier attempts' files
        with self._session.going(self._settings, self._started, going.preflight):
            samples = files.open_samples(SAMPLES_FILE)
            trail.follow(samples)
            recorder = SampleRecorder(
                samples.write_line,
                self._settings.monitor.series_points,
                GpuHealthTracker(self._settings.gpu.fail_on_slowdown_s),
                SampleLines(
                    self._settings.monitor.sample_processes, self._settings.monitor.sample_command_bytes
                ),
            )
            try:
                watched = watch(
                    going,
                    session=self._session,
                    sampler=Sampler(self._ports, going.launched, gpu, recorder, memory, found=found),
                    console=self._console,
                    signals=self._signals,
                    trail=trail,
                )
            finally:
                devices = _devices(gpu)
                samples.close()
        if samples.error is not None and watched.failure is None:
            watched = replace(watched, failure=monitor_failed(f"soak monitor failed: {samples.error}"))
        return watched, recorder, devices

    @property
    def _unstarted_reap_s(self) -> float:
        return self._settings.launcher.kill_grace_s + UNSTARTED_REAP_SLACK_S

    def _run_dir_broke(self, exc: LauncherError, launched: Launched, checked: Preflight | None) -> RunResult:
        """The run dir broke mid-protocol (unwritable, malformed record): the trainer has been
        stopped; the verdict still gets its artifact."""
        reason = f"soak monitor failed: {type(exc).__name__}: {exc}"
        return self._unstarted(verdicts.stopped(Classification.MONITOR_FAILURE, reason), launched, checked)

    def _cancelled_before_monitoring(self, signal: str) -> RunResult:
        cause = cancellation(self._ports, signal)
        reason = cause.reason
        decision = verdicts.stopped(cause.kind, reason)
        self._session.abort(reason, int(decision.exit_code))
        if self._ports.channel.launch_id is not None:
            self._session.request_stop("kill", reason)
        self._session.reap(self._unstarted_reap_s)
        return self._unstarted(decision)

    def _release_launcher(self, reason: str, exit_code: int) -> None:
        self._session.abort(reason, exit_code)
        self._session.reap(self._unstarted_reap_s)

    def _unstarted(
        self, verdict: verdicts.Verdict, launched: Launched | None = None, checked: Preflight | None = None
    ) -> RunResult:
        exit_record = None
        with contextlib.suppress(LauncherError):
            exit_record = self._ports.channel.read_exit()
        evidence = Evidence(self._started, launched=launched, preflight=checked, exit_record=exit_record)
        files = self._ports.artifact_files(self._started.artifact_dir)
        recorder = SampleRecorder(None, self._settings.monitor.series_points)
        return self._deliver(files, evidence, verdict, recorder)

    def _deliver(
        self, files: ArtifactFiles, evidence: Evidence, verdict: verdicts.Verdict, recorder: SampleRecorder
    ) -> RunResult:
        settings, ports = self._settings, self._ports
        if self._started.request.mode == "local":
            # The local run dir stays under --output, often archived with the artifact. (A pod's
            # is an emptyDir, and a restarted sidecar re-reads the trainer command from it.)
            with contextlib.suppress(LauncherError, OSError):
                ports.channel.redact_commands()
        artifact = build_artifact(settings, ports, files, evidence, verdict=verdict, recorder=recorder)
        attempt = self._started.attempt
        trail = self._trail
        sent = UploadInfo() if trail is None else trail.close()
        sent.checksums_unverified = self._store is not None and not self._store.checksums_confirmed
        return deliver(
            self._ports,
            files,
            artifact,
            verdict,
            Delivery(
                key_prefix=key_prefix(
                    self._settings, self._started.request, str(attempt) if attempt else files.path.name
                ),
                attempt=attempt,
                deadline_unix=None if evidence.preflight is None else evidence.preflight.record.deadline_unix,
                index=self._started.request.index,
                indexes=None if self._started.request.index is None else self._started.request.indexes,
                sent=sent,
                ledger=self._ledger_place(evidence),
            ),
        )

    def _ledger_place(self, evidence: Evidence) -> LedgerPlace | None:
        """Where the run's ledger is; None for a run that got no deadline record (it spent none)."""
        if evidence.preflight is None:
            return None
        request = self._started.request
        lost = (lost_entry(each, request.index) for each in self._started.lost_attempts)
        return LedgerPlace(
            run_id=request.run_id,
            runs_prefix=runs_prefix(self._settings, request),
            deadline_started_unix=evidence.preflight.record.started_unix,
            lost=tuple(entry for entry in lost if entry is not None),
        )

    def _artifact_dir(self, attempt: int) -> Path:
        request = self._started.request
        if attempt:
            index = "" if request.index is None else f"index-{request.index}-"
            label = f"-{request.attempt_label}" if request.attempt_label else ""
            name = f"{index}attempt-{attempt}{label}"
        else:
            now = datetime.fromtimestamp(self._ports.clock.wall(), tz=timezone.utc)
            # No attempt number (refused, or could not start): a unique name, so these never collide.
            name = f"unnumbered-{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{uuid.uuid4().hex[:8]}"
        return self._settings.artifact.output_dir / "runs" / request.run_id / name


def _refusal_kind(exc: SoakError) -> Classification:
    if isinstance(exc, InsufficientBudgetError):
        return Classification.INSUFFICIENT_BUDGET
    if isinstance(exc, TransientError):
        return Classification.TRANSIENT_INFRA
    return Classification.REFUSED


def _devices(gpu: GpuBackend) -> tuple[GpuDevice, ...]:
    with contextlib.suppress(SoakError):
        return tuple(gpu.devices())
    return ()
