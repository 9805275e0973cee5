"""The trainer's Python stacks before a stall's stop: py-spy (shipped next to the launcher by the
init container) reads each live process of the tree, all at once, within the request's bound."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .beside import launcher_dir
from .proc import command_of
from .protocol.names import STACK_READER
from .protocol.stacks import (
    MAX_MISSING_CHARS,
    MAX_STACK_CHARS,
    MAX_STACK_PROCESSES,
    ProcessStack,
    StacksRecord,
    without_command_line,
)

PY_SPY = STACK_READER
# What py-spy's errors mean, for the artifact's "why is this stack missing".
_MISSING = (
    (("permission denied", "operation not permitted"), "ptrace refused"),
    (("failed to find python version", "failed to find a python interpreter"), "not a Python process"),
    (("no such process", "check that the process is running"), "exited before its stack was read"),
)
# Bytes kept of a reader's output (a stack is cut at MAX_STACK_CHARS anyway); read in chunks.
_LIMITS = {"out": 4 * MAX_STACK_CHARS, "err": 16 * 1024}
_CHUNK = 64 * 1024
# After a reader's SIGKILL, how long to wait for it to die before leaving it to the reaper.
_REAP_S = 1.0


def find_py_spy() -> str | None:
    """py-spy beside the launcher's file (the chart's init container puts it there), beside its
    Python (a virtualenv), or on PATH."""
    beside = [launcher_dir(), os.path.dirname(sys.executable)]
    for directory in beside:
        candidate = os.path.join(directory, PY_SPY)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(PY_SPY)


def why_missing(returncode: int, stderr: bytes) -> str:
    text = stderr.decode(errors="replace")
    lowered = text.lower()
    for needles, meaning in _MISSING:
        if any(needle in lowered for needle in needles):
            return meaning
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = "; ".join(lines[:2]) or f"exit status {returncode}"
    return f"{PY_SPY} failed: {detail}"[:MAX_MISSING_CHARS]


def capture(
    pids: Sequence[int], *, tool: str | None, timeout_s: float, launch_id: str, requested_unix: float | None
) -> StacksRecord:
    """Every process's stack, read in parallel; a reader still running at ``timeout_s`` is killed and
    its process named as timed out. Never raises, and never outlasts its bound by more than a kill's
    reaping: a reader (py-spy, or whatever the trainer put in its place) that floods its pipes is read
    only up to a bound, and one whose pipes a forked daemon holds open is not waited out."""
    started = time.time()
    end = time.monotonic() + timeout_s
    chosen, omitted = list(pids[:MAX_STACK_PROCESSES]), max(0, len(pids) - MAX_STACK_PROCESSES)
    commands = {pid: command_of(pid) for pid in chosen}
    readers: dict[int, subprocess.Popen[bytes] | str] = {}
    for pid in chosen:
        readers[pid] = _start(tool, pid) if timeout_s > 0 else "no time left before the deadline"
    running = {pid: reader for pid, reader in readers.items() if not isinstance(reader, str)}
    outputs = _read_all(running, end)
    stacks = []
    for pid in chosen:
        reader = readers[pid]
        if isinstance(reader, str):
            stacks.append(ProcessStack(pid, commands[pid], None, reader))
        else:
            stacks.append(_judged(pid, commands[pid], reader, outputs[pid], timeout_s))
    return StacksRecord(
        launch_id=launch_id,
        tool=tool,
        requested_unix=requested_unix,
        started_unix=started,
        captured_unix=time.time(),
        timeout_s=timeout_s,
        processes=tuple(stacks),
        omitted=omitted,
    )


def _start(tool: str | None, pid: int) -> subprocess.Popen[bytes] | str:
    if tool is None:
        return f"{PY_SPY} was not found beside the launcher, its Python or on PATH"
    try:
        return subprocess.Popen(
            [tool, "dump", "--pid", str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            # Its own process group: a timed-out reader is killed with whatever it forked.
            start_new_session=True,
        )
    except OSError as exc:
        return f"{PY_SPY} could not start: {exc}"


class _Output:
    """What one reader wrote, each stream kept up to its bound (the rest read and dropped)."""

    def __init__(self) -> None:
        self.kept = {"out": bytearray(), "err": bytearray()}
        self.open = 2  # streams not yet at EOF
        self.timed_out = False

    def read(self, fd: int, stream: str) -> bool:
        """One read of a ready stream; False at its end."""
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.open -= 1
            return False
        kept = self.kept[stream]
        kept.extend(chunk[: max(0, _LIMITS[stream] - len(kept))])
        return True


def _read_all(readers: dict[int, subprocess.Popen[bytes]], end: float) -> dict[int, _Output]:
    """Every reader's output until each is done or ``end``; then whichever is not done is killed."""
    outputs = {pid: _Output() for pid in readers}
    with selectors.DefaultSelector() as selector:
        for pid, reader in readers.items():
            for stream, name in ((reader.stdout, "out"), (reader.stderr, "err")):
                if stream is not None:
                    os.set_blocking(stream.fileno(), False)
                    selector.register(stream, selectors.EVENT_READ, (outputs[pid], name))
        while selector.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                output, name = key.data
                if not output.read(key.fd, name):
                    selector.unregister(key.fileobj)
    for pid, reader in readers.items():
        _finish(reader, outputs[pid], end)
    return outputs


def _finish(reader: subprocess.Popen[bytes], output: _Output, end: float) -> None:
    """A reader not done by ``end`` (its pipes still open, or not exited) is killed."""
    if output.open or not _exited_by(reader, end):
        output.timed_out = True
        _kill(reader)
    for stream in (reader.stdout, reader.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _exited_by(reader: subprocess.Popen[bytes], end: float) -> bool:
    try:
        reader.wait(timeout=max(0.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill(reader: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the reader's process group, then a bounded wait: a reader that does not die (or a
    daemon that left its group) is not waited out; the launcher, a subreaper, reaps it later."""
    with contextlib.suppress(OSError):
        os.killpg(reader.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        reader.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        reader.wait(timeout=_REAP_S)


def _judged(
    pid: int, command: tuple[str, ...], reader: subprocess.Popen[bytes], output: _Output, timeout_s: float
) -> ProcessStack:
    if output.timed_out:
        return ProcessStack(pid, command, None, f"timed out after {timeout_s:g}s")
    out, err = bytes(output.kept["out"]), bytes(output.kept["err"])
    if reader.returncode != 0 or not out.strip():
        return ProcessStack(pid, command, None, why_missing(reader.returncode or 0, err))
    text = without_command_line(pid, out.decode(errors="replace"), command)
    if len(text) > MAX_STACK_CHARS:
        text = text[: MAX_STACK_CHARS - 40] + "\n[... cut at the stack size limit]\n"
    return ProcessStack(pid, command, text, None)
