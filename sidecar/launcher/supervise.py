"""The loop while the trainer runs: the deadline's stops on the launcher's own clock, the sidecar's
heartbeat and control requests, signals from outside, the owner, and fd reports."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from .channel import FALLBACK_POLL_S, SidecarChannel
from .deadline import MonotonicDeadline
from .events import EventLoop
from .fdreport import FdReports
from .output import log
from .proc import alive_descendants
from .protocol.exit import ControlAction
from .protocol.fields import signal_name, signal_number
from .protocol.files import atomic_write_json
from .protocol.go import GoRequest
from .protocol.names import ACTIONS, DEADLINE_SOFT_STOP, STACKS_FILE, STOP_SIGNALS
from .protocol.records import ControlRequest
from .stacks import capture, find_py_spy
from .stopping import Stopper
from .trainer import Trainer

# After SIGKILL, how long to wait for the kernel to let processes die before giving up on reaping.
REAP_LIMIT_S = 10.0


class Supervision:
    def __init__(
        self,
        *,
        go: GoRequest,
        deadline: MonotonicDeadline,
        stopper: Stopper,
        channel: SidecarChannel,
        fds: FdReports,
        loop: EventLoop,
        wait: Callable[[float | None], list[int]],
    ) -> None:
        self.go = go
        self.deadline = deadline
        self.stopper = stopper
        self.state = stopper.state
        self.channel = channel
        self.fds = fds
        self.loop = loop
        self.wait = wait

    def run(self, trainer: Trainer) -> None:
        """Until the trainer is reaped (or a KILLed one outlives REAP_LIMIT_S)."""
        signals: list[int] = []
        while trainer.status is None:
            for signum in signals:
                self._on_signal(signum)
            now = time.monotonic()
            remaining = self.deadline.remaining()
            self._enforce_kills(remaining, now)
            self._forward_deferred_stop(now)
            self._deadline_stops(remaining)
            request = self.channel.poll(now, self.loop.take_changed())
            if request is not None:
                self._on_control(request)
            self.fds.report_if_due(now, self.go.fd_report_s)
            timeout = self._wait_timeout(now)
            if timeout is None:
                return
            signals = self.wait(timeout)
            if self.state.kill_sent and trainer.status is None:
                self.stopper.kill_everything(self.state.killed_with_trainer)

    def _on_signal(self, signum: int) -> None:
        """Forward a signal to the trainer's tree; the first stop signal from outside becomes the soft
        stop instead, so the trainer can checkpoint (a second one, or the grace's end, forwards it)."""
        name = signal_name(signum)
        if name in STOP_SIGNALS and self.go.stop_grace_s > 0 and self.state.forward_stop_at is None:
            log(f"{name}: soft stop first, the trainer gets {name} in {self.go.stop_grace_s:g}s")
            self.state.signals_deferred.append(name)
            self.state.forward_stop_at = time.monotonic() + self.go.stop_grace_s
            self.stopper.send_soft_stop(f"signal: {name}")
            return
        self.state.signals_forwarded.append(name)
        self.stopper.signal_tree(signum, only_catchers=signum in (signal.SIGUSR1, signal.SIGUSR2))

    def _on_control(self, request: ControlRequest) -> None:
        if request.action not in ACTIONS:
            log(f"control.json: unknown action {request.action!r} ignored")
            return
        self.state.control_actions.append(ControlAction(request.seq, request.action, request.reason))
        log(f"control: {request.action} ({request.reason})")
        if request.action == "soft_stop":
            self.stopper.send_soft_stop(f"control: {request.reason}")
            return
        # Once, before the first TERM: a later request (anyone can write control.json) would take the
        # stacks of a tree already stopping, over the stall's, and hold up the KILL that follows.
        stopping = self.state.term_sent or self.state.kill_sent
        if request.stacks_timeout_s > 0 and request.action == "terminate" and not stopping:
            self._capture_stacks(request)
        self.stopper.stop("control", hard=request.action == "kill")

    def _capture_stacks(self, request: ControlRequest) -> None:
        """The stall's evidence, before the TERM: never past the deadline's own TERM."""
        bound = min(request.stacks_timeout_s, max(0.0, self.deadline.remaining() - self.go.term_grace_s))
        pids = alive_descendants(self.stopper.launcher_pid)
        record = capture(
            pids,
            tool=find_py_spy(),
            timeout_s=bound,
            launch_id=self.stopper.launch_id,
            requested_unix=request.requested_unix,
        )
        took = record.captured_unix - record.started_unix
        got = sum(process.stack is not None for process in record.processes)
        log(f"stacks of {got} of {len(pids)} trainer processes taken in {took * 1000:.0f} ms ({STACKS_FILE})")
        try:
            atomic_write_json(os.path.join(self.stopper.run_dir, STACKS_FILE), record.within().to_json())
        except OSError as exc:  # the trainer can put something in its way: the stop goes on
            log(f"cannot write {STACKS_FILE}: {exc}")

    def _forward_deferred_stop(self, now: float) -> None:
        state = self.state
        if state.forward_stop_at is None or now < state.forward_stop_at or state.term_sent or state.kill_sent:
            return
        name = state.signals_deferred[0]
        log(f"the trainer still runs {self.go.stop_grace_s:g}s after the soft stop: {name} to its tree")
        state.signals_forwarded.append(name)
        state.because("signalled")
        self.stopper.terminate(signal_number(name))
        state.escalate_at = now + self.go.kill_grace_s

    def _enforce_kills(self, remaining: float, now: float) -> None:
        """KILL at the deadline, when the owner or its heartbeat is lost, and when TERM's grace is up."""
        state, timeout = self.state, self.go.heartbeat_timeout_s
        if remaining <= 0 and not state.deadline_expired:
            state.deadline_expired = True
            self.stopper.stop("deadline", hard=True)
        if self.loop.owner_lost() and not state.owner_lost:
            log("owner process lost: killing the trainer")
            state.owner_lost = True
            self.stopper.stop("owner_lost", hard=True)
        if now - self.channel.heartbeat_changed_at >= timeout and not state.heartbeat_lost:
            self.channel.check_heartbeat()
            if time.monotonic() - self.channel.heartbeat_changed_at >= timeout:
                log(f"no heartbeat for {timeout:g}s: killing the trainer")
                state.heartbeat_lost = True
                self.stopper.stop("heartbeat_lost", hard=True)
        if state.escalate_at is not None and now >= state.escalate_at and not state.kill_sent:
            self.stopper.kill_everything(state.killed_with_trainer)

    def _deadline_stops(self, remaining: float) -> None:
        """The soft stop at the checkpoint margin, then TERM at term_grace_s before the deadline."""
        state = self.state
        if remaining <= self.go.checkpoint_margin_s and not (state.soft_stop_sent or state.kill_sent):
            self.stopper.send_soft_stop(DEADLINE_SOFT_STOP)
        if remaining <= self.go.term_grace_s and not (state.term_sent or state.kill_sent):
            # The deadline's TERM: the trainer stopping now stopped because of the deadline.
            state.because("deadline")
            self.stopper.terminate()

    def _wait_timeout(self, now: float) -> float | None:
        """How long to wait for the next event; None once a KILLed trainer outlives REAP_LIMIT_S."""
        state = self.state
        if not state.kill_sent:
            return self._next_timeout(self.deadline.remaining(), time.monotonic())
        # SIGCHLD wakes us as victims die; the timeout re-scans for stragglers.
        if state.killed_at is None:
            state.killed_at = now
        elif now - state.killed_at > REAP_LIMIT_S:
            log("the trainer does not die after SIGKILL (uninterruptible sleep?)")
            return None
        return 0.05

    def _next_timeout(self, remaining: float, now: float) -> float:
        state, go = self.state, self.go
        due = [remaining, self.channel.heartbeat_changed_at + go.heartbeat_timeout_s - now]
        due.append(self.channel.last_poll + FALLBACK_POLL_S - now)
        if not state.soft_stop_sent:
            due.append(remaining - go.checkpoint_margin_s)
        if not state.term_sent:
            due.append(remaining - go.term_grace_s)
        if state.escalate_at is not None:
            due.append(state.escalate_at - now)
        if state.forward_stop_at is not None and not state.term_sent:
            due.append(state.forward_stop_at - now)
        if self.fds.next_at is not None:
            due.append(self.fds.next_at - now)
        return max(0.0, min(due))
