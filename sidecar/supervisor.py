"""Orchestration: the one module (with the CLI) that sees every layer.

One run: find the launcher, resolve the identity, create or resume the deadline under the store's
lock, give the go-ahead, sample and watch liveness until the launcher reports the trainer's end,
then residual check, run_summary validation, verdict, artifact (local first), upload, publication.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any, Literal, cast

import psutil

from sidecar import __version__
from sidecar.adapters.filestore import canonical_path, identity_from_settings
from sidecar.adapters.fsutil import fsync_dir
from sidecar.adapters.rundir import (
    ExitRecord,
    Heartbeat,
    LauncherInfo,
    RunDir,
    TrainerInfo,
    spawn_local_launcher,
)
from sidecar.adapters.validators import resolve_manifest_validator
from sidecar.core import verdict as verdicts
from sidecar.core.approval import attempt_command, check_approval
from sidecar.core.artifact import (
    Artifact,
    DeadlineInfo,
    MonitorConfig,
    PostShutdown,
    SampleRecorder,
    UploadInfo,
    dumps_artifact,
    leak_failures,
    run_summary_figures,
)
from sidecar.core.deadline import DeadlineClock, DeadlineRecord, check_startable, create_or_resume
from sidecar.core.errors import (
    ConfigError,
    InsufficientBudgetError,
    LauncherError,
    RefusedError,
    SoakError,
    TransientError,
    UploadError,
)
from sidecar.core.keys import render_key_prefix
from sidecar.core.liveness import LivenessTracker
from sidecar.core.ports import (
    ArtifactSink,
    Clock,
    DeadlineStore,
    GpuBackend,
    ProcessSampler,
    ProgressProbe,
)
from sidecar.core.publication import Publication
from sidecar.core.run_summary import SummaryOutcome, evaluate_run_summary
from sidecar.core.samples import GpuSample, ProcessInfo, Sample
from sidecar.core.status import status_json, status_line
from sidecar.launcher import GO_FILE
from sidecar.settings import Settings

Mode = Literal["local", "pod"]
SAMPLES_FILE = "samples.jsonl.gz"
ARTIFACT_FILE = "artifact.json"
# How long the sidecar waits past the launcher's own TERM->KILL escalation before it kills the
# remembered processes itself (the launcher may be wedged or gone).
FALLBACK_SLACK_S = 10.0


class SystemClock:
    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class LockLoss:
    """Set by a deadline store whose lock (an S3 lease) was lost while the run was going."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


@dataclass
class Ports:
    """Everything with side effects the supervisor uses, injected by the CLI (or a test)."""

    sampler: ProcessSampler
    progress: ProgressProbe
    open_gpu: Callable[[Mapping[str, str] | None], GpuBackend]
    store: DeadlineStore
    sink: ArtifactSink | None = None
    publish: Callable[[Publication], list[str]] | None = None
    # Rate-limited "still running" note (pod annotations); called once per sample.
    progress_note: Callable[[str, float, float], object] | None = None
    read_environ: Callable[[int], Mapping[str, str] | None] = lambda _pid: None
    image_digest: Callable[[], str | None] = lambda: None
    lock_loss: LockLoss = field(default_factory=LockLoss)
    clock: Clock = field(default_factory=SystemClock)
    status_stream: IO[str] | None = None


@dataclass(frozen=True)
class RunResult:
    verdict: verdicts.Verdict
    artifact_path: Path | None
    exit_code: int


@dataclass
class _Monitor:
    """What the monitoring phase learned."""

    failure: tuple[verdicts.MonitorKind, str] | None = None
    exit_record: ExitRecord | None = None
    last_processes: list[ProcessInfo] = field(default_factory=list)
    gpu_fault: str | None = None


class TerminalStatus:
    """A status line kept at the bottom of a terminal, with the trainer's output scrolling above.

    Local mode pipes the launcher's output through here; writes from the sampling loop and the
    output reader are serialised so neither clobbers the other.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._status = ""
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def status(self, line: str) -> None:
        with self._lock:
            self._status = line
            self._stream.write("\r\x1b[2K" + line)
            self._stream.flush()

    def output(self, line: str) -> None:
        with self._lock:
            self._stream.write("\r\x1b[2K" + line.rstrip("\n") + "\n" + self._status)
            self._stream.flush()

    def pump(self, source: IO[bytes]) -> threading.Thread:
        """Copy ``source`` line by line above the status line, on a daemon thread, until EOF."""

        def copy() -> None:
            for raw in iter(source.readline, b""):
                self.output(raw.decode("utf-8", errors="replace"))
            source.close()

        thread = threading.Thread(target=copy, name="soak-console", daemon=True)
        thread.start()
        self._pumps.append(thread)
        return thread

    def close(self) -> None:
        for thread in self._pumps:
            thread.join(timeout=2.0)  # the launcher has exited: the pipe is at EOF or soon
        with self._lock:
            if self._status:
                self._stream.write("\n")
                self._stream.flush()
            self._status = ""


class Cancelled(BaseException):
    """SIGTERM to the sidecar: treated like Ctrl-C (external cancellation)."""


def raise_cancelled(signum: int, _frame: object) -> None:
    raise Cancelled(signal.Signals(signum).name)


INTERRUPTED_REASON = "soak was interrupted before the trainer completed"


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        ports: Ports,
        *,
        mode: Mode,
        run_id: str,
        command: Sequence[str] | None = None,
        context: Mapping[str, Any] | None = None,
        attempt_label: str | None = None,
    ) -> None:
        if mode == "local" and not command:
            raise ConfigError("local mode needs a trainer command")
        self.settings = settings
        self.ports = ports
        self.mode = mode
        self.run_id = run_id
        self.command = list(command or [])
        self.context = dict(context or {})
        # Numbered by the deadline store once its lock is held; 0 until then (a refused run).
        self.attempt = 0
        self._attempt_label = attempt_label
        self.run_dir = RunDir(settings.launcher.run_dir)
        self.artifact_dir = self._artifact_dir()
        self._launcher_proc: subprocess.Popen[bytes] | None = None
        self._launcher: LauncherInfo | None = None
        self._started_wall = 0.0
        self._started_mono = 0.0
        self._record: DeadlineRecord | None = None
        self._resumed = False
        self._deadline_clock: DeadlineClock | None = None
        self._gpu: GpuBackend | None = None
        self._recorder: SampleRecorder | None = None
        self._trainer_env: Mapping[str, str] | None = None
        self._resume_checkpoint: str | None = None
        self._extra_args: tuple[str, ...] = ()
        self._last_seen: list[ProcessInfo] = []
        self._remaining_at_start = 0.0
        # Resolved now: a bad validator setting must fail before the trainer runs, not after.
        self._manifest_validator = resolve_manifest_validator(settings.summary.manifest_validator)
        self._trainer: TrainerInfo | None = None
        self._saved_handlers: dict[int, Any] | None = None
        self._terminal = self._terminal_status()

    # ------------------------------------------------------------------ entry point

    def run(self) -> RunResult:
        clock = self.ports.clock
        self._started_wall = clock.wall()
        self._started_mono = clock.monotonic()
        self._prepare_dirs()
        try:
            with contextlib.ExitStack() as stack:
                # Before anything touches the run dir: a second sidecar must not reset or abort
                # the first one's launcher.
                stack.enter_context(self.run_dir.exclusive())
                if self._already_going():
                    # A restarted sidecar: the trainer already runs. Keep its launcher fed while
                    # the store's lock is re-acquired (an S3 lease may take lock_lease_s).
                    stack.enter_context(Heartbeat(self.run_dir, self.settings.launcher.heartbeat_interval_s))
                return self._run_with_lock()
        except (KeyboardInterrupt, Cancelled):
            # Interrupted before monitoring began (waiting for the launcher, the store lock, ...):
            # still an external cancellation with an artifact, and the trainer must not run on.
            self._defer_signals()
            return self._cancelled_before_monitoring()
        finally:
            self._restore_signals()
            if self._terminal is not None:
                self._terminal.close()

    def _prepare_dirs(self) -> None:
        """Unusable directories are a usage error now, not a lost artifact after the run.

        The sidecar writes the run dir and its output; the progress dir it only reads (in a pod it
        is the trainer's volume, mounted read-only into the sidecar), and creates it only locally.
        """
        writable = [self.settings.launcher.run_dir, self.settings.artifact.output_dir]
        progress = self.settings.monitor.progress_dir
        if self.mode == "local":
            writable.insert(0, progress)
        for directory in writable:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot use directory {directory}: {exc}") from exc
            if not os.access(directory, os.W_OK | os.X_OK):
                raise ConfigError(f"directory {directory} is not writable")
        if self.mode == "pod" and not (progress.is_dir() and os.access(progress, os.R_OK | os.X_OK)):
            raise ConfigError(f"progress directory {progress} is missing or not readable")

    def _cancelled_before_monitoring(self) -> RunResult:
        decision = verdicts.stopped("external_cancellation", INTERRUPTED_REASON)
        with contextlib.suppress(LauncherError):
            self.run_dir.abort(INTERRUPTED_REASON, int(decision.exit_code))
        if self.run_dir.launch_id is not None:
            with contextlib.suppress(LauncherError):
                self.run_dir.request("kill", INTERRUPTED_REASON)
        self._reap_local_launcher(timeout_s=self.settings.launcher.kill_grace_s + 5)
        return self._finish_unstarted(decision)

    def _terminal_status(self) -> TerminalStatus | None:
        stream = self.ports.status_stream
        mode = self.settings.monitor.status_line
        if stream is None or mode in ("off", "json"):
            return None
        if mode == "auto" and not stream.isatty():
            return None
        return TerminalStatus(stream)

    def _artifact_dir(self) -> Path:
        if self.attempt:
            name = f"attempt-{self.attempt}" + (f"-{self._attempt_label}" if self._attempt_label else "")
        else:
            name = "unlocked-" + datetime.now(tz=timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        return self.settings.artifact.output_dir / "runs" / self.run_id / name

    def _run_with_lock(self) -> RunResult:
        """The store's lock is held from before the launcher starts to the verdict (the seed's rule).

        In local mode the lock's descriptor is inherited by the launcher too, so the run stays
        locked while the launcher may still kill the trainer after the sidecar died.
        """
        try:
            with self.ports.store.lock(self.run_id):
                self.attempt = self.ports.store.claim_attempt(self.run_id)
                self.artifact_dir = self._artifact_dir()
                self.artifact_dir.mkdir(parents=True, exist_ok=True)
                try:
                    self._start_launcher()
                except LauncherError as exc:
                    return self._finish_unstarted(verdicts.stopped("launcher_missing", str(exc)))
                try:
                    return self._run_locked()
                except LauncherError as exc:
                    # The run dir broke mid-protocol (unwritable, malformed record): the trainer
                    # has been stopped; the verdict still gets its artifact.
                    reason = f"soak monitor failed: {type(exc).__name__}: {exc}"
                    return self._finish_unstarted(verdicts.stopped("monitor_failure", reason))
        except ConfigError as exc:
            # A usage error (exit 64): the launcher must not wait for a go that never comes.
            with contextlib.suppress(LauncherError):
                self.run_dir.abort(str(exc), int(exc.exit_code))
            self._reap_local_launcher(timeout_s=self.settings.launcher.kill_grace_s + 5)
            raise
        except (RefusedError, InsufficientBudgetError, TransientError) as exc:
            kind: verdicts.PreStartKind = (
                "insufficient_budget"
                if isinstance(exc, InsufficientBudgetError)
                else "transient_infra"
                if isinstance(exc, TransientError)
                else "refused"
            )
            refusal = verdicts.refused(str(exc), classification=kind)
            with contextlib.suppress(LauncherError):
                self.run_dir.abort(str(exc), int(refusal.exit_code) or 1)
            self._reap_local_launcher(timeout_s=self.settings.launcher.kill_grace_s + 5)
            return self._finish_unstarted(refusal)
        finally:
            self._reap_local_launcher(timeout_s=self.settings.launcher.kill_grace_s + 5)

    # ------------------------------------------------------------------ start

    def _start_launcher(self) -> None:
        lset = self.settings.launcher
        if self.mode == "local":
            self.run_dir.reset()
            lock_fd = self.ports.store.inheritable_lock_fd(self.run_id)
            self._launcher_proc = spawn_local_launcher(
                lset.run_dir,
                self.command,
                go_timeout_s=lset.go_timeout_s,
                pass_fds=() if lock_fd is None else (lock_fd,),
                stdout=subprocess.PIPE if self._terminal is not None else None,
                stderr=subprocess.STDOUT if self._terminal is not None else None,
            )
            proc = self._launcher_proc
            if self._terminal is not None and proc.stdout is not None:
                self._terminal.pump(proc.stdout)
            self._launcher = self.run_dir.wait_for_launcher(
                lset.appear_timeout_s, alive=lambda: proc.poll() is None
            )
        else:
            self._launcher = self.run_dir.wait_for_launcher(lset.appear_timeout_s)
            self.command = list(self._launcher.command)
            early = self.run_dir.read_exit()
            if early is not None and not self.run_dir.file(GO_FILE).exists():
                # The trainer container gave up (go timeout, signal) before this sidecar was ready.
                raise LauncherError(f"the launcher exited before the sidecar was ready ({early.reason})")
        if not self.command:
            raise LauncherError("the launcher announced no trainer command")
        if not self._launcher.subreaper:
            # Without the subreaper, orphaned workers escape cleanup: refuse rather than leak.
            raise RefusedError("the launcher is not a child subreaper; refusing to start the trainer")

    def _run_locked(self) -> RunResult:
        clock = self.ports.clock
        dset = self.settings.deadline
        identity = identity_from_settings(
            dset,
            run_id=self.run_id,
            command=self.command,
            deadline_store=self.ports.store.location,
            image_digest=self.ports.image_digest(),
        )
        resume_checkpoint = None if dset.resume_checkpoint is None else canonical_path(dset.resume_checkpoint)
        approval = None
        if dset.approval_file is not None:
            try:
                approval = dset.approval_file.read_bytes()
            except OSError as exc:
                raise RefusedError(f"cannot read approval file {dset.approval_file}: {exc}") from exc
        check_approval(
            approval,
            identity,
            required=dset.require_approval or dset.approval_file is not None,
            resume_checkpoint=resume_checkpoint,
            resume_checkpoint_exists=None if resume_checkpoint is None else Path(resume_checkpoint).is_file(),
        )
        self._resume_checkpoint = resume_checkpoint
        self._extra_args = attempt_command(identity, resume_checkpoint, resume_flag=dset.resume_flag)[
            len(identity.command) :
        ]
        self._resumed = self.ports.store.load(self.run_id) is not None
        record = create_or_resume(
            self.ports.store,
            identity,
            now_wall=clock.wall(),
            resume_required=dset.resume or resume_checkpoint is not None,
            max_budget_s=dset.max_budget_s,
        )
        deadline_clock = DeadlineClock(record, now_wall=clock.wall(), now_monotonic=clock.monotonic())
        if not self._already_going():
            # The seed's rule is about starting; a restarted sidecar finds its trainer running.
            check_startable(deadline_clock, clock.wall(), clock.monotonic())
        self._record, self._deadline_clock = record, deadline_clock
        self._remaining_at_start = deadline_clock.remaining(clock.wall(), clock.monotonic())
        self._open_gpu()
        return self._run_started(record)

    def _already_going(self) -> bool:
        """Pod mode after a sidecar restart: the launcher got its go-ahead from our predecessor."""
        return self.mode == "pod" and self.run_dir.file(GO_FILE).exists()

    def _run_started(self, record: DeadlineRecord) -> RunResult:
        try:
            return self._run_going(record)
        except BaseException:
            # The seed's guardian kills the owned group when its supervisor fails: so do we,
            # rather than leave the trainer to the heartbeat timeout.
            self._emergency_stop("soak-sidecar failed while the trainer was running")
            raise

    def _emergency_stop(self, reason: str) -> None:
        with contextlib.suppress(Exception):
            self._request_stop("kill", reason)
            end = time.monotonic() + self.settings.launcher.kill_grace_s + 2.0
            while not self._launcher_exited() and time.monotonic() < end:
                time.sleep(0.05)
        with contextlib.suppress(Exception):
            self._kill_remembered(self._last_seen)

    def _run_going(self, record: DeadlineRecord) -> RunResult:
        lset = self.settings.launcher
        with Heartbeat(self.run_dir, lset.heartbeat_interval_s):
            if not self._already_going():
                self.run_dir.give_go(
                    deadline_unix=record.deadline_unix,
                    checkpoint_margin_s=record.checkpoint_margin_seconds,
                    term_grace_s=self.settings.deadline.term_grace_s,
                    heartbeat_timeout_s=lset.heartbeat_timeout_s,
                    kill_grace_s=lset.kill_grace_s,
                    console_log_bytes=lset.console_log_bytes,
                    soft_stop_signal=lset.soft_stop_signal,
                    run_id=self.run_id,
                    progress_dir=self.settings.monitor.progress_dir.resolve(),
                    deadline_record=record.as_json(),
                    env=(
                        {"SOAK_RESUME_CHECKPOINT": self._resume_checkpoint}
                        if self._resume_checkpoint
                        else None
                    ),
                    extra_args=self._extra_args,
                )
            samples = SamplesFile(self.artifact_dir / SAMPLES_FILE)
            try:
                self._recorder = SampleRecorder(samples.write_line, self.settings.monitor.series_points)
                monitor = self._monitor()
            finally:
                self._close_gpu()
                samples.close()
        if samples.error is not None and monitor.failure is None:
            monitor.failure = ("monitor_failure", f"soak monitor failed: {samples.error}")
        return self._conclude(monitor)

    # ------------------------------------------------------------------ monitoring

    def _launcher_exited(self) -> bool:
        if self._launcher_proc is not None:
            return self._launcher_proc.poll() is not None
        if self.run_dir.read_exit() is not None:
            return True
        assert self._launcher is not None
        return not _same_process_alive(self._launcher.pid, self._launcher.start_ticks)

    def _open_gpu(self) -> GpuBackend:
        """Opened before the go-ahead, so a broken GPU setup stops the run before the trainer
        starts. The trainer inherits the launcher's environment (plus go.json's, which names no
        GPUs), so the launcher's NVIDIA_VISIBLE_DEVICES is the trainer's."""
        if self._gpu is None:
            assert self._launcher is not None
            self._trainer_env = self.ports.read_environ(self._launcher.pid)
            self._gpu = self.ports.open_gpu(self._trainer_env)
        return self._gpu

    def _close_gpu(self) -> None:
        if self._gpu is not None:
            self._gpu.close()

    def _monitor(self) -> _Monitor:
        clock = self.ports.clock
        mset = self.settings.monitor
        assert self._launcher is not None and self._deadline_clock is not None
        result = _Monitor()
        liveness = LivenessTracker(
            mset.startup_timeout_s, mset.stale_progress_s, self._started_mono, mset.progress_signal
        )
        # Liveness is judged more often than full samples when its timeouts are short, so a
        # stale trainer is caught within a tenth of the timeout, not a whole sample interval late.
        liveness_interval = min(
            mset.sample_interval_s, max(0.1, min(mset.stale_progress_s, mset.startup_timeout_s) / 10)
        )
        next_sample = next_liveness = clock.monotonic()
        stop_by: float | None = None
        try:
            while not self._launcher_exited():
                now = clock.monotonic()
                stale = None
                if now >= next_liveness and now < next_sample:
                    stale = liveness.observe(self.ports.progress.sample(), now)
                    next_liveness = now + liveness_interval
                if now >= next_sample:
                    sample = self._take_sample(now)
                    result.last_processes = self._last_seen = list(sample.process.processes)
                    if sample.gpu.fault and result.gpu_fault is None:
                        result.gpu_fault = sample.gpu.fault
                    stale = liveness.observe(sample.progress, now)
                    next_liveness = now + liveness_interval
                    next_sample = now + mset.sample_interval_s
                    self._report(sample, liveness.last_progress_age(now))
                if stale is not None and result.failure is None:
                    result.failure = (cast("verdicts.MonitorKind", stale[0]), stale[1])
                lost = self.ports.lock_loss.reason
                if lost is not None and stop_by is None:
                    # Another supervisor may take the run over: ours must stop now (fail closed).
                    result.failure = result.failure or ("monitor_failure", f"deadline lock lost: {lost}")
                    stop_by = self._request_stop("kill", f"deadline lock lost: {lost}")
                if result.gpu_fault is not None and stop_by is None:
                    stop_by = self._request_stop("terminate", f"GPU fault: {result.gpu_fault}")
                if stale is not None and stop_by is None:
                    stop_by = self._request_stop("terminate", stale[1])
                if stop_by is None and self._deadline_clock.expired(clock.wall(), clock.monotonic()):
                    # The launcher enforces the deadline itself; this is the second line.
                    stop_by = self._request_stop("kill", "total-job deadline expired")
                if stop_by is not None and clock.monotonic() > stop_by:
                    self._kill_remembered(result.last_processes)
                    break
                time.sleep(min(0.1, max(0.005, min(next_sample, next_liveness) - clock.monotonic())))
        except (KeyboardInterrupt, Cancelled):
            self._defer_signals()
            result.failure = ("external_cancellation", INTERRUPTED_REASON)
            self._request_stop("terminate", INTERRUPTED_REASON)
            self._await_exit(self.settings.launcher.kill_grace_s + FALLBACK_SLACK_S, result)
        except Exception as exc:
            # The seed's rule: any failure of the monitor itself (not only our own errors: a
            # broken adapter, a full disk) fails the soak as monitor_failure, with an artifact.
            self._defer_signals()
            reason = f"soak monitor failed: {type(exc).__name__}: {exc}"
            result.failure = ("monitor_failure", reason)
            self._request_stop("terminate", reason)
            self._await_exit(self.settings.launcher.kill_grace_s + FALLBACK_SLACK_S, result)
        # From here on the artifact comes first: a further Ctrl-C or SIGTERM is noted, not raised.
        self._defer_signals()
        self._reap_local_launcher(timeout_s=self.settings.launcher.kill_grace_s + FALLBACK_SLACK_S)
        result.exit_record = self.run_dir.wait_exit(2.0)
        return result

    def _await_exit(self, timeout_s: float, result: _Monitor) -> None:
        end = time.monotonic() + timeout_s
        while not self._launcher_exited():
            if time.monotonic() > end:
                self._kill_remembered(result.last_processes)
                return
            time.sleep(0.05)

    def _defer_signals(self) -> None:
        """Note SIGINT/SIGTERM instead of raising them until run() returns (main thread only)."""
        if self._saved_handlers is not None or threading.current_thread() is not threading.main_thread():
            return

        def note(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            print(f"soak-sidecar: {name} while concluding: writing the artifact first", file=sys.stderr)

        self._saved_handlers = {
            signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)
        }

    def _restore_signals(self) -> None:
        saved, self._saved_handlers = self._saved_handlers, None
        for signum, handler in (saved or {}).items():
            if handler is not None:
                signal.signal(signum, handler)

    def _request_stop(self, action: Literal["terminate", "kill"], reason: str) -> float:
        with contextlib.suppress(LauncherError):
            self.run_dir.request(action, reason)
        return self.ports.clock.monotonic() + self.settings.launcher.kill_grace_s + FALLBACK_SLACK_S

    def _kill_remembered(self, processes: Sequence[ProcessInfo]) -> None:
        """Last resort when the launcher does not act: SIGKILL what we saw, PID-reuse-safe,
        and the trainer's process group (it may have started after the last sample)."""
        trainer = self.run_dir.trainer()
        if trainer is not None and _same_process_alive(trainer.pid, trainer.start_ticks):
            with contextlib.suppress(OSError):
                os.killpg(trainer.pgid, signal.SIGKILL)
        for info in self.ports.sampler.still_alive(processes):
            with contextlib.suppress(psutil.Error, OSError):
                psutil.Process(info.pid).kill()
        if self._launcher_proc is not None and self._launcher_proc.poll() is None:
            self._launcher_proc.kill()

    def _take_sample(self, now_mono: float) -> Sample:
        assert self._launcher is not None and self._recorder is not None
        tree = self.ports.sampler.sample(self._launcher.pid)
        gpu: GpuSample = self._open_gpu().sample({p.pid for p in tree.processes}, now_mono)
        sample = Sample(
            t_wall=self.ports.clock.wall(),
            elapsed_s=round(now_mono - self._started_mono, 6),
            process=tree,
            gpu=gpu,
            progress=self.ports.progress.sample(),
        )
        self._recorder.add(sample, steady=self._steady(sample))
        return sample

    def _steady(self, sample: Sample) -> bool:
        """The trainer runs (not a zombie) and has made progress: growth is measured over these."""
        if sample.progress.bytes_total <= 0:
            return False
        if self._trainer is None:
            with contextlib.suppress(LauncherError):
                self._trainer = self.run_dir.trainer()
        trainer = self._trainer
        if trainer is None:
            return False
        in_sample = any(
            p.pid == trainer.pid
            and (trainer.start_ticks is None or p.start_ticks in (None, trainer.start_ticks))
            and p.state != psutil.STATUS_ZOMBIE
            for p in sample.process.processes
        )
        # An exiting trainer closes its fds and frees its memory before it turns zombie: a
        # sample taken then would hide a leak. Exit is irreversible, so looking after the sample
        # is conservative (a trainer that began exiting just after it loses one good sample).
        return in_sample and not _exiting(trainer.pid, trainer.start_ticks)

    def _report(self, sample: Sample, progress_age: float | None) -> None:
        clock = self.ports.clock
        if self.ports.progress_note is not None:
            self.ports.progress_note("running", clock.wall(), clock.monotonic())
        stream = self.ports.status_stream
        if stream is None or self.settings.monitor.status_line == "off":
            return
        assert self._deadline_clock is not None
        left = self._deadline_clock.remaining(clock.wall(), clock.monotonic())
        if self._terminal is not None:
            self._terminal.status(status_line(sample, budget_left_s=left, progress_age_s=progress_age))
        else:
            stream.write(status_json(sample, budget_left_s=left, progress_age_s=progress_age) + "\n")
            stream.flush()

    def _reap_local_launcher(self, *, timeout_s: float) -> None:
        proc = self._launcher_proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ------------------------------------------------------------------ conclusion

    def _conclude(self, monitor: _Monitor) -> RunResult:
        clock = self.ports.clock
        mset = self.settings.monitor
        exit_record = monitor.exit_record
        if exit_record is None and monitor.failure is None:
            monitor.failure = ("monitor_failure", "launcher exited without writing exit.json")
        if exit_record is not None and exit_record.reason == "spawn_failed" and monitor.failure is None:
            problem = "was not found" if exit_record.exit_code == 127 else "is not executable"
            monitor.failure = (
                "trainer_not_started",
                f"the trainer command {self.command[0]!r} {problem} (launcher exit {exit_record.exit_code})",
            )
        duration = clock.monotonic() - self._started_mono
        if mset.post_shutdown_grace_s:
            time.sleep(mset.post_shutdown_grace_s)
        launcher_pid = self._launcher.pid if self._launcher else None
        residuals = self.ports.sampler.still_alive(
            [p for p in monitor.last_processes if p.pid != launcher_pid]
        )
        # The launcher (a subreaper) kills what outlives the trainer before it exits, so a leaked
        # worker is rarely still alive here: what it had to kill after the trainer ended, or
        # could not reap, is residual too (the seed's rule; stricter: no grace before TERM).
        residual_pids = {p.pid for p in residuals}
        if exit_record is not None:
            residual_pids.update(k.pid for k in exit_record.survivors_killed)
            residual_pids.update(exit_record.unreaped)
        if launcher_pid is not None:
            residual_pids.discard(launcher_pid)
        alive_pids = {p.pid for p in residuals}
        seen = {p.pid: p for p in monitor.last_processes}
        reported = residuals + [seen[pid] for pid in sorted(residual_pids - alive_pids) if pid in seen]
        # Nothing the run started may outlive it (the launcher may be gone: SIGKILLed, crashed).
        self._kill_remembered(residuals)
        summary = self._evaluate_summary()
        recorder = self._recorder
        assert recorder is not None
        leaks = leak_failures(
            recorder.summary,
            max_rss_growth_mib=mset.max_rss_growth_mib,
            max_fd_growth=mset.max_fd_growth,
            max_gpu_growth_mib=self.settings.gpu.max_memory_growth_mib,
        )
        # A trainer that died of the deadline's TERM (sent term_grace_s before the deadline) ended
        # because of the deadline even if the deadline itself had not passed yet.
        deadline_expired = bool(exit_record and exit_record.deadline_expired) or (
            (
                bool(exit_record and exit_record.reason == "deadline")
                or (
                    self._deadline_clock is not None
                    and self._deadline_clock.expired(clock.wall(), clock.monotonic())
                )
            )
            and (exit_record is None or exit_record.returncode != 0)
        ) or (
            # Stopped at the checkpoint margin without completing: the budget ran out, which is
            # the deadline's verdict, not the trainer's (or an external) cancellation.
            bool(exit_record and exit_record.soft_stop_sent)
            and not summary.passed
        )
        decision = verdicts.decide(
            monitor_failure=monitor.failure,
            returncode=_trainer_returncode(exit_record),
            duration_s=duration,
            min_duration_s=mset.min_duration_s,
            residuals=[str(pid) for pid in sorted(residual_pids)],
            leaks=leaks,
            summary=summary,
            deadline_expired=deadline_expired,
            gpu_fault=monitor.gpu_fault or recorder.summary.gpu_fault,
            upload_error=None,
        )
        recorder.summary.residual_process_count = len(residual_pids)
        recorder.summary.run_summary_figures = run_summary_figures(summary.data)
        artifact = self._artifact(decision, summary, exit_record, reported, duration)
        samples_path = self.artifact_dir / SAMPLES_FILE
        artifact.samples = recorder.series(SAMPLES_FILE, _sha256_file(samples_path))
        return self._deliver(artifact, decision)

    def _evaluate_summary(self) -> SummaryOutcome:
        sset = self.settings.summary
        path = self.settings.monitor.progress_dir / sset.file_name
        raw: bytes | None
        mtime: float | None
        try:
            with path.open("rb") as handle:
                mtime = os.fstat(handle.fileno()).st_mtime
                raw = handle.read(sset.max_bytes + 1)
        except FileNotFoundError:
            raw, mtime = None, None
        except OSError as exc:
            return SummaryOutcome(
                present=True,
                data=None,
                classification="invalid_run_summary",
                failures=(f"run_summary.json cannot be read: {exc}",),
            )
        return evaluate_run_summary(
            raw,
            mtime=mtime,
            run_started_wall=self._started_wall,
            max_bytes=sset.max_bytes,
            manifest_validator=self._manifest_validator,
        )

    def _artifact(
        self,
        decision: verdicts.Verdict,
        summary: SummaryOutcome | None,
        exit_record: ExitRecord | None,
        residuals: Sequence[ProcessInfo],
        duration: float,
    ) -> Artifact:
        mset = self.settings.monitor
        recorder = self._recorder or SampleRecorder(None, mset.series_points)
        record = self._record
        deadline = None
        if record is not None:
            deadline = DeadlineInfo(
                run_id=self.run_id,
                store=self.ports.store.location,
                identity_sha256=record.identity_sha256,
                started_unix=record.started_unix,
                deadline_unix=record.deadline_unix,
                budget_s=record.budget_seconds,
                checkpoint_margin_s=record.checkpoint_margin_seconds,
                remaining_at_start_s=self._remaining_at_start,
                resumed=self._resumed,
                expired=decision.classification == "deadline_exhausted",
                soft_stop_sent=bool(exit_record and exit_record.soft_stop_sent),
                term_sent=bool(exit_record and exit_record.term_sent),
                kill_sent=bool(exit_record and exit_record.kill_sent),
            )
        console = self._keep_console_logs()
        return Artifact(
            status=decision.status,
            failure_reason=decision.reason,
            failure_classification=decision.classification,
            exit_code=int(decision.exit_code),
            command=self.command,
            context={
                **self.context,
                "mode": self.mode,
                "run_id": self.run_id,
                "attempt": self.attempt,
            },
            started_at_utc=_utc(self._started_wall),
            ended_at_utc=_utc(self.ports.clock.wall()),
            duration_s=round(duration, 6),
            returncode=_trainer_returncode(exit_record),
            monitor=MonitorConfig(
                sample_interval_s=mset.sample_interval_s,
                startup_timeout_s=mset.startup_timeout_s,
                stale_progress_s=mset.stale_progress_s,
                post_shutdown_grace_s=mset.post_shutdown_grace_s,
                min_duration_s=mset.min_duration_s,
                sample_count=recorder.count,
            ),
            deadline=deadline,
            samples=recorder.series(None, None),
            resource_summary=recorder.summary,
            shutdown=_json_safe(dict(summary.shutdown)) if summary and summary.shutdown is not None else None,
            post_shutdown=PostShutdown(
                residual_processes=list(residuals),
                launcher_exit=_exit_json(self.run_dir),
            ),
            run_summary=_json_safe(summary.data) if summary else None,
            console_log=str(console[-1].resolve()) if console else None,
            provenance=self._provenance(),
        )

    def _keep_console_logs(self) -> list[Path]:
        """Copies of the console logs beside the artifact: the run dir is reused by the next run."""
        kept: list[Path] = []
        for log in self.run_dir.console_logs():
            copy = self.artifact_dir / log.name
            with contextlib.suppress(OSError):
                if not copy.exists():
                    self.artifact_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, copy)
                kept.append(copy)
        return kept

    def _provenance(self) -> dict[str, Any]:
        devices: list[dict[str, Any]] = []
        if self._gpu is not None:
            with contextlib.suppress(SoakError):
                devices = [d.model_dump() for d in self._gpu.devices()]
        env = self._trainer_env or {}
        return {
            "source": _git_snapshot(Path.cwd()),
            "gpu_devices": devices,
            "software": _software(),
            "environment": {
                "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES"),
                "NVIDIA_VISIBLE_DEVICES": env.get("NVIDIA_VISIBLE_DEVICES"),
            },
            "host": {
                "hostname": socket.gethostname(),
                "boot_id": _boot_id(),
                "launcher": None if self._launcher is None else self._launcher.hostname,
            },
        }

    def _finish_unstarted(self, decision: verdicts.Verdict) -> RunResult:
        artifact = self._artifact(decision, None, self.run_dir.read_exit(), [], 0.0)
        return self._deliver(artifact, decision)

    def _deliver(self, artifact: Artifact, decision: verdicts.Verdict) -> RunResult:
        artifact_path = self.artifact_dir / ARTIFACT_FILE
        final = decision
        try:
            self.artifact_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(artifact_path, dumps_artifact(artifact).encode())
        except OSError as exc:
            # Disk full, read-only: the verdict must still be told (stderr, publication).
            final = verdicts.with_upload_error(decision, f"the local artifact was not written: {exc}")
            _apply_verdict(artifact, final)
            print(f"soak-sidecar: cannot write {artifact_path}: {exc}", file=sys.stderr)
            self._publish(final, artifact, None)
            return RunResult(verdict=final, artifact_path=None, exit_code=int(final.exit_code))
        sink = self.ports.sink
        if sink is not None:
            upload = UploadInfo()
            files = [
                p for p in (self.artifact_dir / SAMPLES_FILE, *self._keep_console_logs()) if p.is_file()
            ]
            try:
                for obj in sink.upload(files, self._key_prefix()):
                    upload.uris[obj.path.name] = obj.uri
                    upload.sha256[obj.path.name] = obj.sha256
                artifact.upload = upload
                write_atomic(artifact_path, dumps_artifact(artifact).encode())
                for obj in sink.upload([artifact_path], self._key_prefix()):
                    upload.uris[obj.path.name] = obj.uri
                    upload.sha256[obj.path.name] = obj.sha256
            except (UploadError, ConfigError) as exc:
                upload.error = str(exc)
                final = verdicts.with_upload_error(decision, str(exc))
                artifact.upload = upload
                _apply_verdict(artifact, final)
            with contextlib.suppress(OSError):  # the first local copy stands if this one fails
                write_atomic(artifact_path, dumps_artifact(artifact).encode())
        self._publish(final, artifact, artifact_path)
        return RunResult(verdict=final, artifact_path=artifact_path, exit_code=int(final.exit_code))

    def _publish(self, final: verdicts.Verdict, artifact: Artifact, artifact_path: Path | None) -> None:
        if self.ports.publish is None:
            return
        upload = artifact.upload
        local = str(artifact_path) if artifact_path is not None else None
        problems = self.ports.publish(
            Publication(
                status=final.status,
                classification=final.classification,
                reason=final.reason or "",
                exit_code=int(final.exit_code),
                artifact_uri=(upload.uris.get(ARTIFACT_FILE) if upload else None) or local,
                artifact_sha256=(upload.sha256.get(ARTIFACT_FILE) if upload else None)
                or (_sha256_file(artifact_path) if artifact_path is not None else None),
                attempt=self.attempt,
                deadline_unix=self._record.deadline_unix if self._record else None,
            )
        )
        for problem in problems:
            print(f"soak-sidecar: publication: {problem}", file=sys.stderr)

    def _key_prefix(self) -> str:
        s3 = self.settings.s3
        return render_key_prefix(
            s3.key_template,
            {
                "prefix": s3.prefix,
                "namespace": self.settings.kube.namespace or "local",
                "job": str(self.context.get("job") or "local"),
                "pod": self.settings.kube.pod_name or "local",
                "run_id": self.run_id,
                "attempt": str(self.attempt),
            },
        )


# ---------------------------------------------------------------------- helpers


def _trainer_returncode(record: ExitRecord | None) -> int | None:
    """The seed's ``returncode``: negative signal number for a signalled trainer."""
    if record is None or not record.trainer_started:
        return None
    if record.returncode is not None:
        return record.returncode
    return -record.signal if record.signal is not None else None


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync of the directory: a reader sees the old or the new file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def _apply_verdict(artifact: Artifact, final: verdicts.Verdict) -> None:
    artifact.status = final.status
    artifact.failure_reason = final.reason
    artifact.failure_classification = final.classification
    artifact.exit_code = int(final.exit_code)


class SamplesFile:
    """The compressed JSONL stream of every sample. A write error (disk full) is kept, not raised:
    monitoring goes on, and the verdict reports the incomplete evidence as a monitor failure."""

    def __init__(self, path: Path) -> None:
        self.error: str | None = None
        try:
            self._stream: IO[str] | None = gzip.open(path, "wt", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except OSError as exc:
            self._stream = None
            self.error = f"cannot write {path}: {exc}"

    def write_line(self, line: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(line + "\n")
        except OSError as exc:
            self.error = f"writing the samples file failed: {exc}"
            self.close()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            stream.close()
        except OSError as exc:
            self.error = self.error or f"closing the samples file failed: {exc}"


def _exit_json(run_dir: RunDir) -> dict[str, Any] | None:
    try:
        raw = json.loads(run_dir.file("exit.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _same_process_alive(pid: int, start_ticks: int | None) -> bool:
    fields = _stat_fields(pid)
    if not fields or fields[0] == "Z":
        return False
    return start_ticks is None or (len(fields) > 19 and int(fields[19]) == start_ticks)


_PF_EXITING = 0x4  # task flag: the process is inside exit()


def _exiting(pid: int, start_ticks: int | None) -> bool:
    """True when ``pid`` is exiting, a zombie, gone, or another process (PID reuse)."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) <= 19 or fields[0] in ("Z", "X", "x"):
        return True
    if start_ticks is not None and int(fields[19]) != start_ticks:
        return True
    return bool(int(fields[6]) & _PF_EXITING)


def _json_safe(value: Any) -> Any:
    """The trainer's document may hold NaN/Infinity (the seed's parser accepts them): keep as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _sha256_file(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _git_snapshot(path: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            result = subprocess.run(
                ["git", *args], cwd=path, check=False, capture_output=True, text=True, timeout=2.0
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return result.stdout.strip() if result.returncode == 0 else ""

    return {
        "path": str(path),
        "commit": git("rev-parse", "HEAD") or None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty_files": len(git("status", "--porcelain").splitlines()),
    }


def _software() -> dict[str, str | None]:
    def package(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "soak-sidecar": __version__,
        **{name: package(name) for name in ("psutil", "nvidia-ml-py", "boto3", "kubernetes", "torch")},
    }


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return None


@contextlib.contextmanager
def cancellation_on_sigterm() -> Iterator[None]:
    """SIGTERM (pod deletion, kill) becomes an external cancellation, like Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, raise_cancelled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
