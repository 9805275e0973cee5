"""Every signal the launcher sends to the trainer's tree, recorded in the stop state."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from .proc import alive_descendants, catches, command_of
from .protocol.files import atomic_write_json
from .protocol.go import GoRequest
from .protocol.names import SOFT_STOP_FILE
from .protocol.records import SoftStopRecord
from .state import StopState


class Stopper:
    def __init__(self, state: StopState, launcher_pid: int, run_dir: str, launch_id: str) -> None:
        self.state = state
        self.launcher_pid = launcher_pid
        self.run_dir = run_dir
        self.launch_id = launch_id
        self.trainer_pid: int | None = None
        self.go: GoRequest | None = None

    def signal_group(self, signum: int) -> None:
        if self.trainer_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.trainer_pid, signum)

    def signal_tree(self, signum: int, *, only_catchers: bool = False) -> list[int]:
        """signum to every live process of the trainer's tree, whatever its session or group (a
        worker that setsid()'d away is still the subreaper's descendant), and to the trainer's
        group; with only_catchers, only to the processes with a handler for it. The PIDs signalled."""
        group = None
        if not only_catchers and self.trainer_pid is not None:
            group = self.trainer_pid
            self.signal_group(signum)
        sent: list[int] = []
        for pid in alive_descendants(self.launcher_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # Once is enough: the group's members had it from killpg.
                if (only_catchers and not catches(pid, signum)) or os.getpgid(pid) == group:
                    continue
                os.kill(pid, signum)
                sent.append(pid)
        return sent

    def kill_everything(self, into: dict[int, tuple[str, ...]]) -> None:
        """SIGKILL the trainer's group and every live descendant, recording them in ``into``.

        One pass, no spinning while the victims die (they need the CPU to exit): callers repeat
        it on every wake-up until nothing is left, which also catches a child forked between
        the scan and the kill (it reparents to us, the subreaper).
        """
        state = self.state
        state.kill_sent = True
        state.stop_times.setdefault("kill", time.time())
        victims = alive_descendants(self.launcher_pid)
        known = state.killed_with_trainer.keys() | state.survivors_killed.keys()
        for pid in victims:
            if pid not in known and pid != self.trainer_pid:
                into[pid] = command_of(pid)
        self.signal_group(signal.SIGKILL)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        """The first TERM (or a forwarded stop signal) to the whole tree."""
        self.state.term_sent = True
        self.state.stop_times.setdefault("term", time.time())
        self.signal_tree(signum)

    def stop(self, reason: str, *, hard: bool) -> None:
        """KILL now (hard), or TERM with KILL after go.json's kill_grace_s."""
        self.state.because(reason)
        if hard:
            self.kill_everything(self.state.killed_with_trainer)
            return
        self.terminate()
        if self.state.escalate_at is None:
            self.state.escalate_at = time.monotonic() + (self.go.kill_grace_s if self.go else 0.0)

    def send_soft_stop(self, reason: str) -> None:
        state, go = self.state, self.go
        if state.soft_stop_sent or go is None:
            return
        state.soft_stop_sent = True
        state.stop_times.setdefault("soft_stop", time.time())
        state.soft_stop_reason = reason
        record = SoftStopRecord(self.launch_id, reason, go.deadline_unix, time.time())
        atomic_write_json(os.path.join(self.run_dir, SOFT_STOP_FILE), record.to_json())
        # Only to processes that asked for it: torchrun's agent has no handler and would die of
        # SIGUSR1, while its workers (each in a session of its own) catch it and checkpoint.
        state.soft_stop_signalled = self.signal_tree(go.soft_stop_signum, only_catchers=True)
