"""The trainer's Python stacks before a stall's stop: py-spy (shipped next to the launcher by the
init container) reads each live process of the tree, all at once, within the request's bound."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from .proc import command_of
from .protocol.names import STACK_READER
from .protocol.stacks import (
    MAX_MISSING_CHARS,
    MAX_STACK_CHARS,
    MAX_STACK_PROCESSES,
    ProcessStack,
    StacksRecord,
)

PY_SPY = STACK_READER
# What py-spy's errors mean, for the artifact's "why is this stack missing".
_MISSING = (
    (("permission denied", "operation not permitted"), "ptrace refused"),
    (("failed to find python version", "failed to find a python interpreter"), "not a Python process"),
    (("no such process", "check that the process is running"), "exited before its stack was read"),
)


def find_py_spy() -> str | None:
    """py-spy beside the launcher's file (the chart's init container puts it there), beside its
    Python (a virtualenv), or on PATH."""
    beside = [os.path.dirname(os.path.abspath(sys.argv[0])), os.path.dirname(sys.executable)]
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
    its process named as timed out. Never raises: a stack that cannot be read says why."""
    started = time.time()
    end = time.monotonic() + timeout_s
    chosen, omitted = list(pids[:MAX_STACK_PROCESSES]), max(0, len(pids) - MAX_STACK_PROCESSES)
    commands = {pid: command_of(pid) for pid in chosen}
    readers: dict[int, subprocess.Popen[bytes] | str] = {}
    for pid in chosen:
        readers[pid] = _start(tool, pid) if timeout_s > 0 else "no time left before the deadline"
    stacks = [_collect(pid, commands[pid], readers[pid], end, timeout_s) for pid in chosen]
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
        )
    except OSError as exc:
        return f"{PY_SPY} could not start: {exc}"


def _collect(
    pid: int, command: tuple[str, ...], reader: subprocess.Popen[bytes] | str, end: float, timeout_s: float
) -> ProcessStack:
    if isinstance(reader, str):
        return ProcessStack(pid, command, None, reader)
    try:
        out, err = reader.communicate(timeout=max(0.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            reader.kill()
        reader.communicate()
        return ProcessStack(pid, command, None, f"timed out after {timeout_s:g}s")
    if reader.returncode != 0 or not out.strip():
        return ProcessStack(pid, command, None, why_missing(reader.returncode, err))
    text = out.decode(errors="replace")
    if len(text) > MAX_STACK_CHARS:
        text = text[: MAX_STACK_CHARS - 40] + "\n[... cut at the stack size limit]\n"
    return ProcessStack(pid, command, text, None)
