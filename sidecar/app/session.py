"""The launcher's side of a run: start or find it, give the go-ahead, ask it to stop, clean up.

``LaunchSession`` is the one object that talks to the launcher (through the LauncherChannel port)
and, as a last resort, kills what the launcher should have killed.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from sidecar.app.console import Console
from sidecar.app.ports import HeartbeatStatus, LocalLauncher, Ports, StopRequest
from sidecar.app.values import Launched, Preflight, RunRequest, Started
from sidecar.core import exit_confirmation
from sidecar.core.conclusion import SidecarHeartbeat
from sidecar.core.errors import LauncherError, RefusedError, TrainerNotStartedError
from sidecar.core.samples import ProcessInfo
from sidecar.core.trainer_process import trainer_of
from sidecar.launcher.protocol import names
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.names import ENV_RUN_ID
from sidecar.settings import Settings

# How long the sidecar waits past the launcher's own TERM->KILL escalation before it kills the
# remembered processes itself (the launcher may be wedged or gone).
FALLBACK_SLACK_S = 10.0
POLL_S = 0.05
KUBELET_POLL_S = 0.5


@dataclass(frozen=True)
class Unconfirmed:
    """Why exit.json is not taken: a channel the trainer cannot write contradicts it (or it
    contradicts itself), or, ``contradicted`` False, the kubelet did not answer in time."""

    problem: str
    contradicted: bool = True


class LaunchSession:
    def __init__(self, settings: Settings, ports: Ports, request: RunRequest) -> None:
        self._settings = settings.launcher
        self._ports = ports
        self._request = request
        self._local: LocalLauncher | None = None
        self.launched: Launched | None = None
        # The launcher's tree as last sampled: what an emergency stop kills when the launcher is gone.
        self.last_seen: list[ProcessInfo] = []
        self._heartbeat: HeartbeatStatus | None = None

    @property
    def fallback_after_s(self) -> float:
        """How long after a stop request the launcher's own escalation must be over."""
        # A trainer that exits on its own (a soft stop obeyed, or just before the request) leaves
        # its descendants the exit grace, then TERM and KILL for the survivors.
        return self._settings.exit_grace_s + self._settings.kill_grace_s + FALLBACK_SLACK_S

    def start(self, console: Console) -> Launched:
        """The launcher, announced: started here (local mode) or found in the run dir (pod)."""
        channel, request = self._ports.channel, self._request
        if request.mode == "local":
            channel.reset()
            lock_fd = self._ports.store.inheritable_lock_fd(request.slot)
            local = self._local = self._ports.spawner.spawn(
                request.command,
                go_timeout_s=self._settings.go_timeout_s,
                pass_fds=() if lock_fd is None else (lock_fd,),
                capture_output=console.terminal is not None,
            )
            if console.terminal is not None and local.stdout is not None:
                console.terminal.pump(local.stdout)
            info = channel.wait_for_launcher(
                self._settings.appear_timeout_s, alive=lambda: local.poll() is None
            )
            if info.pid != local.pid:
                # launcher.json sits in a dir others can write: the launcher is the one started here.
                raise LauncherError(
                    f"{names.LAUNCHER_FILE} names pid {info.pid}, not the launcher started here "
                    f"(pid {local.pid}): a forged record"
                )
            command = request.command
        else:
            info = channel.wait_for_launcher(self._settings.appear_timeout_s)
            command = info.command
            early = channel.read_exit()
            if early is not None and not channel.go_given():
                # The trainer container gave up (go timeout, signal) before this sidecar was ready.
                raise LauncherError(f"the launcher exited before the sidecar was ready ({early.reason})")
        if not command:
            raise LauncherError("the launcher announced no trainer command")
        if not info.subreaper:
            # Without the subreaper, orphaned workers escape cleanup: refuse rather than leak.
            raise RefusedError("the launcher is not a child subreaper; refusing to start the trainer")
        if info.command_problem is not None:
            raise TrainerNotStartedError(
                f"the trainer command {command[0]!r} {info.command_problem} "
                "(found by the launcher before the go-ahead: no deadline record, no attempt used)"
            )
        self.launched = Launched(
            launcher=info,
            command=tuple(command),
            fd_tables_readable=self._ports.processes.fd_tables_readable(info.pid),
        )
        return self.launched

    @contextlib.contextmanager
    def going(self, settings: Settings, started: Started, preflight: Preflight) -> Iterator[None]:
        """Heartbeats from before the go-ahead to the end of monitoring (the launcher fails closed
        without them); the go-ahead itself unless a predecessor gave it."""
        with self._ports.channel.heartbeat(self._settings.heartbeat_interval_s) as self._heartbeat:
            if not started.already_going:
                go = go_ahead(settings, self._require_launched(), started, preflight)
                self._ports.channel.give_go(go, preflight.record.as_json())
            yield

    def exited(self) -> bool:
        if self._local is not None:
            return self._local.poll() is not None
        if self._ports.channel.read_exit() is not None:
            return True
        info = self._require_launched().launcher
        return not self._ports.processes.is_alive(info.pid, info.start_ticks)

    def request_stop(self, action: StopRequest, reason: str, *, stacks_timeout_s: float = 0.0) -> None:
        with contextlib.suppress(LauncherError):
            self._ports.channel.request(action, reason, stacks_timeout_s=stacks_timeout_s)

    def abort(self, reason: str, exit_code: int) -> None:
        """Tell a launcher still waiting for its go-ahead not to start the trainer."""
        with contextlib.suppress(LauncherError):
            self._ports.channel.abort(reason, exit_code)

    def kill_remembered(
        self, processes: Sequence[ProcessInfo], tree: Sequence[ProcessInfo] | None = None
    ) -> None:
        """Last resort when the launcher does not act: SIGKILL ``processes``, PID-reuse-safe, and the
        group of the trainer seen in ``tree`` (default: ``processes``), whose members may have
        started after the last sample."""
        seen = processes if tree is None else tree
        trainer = None if self.launched is None else trainer_of(seen, self.launched.launcher.pid)
        if trainer is not None and trainer.start_ticks is not None:
            self._ports.processes.kill_group(trainer.pid, trainer.start_ticks)
        self._ports.processes.kill(processes)
        if self._local is not None and self._local.poll() is None:
            self._local.kill()

    def await_exit(self, timeout_s: float, last_seen: Sequence[ProcessInfo]) -> None:
        """Wait for the launcher to exit; past ``timeout_s``, kill what it should have killed."""
        clock = self._ports.clock
        end = clock.monotonic() + timeout_s
        while not self.exited():
            if clock.monotonic() > end:
                self.kill_remembered(last_seen)
                return
            self._ports.sleep(POLL_S)

    def await_soft_exit(self, until: float, hurried: Callable[[], bool]) -> None:
        """After a soft stop: wait for the launcher to exit until the monotonic time ``until``, or
        until ``hurried`` says somebody asked again to stop."""
        clock = self._ports.clock
        while not self.exited() and clock.monotonic() < until and not hurried():
            self._ports.sleep(POLL_S)

    def emergency_stop(self, reason: str, last_seen: Sequence[ProcessInfo]) -> None:
        """When supervision itself fails, kill the trainer's process group at once rather than
        leave it running until the heartbeat timeout."""
        with contextlib.suppress(Exception):
            self.request_stop("kill", reason)
            self.await_exit(self._settings.kill_grace_s + 2.0, last_seen)
        with contextlib.suppress(Exception):
            self.kill_remembered(last_seen)

    def heartbeat_record(self, *, resumed: bool) -> SidecarHeartbeat:
        """What this sidecar knows of its own heartbeat: whether it could have been lost."""
        beat = self._heartbeat
        if beat is None:
            return SidecarHeartbeat(resumed=resumed)
        return SidecarHeartbeat(
            unwritten=tuple(beat.unwritten),
            longest_gap_s=beat.longest_gap_s,
            timeout_s=self._settings.heartbeat_timeout_s,
            resumed=resumed,
        )

    def unconfirmed(self, record: ExitRecord | None, *, patience_s: float) -> Unconfirmed | None:
        """Why ``record`` cannot be the launcher's own: exit.json sits in a dir the trainer can
        write, so it is held field by field (core.exit_confirmation) to how the launcher ended as
        a channel the trainer cannot write reports it: locally the launcher's exit status, in a pod
        the trainer container's terminated state as the kubelet reports it (awaited up to
        ``patience_s``). A launcher that could not write its record says so through either."""
        ended = self._ended(patience_s if record is not None else 0.0)
        if ended is None:
            if record is not None and self._local is None and self._ports.pod_status is not None:
                return Unconfirmed(
                    f"the kubelet reported no end of the trainer container within {patience_s:g} s: "
                    f"{names.EXIT_FILE} cannot be confirmed",
                    contradicted=False,
                )
            problem = None if record is None else exit_confirmation.inconsistency(record)
            return None if problem is None else Unconfirmed(problem)
        status, who = ended
        if record is None:
            unwritten = status == names.EXIT_RECORD_UNWRITTEN
            could_not = f"{who} exited {status}: the launcher could not write {names.EXIT_FILE}"
            return Unconfirmed(could_not) if unwritten else None
        if status is None:
            return Unconfirmed(f"{who} ended with no exit code: {names.EXIT_FILE} cannot be confirmed")
        problem = exit_confirmation.disagreement(record, status, who)
        return None if problem is None else Unconfirmed(f"{problem}: not the launcher's record")

    def _ended(self, patience_s: float) -> tuple[int | None, str] | None:
        """How the launcher ended, from a channel the trainer cannot write, and who says so; None
        when no such channel has an answer (pod mode outside Kubernetes: only tests run so)."""
        if self._local is not None:
            status = self._local.poll()
            return None if status is None else (status, "the launcher")
        pod = self._ports.pod_status
        if pod is None:
            return None
        clock = self._ports.clock
        end = clock.monotonic() + patience_s
        while (state := pod.trainer_ended()) is None and clock.monotonic() < end:
            self._ports.sleep(KUBELET_POLL_S)
        if state is None:
            return None
        return state.exit_code, "the trainer container (as the kubelet reports it)"

    def reap(self, timeout_s: float) -> None:
        """Wait for a local launcher to exit (it kills the trainer first); kill it if it does not."""
        local = self._local
        if local is None or local.poll() is not None:
            return
        try:
            local.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            local.kill()
            local.wait()

    def _require_launched(self) -> Launched:
        if self.launched is None:
            raise LauncherError("no launcher has announced itself yet")
        return self.launched


def go_ahead(settings: Settings, launched: Launched, started: Started, preflight: Preflight) -> GoRequest:
    """go.json: the deadline record's figures, the launcher settings and the trainer's extras."""
    record, lset = preflight.record, settings.launcher
    env = {
        ENV_RUN_ID: started.request.run_id,
        "SOAK_PROGRESS_DIR": str(settings.monitor.progress_dir.resolve()),
    }
    if preflight.resume_checkpoint:
        env["SOAK_RESUME_CHECKPOINT"] = preflight.resume_checkpoint
    if preflight.checkpoint_record:
        # Where the trainer keeps what a later attempt resumes from: the record and, when it has a
        # folder of its own (a checkpoint volume, not the progress dir), that folder for the
        # framework's checkpoints (the trainer kit saves there).
        env["SOAK_CHECKPOINT_RECORD"] = preflight.checkpoint_record
        folder = PurePath(preflight.checkpoint_record).parent
        if folder != PurePath(env["SOAK_PROGRESS_DIR"]):
            env["SOAK_CHECKPOINT_DIR"] = str(folder)
    return GoRequest(
        launch_id=launched.launcher.launch_id,
        # The attempt's deadline in this node's wall clock: the least any clock allows.
        deadline_unix=preflight.clock.wall_end,
        checkpoint_margin_s=record.checkpoint_margin_seconds,
        term_grace_s=settings.deadline.term_grace_s,
        heartbeat_timeout_s=lset.heartbeat_timeout_s,
        kill_grace_s=lset.kill_grace_s,
        exit_grace_s=lset.exit_grace_s,
        console_log_bytes=lset.console_log_bytes,
        soft_stop_signal=lset.soft_stop_signal,
        stop_grace_s=lset.stop_grace_s,
        env=env,
        extra_args=preflight.extra_args,
        # The trainer-side agent reports its tree's fd tables when this sidecar cannot read them.
        fd_report_s=None if launched.fd_tables_readable else settings.monitor.sample_interval_s,
    )
