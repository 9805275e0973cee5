"""The trainer's process: started in a session of its own, its output pumped to the console log
and the tee, reaped with everything else the subreaper adopts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from .events import EventLoop
from .output import ConsoleLog, OutputTee, log
from .protocol.files import read_bytes


class Trainer:
    def __init__(self, process: subprocess.Popen[bytes], console: ConsoleLog, tee: OutputTee) -> None:
        self.process = process
        self.pid = process.pid
        self.argv = tuple(str(arg) for arg in process.args) if isinstance(process.args, list) else ()
        self.started_unix = time.time()
        self.status: int | None = None  # the raw wait status, once reaped
        self._console: ConsoleLog | None = console
        self._tee = tee
        self._pipe_fd: int | None = None
        self._loop: EventLoop | None = None

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], console: ConsoleLog, tee: OutputTee) -> Trainer:
        """OSError when it cannot be started."""
        process = subprocess.Popen(
            argv,
            start_new_session=True,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return cls(process, console, tee)

    def pump_output(self, loop: EventLoop) -> None:
        """Read the trainer's output whenever the loop sees it (non-blocking, on our own fd)."""
        assert self.process.stdout is not None
        self._pipe_fd = os.dup(self.process.stdout.fileno())
        self.process.stdout.close()
        os.set_blocking(self._pipe_fd, False)
        self._loop = loop
        loop.add_reader(self._pipe_fd, self.on_output)

    def on_output(self) -> None:
        if self._pipe_fd is None:
            return
        try:
            data = os.read(self._pipe_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if self._loop is not None:
                self._loop.remove_reader(self._pipe_fd)
            os.close(self._pipe_fd)
            self._pipe_fd = None
            return
        if self._console is not None:
            try:
                self._console.write(data)
            except OSError as exc:
                log(f"console log write failed, log disabled: {exc}")
                self._console = None
        self._tee.put(data)

    @property
    def output_open(self) -> bool:
        return self._pipe_fd is not None

    def reaped(self, status: int) -> None:
        self.status = status
        self.process.returncode = os.waitstatus_to_exitcode(status)


# Called with the pid and command of each reaped process that died of SIGKILL.
OnKilled = Callable[[int, "tuple[str, ...]"], None]


def reap(trainer: Trainer | None, on_killed: OnKilled | None = None) -> bool:
    """waitpid until nothing is left to reap: the trainer, its children, adopted orphans.
    True when the launcher has no children left at all.

    Each death is looked at before it is reaped (WNOWAIT): a SIGKILLed zombie still has its comm,
    which ``on_killed`` gets (the trainer's own argv for the trainer).
    """
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is None:
            return False
        killed = info.si_code == os.CLD_KILLED and info.si_status == signal.SIGKILL
        command = _command(trainer, info.si_pid) if killed and on_killed is not None else ()
        try:
            pid, status = os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if pid == 0:
            return False
        if trainer is not None and pid == trainer.pid:
            trainer.reaped(status)
        if killed and on_killed is not None:
            on_killed(pid, command)


def _command(trainer: Trainer | None, pid: int) -> tuple[str, ...]:
    if trainer is not None and pid == trainer.pid:
        return tuple(str(arg) for arg in trainer.argv)
    comm = read_bytes(f"/proc/{pid}/comm", 256)
    return (f"[{comm.decode(errors='replace').strip()}]",) if comm else ("?",)
