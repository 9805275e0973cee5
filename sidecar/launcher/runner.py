"""The launcher's run: announce, wait for the go-ahead, start the trainer, supervise it, clean up,
and write exit.json, whatever happened on the way."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, replace

from .beside import kit_dir, with_kit
from .channel import SidecarChannel
from .cleanup import clean_up
from .deadline import MonotonicDeadline
from .events import EventLoop
from .exiting import exit_code, exit_record, open_record_slot, write_exit
from .fdreport import FdReports
from .memory import OomWatch
from .output import STDOUT_QUEUE_BYTES, ConsoleLog, FdWriter, OutputTee, log
from .proc import command_problem, kernel_boot_id, refuse_tracers, start_ticks
from .protocol.exit import ControlAction
from .protocol.fields import ProtocolError, signal_name
from .protocol.files import atomic_write_json, read_json
from .protocol.go import GoRequest
from .protocol.names import (
    ABORT_FILE,
    CONSOLE_LOG,
    DEADLINE_COPY_FILE,
    DEFAULT_GO_TIMEOUT_S,
    ENV_DEADLINE_FILE,
    ENV_RUN_DIR,
    ENV_SOFT_STOP_FILE,
    EXIT_ABORT_DEFAULT,
    EXIT_GO_TIMEOUT,
    EXIT_INSUFFICIENT_BUDGET,
    EXIT_LAUNCHER_ERROR,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_PROTOCOL,
    EXIT_RECORD_UNWRITTEN,
    EXIT_SUPERVISOR_LOST,
    GO_FILE,
    GPU_ENV_VARS,
    LAUNCHER_FILE,
    PROTOCOL,
    SOFT_STOP_FILE,
    TRAINER_FILE,
)
from .protocol.records import AbortRequest, LauncherInfo, TrainerInfo
from .state import ExitRequestError, StopState
from .stopping import Stopper
from .supervise import Supervision
from .trainer import Trainer, reap


@dataclass(frozen=True)
class Options:
    run_dir: str  # absolute
    command: list[str]
    go_timeout_s: float = DEFAULT_GO_TIMEOUT_S
    owner_pid: int | None = None  # local mode: the trainer dies as soon as our parent is not this
    subreaper: bool = True
    termination_log: str | None = None

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)


class Launcher:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.launch_id = uuid.uuid4().hex
        self.loop = EventLoop(options.run_dir, options.owner_pid)
        # Trainer output to our stdout, never blocking the event loop (see FdWriter).
        self.tee = OutputTee(FdWriter(1, STDOUT_QUEUE_BYTES))
        self.stopper = Stopper(StopState(), os.getpid(), options.run_dir, self.launch_id)
        self.channel = SidecarChannel(options.run_dir, self.launch_id)
        self.trainer: Trainer | None = None
        self.deadline: MonotonicDeadline | None = None
        self.oom = OomWatch.here()

    def run(self) -> int:
        code = EXIT_LAUNCHER_ERROR
        state = self.stopper.state
        slot = open_record_slot(self.options.run_dir)
        try:
            self.loop.install()
            self.announce()
            self.start_trainer(self.wait_for_go())
            self.supervise()
            clean_up(
                self.stopper,
                self.trainer,
                self.deadline,
                self.wait,
                self.reap,
                interrupted=self._sidecar_wants_end,
            )
            code = exit_code(state, self.trainer)
        except ExitRequestError as done:
            code = done.code
            clean_up(self.stopper, self.trainer, self.deadline, self.wait, self.reap)
        except Exception as exc:
            # Fail closed: whatever went wrong, nothing we started may outlive us.
            log(f"launcher error: {exc!r}")
            state.because("launcher_error")
            with contextlib.suppress(Exception):
                self.stopper.kill_everything(state.killed_with_trainer)
                clean_up(self.stopper, self.trainer, self.deadline, self.wait, self.reap)
            code = EXIT_LAUNCHER_ERROR
        with contextlib.suppress(Exception):
            self.tee.close()
        record = exit_record(self.launch_id, code, state, self.trainer, self.tee.writer.dropped_bytes)
        record = replace(record, memory=self.oom.report())
        if not write_exit(self.options.run_dir, record, self.options.termination_log, slot):
            # The sidecar holds exit.json to this status: no record of ours, so say so.
            return EXIT_RECORD_UNWRITTEN
        return code

    def wait(self, timeout: float | None) -> list[int]:
        """One event-loop turn, then reap and note dropped output; the signals seen."""
        signals = self.loop.turn(timeout)
        self.reap()
        self.tee.note()
        return signals

    def _sidecar_wants_end(self) -> str | None:
        """During the exit grace: why the sidecar wants it over (a stop request, its owner or
        heartbeat lost), or None. The supervision loop no longer runs, so this looks for it."""
        go = self.stopper.go
        if self.loop.owner_lost():
            return "owner process lost"
        now = time.monotonic()
        request = self.channel.poll(now, self.loop.take_changed())
        if request is not None:
            self.stopper.state.control_actions.append(
                ControlAction(request.seq, request.action, request.reason)
            )
            if request.action == "kill":
                self.stopper.kill_everything(self.stopper.state.survivors_killed)
            return f"control: {request.action} ({request.reason})"
        if go is not None and now - self.channel.heartbeat_changed_at >= go.heartbeat_timeout_s:
            self.channel.check_heartbeat()
            if time.monotonic() - self.channel.heartbeat_changed_at >= go.heartbeat_timeout_s:
                return f"no heartbeat for {go.heartbeat_timeout_s:g}s"
        return None

    def reap(self) -> bool:
        """Reap every dead child (True when none is left); a SIGKILL we did not send may be the OOM
        killer's."""
        return reap(self.trainer, self._killed)

    def _killed(self, pid: int, command: tuple[str, ...]) -> None:
        state = self.stopper.state
        if pid not in state.killed_with_trainer and pid not in state.survivors_killed:
            self.oom.killed(pid, command)

    def announce(self) -> None:
        options = self.options
        info = LauncherInfo(
            launch_id=self.launch_id,
            pid=self.stopper.launcher_pid,
            start_ticks=start_ticks(self.stopper.launcher_pid),
            boot_id=kernel_boot_id(),
            hostname=socket.gethostname(),
            command=tuple(options.command),
            command_problem=command_problem(options.command),
            python=sys.executable,
            python_version=".".join(str(v) for v in sys.version_info[:3]),
            subreaper=options.subreaper,
            owner_pid=options.owner_pid,
            go_timeout_s=options.go_timeout_s,
            started_unix=time.time(),
            gpu_env={name: os.environ[name] for name in GPU_ENV_VARS if name in os.environ},
        )
        atomic_write_json(options.path(LAUNCHER_FILE), info.to_json())

    def _for_me(self, raw: dict[str, object] | None, *, allow_unbound: bool = False) -> bool:
        """A request counts only when it names this launcher (never a stale file of another)."""
        if raw is None or raw.get("protocol") != PROTOCOL:
            return False
        bound = raw.get("launch_id")
        return bound == self.launch_id or (allow_unbound and bound is None)

    def wait_for_go(self) -> GoRequest:
        end = time.monotonic() + self.options.go_timeout_s
        while True:
            self._check_owner("owner process lost before launch; not starting the trainer")
            abort = read_json(self.options.path(ABORT_FILE))
            if abort is not None and self._for_me(abort, allow_unbound=True):
                request = AbortRequest.parse(abort)
                self.stopper.state.because("aborted")
                log(f"aborted by the sidecar: {request.reason}")
                raise ExitRequestError(request.exit_code or EXIT_ABORT_DEFAULT)
            go = read_json(self.options.path(GO_FILE))
            if go is not None and self._for_me(go):
                try:
                    return GoRequest.from_json(go)
                except ProtocolError as exc:
                    log(str(exc))
                    self.stopper.state.because("protocol_error")
                    raise ExitRequestError(EXIT_PROTOCOL) from exc
            left = end - time.monotonic()
            if left <= 0:
                log(f"no go.json within {self.options.go_timeout_s:g}s")
                self.stopper.state.because("go_timeout")
                raise ExitRequestError(EXIT_GO_TIMEOUT)
            step = 1.0 if self.loop.watch.fd is not None else 0.1
            for signum in self.wait(min(left, step)):
                if signal_name(signum) in ("SIGTERM", "SIGINT", "SIGHUP"):
                    log(f"{signal_name(signum)} before the trainer started")
                    self.stopper.state.because("signalled")
                    raise ExitRequestError(128 + signum)

    def _check_owner(self, message: str) -> None:
        if self.loop.owner_lost():
            log(message)
            self.stopper.state.owner_lost = True
            self.stopper.state.because("owner_lost")
            raise ExitRequestError(EXIT_SUPERVISOR_LOST)

    def start_trainer(self, go: GoRequest) -> None:
        self.stopper.go = go
        self.deadline = MonotonicDeadline(go.deadline_unix)
        if self.deadline.remaining() <= go.checkpoint_margin_s:
            # Never start (or resume) inside the checkpoint margin.
            log("less than the checkpoint margin left; not starting the trainer")
            self.stopper.state.because("insufficient_budget")
            raise ExitRequestError(EXIT_INSUFFICIENT_BUDGET)
        self._check_owner("owner process lost before launch; not starting the trainer")
        options = self.options
        env = {
            **os.environ,
            **go.trainer_env(),
            ENV_RUN_DIR: options.run_dir,
            ENV_DEADLINE_FILE: options.path(DEADLINE_COPY_FILE),
            ENV_SOFT_STOP_FILE: options.path(SOFT_STOP_FILE),
        }
        env = with_kit(env, kit_dir())
        console = ConsoleLog(options.path(CONSOLE_LOG), go.console_log_bytes)
        if not refuse_tracers():
            log("cannot make the launcher non-dumpable: the trainer's UID may trace it")
        self.oom.start()
        try:
            trainer = Trainer.start([*options.command, *go.extra_args], env, console, self.tee)
        except OSError as exc:
            log(f"cannot start {options.command[0]!r}: {exc}")
            self.stopper.state.because("spawn_failed")
            missing = isinstance(exc, FileNotFoundError)
            raise ExitRequestError(EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE) from exc
        self.trainer, self.stopper.trainer_pid = trainer, trainer.pid
        trainer.pump_output(self.loop)
        self.channel.start_heartbeat_clock()
        info = TrainerInfo(
            self.launch_id, trainer.pid, trainer.pid, start_ticks(trainer.pid), trainer.started_unix
        )
        atomic_write_json(options.path(TRAINER_FILE), info.to_json())

    def supervise(self) -> None:
        assert self.stopper.go is not None and self.deadline is not None and self.trainer is not None
        fds = FdReports(self.options.run_dir, self.launch_id, self.stopper.launcher_pid)
        supervision = Supervision(
            go=self.stopper.go,
            deadline=self.deadline,
            stopper=self.stopper,
            channel=self.channel,
            fds=fds,
            loop=self.loop,
            wait=self.wait,
        )
        supervision.run(self.trainer)
